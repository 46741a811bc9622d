//! Tests of `render.rs` (kept apart so that the module reads in one screenful more).

use std::path::PathBuf;

use super::*;
use crate::probe::package_file;
use crate::report::load::{SectionSource, load_inputs, read_run_log};
use harness::process::PrivateDir;
use harness::{plot, report::Series};

/// The recorded documents: overhead and coherency in both passes, vmm-compat without MPS only (its MPS run
/// timed out), crash's document without MPS truncated (its run failed) and its MPS run missing.
pub(crate) fn testdata() -> PathBuf {
    package_file("src/report/testdata")
}

/// Stand-in sections: overhead asks for a chart, coherency renders the stub, vmm-compat panics, crash writes
/// a normal section.
struct FakeSections;

impl SectionSource for FakeSections {
    fn section(
        &self,
        probe: ProbeName,
        no_mps: Option<&MeasurementOutput<Value>>,
        mps: Option<&MeasurementOutput<Value>>,
        plots: &mut Plots,
        problems: &mut Vec<String>,
    ) -> ReportSection {
        match probe.name() {
            "overhead" => {
                let points = |doc: Option<&MeasurementOutput<Value>>| -> Vec<(f64, f64)> {
                    doc.and_then(|d| d.results["read_gbps"].as_array().cloned())
                        .unwrap_or_default()
                        .iter()
                        .map(|p| (p[0].as_f64().unwrap(), p[1].as_f64().unwrap()))
                        .collect()
                };
                let chart = plots.line_chart(LineChart {
                    file_stem: "overhead-read".into(),
                    title: "Read bandwidth, own vs imported memory".into(),
                    x_label: "buffer size (MiB)".into(),
                    y_label: "GB/s".into(),
                    x_log: true,
                    y_log: false,
                    series: vec![
                        Series { name: "without MPS".into(), points: points(no_mps) },
                        Series { name: "under MPS".into(), points: points(mps) },
                    ],
                });
                ReportSection {
                    probe: "overhead".into(),
                    question: "Is imported memory slower?".into(),
                    answer: "No: imported memory reads at the same speed (largest difference -0.4%, noise 1.2%)".into(),
                    body: format!("| size | local | imported |\n|---|---|---|\n| 256 MiB | 3010 | 3002 |\n\n{chart}"),
                }
            }
            "coherency" => ReportSection::missing("coherency"),
            "vmm-compat" => panic!("index out of bounds"),
            "crash" => {
                problems.push("crash-mps.json: one cell was not measured".into());
                ReportSection {
                    probe: "crash".into(),
                    question: "Does shared memory survive a crash?".into(),
                    answer: "Yes for the importer's death; the exporter's death frees legacy memory".into(),
                    body: "crash body".into(),
                }
            }
            other => panic!("no stand-in section for {other}"),
        }
    }
}

fn inputs() -> ReportInputs {
    let dir = testdata();
    let log = read_run_log(&dir);
    assert!(log.is_some(), "the recorded run log reads");
    load_inputs(&dir, &ProbeName::all(), &Pass::ALL, log, "gpu-ipc report --from testdata")
}

