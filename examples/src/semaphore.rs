//! What the `semaphore` example program stands on: a backend's context (and a stream on a GPU), creating and
//! attaching semaphores for a backend chosen at run time, and how an outcome is reported.

use std::path::Path;
use std::time::{Duration, Instant};

use gpu_ipc::core::backend::GpuBackend;
use gpu_ipc::driver::{Context, Stream};
use gpu_ipc::host::{Host, HostContext};
use gpu_ipc::semaphore::{AttachOptions, OwnerOptions, Semaphore, SemaphoreError, SemaphoreOwner};
use gpu_ipc::{BackendKind, GpuBackendVisitor};

/// Exit status when the semaphore ended under the program (poisoned by a dead poster, the owner died, or it was
/// closed): the table's [`EXIT_PEER_GONE`](crate::exit::EXIT_PEER_GONE).
pub const EXIT_SEMAPHORE_ENDED: u8 = crate::exit::EXIT_PEER_GONE;

/// The backend the program runs with: its kind, and on a GPU the device's context and one stream.
pub struct Device {
    /// The backend.
    pub kind: BackendKind,
    /// The context and stream (`None` on the host backend).
    pub gpu: Option<(Context, Stream)>,
}

impl Device {
    /// Opens `kind`'s backend on device `ordinal` (nothing to open on the host backend).
    ///
    /// # Errors
    /// No driver or device.
    pub fn open(kind: BackendKind, ordinal: i32) -> Result<Self, ExampleError> {
        let gpu = if kind.is_gpu() {
            let ctx = Context::for_ordinal(ordinal)?;
            let stream = Stream::new(&ctx)?;
            Some((ctx, stream))
        } else {
            None
        };
        Ok(Self { kind, gpu })
    }

    /// The stream, or the error that says a GPU backend is needed.
    ///
    /// # Errors
    /// [`SemaphoreError::NoCudaContext`] on the host backend.
    pub fn stream(&self) -> Result<&Stream, ExampleError> {
        self.gpu.as_ref().map(|(_, stream)| stream).ok_or(ExampleError::Semaphore(SemaphoreError::NoCudaContext))
    }

    /// Creates a semaphore served at `socket`.
    ///
    /// # Errors
    /// As [`SemaphoreOwner::create_with`]; a backend not compiled in.
    pub fn create(&self, socket: &Path, options: &OwnerOptions) -> Result<SemaphoreOwner, ExampleError> {
        struct Create<'a>(&'a Context, &'a Path, &'a OwnerOptions);
        impl GpuBackendVisitor for Create<'_> {
            type Output = Result<SemaphoreOwner, SemaphoreError>;
            fn visit<B: GpuBackend>(self) -> Self::Output {
                SemaphoreOwner::create_with::<B>(self.0, self.1, self.2)
            }
        }
        match &self.gpu {
            None => Ok(SemaphoreOwner::create_with::<Host>(&HostContext, socket, options)?),
            Some((ctx, _)) => Ok(gpu_ipc::dispatch_gpu(self.kind, Create(ctx, socket, options)).map_err(unavailable)??),
        }
    }

    /// Attaches to the semaphore at `socket`, retrying until `patience` passes while nothing listens there yet.
    ///
    /// # Errors
    /// As [`Semaphore::attach`]; a backend not compiled in.
    pub fn attach(
        &self,
        socket: &Path,
        options: &AttachOptions,
        patience: Duration,
    ) -> Result<Semaphore, ExampleError> {
        struct Attach<'a>(&'a Context, &'a Path, &'a AttachOptions);
        impl GpuBackendVisitor for Attach<'_> {
            type Output = Result<Semaphore, SemaphoreError>;
            fn visit<B: GpuBackend>(self) -> Self::Output {
                Semaphore::attach::<B>(self.0, self.1, self.2)
            }
        }
        let deadline = Instant::now() + patience;
        loop {
            let attached = match &self.gpu {
                None => Semaphore::attach::<Host>(&HostContext, socket, options),
                Some((ctx, _)) => {
                    gpu_ipc::dispatch_gpu(self.kind, Attach(ctx, socket, options)).map_err(unavailable)?
                }
            };
            match attached {
                Err(SemaphoreError::Door(gpu_ipc::toolkit::door::DoorError::NoOwner { .. }))
                    if Instant::now() < deadline =>
                {
                    std::thread::sleep(Duration::from_millis(20));
                }
                done => return Ok(done?),
            }
        }
    }
}

/// What the program can fail with: the semaphore's errors, or a backend this build does not have.
#[derive(Debug)]
pub enum ExampleError {
    /// The semaphore's error.
    Semaphore(SemaphoreError),
    /// A backend not compiled into this build.
    Backend(gpu_ipc::BackendUnavailable),
}

impl std::fmt::Display for ExampleError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Semaphore(e) => e.fmt(f),
            Self::Backend(e) => e.fmt(f),
        }
    }
}

impl std::error::Error for ExampleError {}

impl From<SemaphoreError> for ExampleError {
    fn from(e: SemaphoreError) -> Self {
        Self::Semaphore(e)
    }
}

impl From<gpu_ipc::driver::DriverError> for ExampleError {
    fn from(e: gpu_ipc::driver::DriverError) -> Self {
        Self::Semaphore(e.into())
    }
}

fn unavailable(e: gpu_ipc::BackendUnavailable) -> ExampleError {
    ExampleError::Backend(e)
}

/// The word a summary gives an outcome: `done`, or what ended the run.
pub fn outcome_word(result: &Result<(), ExampleError>) -> &'static str {
    match result {
        Ok(()) => "done",
        Err(ExampleError::Semaphore(SemaphoreError::Timeout { .. })) => "timeout",
        Err(ExampleError::Semaphore(SemaphoreError::PosterDied { .. })) => "poster-died",
        Err(ExampleError::Semaphore(SemaphoreError::OwnerGone { .. })) => "owner-gone",
        Err(ExampleError::Semaphore(SemaphoreError::Closed)) => "closed",
        Err(_) => "error",
    }
}

/// The exit status for an outcome: 0 done (or a timeout the caller accepts), [`EXIT_SEMAPHORE_ENDED`] when the
/// semaphore ended, 1 for any other error.
pub fn exit_status(result: &Result<(), ExampleError>) -> u8 {
    match outcome_word(result) {
        "done" => crate::exit::EXIT_OK,
        "poster-died" | "owner-gone" | "closed" => EXIT_SEMAPHORE_ENDED,
        _ => crate::exit::EXIT_FAILURE,
    }
}

/// Waits until `stream` has done its queued work, or `timeout` passes (then `false`): a stream wait that nothing
/// releases must not hang the program.
///
/// # Errors
/// A driver error (from a kernel queued earlier, for instance).
pub fn stream_idle_within(stream: &Stream, timeout: Duration) -> Result<bool, ExampleError> {
    let deadline = Instant::now() + timeout;
    loop {
        if stream.is_idle()? {
            return Ok(true);
        }
        if Instant::now() >= deadline {
            return Ok(false);
        }
        std::thread::sleep(Duration::from_micros(20));
    }
}

/// Percentile `p` (0..=100) of sorted `values`, in microseconds.
pub fn percentile_us(sorted: &[Duration], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let rank = ((p / 100.0) * (sorted.len() - 1) as f64).round() as usize;
    sorted[rank.min(sorted.len() - 1)].as_secs_f64() * 1e6
}
