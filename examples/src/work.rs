//! What fills, checks and transforms frames in the example programs: the pattern kernels on a GPU stream, or the
//! CPU on the host backend's memory (the demo that runs on any Linux machine, without a GPU).

use gpu_ipc::core::backend::{Backend, GpuBackend};
use gpu_ipc::core::frames::{Consumer, Frame, FrameError, FrameGraphs, GraphOptions, Producer, SlotLease, StageIo};
use gpu_ipc::core::host::{Host, HostContext};
use gpu_ipc::driver::{DeviceBuffer, DeviceMemory, Stream};
use gpu_ipc::kernels::launch::Stamp;
use gpu_ipc::kernels::pattern::{count_mismatches_host, fill_pattern_host, xor_words_host};
use gpu_ipc::kernels::persistent::{PersistentFill, PersistentResult, PersistentVerify};

use crate::{Gpu, device_free_bytes, kernel_error};

/// Frames whose running mismatch total is kept, per frame, on the GPU (more than any run-ahead: see
/// [`FrameWork::mismatches`]).
const SNAPSHOTS: u64 = 256;

/// How an example program writes and checks frames with backend `B`.
pub trait FrameWork<B: Backend>: Sized {
    /// Opens device `ordinal` (ignored by the host backend).
    ///
    /// # Errors
    /// No driver or device, or no kernel image for it.
    fn open(ordinal: i32) -> Result<Self, FrameError>;
    /// The backend's context.
    fn ctx(&self) -> &B::Context;
    /// The stream the program's work goes on (`None` on the host).
    fn stream(&self) -> Option<&Stream>;
    /// Writes frame `lease.seq()`'s pattern into its slot (queued on the stream on a GPU).
    ///
    /// # Errors
    /// A slot outside the ring, a kernel or driver error.
    fn fill(&mut self, producer: &Producer<B>, lease: &SlotLease) -> Result<(), FrameError>;
    /// Checks `frame` against its pattern in place (queued on the stream on a GPU), counting mismatched words.
    ///
    /// # Errors
    /// A frame outside the ring, a kernel or driver error.
    fn verify(&mut self, consumer: &Consumer<B>, frame: &Frame) -> Result<(), FrameError> {
        self.verify_as(consumer, frame, frame.seq().0)
    }
    /// Checks `frame` against the pattern of sequence `expected` (a frame that is not the producer's own, such as
    /// the transform of another ring's frame), counting mismatched words; the bookkeeping of
    /// [`FrameWork::mismatches`] goes by the frame's own sequence. On a GPU, a frame with a stamp
    /// ([`Frame::stamp`]: the GPU-side strategies) is checked behind it: a frame the producer never wrote (its death
    /// released the stream's wait) is skipped, never read ([`FrameWork::skipped`]).
    ///
    /// # Errors
    /// As [`FrameWork::verify`].
    fn verify_as(&mut self, consumer: &Consumer<B>, frame: &Frame, expected: u64) -> Result<(), FrameError>;
    /// Word 0 of `frame`, once the frame is there (on a GPU: after the work queued so far).
    ///
    /// # Errors
    /// A frame outside the ring, a driver error.
    fn first_word(&mut self, consumer: &Consumer<B>, frame: &Frame) -> Result<u32, FrameError>;
    /// Starts counting mismatches from zero (after the work queued so far): a new attachment's count.
    ///
    /// # Errors
    /// A driver error.
    fn reset_mismatches(&mut self) -> Result<(), FrameError>;
    /// Waits for the work queued so far.
    ///
    /// # Errors
    /// A driver error.
    fn synchronize(&self) -> Result<(), FrameError>;
    /// Mismatched words of the frames checked up to and including frame `last` (after [`synchronize`]). Frames
    /// checked after it (queued past the end of a stream, whose waits the end released) do not count. `None`: every
    /// frame checked.
    ///
    /// # Errors
    /// A driver error.
    ///
    /// [`synchronize`]: FrameWork::synchronize
    fn mismatches(&self, last: Option<u64>) -> Result<u64, FrameError>;
    /// Free device memory, device-wide (`None` on the host).
    fn device_free(&self) -> Option<u64>;
    /// Frames skipped because their stamp said the producer never wrote them (after [`synchronize`]); `None` when
    /// no frame checked had a stamp (the strategy hands out only frames the host saw published).
    ///
    /// # Errors
    /// A driver error.
    ///
    /// [`synchronize`]: FrameWork::synchronize
    fn skipped(&self) -> Result<Option<u64>, FrameError>;
    /// Verifies and releases the consumer's next `frames` frames in one persistent kernel on the ring's device API
    /// (no launch and no CPU work per frame), waiting at most `per_frame` for each, and waits for it (bounded).
    ///
    /// # Errors
    /// A strategy other than gpu-stream-ops or gpu-poll, the host backend, a kernel or driver error.
    fn run_persistent(
        &mut self,
        consumer: &mut Consumer<B>,
        frames: u64,
        per_frame: std::time::Duration,
    ) -> Result<PersistentResult, FrameError>;
    /// Writes and publishes the producer's next `frames` frames in one persistent kernel on the ring's device API
    /// (no launch and no CPU work per frame), waiting at most `per_frame` for each slot, and waits for it (bounded;
    /// consumers that knock meanwhile are admitted).
    ///
    /// # Errors
    /// A strategy other than gpu-stream-ops or gpu-poll, the host backend, a kernel or driver error.
    fn run_persistent_fill(
        &mut self,
        producer: &mut Producer<B>,
        frames: u64,
        per_frame: std::time::Duration,
    ) -> Result<PersistentResult, FrameError>;
    /// Writes and publishes `frames` frames with the producer's frame graphs (one per slot: wait for the slot, the
    /// pattern fill, publish; one `cuGraphLaunch` per frame), then waits for them (bounded).
    ///
    /// # Errors
    /// A strategy other than gpu-stream-ops or gpu-poll, the host backend, a capture, kernel or driver error.
    fn run_graph_fill(
        &mut self,
        producer: &mut Producer<B>,
        frames: u64,
        per_frame: std::time::Duration,
        progress_every: u64,
    ) -> Result<GraphRun, FrameError>;
    /// Verifies and releases `frames` frames (0: until the end of the stream) with the consumer's frame graphs (one
    /// per slot: wait and stamp check, the pattern check, release), then waits for them (bounded).
    ///
    /// # Errors
    /// As [`FrameWork::run_graph_fill`].
    fn run_graph_verify(
        &mut self,
        consumer: &mut Consumer<B>,
        frames: u64,
        per_frame: std::time::Duration,
        progress_every: u64,
    ) -> Result<GraphRun, FrameError>;
}

