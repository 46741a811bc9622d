//! Tests of `render.rs`.

use super::*;
use crate::crash::model::FailureKind;
use crate::crash::model::tests::healthy_run;
use crate::crash::{CrashSettings, Results};
use gpu_ipc::BackendKind;
use harness::env::MeasurementEnv;

fn output(results: Results, mps: bool) -> MeasurementOutput<Results> {
    output_taking(results, mps, 42.0)
}

/// A recorded-looking document of `results`, as the probe would write it after `seconds`.
pub(super) fn output_taking(results: Results, mps: bool, seconds: f64) -> MeasurementOutput<Results> {
    let verdict = results.verdict(mps);
    MeasurementOutput {
        probe: "crash".into(),
        schema: harness::SCHEMA_VERSION,
        quick: true,
        env: MeasurementEnv {
            devices: Vec::new(),
            driver: "13.0".into(),
            mps,
            date: "2026-11-23T04:00:00Z".into(),
            commit: "abc1234".into(),
            command: "gpu-ipc probe crash --quick".into(),
            host: "h100".into(),
        },
        seconds,
        results,
        verdict,
    }
}

fn settings() -> CrashSettings {
    CrashSettings {
        repetitions: 3,
        allocation_bytes: 64 << 20,
        backends: vec![BackendKind::Legacy, BackendKind::Vmm],
        hammer_ms: 600,
        kill_after_ms: 300,
        nvidia_smi: true,
        max_seconds: None,
    }
}

#[test]
fn text_shows_the_verdict_and_every_cell() {
    let out = output(Results::from_trials(settings(), healthy_run(3), None), false);
    let text = render_text(&out);
    assert!(text.contains("Yes: in 18 of 18 exporter deaths"), "{text}");
    assert_eq!(text.matches("exporter SIGKILL during importer kernel").count(), 4, "{text}");
    assert!(text.contains("C3"), "{text}");
    assert!(text.contains(" 3/3 "), "{text}");
}

#[test]
fn report_section_has_both_runs_tables_and_method() {
    let out = output(Results::from_trials(settings(), healthy_run(3), None), false);
    let with_mps = output(Results::from_trials(settings(), healthy_run(2), None), true);
    let section = report_section(Some(&out), Some(&with_mps), &mut Plots::default());
    assert_eq!(section.question, QUESTION);
    assert!(section.answer.starts_with("without MPS: Yes: in 18 of 18"), "{}", section.answer);
    assert!(section.answer.contains("with MPS: Yes: in 12 of 12"), "{}", section.answer);
    assert!(section.body.contains("### without MPS"));
    assert!(section.body.contains("### with MPS"));
    assert!(
        section.body.contains(
            "| legacy | importer SIGKILL holding GPU-side waits | 3 | 0 | 3 | 3 | 3 | 3 | 3 | - | 3 / 0 / 0 / 0 | 0 |"
        ),
        "{}",
        section.body
    );
    assert!(section.body.contains("**Method.**"));
    assert!(section.body.contains("(for 600 ms, killed 300 ms in)"), "{}", section.body);
    assert!(section.body.contains("Trials run: all 30 of the plan."), "{}", section.body);
    assert!(!section.body.contains("MPS server fault"), "{}", section.body);
    let missing = report_section(None, None, &mut Plots::default());
    assert_eq!(missing, ReportSection::missing("crash"));
}

#[test]
fn failures_are_listed() {
    let mut trials = healthy_run(1);
    trials[0].failure = Some(model::TrialFailure {
        kind: FailureKind::ChildHung,
        stage: "survivor checks".into(),
        detail: "timed out after 60s".into(),
    });
    let out = output(Results::from_trials(settings(), trials, None), false);
    let text = render_text(&out);
    assert!(text.contains("failures of legacy / exporter exits without freeing:"), "{text}");
    let section = report_section(Some(&out), None, &mut Plots::default());
    assert!(section.body.contains("1 child hung (killed)"), "{}", section.body);
    assert!(section.answer.starts_with("without MPS: Partly"), "{}", section.answer);
}