#[test]
fn a_report_from_recorded_json() {
    let report = build(&inputs(), &FakeSections);
    let md = &report.markdown;
    // Header: from the documents' environments and the run log.
    assert!(md.starts_with("# gpu-ipc: the four answers, measured\n"));
    assert!(md.contains("| Devices | NVIDIA H100 80GB HBM3 (GPU-5a1c9e20-1102-4c3d-8e7f-000102030400, compute capability 9.0, 79 GiB) |"), "{md}");
    assert!(md.contains("| CUDA driver | 13.0 |"));
    assert!(md.contains("| Commit | f66943c |"));
    assert!(md.contains("| Date (UTC) | 2026-11-23T03:39:59Z to 2026-11-23T04:02:10Z |"));
    assert!(md.contains("| Report command | `gpu-ipc report --quick` |"));
    assert!(md.contains("| Rendered by | `gpu-ipc report --from testdata` |"));
    assert!(md.contains("| Quick pass | yes"));
    assert!(
        md.contains(
            "| Passes | without MPS: 3 of 4 probes produced a result; under MPS: 3 of 4 probes produced a result |"
        ),
        "{md}"
    );
    // The four answers, first, one line each, in order.
    let answers_at = md.find("## The four answers").unwrap();
    let first_section = md.find("## Is imported memory slower?").unwrap();
    assert!(answers_at < first_section);
    let lines: Vec<&str> = md[answers_at..first_section].lines().filter(|l| l.starts_with("- **")).collect();
    assert_eq!(lines.len(), 4, "{lines:?}");
    assert!(lines[0].starts_with("- **Import overhead.** No: imported memory reads at the same speed (largest"));
    // The stub section is replaced by the runs' verdicts.
    assert!(lines[1].contains("A write is seen within 1.2 us with ld.acquire.sys"), "{}", lines[1]);
    assert!(lines[1].contains("; under MPS: A write is seen within 0.9 us"), "{}", lines[1]);
    // The panicking section is a problem in the report, and its verdicts stand in.
    assert!(lines[2].starts_with("- **What can be shared how.** Legacy IPC shares cuMemAlloc memory"), "{}", lines[2]);
    assert!(
        md.contains("> **Problem:** the vmm-compat section could not be rendered (it panicked: index out of bounds)")
    );
    assert!(md.contains("> **Problem:** under MPS: TIMED OUT after 900 s (killed)"), "{md}");
    assert!(lines[3].starts_with("- **Surviving a crash.** Yes for the importer's death"));
    // The broken document is named with its error, and the run's failure is said.
    assert!(md.contains("> **Problem:** without MPS: FAILED (exit 1): gpu-ipc probe crash: the exporter child process failed: CUDA_ERROR_LAUNCH_FAILED; "), "{md}");
    assert!(md.contains("crash-no-mps.json: not a probe's JSON document: EOF while parsing"), "{md}");
    assert!(md.contains("> **Problem:** crash-mps.json: one cell was not measured"));
    // Sections: body, chart link, verdict table with links to the raw JSON.
    assert!(md.contains("![Read bandwidth, own vs imported memory](plots/overhead-read.svg)"));
    assert!(md.contains("| without MPS | Imported memory reads as fast as local memory. | largest read-bandwidth difference: -0.4% (noise 1.2%) | 95.2 s | [JSON](raw/overhead-no-mps.json) |"), "{md}");
    // Footer: each run's command and time.
    assert!(md.contains("## How this was measured"));
    assert!(md.contains("| overhead | under MPS | result | 97.0 | `/opt/gpu-ipc/gpu-ipc probe overhead --json --out docs/answers/raw/overhead-mps.json --no-progress --quick` |"), "{md}");
    assert!(md.contains("| vmm-compat | under MPS | TIMED OUT after 900 s (killed) |  |  |"), "{md}");
    assert!(md.contains("- the private MPS daemon (pid 4242) was still running 10 s after quit"));
    // Answers and completeness.
    assert!(!report.complete);
    assert!(report.answers[0].complete);
    assert!(!report.answers[2].complete && !report.answers[3].complete);
    assert_eq!(report.answers[0].passes[1].mps_active, Some(true));
    assert_eq!(report.charts.len(), 1);
    assert_eq!(report.charts[0].series[0].points.len(), 4);
    assert_eq!(answer_lines(&report)[0], lines[0]);
}

#[test]
fn the_json_summary_names_every_pass() {
    let report = build(&inputs(), &FakeSections);
    let json =
        serde_json::to_value(JsonSummary { report: "x".into(), complete: report.complete, answers: report.answers })
            .unwrap();
    assert_eq!(json["answers"].as_array().unwrap().len(), 4);
    assert_eq!(json["answers"][2]["probe"], "vmm-compat");
    assert_eq!(json["answers"][2]["passes"][1]["pass"], "mps");
    assert_eq!(json["answers"][2]["passes"][1]["status"], "under MPS: TIMED OUT after 900 s (killed)");
    assert_eq!(json["answers"][0]["passes"][0]["key_figure"], "largest read-bandwidth difference: -0.4% (noise 1.2%)");
}

