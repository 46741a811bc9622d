//! The Rust consumer's own cost per frame: `next_frame` and `release` on the host backend, with the producer kept
//! ahead so the consumer never waits. The reference of `scripts/python_overhead.py` ("package overhead = Python
//! minus Rust"): the same calls in the same pattern, from Rust.
//!
//! ```text
//! consumer_overhead --frames 20000 --slots 8 --json
//! ```
//!
//! Producer and consumer run in this one process (the consumer attaches from a thread, then both run on the main
//! thread). In rounds: the producer fills every slot (not timed), then the consumer takes each frame
//! (`next_frame`, timed as a batch) and releases them (`release`, timed as a batch). Every frame is published
//! before the consumer asks for it, so no call waits. CPU time is this thread's (`CLOCK_THREAD_CPUTIME_ID`).

#![forbid(unsafe_code)] // Only ipc-core's driver and sys layers may contain `unsafe`.

use std::process::ExitCode;
use std::time::{Duration, Instant};

use clap::Parser;
use gpu_ipc::core::frames::{AttachOptions, Consumer, FrameError, Producer, ProducerConfig};
use gpu_ipc::core::wire::{FrameGeometry, PixelFormat, SyncStrategy};
use gpu_ipc::host::{Host, HostContext};

/// Measure the Rust consumer's CPU time per `next_frame` and `release` (host backend, no waiting).
#[derive(Debug, Clone, Parser)]
#[command(version)]
struct Args {
    /// Frames to take and release (rounded up to whole rounds of `--slots`).
    #[arg(long, default_value_t = 20_000)]
    frames: u64,
    /// Slots in the ring: frames taken per round.
    #[arg(long, default_value_t = 8)]
    slots: u32,
    /// Frame width (rgb8).
    #[arg(long, default_value_t = 640)]
    width: u32,
    /// Frame height.
    #[arg(long, default_value_t = 360)]
    height: u32,
    /// `cpu-spin` or `cpu-sleep` (the host backend's strategies).
    #[arg(long, default_value = "cpu-spin")]
    sync: SyncStrategy,
    /// Print one JSON object instead of text.
    #[arg(long)]
    json: bool,
}

fn thread_cpu() -> Duration {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::ThreadCPUTime);
    Duration::new(t.tv_sec.max(0) as u64, t.tv_nsec.clamp(0, 999_999_999) as u32)
}

/// Per-call figures, in microseconds.
struct Costs {
    frames: u64,
    next_cpu_us: f64,
    next_wall_us: f64,
    release_cpu_us: f64,
    release_wall_us: f64,
}

fn measure(args: &Args) -> Result<Costs, FrameError> {
    let socket = std::env::temp_dir().join(format!("gpu-ipc-overhead-{}.sock", std::process::id()));
    let format = PixelFormat::Rgb8;
    let layout = FrameGeometry::new(args.width, args.height, format)?;
    let config = ProducerConfig::new(&socket, layout, args.slots, args.sync);
    let mut producer = Producer::<Host>::create(&HostContext, config)?;
    let path = socket.clone();
    let attach = std::thread::spawn(move || Consumer::<Host>::attach(&HostContext, &path, &AttachOptions::default()));
    producer.wait_for_consumers(1, Duration::from_secs(10))?;
    let mut consumer = attach.join().map_err(|_| FrameError::Config("the attaching thread panicked".into()))??;
    let timeout = Duration::from_secs(5);
    let rounds = args.frames.div_ceil(u64::from(args.slots)).max(1);
    let (mut next_cpu, mut next_wall, mut release_cpu, mut release_wall) =
        (Duration::ZERO, Duration::ZERO, Duration::ZERO, Duration::ZERO);
    let mut frames = Vec::with_capacity(args.slots as usize);
    for _ in 0..rounds {
        for _ in 0..args.slots {
            let lease = producer.acquire(None, timeout)?;
            producer.publish(lease, None)?;
        }
        let (c, w) = (thread_cpu(), Instant::now());
        for _ in 0..args.slots {
            frames.push(consumer.next_frame(None, timeout)?);
        }
        next_wall += w.elapsed();
        next_cpu += thread_cpu() - c;
        let (c, w) = (thread_cpu(), Instant::now());
        for frame in frames.drain(..) {
            consumer.release(frame, None)?;
        }
        release_wall += w.elapsed();
        release_cpu += thread_cpu() - c;
    }
    consumer.detach();
    drop(producer);
    let n = rounds * u64::from(args.slots);
    let us = |d: Duration| d.as_secs_f64() * 1e6 / n as f64;
    Ok(Costs {
        frames: n,
        next_cpu_us: us(next_cpu),
        next_wall_us: us(next_wall),
        release_cpu_us: us(release_cpu),
        release_wall_us: us(release_wall),
    })
}

fn main() -> ExitCode {
    let args = Args::parse();
    match measure(&args) {
        Ok(c) => {
            if args.json {
                let summary = serde_json::json!({
                    "backend": "host",
                    "sync": args.sync.name(),
                    "frames": c.frames,
                    "next_frame_cpu_us": c.next_cpu_us,
                    "next_frame_wall_us": c.next_wall_us,
                    "release_cpu_us": c.release_cpu_us,
                    "release_wall_us": c.release_wall_us,
                });
                println!("{summary}");
            } else {
                println!(
                    "{} frames: next_frame {:.2} us CPU ({:.2} wall), release {:.2} us CPU ({:.2} wall)",
                    c.frames, c.next_cpu_us, c.next_wall_us, c.release_cpu_us, c.release_wall_us
                );
            }
            ExitCode::SUCCESS
        }
        Err(error) => {
            eprintln!("consumer_overhead: {error}");
            ExitCode::FAILURE
        }
    }
}
