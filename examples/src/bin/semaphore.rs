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
//! Every process attaches the same way: a peer becomes a poster with its first post, so `wait`'s death breaks
//! nothing, while a `post` that dies without detaching after posting poisons the semaphore: every waiter gets
//! `poster-died` (exit status 4) within a second, and so does a newcomer. `owner --dead-poster ignore` makes a
//! semaphore that goes on instead; `owner --reset-when-poisoned` resets a poisoned one. `--stream` posts and waits
//! on a CUDA stream (GPU backends); a stream `wait` also copies, on the stream after each wait, the word that says
//! whether a post or the poison released it, and reports what the GPU saw (`gpu_poisoned`). With `--json` each
//! prints one JSON summary on stdout.
//!
//! Exit status (one table for every example program: `docs/exit-codes.md`): 0 done; 1 an error; 4 the semaphore
//! ended (poisoned by a dead poster, the owner died, or it was closed).

#![forbid(unsafe_code)] // Only ipc-core's driver and sys layers may contain `unsafe`.

use std::io::Read;
use std::path::PathBuf;
use std::process::{Command, ExitCode, Stdio};
use std::time::{Duration, Instant};

use clap::{Parser, Subcommand};
use std::sync::atomic::Ordering;

use gpu_ipc::driver::{DeviceBuffer, DeviceMemory};
use gpu_ipc::semaphore::{AttachOptions, DeadPoster, OwnerOptions, Semaphore, SemaphoreError};
use gpu_ipc_examples::semaphore::{Device, ExampleError, exit_status, outcome_word, percentile_us, stream_idle_within};
use gpu_ipc_examples::{ObjectArgs, print_summary, stdin_closed_flag};

