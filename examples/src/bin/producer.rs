//! A producer of 4K RGB frames (by default): fills each frame on the GPU with the pattern of its sequence number,
//! and publishes it into a ring that `consumer` processes attach to.
//!
//! ```text
//! producer --socket /tmp/frames.sock --backend vmm --sync gpu-stream-ops --slots 4 --consumers 2 --frames 10000
//! ```
//! It waits for `--consumers` consumers, produces `--frames` frames, waits until every live consumer released
//! the last one, and prints frames per second (`--json`: one JSON object).
//!
//! For the stress harness (`gpu-ipc stress`): `--until-stdin-closes` runs until the parent closes the pipe,
//! `--progress-every` reports progress on stderr, and the summary carries the longest gap between two publishes
//! and the process's fds and the device's free memory at the start and the end.

#![forbid(unsafe_code)] // Only ipc-core's driver and sys layers may contain `unsafe`.

use std::process::ExitCode;
use std::time::{Duration, Instant};

use clap::Parser;
use gpu_ipc::BackendVisitor;
use gpu_ipc::core::backend::GpuBackend;
use gpu_ipc::core::frames::{FrameError, Producer, ProducerConfig, SlowConsumerPolicy};
use gpu_ipc::core::wire::{FrameGeometry, PixelFormat, SocketAccess, SyncStrategy};
use gpu_ipc_examples::{
    CommonArgs, GapMeter, Gpu, cpu_time, device_free_bytes, fps, kernel_error, open_fds, parse_pixel_format,
    parse_sync, print_summary, stdin_closed_flag, sync_name,
};

/// Publish frames into shared GPU memory.
#[derive(Debug, Clone, Parser)]
#[command(version)]
struct Args {
    #[command(flatten)]
    common: CommonArgs,
    /// Sync strategy: cpu-spin, cpu-sleep, ipc-event, gpu-stream-ops or gpu-poll (needs MPS).
    #[arg(long, default_value = "cpu-spin", value_parser = parse_sync)]
    sync: SyncStrategy,
    /// Ring slots.
    #[arg(long, default_value_t = 2)]
    slots: u32,
    /// Frame width in pixels.
    #[arg(long, default_value_t = 3840)]
    width: u32,
    /// Frame height in pixels.
    #[arg(long, default_value_t = 2160)]
    height: u32,
    /// Pixel format: rgb8, rgba8 or gray8.
    #[arg(long, default_value = "rgb8", value_parser = parse_pixel_format)]
    format: PixelFormat,
    /// Frames to produce.
    #[arg(long, default_value_t = 10_000)]
    frames: u64,
    /// Consumers to wait for before producing.
    #[arg(long, default_value_t = 1)]
    consumers: usize,
    /// Print `producer: frame N` on stderr every N frames (0: never).
    #[arg(long, default_value_t = 0)]
    progress_every: u64,
    /// Produce until standard input is closed (or `--frames` is reached, unless it is 0), then finish as usual.
    #[arg(long)]
    until_stdin_closes: bool,
    /// Slow-consumer policy: evict a consumer that holds a frame this many milliseconds (default: wait for it).
    #[arg(long, value_name = "MS")]
    evict_after_ms: Option<u64>,
    /// Also serve consumers running as this uid (repeatable): the socket file becomes mode 0666 and each
    /// consumer's uid is checked (default: our own uid only, mode 0600).
    #[arg(long = "allow-uid", value_name = "UID", conflicts_with = "socket_group")]
    allow_uids: Vec<u32>,
    /// Serve the members of this group: the socket file is given to it with mode 0660, and the kernel checks
    /// membership (supplementary groups included).
    #[arg(long, value_name = "GID")]
    socket_group: Option<u32>,
}

#[derive(Debug, serde::Serialize)]
struct Summary {
    role: &'static str,
    backend: String,
    sync: &'static str,
    slots: u32,
    frame_bytes: u64,
    frames: u64,
    seconds: f64,
    fps: f64,
    gb_per_s: f64,
    cpu_us_per_frame: f64,
    consumers_at_start: usize,
    consumers_at_end: usize,
    consumers_lost: usize,
    /// Longest time between two publishes, in milliseconds.
    max_publish_gap_ms: f64,
    /// Open fds once the first consumers attached, and after the last frame was drained.
    fds_at_start: u64,
    fds_at_end: u64,
    /// Free device memory (`cuMemGetInfo`, device-wide) after the ring was made, and at the end.
    device_free_at_start: Option<u64>,
    device_free_at_end: Option<u64>,
    /// Whether standard input closing ended the run (`--until-stdin-closes`).
    stopped_by_stdin: bool,
}

