//! The example persistent kernels of the ring's device API (`kernels/cuda/gpu_ipc_ring.cuh`), one launch for many
//! frames with no launch and no CPU work per frame:
//! - [`PersistentVerify`] (`gpu_ipc_persistent_verify`), a consumer: waits for, checks and releases frames; launched
//!   through `Consumer::launch_on_ring`, which hands it the ring's descriptor and raises its abort word when the
//!   producer dies or the consumer is dropped.
//! - [`PersistentFill`] (`gpu_ipc_persistent_fill`), a producer: waits until each slot is free, writes the frame's
//!   pattern and publishes it; launched through `Producer::launch_on_ring` (abort word raised when the producer is
//!   dropped; consumers that die release its waits through their poisoned counters).
//!
//! Both run in ONE block: right for the handoff of small frames, slow for frames of megabytes (one SM moves a small
//! share of the memory bandwidth). [`PersistentFillGrid`] and [`PersistentVerifyGrid`] are the same two spread over
//! the whole GPU ([`GridShape`]: a leader block does the ring's waits and opens each frame to worker blocks, the last
//! worker done with a frame publishes or releases it), still one launch for the whole run, and they time each frame
//! on the GPU's clock ([`PersistentGrid::frame_times`]).
//!
//! ```no_run
//! use std::time::Duration;
//! use gpu_ipc_kernels::persistent::PersistentVerify;
//! use ipc_core::backend::GpuBackend;
//! use gpu_ipc_driver::{Context, Stream};
//! use ipc_core::frames::Consumer;
//!
//! fn check_frames<B: GpuBackend>(ctx: &Context, consumer: &mut Consumer<B>) -> Result<(), Box<dyn std::error::Error>> {
//!     let kernel = PersistentVerify::load(ctx)?;
//!     let stream = Stream::new(ctx)?;
//!     kernel.launch(consumer, &stream, 1000, Duration::from_secs(1))?;
//!     // ... the CPU is free: no call per frame ...
//!     let result = kernel.finish(consumer, Duration::from_secs(30))?;
//!     assert_eq!((result.frames, result.mismatched_words), (1000, 0));
//!     Ok(())
//! }
//! ```

use std::time::Duration;

use gpu_ipc_driver::{Context, DeviceBuffer, DeviceMemory, Function, KernelArg, LaunchConfig, Stream};
use ipc_core::backend::Backend;
use ipc_core::frames::{Consumer, FrameError, Producer};

use crate::launch::{KernelError, load_module};
use crate::{PERSISTENT_FILL, PERSISTENT_FILL_GRID, PERSISTENT_VERIFY, PERSISTENT_VERIFY_GRID};

/// Most threads of the kernel's one block.
const MAX_THREADS: u32 = 1024;

/// Threads of the one block for frames of `slot_bytes`: a thread per 16 bytes in whole warps, 32 to 1,024. A
/// block no wider than its frame: every frame costs two block barriers on the handoff's path, and a barrier of
/// 1,024 threads is dearer than one of 32 (the 256-byte frames of the round-trip bench need one warp).
fn threads_for(slot_bytes: u64) -> u32 {
    let wanted = slot_bytes.div_ceil(16).next_multiple_of(32).clamp(32, u64::from(MAX_THREADS));
    u32::try_from(wanted).unwrap_or(MAX_THREADS)
}

/// Why the persistent kernel stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum PersistentOutcome {
    /// Every frame asked for was verified and released.
    Done,
    /// A frame did not come within the timeout per frame.
    TimedOut,
    /// The host raised the abort word (the producer hung up, the consumer was dropped), or the peer raised the
    /// survivor's abort word (it saw this process gone).
    Aborted,
    /// A frame's stamp was not the producer's: it died before it published that frame.
    StampInvalid,
    /// The kernel lease ran out: this process's heartbeat stood still for the lease (it was stopped, or killed and
    /// nobody reads this), `ipc_core::resident::KernelLease`.
    Orphaned,
    /// A value the kernel does not write: the result was not written (the kernel did not run to its end).
    Unknown(u64),
}

impl PersistentOutcome {
    fn from_raw(raw: u64) -> Self {
        match raw {
            0 => Self::Done,
            1 => Self::TimedOut,
            2 => Self::Aborted,
            3 => Self::StampInvalid,
            4 => Self::Orphaned,
            other => Self::Unknown(other),
        }
    }
}

