//! A cross-process counting semaphore, from the command line: an owner, processes that post, processes that wait
//! (on the CPU or on a CUDA stream), and a round-trip benchmark.
//!
//! ```text
//! semaphore owner --socket /tmp/sem.sock --backend host &            # serves it until stdin closes or --hold-secs
//! semaphore post  --socket /tmp/sem.sock --backend host --count 5
//! semaphore wait  --socket /tmp/sem.sock --backend host --count 5
//! semaphore bench --backend vmm --rounds 10000                       # CPU and stream round trips between 2 processes
//! ```
//!
//! `wait` attaches as a pure waiter (`posts = false`): its death breaks nothing. `post` attaches as a poster: if it
//! dies without detaching, every waiter gets `poster-died` (exit status 4) within a second. `--stream` posts and
//! waits on a CUDA stream (GPU backends). With `--json` each prints one JSON summary on stdout.
//!
//! Exit status: 0 done; 1 an error; 4 the semaphore ended (a poster or the owner died, or it was closed).

#![forbid(unsafe_code)] // Only ipc-core's driver and sys layers may contain `unsafe`.

use std::io::Read;
use std::path::PathBuf;
use std::process::{Command, ExitCode, Stdio};
use std::time::{Duration, Instant};

use clap::{Parser, Subcommand};
use gpu_ipc::BackendKind;
use gpu_ipc::core::semaphore::{AttachOptions, OwnerOptions, Semaphore, SemaphoreError};
use gpu_ipc_examples::print_summary;
use gpu_ipc_examples::semaphore::{Device, ExampleError, exit_status, outcome_word, percentile_us, stream_idle_within};

/// A cross-process counting semaphore.
#[derive(Debug, Parser)]
#[command(version)]
struct Args {
    #[command(subcommand)]
    command: Cmd,
    /// Backend: legacy, vmm, or host (CPU posts and waits only).
    #[arg(long, global = true, default_value = "host")]
    backend: BackendKind,
    /// CUDA device.
    #[arg(long, global = true, default_value_t = 0)]
    device: i32,
    /// Print the summary as one JSON object.
    #[arg(long, global = true)]
    json: bool,
}

#[derive(Debug, Subcommand)]
enum Cmd {
    /// Create a semaphore and serve it until stdin closes (or `--hold-secs` pass).
    Owner {
        #[arg(long)]
        socket: PathBuf,
        /// Posts it starts with.
        #[arg(long, default_value_t = 0)]
        initial: u64,
        /// Serve this long, then close (0: until stdin closes).
        #[arg(long, default_value_t = 0)]
        hold_secs: u64,
    },
    /// Attach as a poster and post `--count` times, one post at a time.
    Post {
        #[arg(long)]
        socket: PathBuf,
        #[arg(long, default_value_t = 1)]
        count: u64,
        /// Pause between posts, in microseconds.
        #[arg(long, default_value_t = 0)]
        interval_us: u64,
        /// Post on a CUDA stream (a host function adds each post once the stream gets there).
        #[arg(long)]
        stream: bool,
        /// After posting, stay attached this long (a poster that is killed meanwhile breaks the semaphore).
        #[arg(long, default_value_t = 0)]
        hold_secs: u64,
    },
    /// Attach as a pure waiter and take `--count` posts, each wait bounded by `--timeout-ms`.
    Wait {
        #[arg(long)]
        socket: PathBuf,
        #[arg(long, default_value_t = 1)]
        count: u64,
        #[arg(long, default_value_t = 30_000)]
        timeout_ms: u64,
        /// Stop at the first wait that times out, and count that as done (to take whatever is posted).
        #[arg(long)]
        until_idle: bool,
        /// Wait on a CUDA stream (`cuStreamWaitValue64`), then ask how the wait was released.
        #[arg(long)]
        stream: bool,
        /// With `--stream`: queue this many waits before waiting for the stream (they hold tickets meanwhile).
        #[arg(long, default_value_t = 1)]
        stream_ahead: u64,
    },
    /// Round trips between this process and a partner it starts: CPU to CPU, and stream to stream.
    Bench {
        #[arg(long, default_value_t = 10_000)]
        rounds: u64,
        /// Which round trips: cpu, stream, or both.
        #[arg(long, default_value = "both")]
        mode: String,
        /// Folder for the two sockets (default: the temporary folder).
        #[arg(long)]
        dir: Option<PathBuf>,
    },
    /// The benchmark's partner (started by `bench`): waits on `--ping`, posts to its own `--pong`.
    Pong {
        #[arg(long)]
        ping: PathBuf,
        #[arg(long)]
        pong: PathBuf,
        #[arg(long)]
        rounds: u64,
        #[arg(long)]
        mode: String,
    },
}

#[derive(Debug, Default, serde::Serialize)]
struct Summary {
    role: &'static str,
    backend: &'static str,
    outcome: &'static str,
    message: Option<String>,
    /// Posts made (post) or taken (wait).
    count: u64,
    /// Milliseconds from the start to the end of the run.
    ms: f64,
    /// Value of the semaphore at the end, as this process saw it.
    value: i64,
    /// Round trips (bench).
    round_trips: Vec<RoundTrip>,
}