/// What a run of frame graphs did (`producer --graph`, `consumer --graph`).
#[derive(Debug)]
pub struct GraphRun {
    /// Graphs launched: one per frame.
    pub launched: u64,
    /// Of those, frames a consumer's graphs did not read (their stamp was not the producer's, their wait gave up,
    /// or they came past the end of the stream); 0 for a producer.
    pub skipped: u64,
    /// Mismatched words of the frames read (a consumer's).
    pub mismatched_words: u64,
    /// How the run ended before its count: the end of the stream, the producer gone (a consumer's).
    pub ended: Option<FrameError>,
}

/// Launches `side`'s frame graphs, `per_launch` frames at a time, until `frames` are launched (0: until `launch`
/// fails with the end of the stream or the producer gone), printing `what: frame N` every `progress_every` frames.
fn launch_graphs(
    frames: u64,
    per_launch: u64,
    progress_every: u64,
    what: &str,
    mut launch: impl FnMut() -> Result<u64, FrameError>,
) -> Result<(u64, Option<FrameError>), FrameError> {
    let mut launched = 0u64;
    while frames == 0 || launched < frames {
        match launch() {
            Ok(_) => launched += per_launch,
            Err(e @ (FrameError::EndOfStream { .. } | FrameError::ProducerGone { .. })) => {
                return Ok((launched, Some(e)));
            }
            Err(e) => return Err(e),
        }
        if progress_every != 0 && launched % progress_every < per_launch {
            eprintln!("{what}: frame {}", launched - launched % progress_every);
        }
    }
    Ok((launched, None))
}

