//! What the crash probe records and what it concludes: the cases, one record per trial, the counts per case and
//! backend, and the verdict. Everything here is pure (no CUDA, no processes), so it is tested on hand-written
//! records and on recorded JSON.

use serde::{Deserialize, Serialize};

use harness::Verdict;
use harness::stats::Distribution;

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
    pub backend: String,
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
    pub fn not_run(backend: &str, case: CrashCase, repetition: u32, reason: &str) -> Self {
        Self {
            backend: backend.to_owned(),
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

/// Counts and distributions of one case on one backend.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CellSummary {
    /// `legacy` or `vmm`.
    pub backend: String,
    /// The case.
    pub case: CrashCase,
    /// Trials started.
    pub trials: u64,
    /// Trials of the plan not started (see the run's `stopped` for why).
    #[serde(default)]
    pub not_run: u64,
    /// Trials whose death broke a process that was never killed (MPS server fault or lost context).
    #[serde(default)]
    pub faults: u64,
    /// The first such fault's error, as the observer (and the survivor) reported it.
    #[serde(default)]
    pub fault_detail: Option<String>,
    /// Trials that ran to the end (the survivor reported).
    pub completed: u64,
    /// Trials that failed, by kind (in [`FailureKind::ALL`] order; not-run trials are counted in `not_run`).
    pub failed: Vec<(FailureKind, u64)>,
    /// Up to three distinct failure messages, for the report.
    pub failure_examples: Vec<String>,
    /// The survivor could copy the memory to the host.
    pub read_ok: u64,
    /// A kernel on the memory launched and completed.
    pub launch_ok: u64,
    /// Every word still held the pattern written before the death.
    pub data_intact: u64,
    /// The survivor could rewrite the memory and verify it.
    pub write_ok: u64,
    /// All four of the above.
    pub fully_usable: u64,
    /// Trials with a hammer kernel across the death that finished and found no changed word.
    pub hammer_clean: u64,
    /// Trials with a hammer kernel that found changed words or never finished.
    pub hammer_bad: u64,
    /// How the survivor's GPU-side wait ended, per outcome (only outcomes that happened).
    pub wait: Vec<(WaitOutcome, u64)>,
    /// When the allocation's memory came back, per point (only points that happened).
    pub memory_return: Vec<(MemoryReturn, u64)>,
    /// Milliseconds from `exit`/SIGKILL until the victim was reaped.
    pub reap_ms: Option<Distribution>,
    /// Milliseconds from the reaping until the memory came back (trials where it came back at the death).
    pub return_after_death_ms: Option<Distribution>,
    /// MiB of the allocation given back at the death.
    pub returned_at_death_mib: Option<Distribution>,
    /// Milliseconds of the survivor's host copy.
    pub read_ms: Option<Distribution>,
    /// Milliseconds of the survivor's first kernel after the death.
    pub verify_ms: Option<Distribution>,
    /// Milliseconds of the survivor's rewrite and check.
    pub write_ms: Option<Distribution>,
    /// Milliseconds the survivor's wait kernel waited before it saw the flag.
    pub wait_ms: Option<Distribution>,
}

impl CellSummary {
    /// Trials that failed, all kinds together.
    pub fn failed_total(&self) -> u64 {
        self.failed.iter().map(|(_, n)| n).sum()
    }

    /// The count of trials whose memory came back at `point`.
    pub fn returned(&self, point: MemoryReturn) -> u64 {
        self.memory_return.iter().find(|(p, _)| *p == point).map_or(0, |(_, n)| *n)
    }

    /// The count of waits that ended with `outcome`.
    pub fn waits(&self, outcome: WaitOutcome) -> u64 {
        self.wait.iter().find(|(o, _)| *o == outcome).map_or(0, |(_, n)| *n)
    }
}

/// Groups `trials` by backend (in order of first appearance) and case (in [`CrashCase::ALL`] order), and counts.
pub fn summarize(trials: &[TrialRecord]) -> Vec<CellSummary> {
    let mut backends: Vec<&str> = Vec::new();
    for t in trials {
        if !backends.contains(&t.backend.as_str()) {
            backends.push(&t.backend);
        }
    }
    let mut cells = Vec::new();
    for backend in backends {
        for case in CrashCase::ALL {
            let group: Vec<&TrialRecord> = trials.iter().filter(|t| t.backend == backend && t.case == case).collect();
            if !group.is_empty() {
                cells.push(summarize_cell(backend, case, &group));
            }
        }
    }
    cells
}

fn summarize_cell(backend: &str, case: CrashCase, all: &[&TrialRecord]) -> CellSummary {
    let not_run = all.iter().filter(|t| !t.started()).count() as u64;
    let group: Vec<&TrialRecord> = all.iter().copied().filter(|t| t.started()).collect();
    let group = group.as_slice();
    let fault_detail =
        group.iter().filter_map(|t| t.failure.as_ref()).find(|f| f.kind.is_fault()).map(|f| f.detail.clone());
    let survivors: Vec<&SurvivorReport> =
        group.iter().filter(|t| t.failure.is_none()).filter_map(|t| t.survivor.as_ref()).collect();
    let count = |f: fn(&SurvivorReport) -> bool| survivors.iter().filter(|s| f(s)).count() as u64;
    let failed = FailureKind::ALL
        .iter()
        .filter(|k| **k != FailureKind::NotRun)
        .map(|&kind| (kind, group.iter().filter(|t| t.failure.as_ref().is_some_and(|f| f.kind == kind)).count() as u64))
        .filter(|(_, n)| *n > 0)
        .collect();
    let mut failure_examples: Vec<String> = Vec::new();
    for f in group.iter().filter_map(|t| t.failure.as_ref()) {
        let line = format!("{} ({}): {}", f.kind.label(), f.stage, f.detail);
        if failure_examples.len() < 3 && !failure_examples.contains(&line) {
            failure_examples.push(line);
        }
    }
    let hammered: Vec<&&SurvivorReport> =
        survivors.iter().filter(|s| s.hammer_passes.is_some() || s.hammer_stuck).collect();
    let hammer_clean = hammered.iter().filter(|s| !s.hammer_stuck && s.hammer_mismatches == Some(0)).count() as u64;
    let mut wait: Vec<(WaitOutcome, u64)> = Vec::new();
    for outcome in survivors.iter().filter_map(|s| s.wait) {
        tally(&mut wait, outcome);
    }
    let mut memory_return: Vec<(MemoryReturn, u64)> = Vec::new();
    let completed: Vec<&&TrialRecord> = group.iter().filter(|t| t.failure.is_none()).collect();
    for point in completed.iter().filter_map(|t| t.memory.as_ref().and_then(|m| m.memory_return(case))) {
        tally(&mut memory_return, point);
    }
    memory_return.sort_by_key(|(p, _)| MemoryReturn::ALL.iter().position(|q| q == p));
    let dist = |values: Vec<f64>| Distribution::from_samples(&mut { values });
    CellSummary {
        backend: backend.to_owned(),
        case,
        trials: group.len() as u64,
        not_run,
        faults: group.iter().filter(|t| t.faulted()).count() as u64,
        fault_detail,
        completed: completed.len() as u64,
        failed,
        failure_examples,
        read_ok: count(SurvivorReport::read_ok),
        launch_ok: count(SurvivorReport::launch_ok),
        data_intact: count(SurvivorReport::data_intact),
        write_ok: count(SurvivorReport::write_ok),
        fully_usable: count(SurvivorReport::fully_usable),
        hammer_clean,
        hammer_bad: hammered.len() as u64 - hammer_clean,
        wait,
        memory_return,
        reap_ms: dist(group.iter().filter_map(|t| t.victim_reap_ms).collect()),
        return_after_death_ms: dist(
            completed.iter().filter_map(|t| t.memory.as_ref().and_then(|m| m.return_after_death_ms)).collect(),
        ),
        returned_at_death_mib: dist(
            completed
                .iter()
                .filter_map(|t| t.memory.as_ref())
                .map(|m| m.returned_at_death_bytes(case) as f64 / MIB)
                .collect(),
        ),
        read_ms: dist(survivors.iter().filter_map(|s| s.read_ms).collect()),
        verify_ms: dist(survivors.iter().filter_map(|s| s.verify_ms).collect()),
        write_ms: dist(survivors.iter().filter_map(|s| s.write_ms).collect()),
        wait_ms: dist(
            survivors.iter().filter(|s| s.wait == Some(WaitOutcome::Released)).filter_map(|s| s.wait_ms).collect(),
        ),
    }
}

/// Bytes per MiB, as a float.
pub const MIB: f64 = 1024.0 * 1024.0;

fn tally<T: PartialEq>(counts: &mut Vec<(T, u64)>, value: T) {
    match counts.iter_mut().find(|(v, _)| *v == value) {
        Some((_, n)) => *n += 1,
        None => counts.push((value, 1)),
    }
}

/// The totals over one side of the question (exporter deaths or importer deaths), across backends and cases.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DeathTotals {
    /// Trials that ran to the end.
    pub completed: u64,
    /// Trials whose survivor found the memory fully usable (read, launch, intact data, write).
    pub usable: u64,
    /// Trials that failed (hung, setup, survivor failed, victim did not die).
    pub failed: u64,
}