/// One kind of round trip the bench measured.
#[derive(Debug, serde::Serialize)]
struct RoundTrip {
    /// `cpu<->cpu` or `stream<->stream`.
    mode: String,
    rounds: u64,
    p50_us: f64,
    p99_us: f64,
    mean_us: f64,
}

fn main() -> ExitCode {
    let args = Args::parse();
    let start = Instant::now();
    let mut summary = Summary { backend: args.backend.name(), ..Summary::default() };
    let result = run(&args, &mut summary);
    summary.outcome = outcome_word(&result);
    summary.message = result.as_ref().err().map(ToString::to_string);
    summary.ms = start.elapsed().as_secs_f64() * 1e3;
    if let Err(e) = &result {
        eprintln!("semaphore {}: {e}", summary.role);
    }
    print_summary(args.json, &summary, |s| {
        let trips: Vec<String> = s
            .round_trips
            .iter()
            .map(|t| {
                format!(
                    "{} round trip over {}: p50 {:.1} us, p99 {:.1} us, mean {:.1} us",
                    t.mode, t.rounds, t.p50_us, t.p99_us, t.mean_us
                )
            })
            .collect();
        format!("semaphore {}: {} ({} in {:.1} ms) {}", s.role, s.outcome, s.count, s.ms, trips.join("; "))
    });
    ExitCode::from(exit_status(&result))
}

fn run(args: &Args, summary: &mut Summary) -> Result<(), ExampleError> {
    summary.role = match args.command {
        Cmd::Owner { .. } => "owner",
        Cmd::Post { .. } => "post",
        Cmd::Wait { .. } => "wait",
        Cmd::Bench { .. } => "bench",
        Cmd::Pong { .. } => "pong",
    };
    let device = Device::open(args.backend, args.device)?;
    let patience = Duration::from_secs(10);
    match &args.command {
        Cmd::Owner { socket, initial, hold_secs } => {
            let owner = device.create(socket, &OwnerOptions { initial: *initial, ..OwnerOptions::default() })?;
            eprintln!("semaphore owner: ready at {}", owner.path().display());
            if *hold_secs == 0 {
                // Until stdin closes (the test or shell that started it ends it that way).
                let _ = std::io::stdin().read_to_end(&mut Vec::new());
            } else {
                std::thread::sleep(Duration::from_secs(*hold_secs));
            }
            summary.value = owner.semaphore().value();
            owner.semaphore().check()?;
            Ok(())
        }
        Cmd::Post { socket, count, interval_us, stream, hold_secs } => {
            let sem =
                device.attach(socket, &AttachOptions { name: "post".into(), ..AttachOptions::default() }, patience)?;
            eprintln!("semaphore post: attached");
            for _ in 0..*count {
                if *stream {
                    sem.post_on(device.stream()?, 1)?;
                } else {
                    sem.post(1)?;
                }
                summary.count += 1;
                if *interval_us > 0 {
                    std::thread::sleep(Duration::from_micros(*interval_us));
                }
            }
            if *stream && !stream_idle_within(device.stream()?, patience)? {
                return Err(SemaphoreError::Timeout { waited: patience }.into());
            }
            eprintln!("semaphore post: posted {}", summary.count);
            std::thread::sleep(Duration::from_secs(*hold_secs));
            summary.value = sem.value();
            Ok(())
        }
        Cmd::Wait { socket, count, timeout_ms, until_idle, stream, stream_ahead } => {
            let options = AttachOptions { name: "wait".into(), posts: false, ..AttachOptions::default() };
            let sem = device.attach(socket, &options, patience)?;
            eprintln!("semaphore wait: attached");
            let timeout = Duration::from_millis(*timeout_ms);
            let result = (|| {
                while summary.count < *count {
                    if *stream {
                        let batch = (*stream_ahead).clamp(1, *count - summary.count);
                        summary.count += wait_on_stream(&device, &sem, batch, timeout)?;
                    } else {
                        sem.wait(timeout)?;
                        summary.count += 1;
                    }
                }
                Ok(())
            })();
            summary.value = sem.value();
            match result {
                Err(ExampleError::Semaphore(SemaphoreError::Timeout { .. })) if *until_idle => Ok(()),
                other => other,
            }
        }
        Cmd::Bench { rounds, mode, dir } => {
            summary.round_trips = bench(&device, args, *rounds, mode, dir.clone())?;
            summary.count = *rounds;
            Ok(())
        }
        Cmd::Pong { ping, pong, rounds, mode } => pong_side(&device, ping, pong, *rounds, mode),
    }
}

/// Queues `batch` stream waits, waits (bounded) for the stream, and counts those a post released. The first one
/// the poison released is the error; one still waiting at the timeout is a timeout.
fn wait_on_stream(device: &Device, sem: &Semaphore, batch: u64, timeout: Duration) -> Result<u64, ExampleError> {
    let stream = device.stream()?;
    let waits = (0..batch).map(|_| sem.wait_on(stream)).collect::<Result<Vec<_>, _>>()?;
    eprintln!("semaphore wait: {batch} stream waits queued");
    if !stream_idle_within(stream, timeout)? {
        return Err(SemaphoreError::Timeout { waited: timeout }.into());
    }
    let mut released = 0;
    for wait in &waits {
        if !sem.wait_status(wait)? {
            return Err(SemaphoreError::Timeout { waited: timeout }.into());
        }
        released += 1;
    }
    Ok(released)
}

