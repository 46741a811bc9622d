//! What the crash probe records: the cases, one record per trial, the survivor's and the observer's evidence (the
//! counts and the verdict drawn from them are in [`super::summary`]). Everything here is pure (no CUDA, no processes), so it is tested on hand-written
//! records and on recorded JSON.

use gpu_ipc::BackendKind;
use serde::{Deserialize, Serialize};

/// Which process dies, and what runs at that moment.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum CrashCase {
    /// The exporter calls `exit` without freeing anything (no destructor runs).
    ExporterExit,
    /// The parent sends the exporter SIGKILL.
    ExporterKill,
    /// The exporter is killed while the importer's kernel reads and rewrites the memory.
    ExporterKillDuringImporterKernel,
    /// The importer is killed while the exporter's kernel reads and rewrites the memory.
    ImporterKillDuringExporterKernel,
    /// The importer is killed while it holds GPU-side waits (a polling kernel and `cuStreamWaitValue64`) on a flag
    /// inside the shared memory.
    ImporterKillDuringGpuWait,
}

impl CrashCase {
    /// Every case, in the order the probe runs and reports them.
    pub const ALL: [CrashCase; 5] = [
        CrashCase::ExporterExit,
        CrashCase::ExporterKill,
        CrashCase::ExporterKillDuringImporterKernel,
        CrashCase::ImporterKillDuringExporterKernel,
        CrashCase::ImporterKillDuringGpuWait,
    ];

    /// True when the exporter is the process that dies (the importer survives).
    pub const fn exporter_dies(self) -> bool {
        matches!(self, Self::ExporterExit | Self::ExporterKill | Self::ExporterKillDuringImporterKernel)
    }

    /// True when the survivor runs the hammer kernel across the death.
    pub const fn survivor_hammers(self) -> bool {
        matches!(self, Self::ExporterKillDuringImporterKernel | Self::ImporterKillDuringExporterKernel)
    }

    /// True when the victim is killed while a kernel of its own runs on the shared memory: the most destructive
    /// case (under MPS it can fault the server for every client), so the probe runs these last.
    pub const fn kills_running_victim_kernel(self) -> bool {
        matches!(self, Self::ImporterKillDuringGpuWait)
    }

    /// The case as a sentence names what was done ("killing ...").
    pub const fn action(self) -> &'static str {
        match self {
            Self::ExporterExit => "letting the exporter exit without freeing",
            Self::ExporterKill => "killing the exporter",
            Self::ExporterKillDuringImporterKernel => {
                "killing the exporter while the importer's kernel ran on the shared memory"
            }
            Self::ImporterKillDuringExporterKernel => {
                "killing the importer while the exporter's kernel ran on the shared memory"
            }
            Self::ImporterKillDuringGpuWait => "killing an importer while its kernel waited on the shared memory",
        }
    }

    /// The case as a table row names it.
    pub const fn label(self) -> &'static str {
        match self {
            Self::ExporterExit => "exporter exits without freeing",
            Self::ExporterKill => "exporter SIGKILL",
            Self::ExporterKillDuringImporterKernel => "exporter SIGKILL during importer kernel",
            Self::ImporterKillDuringExporterKernel => "importer SIGKILL during exporter kernel",
            Self::ImporterKillDuringGpuWait => "importer SIGKILL holding GPU-side waits",
        }
    }
}

/// How a trial that did not run to the end failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum FailureKind {
    /// Starting, allocating, exporting or importing failed before the death (no crash was tested).
    Setup,
    /// A child did not answer within its deadline and was killed.
    ChildHung,
    /// A child reported an error or hung up after the death (a survivor that could not even report).
    SurvivorFailed,
    /// The victim did not exit after `exit` or SIGKILL within its deadline.
    VictimDidNotDie,
    /// Under MPS, after the death a process that was never killed (the observer, which never touches the shared
    /// memory) lost its CUDA context or stopped answering: the death faulted the MPS server, which tears down every
    /// client connected at that moment.
    MpsServerFault,
    /// Without MPS, the same: a process that was never killed lost its context after the death.
    ContextLost,
    /// Not run: an earlier fault left no working CUDA client, the case had already faulted the server, or the
    /// `--max-seconds` bound was reached (the detail says which).
    NotRun,
}

impl FailureKind {
    /// Every kind, in report order.
    pub const ALL: [FailureKind; 7] = [
        FailureKind::MpsServerFault,
        FailureKind::ContextLost,
        FailureKind::Setup,
        FailureKind::ChildHung,
        FailureKind::SurvivorFailed,
        FailureKind::VictimDidNotDie,
        FailureKind::NotRun,
    ];

