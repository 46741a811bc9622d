//! What the `work_queue` example program stands on: running code generic over the queue's backend for a backend
//! chosen at run time, the GPU side (context, stream, the demo kernels), and how an outcome is reported.

use std::time::{Duration, Instant};

use gpu_ipc::BackendKind;
use gpu_ipc::driver::{Context, DriverError, Stream};
use gpu_ipc::host::{Host, HostContext};
use gpu_ipc::kernels::launch::KernelError;
use gpu_ipc::kernels::work_queue::QueueDemoKernels;
use gpu_ipc::queue::{QueueBackend, QueueError};

/// Exit status when the queue ended under a worker (its owner died).
pub const EXIT_OWNER_GONE: u8 = crate::exit::EXIT_PEER_GONE;

/// A GPU program's context, stream and demo kernels.
pub struct Gpu {
    /// The device's primary context.
    pub ctx: Context,
    /// The stream the program's kernels go on.
    pub stream: Stream,
    /// The demo worker and producer.
    pub kernels: QueueDemoKernels,
}

impl Gpu {
    /// Opens device `ordinal`, makes a stream and loads the demo kernels.
    ///
    /// # Errors
    /// No driver or device, or no kernel image for it.
    pub fn open(ordinal: i32) -> Result<Self, ExampleError> {
        let ctx = Context::for_ordinal(ordinal)?;
        let stream = Stream::new(&ctx)?;
        let kernels = QueueDemoKernels::load(&ctx)?;
        Ok(Self { ctx, stream, kernels })
    }

    /// Waits until the stream has run its work, up to `timeout`.
    ///
    /// # Errors
    /// [`ExampleError::Usage`] naming `what` when it has not; a driver error.
    pub fn finish(&self, what: &str, timeout: Duration) -> Result<(), ExampleError> {
        if self.kernels.wait(&self.stream, timeout)? {
            Ok(())
        } else {
            Err(ExampleError::Usage(format!("{what} did not finish within {timeout:?}")))
        }
    }
}

/// Code generic over the queue's backend.
pub trait QueueProgram {
    /// What it returns.
    type Output;
    /// Runs it with `B`, in `ctx`; `gpu` on the GPU backends.
    fn run<B: QueueBackend>(self, ctx: &B::Context, gpu: Option<&Gpu>) -> Result<Self::Output, ExampleError>;
}

/// Runs `program` with the backend `kind` on device `ordinal`.
///
/// # Errors
/// A backend not compiled into this build, no driver, or the program's error.
pub fn run_queue_program<P: QueueProgram>(
    kind: BackendKind,
    ordinal: i32,
    program: P,
) -> Result<P::Output, ExampleError> {
    if !kind.is_gpu() {
        return program.run::<Host>(&HostContext, None);
    }
    let unavailable = || ExampleError::Usage(gpu_ipc::BackendUnavailable { kind, needs_gpu: true }.to_string());
    if !gpu_ipc::COMPILED_GPU.contains(&kind) {
        return Err(unavailable());
    }
    let gpu = Gpu::open(ordinal)?;
    match kind {
        #[cfg(feature = "legacy")]
        BackendKind::Legacy => program.run::<gpu_ipc::legacy::Legacy>(&gpu.ctx, Some(&gpu)),
        #[cfg(feature = "vmm")]
        BackendKind::Vmm => program.run::<gpu_ipc::vmm::Vmm>(&gpu.ctx, Some(&gpu)),
        _ => Err(unavailable()),
    }
}

/// What the program can fail with.
#[derive(Debug)]
pub enum ExampleError {
    /// The queue's error.
    Queue(QueueError),
    /// The demo kernels' error.
    Kernel(KernelError),
    /// A wrong option, a backend not compiled in, or a run that did not add up.
    Usage(String),
}

impl std::fmt::Display for ExampleError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Queue(e) => e.fmt(f),
            Self::Kernel(e) => e.fmt(f),
            Self::Usage(e) => f.write_str(e),
        }
    }
}

impl std::error::Error for ExampleError {}

impl From<QueueError> for ExampleError {
    fn from(e: QueueError) -> Self {
        Self::Queue(e)
    }
}

impl From<KernelError> for ExampleError {
    fn from(e: KernelError) -> Self {
        Self::Kernel(e)
    }
}

impl From<DriverError> for ExampleError {
    fn from(e: DriverError) -> Self {
        Self::Queue(e.into())
    }
}

/// The word a summary gives an outcome: `done`, or what ended the run.
pub fn outcome_word<T>(result: &Result<T, ExampleError>) -> &'static str {
    match result {
        Ok(_) => "done",
        Err(ExampleError::Queue(QueueError::OwnerGone { .. })) => "owner-gone",
        Err(ExampleError::Queue(QueueError::Timeout { .. } | QueueError::Full { .. } | QueueError::NotDone { .. })) => {
            "timeout"
        }
        Err(ExampleError::Queue(QueueError::Driver(DriverError::LibraryNotFound { .. }))) => "no-driver",
        Err(_) => "error",
    }
}

/// The exit status for an outcome: 0 done, 3 no CUDA driver, [`EXIT_OWNER_GONE`], 1 otherwise.
pub fn exit_status<T>(result: &Result<T, ExampleError>) -> u8 {
    match outcome_word(result) {
        "done" => crate::exit::EXIT_OK,
        "no-driver" => crate::EXIT_NO_DRIVER,
        "owner-gone" => EXIT_OWNER_GONE,
        _ => crate::exit::EXIT_FAILURE,
    }
}

/// Tasks per second over `elapsed`.
pub fn per_second(tasks: u64, elapsed: Duration) -> f64 {
    if elapsed.is_zero() { 0.0 } else { tasks as f64 / elapsed.as_secs_f64() }
}

/// Calls `step` until it returns `Some`, sleeping `nap` between calls, for up to `timeout`.
///
/// # Errors
/// [`ExampleError::Usage`] naming `what` at the deadline, or `step`'s error.
pub fn retry_until<T>(
    what: &str,
    timeout: Duration,
    nap: Duration,
    mut step: impl FnMut() -> Result<Option<T>, ExampleError>,
) -> Result<T, ExampleError> {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(done) = step()? {
            return Ok(done);
        }
        if Instant::now() >= deadline {
            return Err(ExampleError::Usage(format!("{what}: nothing within {timeout:?}")));
        }
        std::thread::sleep(nap);
    }
}
