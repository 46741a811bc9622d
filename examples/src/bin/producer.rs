//! A producer of 4K RGB frames (by default): fills each frame on the GPU with the pattern of its sequence number,
//! and publishes it into a ring that `consumer` processes attach to.
//!
//! ```text
//! producer --socket /tmp/frames.sock --backend vmm --sync gpu-stream-ops --slots 4 --consumers 2 --frames 10000
//! ```
//! It waits for `--consumers` consumers, produces `--frames` frames, waits until every live consumer released
//! the last one, and prints frames per second (`--json`: one JSON object).
//!
//! Without a GPU, `--backend host` runs the same program on host memory with a CPU strategy (`cpu-spin`,
//! `cpu-sleep`): a demo of the API and the protocol, with 640x480 frames unless `--width`/`--height` say otherwise.
//!
//! `--tensor f32:4x1024x1024` makes a ring of tensors instead of pixel frames (any element type and shape; see
//! `--help`): each slot holds that tensor, filled with the same pattern as a frame (words of its sequence number),
//! and consumers of this release read it (those of protocol version 1 are refused, told why).
//!
//! `--persistent` writes and publishes the `--frames` frames in one persistent kernel on the ring's device API
//! instead (`gpu_ipc_persistent_fill`, gpu-stream-ops or gpu-poll: no launch and no CPU work per frame; consumers of
//! any kind read them; the summary's `persistent` says how it ended).
//!
//! `--graph` publishes them with frame graphs instead (one CUDA graph per slot: the wait for the slot, the pattern
//! fill, the publish; one `cuGraphLaunch` per frame; gpu-stream-ops or gpu-poll, under MPS).
//!
//! Exit status: 0 done; 1 an error; 3 no CUDA driver (use `--backend host`).
//!
//! For the stress harness (`gpu-ipc stress`): `--until-stdin-closes` runs until the parent closes the pipe,
//! `--progress-every` reports progress on stderr, and the summary carries the longest gap between two publishes
//! and the process's fds and the device's free memory at the start and the end.

#![forbid(unsafe_code)] // Only ipc-core's driver and sys layers may contain `unsafe`.

use std::process::ExitCode;
use std::time::{Duration, Instant};

use clap::Parser;
use gpu_ipc::core::backend::Backend;
use gpu_ipc::core::frames::{FrameError, Producer, ProducerConfig, SlowConsumerPolicy};
use gpu_ipc::core::wire::{FrameGeometry, PixelFormat, SlotLayout, SocketAccess, SyncStrategy, TensorDesc};
use gpu_ipc::kernels::persistent::{PersistentOutcome, PersistentResult};
use gpu_ipc_examples::work::{FrameWork, ProgramVisitor, run_with_backend};
use gpu_ipc_examples::{
    CommonArgs, GapMeter, cpu_time, exit_for, fps, open_fds, parse_pixel_format, print_summary, stdin_closed_flag,
};

/// Publish frames into shared GPU memory.
#[derive(Debug, Clone, Parser)]
#[command(version, after_help = gpu_ipc_examples::exit::HELP)]
struct Args {
    #[command(flatten)]
    common: CommonArgs,
    /// Sync strategy: cpu-spin, cpu-sleep, ipc-event, gpu-stream-ops or gpu-poll (needs MPS); by default
    /// gpu-stream-ops on a GPU backend, cpu-spin on the host backend (`SyncStrategy::default_for`).
    #[arg(long)]
    sync: Option<SyncStrategy>,
    /// Ring slots, 1 to 256 (above 32: control-block layout 2, for consumers of this release).
    #[arg(long, default_value_t = 2)]
    slots: u32,
    /// Frame width in pixels (default 3840; 640 with `--backend host`).
    #[arg(long)]
    width: Option<u32>,
    /// Frame height in pixels (default 2160; 480 with `--backend host`).
    #[arg(long)]
    height: Option<u32>,
    /// Pixel format: rgb8, rgba8 or gray8.
    #[arg(long, default_value = "rgb8", value_parser = parse_pixel_format)]
    format: PixelFormat,
    /// Slots of a tensor instead of pixel frames: DTYPE:SHAPE, e.g. f32:4x1024x1024 or bf16:8x4096 (element types:
    /// u8 i8 u16 i16 u32 i32 u64 i64 f16 bf16 f32 f64 bool f8e4m3fn f8e5m2 c64 c128, or their NumPy names).
    #[arg(long, value_name = "DTYPE:SHAPE", conflicts_with_all = ["width", "height", "format"])]
    tensor: Option<TensorDesc>,
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
    /// Write and publish the `--frames` frames in one persistent kernel on the ring's device API (gpu-stream-ops or
    /// gpu-poll; read docs/kernels.md before using it under MPS).
    #[arg(long, conflicts_with_all = ["until_stdin_closes", "evict_after_ms", "progress_every"])]
    persistent: bool,
    /// Publish the `--frames` frames with frame graphs: one CUDA graph per slot (wait for the slot, fill, publish),
    /// one launch per frame (gpu-stream-ops or gpu-poll, under MPS).
    #[arg(long, conflicts_with_all = ["until_stdin_closes", "evict_after_ms", "persistent"])]
    graph: bool,
}

