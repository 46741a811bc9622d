//! A work queue (master/worker) from the command line: an owner that pushes tasks, workers that pop them on the
//! CPU or from a kernel, and a benchmark of kernels popping in 1 and 4 worker processes against one process on its
//! own queue.
//!
//! ```text
//! work_queue owner  --socket /tmp/q.sock --backend host --tasks 100000 --workers 2 &
//! work_queue worker --socket /tmp/q.sock --backend host &
//! work_queue worker --socket /tmp/q.sock --backend host
//! work_queue bench  --backend vmm --tasks 1000000 --workers 1,4      # kernels popping; tasks per second
//! ```
//!
//! The owner pushes tasks `0 .. --tasks` (each record holds its number in every 64-bit word: `--push cpu` from the
//! CPU, `--push kernel` from a kernel), closes the queue, and waits until every task was completed or reported
//! lost. A worker pops until the queue is closed and drained (`--pop cpu`, or `--pop kernel`: a persistent kernel
//! in which each warp pops, checks, works on and completes tasks), and reports the count, sum and sum of squares
//! of what it completed, which must add up over the workers to those of the tasks. `--stall-after N` makes a worker
//! pop `--hold` tasks after N, say `holding H tasks`, and wait to be killed while it holds them (the owner then hands
//! every one out again). With `--json` each prints one JSON summary on stdout.
//!
//! Exit status: 0 done; 1 an error (or a run that does not add up); 3 no CUDA driver; 4 the owner died.

#![forbid(unsafe_code)] // Only ipc-core's driver and sys layers may contain `unsafe`.

use std::io::{BufRead, BufReader, Write};
use std::path::PathBuf;
use std::process::{Child, Command, ExitCode, Stdio};
use std::time::{Duration, Instant};

use clap::{Parser, Subcommand, ValueEnum};
use gpu_ipc::kernels::work_queue::{DemoSums, demo_record};
use gpu_ipc::queue::{QueueBackend, QueueConfig, QueueError, QueueStats, QueueWorker, WorkQueue, WorkerOptions};
use gpu_ipc_examples::work_queue::{
    ExampleError, Gpu, QueueProgram, exit_status, outcome_word, per_second, retry_until, run_queue_program,
};
use gpu_ipc_examples::{ObjectArgs, print_summary};

/// A work queue between processes.
#[derive(Debug, Parser)]
#[command(version, after_help = gpu_ipc_examples::exit::HELP)]
struct Args {
    #[command(subcommand)]
    command: Cmd,
    #[command(flatten)]
    object: ObjectArgs,
    /// Bound on the whole run, in seconds.
    #[arg(long, global = true, default_value_t = 120)]
    timeout_secs: u64,
}

/// Who pushes or pops: the CPU, or a kernel.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, serde::Serialize)]
#[serde(rename_all = "lowercase")]
enum Side {
    Cpu,
    Kernel,
}

#[derive(Debug, Clone, Subcommand)]
enum Cmd {
    /// Create a queue, wait for `--workers`, push `--tasks`, close, and wait until all are done.
    Owner {
        #[arg(long)]
        socket: PathBuf,
        #[arg(long, default_value_t = 100_000)]
        tasks: u64,
        /// Workers to wait for before pushing.
        #[arg(long, default_value_t = 1)]
        workers: usize,
        /// Cells (a power of two).
        #[arg(long, default_value_t = 4096)]
        capacity: u64,
        /// Bytes of a record (a multiple of 8).
        #[arg(long, default_value_t = 16)]
        record_bytes: u32,
        #[arg(long, value_enum, default_value = "cpu")]
        push: Side,
        /// How long after a worker's end its tasks are taken back, in milliseconds.
        #[arg(long, default_value_t = 1000)]
        reclaim_ms: u64,
    },
    /// Attach and pop until the queue is closed and drained.
    Worker {
        #[arg(long)]
        socket: PathBuf,
        #[arg(long, default_value = "worker")]
        name: String,
        #[arg(long, value_enum, default_value = "cpu")]
        pop: Side,
        /// Tasks popped at once (CPU).
        #[arg(long, default_value_t = 64)]
        batch: usize,
        /// Complete this many tasks, then pop `--hold` tasks, say `holding N tasks` on stderr, hold them without
        /// completing them and wait to be killed (CPU pops, any backend).
        #[arg(long)]
        stall_after: Option<u64>,
        /// How many tasks a stalled worker holds (`--stall-after`).
        #[arg(long, default_value_t = 8)]
        hold: usize,
        /// Warps per multiprocessor popping (kernel).
        #[arg(long, default_value_t = 4)]
        warps_per_sm: u32,
        /// Rounds of a 64-bit mix per record word: the "work" on each task (kernel).
        #[arg(long, default_value_t = 0)]
        work_rounds: u64,
        /// Say `ready` on stderr once attached and loaded, then wait for a line on stdin before popping.
        #[arg(long)]
        wait_go: bool,
    },
    /// Tasks per second with kernels popping: one process on its own queue, then 1 and 4 (`--workers`) worker
    /// processes on the queue of this one.
    Bench {
        #[arg(long, default_value_t = 1_000_000)]
        tasks: u64,
        /// Worker process counts to run.
        #[arg(long, value_delimiter = ',', default_value = "1,4")]
        workers: Vec<usize>,
        #[arg(long, default_value_t = 16)]
        record_bytes: u32,
        #[arg(long, default_value_t = 4)]
        warps_per_sm: u32,
        #[arg(long, default_value_t = 0)]
        work_rounds: u64,
        /// Folder for the sockets (default: the temporary folder).
        #[arg(long)]
        dir: Option<PathBuf>,
    },
}