/// What a persistent kernel reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct PersistentResult {
    /// Frames verified and released (the consumer), or written and published (the producer).
    pub frames: u64,
    /// Words of those frames that differed from their pattern (0 when all is well; always 0 for the producer).
    pub mismatched_words: u64,
    /// Why it stopped.
    pub outcome: PersistentOutcome,
    /// The frame it stopped at (the first not released).
    pub stopped_at: u64,
}

/// What both example kernels share: the function, and the four result words it writes at its end (`result[0..4]`
/// of the kernels).
struct Persistent {
    kernel: Function,
    result: DeviceBuffer,
}

impl Persistent {
    fn load(ctx: &Context, name: &str) -> Result<Self, KernelError> {
        let (module, _) = load_module(ctx, crate::image::force_ptx_from_env())?;
        Ok(Self { kernel: module.function(name)?, result: DeviceBuffer::alloc(ctx, 32)? })
    }

    /// Resets the result words to "not written", then gives the launch's shape and its arguments after the ring's
    /// descriptor: `frames`, the timeout per frame in ns, the result words.
    fn launch_args(
        &self,
        frames: u64,
        per_frame: Duration,
        slot_bytes: u64,
    ) -> Result<(LaunchConfig, [KernelArg<'_>; 3]), FrameError> {
        self.result.write(0, &[0u64, 0, u64::MAX, 0])?;
        let timeout_ns = u64::try_from(per_frame.as_nanos()).unwrap_or(u64::MAX);
        let args = [KernelArg::U64(frames), KernelArg::U64(timeout_ns), KernelArg::Span(self.result.span())];
        Ok((LaunchConfig::linear(1, threads_for(slot_bytes)), args))
    }

    fn read(&self) -> Result<PersistentResult, FrameError> {
        let mut words = [0u64; 4];
        self.result.read(0, &mut words)?;
        Ok(PersistentResult {
            frames: words[0],
            mismatched_words: words[1],
            outcome: PersistentOutcome::from_raw(words[2]),
            stopped_at: words[3],
        })
    }
}

/// The persistent consumer kernel, loaded in one context, with its result words.
pub struct PersistentVerify(Persistent);

impl PersistentVerify {
    /// Loads the image that suits the context's device (`GPU_IPC_FORCE_PTX=1` forces the PTX).
    ///
    /// # Errors
    /// [`KernelError::NoImage`] or [`KernelError::ImageRejected`].
    pub fn load(ctx: &Context) -> Result<Self, KernelError> {
        Ok(Self(Persistent::load(ctx, PERSISTENT_VERIFY)?))
    }

    /// Launches the kernel on the consumer's ring: it verifies the next `frames` frames against their pattern and
    /// releases each, waiting at most `per_frame` for each (and leaving at once on the abort word). One block.
    ///
    /// # Errors
    /// As `Consumer::launch_on_ring` (a strategy other than gpu-stream-ops or gpu-poll, a kernel already on the
    /// ring, the producer gone), a driver error.
    pub fn launch<B: Backend>(
        &self,
        consumer: &mut Consumer<B>,
        stream: &Stream,
        frames: u64,
        per_frame: Duration,
    ) -> Result<(), FrameError> {
        let (config, args) = self.0.launch_args(frames, per_frame, consumer.slot_layout().bytes())?;
        consumer.launch_on_ring(&self.0.kernel, stream, config, &args)
    }