    /// As a table column names it.
    pub const fn label(self) -> &'static str {
        match self {
            Self::Setup => "setup failed",
            Self::ChildHung => "child hung (killed)",
            Self::SurvivorFailed => "survivor failed",
            Self::VictimDidNotDie => "victim did not die",
            Self::MpsServerFault => "MPS server fault (every client lost its context)",
            Self::ContextLost => "a process that was not killed lost its context",
            Self::NotRun => "not run",
        }
    }

    /// A death that broke a process that was never killed: the fault reaches beyond the two processes.
    pub const fn is_fault(self) -> bool {
        matches!(self, Self::MpsServerFault | Self::ContextLost)
    }

    /// The fault kind for a run with or without MPS.
    pub const fn fault(mps: bool) -> Self {
        if mps { Self::MpsServerFault } else { Self::ContextLost }
    }
}

/// The CUDA error a message names (`CUDA_ERROR_ILLEGAL_ADDRESS (700)`), or the message itself, shortened.
pub fn error_name(detail: &str) -> String {
    if let Some(start) = detail.find("CUDA_ERROR_") {
        let rest = &detail[start..];
        let end = rest.find(|c: char| !(c.is_ascii_alphanumeric() || c == '_')).unwrap_or(rest.len());
        let code = rest[end..]
            .strip_prefix(" (")
            .and_then(|after| after.split_once(')'))
            .map(|(code, _)| code)
            .filter(|code| !code.is_empty() && code.chars().all(|c| c.is_ascii_digit()));
        return match code {
            Some(code) => format!("{} ({code})", &rest[..end]),
            None => rest[..end].to_owned(),
        };
    }
    let short: String = detail.chars().take(80).collect();
    if short.len() < detail.len() { format!("{short}...") } else { short }
}

/// Why a trial did not run to the end.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TrialFailure {
    /// The kind of failure.
    pub kind: FailureKind,
    /// The step it happened in (e.g. `import`, `survivor checks`).
    pub stage: String,
    /// What was said.
    pub detail: String,
}

/// How a GPU-side wait of the survivor on the flag in the shared memory ended after the death: the survivor
/// starts a polling kernel on the flag, then writes the flag from the host; the kernel should see it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum WaitOutcome {
    /// The kernel saw the flag and ended.
    Released,
    /// The kernel ran into its own `%globaltimer` deadline without seeing the flag.
    TimedOut,
    /// The kernel had not ended by the host's deadline (the GPU did not run it).
    Stuck,
    /// Launching, writing the flag or reading the result failed.
    Error,
    /// Not attempted (an earlier step left the survivor's stream unusable).
    NotRun,
}

/// What the survivor found after the death, all on the shared memory.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct SurvivorReport {
    /// Passes the hammer kernel completed across the death (cases where the survivor hammers).
    pub hammer_passes: Option<u64>,
    /// Words the hammer kernel found not holding the pattern while it ran across the death.
    pub hammer_mismatches: Option<u64>,
    /// The hammer kernel had not ended by the host's deadline.
    pub hammer_stuck: bool,
    /// The error of a host copy from the memory (`cuMemcpyDtoH` of a sample), `None` when it worked.
    pub read_error: Option<String>,
    /// Milliseconds the host copy took.
    pub read_ms: Option<f64>,
    /// Words of the host-copied sample that differ from the pattern.
    pub sample_mismatches: Option<u64>,
    /// The error of launching (and completing) the verify kernel, `None` when it worked.
    pub launch_error: Option<String>,
    /// Milliseconds from the survivor's first launch after the death to its completion.
    pub verify_ms: Option<f64>,
    /// Words of the whole pattern area that differ from the pattern written before the death (word by word).
    pub data_mismatches: Option<u64>,
    /// The error of rewriting the memory with a new pattern and verifying it, `None` when it worked.
    pub write_error: Option<String>,
    /// Milliseconds the rewrite and its verification took.
    pub write_ms: Option<f64>,
    /// Words that did not hold the new pattern after the rewrite.
    pub write_mismatches: Option<u64>,
    /// How the survivor's GPU-side wait on the shared flag ended.
    pub wait: Option<WaitOutcome>,
    /// Nanoseconds the wait kernel reported having waited, in milliseconds.
    pub wait_ms: Option<f64>,
    /// The error of the wait step, if any.
    pub wait_error: Option<String>,
}

impl SurvivorReport {
    /// The survivor could copy the memory to the host.
    pub fn read_ok(&self) -> bool {
        self.read_error.is_none() && self.read_ms.is_some()
    }

