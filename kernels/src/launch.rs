//! Typed launchers of the embedded kernels: load the right image for the device, then fill and verify frames.

use gpu_ipc_driver::{
    Context, DeviceBuffer, DeviceMemory, DeviceSpan, DriverError, Function, KernelArg, LaunchConfig, Module, Stream,
    raw::CUresult,
};

use crate::image::{self, ComputeCapability, KernelImage, NoImageForDevice};
use crate::{CHECK_STAMP, FILL_PATTERN, FILL_PATTERN_AT, VERIFY_PATTERN, VERIFY_PATTERN_AT, VERIFY_STAMPED, XOR_WORDS};

/// Why the kernels could not be loaded or launched.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum KernelError {
    /// No embedded image suits the device.
    #[error(transparent)]
    NoImage(#[from] NoImageForDevice),
    /// The driver refused the image chosen for the device.
    #[error(
        "the CUDA driver {driver} rejected the kernel image {image} on a device of compute capability {device}: {source}; {fix}"
    )]
    ImageRejected {
        /// The image that was tried (its file name in `kernels/images/kernels/`).
        image: &'static str,
        /// The driver's CUDA version.
        driver: String,
        /// The device's compute capability.
        device: ComputeCapability,
        /// What to do.
        fix: &'static str,
        /// The driver's error.
        source: Box<DriverError>,
    },
    /// A frame size the pattern kernels cannot handle.
    #[error("{bytes} bytes is not a whole number of 32-bit words")]
    UnalignedSize {
        /// The size given.
        bytes: u64,
    },
    /// Two buffers a kernel pairs word for word are not the same size.
    #[error("the destination is {dst} bytes and the source {src}: a word-by-word transform needs the same size")]
    SizeMismatch {
        /// Bytes of the destination.
        dst: u64,
        /// Bytes of the source.
        src: u64,
    },
    /// Any other driver error.
    #[error(transparent)]
    Driver(#[from] DriverError),
}

/// Loads the embedded image that suits the context's device as a module (exact cubin, closest cubin of the same
/// major, else PTX; the PTX when `force_ptx`), with a typed error that names the driver, the image and the fix.
///
/// # Errors
/// [`KernelError::NoImage`] or [`KernelError::ImageRejected`].
pub fn load_module(ctx: &Context, force_ptx: bool) -> Result<(Module, &'static KernelImage), KernelError> {
    let device = ctx.device();
    let (major, minor) = device.compute_capability()?;
    let image = image::select_image(ComputeCapability::new(major, minor), force_ptx)?;
    let module = Module::load(ctx, image.bytes).map_err(|source| {
        let fix = if source.is(CUresult::CUDA_ERROR_UNSUPPORTED_PTX_VERSION) {
            "the PTX is newer than this driver: update the NVIDIA driver"
        } else if source.is(CUresult::CUDA_ERROR_NO_BINARY_FOR_GPU) {
            "no code in the image runs on this GPU: rebuild the kernels for it (scripts/gen-kernels.sh)"
        } else {
            "report this with the output of `gpu-ipc doctor --json`"
        };
        let driver = gpu_ipc_driver::Driver::load().map(|d| d.version().to_string()).unwrap_or_default();
        KernelError::ImageRejected {
            image: image.file,
            driver,
            device: ComputeCapability::new(major, minor),
            fix,
            source: Box::new(source),
        }
    })?;
    tracing::debug!(image = %image, "loaded the kernel module");
    Ok((module, image))
}

/// The frame-pattern kernels, loaded in one context: fill a frame with the pattern of a sequence number, count the
/// words of a frame that differ from it, and XOR a frame into another (a pipeline stage's transform).
///
/// ```no_run
/// use gpu_ipc_kernels::launch::PatternKernels;
/// use gpu_ipc_driver::{Context, DeviceBuffer, DeviceMemory, Stream};
///
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let ctx = Context::for_ordinal(0)?;
/// let kernels = PatternKernels::load(&ctx)?;
/// let stream = Stream::new(&ctx)?;
/// let frame = DeviceBuffer::alloc(&ctx, 3840 * 2160 * 3)?;
/// kernels.fill(&stream, frame.span(), 7)?;
/// assert_eq!(kernels.count_mismatches(&stream, frame.span(), 7)?, 0);
/// # Ok(()) }
/// ```
pub struct PatternKernels {
    fill: Function,
    verify: Function,
    fill_at: Function,
    verify_at: Function,
    check_stamp: Function,
    verify_stamped: Function,
    xor: Function,
    counter: DeviceBuffer,
    /// Whether the frame being checked is its producer's: written by `check_stamp`, read by `verify_stamped`.
    stamp_valid: DeviceBuffer,
    image: &'static KernelImage,
    max_blocks: u32,
}