#[derive(Debug, Default, serde::Serialize)]
struct Summary {
    role: &'static str,
    backend: &'static str,
    outcome: &'static str,
    message: Option<String>,
    /// Owner: the queue's counters at the end.
    stats: Option<QueueStats>,
    /// Owner: the sums of the tasks pushed; worker: of those it completed.
    sums: DemoSums,
    /// Worker: tasks it completed that were redeliveries.
    redelivered: u64,
    /// Worker: records with a word other than the task's number.
    bad_records: u64,
    seconds: f64,
    tasks_per_s: f64,
    /// Worker with `--pop kernel`: `%globaltimer` at the kernel's start and end (the same clock in every process).
    gpu_start_ns: u64,
    gpu_end_ns: u64,
    /// Bench: one row per run.
    rows: Vec<BenchRow>,
}

#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
struct BenchRow {
    /// `local` (this process, its own queue) or `processes`.
    mode: String,
    workers: usize,
    tasks: u64,
    /// From the first kernel's start to the last one's end, on the GPU's clock.
    seconds: f64,
    tasks_per_s: f64,
    /// Whether the completed tasks added up to those pushed.
    ok: bool,
}

fn main() -> ExitCode {
    let args = Args::parse();
    let timeout = Duration::from_secs(args.timeout_secs);
    let started = Instant::now();
    let mut summary = Summary { backend: args.object.backend.name(), ..Summary::default() };
    let result = match args.command.clone() {
        Cmd::Owner { .. } => {
            summary.role = "owner";
            run_queue_program(
                args.object.backend,
                args.object.device,
                Owner { args: &args, timeout, summary: &mut summary },
            )
        }
        Cmd::Worker { .. } => {
            summary.role = "worker";
            run_queue_program(
                args.object.backend,
                args.object.device,
                Worker { args: &args, timeout, summary: &mut summary },
            )
        }
        Cmd::Bench { tasks, workers, record_bytes, warps_per_sm, work_rounds, dir } => {
            summary.role = "bench";
            let bench = Bench { args: &args, tasks, workers, record_bytes, warps_per_sm, work_rounds, dir, timeout };
            run_queue_program(args.object.backend, args.object.device, bench).map(|rows| summary.rows = rows)
        }
    };
    summary.outcome = outcome_word(&result);
    if summary.seconds == 0.0 {
        summary.seconds = started.elapsed().as_secs_f64();
    }
    if let Err(e) = &result {
        eprintln!("work_queue {}: {e}", summary.role);
        summary.message = Some(e.to_string());
    }
    print_summary(args.object.json, &summary, |s| match (s.role, &s.stats) {
        ("bench", _) => s.rows.iter().map(|r| format!("{r:?}")).collect::<Vec<_>>().join("\n"),
        (_, Some(stats)) => {
            format!("{}: {} in {:.3} s ({:.0} tasks/s): {stats:?}", s.role, s.outcome, s.seconds, s.tasks_per_s)
        }
        _ => format!("{}: {} {:?} in {:.3} s ({:.0} tasks/s)", s.role, s.outcome, s.sums, s.seconds, s.tasks_per_s),
    });
    ExitCode::from(exit_status(&result))
}

struct Owner<'a> {
    args: &'a Args,
    timeout: Duration,
    summary: &'a mut Summary,
}