    /// Waits at most `timeout` for the kernel (`Consumer::finish_ring_kernel`: the consumer's next sequence moves
    /// past the frames it released), then reads what it reports.
    ///
    /// # Errors
    /// [`FrameError::Timeout`] when it is still running, a driver error.
    pub fn finish<B: Backend>(
        &self,
        consumer: &mut Consumer<B>,
        timeout: Duration,
    ) -> Result<PersistentResult, FrameError> {
        consumer.finish_ring_kernel(timeout)?;
        self.0.read()
    }
}

/// The persistent producer kernel, loaded in one context, with its result words.
///
/// ```no_run
/// use std::time::Duration;
/// use gpu_ipc_kernels::persistent::PersistentFill;
/// use ipc_core::backend::GpuBackend;
/// use gpu_ipc_driver::{Context, Stream};
/// use ipc_core::frames::Producer;
///
/// fn publish_frames<B: GpuBackend>(ctx: &Context, producer: &mut Producer<B>) -> Result<(), Box<dyn std::error::Error>> {
///     let kernel = PersistentFill::load(ctx)?;
///     let stream = Stream::new(ctx)?;
///     kernel.launch(producer, &stream, 1000, Duration::from_secs(1))?;
///     // finish_ring_kernel admits consumers that knock while the kernel publishes.
///     let result = kernel.finish(producer, Duration::from_secs(30))?;
///     assert_eq!(result.frames, 1000);
///     Ok(())
/// }
/// ```
pub struct PersistentFill(Persistent);

impl PersistentFill {
    /// Loads the image that suits the context's device (`GPU_IPC_FORCE_PTX=1` forces the PTX).
    ///
    /// # Errors
    /// [`KernelError::NoImage`] or [`KernelError::ImageRejected`].
    pub fn load(ctx: &Context) -> Result<Self, KernelError> {
        Ok(Self(Persistent::load(ctx, PERSISTENT_FILL)?))
    }

    /// Launches the kernel on the producer's ring: it publishes the next `frames` frames, each written with its
    /// pattern once its slot is free, waiting at most `per_frame` for each slot (and leaving at once on the abort
    /// word). One block.
    ///
    /// # Errors
    /// As `Producer::launch_on_ring` (a strategy other than gpu-stream-ops or gpu-poll, a kernel already on the
    /// ring), a driver error.
    pub fn launch<B: Backend>(
        &self,
        producer: &mut Producer<B>,
        stream: &Stream,
        frames: u64,
        per_frame: Duration,
    ) -> Result<(), FrameError> {
        let (config, args) = self.0.launch_args(frames, per_frame, producer.slot_layout().bytes())?;
        producer.launch_on_ring(&self.0.kernel, stream, config, &args)
    }

    /// Waits at most `timeout` for the kernel (`Producer::finish_ring_kernel`, which admits consumers meanwhile),
    /// then reads what it reports.
    ///
    /// # Errors
    /// [`FrameError::Timeout`] when it is still running, a driver error.
    pub fn finish<B: Backend>(
        &self,
        producer: &mut Producer<B>,
        timeout: Duration,
    ) -> Result<PersistentResult, FrameError> {
        producer.finish_ring_kernel(timeout)?;
        self.0.read()
    }
}

/// Threads per block of the grid kernels: `GPU_IPC_GRID_THREADS` of `kernels/cuda/pattern.cu`, whose
/// `__launch_bounds__` keep a thread within 64 registers so that two such blocks (one of each side's grid) fit on one
/// SM together.
pub const GRID_THREADS: u32 = 512;

/// Words of `struct gpu_ipc_grid_scratch`: 32 words of gate, outcomes and counts, then a counter per slot.
const GRID_SCRATCH_WORDS: usize = 32 + ipc_core::ring::layout::MAX_SLOTS as usize;

/// How a grid kernel spreads over the GPU: one leader block (the ring's waits) and `workers` worker blocks (the
/// frame's words), [`GRID_THREADS`] threads each.
///
/// Every block of both sides' grids must be resident at once (a worker waits for its leader, a producer for its
/// consumer): [`GridShape::per_sm`] gives each side one block per SM, which `__launch_bounds__` guarantees fit two
/// by two, under MPS at 100% active threads (the default). A grid that cannot be wholly resident does not hang: its
/// waits time out.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct GridShape {
    /// Worker blocks, at least 1.
    pub workers: u32,
}

impl GridShape {
    /// `workers` worker blocks for frames of `slot_bytes`, at most one per [`GRID_THREADS`] 16-byte vectors of the
    /// frame (a small frame needs few), at least one.
    pub fn new(slot_bytes: u64, workers: u32) -> Self {
        let useful = slot_bytes.div_ceil(16).div_ceil(u64::from(GRID_THREADS)).max(1);
        let workers = u64::from(workers).clamp(1, useful);
        Self { workers: u32::try_from(workers).unwrap_or(u32::MAX) }
    }

    /// One block per SM on a device of `sms` SMs: the leader and a worker per SM but one ([`GridShape::new`]), so
    /// that the producer's grid and the consumer's together hold two blocks per SM.
    pub fn per_sm(slot_bytes: u64, sms: u32) -> Self {
        Self::new(slot_bytes, sms.saturating_sub(1))
    }

