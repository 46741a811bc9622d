//! `gpu-ipc probe overhead`: is memory imported from another process slower for kernels than memory the process
//! allocated itself?
//!
//! The same kernels (`kernels/cuda/probe_memory.cu`) run on every memory kind: the process's own `cuMemAlloc`
//! memory, `cuMemAlloc` memory of another process opened with a legacy handle, the process's own VMM memory
//! (`cuMemCreate` + map), another process's VMM memory imported from an fd, and, on a machine with two GPUs, another
//! GPU's memory imported from a process on that GPU. Per kind: read and write bandwidth over sizes from 4 KiB to
//! 1 GiB, dependent-load latency over working sets that sit in L1, L2 and DRAM, store latency; each measured in
//! several runs so that the run-to-run spread is known. Then attach and detach cost per backend and size, in this
//! process (repeated) and as the first import of fresh processes.

use std::time::{Duration, Instant};

use gpu_ipc::BackendChoice;
use gpu_ipc::core::driver::{
    Context, Device, DeviceBuffer, DeviceMemory, DeviceSpan, Event, EventFlags, KernelArg, LaunchConfig, Stream, sys,
};
use gpu_ipc::kernels::probe::{MEM_CHASE, MEM_READ, MEM_STORE_LATENCY, MEM_WRITE, ProbeKernels};
use serde::{Deserialize, Serialize};

use harness::child::ChildFailure;
use harness::child::{Channel, ChildProcess, ChildTask};
use harness::env::ProbeEnv;
use harness::progress::Progress;
use harness::regions::{ExportedRegion, HandleMessage, ImportedRegion};
use harness::report::{LineChart, Plots, ReportSection, Series};
use harness::stats::{Distribution, relative_difference};
use harness::{CommonArgs, ProbeError, ProbeOutput, Verdict};

const KIB: u64 = 1024;
const MIB: u64 = 1024 * KIB;
const GIB: u64 = 1024 * MIB;
/// Bytes per chase element line: one u64 per 128-byte line, so every load touches a new line.
const LINE: u64 = 128;

/// Options of `gpu-ipc probe overhead`.
#[derive(Debug, Clone, clap::Args)]
pub struct ProbeArgs {
    #[command(flatten)]
    /// Options every probe takes.
    pub common: CommonArgs,
    /// Runs per measurement (the spread across runs is the noise band). Default 5 (--quick 3).
    #[arg(long)]
    pub runs: Option<u32>,
    /// Attach/detach repetitions per backend and size. Default 200 (--quick 20).
    #[arg(long)]
    pub attach_reps: Option<u32>,
    /// Fresh processes whose first import is timed, per backend. Default 5 (--quick 2).
    #[arg(long)]
    pub first_imports: Option<u32>,
    /// Largest attach size in MiB (default 4096: 4 MiB, 256 MiB, 4 GiB).
    #[arg(long, default_value_t = 4096)]
    pub max_attach_mib: u64,
}

/// A kind of memory the kernels run on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum MemoryKind {
    /// `cuMemAlloc` in this process.
    Local,
    /// Another process's `cuMemAlloc`, opened with `cuIpcOpenMemHandle`.
    LegacyImported,
    /// `cuMemCreate` + map in this process.
    VmmLocal,
    /// Another process's `cuMemCreate`, imported from an fd and mapped.
    VmmImported,
    /// Another GPU's `cuMemAlloc`, exported by a process on that GPU, opened here with lazy peer access.
    PeerImported,
}

impl MemoryKind {
    /// How a report names it.
    pub fn label(self) -> &'static str {
        match self {
            MemoryKind::Local => "local cuMemAlloc",
            MemoryKind::LegacyImported => "legacy-imported",
            MemoryKind::VmmLocal => "VMM local",
            MemoryKind::VmmImported => "VMM-imported",
            MemoryKind::PeerImported => "peer GPU, imported",
        }
    }

    /// The local kind an imported kind is compared with.
    pub fn baseline(self) -> Option<MemoryKind> {
        match self {
            MemoryKind::LegacyImported | MemoryKind::PeerImported => Some(MemoryKind::Local),
            MemoryKind::VmmImported => Some(MemoryKind::VmmLocal),
            _ => None,
        }
    }
}

/// A metric measured in several runs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Measured {
    /// One value per run (GB/s for bandwidth; ns for latency: the run's median per-load latency).
    pub runs: Vec<f64>,
    /// The runs' distribution (its p50 is the figure, its relative spread the noise band).
    pub summary: Distribution,
    /// For latencies: every per-load sample of every run pooled (ns).
    pub samples: Option<Distribution>,
}

/// Bandwidth at one size.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BandwidthPoint {
    /// Bytes read or written per kernel.
    pub bytes: u64,
    /// Read bandwidth, GB/s (10^9 bytes per second).
    pub read_gbps: Measured,
    /// Write bandwidth, GB/s.
    pub write_gbps: Measured,
}

/// Latency at one working set.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LatencyPoint {
    /// Working set in bytes.
    pub bytes: u64,
    /// Which cache it is meant to sit in: `L1`, `L2` or `DRAM`.
    pub level: String,
    /// Dependent-load latency, ns per load.
    pub load_ns: Measured,
}

/// Everything measured on one memory kind.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct KindResults {
    /// The kind.
    pub kind: MemoryKind,
    /// Bandwidth per size.
    pub bandwidth: Vec<BandwidthPoint>,
    /// Load latency per working set.
    pub latency: Vec<LatencyPoint>,
    /// Store + `__threadfence()` latency, ns.
    pub store_ns: Measured,
}