impl QueueProgram for Owner<'_> {
    type Output = ();
    fn run<B: QueueBackend>(self, ctx: &B::Context, gpu: Option<&Gpu>) -> Result<(), ExampleError> {
        let Cmd::Owner { socket, tasks, workers, capacity, record_bytes, push, reclaim_ms } = &self.args.command else {
            return Err(ExampleError::Usage("not the owner".into()));
        };
        if *record_bytes == 0 || record_bytes % 8 != 0 {
            return Err(ExampleError::Usage(format!("--record-bytes {record_bytes}: use a multiple of 8")));
        }
        let config = QueueConfig {
            reclaim_after: Duration::from_millis(*reclaim_ms),
            ..QueueConfig::new(*capacity, *record_bytes)
        };
        let queue = WorkQueue::<B>::create(ctx, socket, config)?;
        eprintln!("work_queue owner: serving {}", queue.socket().display());
        queue.wait_for_workers(*workers, self.timeout)?;
        let start = Instant::now();
        match push {
            Side::Cpu => push_from_cpu(&queue, *tasks, *record_bytes, self.timeout)?,
            Side::Kernel => {
                let gpu = gpu.ok_or(QueueError::NeedsGpu { what: "--push kernel" })?;
                push_from_kernel(&queue, gpu, *tasks, *record_bytes, self.timeout)?;
            }
        }
        queue.close()?;
        let stats = queue.wait_until_done(self.timeout)?;
        self.summary.seconds = start.elapsed().as_secs_f64();
        self.summary.tasks_per_s = per_second(*tasks, start.elapsed());
        self.summary.sums = DemoSums::of_range(0, *tasks);
        self.summary.stats = Some(stats);
        let lost = queue.take_lost();
        if stats.pushed != *tasks || stats.completed + stats.lost != *tasks || !lost.is_empty() {
            return Err(ExampleError::Usage(format!("{tasks} tasks pushed, but {stats:?}; lost: {lost:?}")));
        }
        Ok(())
    }
}

fn push_from_cpu<B: QueueBackend>(
    queue: &WorkQueue<B>,
    tasks: u64,
    record_bytes: u32,
    timeout: Duration,
) -> Result<(), ExampleError> {
    let mut next = 0;
    while next < tasks {
        let records: Vec<Vec<u8>> =
            (next..(next + 256).min(tasks)).map(|v| demo_record(v, record_bytes as usize)).collect();
        let refs: Vec<&[u8]> = records.iter().map(Vec::as_slice).collect();
        let pushed = retry_until("pushing", timeout, Duration::from_micros(50), || {
            let ids = queue.try_push_many(&refs)?;
            Ok((!ids.is_empty()).then_some(ids.len() as u64))
        })?;
        next += pushed;
    }
    Ok(())
}

fn push_from_kernel<B: QueueBackend>(
    queue: &WorkQueue<B>,
    gpu: &Gpu,
    tasks: u64,
    record_bytes: u32,
    timeout: Duration,
) -> Result<(), ExampleError> {
    gpu.kernels.reset()?;
    let (config, args) = gpu.kernels.producer_launch(0, tasks, record_bytes, 32 * 1024, timeout)?;
    queue.launch(gpu.kernels.producer(), &gpu.stream, config, &args)?;
    gpu.finish("the producer kernel", timeout + Duration::from_secs(5))?;
    match gpu.kernels.producer_result()? {
        (pushed, 0) if pushed == tasks => Ok(()),
        (pushed, failed) => {
            Err(ExampleError::Usage(format!("the producer kernel pushed {pushed} of {tasks} ({failed} failed)")))
        }
    }
}

struct Worker<'a> {
    args: &'a Args,
    timeout: Duration,
    summary: &'a mut Summary,
}

