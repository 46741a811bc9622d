//! `gpu-ipc probe coherency`: a writer in one process publishes a payload and then a flag; a polling reader in
//! another process waits for the flag and then reads the payload. When is the write visible, and which loads and
//! fences are needed?
//!
//! Every pair of a writer (five flag stores in a kernel, `cuStreamWriteValue64` after a payload kernel, the CPU
//! through host-shared memory) and a reader (twenty kernel variants: five flag loads x plain or volatile payload
//! loads x with or without `__threadfence()` between; `cuStreamWaitValue64` followed by a check kernel) runs
//! `rounds` handoffs: over memory exported by each backend with the writer in a child process, and, as the control,
//! over the process's own memory with both sides in one process. The kernels and the exact protocol are in
//! `kernels/cuda/probe_coherency.cu`; the reader holds the payload's lines in its caches from the previous round, so
//! a load that may be served from a stale line shows up as stale words.
//!
//! A cell reports handoffs done, stale rounds and words, timeouts (a poll that never saw the flag), and the
//! visibility latency (the reader's `%globaltimer` when it saw the flag minus the writer's just before it stored it;
//! for the CPU writer, the CPU's round trip from its flag store to the reader's ack). With `cuobjdump` on the PATH the
//! probe also records which SASS instructions each variant's loads, stores and fences became.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use gpu_ipc::core::driver::{
    Context, DeviceBuffer, DevicePtr, Event, EventFlags, HostRegistration, KernelParam, LaunchConfig, Stream,
    WaitCondition, copy_from_device, copy_to_device, fill_u32_async,
};
use gpu_ipc::core::sys::shm::{SharedMemory, SharedObject};
use gpu_ipc::kernels::probe::{
    COH_PAYLOAD_CHECK, COH_PAYLOAD_WRITE, FlagLoad, FlagStore, PayloadLoad, ProbeKernels, coherency_layout as layout,
    coherency_reader, coherency_writer,
};
use serde::{Deserialize, Serialize};

use super::channel::{Channel, ChildProcess, ChildTask};
use super::env::ProbeEnv;
use super::progress::Progress;
use super::regions::{ExportedRegion, HandleMessage, ImportedRegion};
use super::stats::Distribution;
use super::{ChildFailure, CommonArgs, ProbeError, ProbeOutput, Verdict};
use crate::answers::{Plots, ReportSection};

/// Payload words (u32) per round: 16 lines of 128 bytes.
pub const PAYLOAD_WORDS: u64 = 512;
/// Byte offset of the writer's timestamps in the shared device buffer (after flag, ack and payload).
const WRITE_TS_OFFSET: u64 = 8192;
/// Host-shared memory for the CPU writer: flag, ack and payload, as u64 atomics.
const HOST_WORDS: usize = 1024;
type HostBlock = [AtomicU64; HOST_WORDS];

/// Options of `gpu-ipc probe coherency`.
#[derive(Debug, Clone, clap::Args)]
pub struct ProbeArgs {
    #[command(flatten)]
    /// Options every probe takes.
    pub common: CommonArgs,
    /// Handoffs per cell (default: 100,000 with MPS, 100 without, where every handoff costs GPU time slices;
    /// --quick: a tenth of that).
    #[arg(long)]
    pub rounds: Option<u64>,
    /// Only this backend for the cross-process cells (default: every backend built in).
    #[arg(long)]
    pub backend: Option<gpu_ipc::BackendChoice>,
    /// Skip the same-process control run.
    #[arg(long)]
    pub no_control: bool,
    /// Per-round deadline of a poll, in milliseconds (default: 50 with MPS, 500 without).
    #[arg(long)]
    pub round_timeout_ms: Option<u64>,
}

/// Who writes the payload and the flag.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", tag = "kind")]
pub enum Writer {
    /// A kernel: plain payload stores, then the flag with `store`.
    Kernel {
        /// The flag store under test.
        store: FlagStore,
    },
    /// A payload kernel, then `cuStreamWriteValue64` (default flags: a memory barrier before the write).
    StreamWrite,
    /// The CPU, through host memory shared by a memfd: relaxed payload stores, then a release store of the flag.
    Cpu,
}

impl Writer {
    /// Every writer.
    pub fn all() -> Vec<Writer> {
        let mut all: Vec<Writer> = FlagStore::ALL.iter().map(|&store| Writer::Kernel { store }).collect();
        all.push(Writer::StreamWrite);
        all.push(Writer::Cpu);
        all
    }

    /// How a report names it.
    pub fn label(self) -> String {
        match self {
            Writer::Kernel { store } => format!("kernel: {}", store.label()),
            Writer::StreamWrite => "cuStreamWriteValue64".to_owned(),
            Writer::Cpu => "CPU (host memory)".to_owned(),
        }
    }
}

/// Who polls the flag and reads the payload.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", tag = "kind")]
pub enum Reader {
    /// A kernel polling with `load`, reading the payload with `payload`, `__threadfence()` between when `fence`.
    Kernel {
        /// The flag load under test.
        load: FlagLoad,
        /// The payload loads.
        payload: PayloadLoad,
        /// Whether `__threadfence()` sits between the flag and the payload.
        fence: bool,
    },
    /// `cuStreamWaitValue64` on the flag, then a kernel that checks the payload with plain loads.
    StreamWait,
}

impl Reader {
    /// Every reader.
    pub fn all() -> Vec<Reader> {
        let mut all = Vec::new();
        for &load in FlagLoad::ALL {
            for &payload in PayloadLoad::ALL {
                for fence in [false, true] {
                    all.push(Reader::Kernel { load, payload, fence });
                }
            }
        }
        all.push(Reader::StreamWait);
        all
    }

    /// How a report names it.
    pub fn label(self) -> String {
        match self {
            Reader::Kernel { load, payload, fence } => {
                let fence = if fence { " + __threadfence()" } else { "" };
                format!("{}{fence}, payload {}", load.label(), payload.label())
            }
            Reader::StreamWait => "cuStreamWaitValue64 + kernel".to_owned(),
        }
    }
}

/// Where the shared words live and who runs the two sides.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Placement {
    /// Device memory of the legacy backend; the writer in another process.
    Legacy,
    /// Device memory of the VMM backend; the writer in another process.
    Vmm,
    /// Host memory shared by a memfd, registered with CUDA by the reader; the CPU writer in another process.
    HostShared,
    /// The control: the process's own device memory (`cuMemAlloc`), both sides in one process.
    SameProcess,
    /// The control for the CPU writer: registered host memory, the writer a thread of the same process.
    SameProcessHost,
}

impl Placement {
    /// Whether the two sides ran in different processes.
    pub fn cross_process(self) -> bool {
        matches!(self, Placement::Legacy | Placement::Vmm | Placement::HostShared)
    }

    /// How a report names it.
    pub fn label(self) -> &'static str {
        match self {
            Placement::Legacy => "legacy IPC, 2 processes",
            Placement::Vmm => "VMM fd, 2 processes",
            Placement::HostShared => "host memfd, 2 processes",
            Placement::SameProcess => "own memory, 1 process",
            Placement::SameProcessHost => "own host memory, 1 process",
        }
    }
}

/// What a cell showed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Outcome {
    /// Every round done, every payload word current.
    Correct,
    /// At least one round read a stale payload word.
    Stale,
    /// A poll never saw the flag within its deadline (e.g. a load the compiler hoisted out of the loop).
    Timeout,
    /// The cell did not finish for another reason (the note says which).
    Failed,
}

/// One writer-reader pair in one placement.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Cell {
    /// The writer.
    pub writer: Writer,
    /// The reader.
    pub reader: Reader,
    /// Where it ran.
    pub placement: Placement,
    /// Handoffs asked for.
    pub rounds_planned: u64,
    /// Handoffs the reader completed.
    pub rounds_done: u64,
    /// Rounds with at least one stale payload word.
    pub stale_rounds: u64,
    /// Stale payload words, summed over rounds.
    pub stale_words: u64,
    /// The first round that read a stale word (0 if none).
    pub first_stale_round: u64,
    /// 1 when a reader's poll timed out (which ends the cell).
    pub reader_timeouts: u64,
    /// 1 when the writer gave up waiting for an ack.
    pub writer_timeouts: u64,
    /// The outcome.
    pub outcome: Outcome,
    /// Visibility latency in nanoseconds (reader saw the flag minus writer stored it; for the CPU writer the
    /// round trip from the CPU's flag store to the ack, which `latency_is_round_trip` says).
    pub latency_ns: Option<Distribution>,
    /// Whether `latency_ns` is a round trip rather than one way.
    pub latency_is_round_trip: bool,
    /// What went wrong, when something did.
    pub note: Option<String>,
}