/// The frame graphs' options of a run of `frames` frames (0: until the end) through `slots` slots: a whole lap of the
/// ring per launch when the run is a whole number of laps, else one frame per launch.
fn graph_options(frames: u64, slots: u32, per_frame: std::time::Duration) -> GraphOptions {
    let lap = if frames.is_multiple_of(u64::from(slots)) { slots } else { 1 };
    GraphOptions::new(per_frame).frames_per_launch(lap)
}

/// The host backend's answer to what only a GPU backend does.
fn needs_gpu(what: &str) -> FrameError {
    FrameError::Config(format!("{what}: it needs a GPU backend (legacy or vmm)"))
}

/// How long to wait for a persistent kernel of `frames` frames, each allowed `per_frame` (it leaves sooner on its
/// abort word).
fn persistent_bound(frames: u64, per_frame: std::time::Duration) -> std::time::Duration {
    let bound = per_frame.saturating_mul(u32::try_from(frames).unwrap_or(u32::MAX).saturating_add(1));
    bound.saturating_add(std::time::Duration::from_secs(10))
}

/// The GPU's side: the pattern kernels on one stream; mismatches counted on the GPU, with the running total
/// copied after each frame's check into a ring of `SNAPSHOTS` words, so the total up to any recent frame can be
/// read after the fact without a CPU synchronisation per frame.
pub struct GpuWork {
    gpu: Gpu,
    counter: DeviceBuffer,
    snapshots: DeviceBuffer,
    /// Frames whose stamp did not match (`gpu_ipc_verify_stamped`).
    skipped: DeviceBuffer,
    /// Whether a frame was checked behind its stamp.
    stamped: bool,
}

impl<B: GpuBackend> FrameWork<B> for GpuWork {
    fn open(ordinal: i32) -> Result<Self, FrameError> {
        let gpu = Gpu::open(ordinal)?;
        let counter = DeviceBuffer::alloc(&gpu.ctx, 8)?;
        counter.write(0, &[0u64])?;
        let snapshots = DeviceBuffer::alloc(&gpu.ctx, 8 * SNAPSHOTS)?;
        snapshots.write(0, &[0u64; SNAPSHOTS as usize])?;
        let skipped = DeviceBuffer::alloc(&gpu.ctx, 8)?;
        skipped.write(0, &[0u64])?;
        Ok(Self { gpu, counter, snapshots, skipped, stamped: false })
    }

    fn ctx(&self) -> &B::Context {
        &self.gpu.ctx
    }

    fn stream(&self) -> Option<&Stream> {
        Some(&self.gpu.stream)
    }

    fn fill(&mut self, producer: &Producer<B>, lease: &SlotLease) -> Result<(), FrameError> {
        let span = producer.slot_span(lease)?;
        self.gpu.kernels.fill(&self.gpu.stream, span, lease.seq().0).map_err(kernel_error)
    }

    fn verify_as(&mut self, consumer: &Consumer<B>, frame: &Frame, expected: u64) -> Result<(), FrameError> {
        let span = consumer.frame_span(frame)?;
        let seq = frame.seq().0;
        let (stream, kernels) = (&self.gpu.stream, &self.gpu.kernels);
        match (consumer.stamp_span(frame)?, frame.stamp()) {
            (Some(word), Some(stamp)) => {
                self.stamped = true;
                let (counter, skipped) = (self.counter.span(), self.skipped.span());
                let stamp = Stamp { word, expected: stamp.expected };
                kernels.verify_stamped(stream, span, expected, stamp, counter, skipped).map_err(kernel_error)?;
            }
            _ => kernels.verify(stream, span, expected, self.counter.span()).map_err(kernel_error)?,
        }
        let snapshot = self.snapshots.span().slice(8 * (seq % SNAPSHOTS), 8)?;
        Ok(snapshot.copy_from_async(&self.counter.span(), &self.gpu.stream)?)
    }