    /// Blocks of the launch: the leader and the workers.
    pub fn blocks(self) -> u32 {
        self.workers.saturating_add(1)
    }

    fn config(self) -> LaunchConfig {
        LaunchConfig::linear(self.blocks(), GRID_THREADS)
    }
}

/// What both grid kernels share: the function, the result words, the scratch words (`struct gpu_ipc_grid_scratch`),
/// and the frame times (`times`, one word per frame of the last launch).
pub struct PersistentGrid {
    kernel: Function,
    result: DeviceBuffer,
    scratch: DeviceBuffer,
    times: Option<DeviceBuffer>,
    /// Frames of the last launch (the words of `times` it writes).
    frames: u64,
    /// Launched and not yet seen finished: its words are in use.
    running: bool,
}

impl PersistentGrid {
    fn load(ctx: &Context, name: &str) -> Result<Self, KernelError> {
        let (module, _) = load_module(ctx, crate::image::force_ptx_from_env())?;
        Ok(Self {
            kernel: module.function(name)?,
            result: DeviceBuffer::alloc(ctx, 32)?,
            scratch: DeviceBuffer::alloc(ctx, 8 * GRID_SCRATCH_WORDS as u64)?,
            times: None,
            frames: 0,
            running: false,
        })
    }

    /// Resets the result, scratch and time words for a launch of `frames` frames, refusing while the last launch
    /// may still use them.
    fn reset(&mut self, ctx: &Context, frames: u64) -> Result<(), FrameError> {
        if self.running {
            return Err(FrameError::Config(
                "this grid kernel's last launch has not been finished: call finish first".into(),
            ));
        }
        self.result.write(0, &[0u64, 0, u64::MAX, 0])?;
        self.scratch.write(0, &[0u64; GRID_SCRATCH_WORDS])?;
        let bytes = frames.max(1).saturating_mul(8);
        if self.times.as_ref().is_none_or(|t| t.span().len() < bytes) {
            self.times = Some(DeviceBuffer::alloc(ctx, bytes)?);
        }
        self.frames = frames;
        Ok(())
    }

    /// The arguments after the ring's descriptor: `frames`, the timeout per frame in ns, the result, scratch and
    /// time words.
    fn args(&self, per_frame: Duration) -> [KernelArg<'_>; 5] {
        let timeout_ns = u64::try_from(per_frame.as_nanos()).unwrap_or(u64::MAX);
        let times = self.times.as_ref().map_or(KernelArg::U64(0), |t| KernelArg::Span(t.span()));
        [
            KernelArg::U64(self.frames),
            KernelArg::U64(timeout_ns),
            KernelArg::Span(self.result.span()),
            KernelArg::Span(self.scratch.span()),
            times,
        ]
    }

    fn read(&mut self) -> Result<PersistentResult, FrameError> {
        self.running = false;
        let mut words = [0u64; 4];
        self.result.read(0, &mut words)?;
        Ok(PersistentResult {
            frames: words[0],
            mismatched_words: words[1],
            outcome: PersistentOutcome::from_raw(words[2]),
            stopped_at: words[3],
        })
    }

    /// When each frame of the last launch was published (the producer's kernel) or released (the consumer's), in
    /// ns of the GPU's `%globaltimer` (one clock for every process on the GPU): one word per frame of the launch,
    /// meaningful for the frames it reported done. Read it after `finish`.
    ///
    /// # Errors
    /// The kernel not finished, a driver error.
    pub fn frame_times(&self) -> Result<Vec<u64>, FrameError> {
        if self.running {
            return Err(FrameError::Config("the grid kernel is still running: call finish first".into()));
        }
        let Some(times) = &self.times else { return Ok(Vec::new()) };
        let mut words = vec![0u64; usize::try_from(self.frames).unwrap_or(0)];
        times.read(0, &mut words)?;
        Ok(words)
    }
}