impl QueueProgram for Worker<'_> {
    type Output = ();
    fn run<B: QueueBackend>(self, ctx: &B::Context, gpu: Option<&Gpu>) -> Result<(), ExampleError> {
        let Cmd::Worker { socket, name, pop, batch, stall_after, hold, warps_per_sm, work_rounds, wait_go } =
            &self.args.command
        else {
            return Err(ExampleError::Usage("not a worker".into()));
        };
        let options = WorkerOptions { name: name.clone(), wait_for_owner: self.timeout, ..WorkerOptions::default() };
        let worker = QueueWorker::<B>::attach(ctx, socket, &options)?;
        if *wait_go {
            eprintln!("work_queue worker: ready");
            let mut line = String::new();
            std::io::stdin().read_line(&mut line).map_err(|e| ExampleError::Usage(format!("reading stdin: {e}")))?;
        }
        let start = Instant::now();
        match pop {
            Side::Cpu => {
                let stall = stall_after.map(|after| (after, *hold));
                pop_on_cpu(&worker, *batch, stall, self.timeout, self.summary)?;
            }
            Side::Kernel => {
                let gpu = gpu.ok_or(QueueError::NeedsGpu { what: "--pop kernel" })?;
                gpu.kernels.reset()?;
                let (config, args) = gpu.kernels.worker_launch(*warps_per_sm, *work_rounds, self.timeout);
                worker.launch(gpu.kernels.worker(), &gpu.stream, config, &args)?;
                gpu.finish("the worker kernel", self.timeout + Duration::from_secs(5))?;
                let result = gpu.kernels.worker_result()?;
                self.summary.sums = result.sums;
                self.summary.redelivered = result.redelivered;
                self.summary.bad_records = result.bad_records;
                self.summary.gpu_start_ns = result.gpu_start_ns;
                self.summary.gpu_end_ns = result.gpu_end_ns;
                if result.timed_out_warps > 0 {
                    let why = if worker.owner_gone() { "the owner is gone" } else { "the queue was not closed" };
                    return Err(ExampleError::Usage(format!("the kernel ran out of time: {why}; {result:?}")));
                }
                if result.lease_lost > 0 {
                    return Err(QueueError::LeaseLost { id: 0 }.into());
                }
            }
        }
        self.summary.seconds = start.elapsed().as_secs_f64();
        self.summary.tasks_per_s = per_second(self.summary.sums.count, start.elapsed());
        if self.summary.bad_records > 0 {
            return Err(ExampleError::Usage(format!("{} records were not what was pushed", self.summary.bad_records)));
        }
        Ok(())
    }
}

/// Pops and completes until the queue is closed and drained; with `stall` = (after, hold), once `after` tasks are
/// completed, pops until it holds `hold` tasks, says so, and waits to be killed while holding them.
fn pop_on_cpu<B: QueueBackend>(
    worker: &QueueWorker<B>,
    batch: usize,
    stall: Option<(u64, usize)>,
    timeout: Duration,
    summary: &mut Summary,
) -> Result<(), ExampleError> {
    loop {
        if let Some((_, hold)) = stall.filter(|(after, _)| summary.sums.count >= *after) {
            let deadline = Instant::now() + timeout;
            let mut held = Vec::with_capacity(hold);
            while held.len() < hold {
                let left = deadline.saturating_duration_since(Instant::now());
                held.extend(worker.pop_many(hold - held.len(), left)?);
            }
            // Popped and not completed: the owner must hand every one of them out again once this process is killed.
            eprintln!("work_queue worker: holding {} tasks", held.len());
            std::thread::sleep(timeout);
            return Err(ExampleError::Usage("stalled and was not killed".into()));
        }
        let tasks = match worker.pop_many(batch.max(1), timeout) {
            Ok(tasks) => tasks,
            Err(QueueError::Closed) => return Ok(()),
            Err(e) => return Err(e.into()),
        };
        let mut sums = summary.sums;
        for task in &tasks {
            let words: Vec<u64> =
                task.record().chunks_exact(8).map(|w| u64::from_le_bytes(w.try_into().unwrap_or_default())).collect();
            let value = words.first().copied().unwrap_or(0);
            summary.bad_records += u64::from(words.is_empty() || words.iter().any(|&w| w != value));
            summary.redelivered += u64::from(task.attempt() > 0);
            sums = sums.with(value);
        }
        // One kernel launch for the batch on a GPU backend.
        worker.complete_many(tasks)?;
        summary.sums = sums;
    }
}

struct Bench<'a> {
    args: &'a Args,
    tasks: u64,
    workers: Vec<usize>,
    record_bytes: u32,
    warps_per_sm: u32,
    work_rounds: u64,
    dir: Option<PathBuf>,
    timeout: Duration,
}

