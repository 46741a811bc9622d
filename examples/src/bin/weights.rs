//! Model weights between processes (`gpu_ipc::weights`): an owner publishes a set of tensors and new generations of
//! it; a reader process opens the set, follows the generations and checks every tensor's bytes against the
//! manifest's checksums; `bench` runs both (the reader as a child process) and prints what opening and switching cost.
//!
//! ```text
//! weights bench --backend vmm --tensors 291 --mib 1024 --generations 20 --json
//! weights bench --backend host --tensors 19000 --mib 64        # no GPU needed
//! weights owner --backend vmm --socket /tmp/w.sock              # publishes 1, then one more per line on stdin
//! weights stream-wait --backend vmm --socket /tmp/w.sock --generation 2
//! ```
//! `stream-wait` queues on a CUDA stream a wait for a generation (`WeightsReader::wait_on`) and, right after it, a
//! copy of the reader's status word into device memory (what a kernel queued after the wait would read); it prints
//! what released the stream, as the GPU saw it and as the CPU is told, and how long the reader took to close
//! (`--close-after-ms`: the reader closes while the stream still waits, which must release it).
//! Exit status: 0 every generation the reader took verified; 1 a mismatch or another error; 3 no CUDA driver (use
//! `--backend host`).

#![forbid(unsafe_code)] // Only ipc-core's driver and sys layers may contain `unsafe`.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode, Stdio};
use std::time::{Duration, Instant};

use clap::{Parser, Subcommand};
use gpu_ipc::BackendKind;
use gpu_ipc::core::host::{Host, HostContext};
use gpu_ipc::driver::{Context, DeviceBuffer, DeviceMemory, Stream};
use gpu_ipc::pool::PoolError;
use gpu_ipc::weights::{
    ArenaBytes, DType, GenerationWaitStatus, TensorDesc, WeightsError, WeightsOptions, WeightsOwner, WeightsReader,
};
use gpu_ipc_examples::{EXIT_NO_DRIVER, RoleArgs, print_summary};

/// Share a set of tensors and its generations between processes.
#[derive(Debug, Parser)]
#[command(version, after_help = gpu_ipc_examples::exit::HELP)]
struct Args {
    #[command(subcommand)]
    role: Role,
}

#[derive(Debug, Subcommand)]
enum Role {
    /// Publish `--generations` generations of a set of `--tensors` bf16 tensors (`--mib` MiB in all) while a reader
    /// child process follows them and verifies each.
    Bench {
        #[command(flatten)]
        common: RoleArgs,
        #[arg(long, default_value_t = 291)]
        tensors: u64,
        #[arg(long, default_value_t = 64)]
        mib: u64,
        #[arg(long, default_value_t = 10)]
        generations: u64,
    },
    /// Open the set at `--socket`, follow it up to `--generations`, verify each generation taken.
    Reader {
        #[command(flatten)]
        common: RoleArgs,
        #[arg(long)]
        socket: PathBuf,
        #[arg(long, default_value_t = 10)]
        generations: u64,
    },
    /// Publish generation 1 of a small set at `--socket`, then one more generation per line read on stdin; end at
    /// the end of stdin.
    Owner {
        #[command(flatten)]
        common: RoleArgs,
        #[arg(long)]
        socket: PathBuf,
    },
    /// Queue on a CUDA stream a wait for `--generation` (and a copy of the status word after it), then report what
    /// released the stream (at most `--timeout-ms`). GPU backends only.
    StreamWait {
        #[command(flatten)]
        common: RoleArgs,
        #[arg(long)]
        socket: PathBuf,
        #[arg(long)]
        generation: u64,
        #[arg(long, default_value_t = 30_000)]
        timeout_ms: u64,
        /// Close the reader this long after queueing, while the stream may still wait.
        #[arg(long)]
        close_after_ms: Option<u64>,
    },
}

#[derive(Debug, serde::Serialize)]
struct StreamWaitReport {
    role: &'static str,
    backend: &'static str,
    generation: u64,
    /// The status word as the stream's copy after the wait saw it.
    gpu_word: u64,
    /// What released the wait by that word: "published" or "gone".
    gpu_status: &'static str,
    /// What `wait_status` said once the stream was idle (`None` when the reader was closed first).
    cpu_status: Option<String>,
    /// Milliseconds from queueing the wait to the stream found idle.
    released_after_ms: f64,
    /// Milliseconds the reader took to close (`--close-after-ms`).
    close_ms: Option<f64>,
}

#[derive(Debug, serde::Serialize)]
struct ReaderReport {
    role: &'static str,
    backend: &'static str,
    tensors: u64,
    cold_open_ms: f64,
    switches: u64,
    switch_ms_max: f64,
    verified_generations: u64,
}