struct Run(Args);

impl BackendVisitor for Run {
    type Output = Result<Summary, FrameError>;
    fn visit<B: GpuBackend>(self) -> Self::Output {
        let args = self.0;
        let Gpu { ctx, kernels, stream } = Gpu::open(args.common.device)?;
        let geometry = FrameGeometry::new(args.width, args.height, args.format)?;
        let mut config = ProducerConfig::new(&args.common.socket, geometry, args.slots, args.sync);
        if let Some(gid) = args.socket_group {
            config.access = SocketAccess::group(gid);
        } else if !args.allow_uids.is_empty() {
            config.access = SocketAccess::users(args.allow_uids.iter().copied());
        }
        if let Some(ms) = args.evict_after_ms {
            config.slow_consumer = SlowConsumerPolicy::Evict { after: Duration::from_millis(ms) };
        }
        let mut producer = Producer::<B>::create(&ctx, config)?;
        let device_free_at_start = device_free_bytes(&ctx);
        let stop = args.until_stdin_closes.then(stdin_closed_flag);
        eprintln!("producer: waiting for {} consumer(s) on {}", args.consumers, args.common.socket.display());
        producer.wait_for_consumers(args.consumers, Duration::from_secs(args.common.attach_timeout))?;
        let consumers_at_start = producer.consumers();
        let fds_at_start = open_fds();
        let timeout = Duration::from_secs(10);
        let mut gaps = GapMeter::default();
        let mut produced = 0u64;
        let stopped = || stop.as_ref().is_some_and(|s| s.load(std::sync::atomic::Ordering::Acquire));
        let (cpu0, t0) = (cpu_time(), Instant::now());
        while (args.frames == 0 || produced < args.frames) && !stopped() {
            let slot = producer.acquire(Some(&stream), timeout)?;
            // The slot, as a span of the exported region (checked to lie inside it).
            let span = producer.slot_span(&slot)?;
            kernels.fill(&stream, span, slot.seq).map_err(kernel_error)?;
            producer.publish(slot, Some(&stream))?;
            gaps.tick();
            produced += 1;
            if args.progress_every != 0 && produced.is_multiple_of(args.progress_every) {
                eprintln!("producer: frame {produced}");
            }
        }
        // Done when every live consumer has released the last frame.
        producer.drain(Some(&stream), timeout)?;
        let elapsed = t0.elapsed();
        let cpu = cpu_time().saturating_sub(cpu0);
        let frames = produced;
        Ok(Summary {
            role: "producer",
            backend: B::NAME.to_owned(),
            sync: sync_name(args.sync),
            slots: args.slots,
            frame_bytes: geometry.frame_bytes(),
            frames,
            seconds: elapsed.as_secs_f64(),
            fps: fps(frames, elapsed),
            gb_per_s: fps(frames, elapsed) * geometry.frame_bytes() as f64 / 1e9,
            cpu_us_per_frame: cpu.as_secs_f64() * 1e6 / frames.max(1) as f64,
            consumers_at_start,
            consumers_at_end: producer.consumers(),
            consumers_lost: producer.consumers_lost(),
            max_publish_gap_ms: gaps.max_ms(),
            fds_at_start,
            fds_at_end: open_fds(),
            device_free_at_start,
            device_free_at_end: device_free_bytes(&ctx),
            stopped_by_stdin: stopped(),
        })
    }
}

fn main() -> ExitCode {
    let args = Args::parse();
    let json = args.common.json;
    match args.common.backend.dispatch(Run(args)) {
        Ok(s) => {
            print_summary(json, &s, |s| {
                format!(
                    "producer: {} frames of {} bytes in {:.3} s: {:.1} frames/s ({:.1} GB/s), {:.1} us CPU/frame, \
                     consumers {} -> {} ({} lost)",
                    s.frames,
                    s.frame_bytes,
                    s.seconds,
                    s.fps,
                    s.gb_per_s,
                    s.cpu_us_per_frame,
                    s.consumers_at_start,
                    s.consumers_at_end,
                    s.consumers_lost
                )
            });
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("producer: {e}");
            ExitCode::FAILURE
        }
    }
}
