//! What the overhead probe measured: memory kinds, measurements, comparisons, results.

use gpu_ipc::BackendKind;
use serde::{Deserialize, Serialize};

use harness::stats::Distribution;

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
    pub backend: BackendKind,
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
    pub backend: BackendKind,
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
    /// Whether the difference is a finding by `verdict::is_finding` (beyond twice the noise and at least 2%) in the
    /// version that recorded it; the verdict judges afresh.
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

pub(super) const KIB: u64 = 1024;
pub(super) const MIB: u64 = 1024 * KIB;
pub(super) const GIB: u64 = 1024 * MIB;
/// Bytes per chase element line: one u64 per 128-byte line, so every load touches a new line.
pub(super) const LINE: u64 = 128;

/// `bytes` in the largest binary unit that divides it: `4 KiB`, `64 MiB`, `1 GiB`.
pub(super) fn human(bytes: u64) -> String {
    if bytes >= GIB && bytes.is_multiple_of(GIB) {
        format!("{} GiB", bytes / GIB)
    } else if bytes >= MIB && bytes.is_multiple_of(MIB) {
        format!("{} MiB", bytes / MIB)
    } else {
        format!("{} KiB", bytes / KIB)
    }
}