/// Adds up the cells whose victim is the exporter (`exporter == true`) or the importer.
pub fn totals(cells: &[CellSummary], exporter: bool) -> DeathTotals {
    cells.iter().filter(|c| c.case.exporter_dies() == exporter).fold(DeathTotals::default(), |t, c| DeathTotals {
        completed: t.completed + c.completed,
        usable: t.usable + c.fully_usable,
        failed: t.failed + c.failed_total(),
    })
}

/// The most frequent memory-return point of exporter deaths, with its count and the number of trials classified.
pub fn dominant_exporter_return(cells: &[CellSummary]) -> Option<(MemoryReturn, u64, u64)> {
    let mut counts: Vec<(MemoryReturn, u64)> = Vec::new();
    for cell in cells.iter().filter(|c| c.case.exporter_dies()) {
        for &(point, n) in &cell.memory_return {
            match counts.iter_mut().find(|(p, _)| *p == point) {
                Some((_, m)) => *m += n,
                None => counts.push((point, n)),
            }
        }
    }
    let classified = counts.iter().map(|(_, n)| n).sum();
    counts.iter().max_by_key(|(_, n)| *n).map(|&(point, n)| (point, n, classified))
}

/// The finding of deaths that broke a process that was never killed, one clause per case, e.g. "under MPS,
/// killing an importer while its kernel waited on the shared memory broke the MPS server for every client:
/// CUDA_ERROR_ILLEGAL_ADDRESS (700) in the observer, a process that never touched the memory (legacy: 1 of 1 such
/// trials)". `None` when no trial faulted.
pub fn fault_finding(cells: &[CellSummary], mps: bool) -> Option<String> {
    let mut clauses = Vec::new();
    for case in CrashCase::ALL {
        let faulted: Vec<&CellSummary> = cells.iter().filter(|c| c.case == case && c.faults > 0).collect();
        let Some(first) = faulted.first() else { continue };
        let error = first.fault_detail.as_deref().map_or_else(|| "an error".to_owned(), error_name);
        let counts = faulted
            .iter()
            .map(|c| format!("{}: {} of {} such trials", c.backend, c.faults, c.trials))
            .collect::<Vec<_>>()
            .join(", ");
        clauses.push(if mps {
            format!(
                "under MPS, {} broke the MPS server for every client: {error} in the observer, a process that never \
                 touched the memory ({counts})",
                case.action()
            )
        } else {
            format!(
                "{} broke a process that was never killed: {error} in the observer, which never touched the memory \
                 ({counts})",
                case.action()
            )
        });
    }
    if clauses.is_empty() { None } else { Some(clauses.join("; ")) }
}

