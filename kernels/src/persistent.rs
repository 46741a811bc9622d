//! The example persistent consumer of the ring's device API (`kernels/cuda/gpu_ipc_ring.cuh`):
//! `gpu_ipc_persistent_verify`, one launch that waits for, checks and releases frames with no launch and no CPU work
//! per frame, launched through `Consumer::launch_on_ring` (which hands it the ring's descriptor and raises its abort
//! word when the producer dies or the consumer is dropped).
//!
//! ```no_run
//! use std::time::Duration;
//! use gpu_ipc_kernels::persistent::PersistentVerify;
//! use ipc_core::backend::GpuBackend;
//! use ipc_core::driver::{Context, Stream};
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

use ipc_core::backend::Backend;
use ipc_core::driver::{Context, DeviceBuffer, DeviceMemory, Function, KernelArg, LaunchConfig, Stream};
use ipc_core::frames::{Consumer, FrameError};

use crate::PERSISTENT_VERIFY;
use crate::launch::{KernelError, load_module};

/// Threads of the kernel's one block.
const THREADS: u32 = 1024;

/// Why the persistent kernel stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum PersistentOutcome {
    /// Every frame asked for was verified and released.
    Done,
    /// A frame did not come within the timeout per frame.
    TimedOut,
    /// The host raised the abort word (the producer hung up, the consumer was dropped).
    Aborted,
    /// A frame's stamp was not the producer's: it died before it published that frame.
    StampInvalid,
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
            other => Self::Unknown(other),
        }
    }
}

/// What the persistent kernel reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct PersistentResult {
    /// Frames verified and released.
    pub frames: u64,
    /// Words of those frames that differed from their pattern (0 when all is well).
    pub mismatched_words: u64,
    /// Why it stopped.
    pub outcome: PersistentOutcome,
    /// The frame it stopped at (the first not released).
    pub stopped_at: u64,
}

/// The persistent consumer kernel, loaded in one context, with its result words.
pub struct PersistentVerify {
    kernel: Function,
    result: DeviceBuffer,
}

impl PersistentVerify {
    /// Loads the image that suits the context's device (`GPU_IPC_FORCE_PTX=1` forces the PTX).
    ///
    /// # Errors
    /// [`KernelError::NoImage`] or [`KernelError::ImageRejected`].
    pub fn load(ctx: &Context) -> Result<Self, KernelError> {
        let (module, _) = load_module(ctx, crate::image::force_ptx_from_env())?;
        Ok(Self { kernel: module.function(PERSISTENT_VERIFY)?, result: DeviceBuffer::alloc(ctx, 32)? })
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
        // The result holds "not written" until the kernel writes it.
        self.result.write(0, &[0u64, 0, u64::MAX, 0])?;
        let timeout_ns = u64::try_from(per_frame.as_nanos()).unwrap_or(u64::MAX);
        consumer.launch_on_ring(
            &self.kernel,
            stream,
            LaunchConfig::linear(1, THREADS),
            &[KernelArg::U64(frames), KernelArg::U64(timeout_ns), KernelArg::Span(self.result.span())],
        )
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn outcomes_are_the_kernels_codes() {
        let ptx = crate::image::IMAGES.iter().find(|i| i.file.ends_with(".ptx")).map(|i| i.bytes);
        assert!(ptx.is_some_and(|p| String::from_utf8_lossy(p).contains(&format!(".entry {PERSISTENT_VERIFY}("))));
        assert_eq!(PersistentOutcome::from_raw(0), PersistentOutcome::Done);
        assert_eq!(PersistentOutcome::from_raw(1), PersistentOutcome::TimedOut);
        assert_eq!(PersistentOutcome::from_raw(2), PersistentOutcome::Aborted);
        assert_eq!(PersistentOutcome::from_raw(3), PersistentOutcome::StampInvalid);
        assert_eq!(PersistentOutcome::from_raw(u64::MAX), PersistentOutcome::Unknown(u64::MAX));
        let source = include_str!("../cuda/pattern.cu");
        assert!(source.contains("#define GPU_IPC_PERSISTENT_STAMP_INVALID 3ull"));
        let header = include_str!("../cuda/gpu_ipc_ring.cuh");
        assert!(
            header.contains("#define GPU_IPC_RING_TIMED_OUT 1") && header.contains("#define GPU_IPC_RING_ABORTED 2")
        );
    }
}