const THREADS: u32 = 256;

/// A frame's stamp as a kernel checks it (docs/ring.md, the stamp rule): the word, and what it holds, under
/// `ipc_core::frames::STAMP_MASK`, when the frame is the producer's.
#[derive(Debug, Clone, Copy)]
pub struct Stamp<'a> {
    /// The frame's stamp word (`Consumer::stamp_span`).
    pub word: DeviceSpan<'a>,
    /// `Frame::stamp().expected`: the frame's own sequence + 1, whatever pattern it is checked against.
    pub expected: u64,
}

impl PatternKernels {
    /// Loads the image that suits the context's device (exact cubin, closest cubin of the same major, else PTX;
    /// `GPU_IPC_FORCE_PTX=1` forces the PTX).
    ///
    /// # Errors
    /// [`KernelError::NoImage`] or [`KernelError::ImageRejected`] (with the driver and image named).
    pub fn load(ctx: &Context) -> Result<Self, KernelError> {
        Self::load_image(ctx, image::force_ptx_from_env())
    }

    /// As [`PatternKernels::load`], choosing the PTX path explicitly when `force_ptx`.
    ///
    /// # Errors
    /// As [`PatternKernels::load`].
    pub fn load_image(ctx: &Context, force_ptx: bool) -> Result<Self, KernelError> {
        let (module, image) = load_module(ctx, force_ptx)?;
        let device = ctx.device();
        let sms = device.sm_count()?;
        tracing::debug!(image = %image, "loaded the pattern kernels");
        Ok(Self {
            fill: module.function(FILL_PATTERN)?,
            verify: module.function(VERIFY_PATTERN)?,
            fill_at: module.function(FILL_PATTERN_AT)?,
            verify_at: module.function(VERIFY_PATTERN_AT)?,
            check_stamp: module.function(CHECK_STAMP)?,
            verify_stamped: module.function(VERIFY_STAMPED)?,
            xor: module.function(XOR_WORDS)?,
            counter: DeviceBuffer::alloc(ctx, 8)?,
            stamp_valid: DeviceBuffer::alloc(ctx, 8)?,
            image,
            // Enough resident blocks to saturate memory bandwidth; the kernels loop over the rest.
            max_blocks: sms * 8,
        })
    }