/// What the probe measured.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Results {
    /// Handoffs per cell asked for.
    pub rounds: u64,
    /// Per-round poll deadline, in milliseconds.
    pub round_timeout_ms: u64,
    /// Payload size per round, in bytes.
    pub payload_bytes: u64,
    /// Every cell.
    pub cells: Vec<Cell>,
    /// For each coherency kernel: the memory and fence instructions its SASS holds (`cuobjdump -sass`), in order
    /// of first appearance, with counts. Empty when `cuobjdump` was not available.
    pub sass: BTreeMap<String, Vec<String>>,
    /// Why `sass` is empty, when it is.
    pub sass_note: Option<String>,
    /// The image the kernels came from (e.g. `sm_90.cubin`).
    pub image: String,
}

/// Runs the probe; returns the exit status.
pub fn main(args: &ProbeArgs) -> u8 {
    super::execute("coherency", &args.common, |env, progress| run(args, env, progress), render_text)
}

/// Parameters of one cell, as the writer side needs them.
#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
struct CellPlan {
    writer: Writer,
    rounds: u64,
    round_timeout_ns: u64,
}

/// Messages from the parent to the writer child.
#[derive(Debug, Serialize, Deserialize)]
#[serde(tag = "msg", rename_all = "kebab-case")]
enum ToWriter {
    /// Import the device buffer (legacy handle bytes here; a VMM fd rides along).
    ImportDevice(HandleMessage),
    /// Map the host block (its memfd rides along).
    MapHost,
    /// Start a cell.
    Start(CellPlan),
    /// The reader is done (or aborted); finish and report.
    Finish,
    /// Leave.
    Exit,
}

/// Messages from the writer child to the parent.
#[derive(Debug, Serialize, Deserialize)]
#[serde(tag = "msg", rename_all = "kebab-case")]
enum FromWriter {
    Ready,
    Started,
    Finished(WriterReport),
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
struct WriterReport {
    rounds_done: u64,
    timeouts: u64,
    /// CPU writer only: flag store to ack seen, per round, in ns.
    round_trip_ns: Vec<f64>,
    error: Option<String>,
}

fn run(args: &ProbeArgs, env: &ProbeEnv, progress: &Progress) -> Result<(Results, Verdict), ProbeError> {
    let rounds = args.rounds.unwrap_or(match (env.mps, args.common.quick) {
        (true, false) => 100_000,
        (true, true) => 10_000,
        (false, false) => 100,
        (false, true) => 50,
    });
    let round_timeout_ms = args.round_timeout_ms.unwrap_or(if env.mps { 50 } else { 500 });
    let plan = |writer| CellPlan { writer, rounds, round_timeout_ns: round_timeout_ms * 1_000_000 };

    let ctx = Context::for_ordinal(args.common.device)?;
    let reader = ReaderSide::new(&ctx, rounds)?;
    let (sass, sass_note) = disassemble(reader.kernels.image());

    let backends: Vec<gpu_ipc::BackendChoice> =
        args.backend.map_or_else(|| gpu_ipc::BackendChoice::ALL.to_vec(), |b| vec![b]);
    let device_writers: Vec<Writer> = Writer::all().into_iter().filter(|w| *w != Writer::Cpu).collect();
    let readers = Reader::all();
    let control_pairs = control_pairs();
    let control_cells = if args.no_control { 0 } else { control_pairs.len() };
    let total = backends.len() * device_writers.len() * readers.len() + readers.len() + control_cells;
    progress.stage("writer x reader cells", total as u64);

    let mut cells = Vec::new();
    for &backend in &backends {
        let placement = match backend.name() {
            "legacy" => Placement::Legacy,
            _ => Placement::Vmm,
        };
        let shared = ExportedRegion::allocate(backend, &ctx, WRITE_TS_OFFSET + 8 * rounds)?;
        let child = spawn_writer(args.common.device)?;
        let (handle, fd) = shared.export()?;
        child.channel().send(&ToWriter::ImportDevice(handle), fd.into_iter().collect())?;
        expect_ready(&child)?;
        let memory = Memory::Device(shared.ptr());
        for &writer in &device_writers {
            for &r in &readers {
                let cell = run_cell(&reader, &memory, WriterAt::Child(&child), plan(writer), r, placement);
                progress.step(&format!("{} / {}", writer.label(), r.label()));
                cells.push(cell);
            }
        }
        let _ = child.channel().send(&ToWriter::Exit, Vec::new());
    }

    // The CPU writer, in another process, through a memfd.
    {
        let host = HostShared::create(&ctx)?;
        let child = spawn_writer(args.common.device)?;
        child.channel().send(&ToWriter::MapHost, vec![host.block.memory().try_clone_fd().map_err(other)?])?;
        expect_ready(&child)?;
        let memory = Memory::Host(&host);
        for &r in &readers {
            let cell = run_cell(&reader, &memory, WriterAt::Child(&child), plan(Writer::Cpu), r, Placement::HostShared);
            progress.step(&format!("CPU / {}", r.label()));
            cells.push(cell);
        }
        let _ = child.channel().send(&ToWriter::Exit, Vec::new());
    }

    if !args.no_control {
        let local = DeviceBuffer::alloc(&ctx, WRITE_TS_OFFSET + 8 * rounds)?;
        let writer = WriterSide::new(&ctx, Some(Memory::Device(local.ptr()).owned()))?;
        let host = HostShared::create(&ctx)?;
        let host_writer = WriterSide::new(&ctx, Some(OwnedMemory::Host(host.block.clone())))?;
        for &(w, r) in &control_pairs {
            {
                let (memory, side, placement) = if w == Writer::Cpu {
                    (Memory::Host(&host), &host_writer, Placement::SameProcessHost)
                } else {
                    (Memory::Device(local.ptr()), &writer, Placement::SameProcess)
                };
                let cell = run_cell(&reader, &memory, WriterAt::Here(side), plan(w), r, placement);
                progress.step(&format!("control {} / {}", w.label(), r.label()));
                cells.push(cell);
            }
        }
    }

    let results = Results {
        rounds,
        round_timeout_ms,
        payload_bytes: PAYLOAD_WORDS * 4,
        cells,
        sass,
        sass_note,
        image: reader.kernels.image().file.to_owned(),
    };
    let verdict = verdict(&results);
    Ok((results, verdict))
}

fn other<E: std::fmt::Display>(e: E) -> ProbeError {
    ProbeError::Other(e.to_string())
}

/// The pairs the one-process control runs: the kernel and CPU writers against the kernel readers. Stream-driven
/// sides are left out of it: in one process, a `cuStreamWaitValue64` that is not yet satisfied can hold back the
/// other streams of that process (under MPS on the H100 a stream writer waiting for an ack stalled the reader's
/// own work queued behind it), so a one-process control of them measures that, not visibility.
pub fn control_pairs() -> Vec<(Writer, Reader)> {
    let writers = Writer::all().into_iter().filter(|w| *w != Writer::StreamWrite);
    let readers: Vec<Reader> = Reader::all().into_iter().filter(|r| *r != Reader::StreamWait).collect();
    writers.flat_map(|w| readers.iter().map(move |&r| (w, r))).collect()
}

fn spawn_writer(device: i32) -> Result<ChildProcess, ProbeError> {
    let task = ChildTask { role: "coherency-writer".to_owned(), params: serde_json::json!({ "device": device }) };
    Ok(ChildProcess::spawn(&task, &[], Duration::from_secs(30))?)
}

fn expect_ready(child: &ChildProcess) -> Result<(), ProbeError> {
    let reply: serde_json::Value = child.channel().recv_plain(Duration::from_secs(60))?;
    if let Ok(failure) = serde_json::from_value::<ChildFailure>(reply.clone()) {
        return Err(ProbeError::Child { role: "coherency-writer".to_owned(), reason: failure.error });
    }
    match serde_json::from_value::<FromWriter>(reply) {
        Ok(FromWriter::Ready) => Ok(()),
        other => Err(ProbeError::Other(format!("coherency writer: expected ready, got {other:?}"))),
    }
}

/// Host memory shared by a memfd and registered with CUDA in this process.
struct HostShared {
    block: Arc<SharedObject<HostBlock>>,
    registration: HostRegistration<SharedObject<HostBlock>>,
}

impl HostShared {
    fn create(ctx: &Context) -> Result<Self, ProbeError> {
        let memory = SharedMemory::create("gpu-ipc-coherency", HOST_WORDS * 8).map_err(other)?;
        let block = Arc::new(SharedObject::new(memory).map_err(other)?);
        let registration = HostRegistration::new(ctx, block.clone())?;
        Ok(Self { block, registration })
    }
}

/// The shared words of a cell, as the reader (this process) sees them.
enum Memory<'a> {
    Device(DevicePtr),
    Host(&'a HostShared),
}

/// The shared words as a writer side owns or borrows them.
#[derive(Clone)]
enum OwnedMemory {
    Device(DevicePtr),
    Host(Arc<SharedObject<HostBlock>>),
}

impl Memory<'_> {
    fn owned(&self) -> OwnedMemory {
        match self {
            Memory::Device(ptr) => OwnedMemory::Device(*ptr),
            Memory::Host(host) => OwnedMemory::Host(host.block.clone()),
        }
    }