/// A cross-process counting semaphore.
#[derive(Debug, Parser)]
#[command(version, after_help = gpu_ipc_examples::exit::HELP)]
struct Args {
    #[command(subcommand)]
    command: Cmd,
    #[command(flatten)]
    object: ObjectArgs,
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
        /// What the death of a peer that has posted does: `poison` (the semaphore breaks) or `ignore`.
        #[arg(long, default_value = "poison", value_parser = parse_dead_poster)]
        dead_poster: DeadPoster,
        /// Reset the semaphore whenever a dead poster poisons it (prints "reset").
        #[arg(long)]
        reset_when_poisoned: bool,
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
    /// Attach (as every peer does: it never posts, so its death breaks nothing) and take `--count` posts, each wait
    /// bounded by `--timeout-ms`.
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
    /// Stream waits whose status word, copied on the GPU right after the wait, said the poison released them.
    gpu_poisoned: u64,
    /// Resets the owner made (`--reset-when-poisoned`).
    resets: u64,
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
    let mut summary = Summary { backend: args.object.backend.name(), ..Summary::default() };
    let result = run(&args, &mut summary);
    summary.outcome = outcome_word(&result);
    summary.message = result.as_ref().err().map(ToString::to_string);
    summary.ms = start.elapsed().as_secs_f64() * 1e3;
    if let Err(e) = &result {
        eprintln!("semaphore {}: {e}", summary.role);
    }
    print_summary(args.object.json, &summary, |s| {
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
    let device = Device::open(args.object.backend, args.object.device)?;
    let patience = Duration::from_secs(10);
    match &args.command {
        Cmd::Owner { socket, initial, hold_secs, dead_poster, reset_when_poisoned } => {
            let options = OwnerOptions { initial: *initial, dead_poster: *dead_poster, ..OwnerOptions::default() };
            let owner = device.create(socket, &options)?;
            eprintln!("semaphore owner: ready at {}", owner.path().display());
            if *reset_when_poisoned {
                // Until stdin closes (or --hold-secs), resetting whenever a dead poster poisons it.
                let closed = stdin_closed_flag();
                let until = (*hold_secs > 0).then(|| Instant::now() + Duration::from_secs(*hold_secs));
                while !closed.load(Ordering::Acquire) && until.is_none_or(|t| Instant::now() < t) {
                    if let Err(e @ SemaphoreError::PosterDied { .. }) = owner.semaphore().check() {
                        let value = owner.reset()?;
                        summary.resets += 1;
                        eprintln!("semaphore owner: reset (value {value}) after: {e}");
                    }
                    std::thread::sleep(Duration::from_millis(5));
                }
            } else if *hold_secs == 0 {
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
            let options = AttachOptions { name: "wait".into(), ..AttachOptions::default() };
            let sem = device.attach(socket, &options, patience)?;
            eprintln!("semaphore wait: attached");
            let timeout = Duration::from_millis(*timeout_ms);
            let result = (|| {
                while summary.count < *count {
                    if *stream {
                        let batch = (*stream_ahead).clamp(1, *count - summary.count);
                        summary.count += wait_on_stream(&device, &sem, batch, timeout, &mut summary.gpu_poisoned)?;
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

/// Queues `batch` stream waits, each followed on the stream by a copy of its status word into device memory (what
/// a kernel queued after the wait would read), waits (bounded) for the stream, and counts those a post released.
/// Adds to `gpu_poisoned` how many the GPU-side status showed released by the poison. The first one the poison
/// released is the error; one still waiting at the timeout is a timeout.
fn wait_on_stream(
    device: &Device,
    sem: &Semaphore,
    batch: u64,
    timeout: Duration,
    gpu_poisoned: &mut u64,
) -> Result<u64, ExampleError> {
    let (ctx, stream) = device.gpu.as_ref().ok_or(SemaphoreError::NoCudaContext)?;
    // Freed only once the stream is idle: on any early return the stream may still copy into it, so it is left
    // allocated (a few bytes, in a process about to exit).
    let status = std::mem::ManuallyDrop::new(DeviceBuffer::alloc(ctx, 8 * batch)?);
    let mut waits = Vec::new();
    for i in 0..batch {
        let wait = sem.wait_on(stream)?;
        sem.copy_status_on(stream, &wait, &status.span().slice(8 * i, 8)?)?;
        waits.push(wait);
    }
    eprintln!("semaphore wait: {batch} stream waits queued");
    if !stream_idle_within(stream, timeout)? {
        return Err(SemaphoreError::Timeout { waited: timeout }.into());
    }
    let mut words = vec![0u64; batch as usize];
    status.span().read(0, &mut words)?;
    drop(std::mem::ManuallyDrop::into_inner(status));
    let poisoned = waits.iter().zip(&words).filter(|&(wait, &word)| !wait.released_by_post(word)).count() as u64;
    *gpu_poisoned += poisoned;
    eprintln!("semaphore wait: the GPU saw {poisoned} of {batch} stream waits released by the poison");
    let mut released = 0;
    for (wait, &word) in waits.iter().zip(&words) {
        match sem.wait_status(wait) {
            Ok(true) => {}
            Ok(false) => return Err(SemaphoreError::Timeout { waited: timeout }.into()),
            Err(e) => {
                // What the GPU saw must agree with what the CPU is told.
                if wait.released_by_post(word) {
                    eprintln!("semaphore wait: the GPU saw a post for ticket {} the CPU calls poisoned", wait.ticket());
                }
                return Err(e.into());
            }
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
            .args(["--backend", args.object.backend.name(), "--device", &args.object.device.to_string(), "pong"])
            .arg("--ping")
            .arg(&ping_path)
            .arg("--pong")
            .arg(&pong_path)
            .args(["--rounds", &rounds.to_string(), "--mode", mode])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .spawn()
            .map_err(|e| SemaphoreError::Thread { what: "bench partner", source: e })?;
        let options = AttachOptions { name: "bench".into(), ..AttachOptions::default() };
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
    let options = AttachOptions { name: "pong".into(), ..AttachOptions::default() };
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

fn parse_dead_poster(s: &str) -> Result<DeadPoster, String> {
    match s {
        "poison" => Ok(DeadPoster::Poison),
        "ignore" => Ok(DeadPoster::Ignore),
        _ => Err(format!("unknown rule `{s}`; use poison or ignore")),
    }
}