#[derive(Debug, serde::Serialize)]
struct BenchSummary {
    role: &'static str,
    backend: &'static str,
    tensors: u64,
    arena_bytes: u64,
    create_ms: f64,
    publish_ms_max: f64,
    reader: Option<serde_json::Value>,
}

/// The set's tensors: `tensors` bf16 tensors of about `mib` MiB together, a few shapes.
fn tensors(tensors: u64, mib: u64) -> Result<Vec<(String, TensorDesc)>, WeightsError> {
    let each = ((mib << 20) / tensors.max(1) / 2).max(1);
    (0..tensors)
        .map(|i| {
            let shape = if each >= 256 && i % 2 == 0 { vec![each / 256, 256] } else { vec![each] };
            let desc = TensorDesc::contiguous(DType::BF16, shape).map_err(|e| WeightsError::Invalid(e.to_string()))?;
            Ok((format!("model.layers.{}.t{}.weight", i / 3, i % 3), desc))
        })
        .collect()
}

/// Generation `g`'s bytes of a tensor of `len` bytes.
fn bytes_of(g: u64, index: usize, len: u64) -> Vec<u8> {
    (0..len).map(|k| (g as u8).wrapping_mul(31) ^ (index as u8) ^ (k as u8)).collect()
}

fn publish<B: ArenaBytes>(owner: &mut WeightsOwner<B>) -> Result<u64, WeightsError> {
    let generation = owner.generation() + 1;
    let staged = owner.stage()?;
    let entries = staged.manifest().entries.clone();
    for (i, e) in entries.iter().enumerate() {
        staged.write(&e.name, &bytes_of(generation, i, e.span_bytes()))?;
    }
    owner.commit()
}

fn bench<B: ArenaBytes>(
    ctx: &B::Context,
    common: &RoleArgs,
    n: u64,
    mib: u64,
    generations: u64,
) -> Result<BenchSummary, WeightsError> {
    let socket = std::env::temp_dir().join(format!("gpu-ipc-weights-bench-{}.sock", std::process::id()));
    let start = Instant::now();
    let options = WeightsOptions { checksums: true, ..WeightsOptions::default() };
    let mut owner = WeightsOwner::<B>::create(ctx, &socket, "model", tensors(n, mib)?, options)?;
    publish(&mut owner)?;
    let create_ms = start.elapsed().as_secs_f64() * 1e3;
    let exe = std::env::current_exe().map_err(|e| WeightsError::Invalid(format!("finding this program: {e}")))?;
    let mut child = Command::new(exe)
        .args(["reader", "--json", "--backend", B::KIND.name(), "--device", &common.device.to_string()])
        .args(["--generations", &generations.to_string(), "--socket"])
        .arg(owner.path())
        .stdout(Stdio::piped())
        .spawn()
        .map_err(|e| WeightsError::Invalid(format!("starting the reader: {e}")))?;
    let deadline = Instant::now() + Duration::from_secs(30);
    while owner.readers().is_empty() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(2));
    }
    let mut publish_ms_max: f64 = 0.0;
    while owner.generation() < generations {
        // One generation at a time, once the reader holds the one before (it checks each whole).
        let want = owner.generation();
        while !owner.readers().iter().any(|r| r.generations.contains(&want))
            && Instant::now() < deadline + Duration::from_secs(60)
        {
            std::thread::sleep(Duration::from_micros(200));
        }
        let start = Instant::now();
        publish(&mut owner)?;
        publish_ms_max = publish_ms_max.max(start.elapsed().as_secs_f64() * 1e3);
    }
    let mut line = String::new();
    if let Some(out) = child.stdout.take() {
        for l in BufReader::new(out).lines().map_while(Result::ok) {
            line = l;
        }
    }
    let status = child.wait().map_err(|e| WeightsError::Invalid(format!("waiting for the reader: {e}")))?;
    if !status.success() {
        return Err(WeightsError::Invalid(format!("the reader failed ({status}): {line}")));
    }
    Ok(BenchSummary {
        role: "bench",
        backend: B::KIND.name(),
        tensors: n,
        arena_bytes: owner.layout().arena_bytes,
        create_ms,
        publish_ms_max,
        reader: serde_json::from_str(&line).ok(),
    })
}

