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

mod analysis;
mod sass;
mod sides;
mod words;

pub use analysis::{render_text, report_section, verdict};
use sass::disassemble;
pub use sides::child;
use sides::{CellPlan, FromWriter, ReaderSide, ToWriter, WriterAt, WriterSide, run_cell};
use words::{HostShared, Memory, OwnedMemory};

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::AtomicU64;
use std::time::Duration;

use gpu_ipc::driver::{Context, DeviceBuffer};
use gpu_ipc::kernels::probe::{FlagLoad, FlagStore, PayloadLoad};
use serde::{Deserialize, Serialize};

use harness::child::ChildFailure;
use harness::child::{ChildProcess, ChildTask};
use harness::env::MeasurementEnv;
use harness::progress::Progress;
use harness::regions::ExportedRegion;
use harness::stats::Distribution;
use harness::{CommonArgs, MeasurementError, Verdict};

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
    pub backend: Option<gpu_ipc::BackendKind>,
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
    harness::execute("coherency", &args.common, |env, progress| run(args, env, progress), render_text)
}

fn run(args: &ProbeArgs, env: &MeasurementEnv, progress: &Progress) -> Result<(Results, Verdict), MeasurementError> {
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

    let backends: Vec<gpu_ipc::BackendKind> = args.backend.map_or_else(|| gpu_ipc::COMPILED_GPU.to_vec(), |b| vec![b]);
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
        let shared = Arc::new(ExportedRegion::allocate(backend, &ctx, WRITE_TS_OFFSET + 8 * rounds)?);
        let child = spawn_writer(args.common.device)?;
        let (handle, fd) = shared.export()?;
        child.channel().send(&ToWriter::ImportDevice(handle), fd.into_iter().collect())?;
        expect_ready(&child)?;
        let memory = Memory::Device(shared.clone());
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
        child.channel().send(&ToWriter::MapHost, vec![host.block.memory().try_clone_fd()?])?;
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
        let local = Arc::new(DeviceBuffer::alloc(&ctx, WRITE_TS_OFFSET + 8 * rounds)?);
        let writer = WriterSide::new(&ctx, Some(Memory::Device(local.clone()).owned()))?;
        let host = HostShared::create(&ctx)?;
        let host_writer = WriterSide::new(&ctx, Some(OwnedMemory::Host(host.block.clone())))?;
        for &(w, r) in &control_pairs {
            {
                let (memory, side, placement) = if w == Writer::Cpu {
                    (Memory::Host(&host), &host_writer, Placement::SameProcessHost)
                } else {
                    (Memory::Device(local.clone()), &writer, Placement::SameProcess)
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

/// The pairs the one-process control runs: the kernel and CPU writers against the kernel readers. Stream-driven
/// sides are left out of it: in one process, a `cuStreamWaitValue64` that is not yet satisfied can hold back the
/// other streams of that process (under MPS on the H100 a stream writer waiting for an ack stalled the reader's
/// own work queued behind it), so a one-process control of them measures that, not visibility.
pub fn control_pairs() -> Vec<(Writer, Reader)> {
    let writers = Writer::all().into_iter().filter(|w| *w != Writer::StreamWrite);
    let readers: Vec<Reader> = Reader::all().into_iter().filter(|r| *r != Reader::StreamWait).collect();
    writers.flat_map(|w| readers.iter().map(move |&r| (w, r))).collect()
}

fn spawn_writer(device: i32) -> Result<ChildProcess, MeasurementError> {
    let task = ChildTask::of(&sides::CoherencyTask::Writer { device })
        .map_err(|source| MeasurementError::Malformed { what: "coherency task".to_owned(), source })?;
    Ok(ChildProcess::spawn(&task, &[], Duration::from_secs(30))?)
}

fn expect_ready(child: &ChildProcess) -> Result<(), MeasurementError> {
    let reply: serde_json::Value = child.channel().recv_plain(Duration::from_secs(60))?;
    if let Ok(failure) = serde_json::from_value::<ChildFailure>(reply.clone()) {
        return Err(MeasurementError::Child { role: "coherency-writer".to_owned(), reason: failure.error });
    }
    match serde_json::from_value::<FromWriter>(reply) {
        Ok(FromWriter::Ready) => Ok(()),
        other => {
            Err(MeasurementError::Unexpected { peer: "coherency writer", expected: "ready", got: format!("{other:?}") })
        }
    }
}
/// The coherency probe, as [`crate::PROBES`] lists it.
#[derive(Debug, Clone, Copy)]
pub struct Coherency;

crate::probe::impl_probe!(Coherency {
    name: "coherency",
    title: "Cross-process coherency",
    question: "When does one process's write become visible to another process's polling kernel, and which loads and \
            fences are needed?",
    args: ProbeArgs,
    main: main,
    child: child,
    results: Results,
    section: report_section,
    verdict: verdict,
});