    /// The device address of the flag (the ack and payload follow at fixed offsets).
    fn device_base(&self) -> DevicePtr {
        match self {
            Memory::Device(ptr) => *ptr,
            Memory::Host(host) => host.registration.device_ptr(),
        }
    }

    /// Zeroes flag, ack and payload (synchronously).
    fn reset(&self, stream: &Stream) -> Result<(), ProbeError> {
        match self {
            Memory::Device(ptr) => {
                fill_u32_async(*ptr, WRITE_TS_OFFSET, 0, stream)?;
                wait_idle(stream, Instant::now() + Duration::from_secs(10)).map_err(ProbeError::Other)?;
            }
            Memory::Host(host) => {
                for word in host.block.get() {
                    word.store(0, Ordering::SeqCst);
                }
            }
        }
        Ok(())
    }

    /// Writes the abort value into flag and ack, releasing whatever waits on either.
    fn abort(&self) {
        match self {
            Memory::Device(ptr) => {
                let _ = copy_to_device(ptr.offset(layout::FLAG), &[layout::ABORT]);
                let _ = copy_to_device(ptr.offset(layout::ACK), &[layout::ABORT]);
            }
            Memory::Host(host) => {
                let words = host.block.get();
                words[(layout::FLAG / 8) as usize].store(layout::ABORT, Ordering::SeqCst);
                words[(layout::ACK / 8) as usize].store(layout::ABORT, Ordering::SeqCst);
            }
        }
    }
}

/// The reader's resources: kernels, a stream, result and timestamp buffers.
struct ReaderSide {
    ctx: Context,
    kernels: ProbeKernels,
    stream: Arc<Stream>,
    results: DeviceBuffer,
    seen_ts: DeviceBuffer,
}

impl ReaderSide {
    fn new(ctx: &Context, rounds: u64) -> Result<Self, ProbeError> {
        Ok(Self {
            ctx: ctx.clone(),
            kernels: ProbeKernels::load(ctx)?,
            stream: Arc::new(Stream::new(ctx)?),
            results: DeviceBuffer::alloc(ctx, 8 * layout::RESULTS as u64)?,
            seen_ts: DeviceBuffer::alloc(ctx, 8 * rounds.max(1))?,
        })
    }

    /// Zeroes the results and timestamps (bounded wait), before the writer starts.
    fn prepare(&self) -> Result<(), ProbeError> {
        self.results.fill_u32_async(0, &self.stream)?;
        self.seen_ts.fill_u32_async(0, &self.stream)?;
        wait_idle(&self.stream, Instant::now() + Duration::from_secs(10)).map_err(ProbeError::Other)
    }

    /// Queues (kernel reader) or starts enqueueing on a thread (stream-wait reader) the reader of one cell.
    fn start(
        &self,
        reader: Reader,
        base: DevicePtr,
        plan: CellPlan,
    ) -> Result<Option<std::thread::JoinHandle<Result<(), String>>>, ProbeError> {
        let flag = base.offset(layout::FLAG);
        let ack = base.offset(layout::ACK);
        let payload = base.offset(layout::PAYLOAD);
        match reader {
            Reader::Kernel { load, payload: payload_load, fence } => {
                let kernel = self.kernels.function(&coherency_reader(load, payload_load, fence))?;
                kernel.launch(
                    &self.stream,
                    LaunchConfig::linear(1, 32),
                    &[
                        KernelParam::Ptr(flag),
                        KernelParam::Ptr(ack),
                        KernelParam::Ptr(payload),
                        KernelParam::U64(PAYLOAD_WORDS),
                        KernelParam::U64(plan.rounds),
                        KernelParam::U64(plan.round_timeout_ns),
                        KernelParam::Ptr(self.seen_ts.ptr()),
                        KernelParam::Ptr(self.results.ptr()),
                    ],
                )?;
                Ok(None)
            }
            Reader::StreamWait => {
                let check = self.kernels.function(COH_PAYLOAD_CHECK)?;
                let (ctx, stream) = (self.ctx.clone(), self.stream.clone());
                let (seen_ts, results) = (self.seen_ts.ptr(), self.results.ptr());
                Ok(Some(std::thread::spawn(move || {
                    ctx.bind().map_err(|e| e.to_string())?;
                    let mut throttle = Throttle::new(&ctx);
                    for round in 1..=plan.rounds {
                        throttle.before(&stream, round).map_err(|e| e.to_string())?;
                        stream.wait_value_u64(flag, round, WaitCondition::AtLeast).map_err(|e| e.to_string())?;
                        check
                            .launch(
                                &stream,
                                LaunchConfig::linear(1, 32),
                                &[
                                    KernelParam::Ptr(flag),
                                    KernelParam::Ptr(payload),
                                    KernelParam::U64(PAYLOAD_WORDS),
                                    KernelParam::U64(round),
                                    KernelParam::Ptr(seen_ts),
                                    KernelParam::Ptr(results),
                                ],
                            )
                            .map_err(|e| e.to_string())?;
                        stream.write_value_u64(ack, round).map_err(|e| e.to_string())?;
                    }
                    Ok(())
                })))
            }
        }
    }
}

