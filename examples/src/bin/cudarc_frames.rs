//! Frames through gpu-ipc, written and checked by your own CUDA kernel compiled and launched with cudarc, on your
//! own cudarc stream: gpu-ipc queues its waits and publishes on that stream (borrowed, not copied), so nothing
//! synchronises with the CPU per frame, with any strategy.
//!
//! ```text
//! cudarc_frames --role producer --socket /tmp/f.sock --backend vmm --sync gpu-stream-ops --frames 2000 &
//! cudarc_frames --role consumer --socket /tmp/f.sock --backend vmm --frames 0     # until the end of the stream
//! ```
//! `--launch gpu-ipc` runs the same kernel (the same NVRTC PTX) through gpu-ipc's own launcher on a gpu-ipc stream
//! instead: the reference the cudarc path is compared with. Needs a GPU and NVRTC (`libnvrtc.so` on the loader
//! path). Exit status: 0 done (a consumer: every frame it read matched); 1 an error or mismatched words; 3 no CUDA
//! driver; 4 the producer died.

// The two `unsafe` blocks are cudarc's own API (a kernel launch, its event tracking), as in any cudarc program;
// gpu-ipc's side of the interop needs none.
#![deny(unsafe_code)]

use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Parser;
use gpu_ipc::core::backend::GpuBackend;
use gpu_ipc::core::frames::{AttachOptions, Consumer, Frame, FrameError, Producer, ProducerConfig, SlotLease};
use gpu_ipc::core::wire::{FrameGeometry, PixelFormat, SyncStrategy};
use gpu_ipc::cudarc_interop::cudarc::driver::{CudaContext, CudaFunction, CudaSlice, CudaStream, PushKernelArg};
use gpu_ipc::cudarc_interop::{self as interop, cudarc};
use gpu_ipc::driver::{Context, DeviceBuffer, DeviceMemory, KernelArg, LaunchConfig, Module, Stream};
use gpu_ipc::{BackendKind, GpuBackendVisitor};
use gpu_ipc_examples::{EXIT_PRODUCER_GONE, cpu_time, exit_for, fps, print_summary};

/// The user's own kernels: the frame pattern of gpu-ipc's example programs (`gpu_ipc::kernels::pattern`), so a
/// `producer` can feed this consumer and the other way round.
const KERNELS: &str = r#"
__device__ unsigned int pattern(unsigned long long i, unsigned long long seq) {
    unsigned int x = ((unsigned int)i * 0x9E3779B1u) ^ ((unsigned int)seq * 0x85EBCA6Bu) ^ 0xA5A5A5A5u;
    return x ^ (x >> 16);
}
extern "C" __global__ void fill_frame(unsigned int* words, unsigned long long n, unsigned long long seq) {
    for (unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x; i < n;
         i += (unsigned long long)gridDim.x * blockDim.x) {
        words[i] = pattern(i, seq);
    }
}
extern "C" __global__ void check_frame(const unsigned int* words, unsigned long long n, unsigned long long seq,
                                       unsigned long long* mismatches) {
    unsigned long long bad = 0;
    for (unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x; i < n;
         i += (unsigned long long)gridDim.x * blockDim.x) {
        bad += words[i] != pattern(i, seq);
    }
    for (int offset = 16; offset > 0; offset >>= 1) bad += __shfl_down_sync(0xffffffffu, bad, offset);
    if ((threadIdx.x & 31) == 0 && bad != 0) atomicAdd(mismatches, bad);
}
// The running total after frame `seq`'s check, kept per frame: frames queued past the end of a stream are left out
// by reading the total as it stood after the last frame the producer published.
extern "C" __global__ void snapshot(const unsigned long long* total, unsigned long long* snapshots,
                                    unsigned long long seq) {
    snapshots[seq % 256] = *total;
}
"#;