/// The consumer's persistent kernel over the whole GPU (`gpu_ipc_persistent_verify_grid`): as
/// [`PersistentVerify`], each frame's words checked by every worker block.
///
/// ```no_run
/// use std::time::Duration;
/// use gpu_ipc_kernels::persistent::{GridShape, PersistentVerifyGrid};
/// use ipc_core::backend::GpuBackend;
/// use gpu_ipc_driver::{Context, Stream};
/// use ipc_core::frames::Consumer;
///
/// fn check_frames<B: GpuBackend>(ctx: &Context, consumer: &mut Consumer<B>) -> Result<(), Box<dyn std::error::Error>> {
///     let mut kernel = PersistentVerifyGrid::load(ctx)?;
///     let stream = Stream::new(ctx)?;
///     let shape = GridShape::per_sm(consumer.slot_layout().bytes(), ctx.device().sm_count()?);
///     kernel.launch(consumer, &stream, 1000, Duration::from_secs(1), shape)?;
///     let result = kernel.finish(consumer, Duration::from_secs(30))?;
///     assert_eq!((result.frames, result.mismatched_words), (1000, 0));
///     let released_ns = kernel.grid().frame_times()?;
///     Ok(())
/// }
/// ```
pub struct PersistentVerifyGrid(PersistentGrid);

impl PersistentVerifyGrid {
    /// Loads the image that suits the context's device (`GPU_IPC_FORCE_PTX=1` forces the PTX).
    ///
    /// # Errors
    /// [`KernelError::NoImage`] or [`KernelError::ImageRejected`].
    pub fn load(ctx: &Context) -> Result<Self, KernelError> {
        Ok(Self(PersistentGrid::load(ctx, PERSISTENT_VERIFY_GRID)?))
    }

    /// Launches the kernel on the consumer's ring in `shape`: it verifies the next `frames` frames against their
    /// pattern and releases each, its leader waiting at most `per_frame` for each (and leaving at once on the
    /// abort word).
    ///
    /// # Errors
    /// The last launch not finished, as `Consumer::launch_on_ring` (a strategy other than gpu-stream-ops or
    /// gpu-poll, a kernel already on the ring, the producer gone), a driver error.
    pub fn launch<B: Backend>(
        &mut self,
        consumer: &mut Consumer<B>,
        stream: &Stream,
        frames: u64,
        per_frame: Duration,
        shape: GridShape,
    ) -> Result<(), FrameError> {
        self.0.reset(stream.context(), frames)?;
        consumer.launch_on_ring(&self.0.kernel, stream, shape.config(), &self.0.args(per_frame))?;
        self.0.running = true;
        Ok(())
    }

    /// Waits at most `timeout` for the kernel (`Consumer::finish_ring_kernel`), then reads what it reports.
    ///
    /// # Errors
    /// [`FrameError::Timeout`] when it is still running, a driver error.
    pub fn finish<B: Backend>(
        &mut self,
        consumer: &mut Consumer<B>,
        timeout: Duration,
    ) -> Result<PersistentResult, FrameError> {
        consumer.finish_ring_kernel(timeout)?;
        self.0.read()
    }

    /// The words it shares with the producer's grid kernel (its frame times).
    pub fn grid(&self) -> &PersistentGrid {
        &self.0
    }
}

/// The producer's persistent kernel over the whole GPU (`gpu_ipc_persistent_fill_grid`): as [`PersistentFill`],
/// each frame's words written by every worker block.
pub struct PersistentFillGrid(PersistentGrid);

impl PersistentFillGrid {
    /// Loads the image that suits the context's device (`GPU_IPC_FORCE_PTX=1` forces the PTX).
    ///
    /// # Errors
    /// [`KernelError::NoImage`] or [`KernelError::ImageRejected`].
    pub fn load(ctx: &Context) -> Result<Self, KernelError> {
        Ok(Self(PersistentGrid::load(ctx, PERSISTENT_FILL_GRID)?))
    }

    /// Launches the kernel on the producer's ring in `shape`: it publishes the next `frames` frames, each written
    /// with its pattern once its slot is free, its leader waiting at most `per_frame` for each slot.
    ///
    /// # Errors
    /// The last launch not finished, as `Producer::launch_on_ring`, a driver error.
    pub fn launch<B: Backend>(
        &mut self,
        producer: &mut Producer<B>,
        stream: &Stream,
        frames: u64,
        per_frame: Duration,
        shape: GridShape,
    ) -> Result<(), FrameError> {
        self.0.reset(stream.context(), frames)?;
        producer.launch_on_ring(&self.0.kernel, stream, shape.config(), &self.0.args(per_frame))?;
        self.0.running = true;
        Ok(())
    }