#[test]
fn nothing_to_read_gives_a_report_that_says_so() {
    let empty = PrivateDir::new("test-empty").unwrap();
    let inputs = load_inputs(empty.path(), &ProbeName::all(), &[Pass::NoMps], None, "gpu-ipc report --from x --no-mps");
    let report = build(&inputs, &FakeSections);
    assert!(!report.complete);
    let first = &report.answers[0].answer;
    assert!(
        first.starts_with("no result: without MPS: ") && first.ends_with("overhead-no-mps.json: not found"),
        "{first}"
    );
    assert!(report.markdown.contains("| Devices | unknown (no probe produced a result) |"));
    assert!(
        report.markdown.contains("| Passes | without MPS: 0 of 4 probes produced a result; under MPS: not asked for |")
    );
    assert!(report.charts.is_empty());
}

#[test]
fn a_skipped_mps_pass_is_reported_as_skipped() {
    let dir = testdata();
    let mut log = read_run_log(&dir).unwrap();
    for run in log.runs.iter_mut().filter(|r| r.pass == Pass::Mps) {
        run.status = RunStatus::Skipped { reason: "nvidia-cuda-mps-control not found on PATH".into() };
    }
    let empty = PrivateDir::new("test-skip").unwrap();
    for name in ["overhead-no-mps.json", "coherency-no-mps.json"] {
        std::fs::copy(dir.join(name), empty.path().join(name)).unwrap();
    }
    let inputs = load_inputs(
        empty.path(),
        &[crate::test_name("overhead"), crate::test_name("coherency")],
        &Pass::ALL,
        Some(log),
        "r",
    );
    let report = build(&inputs, &FakeSections);
    assert!(
        report
            .markdown
            .contains("| Passes | without MPS: ran; under MPS: SKIPPED (nvidia-cuda-mps-control not found on PATH) |"),
        "{}",
        report.markdown
    );
    assert!(report.markdown.contains("| under MPS | SKIPPED: nvidia-cuda-mps-control not found on PATH | | | |"));
    assert!(!report.complete, "a skipped pass is not a complete report");
}

#[test]
fn writing_puts_readme_plots_and_raw_json_in_place() {
    let out = PrivateDir::new("test-write").unwrap();
    let inputs = inputs();
    let report = build(&inputs, &FakeSections);
    std::fs::create_dir_all(out.path().join(PLOTS_DIR)).unwrap();
    std::fs::write(out.path().join("plots/stale.svg"), "<svg/>").unwrap();
    std::fs::write(out.path().join("plots/notes.txt"), "kept").unwrap();
    write(&report, &inputs, out.path()).unwrap();
    assert_eq!(std::fs::read_to_string(out.path().join("README.md")).unwrap(), report.markdown);
    let svg = std::fs::read_to_string(out.path().join("plots/overhead-read.svg")).unwrap();
    assert!(svg.contains("Read bandwidth, own vs imported memory"));
    assert!(out.path().join("plots/stale.svg").exists(), "what this run did not write is not deleted");
    assert!(out.path().join("plots/notes.txt").exists());
    for name in ["overhead-no-mps.json", "crash-no-mps.json", "runs.json", "crash-no-mps.log"] {
        assert!(out.path().join("raw").join(name).is_file(), "{name} copied");
    }
    // Writing again from the copy (the `--from docs/answers/raw` case) gives the same report.
    let again = load_inputs(
        &out.path().join("raw"),
        &ProbeName::all(),
        &Pass::ALL,
        read_run_log(&out.path().join("raw")),
        "gpu-ipc report --from testdata",
    );
    let report2 = build(&again, &FakeSections);
    assert_eq!(report2.markdown, report.markdown);
    write(&report2, &again, out.path()).unwrap();
    assert_eq!(std::fs::read_to_string(out.path().join("plots/overhead-read.svg")).unwrap(), svg, "deterministic");
    let _ = plot::render_svg;
}
