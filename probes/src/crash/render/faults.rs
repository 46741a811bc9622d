//! Tests of `render.rs`.

use super::*;
use crate::crash::model::CrashCase;
use crate::crash::model::tests::mps_fault_run;
use crate::crash::{CrashSettings, Results};
use gpu_ipc::BackendKind;

fn output(results: Results, mps: bool, seconds: f64) -> MeasurementOutput<Results> {
    super::tests::output_taking(results, mps, seconds)
}

/// The MPS pass of run 2 (H100, driver 580, CUDA 13.0, quick), as the probe of that time recorded it: the
/// first `importer-kill-during-gpu-wait` trial's observer got error 700 after the death (a setup failure then),
/// and every later trial failed in setup on the dead observer.
const RUN2_MPS: &str = include_str!("../testdata/run2-crash-mps.json");

#[test]
fn the_recorded_mps_fault_of_run_2_is_reported_as_a_fault_with_the_trials_that_could_not_run() {
    let recorded: MeasurementOutput<Results> = serde_json::from_str(RUN2_MPS).unwrap();
    assert!(recorded.env.mps);
    // As recorded: "Partly" with 18 setup failures, the fault not named.
    assert!(recorded.verdict.answer.starts_with("Partly: in 9 of 9"), "{}", recorded.verdict.answer);
    let results = recorded.results.normalized(true);
    let gpu_wait = results
        .cells
        .iter()
        .find(|c| c.backend == BackendKind::Legacy && c.case == CrashCase::ImporterKillDuringGpuWait);
    let gpu_wait = gpu_wait.unwrap();
    assert_eq!((gpu_wait.trials, gpu_wait.faults, gpu_wait.not_run, gpu_wait.completed), (1, 1, 2, 0));
    assert!(gpu_wait.fault_detail.as_deref().unwrap().contains("CUDA_ERROR_ILLEGAL_ADDRESS (700)"));
    assert!(results.cells.iter().filter(|c| c.backend == BackendKind::Vmm).all(|c| c.trials == 0 && c.not_run == 3));
    let v = results.verdict(true);
    assert!(
        v.answer.starts_with(
            "Partly \u{2014} under MPS, killing an importer while its kernel waited on the shared memory broke the \
             MPS server for every client: CUDA_ERROR_ILLEGAL_ADDRESS (700) in the observer, a process that never \
             touched the memory (legacy: 1 of 1 such trials); 17 of 30 trials of the pass could not run (the \
             observer had lost its context"
        ),
        "{}",
        v.answer
    );
    assert!(v.answer.contains("Of the trials that ran to the end: in 9 of 9 exporter deaths"), "{}", v.answer);
    assert!(!v.answer.contains("trials failed"), "{}", v.answer);
    assert!(
        v.key_figure.starts_with(
            "MPS server faults: 1 (legacy importer SIGKILL holding GPU-side waits); trials run: 13 of 30;"
        ),
        "{}",
        v.key_figure
    );

    let section = report_section(None, Some(&recorded), &mut Plots::default());
    assert!(
        section.answer.starts_with("with MPS: Partly \u{2014} under MPS, killing an importer"),
        "{}",
        section.answer
    );
    assert!(section.body.contains("**MPS server fault.** Under MPS, killing an importer"), "{}", section.body);
    assert!(
        section.body.contains("Trials run: 13 of 30; 17 not run (stopped: the observer had lost its context in the fault of legacy importer SIGKILL holding GPU-side waits, and the older probe"),
        "{}",
        section.body
    );
    assert!(
        section
            .body
            .contains("| vmm | exporter exits without freeing | 0 | 3 | 0 | 0 | 0 | 0 | 0 | - | 0 / 0 / 0 / 0 | 0 |"),
        "{}",
        section.body
    );
    assert!(
        section.body.contains("| legacy | importer SIGKILL holding GPU-side waits | 1 | 2 | 0 |"),
        "{}",
        section.body
    );
    assert!(section.body.contains("1 MPS server fault (every client lost its context)"), "{}", section.body);
    assert!(!section.body.contains("also not run"), "{}", section.body);
}

#[test]
fn a_fault_recorded_by_the_current_probe_is_stated_first_in_text_and_report() {
    let out = output(mps_fault_run(), true, 190.0);
    assert!(out.verdict.answer.starts_with("Partly \u{2014} under MPS,"), "{}", out.verdict.answer);
    let text = render_text(&out);
    assert!(text.contains("trials run: 26 of 30; 4 not run"), "{text}");
    assert!(
        text.contains("also not run: not repeated: its first trial (legacy, repetition 0) faulted the MPS server"),
        "{text}"
    );
    let section = report_section(None, Some(&out), &mut Plots::default());
    assert!(
        section.body.contains("- legacy / importer SIGKILL holding GPU-side waits (repetition 0), observer after the death: `observer: cuMemGetInfo failed: CUDA_ERROR_ILLEGAL_ADDRESS (700)"),
        "{}",
        section.body
    );
    // Reading the current probe's JSON back changes nothing.
    let back: MeasurementOutput<Results> = serde_json::from_str(&serde_json::to_string(&out).unwrap()).unwrap();
    assert_eq!(back.results.normalized(true), out.results);
}

#[test]
fn a_pass_cut_by_max_seconds_says_how_many_ran() {
    let mut trials = crate::crash::model::tests::healthy_run(3);
    let reason = "--max-seconds 10 reached after 25 of 30 trials";
    for t in trials.iter_mut().rev().take(5) {
        *t = model::TrialRecord::not_run(t.backend, t.case, t.repetition, reason);
    }
    let settings = CrashSettings {
        repetitions: 3,
        allocation_bytes: 64 << 20,
        backends: vec![BackendKind::Legacy, BackendKind::Vmm],
        hammer_ms: 400,
        kill_after_ms: 150,
        nvidia_smi: true,
        max_seconds: Some(10),
    };
    let out = output(Results::from_trials(settings, trials, Some(reason.into())), false, 10.5);
    assert!(out.verdict.answer.starts_with("Yes: in 18 of 18 exporter deaths"), "{}", out.verdict.answer);
    assert!(
        out.verdict
            .answer
            .ends_with("; 5 of 30 trials of the pass could not run (--max-seconds 10 reached after 25 of 30 trials)."),
        "{}",
        out.verdict.answer
    );
    assert!(out.verdict.key_figure.starts_with("trials run: 25 of 30; "), "{}", out.verdict.key_figure);
    let text = render_text(&out);
    assert!(text.contains("trials run: 25 of 30; 5 not run (stopped: --max-seconds 10"), "{text}");
    assert!(!text.contains("also not run"), "{text}");
    let section = report_section(Some(&out), None, &mut Plots::default());
    assert!(section.body.contains("(for 400 ms, killed 150 ms in)"), "{}", section.body);
}