    fn first_word(&mut self, consumer: &Consumer<B>, frame: &Frame) -> Result<u32, FrameError> {
        self.gpu.stream.synchronize()?;
        let mut word = [0u32];
        consumer.frame_span(frame)?.read(0, &mut word)?;
        Ok(word[0])
    }

    fn reset_mismatches(&mut self) -> Result<(), FrameError> {
        self.gpu.stream.synchronize()?;
        Ok(self.counter.write(0, &[0u64])?)
    }

    fn synchronize(&self) -> Result<(), FrameError> {
        Ok(self.gpu.stream.synchronize()?)
    }

    fn mismatches(&self, last: Option<u64>) -> Result<u64, FrameError> {
        let mut value = [0u64];
        match last {
            Some(seq) => self.snapshots.read(8 * (seq % SNAPSHOTS), &mut value)?,
            None => self.counter.read(0, &mut value)?,
        }
        Ok(value[0])
    }

    fn device_free(&self) -> Option<u64> {
        device_free_bytes(&self.gpu.ctx)
    }

    fn skipped(&self) -> Result<Option<u64>, FrameError> {
        if !self.stamped {
            return Ok(None);
        }
        let mut value = [0u64];
        self.skipped.read(0, &mut value)?;
        Ok(Some(value[0]))
    }

    fn run_persistent(
        &mut self,
        consumer: &mut Consumer<B>,
        frames: u64,
        per_frame: std::time::Duration,
    ) -> Result<PersistentResult, FrameError> {
        let kernel = PersistentVerify::load(&self.gpu.ctx).map_err(kernel_error)?;
        kernel.launch(consumer, &self.gpu.stream, frames, per_frame)?;
        kernel.finish(consumer, persistent_bound(frames, per_frame))
    }

    fn run_persistent_fill(
        &mut self,
        producer: &mut Producer<B>,
        frames: u64,
        per_frame: std::time::Duration,
    ) -> Result<PersistentResult, FrameError> {
        let kernel = PersistentFill::load(&self.gpu.ctx).map_err(kernel_error)?;
        kernel.launch(producer, &self.gpu.stream, frames, per_frame)?;
        kernel.finish(producer, persistent_bound(frames, per_frame))
    }

    fn run_graph_fill(
        &mut self,
        producer: &mut Producer<B>,
        frames: u64,
        per_frame: std::time::Duration,
        progress_every: u64,
    ) -> Result<GraphRun, FrameError> {
        let Gpu { kernels, stream, .. } = &self.gpu;
        let options = graph_options(frames, producer.slots(), per_frame);
        let mut graphs: FrameGraphs = producer.capture_frame_graphs(stream, options, |slot, s| {
            kernels.fill_at(s, slot.span, slot.frame_state).map_err(kernel_error)
        })?;
        let per_launch = graphs.frames_per_launch();
        let (launched, ended) = launch_graphs(frames, per_launch, progress_every, "producer", || {
            producer.launch_frame_graph(&mut graphs, stream)
        })?;
        producer.finish_frame_graphs(persistent_bound(launched.min(1 << 20), per_frame))?;
        Ok(GraphRun { launched, skipped: 0, mismatched_words: 0, ended })
    }