/// Frames published, or read and checked, by your own kernel on your own stream.
#[derive(Debug, Clone, Parser)]
#[command(version, after_help = gpu_ipc_examples::exit::HELP)]
struct Args {
    /// producer or consumer.
    #[arg(long)]
    role: Role,
    /// Rendezvous socket.
    #[arg(long, default_value = "/tmp/gpu-ipc-cudarc.sock")]
    socket: std::path::PathBuf,
    /// legacy or vmm.
    #[arg(long, default_value = "vmm")]
    backend: BackendKind,
    /// Sync strategy (the producer's choice; consumers follow it).
    #[arg(long, default_value_t = SyncStrategy::DEFAULT)]
    sync: SyncStrategy,
    /// cudarc: your kernel launched by cudarc on your cudarc stream; gpu-ipc: the same kernel launched by
    /// gpu-ipc's launcher on a gpu-ipc stream.
    #[arg(long, default_value = "cudarc")]
    launch: Launch,
    /// Frames to produce, or to read (0: a consumer reads until the end of the stream).
    #[arg(long, default_value_t = 2000)]
    frames: u64,
    /// Ring slots (producer), 1 to 256.
    #[arg(long, default_value_t = 4)]
    slots: u32,
    /// Frame width, height (RGB, 8 bits per channel).
    #[arg(long, default_value_t = 1920)]
    width: u32,
    /// Frame height.
    #[arg(long, default_value_t = 1080)]
    height: u32,
    /// Consumers the producer waits for.
    #[arg(long, default_value_t = 1)]
    consumers: usize,
    /// CUDA device.
    #[arg(long, default_value_t = 0)]
    device: i32,
    /// Print the summary as one JSON object.
    #[arg(long)]
    json: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "lowercase")]