#[derive(Debug, serde::Serialize)]
struct Summary {
    role: &'static str,
    backend: &'static str,
    sync: &'static str,
    slots: u32,
    /// What each slot holds, in words (`3840x2160 rgb8 frames (24883200 bytes)`, `float32 [4, 1024, 1024]
    /// tensors (16777216 bytes)`).
    slot: String,
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
    /// With `--persistent`: what the persistent kernel reported.
    persistent: Option<PersistentResult>,
}

struct Run(Args);

impl ProgramVisitor for Run {
    type Output = Summary;
    fn run<B: Backend, W: FrameWork<B>>(self) -> Result<Summary, FrameError> {
        let args = self.0;
        let sync = args.sync.unwrap_or_else(|| SyncStrategy::default_for(B::KIND));
        if (args.persistent || args.graph) && args.frames == 0 {
            return Err(FrameError::Config("--persistent and --graph need a --frames count".into()));
        }
        let mut work = W::open(args.common.device)?;
        let host = !B::KIND.is_gpu();
        let (width, height) =
            (args.width.unwrap_or(if host { 640 } else { 3840 }), args.height.unwrap_or(if host { 480 } else { 2160 }));
        let layout = match args.tensor {
            Some(tensor) => SlotLayout::tensors(tensor),
            None => FrameGeometry::new(width, height, args.format)?.into(),
        };
        let frame_bytes = layout.bytes();
        let mut config = ProducerConfig::new(&args.common.socket, layout, args.slots, sync);
        if let Some(gid) = args.socket_group {
            config.access = SocketAccess::group(gid);
        } else if !args.allow_uids.is_empty() {
            config.access = SocketAccess::users(args.allow_uids.iter().copied());
        }
        if let Some(ms) = args.evict_after_ms {
            config.slow_consumer = SlowConsumerPolicy::Evict { after: Duration::from_millis(ms) };
        }
        let mut producer = Producer::<B>::create(work.ctx(), config)?;
        let device_free_at_start = work.device_free();
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
        let mut persistent = None;
        if args.persistent {
            let result = work.run_persistent_fill(&mut producer, args.frames, timeout)?;
            produced = result.frames;
            if result.outcome != PersistentOutcome::Done {
                return Err(FrameError::Config(format!(
                    "the persistent kernel stopped at frame {} ({:?})",
                    result.stopped_at, result.outcome
                )));
            }
            persistent = Some(result);
        }
        if args.graph {
            produced = work.run_graph_fill(&mut producer, args.frames, timeout, args.progress_every)?.launched;
        }
        while !args.persistent && !args.graph && (args.frames == 0 || produced < args.frames) && !stopped() {
            let slot = producer.acquire(work.stream(), timeout)?;
            work.fill(&producer, &slot)?;
            producer.publish(slot, work.stream())?;
            gaps.tick();
            produced += 1;
            if args.progress_every != 0 && produced.is_multiple_of(args.progress_every) {
                eprintln!("producer: frame {produced}");
            }
        }
        // Done when every live consumer has released the last frame.
        producer.drain(work.stream(), timeout)?;
        let elapsed = t0.elapsed();
        let cpu = cpu_time().saturating_sub(cpu0);
        let frames = produced;
        Ok(Summary {
            role: "producer",
            backend: B::KIND.name(),
            sync: sync.name(),
            slots: args.slots,
            slot: producer.slot_layout().to_string(),
            frame_bytes,
            frames,
            seconds: elapsed.as_secs_f64(),
            fps: fps(frames, elapsed),
            gb_per_s: fps(frames, elapsed) * frame_bytes as f64 / 1e9,
            cpu_us_per_frame: cpu.as_secs_f64() * 1e6 / frames.max(1) as f64,
            consumers_at_start,
            consumers_at_end: producer.consumers(),
            consumers_lost: producer.consumers_lost(),
            max_publish_gap_ms: gaps.max_ms(),
            fds_at_start,
            fds_at_end: open_fds(),
            device_free_at_start,
            device_free_at_end: work.device_free(),
            stopped_by_stdin: stopped(),
            persistent,
        })
    }
}

fn main() -> ExitCode {
    let args = Args::parse();
    let json = args.common.json;
    match run_with_backend(args.common.backend, Run(args)) {
        Ok(s) => {
            print_summary(json, &s, |s| {
                format!(
                    "producer: {} frames of {} in {:.3} s: {:.1} frames/s ({:.1} GB/s), {:.1} us CPU/frame, \
                     consumers {} -> {} ({} lost)",
                    s.frames,
                    s.slot,
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
            let (code, line) = exit_for("producer", &e);
            eprintln!("{line}");
            ExitCode::from(code)
        }
    }
}