    fn run_graph_verify(
        &mut self,
        consumer: &mut Consumer<B>,
        frames: u64,
        per_frame: std::time::Duration,
        progress_every: u64,
    ) -> Result<GraphRun, FrameError> {
        let Gpu { kernels, stream, ctx } = &self.gpu;
        let counter = DeviceBuffer::alloc(ctx, 8)?;
        counter.write(0, &[0u64])?;
        let options = graph_options(frames, consumer.offer().slot_count, per_frame);
        let mut graphs = consumer.capture_frame_graphs(stream, options, |slot, s| {
            kernels.verify_at(s, slot.span, slot.frame_state, counter.span()).map_err(kernel_error)
        })?;
        let per_launch = graphs.frames_per_launch();
        let (launched, ended) = launch_graphs(frames, per_launch, progress_every, "consumer", || {
            consumer.launch_frame_graph(&mut graphs, stream)
        })?;
        consumer.finish_frame_graphs(persistent_bound(launched.min(1 << 20), per_frame))?;
        let mut mismatched = [0u64];
        counter.read(0, &mut mismatched)?;
        Ok(GraphRun { launched, skipped: graphs.skipped()?, mismatched_words: mismatched[0], ended })
    }
}

/// The host backend's side: the CPU writes and checks the pattern in the shared host memory.
#[derive(Default)]
pub struct HostWork {
    words: Vec<u32>,
    bytes: Vec<u8>,
    /// Mismatched words, and the frame each check ended at (to leave out frames past `last`).
    checked: Vec<(u64, u64)>,
}

impl FrameWork<Host> for HostWork {
    fn open(_ordinal: i32) -> Result<Self, FrameError> {
        Ok(Self::default())
    }

    fn ctx(&self) -> &HostContext {
        &HostContext
    }

    fn stream(&self) -> Option<&Stream> {
        None
    }

    fn fill(&mut self, producer: &Producer<Host>, lease: &SlotLease) -> Result<(), FrameError> {
        self.words.resize((lease.bytes() / 4) as usize, 0);
        fill_pattern_host(&mut self.words, lease.seq().0);
        self.write_words(producer, lease)
    }

    fn verify_as(&mut self, consumer: &Consumer<Host>, frame: &Frame, expected: u64) -> Result<(), FrameError> {
        self.read_words(consumer, frame)?;
        let bad = count_mismatches_host(&self.words, expected);
        if bad != 0 {
            self.checked.push((frame.seq().0, bad));
        }
        Ok(())
    }

    fn first_word(&mut self, consumer: &Consumer<Host>, frame: &Frame) -> Result<u32, FrameError> {
        let mut word = [0u8; 4];
        consumer.region().read(frame.ptr(), &mut word)?;
        Ok(u32::from_le_bytes(word))
    }

    fn reset_mismatches(&mut self) -> Result<(), FrameError> {
        self.checked.clear();
        Ok(())
    }

    fn synchronize(&self) -> Result<(), FrameError> {
        Ok(())
    }

    fn mismatches(&self, last: Option<u64>) -> Result<u64, FrameError> {
        Ok(self.checked.iter().filter(|(seq, _)| last.is_none_or(|l| *seq <= l)).map(|(_, bad)| bad).sum())
    }

    fn device_free(&self) -> Option<u64> {
        None
    }

    fn skipped(&self) -> Result<Option<u64>, FrameError> {
        Ok(None)
    }

    fn run_persistent(
        &mut self,
        _consumer: &mut Consumer<Host>,
        _frames: u64,
        _per_frame: std::time::Duration,
    ) -> Result<PersistentResult, FrameError> {
        Err(needs_gpu("--persistent runs a kernel on the ring"))
    }

    fn run_persistent_fill(
        &mut self,
        _producer: &mut Producer<Host>,
        _frames: u64,
        _per_frame: std::time::Duration,
    ) -> Result<PersistentResult, FrameError> {
        Err(needs_gpu("--persistent runs a kernel on the ring"))
    }

    fn run_graph_fill(
        &mut self,
        _producer: &mut Producer<Host>,
        _frames: u64,
        _per_frame: std::time::Duration,
        _progress_every: u64,
    ) -> Result<GraphRun, FrameError> {
        Err(needs_gpu("--graph captures CUDA graphs"))
    }

    fn run_graph_verify(
        &mut self,
        _consumer: &mut Consumer<Host>,
        _frames: u64,
        _per_frame: std::time::Duration,
        _progress_every: u64,
    ) -> Result<GraphRun, FrameError> {
        Err(needs_gpu("--graph captures CUDA graphs"))
    }
}