impl QueueProgram for Bench<'_> {
    type Output = Vec<BenchRow>;
    fn run<B: QueueBackend>(self, ctx: &B::Context, gpu: Option<&Gpu>) -> Result<Vec<BenchRow>, ExampleError> {
        let gpu = gpu.ok_or(QueueError::NeedsGpu { what: "the bench (kernels pop)" })?;
        let dir = self.dir.clone().unwrap_or_else(std::env::temp_dir);
        let expected = DemoSums::of_range(0, self.tasks);
        let mut rows = Vec::new();
        for workers in std::iter::once(0).chain(self.workers.iter().copied()) {
            let socket = dir.join(format!("gpu-ipc-queue-bench-{}-{workers}.sock", std::process::id()));
            let capacity = self.tasks.next_power_of_two().max(2);
            let config = QueueConfig { max_workers: 64, ..QueueConfig::new(capacity, self.record_bytes) };
            let queue = WorkQueue::<B>::create(ctx, &socket, config)?;
            // The queue holds every task before the kernels start, so that only popping is timed.
            push_from_kernel(&queue, gpu, self.tasks, self.record_bytes, self.timeout)?;
            queue.close()?;
            let (start, end, sums) = if workers == 0 {
                gpu.kernels.reset()?;
                let (config, args) = gpu.kernels.worker_launch(self.warps_per_sm, self.work_rounds, self.timeout);
                queue.launch(gpu.kernels.worker(), &gpu.stream, config, &args)?;
                gpu.finish("the worker kernel", self.timeout + Duration::from_secs(5))?;
                let r = gpu.kernels.worker_result()?;
                (r.gpu_start_ns, r.gpu_end_ns, r.sums)
            } else {
                self.in_processes(&socket, workers)?
            };
            let stats = queue.wait_until_done(self.timeout)?;
            let seconds = end.saturating_sub(start) as f64 / 1e9;
            let ok = sums == expected && stats.completed == self.tasks && stats.lost == 0;
            let mode = if workers == 0 { "local" } else { "processes" };
            let row = BenchRow {
                mode: mode.into(),
                workers: workers.max(1),
                tasks: self.tasks,
                seconds,
                tasks_per_s: if seconds > 0.0 { self.tasks as f64 / seconds } else { 0.0 },
                ok,
            };
            eprintln!("work_queue bench: {row:?}");
            rows.push(row);
        }
        if rows.iter().any(|r| !r.ok) {
            return Err(ExampleError::Usage(format!("a run did not add up: {rows:?}")));
        }
        Ok(rows)
    }
}

impl Bench<'_> {
    /// Starts `workers` worker processes on `socket`, lets them all pop at once, and returns the earliest kernel
    /// start, the latest kernel end, and the sums of what they completed.
    fn in_processes(&self, socket: &std::path::Path, workers: usize) -> Result<(u64, u64, DemoSums), ExampleError> {
        let exe = std::env::current_exe().map_err(|e| ExampleError::Usage(format!("finding this program: {e}")))?;
        let mut children: Vec<Child> = Vec::new();
        for i in 0..workers {
            let child = Command::new(&exe)
                .args(["worker", "--pop", "kernel", "--wait-go", "--json", "--name", &format!("bench-{i}")])
                .args(["--socket", &socket.display().to_string(), "--backend", self.args.object.backend.name()])
                .args([
                    "--device",
                    &self.args.object.device.to_string(),
                    "--timeout-secs",
                    &self.args.timeout_secs.to_string(),
                ])
                .args([
                    "--warps-per-sm",
                    &self.warps_per_sm.to_string(),
                    "--work-rounds",
                    &self.work_rounds.to_string(),
                ])
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .map_err(|e| ExampleError::Usage(format!("starting a worker: {e}")))?;
            children.push(child);
        }
        for child in &mut children {
            let stderr = child.stderr.take().ok_or_else(|| ExampleError::Usage("no stderr".into()))?;
            let mut lines = BufReader::new(stderr).lines();
            loop {
                match lines.next() {
                    Some(Ok(line)) if line.contains("ready") => break,
                    Some(Ok(line)) => eprintln!("[worker] {line}"),
                    _ => return Err(ExampleError::Usage("a worker ended before it was ready".into())),
                }
            }
            std::thread::spawn(move || lines.map_while(Result::ok).for_each(|line| eprintln!("[worker] {line}")));
        }
        for child in &mut children {
            if let Some(stdin) = child.stdin.as_mut() {
                let _ = writeln!(stdin, "go");
            }
        }
        let (mut start, mut end, mut sums) = (u64::MAX, 0, DemoSums::default());
        for child in children {
            let out = child.wait_with_output().map_err(|e| ExampleError::Usage(format!("a worker: {e}")))?;
            let text = String::from_utf8_lossy(&out.stdout);
            let json: serde_json::Value = serde_json::from_str(text.trim())
                .map_err(|e| ExampleError::Usage(format!("a worker's summary: {e}: {text}")))?;
            if !out.status.success() {
                return Err(ExampleError::Usage(format!("a worker failed ({}): {json}", out.status)));
            }
            let word = |key: &str| json[key].as_u64().unwrap_or(0);
            start = start.min(word("gpu_start_ns"));
            end = end.max(word("gpu_end_ns"));
            let theirs: DemoSums = serde_json::from_value(json["sums"].clone()).unwrap_or_default();
            sums = sums.merge(theirs);
        }
        Ok((start, end, sums))
    }
}