fn reader<B: ArenaBytes>(ctx: &B::Context, socket: &Path, generations: u64) -> Result<ReaderReport, WeightsError> {
    let start = Instant::now();
    let mut reader = WeightsReader::<B>::open(ctx, socket, "model", Duration::from_secs(30))?;
    let cold_open_ms = start.elapsed().as_secs_f64() * 1e3;
    let tensors = reader.held().manifest().entries.len() as u64;
    let (mut switches, mut switch_ms_max, mut verified) = (0u64, 0f64, 0u64);
    let check = |held: &gpu_ipc::weights::HeldGeneration<B>| -> Result<(), WeightsError> {
        if held.verify()? != held.manifest().entries.len() {
            return Err(WeightsError::Invalid("a generation without checksums".into()));
        }
        // And the bytes themselves, against what the owner wrote.
        for (i, e) in held.manifest().entries.iter().enumerate() {
            let mut got = vec![0u8; e.span_bytes() as usize];
            held.read(&e.name, &mut got)?;
            if got != bytes_of(held.generation(), i, e.span_bytes()) {
                return Err(WeightsError::Invalid(format!(
                    "{} of generation {}: other bytes",
                    e.name,
                    held.generation()
                )));
            }
        }
        Ok(())
    };
    check(&reader.held())?;
    verified += 1;
    while reader.generation() < generations {
        reader.wait_for(reader.generation() + 1, Some(Duration::from_secs(60)))?;
        let start = Instant::now();
        reader.refresh()?;
        switch_ms_max = switch_ms_max.max(start.elapsed().as_secs_f64() * 1e3);
        switches += 1;
        check(&reader.held())?;
        verified += 1;
    }
    Ok(ReaderReport {
        role: "reader",
        backend: B::KIND.name(),
        tensors,
        cold_open_ms,
        switches,
        switch_ms_max,
        verified_generations: verified,
    })
}

/// The `owner` role: generation 1, then one more per line on stdin.
fn owner<B: ArenaBytes>(ctx: &B::Context, socket: &Path) -> Result<(), WeightsError> {
    let mut owner = WeightsOwner::<B>::create(ctx, socket, "model", tensors(8, 1)?, WeightsOptions::default())?;
    eprintln!("weights owner: published {}", publish(&mut owner)?);
    for line in std::io::stdin().lock().lines() {
        if line.is_err() {
            break;
        }
        eprintln!("weights owner: published {}", publish(&mut owner)?);
    }
    Ok(())
}

/// The `stream-wait` role (see the module docs).
fn stream_wait<B: ArenaBytes>(
    ctx: &Context,
    b_ctx: &B::Context,
    socket: &Path,
    generation: u64,
    timeout: Duration,
    close_after: Option<Duration>,
) -> Result<StreamWaitReport, WeightsError> {
    let driver = |e: gpu_ipc::driver::DriverError| WeightsError::Pool(PoolError::Backend(e.into()));
    let reader = WeightsReader::<B>::open(b_ctx, socket, "model", Duration::from_secs(30))?;
    let stream = Stream::new(ctx).map_err(driver)?;
    // Freed only once the stream is idle: on an early return it is left allocated (8 bytes, in a process about to
    // exit) rather than freed under a copy still queued.
    let snapshot = std::mem::ManuallyDrop::new(DeviceBuffer::alloc(ctx, 8).map_err(driver)?);
    let queued = Instant::now();
    let wait = reader.wait_on(generation, &stream)?;
    reader.copy_status_on(&stream, &wait, &snapshot.span())?;
    eprintln!("weights stream-wait: stream wait for generation {generation} queued");
    let mut close_ms = None;
    let mut reader = Some(reader);
    if let Some(after) = close_after {
        std::thread::sleep(after);
        let started = Instant::now();
        drop(reader.take());
        close_ms = Some(started.elapsed().as_secs_f64() * 1e3);
        eprintln!("weights stream-wait: reader closed in {:.3} ms", close_ms.unwrap_or(0.0));
    }
    let deadline = queued + timeout;
    while !stream.is_idle().map_err(driver)? {
        if Instant::now() >= deadline {
            return Err(WeightsError::Invalid(format!("the stream still waits after {timeout:?}")));
        }
        std::thread::sleep(Duration::from_micros(20));
    }
    let released_after_ms = queued.elapsed().as_secs_f64() * 1e3;
    let mut word = [0u64; 1];
    snapshot.span().read(0, &mut word).map_err(driver)?;
    drop(std::mem::ManuallyDrop::into_inner(snapshot));
    let gpu_status = match wait.status_of(word[0]) {
        GenerationWaitStatus::Published { .. } => "published",
        GenerationWaitStatus::OwnerGone { .. } => "gone",
        GenerationWaitStatus::Waiting => "waiting",
    };
    Ok(StreamWaitReport {
        role: "stream-wait",
        backend: B::KIND.name(),
        generation,
        gpu_word: word[0],
        gpu_status,
        cpu_status: reader.as_ref().map(|r| format!("{:?}", r.wait_status(&wait))),
        released_after_ms,
        close_ms,
    })
}

