//! Tests of `model.rs` (kept apart so that the module reads in one screenful more).

use super::*;
use crate::crash::summary::*;
use gpu_ipc::BackendKind;

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

pub(crate) fn trial(backend: BackendKind, case: CrashCase, repetition: u32, point: MemoryReturn) -> TrialRecord {
    TrialRecord {
        backend,
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
    for backend in [BackendKind::Legacy, BackendKind::Vmm] {
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
            *t = TrialRecord::not_run(t.backend, t.case, t.repetition, &why);
        }
    }
    let settings = crate::crash::CrashSettings {
        repetitions: 3,
        allocation_bytes: 64 << 20,
        backends: vec![BackendKind::Legacy, BackendKind::Vmm],
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
        .find(|c| c.backend == BackendKind::Vmm && c.case == CrashCase::ImporterKillDuringGpuWait)
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
        v.answer.contains("broke a process that was never killed: CUDA_ERROR_ILLEGAL_ADDRESS (700) in the observer"),
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
        .find(|t| t.backend == BackendKind::Legacy && t.case == CrashCase::ImporterKillDuringGpuWait)
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
    let observer_setup =
        |detail: &str| Some(TrialFailure { kind: FailureKind::Setup, stage: "observer".into(), detail: detail.into() });
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
    let bad =
        trials.iter_mut().find(|t| t.backend == BackendKind::Legacy && t.case == CrashCase::ExporterKill).unwrap();
    let s = bad.survivor.as_mut().unwrap();
    s.data_mismatches = Some(17);
    s.write_error = Some("cuLaunchKernel: CUDA_ERROR_ILLEGAL_ADDRESS".into());
    s.write_mismatches = None;
    s.wait = Some(WaitOutcome::Stuck);
    // One hung child.
    let hung = trials.iter_mut().find(|t| t.backend == BackendKind::Vmm && t.case == CrashCase::ExporterExit).unwrap();
    hung.failure =
        Some(TrialFailure { kind: FailureKind::ChildHung, stage: "survivor checks".into(), detail: "30 s".into() });
    hung.survivor = None;
    let cells = summarize(&trials);
    assert_eq!(cells.len(), 10);
    let kill = cells.iter().find(|c| c.backend == BackendKind::Legacy && c.case == CrashCase::ExporterKill).unwrap();
    assert_eq!((kill.trials, kill.completed, kill.read_ok, kill.launch_ok), (3, 3, 3, 3));
    assert_eq!((kill.data_intact, kill.write_ok, kill.fully_usable), (2, 2, 2));
    assert_eq!(kill.waits(WaitOutcome::Released), 2);
    assert_eq!(kill.waits(WaitOutcome::Stuck), 1);
    assert_eq!(kill.returned(MemoryReturn::AfterSurvivorClose), 3);
    assert_eq!(kill.reap_ms.unwrap().max, 5.0);
    let exit = cells.iter().find(|c| c.backend == BackendKind::Vmm && c.case == CrashCase::ExporterExit).unwrap();
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
    for t in trials.iter_mut().filter(|t| t.backend == BackendKind::Vmm && t.case.exporter_dies()) {
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