/// Attach and detach cost of one backend at one size.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AttachPoint {
    /// The backend.
    pub backend: BackendChoice,
    /// Allocation size in bytes.
    pub bytes: u64,
    /// Import + map (+ reserve + set access) in a process that imported before, ms.
    pub attach_ms: Distribution,
    /// Unmap + release (+ address free), ms.
    pub detach_ms: Distribution,
}

/// The first import of a fresh process.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FirstImport {
    /// The backend.
    pub backend: BackendChoice,
    /// Allocation size in bytes.
    pub bytes: u64,
    /// Creating the CUDA context of the fresh process (cuInit + primary context), ms.
    pub context_ms: Distribution,
    /// Its first import, ms.
    pub first_attach_ms: Distribution,
    /// Its second import of the same allocation (after closing the first), ms.
    pub second_attach_ms: Distribution,
}

/// A verdict line: local against imported for one metric.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Comparison {
    /// The metric, e.g. `read GB/s at 1 GiB`.
    pub metric: String,
    /// The local kind.
    pub local: MemoryKind,
    /// The imported kind.
    pub imported: MemoryKind,
    /// Local value (median of runs).
    pub local_value: f64,
    /// Imported value (median of runs).
    pub imported_value: f64,
    /// `(imported - local) / local`.
    pub difference: f64,
    /// The larger of the two kinds' relative run-to-run spreads.
    pub noise: f64,
    /// Whether |difference| exceeds the noise.
    pub measurable: bool,
}

/// What the probe measured.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Results {
    /// Runs per measurement.
    pub runs: u32,
    /// Per memory kind.
    pub kinds: Vec<KindResults>,
    /// Attach and detach cost.
    pub attach: Vec<AttachPoint>,
    /// First imports of fresh processes.
    pub first_imports: Vec<FirstImport>,
    /// Local against imported, per metric.
    pub comparisons: Vec<Comparison>,
    /// Why a kind or part was not measured.
    pub notes: Vec<String>,
}

/// Runs the probe; returns the exit status.
pub fn main(args: &ProbeArgs) -> u8 {
    harness::execute("overhead", &args.common, |env, progress| run(args, env, progress), render_text)
}

/// Messages to an exporter or importer child.
#[derive(Debug, Serialize, Deserialize)]
#[serde(tag = "msg", rename_all = "kebab-case")]
enum ToChild {
    /// Allocate `bytes` through `backend`, fill it, and send its handle back.
    Allocate { backend: BackendChoice, bytes: u64 },
    /// Import (the fd rides along), time it, close, import again, and report.
    Import(HandleMessage),
    /// Leave.
    Exit,
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(tag = "msg", rename_all = "kebab-case")]
enum FromChild {
    Exported(HandleMessage),
    Imported { context_ms: f64, first_ms: f64, second_ms: f64 },
}

fn sizes(quick: bool) -> Vec<u64> {
    let top = if quick { 256 * MIB } else { GIB };
    let mut out = Vec::new();
    let mut size = 4 * KIB;
    while size <= top {
        out.push(size);
        size *= 4;
    }
    out
}

fn working_sets(quick: bool) -> Vec<(u64, &'static str)> {
    let mut sets = vec![(16 * KIB, "L1"), (4 * MIB, "L2"), (256 * MIB, "DRAM")];
    if !quick {
        sets.insert(1, (128 * KIB, "L1/L2"));
        sets.insert(3, (32 * MIB, "L2/DRAM"));
    }
    sets
}