enum Role {
    Producer,
    Consumer,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
enum Launch {
    Cudarc,
    GpuIpc,
}

#[derive(Debug, serde::Serialize)]
struct Summary {
    role: Role,
    launch: Launch,
    backend: &'static str,
    sync: &'static str,
    frames: u64,
    seconds: f64,
    fps: f64,
    cpu_us_per_frame: f64,
    mismatched_words: u64,
    /// cudarc's context is gpu-ipc's (the device's primary context).
    same_context: bool,
    end_of_stream_after: Option<u64>,
    producer_gone: Option<String>,
}

const THREADS: u32 = 256;

fn launch_config(words: u64) -> (u32, u32) {
    let blocks = words.div_ceil(u64::from(THREADS) * 4).clamp(1, 2048) as u32;
    (blocks, THREADS)
}

/// Where the user's kernels run: on the user's cudarc stream, launched by cudarc; or on a gpu-ipc stream,
/// launched by gpu-ipc.
enum Kernels {
    Cudarc {
        stream: Arc<CudaStream>,
        fill: CudaFunction,
        check: CudaFunction,
        snapshot: CudaFunction,
    },
    GpuIpc {
        stream: Stream,
        fill: gpu_ipc::driver::Function,
        check: gpu_ipc::driver::Function,
        snapshot: gpu_ipc::driver::Function,
    },
}

/// Mismatch counters, wherever the launch path keeps them.
enum Counters {
    Cudarc { total: CudaSlice<u64>, snapshots: CudaSlice<u64> },
    GpuIpc { total: DeviceBuffer, snapshots: DeviceBuffer },
}

struct Run(Args);

impl GpuBackendVisitor for Run {
    type Output = Result<Summary, Box<dyn std::error::Error>>;
    fn visit<B: GpuBackend>(self) -> Self::Output {
        let args = self.0;
        // gpu-ipc's context first: a machine without a driver gets a typed error here (cudarc would panic).
        let ctx = Context::for_ordinal(args.device)?;
        let cuda = CudaContext::new(args.device as usize)?;
        // gpu-ipc orders every frame's work on the stream itself; cudarc's own event tracking (meant for its
        // allocations shared between its streams) would only add events per view and launch.
        disable_cudarc_event_tracking(&cuda);
        let same_context = interop::context(&cuda).is_ok_and(|c| c.as_raw() == ctx.as_raw());
        let ptx = cudarc::nvrtc::compile_ptx(KERNELS)?;
        let user_stream = cuda.new_stream()?;
        let (kernels, counters) = match args.launch {
            Launch::Cudarc => {
                let module = cuda.load_module(ptx)?;
                let kernels = Kernels::Cudarc {
                    stream: user_stream.clone(),
                    fill: module.load_function("fill_frame")?,
                    check: module.load_function("check_frame")?,
                    snapshot: module.load_function("snapshot")?,
                };
                let counters = Counters::Cudarc {
                    total: user_stream.alloc_zeros::<u64>(1)?,
                    snapshots: user_stream.alloc_zeros::<u64>(256)?,
                };
                (kernels, counters)
            }
            Launch::GpuIpc => {
                // PTX text as NVRTC made it: `Module::load` needs no NUL at its end.
                let module = Module::load(&ctx, ptx.to_src().as_bytes())?;
                let kernels = Kernels::GpuIpc {
                    stream: Stream::new(&ctx)?,
                    fill: module.function("fill_frame")?,
                    check: module.function("check_frame")?,
                    snapshot: module.function("snapshot")?,
                };
                let (total, snapshots) = (DeviceBuffer::alloc(&ctx, 8)?, DeviceBuffer::alloc(&ctx, 8 * 256)?);
                total.write(0, &[0u64])?;
                snapshots.write(0, &[0u64; 256])?;
                (kernels, Counters::GpuIpc { total, snapshots })
            }
        };
        // The stream gpu-ipc queues on: the user's cudarc stream, borrowed; or gpu-ipc's own.
        let borrowed;
        let stream: &Stream = match &kernels {
            Kernels::Cudarc { stream, .. } => {
                borrowed = interop::stream(&ctx, stream)?;
                &borrowed
            }
            Kernels::GpuIpc { stream, .. } => stream,
        };
        match args.role {
            Role::Producer => produce::<B>(&args, &ctx, &kernels, stream, same_context),
            Role::Consumer => consume::<B>(&args, &ctx, &kernels, &counters, stream, same_context),
        }
    }
}

#[allow(unsafe_code)]
fn disable_cudarc_event_tracking(cuda: &CudaContext) {
    // SAFETY: cudarc's contract for turning tracking off is that the caller orders the work on cudarc allocations
    // itself; here each allocation is used on one stream only, in order.
    unsafe { cuda.disable_event_tracking() };
}

fn produce<B: GpuBackend>(
    args: &Args,
    ctx: &Context,
    kernels: &Kernels,
    stream: &Stream,
    same_context: bool,
) -> Result<Summary, Box<dyn std::error::Error>> {
    let geometry = FrameGeometry::new(args.width, args.height, PixelFormat::Rgb8)?;
    let mut producer = Producer::<B>::create(ctx, ProducerConfig::new(&args.socket, geometry, args.slots, args.sync))?;
    producer.wait_for_consumers(args.consumers, Duration::from_secs(60))?;
    let (cpu0, t0) = (cpu_time(), Instant::now());
    for _ in 0..args.frames {
        let lease = producer.acquire(Some(stream), Duration::from_secs(10))?;
        fill(&producer, &lease, kernels)?;
        producer.publish(lease, Some(stream))?;
    }
    producer.drain(Some(stream), Duration::from_secs(10))?;
    let elapsed = t0.elapsed();
    Ok(summary(
        args,
        Role::Producer,
        args.frames,
        elapsed,
        cpu_time().saturating_sub(cpu0),
        0,
        same_context,
        None,
        None,
    ))
}

fn fill<B: GpuBackend>(
    producer: &Producer<B>,
    lease: &SlotLease,
    kernels: &Kernels,
) -> Result<(), Box<dyn std::error::Error>> {
    let (words, seq) = (lease.bytes() / 4, lease.seq().0);
    let (blocks, threads) = launch_config(words);
    match kernels {
        Kernels::Cudarc { stream, fill, .. } => {
            let mut slot = interop::slot_slice::<B, u32>(producer, lease, stream)?;
            let mut view = slot.view_mut();
            let mut launch = stream.launch_builder(fill);
            launch.arg(&mut view).arg(&words).arg(&seq);
            launch_cudarc(launch, blocks, threads)?;
        }
        Kernels::GpuIpc { stream, fill, .. } => {
            let span = producer.slot_span(lease)?;
            fill.launch_typed(
                stream,
                LaunchConfig::linear(blocks, threads),
                &[span.into(), KernelArg::U64(words), KernelArg::U64(seq)],
            )?;
        }
    }
    Ok(())
}

#[allow(unsafe_code)]
fn launch_cudarc(
    mut launch: cudarc::driver::LaunchArgs<'_>,
    blocks: u32,
    threads: u32,
) -> Result<(), cudarc::driver::DriverError> {
    let config =
        cudarc::driver::LaunchConfig { grid_dim: (blocks, 1, 1), block_dim: (threads, 1, 1), shared_mem_bytes: 0 };
    // SAFETY: the arguments match the kernels' parameter lists above (pointer, u64, u64[, pointer]), and every
    // pointer is a live view of a frame, a slot or a counter for the duration of the work.
    unsafe { launch.launch(config) }.map(|_| ())
}

fn consume<B: GpuBackend>(
    args: &Args,
    ctx: &Context,
    kernels: &Kernels,
    counters: &Counters,
    stream: &Stream,
    same_context: bool,
) -> Result<Summary, Box<dyn std::error::Error>> {
    let options =
        AttachOptions { name: "cudarc".into(), wait_for_producer: Duration::from_secs(60), ..AttachOptions::default() };
    let mut consumer = Consumer::<B>::attach(ctx, &args.socket, &options)?;
    let first = consumer.next_sequence();
    let (cpu0, t0) = (cpu_time(), Instant::now());
    let (mut end, mut gone) = (None, None);
    while args.frames == 0 || consumer.next_sequence() - first < args.frames {
        let step = consumer.next_frame(Some(stream), Duration::from_secs(10)).and_then(|frame| {
            check(&consumer, &frame, kernels, counters).map_err(|e| FrameError::Config(e.to_string()))?;
            consumer.release(frame, Some(stream))
        });
        match step {
            Ok(()) => {}
            Err(FrameError::EndOfStream { published, .. }) => {
                end = Some(published);
                break;
            }
            Err(FrameError::ProducerGone { pid, how }) => {
                gone = Some(format!("producer pid {pid}: {how}"));
                break;
            }
            Err(e) => return Err(e.into()),
        }
    }
    stream.synchronize()?;
    let elapsed = t0.elapsed();
    // Frames at or past a clean end were never written: neither read nor counted.
    let last_read = end.map_or(consumer.next_sequence(), |end| consumer.next_sequence().min(end));
    let frames = last_read.saturating_sub(first);
    let mismatched = match last_read.checked_sub(1).filter(|_| frames > 0) {
        Some(last) => read_snapshot(counters, last)?,
        None => 0,
    };
    consumer.detach();
    Ok(summary(
        args,
        Role::Consumer,
        frames,
        elapsed,
        cpu_time().saturating_sub(cpu0),
        mismatched,
        same_context,
        end,
        gone,
    ))
}

fn check<B: GpuBackend>(
    consumer: &Consumer<B>,
    frame: &Frame,
    kernels: &Kernels,
    counters: &Counters,
) -> Result<(), Box<dyn std::error::Error>> {
    let (words, seq) = (frame.bytes() / 4, frame.seq().0);
    let (blocks, threads) = launch_config(words);
    match (kernels, counters) {
        (Kernels::Cudarc { stream, check, snapshot, .. }, Counters::Cudarc { total, snapshots }) => {
            let pixels = interop::frame_slice::<B, u32>(consumer, frame, stream)?;
            let view = pixels.view();
            let mut launch = stream.launch_builder(check);
            launch.arg(&view).arg(&words).arg(&seq).arg(total);
            launch_cudarc(launch, blocks, threads)?;
            let mut launch = stream.launch_builder(snapshot);
            launch.arg(total).arg(snapshots).arg(&seq);
            launch_cudarc(launch, 1, 1)?;
        }
        (Kernels::GpuIpc { stream, check, snapshot, .. }, Counters::GpuIpc { total, snapshots }) => {
            let span = consumer.frame_span(frame)?;
            check.launch_typed(
                stream,
                LaunchConfig::linear(blocks, threads),
                &[span.into(), KernelArg::U64(words), KernelArg::U64(seq), total.span().into()],
            )?;
            snapshot.launch_typed(
                stream,
                LaunchConfig::linear(1, 1),
                &[total.span().into(), snapshots.span().into(), KernelArg::U64(seq)],
            )?;
        }
        _ => return Err("launch path and counters disagree".into()),
    }
    Ok(())
}

fn read_snapshot(counters: &Counters, last: u64) -> Result<u64, Box<dyn std::error::Error>> {
    Ok(match counters {
        Counters::Cudarc { snapshots, .. } => snapshots.stream().clone_dtoh(snapshots)?[(last % 256) as usize],
        Counters::GpuIpc { snapshots, .. } => {
            let mut value = [0u64];
            snapshots.read(8 * (last % 256), &mut value)?;
            value[0]
        }
    })
}

#[allow(clippy::too_many_arguments)]
fn summary(
    args: &Args,
    role: Role,
    frames: u64,
    elapsed: Duration,
    cpu: Duration,
    mismatched_words: u64,
    same_context: bool,
    end_of_stream_after: Option<u64>,
    producer_gone: Option<String>,
) -> Summary {
    Summary {
        role,
        launch: args.launch,
        backend: args.backend.name(),
        sync: args.sync.name(),
        frames,
        seconds: elapsed.as_secs_f64(),
        fps: fps(frames, elapsed),
        cpu_us_per_frame: cpu.as_secs_f64() * 1e6 / frames.max(1) as f64,
        mismatched_words,
        same_context,
        end_of_stream_after,
        producer_gone,
    }
}

fn main() -> ExitCode {
    let args = Args::parse();
    let json = args.json;
    let result = gpu_ipc::dispatch_gpu(args.backend, Run(args)).map_err(Box::from).and_then(|r| r);
    match result {
        Ok(s) => {
            print_summary(json, &s, |s| {
                format!(
                    "cudarc_frames {:?} ({:?} launch, {}/{}): {} frames in {:.3} s: {:.1} frames/s, {} mismatched words, {:.1} us CPU/frame{}{}",
                    s.role,
                    s.launch,
                    s.backend,
                    s.sync,
                    s.frames,
                    s.seconds,
                    s.fps,
                    s.mismatched_words,
                    s.cpu_us_per_frame,
                    s.end_of_stream_after.map(|n| format!("; end of stream after {n} frames")).unwrap_or_default(),
                    s.producer_gone.as_deref().map(|g| format!("; {g}")).unwrap_or_default(),
                )
            });
            if s.producer_gone.is_some() {
                ExitCode::from(EXIT_PRODUCER_GONE)
            } else if s.mismatched_words != 0 {
                ExitCode::from(gpu_ipc_examples::exit::EXIT_FAILURE)
            } else {
                ExitCode::SUCCESS
            }
        }
        Err(e) => match e.downcast::<FrameError>() {
            Ok(frame_error) => {
                let (code, line) = exit_for("cudarc_frames", &frame_error);
                eprintln!("{line}");
                ExitCode::from(code)
            }
            Err(other) => {
                let no_driver = other
                    .downcast_ref::<gpu_ipc::driver::DriverError>()
                    .is_some_and(|d| matches!(d, gpu_ipc::driver::DriverError::LibraryNotFound { .. }));
                eprintln!("cudarc_frames: {other}");
                ExitCode::from(if no_driver {
                    gpu_ipc_examples::EXIT_NO_DRIVER
                } else {
                    gpu_ipc_examples::exit::EXIT_FAILURE
                })
            }
        },
    }
}