/// Where the writer of a cell runs.
enum WriterAt<'a> {
    /// In the child process behind this channel.
    Child(&'a ChildProcess),
    /// In this process (the control).
    Here(&'a WriterSide),
}

/// The writer's resources (in the child, or in this process for the control).
struct WriterSide {
    ctx: Context,
    kernels: ProbeKernels,
    stream: Arc<Stream>,
    results: DeviceBuffer,
    memory: Option<OwnedMemory>,
}

/// A writer that was started: the thread that enqueues or spins, and what it needs to finish.
struct RunningWriter {
    thread: std::thread::JoinHandle<WriterReport>,
}

impl WriterSide {
    fn new(ctx: &Context, memory: Option<OwnedMemory>) -> Result<Self, ProbeError> {
        Ok(Self {
            ctx: ctx.clone(),
            kernels: ProbeKernels::load(ctx)?,
            stream: Arc::new(Stream::new(ctx)?),
            results: DeviceBuffer::alloc(ctx, 8 * layout::RESULTS as u64)?,
            memory,
        })
    }

    /// Starts the writer of `plan` on a thread: a kernel writer is one launch; a stream writer enqueues every round
    /// (which blocks while the stream's queue is full); the CPU writer spins through the rounds itself.
    fn start(&self, plan: CellPlan) -> Result<RunningWriter, ProbeError> {
        let memory = self.memory.clone().ok_or_else(|| ProbeError::Other("the writer has no memory".to_owned()))?;
        self.results.fill_u32_async(0, &self.stream)?;
        wait_idle(&self.stream, Instant::now() + Duration::from_secs(10)).map_err(ProbeError::Other)?;
        let kernel = match plan.writer {
            Writer::Kernel { store } => Some(self.kernels.function(&coherency_writer(store))?),
            _ => None,
        };
        let payload_write = self.kernels.function(COH_PAYLOAD_WRITE)?;
        let (ctx, stream, results) = (self.ctx.clone(), self.stream.clone(), self.results.ptr());
        let thread = std::thread::spawn(move || {
            let run = || -> Result<WriterReport, ProbeError> {
                ctx.bind()?;
                match (&memory, plan.writer) {
                    (OwnedMemory::Host(block), Writer::Cpu) => Ok(cpu_writer(block.get(), plan)),
                    (OwnedMemory::Device(base), Writer::Kernel { .. }) => {
                        let kernel = kernel.ok_or_else(|| ProbeError::Other("no writer kernel".to_owned()))?;
                        kernel.launch(
                            &stream,
                            LaunchConfig::linear(1, 32),
                            &[
                                KernelParam::Ptr(base.offset(layout::FLAG)),
                                KernelParam::Ptr(base.offset(layout::ACK)),
                                KernelParam::Ptr(base.offset(layout::PAYLOAD)),
                                KernelParam::U64(PAYLOAD_WORDS),
                                KernelParam::U64(plan.rounds),
                                KernelParam::U64(plan.round_timeout_ns),
                                KernelParam::Ptr(base.offset(WRITE_TS_OFFSET)),
                                KernelParam::Ptr(results),
                            ],
                        )?;
                        Ok(WriterReport::default())
                    }
                    (OwnedMemory::Device(base), Writer::StreamWrite) => {
                        let mut throttle = Throttle::new(&ctx);
                        for round in 1..=plan.rounds {
                            throttle.before(&stream, round)?;
                            if round > 1 {
                                stream.wait_value_u64(base.offset(layout::ACK), round - 1, WaitCondition::AtLeast)?;
                            }
                            payload_write.launch(
                                &stream,
                                LaunchConfig::linear(1, 32),
                                &[
                                    KernelParam::Ptr(base.offset(layout::PAYLOAD)),
                                    KernelParam::U64(PAYLOAD_WORDS),
                                    KernelParam::U64(round),
                                    KernelParam::Ptr(base.offset(WRITE_TS_OFFSET)),
                                ],
                            )?;
                            stream.write_value_u64(base.offset(layout::FLAG), round)?;
                        }
                        Ok(WriterReport { rounds_done: plan.rounds, ..WriterReport::default() })
                    }
                    _ => Err(ProbeError::Other(format!("writer {:?} does not run on this memory", plan.writer))),
                }
            };
            run().unwrap_or_else(|e| WriterReport { error: Some(e.to_string()), ..WriterReport::default() })
        });
        Ok(RunningWriter { thread })
    }

    /// Waits (bounded) for the writer's thread and stream, and reads its results.
    fn finish(&self, running: RunningWriter, plan: CellPlan) -> WriterReport {
        let deadline = Instant::now() + Duration::from_secs(30);
        while !running.thread.is_finished() {
            if Instant::now() > deadline {
                return WriterReport {
                    error: Some("the writer's thread did not finish within 30 s".to_owned()),
                    ..WriterReport::default()
                };
            }
            std::thread::sleep(Duration::from_micros(200));
        }
        let mut report = running.thread.join().unwrap_or_else(|_| WriterReport {
            error: Some("the writer's thread panicked".to_owned()),
            ..WriterReport::default()
        });
        if let Err(e) = wait_idle(&self.stream, deadline) {
            report.error.get_or_insert(e);
            return report;
        }
        if let Writer::Kernel { .. } = plan.writer {
            let mut words = [0u64; layout::RESULTS];
            match self.ctx.bind().and_then(|()| copy_from_device(&mut words, self.results.ptr())) {
                Ok(()) => {
                    report.rounds_done = words[layout::R_DONE];
                    report.timeouts = words[layout::R_TIMEOUT];
                }
                Err(e) => report.error = Some(e.to_string()),
            }
        }
        report
    }
}

/// The CPU writer: relaxed payload stores, a release store of the flag, then a bounded spin for the ack.
fn cpu_writer(words: &HostBlock, plan: CellPlan) -> WriterReport {
    let flag = &words[(layout::FLAG / 8) as usize];
    let ack = &words[(layout::ACK / 8) as usize];
    let payload = &words[(layout::PAYLOAD / 8) as usize..];
    let timeout = Duration::from_nanos(plan.round_timeout_ns);
    let mut report = WriterReport::default();
    report.round_trip_ns.reserve(plan.rounds as usize);
    for round in 1..=plan.rounds {
        for (k, word) in payload.iter().take((PAYLOAD_WORDS / 2) as usize).enumerate() {
            let k = k as u64;
            let pair = u64::from(layout::value(round, 2 * k)) | (u64::from(layout::value(round, 2 * k + 1)) << 32);
            word.store(pair, Ordering::Relaxed);
        }
        let stored = Instant::now();
        flag.store(round, Ordering::Release);
        loop {
            let seen = ack.load(Ordering::Acquire);
            if seen >= layout::ABORT {
                return report;
            }
            if seen >= round {
                break;
            }
            if stored.elapsed() > timeout {
                report.timeouts = 1;
                return report;
            }
            std::hint::spin_loop();
        }
        report.round_trip_ns.push(stored.elapsed().as_nanos() as f64);
        report.rounds_done = round;
    }
    report
}

/// Keeps a stream-driven side from queueing more than [`THROTTLE_ROUNDS`] rounds ahead of the GPU: a stream's queue
/// is finite, and a side that fills it blocks in the driver, which in one process can starve the other side's
/// launches (a deadlock the cell deadline could not end). An event every [`THROTTLE_EVERY`] rounds; before queueing
/// more, wait (bounded) until the event from [`THROTTLE_ROUNDS`] rounds back has completed.
struct Throttle {
    events: std::collections::VecDeque<(u64, Event)>,
    ctx: Context,
}

/// Rounds a stream-driven side may run ahead of the GPU.
const THROTTLE_ROUNDS: u64 = 128;
/// Rounds between two throttle events.
const THROTTLE_EVERY: u64 = 32;

impl Throttle {
    fn new(ctx: &Context) -> Self {
        Self { events: std::collections::VecDeque::new(), ctx: ctx.clone() }
    }

    /// Call before queueing `round`.
    fn before(&mut self, stream: &Stream, round: u64) -> Result<(), ProbeError> {
        if round.is_multiple_of(THROTTLE_EVERY) {
            let event = Event::new(&self.ctx, EventFlags::default())?;
            event.record(stream)?;
            self.events.push_back((round, event));
        }
        let deadline = Instant::now() + Duration::from_secs(30);
        while let Some((queued, event)) = self.events.front() {
            if queued + THROTTLE_ROUNDS > round {
                break;
            }
            if event.is_complete()? {
                self.events.pop_front();
                continue;
            }
            if Instant::now() > deadline {
                return Err(ProbeError::Other(format!(
                    "round {queued} did not complete within 30 s while queueing round {round}"
                )));
            }
            std::thread::sleep(Duration::from_micros(20));
        }
        Ok(())
    }
}

fn wait_idle(stream: &Stream, deadline: Instant) -> Result<(), String> {
    loop {
        match stream.is_idle() {
            Ok(true) => return Ok(()),
            Ok(false) if Instant::now() < deadline => std::thread::sleep(Duration::from_micros(100)),
            Ok(false) => return Err("the GPU stream did not drain before the deadline".to_owned()),
            Err(e) => return Err(e.to_string()),
        }
    }
}

/// Runs one cell; never fails (a failure is the cell's outcome), never hangs (every wait has a deadline, and the
/// abort value releases kernels and stream waits on both sides).
fn run_cell(
    reader: &ReaderSide,
    memory: &Memory<'_>,
    writer_at: WriterAt<'_>,
    plan: CellPlan,
    reader_kind: Reader,
    placement: Placement,
) -> Cell {
    let mut cell = Cell {
        writer: plan.writer,
        reader: reader_kind,
        placement,
        rounds_planned: plan.rounds,
        rounds_done: 0,
        stale_rounds: 0,
        stale_words: 0,
        first_stale_round: 0,
        reader_timeouts: 0,
        writer_timeouts: 0,
        outcome: Outcome::Failed,
        latency_ns: None,
        latency_is_round_trip: plan.writer == Writer::Cpu,
        note: None,
    };
    let started = Instant::now();
    let result = run_cell_inner(reader, memory, &writer_at, plan, reader_kind, &mut cell);
    tracing::info!(
        writer = %plan.writer.label(),
        reader = %reader_kind.label(),
        placement = placement.label(),
        outcome = ?cell.outcome,
        rounds = cell.rounds_done,
        ms = started.elapsed().as_secs_f64() * 1e3,
        error = ?result.as_ref().err().map(ToString::to_string),
        "coherency cell"
    );
    match result {
        Ok(()) => {}
        Err(e) => {
            memory.abort();
            let _ = wait_idle(&reader.stream, Instant::now() + Duration::from_secs(10));
            cell.outcome = Outcome::Failed;
            cell.note = Some(e.to_string());
        }
    }
    cell
}

fn run_cell_inner(
    reader: &ReaderSide,
    memory: &Memory<'_>,
    writer_at: &WriterAt<'_>,
    plan: CellPlan,
    reader_kind: Reader,
    cell: &mut Cell,
) -> Result<(), ProbeError> {
    reader.ctx.bind()?;
    memory.reset(&reader.stream)?;
    reader.prepare()?;
    // The writer first: it waits for the reader's acks, the reader for its flags; either order works.
    let running_here = match writer_at {
        WriterAt::Child(child) => {
            child.channel().send(&ToWriter::Start(plan), Vec::new())?;
            match recv_from_writer(child, Duration::from_secs(30))? {
                FromWriter::Started => None,
                other => return Err(ProbeError::Other(format!("writer: expected started, got {other:?}"))),
            }
        }
        WriterAt::Here(side) => Some(side.start(plan)?),
    };
    let enqueue = reader.start(reader_kind, memory.device_base(), plan)?;

    // Bounded wait for the reader; the kernel ends on its own at the first timed-out round.
    let deadline = Instant::now() + Duration::from_secs(60) + Duration::from_micros(50 * plan.rounds);
    let mut late = false;
    loop {
        let enqueued = enqueue.as_ref().is_none_or(std::thread::JoinHandle::is_finished);
        if enqueued && reader.stream.is_idle()? {
            break;
        }
        if Instant::now() > deadline {
            late = true;
            break;
        }
        std::thread::sleep(Duration::from_micros(200));
    }
    // Release whatever still waits (a writer whose reader gave up, or everything after the deadline).
    memory.abort();
    if let Some(thread) = enqueue {
        let until = Instant::now() + Duration::from_secs(10);
        while !thread.is_finished() && Instant::now() < until {
            std::thread::sleep(Duration::from_micros(200));
        }
        if thread.is_finished()
            && let Ok(Err(e)) = thread.join()
        {
            cell.note = Some(format!("reader: {e}"));
        }
    }
    wait_idle(&reader.stream, Instant::now() + Duration::from_secs(10)).map_err(ProbeError::Other)?;

    let writer_report = match writer_at {
        WriterAt::Child(child) => {
            child.channel().send(&ToWriter::Finish, Vec::new())?;
            match recv_from_writer(child, Duration::from_secs(60))? {
                FromWriter::Finished(report) => report,
                other => return Err(ProbeError::Other(format!("writer: expected finished, got {other:?}"))),
            }
        }
        WriterAt::Here(side) => match running_here {
            Some(running) => side.finish(running, plan),
            None => WriterReport::default(),
        },
    };

    let mut words = [0u64; layout::RESULTS];
    copy_from_device(&mut words, reader.results.ptr())?;
    cell.rounds_done = words[layout::R_DONE];
    cell.stale_rounds = words[layout::R_STALE_ROUNDS];
    cell.stale_words = words[layout::R_STALE_WORDS];
    cell.first_stale_round = words[layout::R_FIRST_STALE];
    cell.reader_timeouts = words[layout::R_TIMEOUT];
    cell.writer_timeouts = writer_report.timeouts;
    let aborted = words[layout::R_ABORTED] != 0;

    cell.latency_ns = if plan.writer == Writer::Cpu {
        Distribution::from_samples(&mut writer_report.round_trip_ns.clone())
    } else {
        let n = cell.rounds_done.min(plan.rounds) as usize;
        let mut seen = vec![0u64; n];
        let mut written = vec![0u64; n];
        if n > 0 {
            copy_from_device(&mut seen, reader.seen_ts.ptr())?;
            copy_from_device(&mut written, memory.device_base().offset(WRITE_TS_OFFSET))?;
        }
        let mut samples: Vec<f64> = seen.iter().zip(&written).map(|(&s, &w)| s.saturating_sub(w) as f64).collect();
        Distribution::from_samples(&mut samples)
    };
    cell.outcome = classify(cell, aborted || late);
    let mut notes: Vec<String> = cell.note.take().into_iter().collect();
    if late {
        notes.push("the reader did not finish before the cell's deadline and was aborted".to_owned());
    } else if aborted && cell.rounds_done < plan.rounds {
        notes.push("aborted".to_owned());
    }
    if let Some(e) = writer_report.error {
        notes.push(format!("writer: {e}"));
    }
    cell.note = (!notes.is_empty()).then(|| notes.join("; "));
    Ok(())
}

/// The outcome of a cell from its counts: stale data outranks everything (it is the failure that matters), then
/// timeouts, then anything that kept the cell from finishing.
pub fn classify(cell: &Cell, aborted: bool) -> Outcome {
    if cell.stale_rounds > 0 {
        Outcome::Stale
    } else if cell.reader_timeouts > 0 {
        Outcome::Timeout
    } else if aborted || cell.rounds_done < cell.rounds_planned {
        Outcome::Failed
    } else {
        Outcome::Correct
    }
}

fn recv_from_writer(child: &ChildProcess, timeout: Duration) -> Result<FromWriter, ProbeError> {
    let reply: serde_json::Value = child.channel().recv_plain(timeout)?;
    if let Ok(failure) = serde_json::from_value::<ChildFailure>(reply.clone()) {
        return Err(ProbeError::Child { role: "coherency-writer".to_owned(), reason: failure.error });
    }
    serde_json::from_value(reply).map_err(|e| ProbeError::Other(format!("writer: malformed reply: {e}")))
}

/// The writer child: imports the memory it is sent, then runs cells on request.
pub fn child(task: ChildTask, channel: &Channel) -> Result<(), ProbeError> {
    let device = task.params["device"].as_i64().unwrap_or(0) as i32;
    let ctx = Context::for_ordinal(device)?;
    let mut side = WriterSide::new(&ctx, None)?;
    let mut _imported: Option<ImportedRegion> = None;
    let mut running: Option<(RunningWriter, CellPlan)> = None;
    loop {
        let (message, mut fds): (ToWriter, _) = channel.recv(Duration::from_secs(3600))?;
        match message {
            ToWriter::ImportDevice(handle) => {
                let region = ImportedRegion::import(&ctx, &handle, fds.pop())?;
                side.memory = Some(OwnedMemory::Device(region.ptr()));
                _imported = Some(region);
                channel.send(&FromWriter::Ready, Vec::new())?;
            }
            ToWriter::MapHost => {
                let fd = fds.pop().ok_or_else(|| ProbeError::Other("no memfd came with MapHost".to_owned()))?;
                let memory = SharedMemory::from_fd(fd, HOST_WORDS * 8).map_err(other)?;
                side.memory = Some(OwnedMemory::Host(Arc::new(SharedObject::new(memory).map_err(other)?)));
                channel.send(&FromWriter::Ready, Vec::new())?;
            }
            ToWriter::Start(plan) => {
                running = Some((side.start(plan)?, plan));
                channel.send(&FromWriter::Started, Vec::new())?;
            }
            ToWriter::Finish => {
                let report = match running.take() {
                    Some((writer, plan)) => side.finish(writer, plan),
                    None => WriterReport { error: Some("no cell was running".to_owned()), ..WriterReport::default() },
                };
                channel.send(&FromWriter::Finished(report), Vec::new())?;
            }
            ToWriter::Exit => return Ok(()),
        }
    }
}

/// Runs `cuobjdump -sass` on the loaded image and keeps, per coherency kernel, its memory and fence instructions.
fn disassemble(image: &gpu_ipc::kernels::image::KernelImage) -> (BTreeMap<String, Vec<String>>, Option<String>) {
    if image.kind != gpu_ipc::kernels::image::ImageKind::Cubin {
        return (BTreeMap::new(), Some(format!("the loaded image {} is PTX: no SASS to read", image.file)));
    }
    let path = std::env::temp_dir().join(format!("gpu-ipc-coherency-{}.cubin", std::process::id()));
    if let Err(e) = std::fs::write(&path, image.bytes) {
        return (BTreeMap::new(), Some(format!("could not write the cubin for cuobjdump: {e}")));
    }
    let output = std::process::Command::new("cuobjdump").arg("-sass").arg(&path).output();
    let _ = std::fs::remove_file(&path);
    match output {
        Ok(out) if out.status.success() => (parse_sass(&String::from_utf8_lossy(&out.stdout)), None),
        Ok(out) => {
            (BTreeMap::new(), Some(format!("cuobjdump failed: {}", String::from_utf8_lossy(&out.stderr).trim())))
        }
        Err(e) => (BTreeMap::new(), Some(format!("cuobjdump not run ({e}); install the CUDA toolkit to record SASS"))),
    }
}

/// From `cuobjdump -sass` output, per `gpu_ipc_coh_*` function: its global-memory loads and stores, fences,
/// barriers and cache controls, as `MNEMONIC xN` in order of first appearance.
pub fn parse_sass(text: &str) -> BTreeMap<String, Vec<String>> {
    let mut out: BTreeMap<String, Vec<String>> = BTreeMap::new();
    let mut current: Option<(String, Vec<(String, usize)>)> = None;
    let mut flush = |current: &mut Option<(String, Vec<(String, usize)>)>| {
        if let Some((name, list)) = current.take()
            && name.starts_with("gpu_ipc_coh_")
        {
            out.insert(name, list.into_iter().map(|(m, n)| format!("{m} x{n}")).collect());
        }
    };
    for line in text.lines() {
        let trimmed = line.trim();
        if let Some(name) = trimmed.strip_prefix("Function : ") {
            flush(&mut current);
            current = Some((name.trim().to_owned(), Vec::new()));
            continue;
        }
        let Some((_, list)) = current.as_mut() else { continue };
        // "/*0080*/   @!P0 LDG.E.64.STRONG.SYS R4, desc[UR4][R2.64] ;   /* 0x... */"
        let Some(rest) = trimmed.strip_prefix("/*").and_then(|r| r.split_once("*/")).map(|(_, r)| r.trim()) else {
            continue;
        };
        let mut tokens = rest.split_whitespace();
        let Some(mut mnemonic) = tokens.next() else { continue };
        if mnemonic.starts_with('@') {
            let Some(next) = tokens.next() else { continue };
            mnemonic = next;
        }
        let mnemonic = mnemonic.trim_end_matches(';');
        let base = mnemonic.split('.').next().unwrap_or("");
        let relevant =
            matches!(base, "LDG" | "STG" | "LD" | "ST" | "MEMBAR" | "FENCE" | "CCTL" | "ERRBAR" | "ATOMG" | "REDG");
        if !relevant {
            continue;
        }
        match list.iter_mut().find(|(m, _)| m == mnemonic) {
            Some((_, n)) => *n += 1,
            None => list.push((mnemonic.to_owned(), 1)),
        }
    }
    flush(&mut current);
    out
}

/// The pair the project's rule names: publish with `st.release.sys`, poll with `ld.acquire.sys`, plain payload
/// loads, no extra fence.
pub const RULE_WRITER: Writer = Writer::Kernel { store: FlagStore::ReleaseSys };
/// The reader of the rule pair.
pub const RULE_READER: Reader =
    Reader::Kernel { load: FlagLoad::AcquireSys, payload: PayloadLoad::Plain, fence: false };

/// The outcome of a writer-reader pair over the placements it ran in (cross-process only, or the control only).
#[derive(Debug, Clone, PartialEq)]
pub struct PairSummary {
    /// The writer.
    pub writer: Writer,
    /// The reader.
    pub reader: Reader,
    /// Handoffs done over all its cells.
    pub handoffs: u64,
    /// Stale rounds over all its cells.
    pub stale_rounds: u64,
    /// Cells that timed out.
    pub timeouts: u64,
    /// Cells that failed otherwise.
    pub failed: u64,
    /// Cells.
    pub cells: u64,
    /// The worst outcome: Stale over Timeout over Failed over Correct.
    pub outcome: Outcome,
    /// Median of the cells' p50 latencies (ns), for correct one-way cells.
    pub p50_ns: Option<f64>,
    /// Largest of the cells' p99 latencies (ns).
    pub p99_ns: Option<f64>,
}

/// Summarises the cells per pair, over the cross-process placements (`cross = true`) or the control.
pub fn summarise(cells: &[Cell], cross: bool) -> Vec<PairSummary> {
    let mut pairs: BTreeMap<(Writer, Reader), Vec<&Cell>> = BTreeMap::new();
    for cell in cells.iter().filter(|c| c.placement.cross_process() == cross) {
        pairs.entry((cell.writer, cell.reader)).or_default().push(cell);
    }
    pairs
        .into_iter()
        .map(|((writer, reader), list)| {
            let rank = |o: Outcome| match o {
                Outcome::Stale => 3,
                Outcome::Timeout => 2,
                Outcome::Failed => 1,
                Outcome::Correct => 0,
            };
            let outcome = list.iter().map(|c| c.outcome).max_by_key(|&o| rank(o)).unwrap_or(Outcome::Failed);
            let mut p50s: Vec<f64> = list
                .iter()
                .filter(|c| c.outcome == Outcome::Correct)
                .filter_map(|c| c.latency_ns.map(|d| d.p50))
                .collect();
            let p99 = list
                .iter()
                .filter(|c| c.outcome == Outcome::Correct)
                .filter_map(|c| c.latency_ns.map(|d| d.p99))
                .fold(None, |acc: Option<f64>, x| Some(acc.map_or(x, |a| a.max(x))));
            PairSummary {
                writer,
                reader,
                handoffs: list.iter().map(|c| c.rounds_done).sum(),
                stale_rounds: list.iter().map(|c| c.stale_rounds).sum(),
                timeouts: list.iter().filter(|c| c.outcome == Outcome::Timeout).count() as u64,
                failed: list.iter().filter(|c| c.outcome == Outcome::Failed).count() as u64,
                cells: list.len() as u64,
                outcome,
                p50_ns: Distribution::from_samples(&mut p50s).map(|d| d.p50),
                p99_ns: p99,
            }
        })
        .collect()
}

/// The distinct labels of `items`, in first-seen order, joined with " / ".
fn distinct_labels(items: impl Iterator<Item = String>) -> String {
    let mut seen: Vec<String> = Vec::new();
    for item in items {
        if !seen.contains(&item) {
            seen.push(item);
        }
    }
    seen.join(" / ")
}

/// The verdict from the counts: which pairs are correct, which readers read stale data and why, which polls never
/// saw the flag, the fastest correct pair, and whether the project's rule pair held.
pub fn verdict(results: &Results) -> Verdict {
    let pairs = summarise(&results.cells, true);
    let count = |o: Outcome| pairs.iter().filter(|p| p.outcome == o).count();
    let (correct, stale, timeout, failed) =
        (count(Outcome::Correct), count(Outcome::Stale), count(Outcome::Timeout), count(Outcome::Failed));
    let rule = pairs.iter().find(|p| p.writer == RULE_WRITER && p.reader == RULE_READER);
    let fastest = pairs
        .iter()
        .filter(|p| p.outcome == Outcome::Correct && p.writer != Writer::Cpu)
        .filter_map(|p| p.p50_ns.map(|l| (l, p)))
        .min_by(|a, b| a.0.total_cmp(&b.0));
    let mut answer =
        format!("Across processes, {correct} of {} writer/reader pairs were correct in every handoff", pairs.len());
    let stale_pairs: Vec<&PairSummary> = pairs.iter().filter(|p| p.outcome == Outcome::Stale).collect();
    if stale_pairs.is_empty() {
        answer.push_str(", none read a stale payload");
    } else {
        let (rounds, handoffs) = stale_pairs.iter().fold((0, 0), |(r, h), p| (r + p.stale_rounds, h + p.handoffs));
        answer.push_str(&format!(
            "; {stale} read stale payload words ({rounds} of {handoffs} rounds), all with readers that polled with {} \
             and then read the payload with {}",
            distinct_labels(stale_pairs.iter().filter_map(|p| match p.reader {
                Reader::Kernel { load, .. } => Some(load.label().to_owned()),
                Reader::StreamWait => None,
            })),
            distinct_labels(stale_pairs.iter().map(|p| match p.reader {
                Reader::Kernel { payload, fence, .. } => {
                    format!("{}{}", payload.label(), if fence { " after a fence" } else { " and no fence" })
                }
                Reader::StreamWait => "a check kernel".to_owned(),
            }))
        ));
    }
    if timeout > 0 {
        let loads = distinct_labels(pairs.iter().filter(|p| p.outcome == Outcome::Timeout).map(|p| match p.reader {
            Reader::Kernel { load, .. } => load.label().to_owned(),
            Reader::StreamWait => "a stream wait".to_owned(),
        }));
        answer.push_str(&format!("; {timeout} never saw the flag (polls with a {loads})"));
    }
    if failed > 0 {
        answer.push_str(&format!("; {failed} did not finish"));
    }
    answer.push('.');
    let acquire: Vec<&PairSummary> = pairs
        .iter()
        .filter(|p| matches!(p.reader, Reader::Kernel { load: FlagLoad::AcquireGpu | FlagLoad::AcquireSys, .. }))
        .collect();
    if !acquire.is_empty() && acquire.iter().all(|p| p.outcome == Outcome::Correct) {
        answer.push_str(&format!(" Every ld.acquire reader was correct with every writer ({} pairs).", acquire.len()));
    }
    let key_figure = match rule {
        Some(rule) if rule.outcome == Outcome::Correct => {
            answer.push_str(
                " Rule: publish with st.release.sys (cuStreamWriteValue64 from the host side), poll with \
                 ld.acquire.sys (cuStreamWaitValue64); plain or volatile flag stores without a release were not \
                 caught stale here, but the PTX memory model does not promise them.",
            );
            format!(
                "st.release.sys -> ld.acquire.sys: 0 stale in {} cross-process handoffs, visible after p50 {} (p99 {})",
                rule.handoffs,
                fmt_ns(rule.p50_ns),
                fmt_ns(rule.p99_ns)
            )
        }
        Some(rule) => {
            answer.push_str(" The rule pair st.release.sys / ld.acquire.sys did NOT hold: see the table.");
            format!(
                "st.release.sys -> ld.acquire.sys: {:?}, {} stale rounds in {} handoffs",
                rule.outcome, rule.stale_rounds, rule.handoffs
            )
        }
        None => "the rule pair did not run".to_owned(),
    };
    if let Some((latency, pair)) = fastest {
        answer.push_str(&format!(
            " Fastest correct pair: {} -> {} (p50 {}).",
            pair.writer.label(),
            pair.reader.label(),
            fmt_ns(Some(latency))
        ));
    }
    Verdict { answer, key_figure }
}

fn fmt_ns(ns: Option<f64>) -> String {
    match ns {
        None => "-".to_owned(),
        Some(ns) if ns >= 1e6 => format!("{:.2} ms", ns / 1e6),
        Some(ns) if ns >= 1e3 => format!("{:.2} us", ns / 1e3),
        Some(ns) => format!("{ns:.0} ns"),
    }
}

fn outcome_cell(p: &PairSummary) -> String {
    match p.outcome {
        Outcome::Correct => format!("ok {}", fmt_ns(p.p50_ns)),
        Outcome::Stale => format!("STALE {}/{}", p.stale_rounds, p.handoffs),
        Outcome::Timeout => "timeout".to_owned(),
        Outcome::Failed => "failed".to_owned(),
    }
}

/// One line per placement: how many of its cells were correct, stale, timed out or failed.
pub fn placement_lines(cells: &[Cell]) -> String {
    let mut out = String::new();
    let mut placements: Vec<Placement> = cells.iter().map(|c| c.placement).collect();
    placements.sort();
    placements.dedup();
    for placement in placements {
        let of = |o: Outcome| cells.iter().filter(|c| c.placement == placement && c.outcome == o).count();
        let handoffs: u64 = cells.iter().filter(|c| c.placement == placement).map(|c| c.rounds_done).sum();
        out.push_str(&format!(
            "- {}: {} cells correct, {} stale, {} timed out, {} failed; {handoffs} handoffs\n",
            placement.label(),
            of(Outcome::Correct),
            of(Outcome::Stale),
            of(Outcome::Timeout),
            of(Outcome::Failed)
        ));
    }
    out
}

/// The pair matrix as a Markdown table: a row per reader, a column per writer; each cell the outcome and, when
/// correct, the median visibility latency (for the CPU writer: the round trip).
pub fn matrix_markdown(pairs: &[PairSummary]) -> String {
    let writers: Vec<Writer> = Writer::all().into_iter().filter(|w| pairs.iter().any(|p| p.writer == *w)).collect();
    let mut out = String::from("| reader \\ writer |");
    for w in &writers {
        out.push_str(&format!(" {} |", w.label()));
    }
    out.push_str("\n|---|");
    out.push_str(&"---|".repeat(writers.len()));
    out.push('\n');
    for r in Reader::all() {
        if !pairs.iter().any(|p| p.reader == r) {
            continue;
        }
        out.push_str(&format!("| {} |", r.label()));
        for w in &writers {
            let text = pairs.iter().find(|p| p.writer == *w && p.reader == r).map_or("-".to_owned(), outcome_cell);
            out.push_str(&format!(" {text} |"));
        }
        out.push('\n');
    }
    out
}

/// The result as text: the verdict, then the cross-process matrix and the control's.
pub fn render_text(output: &ProbeOutput<Results>) -> String {
    let r = &output.results;
    let mut out = format!(
        "gpu-ipc probe coherency: {} handoffs per cell, {}-byte payload, poll deadline {} ms, {}\n\n",
        r.rounds,
        r.payload_bytes,
        r.round_timeout_ms,
        output.env.headline(0)
    );
    out.push_str(&format!("{}\n{}\n\n", output.verdict.answer, output.verdict.key_figure));
    out.push_str("Across processes (legacy and VMM device memory; the CPU writer through a memfd):\n");
    out.push_str(&matrix_markdown(&summarise(&r.cells, true)));
    let control = summarise(&r.cells, false);
    if !control.is_empty() {
        out.push_str("\nControl, one process:\n");
        out.push_str(&matrix_markdown(&control));
    }
    out
}

/// The report's section, from the runs without and with MPS.
pub fn report_section(
    no_mps: Option<&ProbeOutput<Results>>,
    mps: Option<&ProbeOutput<Results>>,
    _plots: &mut Plots,
) -> ReportSection {
    let Some(main) = mps.or(no_mps) else { return ReportSection::missing("coherency") };
    let mut body = String::new();
    body.push_str(
        "A writer publishes a 2 KiB payload (16 lines of 128 bytes) and then a flag; a reader polls the flag and \
         then reads every payload word, which it already holds in its caches from the previous round. Each cell \
         counts handoffs, rounds with a stale word, and polls that never saw the flag; `ok` shows the median \
         visibility latency (reader's `%globaltimer` on seeing the flag minus the writer's just before storing it; \
         for the CPU writer the CPU's round trip to the reader's ack). `%globaltimer` advances in steps (32 ns on the \
         H100), so one-way latencies are multiples of it. Kernels: `kernels/cuda/probe_coherency.cu`.\n\n",
    );
    for (name, run) in [("With MPS", mps), ("Without MPS", no_mps)] {
        let Some(run) = run else {
            body.push_str(&format!("### {name}\n\nNot run.\n\n"));
            continue;
        };
        let r = &run.results;
        body.push_str(&format!(
            "### {name}: {} handoffs per cell, poll deadline {} ms\n\n{}\n\n**Across processes** (device memory of \
             each backend, merged; the CPU writer through a memfd):\n\n{}\n",
            r.rounds,
            r.round_timeout_ms,
            run.verdict.key_figure,
            matrix_markdown(&summarise(&r.cells, true))
        ));
        body.push_str(&format!("\nPer placement:\n\n{}", placement_lines(&r.cells)));
        let control = summarise(&r.cells, false);
        if !control.is_empty() {
            body.push_str(&format!(
                "\n**Control, one process** (the process's own `cuMemAlloc` memory, or its own registered host memory \
                 for the CPU writer; kernel and CPU writers against the kernel readers only: in one process a \
                 `cuStreamWaitValue64` that is not yet satisfied can hold back the process's other streams, which \
                 stalled such a cell under MPS on the H100):\n\n{}\n",
                matrix_markdown(&control)
            ));
        }
        if !run.env.mps && r.rounds < 1000 {
            body.push_str(
                "\nWithout MPS the two processes' kernels never run at the same time: each handoff waits for GPU \
                 time slices, so these cells run fewer handoffs.\n\n",
            );
        }
    }
    if !main.results.sass.is_empty() {
        body.push_str(&format!(
            "### What each variant became (`cuobjdump -sass`, {})\n\n| kernel | memory, fence and cache instructions |\n|---|---|\n",
            main.results.image
        ));
        for (kernel, instructions) in &main.results.sass {
            body.push_str(&format!("| `{kernel}` | {} |\n", instructions.join(", ")));
        }
        body.push('\n');
    } else if let Some(note) = &main.results.sass_note {
        body.push_str(&format!("SASS not recorded: {note}\n\n"));
    }
    ReportSection {
        probe: "coherency".to_owned(),
        question: "When does one process's write become visible to another process's polling kernel, and which loads \
                   and fences are needed?"
            .to_owned(),
        answer: format!("{} {}", main.verdict.answer, main.verdict.key_figure),
        body,
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn cell(writer: Writer, reader: Reader, placement: Placement, outcome: Outcome, stale: u64, p50: f64) -> Cell {
        let latency = Distribution { count: 100, min: p50, p50, p99: p50 * 2.0, max: p50 * 3.0, mean: p50 };
        Cell {
            writer,
            reader,
            placement,
            rounds_planned: 100,
            rounds_done: if outcome == Outcome::Timeout { 0 } else { 100 },
            stale_rounds: stale,
            stale_words: stale * 3,
            first_stale_round: u64::from(stale > 0),
            reader_timeouts: u64::from(outcome == Outcome::Timeout),
            writer_timeouts: 0,
            outcome,
            latency_ns: Some(latency),
            latency_is_round_trip: writer == Writer::Cpu,
            note: None,
        }
    }

    fn recorded() -> Results {
        let plain = Reader::Kernel { load: FlagLoad::Plain, payload: PayloadLoad::Plain, fence: false };
        let volatile = Reader::Kernel { load: FlagLoad::Volatile, payload: PayloadLoad::Plain, fence: false };
        let w = Writer::Kernel { store: FlagStore::Volatile };
        Results {
            rounds: 100,
            round_timeout_ms: 50,
            payload_bytes: 2048,
            cells: vec![
                cell(RULE_WRITER, RULE_READER, Placement::Legacy, Outcome::Correct, 0, 1500.0),
                cell(RULE_WRITER, RULE_READER, Placement::Vmm, Outcome::Correct, 0, 1700.0),
                cell(RULE_WRITER, plain, Placement::Vmm, Outcome::Timeout, 0, 0.0),
                cell(w, volatile, Placement::Legacy, Outcome::Stale, 7, 900.0),
                cell(w, volatile, Placement::Vmm, Outcome::Correct, 0, 900.0),
                cell(RULE_WRITER, RULE_READER, Placement::SameProcess, Outcome::Correct, 0, 600.0),
            ],
            sass: BTreeMap::new(),
            sass_note: Some("cuobjdump not run".to_owned()),
            image: "sm_90.cubin".to_owned(),
        }
    }

    #[test]
    fn pairs_take_their_worst_outcome_and_merge_placements() {
        let pairs = summarise(&recorded().cells, true);
        assert_eq!(pairs.len(), 3);
        let rule = pairs.iter().find(|p| p.writer == RULE_WRITER && p.reader == RULE_READER).unwrap();
        assert_eq!((rule.outcome, rule.handoffs, rule.cells), (Outcome::Correct, 200, 2));
        assert_eq!(rule.p50_ns, Some(1500.0));
        assert_eq!(rule.p99_ns, Some(3400.0));
        let stale = pairs.iter().find(|p| p.outcome == Outcome::Stale).unwrap();
        assert_eq!((stale.stale_rounds, stale.handoffs), (7, 200));
        assert_eq!(summarise(&recorded().cells, false).len(), 1);
    }

    #[test]
    fn verdict_counts_and_names_the_rule() {
        let v = verdict(&recorded());
        assert!(v.answer.contains("1 of 3 writer/reader pairs were correct"), "{}", v.answer);
        assert!(v.answer.contains("1 read stale payload words (7 of 200 rounds)"), "{}", v.answer);
        assert!(
            v.answer.contains("polled with ld.volatile and then read the payload with plain loads and no fence"),
            "{}",
            v.answer
        );
        assert!(v.answer.contains("1 never saw the flag (polls with a plain load)"), "{}", v.answer);
        assert!(v.answer.contains("Rule: publish with st.release.sys"), "{}", v.answer);
        assert!(v.key_figure.contains("0 stale in 200 cross-process handoffs"), "{}", v.key_figure);
        assert!(v.key_figure.contains("1.50 us"), "{}", v.key_figure);
    }

    #[test]
    fn a_stale_rule_pair_is_reported_as_broken() {
        let mut results = recorded();
        results.cells[1].outcome = Outcome::Stale;
        results.cells[1].stale_rounds = 2;
        let v = verdict(&results);
        assert!(v.answer.contains("did NOT hold"), "{}", v.answer);
    }

    #[test]
    fn classify_ranks_stale_over_timeout() {
        let mut c = cell(RULE_WRITER, RULE_READER, Placement::Vmm, Outcome::Correct, 0, 1.0);
        assert_eq!(classify(&c, false), Outcome::Correct);
        c.reader_timeouts = 1;
        assert_eq!(classify(&c, false), Outcome::Timeout);
        c.stale_rounds = 1;
        assert_eq!(classify(&c, false), Outcome::Stale);
        c.stale_rounds = 0;
        c.reader_timeouts = 0;
        c.rounds_done = 10;
        assert_eq!(classify(&c, false), Outcome::Failed);
    }

    #[test]
    fn sass_parser_keeps_memory_and_fence_instructions_per_kernel() {
        let text = "\n\tcode for sm_90\n\t\tFunction : gpu_ipc_coh_read_acquiresys_plain_nofence\n\
            \t.headerflags\t@\"EF_CUDA_SM90\"\n\
            /*0000*/                   LDC R1, c[0x0][0x28] ;               /* 0x00000a00ff017b82 */\n\
            /*0010*/                   LDG.E.64.STRONG.SYS R4, desc[UR4][R2.64] ;  /* 0x0 */\n\
            /*0020*/              @!P0 LDG.E.64.STRONG.SYS R4, desc[UR4][R2.64] ;  /* 0x0 */\n\
            /*0030*/                   CCTL.IVALL ;  /* 0x0 */\n\
            /*0040*/                   LDG.E R7, desc[UR4][R2.64] ;  /* 0x0 */\n\
            \t\tFunction : gpu_ipc_mem_read\n\
            /*0000*/                   LDG.E.128 R4, desc[UR4][R2.64] ;  /* 0x0 */\n";
        let sass = parse_sass(text);
        assert_eq!(sass.len(), 1);
        assert_eq!(
            sass["gpu_ipc_coh_read_acquiresys_plain_nofence"],
            vec!["LDG.E.64.STRONG.SYS x2", "CCTL.IVALL x1", "LDG.E x1"]
        );
    }

    #[test]
    fn matrix_lists_each_reader_and_writer_once() {
        let md = matrix_markdown(&summarise(&recorded().cells, true));
        assert!(md.contains("STALE 7/200"), "{md}");
        assert!(md.contains("timeout"), "{md}");
        assert!(md.contains("ok 1.50 us"), "{md}");
        assert_eq!(md.lines().count(), 2 + 3);
    }

    #[test]
    fn results_round_trip_through_json() {
        let results = recorded();
        let json = serde_json::to_string(&results).unwrap();
        assert_eq!(serde_json::from_str::<Results>(&json).unwrap(), results);
    }
}