    /// Waits at most `timeout` for the kernel (`Producer::finish_ring_kernel`, which admits consumers meanwhile),
    /// then reads what it reports.
    ///
    /// # Errors
    /// [`FrameError::Timeout`] when it is still running, a driver error.
    pub fn finish<B: Backend>(
        &mut self,
        producer: &mut Producer<B>,
        timeout: Duration,
    ) -> Result<PersistentResult, FrameError> {
        producer.finish_ring_kernel(timeout)?;
        self.0.read()
    }

    /// The words it shares with the consumer's grid kernel (its frame times).
    pub fn grid(&self) -> &PersistentGrid {
        &self.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_block_is_as_wide_as_the_frame_in_whole_warps() {
        assert_eq!(threads_for(256), 32);
        assert_eq!(threads_for(4), 32);
        assert_eq!(threads_for(16 * 100), 128);
        assert_eq!(threads_for(640 * 360 * 3), 1024);
    }

    #[test]
    fn a_grid_has_a_leader_and_a_worker_per_sm_but_one_and_no_idle_workers_on_small_frames() {
        let frame = 3840 * 2160 * 3;
        assert_eq!(GridShape::per_sm(frame, 132), GridShape { workers: 131 });
        assert_eq!(GridShape::per_sm(frame, 132).blocks(), 132);
        // 256 bytes are 16 vectors: one worker of 512 threads is more than enough.
        assert_eq!(GridShape::per_sm(256, 132).workers, 1);
        assert_eq!(GridShape::new(16 * u64::from(GRID_THREADS) * 3 + 1, 100).workers, 4);
        assert_eq!(GridShape::per_sm(frame, 1).workers, 1, "a one-SM device still gets a worker");
        assert_eq!(GridShape::per_sm(frame, 0).blocks(), 2);
    }

    #[test]
    fn the_grid_constants_are_the_kernels() {
        let source = include_str!("../cuda/pattern.cu");
        assert!(source.contains(&format!("#define GPU_IPC_GRID_THREADS {GRID_THREADS}\n")));
        assert!(source.contains("#define GPU_IPC_GRID_MIN_BLOCKS 2\n"));
        // struct gpu_ipc_grid_scratch: 16 words of gate line, 16 of outcomes and counts, then the slots' counters.
        assert!(source.contains("unsigned long long gate_line[15];"));
        assert!(source.contains("unsigned long long counts_line[12];"));
        assert!(source.contains("unsigned long long done[GPU_IPC_RING_MAX_SLOTS];"));
        let ptx = crate::image::IMAGES.iter().find(|i| i.file.ends_with(".ptx")).map(|i| i.bytes);
        let ptx = ptx.map(String::from_utf8_lossy).unwrap_or_default();
        for kernel in [PERSISTENT_VERIFY_GRID, PERSISTENT_FILL_GRID] {
            assert!(ptx.contains(&format!(".entry {kernel}(")), "{kernel}");
        }
    }

    #[test]
    fn outcomes_are_the_kernels_codes() {
        let ptx = crate::image::IMAGES.iter().find(|i| i.file.ends_with(".ptx")).map(|i| i.bytes);
        let ptx = ptx.map(String::from_utf8_lossy).unwrap_or_default();
        for kernel in [PERSISTENT_VERIFY, PERSISTENT_FILL] {
            assert!(ptx.contains(&format!(".entry {kernel}(")), "{kernel}");
        }
        assert_eq!(PersistentOutcome::from_raw(0), PersistentOutcome::Done);
        assert_eq!(PersistentOutcome::from_raw(1), PersistentOutcome::TimedOut);
        assert_eq!(PersistentOutcome::from_raw(2), PersistentOutcome::Aborted);
        assert_eq!(PersistentOutcome::from_raw(3), PersistentOutcome::StampInvalid);
        assert_eq!(PersistentOutcome::from_raw(u64::MAX), PersistentOutcome::Unknown(u64::MAX));
        let source = include_str!("../cuda/pattern.cu");
        assert!(source.contains("#define GPU_IPC_PERSISTENT_STAMP_INVALID 3ull"));
        let header = include_str!("../cuda/gpu_ipc_ring_waits.cuh");
        assert!(
            header.contains("#define GPU_IPC_RING_TIMED_OUT 1") && header.contains("#define GPU_IPC_RING_ABORTED 2")
        );
        assert!(header.contains("#define GPU_IPC_RING_ORPHANED 4"));
        assert_eq!(PersistentOutcome::from_raw(4), PersistentOutcome::Orphaned);
    }
}