impl HostWork {
    /// Reads `frame` into `self.words` (little-endian 32-bit words).
    fn read_words(&mut self, consumer: &Consumer<Host>, frame: &Frame) -> Result<(), FrameError> {
        self.bytes.resize(frame.bytes() as usize, 0);
        consumer.region().read(frame.ptr(), &mut self.bytes)?;
        self.words.clear();
        self.words.extend(self.bytes.chunks_exact(4).map(|w| u32::from_le_bytes([w[0], w[1], w[2], w[3]])));
        Ok(())
    }

    /// Writes `self.words` (little-endian) into `lease`'s slot, padded with zeros to the frame's size.
    fn write_words(&mut self, producer: &Producer<Host>, lease: &SlotLease) -> Result<(), FrameError> {
        self.bytes.clear();
        self.bytes.extend(self.words.iter().flat_map(|w| w.to_le_bytes()));
        self.bytes.resize(lease.bytes() as usize, 0);
        Ok(producer.region().write(lease.ptr(), &self.bytes)?)
    }
}

/// Runs `f` with the program's backend: the host backend, or a GPU backend compiled in (through
/// [`gpu_ipc::dispatch_gpu`]).
pub trait ProgramVisitor {
    /// What the program returns.
    type Output;
    /// Runs the program with backend `B` and its frame work `W`.
    fn run<B: Backend, W: FrameWork<B>>(self) -> Result<Self::Output, FrameError>;
}

/// Runs `program` with the backend `kind` names.
///
/// # Errors
/// A backend not compiled in, or the program's error.
pub fn run_with_backend<P: ProgramVisitor>(kind: gpu_ipc::BackendKind, program: P) -> Result<P::Output, FrameError> {
    struct Gpu<P>(P);
    impl<P: ProgramVisitor> gpu_ipc::GpuBackendVisitor for Gpu<P> {
        type Output = Result<P::Output, FrameError>;
        fn visit<B: GpuBackend>(self) -> Self::Output {
            self.0.run::<B, GpuWork>()
        }
    }
    match kind {
        gpu_ipc::BackendKind::Host => program.run::<Host, HostWork>(),
        gpu => gpu_ipc::dispatch_gpu(gpu, Gpu(program)).map_err(|e| FrameError::Config(e.to_string()))?,
    }
}

/// How the pipeline's middle stage transforms frames, upstream backend `U` to downstream backend `D`: every 32-bit
/// word XORed with a mask (the kernel `gpu_ipc_xor_words` on a GPU, the CPU on the host backend).
pub trait StageWork<U: Backend, D: Backend>: Sized {
    /// Opens device `ordinal` (ignored by the host backend).
    ///
    /// # Errors
    /// No driver or device, or no kernel image for it.
    fn open(ordinal: i32) -> Result<Self, FrameError>;
    /// The upstream and downstream backends' contexts.
    fn contexts(&self) -> (&U::Context, &D::Context);
    /// The stream the stage's work goes on (`None` on the host).
    fn stream(&self) -> Option<&Stream>;
    /// Writes `io.input ^ mask`, word by word, into `io.output` (queued on the stream on a GPU).
    ///
    /// # Errors
    /// Frames of different sizes, a frame outside its ring, a kernel or driver error.
    fn xor(&self, io: &StageIo<'_, U, D>, mask: u32) -> Result<(), FrameError>;
}

impl<U: GpuBackend, D: GpuBackend> StageWork<U, D> for GpuWork {
    fn open(ordinal: i32) -> Result<Self, FrameError> {
        <Self as FrameWork<U>>::open(ordinal)
    }

    fn contexts(&self) -> (&U::Context, &D::Context) {
        (&self.gpu.ctx, &self.gpu.ctx)
    }

    fn stream(&self) -> Option<&Stream> {
        Some(&self.gpu.stream)
    }