    /// A kernel on the memory launched and completed.
    pub fn launch_ok(&self) -> bool {
        self.launch_error.is_none() && self.data_mismatches.is_some()
    }

    /// Every word still held the pattern written before the death (the sample and the full kernel check), and the
    /// hammer, where it ran, found none changed.
    pub fn data_intact(&self) -> bool {
        self.data_mismatches == Some(0)
            && self.sample_mismatches == Some(0)
            && self.hammer_mismatches.is_none_or(|m| m == 0)
    }

    /// The survivor could rewrite the memory and read back what it wrote.
    pub fn write_ok(&self) -> bool {
        self.write_error.is_none() && self.write_mismatches == Some(0)
    }

    /// Read, launch, intact data and write all worked: the memory is fully usable after the death.
    pub fn fully_usable(&self) -> bool {
        self.read_ok() && self.launch_ok() && self.data_intact() && self.write_ok()
    }
}

/// One `cuMemGetInfo` / `nvidia-smi` reading of the observer.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct MemoryReading {
    /// Free device memory in bytes (`cuMemGetInfo` in the observer process).
    pub free_bytes: u64,
    /// `nvidia-smi --query-gpu=memory.used` in MiB, when `nvidia-smi` is on `PATH`.
    pub smi_used_mib: Option<u64>,
}

/// When the shared allocation's device memory was given back.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum MemoryReturn {
    /// When the victim died.
    AfterDeath,
    /// When the survivor dropped its mapping (or, for the exporter, its allocation).
    AfterSurvivorClose,
    /// Only when the survivor process exited.
    AfterSurvivorExit,
    /// Not within the observed window: the memory leaked (until the driver or a reboot reclaims it).
    Never,
}

impl MemoryReturn {
    /// Every point, in time order.
    pub const ALL: [MemoryReturn; 4] = [
        MemoryReturn::AfterDeath,
        MemoryReturn::AfterSurvivorClose,
        MemoryReturn::AfterSurvivorExit,
        MemoryReturn::Never,
    ];

    /// As a sentence names it.
    pub const fn label(self) -> &'static str {
        match self {
            Self::AfterDeath => "at the death",
            Self::AfterSurvivorClose => "when the survivor closed its mapping",
            Self::AfterSurvivorExit => "only when the survivor process exited",
            Self::Never => "never (within the observed window)",
        }
    }
}

/// The observer's free-memory readings around one trial. Each child's own CUDA context costs memory too, so the
/// allocation's share of each change is the change minus the contexts that came or went (each measured when the
/// child started).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MemoryTrace {
    /// Before either child started.
    pub base: MemoryReading,
    /// After the exporter created its context (no allocation yet).
    pub exporter_started: MemoryReading,
    /// After the importer created its context too.
    pub both_started: MemoryReading,
    /// After the allocation was made, exported and imported.
    pub shared: MemoryReading,
    /// After the victim was reaped and the free memory settled.
    pub after_death: MemoryReading,
    /// After the survivor dropped its mapping (its context still alive).
    pub after_close: Option<MemoryReading>,
    /// After the survivor exited.
    pub after_exit: Option<MemoryReading>,
    /// Milliseconds from the victim's reaping until the observer saw the allocation's memory come back, when it came
    /// back at the death.
    pub return_after_death_ms: Option<f64>,
}

impl MemoryTrace {
    /// Bytes the exporter's context took.
    pub fn exporter_context_bytes(&self) -> i64 {
        delta(self.base.free_bytes, self.exporter_started.free_bytes)
    }

    /// Bytes the importer's context took.
    pub fn importer_context_bytes(&self) -> i64 {
        delta(self.exporter_started.free_bytes, self.both_started.free_bytes)
    }

    /// Bytes the shared allocation (and the import's mapping) took.
    pub fn allocation_bytes(&self) -> i64 {
        delta(self.both_started.free_bytes, self.shared.free_bytes)
    }

    /// Bytes of the allocation given back at the death: the memory freed then, less the victim's context.
    pub fn returned_at_death_bytes(&self, case: CrashCase) -> i64 {
        let victim_context =
            if case.exporter_dies() { self.exporter_context_bytes() } else { self.importer_context_bytes() };
        delta(self.after_death.free_bytes, self.shared.free_bytes) - victim_context
    }

    /// Bytes given back when the survivor closed its mapping.
    pub fn returned_at_close_bytes(&self) -> Option<i64> {
        self.after_close.map(|c| delta(c.free_bytes, self.after_death.free_bytes))
    }