    /// The image that was loaded.
    pub fn image(&self) -> &'static KernelImage {
        self.image
    }

    fn config(&self, bytes: u64) -> Result<(LaunchConfig, u64), KernelError> {
        if !bytes.is_multiple_of(4) {
            return Err(KernelError::UnalignedSize { bytes });
        }
        let words = bytes / 4;
        let wanted = words.div_ceil(u64::from(THREADS) * 4).max(1);
        let blocks = wanted.min(u64::from(self.max_blocks)) as u32;
        Ok((LaunchConfig::linear(blocks, THREADS), words))
    }

    /// Queues a fill of the whole of `frame` with the pattern of `seq`.
    ///
    /// # Errors
    /// A length that is not a multiple of 4, or the launch error.
    pub fn fill(&self, stream: &Stream, frame: DeviceSpan<'_>, seq: u64) -> Result<(), KernelError> {
        let (config, words) = self.config(frame.len())?;
        self.fill.launch_typed(
            stream,
            config,
            &[KernelArg::Span(frame), KernelArg::U64(words), KernelArg::U64(seq)],
        )?;
        Ok(())
    }

    /// Queues a fill of the whole of `frame` with the pattern of the frame a frame graph's launch is for (the
    /// sequence in `frame_state`, `ipc_core::frames::GraphSlot::frame_state`), nothing when the state says the slot
    /// may not be used: what a producer's frame graph records.
    ///
    /// # Errors
    /// A length that is not a multiple of 4, or the launch error.
    pub fn fill_at(
        &self,
        stream: &Stream,
        frame: DeviceSpan<'_>,
        frame_state: DeviceSpan<'_>,
    ) -> Result<(), KernelError> {
        let (config, words) = self.config(frame.len())?;
        self.fill_at.launch_typed(
            stream,
            config,
            &[KernelArg::Span(frame), KernelArg::U64(words), KernelArg::Span(frame_state)],
        )?;
        Ok(())
    }

    /// As [`PatternKernels::verify`] for the frame a frame graph's launch is for (the sequence in `frame_state`),
    /// nothing when the state says the frame is not valid (its stamp was not the producer's, or the wait gave up):
    /// what a consumer's frame graph records.
    ///
    /// # Errors
    /// As [`PatternKernels::verify`].
    pub fn verify_at(
        &self,
        stream: &Stream,
        frame: DeviceSpan<'_>,
        frame_state: DeviceSpan<'_>,
        mismatches: DeviceSpan<'_>,
    ) -> Result<(), KernelError> {
        let (config, words) = self.config(frame.len())?;
        let counter = mismatches.slice(0, 8)?;
        self.verify_at.launch_typed(
            stream,
            config,
            &[KernelArg::Span(frame), KernelArg::U64(words), KernelArg::Span(frame_state), KernelArg::Span(counter)],
        )?;
        Ok(())
    }

    /// Queues a check of the whole of `frame` against the pattern of `seq`, adding the number of mismatched words
    /// to the 64-bit counter at the start of `mismatches` (asynchronous: read the counter after the stream is done).
    ///
    /// # Errors
    /// A frame length that is not a multiple of 4, a counter span shorter than 8 bytes, or the launch error.
    pub fn verify(
        &self,
        stream: &Stream,
        frame: DeviceSpan<'_>,
        seq: u64,
        mismatches: DeviceSpan<'_>,
    ) -> Result<(), KernelError> {
        let (config, words) = self.config(frame.len())?;
        let counter = mismatches.slice(0, 8)?;
        self.verify.launch_typed(
            stream,
            config,
            &[KernelArg::Span(frame), KernelArg::U64(words), KernelArg::U64(seq), KernelArg::Span(counter)],
        )?;
        Ok(())
    }

    /// As [`PatternKernels::verify`], behind the frame's [`Stamp`]. When its word does not say the frame is the
    /// producer's (a dead producer's poison released the stream's wait for a frame it never wrote), no word of the
    /// frame is read and 1 is added to the 64-bit counter at the start of `skipped` instead; either counter is read
    /// after the stream is done. Two launches: a one-thread kernel reads the stamp once (host memory, over the bus)
    /// into a word of this object's device memory, then the check reads that word. So calls on two streams at once
    /// need two `PatternKernels`.
    ///
    /// # Errors
    /// A frame length that is not a multiple of 4, a stamp or counter span shorter than 8 bytes, or the launch error.
    pub fn verify_stamped(
        &self,
        stream: &Stream,
        frame: DeviceSpan<'_>,
        seq: u64,
        stamp: Stamp<'_>,
        mismatches: DeviceSpan<'_>,
        skipped: DeviceSpan<'_>,
    ) -> Result<(), KernelError> {
        let (config, words) = self.config(frame.len())?;
        let (word, mismatches, skipped) = (stamp.word.slice(0, 8)?, mismatches.slice(0, 8)?, skipped.slice(0, 8)?);
        let valid = self.stamp_valid.span();
        self.check_stamp.launch_typed(
            stream,
            LaunchConfig::linear(1, 32),
            &[KernelArg::Span(word), KernelArg::U64(stamp.expected), KernelArg::Span(valid), KernelArg::Span(skipped)],
        )?;
        self.verify_stamped.launch_typed(
            stream,
            config,
            &[
                KernelArg::Span(frame),
                KernelArg::U64(words),
                KernelArg::U64(seq),
                KernelArg::Span(mismatches),
                KernelArg::Span(valid),
            ],
        )?;
        Ok(())
    }

    /// Queues `dst[i] = src[i] ^ mask` over every word of two spans of the same size that do not overlap (two
    /// rings' slots): `mask` `0xFFFF_FFFF` inverts every bit. A frame of the pattern of `seq` becomes the frame of
    /// the pattern of [`xor_sequence`](crate::pattern::xor_sequence)`(seq, mask)`.
    ///
    /// # Errors
    /// Spans of different sizes, a size that is not a multiple of 4, or the launch error.
    pub fn xor_words(
        &self,
        stream: &Stream,
        dst: DeviceSpan<'_>,
        src: DeviceSpan<'_>,
        mask: u32,
    ) -> Result<(), KernelError> {
        if dst.len() != src.len() {
            return Err(KernelError::SizeMismatch { dst: dst.len(), src: src.len() });
        }
        let (config, words) = self.config(dst.len())?;
        self.xor.launch_typed(
            stream,
            config,
            &[KernelArg::Span(dst), KernelArg::Span(src), KernelArg::U64(words), KernelArg::U32(mask)],
        )?;
        Ok(())
    }

    /// Checks a frame and waits for the answer: the number of 32-bit words that differ from the pattern of `seq`.
    ///
    /// # Errors
    /// A length that is not a multiple of 4, or a driver error (including one raised by earlier work on `stream`).
    pub fn count_mismatches(&self, stream: &Stream, frame: DeviceSpan<'_>, seq: u64) -> Result<u64, KernelError> {
        self.counter.fill_u32_async(0, stream)?;
        self.verify(stream, frame, seq, self.counter.span())?;
        stream.synchronize()?;
        let mut count = [0u64];
        self.counter.read(0, &mut count)?;
        Ok(count[0])
    }
}
