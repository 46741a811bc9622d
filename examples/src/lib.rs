//! What the example programs share. The `producer` and `consumer`: their command-line vocabulary, how they fill,
//! check and transform frames ([`work`]: on a GPU, or on the host backend without one) and the summary each prints
//! (one JSON object with `--json`). The roles of the three-stage `pipeline` program: [`pipeline`]. The `semaphore`
//! program: [`semaphore`]. The `work_queue` program: [`work_queue`]. Every program's exit statuses: [`exit`].

#![forbid(unsafe_code)] // Only ipc-core's driver and sys layers may contain `unsafe`.

use std::path::PathBuf;
use std::time::Duration;

use gpu_ipc::BackendKind;
use gpu_ipc::core::frames::FrameError;
use gpu_ipc::core::wire::PixelFormat;
use gpu_ipc::driver::{Context, Stream};
use gpu_ipc::kernels::launch::{KernelError, PatternKernels};

pub mod exit;
pub mod pipeline;
pub mod pool_work;
pub mod semaphore;
pub mod work;
pub mod work_queue;

/// What both programs set up on the GPU: the device's context, the frame-pattern kernels and one stream.
pub struct Gpu {
    /// The device's primary context.
    pub ctx: Context,
    /// Fill and verify kernels.
    pub kernels: PatternKernels,
    /// The stream all of a program's work goes on.
    pub stream: Stream,
}

impl Gpu {
    /// Opens device `ordinal`, loads the kernels and makes a stream.
    ///
    /// # Errors
    /// No driver or device, or no kernel image for it.
    pub fn open(ordinal: i32) -> Result<Self, FrameError> {
        let ctx = Context::for_ordinal(ordinal)?;
        let kernels = PatternKernels::load(&ctx).map_err(kernel_error)?;
        let stream = Stream::new(&ctx)?;
        Ok(Self { ctx, kernels, stream })
    }
}

/// A kernel error in the frame API's terms (the kernels crate sits above `ipc-core`, so no `From` exists).
pub fn kernel_error(e: KernelError) -> FrameError {
    FrameError::Config(e.to_string())
}

/// The options both programs take: where to meet, which backend and device, how to report.
#[derive(Debug, Clone, clap::Args)]
pub struct CommonArgs {
    /// Rendezvous socket (the producer creates it, consumers connect to it).
    #[arg(long, default_value = "/tmp/gpu-ipc-frames.sock")]
    pub socket: PathBuf,
    /// Backend: legacy, vmm, or host (host memory, CPU strategies only: a demo that needs no GPU). Consumers must
    /// match the producer's.
    #[arg(long, default_value = "vmm")]
    pub backend: BackendKind,
    /// How long to wait for the other side to show up, in seconds (the producer for its consumers, a consumer for
    /// its producer's socket).
    #[arg(long, default_value_t = 30)]
    pub attach_timeout: u64,
    /// CUDA device.
    #[arg(long, default_value_t = 0)]
    pub device: i32,
    /// Print the summary as one JSON object.
    #[arg(long)]
    pub json: bool,
}

/// The options every role of the pool and weights examples takes, after the role (`pool owner --backend host`):
/// which backend (vmm by default) and device, how to report.
#[derive(Debug, Clone, clap::Args)]
pub struct RoleArgs {
    /// Backend: legacy, vmm, or host (host memory: no GPU needed).
    #[arg(long, default_value = "vmm")]
    pub backend: BackendKind,
    /// CUDA device.
    #[arg(long, default_value_t = 0)]
    pub device: i32,
    /// Print the summary as one JSON object.
    #[arg(long)]
    pub json: bool,
}

/// The options of the semaphore and work-queue examples, before or after the subcommand: which backend (host by
/// default: host memory, the CPU's side only, no GPU needed) and device, how to report.
#[derive(Debug, Clone, clap::Args)]
pub struct ObjectArgs {
    /// Backend: legacy, vmm, or host (host memory: the CPU's side only, no GPU needed).
    #[arg(long, global = true, default_value = "host")]
    pub backend: BackendKind,
    /// CUDA device.
    #[arg(long, global = true, default_value_t = 0)]
    pub device: i32,
    /// Print the summary as one JSON object.
    #[arg(long, global = true)]
    pub json: bool,
}

/// Parses a pixel format: `rgb8`, `rgba8`, `gray8`.
///
/// # Errors
/// The list of valid names.
pub fn parse_pixel_format(s: &str) -> Result<PixelFormat, String> {
    match s {
        "rgb8" => Ok(PixelFormat::Rgb8),
        "rgba8" => Ok(PixelFormat::Rgba8),
        "gray8" => Ok(PixelFormat::Gray8),
        _ => Err(format!("unknown pixel format `{s}`; use rgb8, rgba8 or gray8")),
    }
}

/// Prints a program's summary on stdout: one JSON object with `--json`, else the line `human` makes.
pub fn print_summary<S: serde::Serialize>(json: bool, summary: &S, human: impl FnOnce(&S) -> String) {
    if json {
        println!("{}", serde_json::to_string(summary).unwrap_or_default());
    } else {
        println!("{}", human(summary));
    }
}

