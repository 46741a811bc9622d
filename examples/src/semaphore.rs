//! What the `semaphore` example program stands on: a backend's context (and a stream on a GPU), creating and
//! attaching semaphores for a backend chosen at run time, and how an outcome is reported.

use std::path::Path;
use std::time::{Duration, Instant};

use gpu_ipc::core::backend::GpuBackend;
use gpu_ipc::core::driver::{Context, Stream, WaitCondition};
use gpu_ipc::core::pool::{AttachOptions as PoolAttachOptions, PoolConfig, PoolError, PoolImporter, SharedPool};
use gpu_ipc::core::semaphore::{AttachOptions, OwnerOptions, Semaphore, SemaphoreError, SemaphoreOwner};
use gpu_ipc::host::{HostContext, HostFake};
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
            None => Ok(SemaphoreOwner::create_with::<HostFake>(&HostContext, socket, options)?),
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
                None => Semaphore::attach::<HostFake>(&HostContext, socket, options),
                Some((ctx, _)) => {
                    gpu_ipc::dispatch_gpu(self.kind, Attach(ctx, socket, options)).map_err(unavailable)?
                }
            };
            match attached {
                Err(SemaphoreError::Door(gpu_ipc::core::door::DoorError::NoOwner { .. }))
                    if Instant::now() < deadline =>
                {
                    std::thread::sleep(Duration::from_millis(20));
                }
                done => return Ok(done?),
            }
        }
    }
}

/// The reference the stream round trip is compared with, measured in the same run: the same ping-pong through bare
/// stream memory operations, as the ring signals (`cuStreamWriteValue64` of round `i` into the partner's word, then
/// `cuStreamWaitValue64` until the partner's answer reaches `i`), on two words of one pool buffer both processes map
/// ([`MEMOPS_BUFFER`]: the ping's word at byte 0, the pong's at byte 128).
pub const MEMOPS_BUFFER: &str = "semaphore-bench-words";

impl Device {
    /// The reference's ping side: serves a pool at `socket` holding the two words, starts the partner with `spawn`,
    /// and runs `rounds` rounds in batches of `batch`, queued on this device's stream; returns the time per round
    /// of each batch and the partner's process.
    ///
    /// # Errors
    /// The host backend (no stream), the pool's or the driver's error, or the partner not answering in `timeout`.
    pub fn memops_ping(
        &self,
        socket: &Path,
        rounds: u64,
        batch: u64,
        timeout: Duration,
        spawn: &mut dyn FnMut() -> Result<std::process::Child, ExampleError>,
    ) -> Result<(Vec<Duration>, std::process::Child), ExampleError> {
        struct Ping<'a> {
            ctx: &'a Context,
            stream: &'a Stream,
            socket: &'a Path,
            rounds: u64,
            batch: u64,
            timeout: Duration,
            spawn: &'a mut dyn FnMut() -> Result<std::process::Child, ExampleError>,
        }
        impl GpuBackendVisitor for Ping<'_> {
            type Output = Result<(Vec<Duration>, std::process::Child), ExampleError>;
            fn visit<B: GpuBackend>(self) -> Self::Output {
                let pool = SharedPool::<B>::create(self.ctx, self.socket, PoolConfig::new(4 << 20))?;
                let words = pool.alloc(MEMOPS_BUFFER, 256, 256, None)?;
                let span = words.span()?;
                span.write(0, &[0u64; 32])?;
                let partner = (self.spawn)()?;
                let mut times = Vec::new();
                let mut done = 0;
                while done < self.rounds {
                    let n = self.batch.min(self.rounds - done);
                    let t0 = Instant::now();
                    for i in done + 1..=done + n {
                        span.write_value_u64(self.stream, 0, i)?;
                        span.wait_value_u64(self.stream, 128, i, WaitCondition::AtLeast)?;
                    }
                    if !stream_idle_within(self.stream, self.timeout)? {
                        return Err(SemaphoreError::Timeout { waited: self.timeout }.into());
                    }
                    times.push(t0.elapsed() / n as u32);
                    done += n;
                }
                Ok((times, partner))
            }
        }
        let Some((ctx, stream)) = &self.gpu else { return Err(SemaphoreError::NoCudaContext.into()) };
        let ping = Ping { ctx, stream, socket, rounds, batch, timeout, spawn };
        gpu_ipc::dispatch_gpu(self.kind, ping).map_err(unavailable)?
    }

    /// The reference's pong side: attaches to the ping's pool at `socket` and answers `rounds` rounds.
    ///
    /// # Errors
    /// As [`memops_ping`](Self::memops_ping).
    pub fn memops_pong(&self, socket: &Path, rounds: u64, batch: u64, timeout: Duration) -> Result<(), ExampleError> {
        struct Pong<'a> {
            ctx: &'a Context,
            stream: &'a Stream,
            socket: &'a Path,
            rounds: u64,
            batch: u64,
            timeout: Duration,
        }
        impl GpuBackendVisitor for Pong<'_> {
            type Output = Result<(), ExampleError>;
            fn visit<B: GpuBackend>(self) -> Self::Output {
                let options = PoolAttachOptions { name: "semaphore-bench-pong".into(), ..PoolAttachOptions::default() };
                let pool = PoolImporter::<B>::attach(self.ctx, self.socket, &options)?;
                let view = pool.lookup(MEMOPS_BUFFER)?;
                let span = view.span()?;
                let mut done = 0;
                while done < self.rounds {
                    let n = self.batch.min(self.rounds - done);
                    for i in done + 1..=done + n {
                        span.wait_value_u64(self.stream, 0, i, WaitCondition::AtLeast)?;
                        span.write_value_u64(self.stream, 128, i)?;
                    }
                    if !stream_idle_within(self.stream, self.timeout)? {
                        return Err(SemaphoreError::Timeout { waited: self.timeout }.into());
                    }
                    done += n;
                }
                Ok(())
            }
        }
        let Some((ctx, stream)) = &self.gpu else { return Err(SemaphoreError::NoCudaContext.into()) };
        gpu_ipc::dispatch_gpu(self.kind, Pong { ctx, stream, socket, rounds, batch, timeout }).map_err(unavailable)?
    }
}

/// What the program can fail with: the semaphore's errors, or a backend this build does not have.
#[derive(Debug)]
pub enum ExampleError {
    /// The semaphore's error.
    Semaphore(SemaphoreError),
    /// A backend not compiled into this build.
    Backend(gpu_ipc::BackendUnavailable),
    /// The pool the benchmark's reference round trip shares its two words through.
    Pool(PoolError),
}

impl From<PoolError> for ExampleError {
    fn from(e: PoolError) -> Self {
        Self::Pool(e)
    }
}

impl std::fmt::Display for ExampleError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Semaphore(e) => e.fmt(f),
            Self::Backend(e) => e.fmt(f),
            Self::Pool(e) => write!(f, "the benchmark's reference pool: {e}"),
        }
    }
}

impl std::error::Error for ExampleError {}

impl From<SemaphoreError> for ExampleError {
    fn from(e: SemaphoreError) -> Self {
        Self::Semaphore(e)
    }
}

impl From<gpu_ipc::core::driver::DriverError> for ExampleError {
    fn from(e: gpu_ipc::core::driver::DriverError) -> Self {
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