    /// Bytes of the allocation given back when the survivor exited: the memory freed then, less its context.
    pub fn returned_at_exit_bytes(&self, case: CrashCase) -> Option<i64> {
        let before = self.after_close.unwrap_or(self.after_death);
        let survivor_context =
            if case.exporter_dies() { self.importer_context_bytes() } else { self.exporter_context_bytes() };
        self.after_exit.map(|e| delta(e.free_bytes, before.free_bytes) - survivor_context)
    }

    /// When the allocation's memory came back: the first point at which at least half of it had (half, so that
    /// a few MiB of driver bookkeeping either way cannot change the answer). `None` when the allocation itself was
    /// too small to see.
    pub fn memory_return(&self, case: CrashCase) -> Option<MemoryReturn> {
        let allocation = self.allocation_bytes();
        if allocation <= 0 {
            return None;
        }
        let enough = |bytes: i64| bytes * 2 >= allocation;
        if enough(self.returned_at_death_bytes(case)) {
            Some(MemoryReturn::AfterDeath)
        } else if self.returned_at_close_bytes().is_some_and(enough) {
            Some(MemoryReturn::AfterSurvivorClose)
        } else if self.returned_at_exit_bytes(case).is_some_and(enough) {
            Some(MemoryReturn::AfterSurvivorExit)
        } else if self.after_exit.is_some() {
            Some(MemoryReturn::Never)
        } else {
            None
        }
    }
}

/// `later - earlier` of free memory readings, as a signed number of bytes freed (negative: memory was taken).
fn delta(later_free: u64, earlier_free: u64) -> i64 {
    (i128::from(later_free) - i128::from(earlier_free)).clamp(i128::from(i64::MIN), i128::from(i64::MAX)) as i64
}

/// Everything one trial recorded.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TrialRecord {
    /// `legacy` or `vmm`.
    pub backend: BackendKind,
    /// The case.
    pub case: CrashCase,
    /// The repetition, from 0.
    pub repetition: u32,
    /// Why it did not run to the end; `None` when it did.
    pub failure: Option<TrialFailure>,
    /// Milliseconds from `exit` or SIGKILL until the victim was reaped.
    pub victim_reap_ms: Option<f64>,
    /// The victim's importer-side check before the death: mismatched words right after the import.
    pub import_mismatches: Option<u64>,
    /// What the survivor found.
    pub survivor: Option<SurvivorReport>,
    /// The observer's readings.
    pub memory: Option<MemoryTrace>,
}

impl TrialRecord {
    /// A trial of the plan that was not started, with the reason.
    pub fn not_run(backend: BackendKind, case: CrashCase, repetition: u32, reason: &str) -> Self {
        Self {
            backend,
            case,
            repetition,
            failure: Some(TrialFailure {
                kind: FailureKind::NotRun,
                stage: "not run".into(),
                detail: reason.to_owned(),
            }),
            victim_reap_ms: None,
            import_mismatches: None,
            survivor: None,
            memory: None,
        }
    }

    /// The trial was started (it may still have failed).
    pub fn started(&self) -> bool {
        self.failure.as_ref().is_none_or(|f| f.kind != FailureKind::NotRun)
    }

    /// The trial's death broke a process that was never killed (an MPS server fault, or a lost context).
    pub fn faulted(&self) -> bool {
        self.failure.as_ref().is_some_and(|f| f.kind.is_fault())
    }
}

/// Reads trials recorded by an older probe, which had no fault outcome: its observer failing after the death (the
/// victim was already reaped) was recorded as a setup failure, and every later trial then failed in setup on the
/// dead observer ("peer hung up"). The first becomes a fault, the others not run. Trials of the current probe are
/// left as they are.
pub fn reinterpret_recorded(trials: &mut [TrialRecord], mps: bool) {
    let mut fault: Option<String> = None;
    for t in trials.iter_mut() {
        let Some(f) = t.failure.as_mut() else { continue };
        if f.kind != FailureKind::Setup || f.stage != "observer" {
            continue;
        }
        if t.victim_reap_ms.is_some() && fault.is_none() {
            f.kind = FailureKind::fault(mps);
            f.stage = "observer after the death".into();
            fault = Some(format!("{} {}", t.backend, t.case.label()));
        } else if let Some(origin) = &fault
            && f.detail.contains("hung up")
        {
            f.kind = FailureKind::NotRun;
            f.detail = format!(
                "the observer had lost its context in the fault of {origin}, and the older probe that recorded this \
                 run did not start a new one (it recorded these trials as setup failures: peer hung up)"
            );
            f.stage = "not run".into();
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
pub(crate) mod tests;