/// Runs `run` with the backend's context: the host backend's, or device `device`'s for a GPU backend.
fn with_backend<G: GpuRun>(
    kind: BackendKind,
    device: i32,
    host: impl FnOnce(&HostContext) -> Result<G::Output, WeightsError>,
    gpu: G,
) -> Result<G::Output, WeightsError> {
    match kind {
        BackendKind::Host => host(&HostContext),
        other => {
            let ctx = Context::for_ordinal(device).map_err(|e| WeightsError::Pool(PoolError::Backend(e.into())))?;
            struct Visit<'a, G>(G, &'a Context);
            impl<G: GpuRun> gpu_ipc::GpuBackendVisitor for Visit<'_, G> {
                type Output = Result<G::Output, WeightsError>;
                fn visit<B: gpu_ipc::core::backend::GpuBackend>(self) -> Self::Output {
                    self.0.run::<B>(self.1)
                }
            }
            gpu_ipc::dispatch_gpu(other, Visit(gpu, &ctx)).map_err(|e| WeightsError::Invalid(e.to_string()))?
        }
    }
}

/// The GPU half of [`with_backend`]: code generic over a GPU backend.
trait GpuRun {
    type Output;
    fn run<B: gpu_ipc::core::backend::GpuBackend>(self, ctx: &Context) -> Result<Self::Output, WeightsError>;
}

struct BenchRun<'a>(&'a RoleArgs, u64, u64, u64);
impl GpuRun for BenchRun<'_> {
    type Output = BenchSummary;
    fn run<B: gpu_ipc::core::backend::GpuBackend>(self, ctx: &Context) -> Result<BenchSummary, WeightsError> {
        bench::<B>(ctx, self.0, self.1, self.2, self.3)
    }
}

struct ReaderRun<'a>(&'a Path, u64);
impl GpuRun for ReaderRun<'_> {
    type Output = ReaderReport;
    fn run<B: gpu_ipc::core::backend::GpuBackend>(self, ctx: &Context) -> Result<ReaderReport, WeightsError> {
        reader::<B>(ctx, self.0, self.1)
    }
}

struct OwnerRun<'a>(&'a Path);
impl GpuRun for OwnerRun<'_> {
    type Output = ();
    fn run<B: gpu_ipc::core::backend::GpuBackend>(self, ctx: &Context) -> Result<(), WeightsError> {
        owner::<B>(ctx, self.0)
    }
}

struct StreamWaitRun<'a>(&'a Path, u64, Duration, Option<Duration>);
impl GpuRun for StreamWaitRun<'_> {
    type Output = StreamWaitReport;
    fn run<B: gpu_ipc::core::backend::GpuBackend>(self, ctx: &Context) -> Result<StreamWaitReport, WeightsError> {
        stream_wait::<B>(ctx, ctx, self.0, self.1, self.2, self.3)
    }
}

fn no_driver(e: &WeightsError) -> bool {
    e.to_string().contains("libcuda")
}

fn main() -> ExitCode {
    let args = Args::parse();
    let outcome = match &args.role {
        Role::Bench { common, tensors, mib, generations } => with_backend(
            common.backend,
            common.device,
            |ctx| bench::<Host>(ctx, common, *tensors, *mib, *generations),
            BenchRun(common, *tensors, *mib, *generations),
        )
        .map(|s| {
            print_summary(common.json, &s, |s| {
                format!(
                    "weights bench ({}): {} tensors, arena {} bytes, made in {:.2} ms, publish at most {:.2} ms; reader: {}",
                    s.backend,
                    s.tensors,
                    s.arena_bytes,
                    s.create_ms,
                    s.publish_ms_max,
                    s.reader.as_ref().map_or("no report".to_owned(), ToString::to_string)
                )
            })
        }),
        Role::Reader { common, socket, generations } => with_backend(
            common.backend,
            common.device,
            |ctx| reader::<Host>(ctx, socket, *generations),
            ReaderRun(socket, *generations),
        )
        .map(|r| print_summary(common.json, &r, |r| format!("{r:?}"))),
        Role::Owner { common, socket } => {
            with_backend(common.backend, common.device, |ctx| owner::<Host>(ctx, socket), OwnerRun(socket))
        }
        Role::StreamWait { common, socket, generation, timeout_ms, close_after_ms } => with_backend(
            common.backend,
            common.device,
            |_| Err(WeightsError::NoCudaContext { set: "model".into() }),
            StreamWaitRun(socket, *generation, Duration::from_millis(*timeout_ms), close_after_ms.map(Duration::from_millis)),
        )
        .map(|r| print_summary(common.json, &r, |r| format!("{r:?}"))),
    };
    match outcome {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("weights: {e}");
            if no_driver(&e) { ExitCode::from(EXIT_NO_DRIVER) } else { ExitCode::FAILURE }
        }
    }
}
