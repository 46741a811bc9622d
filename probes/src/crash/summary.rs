//! What the crash probe concludes from its records: the counts and distributions per case and backend, the totals
//! per side of the question, and the verdict. Pure functions of [`TrialRecord`]s, tested on hand-written records
//! and on recorded JSON.

use gpu_ipc::BackendKind;
use serde::{Deserialize, Serialize};

use harness::Verdict;
use harness::stats::Distribution;

use super::model::{CrashCase, FailureKind, MemoryReturn, SurvivorReport, TrialRecord, WaitOutcome, error_name};

/// Counts and distributions of one case on one backend.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CellSummary {
    /// `legacy` or `vmm`.
    pub backend: BackendKind,
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
    let mut backends: Vec<BackendKind> = Vec::new();
    for t in trials {
        if !backends.contains(&t.backend) {
            backends.push(t.backend);
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

fn summarize_cell(backend: BackendKind, case: CrashCase, all: &[&TrialRecord]) -> CellSummary {
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
        backend,
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