/// Rounds a stream queues before it waits for itself (below the ticket slots a process has).
const STREAM_BATCH: u64 = 50;

fn bench(
    device: &Device,
    args: &Args,
    rounds: u64,
    mode: &str,
    dir: Option<PathBuf>,
) -> Result<Vec<RoundTrip>, ExampleError> {
    let dir = dir.unwrap_or_else(std::env::temp_dir);
    let tag = std::process::id();
    let mut out = Vec::new();
    let modes: &[&str] = match mode {
        "cpu" => &["cpu"],
        "stream" => &["stream"],
        _ if device.gpu.is_some() => &["cpu", "stream"],
        _ => &["cpu"],
    };
    for &mode in modes {
        let ping_path = dir.join(format!("gpu-ipc-sem-bench-{tag}-{mode}-ping.sock"));
        let pong_path = dir.join(format!("gpu-ipc-sem-bench-{tag}-{mode}-pong.sock"));
        let ping = device.create(&ping_path, &OwnerOptions::default())?;
        let exe = std::env::current_exe().map_err(|e| SemaphoreError::Thread { what: "bench partner", source: e })?;
        let mut partner = Command::new(exe)
            .args(["--backend", args.backend.name(), "--device", &args.device.to_string(), "pong"])
            .arg("--ping")
            .arg(&ping_path)
            .arg("--pong")
            .arg(&pong_path)
            .args(["--rounds", &rounds.to_string(), "--mode", mode])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .spawn()
            .map_err(|e| SemaphoreError::Thread { what: "bench partner", source: e })?;
        let options = AttachOptions { name: "bench".into(), posts: false, ..AttachOptions::default() };
        let pong = device.attach(&pong_path, &options, Duration::from_secs(30))?;
        let ping = ping.semaphore();
        let mut times = Vec::with_capacity(rounds as usize);
        let timeout = Duration::from_secs(10);
        if mode == "cpu" {
            for _ in 0..rounds {
                let t0 = Instant::now();
                ping.post(1)?;
                pong.wait(timeout)?;
                times.push(t0.elapsed());
            }
        } else {
            let stream = device.stream()?;
            let mut done = 0;
            while done < rounds {
                let batch = STREAM_BATCH.min(rounds - done);
                let t0 = Instant::now();
                let mut waits = Vec::new();
                for _ in 0..batch {
                    ping.post_on(stream, 1)?;
                    waits.push(pong.wait_on(stream)?);
                }
                if !stream_idle_within(stream, timeout)? {
                    return Err(SemaphoreError::Timeout { waited: timeout }.into());
                }
                for wait in &waits {
                    pong.wait_status(wait)?;
                }
                times.push(t0.elapsed() / batch as u32);
                done += batch;
            }
        }
        let _ = partner.wait();
        times.sort();
        let mean = times.iter().sum::<Duration>().as_secs_f64() * 1e6 / times.len().max(1) as f64;
        let label = if mode == "cpu" { "cpu<->cpu" } else { "stream<->stream (per round, batches of 50)" };
        out.push(RoundTrip {
            mode: label.to_owned(),
            rounds,
            p50_us: percentile_us(&times, 50.0),
            p99_us: percentile_us(&times, 99.0),
            mean_us: mean,
        });
    }
    Ok(out)
}

fn pong_side(
    device: &Device,
    ping: &std::path::Path,
    pong: &std::path::Path,
    rounds: u64,
    mode: &str,
) -> Result<(), ExampleError> {
    let owner = device.create(pong, &OwnerOptions::default())?;
    let options = AttachOptions { name: "pong".into(), posts: false, ..AttachOptions::default() };
    let ping = device.attach(ping, &options, Duration::from_secs(30))?;
    let pong = owner.semaphore();
    let timeout = Duration::from_secs(10);
    if mode == "cpu" {
        for _ in 0..rounds {
            ping.wait(timeout)?;
            pong.post(1)?;
        }
        // Until the bench has taken the last post (the owner's drop would close the semaphore under it).
        while pong.value() > 0 {
            std::thread::sleep(Duration::from_millis(1));
        }
        return Ok(());
    }
    let stream = device.stream()?;
    let mut done = 0;
    while done < rounds {
        let batch = STREAM_BATCH.min(rounds - done);
        for _ in 0..batch {
            let _released_by_ping = ping.wait_on(stream)?;
            pong.post_on(stream, 1)?;
        }
        if !stream_idle_within(stream, timeout)? {
            return Err(SemaphoreError::Timeout { waited: timeout }.into());
        }
        done += batch;
    }
    while pong.value() > 0 {
        std::thread::sleep(Duration::from_millis(1));
    }
    ping.check()?;
    Ok(())
}