    fn xor(&self, io: &StageIo<'_, U, D>, mask: u32) -> Result<(), FrameError> {
        let (dst, src) = (io.output_span()?, io.input_span()?);
        self.gpu.kernels.xor_words(&self.gpu.stream, dst, src, mask).map_err(kernel_error)
    }
}

impl StageWork<Host, Host> for HostWork {
    fn open(_ordinal: i32) -> Result<Self, FrameError> {
        Ok(Self::default())
    }

    fn contexts(&self) -> (&HostContext, &HostContext) {
        (&HostContext, &HostContext)
    }

    fn stream(&self) -> Option<&Stream> {
        None
    }

    fn xor(&self, io: &StageIo<'_, Host, Host>, mask: u32) -> Result<(), FrameError> {
        if io.input.bytes() != io.output.bytes() {
            return Err(FrameError::Config(format!(
                "the upstream frame is {} bytes and the downstream slot {}: the XOR transform keeps the size; give \
                 the stage the upstream frame's --width, --height and --format",
                io.input.bytes(),
                io.output.bytes()
            )));
        }
        let mut bytes = vec![0u8; io.input.bytes() as usize];
        io.upstream.region().read(io.input.ptr(), &mut bytes)?;
        let input: Vec<u32> = bytes.chunks_exact(4).map(|w| u32::from_le_bytes([w[0], w[1], w[2], w[3]])).collect();
        let mut output = vec![0u32; input.len()];
        xor_words_host(&mut output, &input, mask);
        for (chunk, word) in bytes.chunks_exact_mut(4).zip(&output) {
            chunk.copy_from_slice(&word.to_le_bytes());
        }
        Ok(io.downstream.region().write(io.output.ptr(), &bytes)?)
    }
}

/// Runs a stage program with an upstream and a downstream backend chosen at run time.
pub trait StageVisitor {
    /// What the program returns.
    type Output;
    /// Runs the program with backends `U` (upstream) and `D` (downstream) and its work `W`.
    fn run<U: Backend, D: Backend, W: StageWork<U, D>>(self) -> Result<Self::Output, FrameError>;
}

/// Runs `program` with the backends `upstream` and `downstream` name: both the host backend, or both GPU backends
/// compiled in (the two may differ: legacy upstream, vmm downstream).
///
/// # Errors
/// One side on the host and the other on a GPU, a backend not compiled in, or the program's error.
pub fn run_with_stage_backends<P: StageVisitor>(
    upstream: gpu_ipc::BackendKind,
    downstream: gpu_ipc::BackendKind,
    program: P,
) -> Result<P::Output, FrameError> {
    use gpu_ipc::BackendKind::Host as HostKind;
    struct Up<P>(P, gpu_ipc::BackendKind);
    struct Down<U, P>(P, std::marker::PhantomData<U>);
    impl<P: StageVisitor> gpu_ipc::GpuBackendVisitor for Up<P> {
        type Output = Result<P::Output, FrameError>;
        fn visit<U: GpuBackend>(self) -> Self::Output {
            gpu_ipc::dispatch_gpu(self.1, Down::<U, P>(self.0, std::marker::PhantomData))
                .map_err(|e| FrameError::Config(e.to_string()))?
        }
    }
    impl<U: GpuBackend, P: StageVisitor> gpu_ipc::GpuBackendVisitor for Down<U, P> {
        type Output = Result<P::Output, FrameError>;
        fn visit<D: GpuBackend>(self) -> Self::Output {
            self.0.run::<U, D, GpuWork>()
        }
    }
    match (upstream, downstream) {
        (HostKind, HostKind) => program.run::<Host, Host, HostWork>(),
        (HostKind, _) | (_, HostKind) => Err(FrameError::Config(format!(
            "a stage's two rings must both be on the host or both on the GPU (upstream {upstream}, downstream \
             {downstream}): its work reads one and writes the other"
        ))),
        (up, down) => gpu_ipc::dispatch_gpu(up, Up(program, down)).map_err(|e| FrameError::Config(e.to_string()))?,
    }
}
