//! Tests on a recorded run: `testdata/recorded-quick.json` holds a whole `--json` document (a quick pass on both
//! backends, with one hung survivor and VMM exporter deaths that return memory at the death). Regenerate it with
//! `cargo test -p gpu-ipc-probes write_recorded_fixture -- --ignored` after a schema change.

use super::*;
use crate::crash::model::tests::{healthy_run, trace};
use crate::crash::model::{FailureKind, TrialFailure};
use crate::crash::{CrashSettings, Results};
use gpu_ipc::BackendKind;
use harness::env::MeasurementEnv;

const RECORDED: &str = include_str!("../testdata/recorded-quick.json");

fn sample() -> MeasurementOutput<Results> {
    let mut trials = healthy_run(3);
    for t in trials.iter_mut().filter(|t| t.backend == BackendKind::Vmm && t.case.exporter_dies()) {
        t.memory = Some(trace(t.case, MemoryReturn::AfterDeath));
    }
    let hung = &mut trials[4];
    hung.failure = Some(TrialFailure {
        kind: FailureKind::ChildHung,
        stage: "survivor checks".into(),
        detail: "probe channel: recv timed out after 60s".into(),
    });
    hung.survivor = None;
    let settings = CrashSettings {
        repetitions: 3,
        allocation_bytes: 64 << 20,
        backends: vec![BackendKind::Legacy, BackendKind::Vmm],
        hammer_ms: 600,
        kill_after_ms: 300,
        nvidia_smi: true,
        max_seconds: None,
    };
    let results = Results::from_trials(settings, trials, None);
    let verdict = results.verdict(false);
    MeasurementOutput {
        probe: "crash".into(),
        schema: harness::SCHEMA_VERSION,
        quick: true,
        env: MeasurementEnv {
            devices: Vec::new(),
            driver: "13.0".into(),
            mps: false,
            date: "2026-11-23T04:00:00Z".into(),
            commit: "29468a6".into(),
            command: "gpu-ipc probe crash --quick --json".into(),
            host: "gpu-host".into(),
        },
        seconds: 61.5,
        results,
        verdict,
    }
}

#[test]
#[ignore = "writes the fixture; run by hand after a schema change"]
fn write_recorded_fixture() {
    let path = crate::probe::package_file("src/crash/testdata/recorded-quick.json");
    std::fs::write(path, serde_json::to_string_pretty(&sample()).unwrap() + "\n").unwrap();
}

#[test]
fn a_recorded_run_reads_back_and_its_counts_and_verdict_are_recomputed() {
    let output: MeasurementOutput<Results> = serde_json::from_str(RECORDED).unwrap();
    assert_eq!(output.results.cells, summary::summarize(&output.results.trials));
    assert_eq!(output.verdict, output.results.verdict(false));
    assert!(
        output.verdict.answer.starts_with("Partly: in 17 of 17 exporter deaths the importer kept reading"),
        "{}",
        output.verdict.answer
    );
    assert!(output.verdict.answer.contains("1 trials failed (1 with a hung child)"), "{}", output.verdict.answer);
    let text = render_text(&output);
    assert!(text.contains("failures of legacy / exporter SIGKILL:"), "{text}");
    assert!(text.contains("D3"), "{text}");
    let section = report_section(Some(&output), None, &mut Plots::default());
    assert!(section.body.contains("| vmm | exporter SIGKILL | 3 | 0 | 0 | 0 |"), "{}", section.body);
}