/// Frames per second over `elapsed`.
pub fn fps(frames: u64, elapsed: Duration) -> f64 {
    if elapsed.is_zero() { 0.0 } else { frames as f64 / elapsed.as_secs_f64() }
}

/// CPU time (user + system) this process has used so far.
pub fn cpu_time() -> Duration {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::ProcessCPUTime);
    Duration::new(t.tv_sec.max(0) as u64, t.tv_nsec.clamp(0, 999_999_999) as u32)
}

pub use exit::{EXIT_EVICTED, EXIT_FAILURE, EXIT_NO_DRIVER};

/// Exit status of a consumer whose producer died (not a clean end of stream, which exits 0): the table's
/// [`exit::EXIT_PEER_GONE`].
pub const EXIT_PRODUCER_GONE: u8 = exit::EXIT_PEER_GONE;

/// The exit status and the one line a program prints for `e`: [`EXIT_NO_DRIVER`] when the CUDA driver is missing
/// (with the hint that `--backend host` runs without one), else [`EXIT_FAILURE`].
pub fn exit_for(program: &str, e: &FrameError) -> (u8, String) {
    use gpu_ipc::driver::DriverError;
    let no_driver = matches!(
        e,
        FrameError::Driver(DriverError::LibraryNotFound { .. })
            | FrameError::Backend(gpu_ipc::core::backend::BackendError::Driver(DriverError::LibraryNotFound { .. }))
    );
    if no_driver {
        (EXIT_NO_DRIVER, format!("{program}: {e} (`--backend host` runs the demo without a GPU)"))
    } else {
        (EXIT_FAILURE, format!("{program}: {e}"))
    }
}

/// Open file descriptors of this process (entries of `/proc/self/fd`, including the one reading it), or 0 when
/// `/proc` cannot be read.
pub fn open_fds() -> u64 {
    std::fs::read_dir("/proc/self/fd").map_or(0, |dir| dir.count() as u64)
}

/// Free device memory in bytes as `cuMemGetInfo` reports it (device-wide, every process's allocations count), or
/// `None` when the driver cannot say.
pub fn device_free_bytes(ctx: &Context) -> Option<u64> {
    ctx.memory_info().ok().map(|(free, _total)| free)
}

/// The longest time between two successive events (publishes, frames received), from the second event on.
#[derive(Debug, Default, Clone, Copy)]
pub struct GapMeter {
    last: Option<std::time::Instant>,
    max: Duration,
}

impl GapMeter {
    /// Records an event now.
    pub fn tick(&mut self) {
        self.tick_at(std::time::Instant::now());
    }

    /// Records an event at `now`.
    pub fn tick_at(&mut self, now: std::time::Instant) {
        if let Some(last) = self.last {
            self.max = self.max.max(now.saturating_duration_since(last));
        }
        self.last = Some(now);
    }

    /// Forgets the last event (the next one starts a new series, e.g. after a re-attach), keeping the maximum.
    pub fn restart(&mut self) {
        self.last = None;
    }

    /// The longest gap seen, in milliseconds.
    pub fn max_ms(&self) -> f64 {
        self.max.as_secs_f64() * 1e3
    }
}

/// A flag that turns true once standard input reaches end of file (or fails): how a parent process asks a
/// program to finish its run cleanly (close the pipe) without a signal handler.
pub fn stdin_closed_flag() -> std::sync::Arc<std::sync::atomic::AtomicBool> {
    use std::io::Read;
    let flag = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let set = flag.clone();
    std::thread::spawn(move || {
        let mut sink = [0u8; 256];
        let mut stdin = std::io::stdin();
        while matches!(stdin.read(&mut sink), Ok(n) if n > 0) {}
        set.store(true, std::sync::atomic::Ordering::Release);
    });
    flag
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn gap_meter_keeps_the_longest_gap_and_restarts_series() {
        let t0 = std::time::Instant::now();
        let mut gaps = GapMeter::default();
        gaps.tick_at(t0);
        assert_eq!(gaps.max_ms(), 0.0);
        gaps.tick_at(t0 + Duration::from_millis(5));
        gaps.tick_at(t0 + Duration::from_millis(7));
        assert!((gaps.max_ms() - 5.0).abs() < 1e-9);
        // A new series (re-attach) does not count the pause between series.
        gaps.restart();
        gaps.tick_at(t0 + Duration::from_millis(500));
        gaps.tick_at(t0 + Duration::from_millis(501));
        assert!((gaps.max_ms() - 5.0).abs() < 1e-9);
    }

    #[test]
    fn open_fds_counts_this_process() {
        let before = open_fds();
        let file = std::fs::File::open("/proc/self/stat").unwrap();
        assert_eq!(open_fds(), before + 1);
        drop(file);
    }

    #[test]
    fn fps_is_frames_over_seconds() {
        assert_eq!(fps(1000, Duration::from_millis(500)), 2000.0);
        assert_eq!(fps(5, Duration::ZERO), 0.0);
    }
}
