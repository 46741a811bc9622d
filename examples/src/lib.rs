//! What the `producer` and `consumer` example programs share: their command-line vocabulary and the summary
//! each prints (one JSON object with `--json`).

#![forbid(unsafe_code)] // Only ipc-core's driver and sys layers may contain `unsafe`.

use std::path::PathBuf;
use std::time::Duration;

use gpu_ipc::BackendChoice;
use gpu_ipc::core::driver::{Context, Stream};
use gpu_ipc::core::frames::FrameError;
use gpu_ipc::core::wire::{PixelFormat, SyncStrategy};
use gpu_ipc::kernels::launch::{KernelError, PatternKernels};

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
    /// Backend: legacy or vmm (consumers must match the producer's).
    #[arg(long, default_value = "vmm")]
    pub backend: BackendChoice,
    /// How long to wait for the other side to show up, in seconds.
    #[arg(long, default_value_t = 30)]
    pub attach_timeout: u64,
    /// CUDA device.
    #[arg(long, default_value_t = 0)]
    pub device: i32,
    /// Print the summary as one JSON object.
    #[arg(long)]
    pub json: bool,
}

/// Parses a sync strategy as the flags spell it: `cpu-spin`, `cpu-sleep`, `ipc-event`, `gpu-stream-ops`.
///
/// # Errors
/// The list of valid names.
pub fn parse_sync(s: &str) -> Result<SyncStrategy, String> {
    SYNC_NAMES
        .iter()
        .find(|(name, _)| *name == s)
        .map(|(_, sync)| *sync)
        .ok_or_else(|| format!("unknown sync strategy `{s}`; use one of: {}", sync_names().join(", ")))
}

/// The flag spelling of a sync strategy.
pub fn sync_name(sync: SyncStrategy) -> &'static str {
    SYNC_NAMES.iter().find(|(_, s)| *s == sync).map_or("unknown", |(name, _)| name)
}

const SYNC_NAMES: &[(&str, SyncStrategy)] = &[
    ("cpu-spin", SyncStrategy::CpuSpin),
    ("cpu-sleep", SyncStrategy::CpuSleep),
    ("ipc-event", SyncStrategy::IpcEvent),
    ("gpu-stream-ops", SyncStrategy::GpuStreamOps),
];

fn sync_names() -> Vec<&'static str> {
    SYNC_NAMES.iter().map(|(n, _)| *n).collect()
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

/// Exit status of a consumer whose producer went away.
pub const EXIT_PRODUCER_GONE: u8 = 4;

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn sync_names_round_trip() {
        for (name, sync) in SYNC_NAMES {
            assert_eq!(parse_sync(name).unwrap(), *sync);
            assert_eq!(sync_name(*sync), *name);
        }
        assert!(parse_sync("spin").unwrap_err().contains("cpu-spin, cpu-sleep, ipc-event, gpu-stream-ops"));
    }

    #[test]
    fn fps_is_frames_over_seconds() {
        assert_eq!(fps(1000, Duration::from_millis(500)), 2000.0);
        assert_eq!(fps(5, Duration::ZERO), 0.0);
    }
}