/// The verdict from the counts: never a fixed answer. "Yes" only when every completed trial on both sides left the
/// survivor with fully usable memory and none failed; "No" when no survivor ever did; "Partly" otherwise. A death
/// that broke a process that was never killed (under MPS: the server, for every client) comes first, in plain
/// words, with the number of trials that could not run after it; `stopped` is why trials were not run.
pub fn verdict(cells: &[CellSummary], mps: bool, stopped: Option<&str>) -> Verdict {
    let exporter = totals(cells, true);
    let importer = totals(cells, false);
    let failed = exporter.failed + importer.failed;
    let faults: u64 = cells.iter().map(|c| c.faults).sum();
    let hung: u64 = cells
        .iter()
        .flat_map(|c| &c.failed)
        .filter(|(k, _)| matches!(k, FailureKind::ChildHung | FailureKind::VictimDidNotDie))
        .map(|(_, n)| n)
        .sum();
    let started: u64 = cells.iter().map(|c| c.trials).sum();
    let not_run: u64 = cells.iter().map(|c| c.not_run).sum();
    let planned = started + not_run;
    let waits_released: u64 = cells.iter().map(|c| c.waits(WaitOutcome::Released)).sum();
    let waits: u64 = cells.iter().map(|c| c.wait.iter().map(|(_, n)| n).sum::<u64>()).sum();
    let memory = dominant_exporter_return(cells);
    let completed = exporter.completed + importer.completed;
    let finding = fault_finding(cells, mps);
    let why = stopped.or((faults > 0).then_some("a case that faulted is not repeated"));
    let not_run_clause = (not_run > 0).then(|| {
        format!(
            "{not_run} of {planned} trials of the pass could not run{}",
            why.map_or_else(String::new, |why| format!(" ({why})"))
        )
    });
    let fault_figure = if faults > 0 {
        let which = cells
            .iter()
            .filter(|c| c.faults > 0)
            .map(|c| format!("{} {}", c.backend, c.case.label()))
            .collect::<Vec<_>>()
            .join(", ");
        let name = if mps { "MPS server faults" } else { "lost contexts of processes not killed" };
        format!("{name}: {faults} ({which}); ")
    } else {
        String::new()
    };
    let run_figure = if not_run > 0 { format!("trials run: {started} of {planned}; ") } else { String::new() };
    if completed == 0 {
        let mut answer = format!("Unknown: no trial ran to the end ({failed} failed");
        if let Some(finding) = &finding {
            answer.push_str(&format!("; {finding}"));
        }
        if let Some(clause) = &not_run_clause {
            answer.push_str(&format!("; {clause}"));
        }
        answer.push_str("; see the failures per case)");
        return Verdict {
            answer,
            key_figure: format!("{fault_figure}{run_figure}trials completed: 0; failed: {failed}"),
        };
    }
    let word = if exporter.usable == exporter.completed && importer.usable == importer.completed && failed == 0 {
        "Yes"
    } else if exporter.usable == 0 && importer.usable == 0 {
        "No"
    } else {
        "Partly"
    };
    let mut answer = String::from(word);
    match &finding {
        Some(finding) => {
            answer.push_str(&format!(" \u{2014} {finding}"));
            if let Some(clause) = &not_run_clause {
                answer.push_str(&format!("; {clause}"));
            }
            answer.push_str(". Of the trials that ran to the end: in ");
        }
        None => answer.push_str(": in "),
    }
    answer.push_str(&format!(
        "{} of {} exporter deaths the importer kept reading, writing and launching on intact data, and in {} of {} \
         importer deaths the exporter did",
        exporter.usable, exporter.completed, importer.usable, importer.completed
    ));
    if let Some((point, n, classified)) = memory {
        answer.push_str(&format!(
            "; a dead exporter's memory was given back {} in {n} of {classified} trials",
            point.label()
        ));
    }
    let other_failed = failed - faults;
    if other_failed > 0 {
        let other = if faults > 0 { " other" } else { "" };
        answer.push_str(&format!("; {other_failed}{other} trials failed ({hung} with a hung child)"));
    }
    if finding.is_none()
        && let Some(clause) = &not_run_clause
    {
        answer.push_str(&format!("; {clause}"));
    }
    answer.push('.');
    let memory_figure = memory.map_or_else(
        || "memory return: not measured".to_owned(),
        |(point, n, classified)| format!("memory returned {}: {n}/{classified}", point.label()),
    );
    Verdict {
        answer,
        key_figure: format!(
            "{fault_figure}{run_figure}survivor fully usable: {}/{} exporter deaths, {}/{} importer deaths; survivor \
             waits released: {waits_released}/{waits}; {memory_figure}",
            exporter.usable, exporter.completed, importer.usable, importer.completed
        ),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
pub(crate) mod tests {
    use super::*;

    const GIB: u64 = 1 << 30;
    const CTX: u64 = 500 << 20;
    const ALLOC: u64 = 64 << 20;

    fn reading(free_bytes: u64) -> MemoryReading {
        MemoryReading { free_bytes, smi_used_mib: Some(0) }
    }

    /// A trace where the allocation comes back at `point`.
    pub(crate) fn trace(case: CrashCase, point: MemoryReturn) -> MemoryTrace {
        let base = 80 * GIB;
        let both = base - 2 * CTX;
        let shared = both - ALLOC;
        let after_death = shared + CTX + if point == MemoryReturn::AfterDeath { ALLOC } else { 0 } + (1 << 20);
        let after_close = after_death + if point == MemoryReturn::AfterSurvivorClose { ALLOC } else { 0 };
        let after_exit = after_close + CTX + if point == MemoryReturn::AfterSurvivorExit { ALLOC } else { 0 };
        let _ = case;
        MemoryTrace {
            base: reading(base),
            exporter_started: reading(base - CTX),
            both_started: reading(both),
            shared: reading(shared),
            after_death: reading(after_death),
            after_close: Some(reading(after_close)),
            after_exit: Some(reading(after_exit)),
            return_after_death_ms: (point == MemoryReturn::AfterDeath).then_some(12.0),
        }
    }

    pub(crate) fn healthy_survivor(case: CrashCase) -> SurvivorReport {
        SurvivorReport {
            hammer_passes: case.survivor_hammers().then_some(5000),
            hammer_mismatches: case.survivor_hammers().then_some(0),
            hammer_stuck: false,
            read_error: None,
            read_ms: Some(0.4),
            sample_mismatches: Some(0),
            launch_error: None,
            verify_ms: Some(0.1),
            data_mismatches: Some(0),
            write_error: None,
            write_ms: Some(0.2),
            write_mismatches: Some(0),
            wait: Some(WaitOutcome::Released),
            wait_ms: Some(0.05),
            wait_error: None,
        }
    }

    pub(crate) fn trial(backend: &str, case: CrashCase, repetition: u32, point: MemoryReturn) -> TrialRecord {
        TrialRecord {
            backend: backend.to_owned(),
            case,
            repetition,
            failure: None,
            victim_reap_ms: Some(3.0 + f64::from(repetition)),
            import_mismatches: Some(0),
            survivor: Some(healthy_survivor(case)),
            memory: Some(trace(case, point)),
        }
    }

    /// Every case on both backends, `reps` times, all healthy; exporter deaths return memory at survivor close.
    pub(crate) fn healthy_run(reps: u32) -> Vec<TrialRecord> {
        let mut trials = Vec::new();
        for backend in ["legacy", "vmm"] {
            for case in CrashCase::ALL {
                for rep in 0..reps {
                    trials.push(trial(backend, case, rep, MemoryReturn::AfterSurvivorClose));
                }
            }
        }
        trials
    }

    /// The observer's error of run 2's MPS fault, as the current probe records it (with the survivor's).
    pub(crate) const FAULT_DETAIL: &str = "observer: cuMemGetInfo failed: CUDA_ERROR_ILLEGAL_ADDRESS (700): an illegal \
        memory access was encountered; survivor: host read: cuMemcpyDtoH failed: CUDA_ERROR_ILLEGAL_ADDRESS (700): \
        an illegal memory access was encountered";

    /// A quick pass under MPS as the current probe runs it: the first trial of the case that kills a victim holding
    /// a wait faults the server on each backend, and its other two repetitions are not run.
    pub(crate) fn mps_fault_run() -> crate::crash::Results {
        let mut trials = healthy_run(3);
        for t in trials.iter_mut().filter(|t| t.case == CrashCase::ImporterKillDuringGpuWait) {
            if t.repetition == 0 {
                t.failure = Some(TrialFailure {
                    kind: FailureKind::MpsServerFault,
                    stage: "observer after the death".into(),
                    detail: FAULT_DETAIL.into(),
                });
                t.memory = None;
            } else {
                let why = format!("not repeated: its first trial ({}, repetition 0) faulted the MPS server", t.backend);
                *t = TrialRecord::not_run(&t.backend.clone(), t.case, t.repetition, &why);
            }
        }
        let settings = crate::crash::CrashSettings {
            repetitions: 3,
            allocation_bytes: 64 << 20,
            backends: vec!["legacy".into(), "vmm".into()],
            hammer_ms: 400,
            kill_after_ms: 150,
            nvidia_smi: true,
            max_seconds: None,
        };
        crate::crash::Results::from_trials(settings, trials, None)
    }

    #[test]
    fn cuda_errors_are_named_by_their_code() {
        assert_eq!(error_name(FAULT_DETAIL), "CUDA_ERROR_ILLEGAL_ADDRESS (700)");
        assert_eq!(error_name("x: CUDA_ERROR_LAUNCH_FAILED: boom"), "CUDA_ERROR_LAUNCH_FAILED");
        assert_eq!(error_name("probe channel: peer hung up"), "probe channel: peer hung up");
        assert_eq!(error_name(&"y".repeat(100)).len(), 83);
    }

    #[test]
    fn an_mps_fault_is_its_own_outcome_and_comes_first_in_the_verdict() {
        let results = mps_fault_run();
        let cell = results
            .cells
            .iter()
            .find(|c| c.backend == "vmm" && c.case == CrashCase::ImporterKillDuringGpuWait)
            .unwrap();
        assert_eq!((cell.trials, cell.not_run, cell.faults, cell.completed), (1, 2, 1, 0));
        assert_eq!(cell.failed, vec![(FailureKind::MpsServerFault, 1)]);
        assert_eq!(cell.failed_total(), 1);
        assert_eq!(cell.fault_detail.as_deref(), Some(FAULT_DETAIL));
        let v = verdict(&results.cells, true, None);
        assert!(
            v.answer.starts_with(
                "Partly \u{2014} under MPS, killing an importer while its kernel waited on the shared memory broke the \
                 MPS server for every client: CUDA_ERROR_ILLEGAL_ADDRESS (700) in the observer, a process that never \
                 touched the memory (legacy: 1 of 1 such trials, vmm: 1 of 1 such trials); 4 of 30 trials of the pass \
                 could not run (a case that faulted is not repeated). Of the trials that ran to the end: in 18 of 18 exporter deaths"
            ),
            "{}",
            v.answer
        );
        assert!(v.answer.contains("and in 6 of 6 importer deaths the exporter did"), "{}", v.answer);
        assert!(!v.answer.contains("trials failed"), "{}", v.answer);
        assert!(v.key_figure.starts_with("MPS server faults: 2 (legacy importer SIGKILL holding GPU-side waits, vmm importer SIGKILL holding GPU-side waits); trials run: 26 of 30; survivor fully usable: 18/18"), "{}", v.key_figure);
        // Without MPS the same records name a lost context, not the server.
        let v = verdict(&results.cells, false, None);
        assert!(
            v.answer
                .contains("broke a process that was never killed: CUDA_ERROR_ILLEGAL_ADDRESS (700) in the observer"),
            "{}",
            v.answer
        );
        assert!(v.key_figure.starts_with("lost contexts of processes not killed: 2"), "{}", v.key_figure);
    }

    #[test]
    fn a_fault_is_never_a_yes_and_everything_faulted_is_unknown_with_the_finding() {
        let mut trials = healthy_run(1);
        trials.retain(|t| t.case == CrashCase::ImporterKillDuringGpuWait);
        for t in &mut trials {
            t.failure = Some(TrialFailure {
                kind: FailureKind::MpsServerFault,
                stage: "observer after the death".into(),
                detail: FAULT_DETAIL.into(),
            });
        }
        let v = verdict(
            &summarize(&trials),
            true,
            Some("after the fault, a new CUDA client (the observer) could not start: x"),
        );
        assert!(
            v.answer.starts_with("Unknown: no trial ran to the end (2 failed; under MPS, killing an importer"),
            "{}",
            v.answer
        );
        // One healthy trial beside a fault: "Partly", never "Yes".
        let mut trials = healthy_run(1);
        let t = trials
            .iter_mut()
            .find(|t| t.backend == "legacy" && t.case == CrashCase::ImporterKillDuringGpuWait)
            .unwrap();
        t.failure = Some(TrialFailure {
            kind: FailureKind::MpsServerFault,
            stage: "observer after the death".into(),
            detail: FAULT_DETAIL.into(),
        });
        let v = verdict(&summarize(&trials), true, None);
        assert!(v.answer.starts_with("Partly \u{2014} under MPS"), "{}", v.answer);
    }

    #[test]
    fn old_records_of_a_fault_are_reinterpreted_and_new_ones_left_alone() {
        let mut trials = healthy_run(1);
        let observer_setup = |detail: &str| {
            Some(TrialFailure { kind: FailureKind::Setup, stage: "observer".into(), detail: detail.into() })
        };
        // Before any death: a setup failure of the observer stays one.
        trials[0].failure = observer_setup("probe channel: peer hung up during send");
        trials[0].victim_reap_ms = None;
        trials[1].failure = observer_setup("cuMemGetInfo failed: CUDA_ERROR_ILLEGAL_ADDRESS (700)");
        trials[2].failure = observer_setup("probe channel: peer hung up during send");
        trials[2].victim_reap_ms = None;
        let mut fresh = mps_fault_run().trials;
        let unchanged = fresh.clone();
        reinterpret_recorded(&mut trials, true);
        reinterpret_recorded(&mut fresh, true);
        assert_eq!(fresh, unchanged);
        assert_eq!(trials[0].failure.as_ref().unwrap().kind, FailureKind::Setup);
        assert_eq!(trials[1].failure.as_ref().unwrap().kind, FailureKind::MpsServerFault);
        assert_eq!(trials[2].failure.as_ref().unwrap().kind, FailureKind::NotRun);
        assert!(trials[2].failure.as_ref().unwrap().detail.contains("in the fault of legacy exporter SIGKILL"));
        assert!(!trials[2].started() && trials[1].started() && trials[1].faulted());
    }

    #[test]
    fn memory_return_points_are_told_apart_net_of_the_contexts() {
        for case in CrashCase::ALL {
            for point in MemoryReturn::ALL {
                let t = trace(case, point);
                assert_eq!(t.allocation_bytes(), ALLOC as i64);
                assert_eq!(t.memory_return(case), Some(point), "{case:?} {point:?}");
            }
        }
        let t = trace(CrashCase::ExporterKill, MemoryReturn::AfterDeath);
        assert_eq!(t.returned_at_death_bytes(CrashCase::ExporterKill), (ALLOC + (1 << 20)) as i64);
    }

    #[test]
    fn memory_return_without_an_exit_reading_is_unknown_unless_seen_earlier() {
        let mut t = trace(CrashCase::ExporterKill, MemoryReturn::Never);
        t.after_exit = None;
        assert_eq!(t.memory_return(CrashCase::ExporterKill), None);
        let mut t = trace(CrashCase::ExporterKill, MemoryReturn::AfterSurvivorClose);
        t.after_exit = None;
        assert_eq!(t.memory_return(CrashCase::ExporterKill), Some(MemoryReturn::AfterSurvivorClose));
    }

    #[test]
    fn cells_count_every_outcome() {
        let mut trials = healthy_run(3);
        // One legacy exporter-kill trial: data changed, write failed, wait stuck.
        let bad = trials.iter_mut().find(|t| t.backend == "legacy" && t.case == CrashCase::ExporterKill).unwrap();
        let s = bad.survivor.as_mut().unwrap();
        s.data_mismatches = Some(17);
        s.write_error = Some("cuLaunchKernel: CUDA_ERROR_ILLEGAL_ADDRESS".into());
        s.write_mismatches = None;
        s.wait = Some(WaitOutcome::Stuck);
        // One hung child.
        let hung = trials.iter_mut().find(|t| t.backend == "vmm" && t.case == CrashCase::ExporterExit).unwrap();
        hung.failure =
            Some(TrialFailure { kind: FailureKind::ChildHung, stage: "survivor checks".into(), detail: "30 s".into() });
        hung.survivor = None;
        let cells = summarize(&trials);
        assert_eq!(cells.len(), 10);
        let kill = cells.iter().find(|c| c.backend == "legacy" && c.case == CrashCase::ExporterKill).unwrap();
        assert_eq!((kill.trials, kill.completed, kill.read_ok, kill.launch_ok), (3, 3, 3, 3));
        assert_eq!((kill.data_intact, kill.write_ok, kill.fully_usable), (2, 2, 2));
        assert_eq!(kill.waits(WaitOutcome::Released), 2);
        assert_eq!(kill.waits(WaitOutcome::Stuck), 1);
        assert_eq!(kill.returned(MemoryReturn::AfterSurvivorClose), 3);
        assert_eq!(kill.reap_ms.unwrap().max, 5.0);
        let exit = cells.iter().find(|c| c.backend == "vmm" && c.case == CrashCase::ExporterExit).unwrap();
        assert_eq!((exit.trials, exit.completed, exit.failed_total()), (3, 2, 1));
        assert_eq!(exit.failed, vec![(FailureKind::ChildHung, 1)]);
        assert_eq!(exit.failure_examples, vec!["child hung (killed) (survivor checks): 30 s".to_owned()]);
        let hammer = cells.iter().find(|c| c.case == CrashCase::ImporterKillDuringExporterKernel).unwrap();
        assert_eq!((hammer.hammer_clean, hammer.hammer_bad), (3, 0));
        assert_eq!(cells.iter().find(|c| c.case == CrashCase::ExporterKill).unwrap().hammer_clean, 0);
    }

    #[test]
    fn verdict_yes_only_when_every_trial_is_clean() {
        let cells = summarize(&healthy_run(4));
        let v = verdict(&cells, false, None);
        assert!(v.answer.starts_with("Yes: in 24 of 24 exporter deaths"), "{}", v.answer);
        assert!(v.answer.contains("and in 16 of 16 importer deaths"), "{}", v.answer);
        assert!(v.answer.contains("when the survivor closed its mapping in 24 of 24 trials"), "{}", v.answer);
        assert!(!v.answer.contains("failed"));
        assert!(v.key_figure.contains("survivor waits released: 40/40"), "{}", v.key_figure);
    }

    #[test]
    fn verdict_partly_with_a_failure_and_dominant_memory_point() {
        let mut trials = healthy_run(2);
        for t in trials.iter_mut().filter(|t| t.backend == "vmm" && t.case.exporter_dies()) {
            t.memory = Some(trace(t.case, MemoryReturn::AfterDeath));
        }
        trials[0].failure =
            Some(TrialFailure { kind: FailureKind::VictimDidNotDie, stage: "death".into(), detail: "5 s".into() });
        let v = verdict(&summarize(&trials), false, None);
        assert!(v.answer.starts_with("Partly: in 11 of 11 exporter deaths"), "{}", v.answer);
        // 5 legacy exporter deaths returned at close, 6 vmm at the death.
        assert!(v.answer.contains("at the death in 6 of 11 trials"), "{}", v.answer);
        assert!(v.answer.contains("1 trials failed (1 with a hung child)"), "{}", v.answer);
    }

    #[test]
    fn verdict_no_and_unknown() {
        let mut trials = healthy_run(1);
        for t in &mut trials {
            t.survivor.as_mut().unwrap().read_error = Some("cuMemcpyDtoH: CUDA_ERROR_ILLEGAL_ADDRESS".into());
        }
        assert!(verdict(&summarize(&trials), false, None).answer.starts_with("No: in 0 of 6 exporter deaths"));
        for t in &mut trials {
            t.failure = Some(TrialFailure { kind: FailureKind::Setup, stage: "import".into(), detail: "x".into() });
        }
        let v = verdict(&summarize(&trials), false, None);
        assert!(v.answer.starts_with("Unknown: no trial ran to the end (10 failed"), "{}", v.answer);
    }
}