fn run(args: &ProbeArgs, _env: &ProbeEnv, progress: &Progress) -> Result<(Results, Verdict), ProbeError> {
    let quick = args.common.quick;
    let runs = args.runs.unwrap_or(if quick { 3 } else { 5 }).max(2);
    let attach_reps = args.attach_reps.unwrap_or(if quick { 20 } else { 200 }).max(1);
    let first_imports = args.first_imports.unwrap_or(if quick { 2 } else { 5 });
    let device = args.common.device;
    let ctx = Context::for_ordinal(device)?;
    let bench = Bench::new(&ctx)?;
    let buffer_bytes = sizes(quick).last().copied().unwrap_or(GIB);
    let mut notes = Vec::new();

    // The memory kinds: our own, and the exporter child's.
    let exporter = spawn_child("overhead-exporter", device)?;
    let local = DeviceBuffer::alloc(&ctx, buffer_bytes)?;
    let mut keep_imports: Vec<(MemoryKind, ImportedRegion)> = Vec::new();
    let mut keep_local: Vec<(MemoryKind, ExportedRegion)> = Vec::new();
    for &backend in BackendChoice::ALL {
        let (message, fd) = ask_export(&exporter, backend, buffer_bytes)?;
        let imported = ImportedRegion::import(&ctx, &message, fd)?;
        let kind = if backend.name() == "legacy" { MemoryKind::LegacyImported } else { MemoryKind::VmmImported };
        keep_imports.push((kind, imported));
        if backend.name() == "vmm" {
            let own = ExportedRegion::allocate(backend, &ctx, buffer_bytes)?;
            keep_local.push((MemoryKind::VmmLocal, own));
        }
    }
    let peer = if Device::count()? >= 2 {
        match peer_import(&ctx, device, buffer_bytes) {
            Ok((child, region)) => Some((child, region)),
            Err(e) => {
                notes.push(format!("peer import not measured: {e}"));
                None
            }
        }
    } else {
        notes.push("one GPU: no peer-imported memory (run on a machine with two GPUs for that row)".to_owned());
        None
    };
    let mut kinds: Vec<(MemoryKind, DeviceSpan<'_>)> = vec![(MemoryKind::Local, local.span())];
    kinds.extend(keep_imports.iter().map(|(kind, region)| (*kind, region.span())));
    kinds.extend(keep_local.iter().map(|(kind, region)| (*kind, region.span())));
    kinds.extend(peer.iter().map(|(_, region)| (MemoryKind::PeerImported, region.span())));
    kinds.sort_by_key(|(kind, _)| *kind);

    let sizes = sizes(quick);
    let sets = working_sets(quick);
    progress.stage("bandwidth and latency", (kinds.len() * (sizes.len() + sets.len() + 1)) as u64);
    let mut kind_results = Vec::new();
    for &(kind, base) in &kinds {
        let mut bandwidth = Vec::new();
        for &bytes in &sizes {
            bandwidth.push(BandwidthPoint {
                bytes,
                read_gbps: bench.bandwidth(base, bytes, runs, false)?,
                write_gbps: bench.bandwidth(base, bytes, runs, true)?,
            });
            progress.step(&format!("{} {}", kind.label(), human(bytes)));
            tracing::info!(kind = kind.label(), bytes, "bandwidth measured");
        }
        let mut latency = Vec::new();
        for &(bytes, level) in &sets {
            latency.push(LatencyPoint { bytes, level: level.to_owned(), load_ns: bench.chase(base, bytes, runs)? });
            progress.step(&format!("{} chase {}", kind.label(), human(bytes)));
            tracing::info!(kind = kind.label(), bytes, "chase measured");
        }
        let store_ns = bench.store_latency(base, runs)?;
        progress.step(&format!("{} stores", kind.label()));
        kind_results.push(KindResults { kind, bandwidth, latency, store_ns });
    }
    drop(kinds);
    drop(keep_imports);
    drop(keep_local);
    drop(peer);

    // Attach and detach: repeated imports in this process.
    let attach_sizes: Vec<u64> =
        [4 * MIB, 256 * MIB, 4 * GIB].into_iter().filter(|&b| b <= args.max_attach_mib * MIB).collect();
    progress.stage("attach and detach", (BackendChoice::ALL.len() * attach_sizes.len()) as u64 + 1);
    let mut attach = Vec::new();
    for &backend in BackendChoice::ALL {
        for &bytes in &attach_sizes {
            let (message, fd) = ask_export(&exporter, backend, bytes)?;
            attach.push(time_attach(&ctx, backend, &message, fd, attach_reps)?);
            progress.step(&format!("{backend} {}", human(bytes)));
        }
    }

    // First imports of fresh processes.
    let mut firsts = Vec::new();
    for &backend in BackendChoice::ALL {
        let (message, fd) = ask_export(&exporter, backend, 4 * MIB)?;
        let (mut context, mut first, mut second) = (Vec::new(), Vec::new(), Vec::new());
        for _ in 0..first_imports {
            let importer = spawn_child("overhead-importer", device)?;
            let dup = fd.as_ref().map(std::os::fd::OwnedFd::try_clone).transpose().map_err(other)?;
            importer.channel().send(&ToChild::Import(message.clone()), dup.into_iter().collect())?;
            match recv_reply(&importer, Duration::from_secs(60))? {
                FromChild::Imported { context_ms, first_ms, second_ms } => {
                    context.push(context_ms);
                    first.push(first_ms);
                    second.push(second_ms);
                }
                other => return Err(ProbeError::Other(format!("importer: unexpected {other:?}"))),
            }
        }
        if let (Some(context_ms), Some(first_attach_ms), Some(second_attach_ms)) = (
            Distribution::from_samples(&mut context),
            Distribution::from_samples(&mut first),
            Distribution::from_samples(&mut second),
        ) {
            firsts.push(FirstImport { backend, bytes: 4 * MIB, context_ms, first_attach_ms, second_attach_ms });
        }
    }
    progress.step("first imports");
    let _ = exporter.channel().send(&ToChild::Exit, Vec::new());

    let comparisons = compare(&kind_results);
    let results = Results { runs, kinds: kind_results, attach, first_imports: firsts, comparisons, notes };
    let verdict = verdict(&results);
    Ok((results, verdict))
}

fn other<E: std::fmt::Display>(e: E) -> ProbeError {
    ProbeError::Other(e.to_string())
}

fn human(bytes: u64) -> String {
    if bytes >= GIB && bytes.is_multiple_of(GIB) {
        format!("{} GiB", bytes / GIB)
    } else if bytes >= MIB && bytes.is_multiple_of(MIB) {
        format!("{} MiB", bytes / MIB)
    } else {
        format!("{} KiB", bytes / KIB)
    }
}

fn spawn_child(role: &str, device: i32) -> Result<ChildProcess, ProbeError> {
    let task = ChildTask { role: role.to_owned(), params: serde_json::json!({ "device": device }) };
    Ok(ChildProcess::spawn(&task, &[], Duration::from_secs(30))?)
}

fn recv_reply(child: &ChildProcess, timeout: Duration) -> Result<FromChild, ProbeError> {
    let (reply, fds): (serde_json::Value, _) = child.channel().recv(timeout)?;
    drop(fds);
    if let Ok(failure) = serde_json::from_value::<ChildFailure>(reply.clone()) {
        return Err(ProbeError::Child { role: "overhead".to_owned(), reason: failure.error });
    }
    serde_json::from_value(reply).map_err(|e| ProbeError::Other(format!("overhead child: malformed reply: {e}")))
}

fn ask_export(
    exporter: &ChildProcess,
    backend: BackendChoice,
    bytes: u64,
) -> Result<(HandleMessage, Option<std::os::fd::OwnedFd>), ProbeError> {
    exporter.channel().send(&ToChild::Allocate { backend, bytes }, Vec::new())?;
    let (reply, mut fds): (serde_json::Value, _) = exporter.channel().recv(Duration::from_secs(120))?;
    if let Ok(failure) = serde_json::from_value::<ChildFailure>(reply.clone()) {
        return Err(ProbeError::Child { role: "overhead-exporter".to_owned(), reason: failure.error });
    }
    match serde_json::from_value(reply) {
        Ok(FromChild::Exported(message)) => Ok((message, fds.pop())),
        other => Err(ProbeError::Other(format!("exporter: unexpected {other:?}"))),
    }
}

fn peer_import(ctx: &Context, device: i32, bytes: u64) -> Result<(ChildProcess, ImportedRegion), ProbeError> {
    let peer_device = if device == 0 { 1 } else { 0 };
    let peer = spawn_child("overhead-exporter", peer_device)?;
    #[cfg(feature = "legacy")]
    let backend = BackendChoice::Legacy;
    #[cfg(not(feature = "legacy"))]
    let backend = BackendChoice::Vmm;
    let (message, fd) = ask_export(&peer, backend, bytes)?;
    let region = ImportedRegion::import(ctx, &message, fd)?;
    Ok((peer, region))
}

/// Times `reps` imports and closes of one exported allocation in this process.
fn time_attach(
    ctx: &Context,
    backend: BackendChoice,
    message: &HandleMessage,
    fd: Option<std::os::fd::OwnedFd>,
    reps: u32,
) -> Result<AttachPoint, ProbeError> {
    let (mut attach, mut detach) = (Vec::new(), Vec::new());
    for _ in 0..reps {
        let dup = fd.as_ref().map(std::os::fd::OwnedFd::try_clone).transpose().map_err(other)?;
        let started = Instant::now();
        let region = ImportedRegion::import(ctx, message, dup)?;
        attach.push(started.elapsed().as_secs_f64() * 1e3);
        let started = Instant::now();
        drop(region);
        detach.push(started.elapsed().as_secs_f64() * 1e3);
    }
    let none = || ProbeError::Other("no attach samples".to_owned());
    Ok(AttachPoint {
        backend,
        bytes: message.size,
        attach_ms: Distribution::from_samples(&mut attach).ok_or_else(none)?,
        detach_ms: Distribution::from_samples(&mut detach).ok_or_else(none)?,
    })
}

/// The kernels and buffers the measurements use.
struct Bench {
    ctx: Context,
    stream: Stream,
    read: gpu_ipc::core::driver::Function,
    write: gpu_ipc::core::driver::Function,
    chase: gpu_ipc::core::driver::Function,
    store: gpu_ipc::core::driver::Function,
    scratch: DeviceBuffer,
    blocks: u32,
    start: Event,
    end: Event,
}

/// Chase samples per run.
const CHASE_STEPS: u64 = 4096;

impl Bench {
    fn new(ctx: &Context) -> Result<Self, ProbeError> {
        let kernels = ProbeKernels::load(ctx)?;
        let sms = ctx.device().attribute(sys::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)?.max(1) as u32;
        Ok(Self {
            ctx: ctx.clone(),
            stream: Stream::new(ctx)?,
            read: kernels.function(MEM_READ)?,
            write: kernels.function(MEM_WRITE)?,
            chase: kernels.function(MEM_CHASE)?,
            store: kernels.function(MEM_STORE_LATENCY)?,
            scratch: DeviceBuffer::alloc(ctx, 8 * (CHASE_STEPS + 16))?,
            blocks: sms * 8,
            start: Event::new(ctx, EventFlags::TIMING)?,
            end: Event::new(ctx, EventFlags::TIMING)?,
        })
    }

    /// GB/s of reading (or writing) `bytes` at `base`: per run, enough launches back to back to take a few ms,
    /// timed with events.
    fn bandwidth(&self, base: DeviceSpan<'_>, bytes: u64, runs: u32, write: bool) -> Result<Measured, ProbeError> {
        let base = base.slice(0, bytes)?;
        let n_vec = bytes / 16;
        let blocks = (n_vec.div_ceil(256).min(u64::from(self.blocks)).max(1)) as u32;
        let config = LaunchConfig::linear(blocks, 256);
        let launches = (256 * MIB / bytes).clamp(4, 2000) as u32;
        let launch = |i: u32| -> Result<(), ProbeError> {
            if write {
                self.write.launch_typed(
                    &self.stream,
                    config,
                    &[KernelArg::Span(base), KernelArg::U64(n_vec), KernelArg::U32(i)],
                )?;
            } else {
                self.read.launch_typed(
                    &self.stream,
                    config,
                    &[
                        KernelArg::Span(base),
                        KernelArg::U64(n_vec),
                        KernelArg::U32(0x9E37_79B9),
                        KernelArg::Span(self.scratch.span()),
                    ],
                )?;
            }
            Ok(())
        };
        // Warm-up: module, caches, TLB.
        launch(0)?;
        launch(1)?;
        self.stream.synchronize()?;
        let mut values = Vec::new();
        for _ in 0..runs {
            self.start.record(&self.stream)?;
            for i in 0..launches {
                launch(i)?;
            }
            self.end.record(&self.stream)?;
            self.end.synchronize()?;
            let ms = f64::from(Event::elapsed_ms(&self.start, &self.end)?);
            values.push(bytes as f64 * f64::from(launches) / (ms * 1e-3) / 1e9);
        }
        measured(values, None)
    }

    /// ns per dependent load over a random cyclic chain of 128-byte lines spanning `bytes` at `base`.
    fn chase(&self, base: DeviceSpan<'_>, bytes: u64, runs: u32) -> Result<Measured, ProbeError> {
        let lines = (bytes / LINE).max(2);
        let chain = chain_words(lines, 0x5eed_0000 ^ bytes);
        let base = base.slice(0, lines * LINE)?;
        base.write(0, &chain)?;
        // A copy from pageable memory may still be in flight when cuMemcpyHtoD returns, and our stream does not
        // wait for the legacy stream it ran on: without this the chase can read a half-written chain (seen on the
        // H100 as CUDA_ERROR_ILLEGAL_ADDRESS).
        self.ctx.synchronize()?;
        let warm = lines.min(1 << 20);
        let mut values = Vec::new();
        let mut pooled = Vec::new();
        for run in 0..runs {
            let start = (u64::from(run) * 7919 % lines) * (LINE / 8);
            self.chase.launch_typed(
                &self.stream,
                LaunchConfig::linear(1, 32),
                &[
                    KernelArg::Span(base),
                    KernelArg::U64(start),
                    KernelArg::U64(warm),
                    KernelArg::U64(CHASE_STEPS),
                    KernelArg::Span(self.scratch.span()),
                    KernelArg::Span(self.scratch.span().slice(8 * (CHASE_STEPS + 8), 8 * 8)?),
                ],
            )?;
            self.stream.synchronize()?;
            let samples = self.read_cycles()?;
            values.push(median(&samples));
            pooled.extend(samples);
        }
        measured(values, Distribution::from_samples(&mut pooled))
    }

    /// ns per store + `__threadfence()` over 1 MiB of lines at `base`.
    fn store_latency(&self, base: DeviceSpan<'_>, runs: u32) -> Result<Measured, ProbeError> {
        let base = base.slice(0, MIB)?;
        let mut values = Vec::new();
        let mut pooled = Vec::new();
        for _ in 0..runs {
            self.store.launch_typed(
                &self.stream,
                LaunchConfig::linear(1, 32),
                &[
                    KernelArg::Span(base),
                    KernelArg::U64(MIB / LINE),
                    KernelArg::U64(CHASE_STEPS),
                    KernelArg::Span(self.scratch.span()),
                ],
            )?;
            self.stream.synchronize()?;
            let samples = self.read_cycles()?;
            values.push(median(&samples));
            pooled.extend(samples);
        }
        measured(values, Distribution::from_samples(&mut pooled))
    }

    /// The per-step cycle counts the last chase or store kernel wrote, converted to ns with the kernel's own
    /// total cycles / total `%globaltimer` ns.
    fn read_cycles(&self) -> Result<Vec<f64>, ProbeError> {
        let mut words = vec![0u64; (CHASE_STEPS + 2) as usize];
        self.scratch.read(0, &mut words)?;
        let total_cycles = words[CHASE_STEPS as usize] as f64;
        let total_ns = words[CHASE_STEPS as usize + 1] as f64;
        let ns_per_cycle = if total_cycles > 0.0 && total_ns > 0.0 { total_ns / total_cycles } else { f64::NAN };
        Ok(words[..CHASE_STEPS as usize].iter().map(|&c| c as f64 * ns_per_cycle).collect())
    }
}

fn median(samples: &[f64]) -> f64 {
    let mut copy = samples.to_vec();
    Distribution::from_samples(&mut copy).map_or(f64::NAN, |d| d.p50)
}

fn measured(values: Vec<f64>, samples: Option<Distribution>) -> Result<Measured, ProbeError> {
    let summary = Distribution::from_samples(&mut values.clone())
        .ok_or_else(|| ProbeError::Other("a measurement produced no value".to_owned()))?;
    Ok(Measured { runs: values, summary, samples })
}

/// A random cyclic permutation of `lines` lines as a chase chain: word `16 * a` holds `16 * b` when line `b`
/// follows line `a` (indices in u64 words; one element per 128-byte line). Deterministic for a seed.
pub fn chain_words(lines: u64, seed: u64) -> Vec<u64> {
    let words_per_line = LINE / 8;
    let mut order: Vec<u64> = (0..lines).collect();
    // Sattolo's algorithm: a single cycle through every line.
    let mut state = seed | 1;
    for i in (1..order.len()).rev() {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        let j = (state % i as u64) as usize;
        order.swap(i, j);
    }
    let mut chain = vec![0u64; (lines * words_per_line) as usize];
    for (i, &next) in order.iter().enumerate() {
        chain[i * words_per_line as usize] = next * words_per_line;
    }
    chain
}

/// Local against imported, per metric: bandwidth at the largest size, latency at each working set, stores.
pub fn compare(kinds: &[KindResults]) -> Vec<Comparison> {
    let mut out = Vec::new();
    for imported in kinds {
        let Some(base_kind) = imported.kind.baseline() else { continue };
        let Some(local) = kinds.iter().find(|k| k.kind == base_kind) else { continue };
        let mut push = |metric: String, l: &Measured, i: &Measured| {
            let noise = l.summary.relative_spread().max(i.summary.relative_spread());
            let difference = relative_difference(l.summary.p50, i.summary.p50);
            out.push(Comparison {
                metric,
                local: local.kind,
                imported: imported.kind,
                local_value: l.summary.p50,
                imported_value: i.summary.p50,
                difference,
                noise,
                measurable: difference.abs() > noise,
            });
        };
        for (l, i) in local.bandwidth.iter().zip(&imported.bandwidth) {
            if l.bytes == i.bytes && l.bytes >= 64 * MIB {
                push(format!("read GB/s at {}", human(l.bytes)), &l.read_gbps, &i.read_gbps);
                push(format!("write GB/s at {}", human(l.bytes)), &l.write_gbps, &i.write_gbps);
            }
        }
        for (l, i) in local.latency.iter().zip(&imported.latency) {
            if l.bytes == i.bytes {
                push(format!("load ns, {} ({})", human(l.bytes), l.level), &l.load_ns, &i.load_ns);
            }
        }
        push("store+fence ns".to_owned(), &local.store_ns, &imported.store_ns);
    }
    out
}

impl Comparison {
    /// Whether the imported memory did worse: less bandwidth, or more latency.
    pub fn imported_is_worse(&self) -> bool {
        if self.metric.contains("GB/s") { self.difference < 0.0 } else { self.difference > 0.0 }
    }
}

/// The answer: for same-GPU imports, whether any metric was measurably worse than on local memory (beyond the
/// run-to-run spread), in which direction the measurable differences went, and the largest difference with its
/// noise band. Peer-GPU memory is left out (it is another GPU's memory, not an IPC cost).
pub fn verdict(results: &Results) -> Verdict {
    let same_gpu: Vec<&Comparison> =
        results.comparisons.iter().filter(|c| c.imported != MemoryKind::PeerImported).collect();
    let largest = same_gpu.iter().max_by(|a, b| a.difference.abs().total_cmp(&b.difference.abs()));
    let mut worse: Vec<&&Comparison> = same_gpu.iter().filter(|c| c.measurable && c.imported_is_worse()).collect();
    worse.sort_by(|a, b| b.difference.abs().total_cmp(&a.difference.abs()));
    let better: Vec<&&Comparison> = same_gpu.iter().filter(|c| c.measurable && !c.imported_is_worse()).collect();
    let describe = |c: &Comparison| {
        format!("{} {} {:+.1}% (noise {:.1}%)", c.imported.label(), c.metric, 100.0 * c.difference, 100.0 * c.noise)
    };
    let answer = if largest.is_none() {
        "Not measured: no imported memory kind ran.".to_owned()
    } else if !worse.is_empty() {
        let list: Vec<String> = worse.iter().take(3).map(|c| describe(c)).collect();
        format!(
            "Imported memory was measurably slower on {} of {} metrics: {}.",
            worse.len(),
            same_gpu.len(),
            list.join("; ")
        )
    } else if better.is_empty() {
        format!(
            "No: over {} metrics (bandwidth 64 MiB-1 GiB, load latency in L1, L2 and DRAM, store latency), kernels on \
             memory imported from another process (legacy and VMM) ran within the run-to-run spread of the same \
             kernels on the process's own memory.",
            same_gpu.len()
        )
    } else {
        let list: Vec<String> = better.iter().take(2).map(|c| describe(c)).collect();
        format!(
            "No: over {} metrics (bandwidth 64 MiB-1 GiB, load latency in L1, L2 and DRAM, store latency) imported \
             memory (legacy and VMM) was never measurably slower than the process's own; the {} difference(s) beyond \
             the run-to-run spread favoured imported memory and are small ({}).",
            same_gpu.len(),
            better.len(),
            list.join("; ")
        )
    };
    let key_figure = largest.map_or_else(
        || "-".to_owned(),
        |c| {
            format!(
                "largest difference: {} {} {:+.2}% ({:.4} vs {:.4}), noise band {:.2}%",
                c.imported.label(),
                c.metric,
                100.0 * c.difference,
                c.imported_value,
                c.local_value,
                100.0 * c.noise
            )
        },
    );
    Verdict { answer, key_figure }
}

/// The child processes: `overhead-exporter` allocates and exports on request; `overhead-importer` is a fresh process
/// whose first import is timed.
pub fn child(task: ChildTask, channel: &Channel) -> Result<(), ProbeError> {
    let device = task.params["device"].as_i64().unwrap_or(0) as i32;
    let started = Instant::now();
    let ctx = Context::for_ordinal(device)?;
    let context_ms = started.elapsed().as_secs_f64() * 1e3;
    let mut kept: Vec<ExportedRegion> = Vec::new();
    loop {
        let (message, mut fds): (ToChild, _) = channel.recv(Duration::from_secs(3600))?;
        match message {
            ToChild::Allocate { backend, bytes } => {
                let region = ExportedRegion::allocate(backend, &ctx, bytes)?;
                region.span().fill_u32_async(0x0D15_EA5E, &Stream::new(&ctx)?)?;
                ctx.synchronize()?;
                let (handle, fd) = region.export()?;
                kept.push(region);
                channel.send(&FromChild::Exported(handle), fd.into_iter().collect())?;
            }
            ToChild::Import(handle) => {
                let fd = fds.pop();
                let dup = fd.as_ref().map(std::os::fd::OwnedFd::try_clone).transpose().map_err(other)?;
                let t = Instant::now();
                let first = ImportedRegion::import(&ctx, &handle, fd)?;
                let first_ms = t.elapsed().as_secs_f64() * 1e3;
                drop(first);
                let t = Instant::now();
                let second = ImportedRegion::import(&ctx, &handle, dup)?;
                let second_ms = t.elapsed().as_secs_f64() * 1e3;
                drop(second);
                channel.send(&FromChild::Imported { context_ms, first_ms, second_ms }, Vec::new())?;
                return Ok(());
            }
            ToChild::Exit => return Ok(()),
        }
    }
}

/// The result as text.
pub fn render_text(output: &ProbeOutput<Results>) -> String {
    let r = &output.results;
    let mut out = format!("gpu-ipc probe overhead: {} ({} runs per measurement)\n\n", output.env.headline(0), r.runs);
    out.push_str(&format!("{}\n{}\n\n", output.verdict.answer, output.verdict.key_figure));
    out.push_str(&comparison_table(&r.comparisons));
    out.push('\n');
    out.push_str(&attach_table(&r.attach, &r.first_imports));
    for note in &r.notes {
        out.push_str(&format!("note: {note}\n"));
    }
    out
}

fn comparison_table(comparisons: &[Comparison]) -> String {
    let mut out = String::from(
        "| metric | local | imported | local value | imported value | difference | noise band | measurable |\n\
         |---|---|---|---:|---:|---:|---:|---|\n",
    );
    for c in comparisons {
        out.push_str(&format!(
            "| {} | {} | {} | {:.2} | {:.2} | {:+.2}% | {:.2}% | {} |\n",
            c.metric,
            c.local.label(),
            c.imported.label(),
            c.local_value,
            c.imported_value,
            100.0 * c.difference,
            100.0 * c.noise,
            if c.measurable { "yes" } else { "no" }
        ));
    }
    out
}

fn attach_table(attach: &[AttachPoint], firsts: &[FirstImport]) -> String {
    let mut out = String::from(
        "| backend | size | attach p50 ms | attach p99 ms | attach max ms | detach p50 ms | detach p99 ms | reps |\n\
         |---|---:|---:|---:|---:|---:|---:|---:|\n",
    );
    for a in attach {
        out.push_str(&format!(
            "| {} | {} | {:.3} | {:.3} | {:.3} | {:.3} | {:.3} | {} |\n",
            a.backend.name(),
            human(a.bytes),
            a.attach_ms.p50,
            a.attach_ms.p99,
            a.attach_ms.max,
            a.detach_ms.p50,
            a.detach_ms.p99,
            a.attach_ms.count
        ));
    }
    if !firsts.is_empty() {
        out.push_str(
            "\n| backend | size | fresh processes | CUDA context p50 ms | first import p50 ms (max) | second import p50 ms |\n\
             |---|---:|---:|---:|---:|---:|\n",
        );
        for f in firsts {
            out.push_str(&format!(
                "| {} | {} | {} | {:.1} | {:.3} ({:.3}) | {:.3} |\n",
                f.backend.name(),
                human(f.bytes),
                f.first_attach_ms.count,
                f.context_ms.p50,
                f.first_attach_ms.p50,
                f.first_attach_ms.max,
                f.second_attach_ms.p50
            ));
        }
    }
    out
}

/// The report's section, from the runs without and with MPS.
pub fn report_section(
    no_mps: Option<&ProbeOutput<Results>>,
    mps: Option<&ProbeOutput<Results>>,
    plots: &mut Plots,
) -> ReportSection {
    let Some(main) = no_mps.or(mps) else { return ReportSection::missing("overhead") };
    let mut body = String::from(
        "The same kernels (`kernels/cuda/probe_memory.cu`) on each kind of memory: 16-byte vector reads and writes \
         (grid-stride, enough launches per run to take milliseconds, timed with events), a one-thread dependent \
         pointer chase over a random cycle of 128-byte lines (each load timed with `clock64`, converted with the \
         kernel's own `%globaltimer`), and a store followed by `__threadfence()`. Each figure is the median of several \
         runs; the noise band is the larger relative spread (max - min) / median of the two kinds compared.\n\n",
    );
    for (name, run) in [("Without MPS", no_mps), ("With MPS", mps)] {
        let Some(run) = run else { continue };
        let r = &run.results;
        let suffix = if run.env.mps { "mps" } else { "no-mps" };
        body.push_str(&format!("### {name}\n\n{}\n\n{}\n", run.verdict.key_figure, comparison_table(&r.comparisons)));
        let mut chart = |stem: &str,
                         title: &str,
                         x_label: &str,
                         y_label: &str,
                         y_log: bool,
                         f: &dyn Fn(&KindResults) -> Vec<(f64, f64)>| {
            plots.line_chart(LineChart {
                file_stem: format!("overhead-{stem}-{suffix}"),
                title: format!("{title} ({name})"),
                x_label: x_label.to_owned(),
                y_label: y_label.to_owned(),
                x_log: true,
                y_log,
                series: r.kinds.iter().map(|k| Series { name: k.kind.label().to_owned(), points: f(k) }).collect(),
            })
        };
        let read = chart("read-bandwidth", "Read bandwidth vs size", "bytes read per kernel", "GB/s", true, &|k| {
            k.bandwidth.iter().map(|p| (p.bytes as f64, p.read_gbps.summary.p50)).collect()
        });
        let write =
            chart("write-bandwidth", "Write bandwidth vs size", "bytes written per kernel", "GB/s", true, &|k| {
                k.bandwidth.iter().map(|p| (p.bytes as f64, p.write_gbps.summary.p50)).collect()
            });
        let latency = chart(
            "load-latency",
            "Dependent-load latency vs working set",
            "working set (bytes)",
            "ns per load (median)",
            false,
            &|k| k.latency.iter().map(|p| (p.bytes as f64, p.load_ns.summary.p50)).collect(),
        );
        body.push_str(&format!("\n{read}\n\n{write}\n\n{latency}\n\n"));
        body.push_str("Load latency distributions (all per-load samples of all runs, ns):\n\n| memory | working set | p50 | p99 | max | samples |\n|---|---:|---:|---:|---:|---:|\n");
        for k in &r.kinds {
            for p in &k.latency {
                if let Some(d) = p.load_ns.samples {
                    body.push_str(&format!(
                        "| {} | {} ({}) | {:.0} | {:.0} | {:.0} | {} |\n",
                        k.kind.label(),
                        human(p.bytes),
                        p.level,
                        d.p50,
                        d.p99,
                        d.max,
                        d.count
                    ));
                }
            }
        }
        body.push_str("\nAttach (import + map) and detach cost:\n\n");
        body.push_str(&attach_table(&r.attach, &r.first_imports));
        for note in &r.notes {
            body.push_str(&format!("\nNote: {note}\n"));
        }
        body.push('\n');
    }
    ReportSection {
        probe: "overhead".to_owned(),
        question: "Is memory imported from another process slower for kernels than the process's own memory?"
            .to_owned(),
        answer: format!("{} {}", main.verdict.answer, main.verdict.key_figure),
        body,
    }
}

/// The overhead probe, as [`crate::PROBES`] lists it.
#[derive(Debug, Clone, Copy)]
pub struct Overhead;

impl crate::Probe for Overhead {
    fn name(&self) -> &'static str {
        "overhead"
    }

    fn title(&self) -> &'static str {
        "Import overhead"
    }

    fn question(&self) -> &'static str {
        "Is memory imported from another process slower for kernels than the process's own memory?"
    }

    fn command(&self) -> clap::Command {
        crate::command_for::<ProbeArgs>(self.name(), self.question())
    }

    fn run(&self, matches: &clap::ArgMatches) -> u8 {
        crate::run_with(matches, main)
    }

    fn child(
        &self,
        task: harness::child::ChildTask,
        channel: &harness::child::Channel,
    ) -> Result<(), harness::ProbeError> {
        child(task, channel)
    }

    fn revise_verdict(&self, results: &serde_json::Value) -> Option<harness::Verdict> {
        crate::typed_verdict::<Results>(results, verdict)
    }

    fn report_section(
        &self,
        no_mps: Option<&harness::ProbeOutput<serde_json::Value>>,
        mps: Option<&harness::ProbeOutput<serde_json::Value>>,
        plots: &mut harness::report::Plots,
        problems: &mut Vec<String>,
    ) -> harness::report::ReportSection {
        crate::typed_section::<Results>(self.name(), no_mps, mps, plots, problems, report_section)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn m(runs: &[f64]) -> Measured {
        measured(runs.to_vec(), None).unwrap()
    }

    fn kind(kind: MemoryKind, read: &[f64], load: &[f64]) -> KindResults {
        KindResults {
            kind,
            bandwidth: vec![BandwidthPoint { bytes: GIB, read_gbps: m(read), write_gbps: m(&[3000.0, 3010.0]) }],
            latency: vec![LatencyPoint { bytes: 256 * MIB, level: "DRAM".to_owned(), load_ns: m(load) }],
            store_ns: m(&[500.0, 505.0]),
        }
    }

    fn results_of(runs: u32, kinds: Vec<KindResults>, comparisons: Vec<Comparison>) -> Results {
        Results { runs, kinds, attach: Vec::new(), first_imports: Vec::new(), comparisons, notes: Vec::new() }
    }

    #[test]
    fn chain_is_one_cycle_through_every_line() {
        let lines = 1000;
        let chain = chain_words(lines, 42);
        let mut seen = vec![false; lines as usize];
        let mut j = 0u64;
        for _ in 0..lines {
            let line = (j / 16) as usize;
            assert!(!seen[line], "line {line} visited twice");
            seen[line] = true;
            j = chain[j as usize];
        }
        assert_eq!(j, 0, "the chain returns to its start after every line");
        assert!(seen.iter().all(|&s| s));
    }

    #[test]
    fn differences_inside_the_noise_are_not_measurable() {
        let kinds = vec![
            kind(MemoryKind::Local, &[3000.0, 3100.0, 2950.0], &[600.0, 610.0]),
            kind(MemoryKind::LegacyImported, &[3050.0, 2990.0, 3020.0], &[605.0, 600.0]),
        ];
        let comparisons = compare(&kinds);
        assert_eq!(comparisons.len(), 4);
        assert!(comparisons.iter().all(|c| !c.measurable), "{comparisons:#?}");
        let v = verdict(&results_of(3, kinds, comparisons));
        assert!(v.answer.starts_with("No: over 4 metrics"), "{}", v.answer);
        assert!(v.answer.contains("within the run-to-run spread"), "{}", v.answer);
        assert!(v.key_figure.contains("noise band"), "{}", v.key_figure);
    }

    #[test]
    fn a_difference_beyond_the_noise_is_reported_with_its_size() {
        let kinds = vec![
            kind(MemoryKind::VmmLocal, &[3000.0, 3001.0], &[600.0, 601.0]),
            kind(MemoryKind::VmmImported, &[2700.0, 2701.0], &[600.0, 601.0]),
        ];
        let comparisons = compare(&kinds);
        let read = comparisons.iter().find(|c| c.metric.starts_with("read")).unwrap();
        assert!(read.measurable);
        assert!((read.difference + 0.1).abs() < 1e-3);
        let v = verdict(&results_of(2, kinds, comparisons));
        assert!(v.answer.contains("measurably slower on 1 of 4 metrics"), "{}", v.answer);
        assert!(v.answer.contains("-10.0%"), "{}", v.answer);
    }

    #[test]
    fn differences_in_favour_of_imported_memory_are_not_called_overhead() {
        let kinds = vec![
            kind(MemoryKind::VmmLocal, &[3000.0, 3001.0], &[600.0, 601.0]),
            kind(MemoryKind::VmmImported, &[3100.0, 3101.0], &[580.0, 581.0]),
        ];
        let comparisons = compare(&kinds);
        assert!(comparisons.iter().filter(|c| c.measurable).all(|c| !c.imported_is_worse()));
        let v = verdict(&results_of(2, kinds, comparisons));
        assert!(v.answer.starts_with("No: "), "{}", v.answer);
        assert!(v.answer.contains("favoured imported memory"), "{}", v.answer);
    }

    #[test]
    fn peer_memory_is_not_counted_as_ipc_overhead() {
        let kinds = vec![
            kind(MemoryKind::Local, &[3000.0, 3001.0], &[600.0, 601.0]),
            kind(MemoryKind::PeerImported, &[370.0, 371.0], &[2000.0, 2001.0]),
        ];
        let comparisons = compare(&kinds);
        assert!(
            comparisons
                .iter()
                .filter(|c| !c.metric.starts_with("store") && !c.metric.starts_with("write"))
                .all(|c| c.measurable)
        );
        let v = verdict(&results_of(2, kinds, comparisons));
        assert!(v.answer.starts_with("Not measured"), "{}", v.answer);
    }

    #[test]
    fn sizes_span_4_kib_to_1_gib() {
        let s = sizes(false);
        assert_eq!((s[0], *s.last().unwrap(), s.len()), (4 * KIB, GIB, 10));
        assert_eq!(*sizes(true).last().unwrap(), 256 * MIB);
    }
}
