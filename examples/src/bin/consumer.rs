//! A consumer: attaches to a `producer`, checks every frame on the GPU against the pattern of its sequence number
//! (no copy: the kernel reads the shared slot in place), releases it, and prints frames per second and the number
//! of mismatched words (which must be 0).
//!
//! ```text
//! consumer --socket /tmp/frames.sock --backend vmm --frames 10000 --json
//! ```
//! Exit status: 0 all frames verified; 1 mismatches or another error; 4 the producer went away.

#![forbid(unsafe_code)] // Only ipc-core's driver and sys layers may contain `unsafe`.

use std::process::ExitCode;
use std::time::{Duration, Instant};

use clap::Parser;
use gpu_ipc::BackendVisitor;
use gpu_ipc::core::backend::{Backend, GpuBackend};
use gpu_ipc::core::driver::{Context, DeviceBuffer, DeviceMemory};
use gpu_ipc::core::frames::{AttachOptions, Consumer, FrameError};
use gpu_ipc::core::wire::WireError;
use gpu_ipc_examples::{CommonArgs, EXIT_PRODUCER_GONE, Gpu, cpu_time, fps, kernel_error, print_summary, sync_name};

/// Read and verify frames from shared GPU memory.
#[derive(Debug, Clone, Parser)]
#[command(version)]
struct Args {
    #[command(flatten)]
    common: CommonArgs,
    /// Frames to read (0: until the producer goes away).
    #[arg(long, default_value_t = 10_000)]
    frames: u64,
    /// A name for the producer's logs.
    #[arg(long, default_value = "consumer")]
    name: String,
    /// Print `consumer NAME: frame SEQ` on stderr every N frames (0: never).
    #[arg(long, default_value_t = 0)]
    progress_every: u64,
}

#[derive(Debug, serde::Serialize)]
struct Summary {
    role: &'static str,
    name: String,
    backend: String,
    sync: &'static str,
    first_seq: u64,
    frames: u64,
    mismatched_words: u64,
    seconds: f64,
    fps: f64,
    cpu_us_per_frame: f64,
    producer_gone: Option<String>,
}

struct Run(Args);

impl BackendVisitor for Run {
    type Output = Result<Summary, FrameError>;
    fn visit<B: GpuBackend>(self) -> Self::Output {
        let args = self.0;
        let Gpu { ctx, kernels, stream } = Gpu::open(args.common.device)?;
        let counter = DeviceBuffer::alloc(&ctx, 8)?;
        counter.write(0, &[0u64])?;
        let options = AttachOptions { name: args.name.clone(), ..AttachOptions::default() };
        let mut consumer = attach_retrying::<B>(&ctx, &args, &options)?;
        let first_seq = consumer.next_sequence();
        let timeout = Duration::from_secs(10);
        let (cpu0, t0) = (cpu_time(), Instant::now());
        let mut frames = 0;
        let mut gone = None;
        while args.frames == 0 || frames < args.frames {
            let step = consumer.next_frame(Some(&stream), timeout).and_then(|frame| {
                // The frame, as a span of the imported region (checked to lie inside it).
                let span = consumer.frame_span(&frame)?;
                kernels.verify(&stream, span, frame.seq, counter.span()).map_err(kernel_error)?;
                consumer.release(frame, Some(&stream))
            });
            match step {
                Ok(()) => {
                    frames += 1;
                    if args.progress_every != 0 && frames % args.progress_every == 0 {
                        eprintln!("consumer {}: frame {frames}", args.name);
                    }
                }
                Err(FrameError::ProducerGone { pid, how }) => {
                    gone = Some(format!("producer pid {pid}: {how}"));
                    break;
                }
                Err(e) => return Err(e),
            }
        }
        stream.synchronize()?;
        let elapsed = t0.elapsed();
        let mut mismatched = [0u64];
        counter.read(0, &mut mismatched)?;
        let sync = consumer.offer().sync;
        if gone.is_none() {
            consumer.detach();
        }
        Ok(Summary {
            role: "consumer",
            name: args.name,
            backend: B::NAME.to_owned(),
            sync: sync_name(sync),
            first_seq,
            frames,
            mismatched_words: mismatched[0],
            seconds: elapsed.as_secs_f64(),
            fps: fps(frames, elapsed),
            cpu_us_per_frame: cpu_time().saturating_sub(cpu0).as_secs_f64() * 1e6 / frames.max(1) as f64,
            producer_gone: gone,
        })
    }
}

/// Attaches, retrying while no producer listens yet (so consumers may start first).
fn attach_retrying<B: Backend<Context = Context>>(
    ctx: &Context,
    args: &Args,
    options: &AttachOptions,
) -> Result<Consumer<B>, FrameError> {
    let deadline = Instant::now() + Duration::from_secs(args.common.attach_timeout);
    loop {
        match Consumer::<B>::attach(ctx, &args.common.socket, options) {
            Ok(c) => return Ok(c),
            Err(FrameError::Wire(WireError::NoProducer { .. })) if Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(20));
            }
            Err(e) => return Err(e),
        }
    }
}

fn main() -> ExitCode {
    let args = Args::parse();
    let json = args.common.json;
    match args.common.backend.dispatch(Run(args)) {
        Ok(s) => {
            print_summary(json, &s, |s| {
                format!(
                    "consumer {}: {} frames from #{} in {:.3} s: {:.1} frames/s, {} mismatched words, {:.1} us CPU/frame{}",
                    s.name,
                    s.frames,
                    s.first_seq,
                    s.seconds,
                    s.fps,
                    s.mismatched_words,
                    s.cpu_us_per_frame,
                    s.producer_gone.as_deref().map(|g| format!("; {g}")).unwrap_or_default()
                )
            });
            if s.producer_gone.is_some() {
                ExitCode::from(EXIT_PRODUCER_GONE)
            } else if s.mismatched_words != 0 {
                ExitCode::FAILURE
            } else {
                ExitCode::SUCCESS
            }
        }
        Err(FrameError::ProducerGone { pid, how }) => {
            eprintln!("consumer: the producer (pid {pid}) is gone: {how}");
            ExitCode::from(EXIT_PRODUCER_GONE)
        }
        Err(e) => {
            eprintln!("consumer: {e}");
            ExitCode::FAILURE
        }
    }
}
