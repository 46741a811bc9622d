//! The crash probe's text output and its section of the report.

use std::fmt::Write as _;

use super::super::ProbeOutput;
use super::super::stats::Distribution;
use super::Results;
use super::model::{self, CellSummary, MemoryReturn, WaitOutcome};
use crate::answers::{Plots, ReportSection};

/// The question the probe answers.
pub const QUESTION: &str =
    "Does shared GPU memory survive the death of the process that exported it, or of one that imported it?";

/// The result as text: the verdict, then a table of counts per backend and case, then the times.
pub fn render_text(output: &ProbeOutput<Results>) -> String {
    let mut text = String::new();
    let device = output.env.headline(0);
    let _ = writeln!(text, "gpu-ipc probe crash on {device}{}", if output.quick { " (quick)" } else { "" });
    let _ = writeln!(text, "{}", output.verdict.answer);
    let _ = writeln!(text, "key figure: {}\n", output.verdict.key_figure);
    let _ = writeln!(
        text,
        "{:<8} {:<42} {:>6} {:>5} {:>5} {:>6} {:>6} {:>5} {:>7} {:>8} {:>12}",
        "backend", "case", "trials", "fail", "read", "launch", "intact", "write", "hammer", "wait", "memory back"
    );
    for c in &output.results.cells {
        let _ = writeln!(
            text,
            "{:<8} {:<42} {:>6} {:>5} {:>5} {:>6} {:>6} {:>5} {:>7} {:>8} {:>12}",
            c.backend,
            c.case.label(),
            c.trials,
            c.failed_total(),
            c.read_ok,
            c.launch_ok,
            c.data_intact,
            c.write_ok,
            hammer_cell(c),
            format!("{}/{}", c.waits(WaitOutcome::Released), c.wait.iter().map(|(_, n)| n).sum::<u64>()),
            memory_short(c),
        );
    }
    let _ = writeln!(text, "\nmemory back: D at the death, C when the survivor closed, X when it exited, N never");
    let _ = writeln!(text, "\ntimes in ms (p50 / p99 / max):");
    for c in &output.results.cells {
        let _ = writeln!(
            text,
            "  {:<6} {:<42} reap {}  memory back {}  read {}  first kernel {}  wait {}",
            c.backend,
            c.case.label(),
            dist(c.reap_ms.as_ref()),
            dist(c.return_after_death_ms.as_ref()),
            dist(c.read_ms.as_ref()),
            dist(c.verify_ms.as_ref()),
            dist(c.wait_ms.as_ref()),
        );
    }
    for c in output.results.cells.iter().filter(|c| !c.failure_examples.is_empty()) {
        let _ = writeln!(text, "\nfailures of {} / {}:", c.backend, c.case.label());
        for line in &c.failure_examples {
            let _ = writeln!(text, "  {line}");
        }
    }
    text
}

fn hammer_cell(c: &CellSummary) -> String {
    if c.case.survivor_hammers() { format!("{}/{}", c.hammer_clean, c.hammer_clean + c.hammer_bad) } else { "-".into() }
}

fn memory_short(c: &CellSummary) -> String {
    let letters = [("D", MemoryReturn::AfterDeath), ("C", MemoryReturn::AfterSurvivorClose)];
    let more = [("X", MemoryReturn::AfterSurvivorExit), ("N", MemoryReturn::Never)];
    let parts: Vec<String> = letters
        .iter()
        .chain(more.iter())
        .filter(|(_, p)| c.returned(*p) > 0)
        .map(|(l, p)| format!("{l}{}", c.returned(*p)))
        .collect();
    if parts.is_empty() { "-".into() } else { parts.join(" ") }
}

fn dist(d: Option<&Distribution>) -> String {
    d.map_or_else(|| "-".to_owned(), |d| format!("{:.2} / {:.2} / {:.2}", d.p50, d.p99, d.max))
}

fn dist_md(d: Option<&Distribution>) -> String {
    d.map_or_else(|| "-".to_owned(), |d| format!("{:.2} / {:.2} / {:.2} (n={})", d.p50, d.p99, d.max, d.count))
}

/// The report's section, from the runs without and with MPS (either may be missing). `plots` is not used: the
/// answer is counts, which tables show better than charts.
pub fn report_section(
    no_mps: Option<&ProbeOutput<Results>>,
    mps: Option<&ProbeOutput<Results>>,
    _plots: &mut Plots,
) -> ReportSection {
    let runs: Vec<(&str, &ProbeOutput<Results>)> =
        [("without MPS", no_mps), ("with MPS", mps)].into_iter().filter_map(|(l, r)| r.map(|r| (l, r))).collect();
    if runs.is_empty() {
        return ReportSection::missing("crash");
    }
    let answer = runs
        .iter()
        .map(|(label, run)| {
            let v = model::verdict(&run.results.cells);
            format!("{label}: {} ({})", v.answer.trim_end_matches('.'), v.key_figure)
        })
        .collect::<Vec<_>>()
        .join("; ");
    let mut body = String::new();
    for (label, run) in &runs {
        let _ = writeln!(body, "### {label}: {}\n", run.env.headline(0));
        let s = &run.results.settings;
        let _ = writeln!(
            body,
            "{} repetitions per case and backend{}, {} MiB allocations, backends: {}; recorded {} (commit {}).\n",
            s.repetitions,
            if run.quick { " (quick pass)" } else { "" },
            s.allocation_bytes >> 20,
            s.backends.join(", "),
            run.env.date,
            run.env.commit
        );
        body.push_str(&outcome_table(&run.results.cells));
        body.push('\n');
        body.push_str(&memory_table(&run.results.cells));
        body.push('\n');
        body.push_str(&times_table(&run.results.cells));
        body.push('\n');
        for c in run.results.cells.iter().filter(|c| !c.failure_examples.is_empty()) {
            let _ = writeln!(body, "Failures, {} / {}:\n", c.backend, c.case.label());
            for line in &c.failure_examples {
                let _ = writeln!(body, "- `{}`", line.replace('`', "'"));
            }
            body.push('\n');
        }
    }
    body.push_str(METHOD);
    ReportSection { probe: "crash".into(), question: QUESTION.into(), answer, body }
}

fn outcome_table(cells: &[CellSummary]) -> String {
    let mut t = String::from(
        "| backend | case | trials | completed | read ok | launch ok | data intact | write ok | hammer clean | \
         wait released / timed out / stuck / error | failed (how) |\n|---|---|---|---|---|---|---|---|---|---|---|\n",
    );
    for c in cells {
        let failed = if c.failed.is_empty() {
            "0".to_owned()
        } else {
            c.failed.iter().map(|(k, n)| format!("{n} {}", k.label())).collect::<Vec<_>>().join(", ")
        };
        let _ = writeln!(
            t,
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} / {} / {} / {} | {} |",
            c.backend,
            c.case.label(),
            c.trials,
            c.completed,
            c.read_ok,
            c.launch_ok,
            c.data_intact,
            c.write_ok,
            hammer_cell(c),
            c.waits(WaitOutcome::Released),
            c.waits(WaitOutcome::TimedOut),
            c.waits(WaitOutcome::Stuck),
            c.waits(WaitOutcome::Error) + c.waits(WaitOutcome::NotRun),
            failed
        );
    }
    t
}

fn memory_table(cells: &[CellSummary]) -> String {
    let mut t = String::from(
        "| backend | case | memory back at the death | when the survivor closed | when the survivor exited | never | \
         MiB back at the death p50 / p99 / max |\n|---|---|---|---|---|---|---|\n",
    );
    for c in cells {
        let _ = writeln!(
            t,
            "| {} | {} | {} | {} | {} | {} | {} |",
            c.backend,
            c.case.label(),
            c.returned(MemoryReturn::AfterDeath),
            c.returned(MemoryReturn::AfterSurvivorClose),
            c.returned(MemoryReturn::AfterSurvivorExit),
            c.returned(MemoryReturn::Never),
            dist_md(c.returned_at_death_mib.as_ref())
        );
    }
    t
}

fn times_table(cells: &[CellSummary]) -> String {
    let mut t = String::from(
        "| backend | case | victim reaped (ms) | memory back after reaping (ms) | survivor host read (ms) | \
         first kernel (ms) | rewrite + check (ms) | wait released after (ms) |\n|---|---|---|---|---|---|---|---|\n",
    );
    for c in cells {
        let _ = writeln!(
            t,
            "| {} | {} | {} | {} | {} | {} | {} | {} |",
            c.backend,
            c.case.label(),
            dist_md(c.reap_ms.as_ref()),
            dist_md(c.return_after_death_ms.as_ref()),
            dist_md(c.read_ms.as_ref()),
            dist_md(c.verify_ms.as_ref()),
            dist_md(c.write_ms.as_ref()),
            dist_md(c.wait_ms.as_ref()),
        );
    }
    t.push_str("\nTimes are p50 / p99 / max (nearest rank) over the trials where the step ran.\n");
    t
}

const METHOD: &str = "\
**Method.** Each trial starts an exporter and an importer process (children of `gpu-ipc`), which share one \
allocation through the backend (legacy: the 64-byte `cuIpcGetMemHandle` handle in a message; VMM: the POSIX fd \
with `SCM_RIGHTS`). The exporter fills it with a pattern in which every 32-bit word differs from its neighbours \
and from every other sequence's; the importer checks every word. Then one process dies: the exporter calls `exit` \
without freeing anything, or the parent sends SIGKILL, in two cases while the survivor's kernel reads and rewrites \
every word (for 600 ms, killed 300 ms in) and in one while the importer holds a polling kernel \
(`ld.acquire.sys`, 10 s deadline) and a `cuStreamWaitValue64` on a flag inside the memory. The survivor then copies \
a sample to the host, counts mismatched words of the whole allocation with a kernel, rewrites and re-checks it, and \
runs its own polling kernel on the flag, which it releases from the host (2 s deadline; a kernel still running 5 s \
later counts as stuck). A third process with its own CUDA context reads `cuMemGetInfo` before the children start, \
after each started, after the allocation, after the death, after the survivor closed its mapping and after it \
exited; each child's context is measured when it starts and subtracted, and the allocation counts as given back at \
the first point where at least half of it had come back. `nvidia-smi` readings are recorded beside each in the JSON.

**Caveats.** Memory readings are device-wide: another process allocating during a trial would move them (run on an \
idle GPU). Under MPS, clients share the server's context, so context costs and the moment memory comes back can \
differ from a run without MPS. Without MPS the two processes' kernels time-slice, so the survivor's hammer may run \
fewer passes while the victim is alive. A survivor check that fails is counted, with its CUDA error, never retried.
";

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::probe::crash::model::FailureKind;
    use crate::probe::crash::model::tests::healthy_run;
    use crate::probe::crash::{CrashSettings, Results};
    use crate::probe::env::ProbeEnv;

    fn output(results: Results, mps: bool) -> ProbeOutput<Results> {
        let verdict = model::verdict(&results.cells);
        ProbeOutput {
            probe: "crash".into(),
            schema: crate::probe::SCHEMA_VERSION,
            quick: true,
            env: ProbeEnv {
                devices: Vec::new(),
                driver: "13.0".into(),
                mps,
                date: "2026-11-23T04:00:00Z".into(),
                commit: "abc1234".into(),
                command: "gpu-ipc probe crash --quick".into(),
                host: "h100".into(),
            },
            seconds: 42.0,
            results,
            verdict,
        }
    }

    fn settings() -> CrashSettings {
        CrashSettings {
            repetitions: 3,
            allocation_bytes: 64 << 20,
            backends: vec!["legacy".into(), "vmm".into()],
            hammer_ms: 600,
            kill_after_ms: 300,
            nvidia_smi: true,
        }
    }

    #[test]
    fn text_shows_the_verdict_and_every_cell() {
        let out = output(Results::from_trials(settings(), healthy_run(3)), false);
        let text = render_text(&out);
        assert!(text.contains("Yes: in 18 of 18 exporter deaths"), "{text}");
        assert_eq!(text.matches("exporter SIGKILL during importer kernel").count(), 4, "{text}");
        assert!(text.contains("C3"), "{text}");
        assert!(text.contains(" 3/3 "), "{text}");
    }

    #[test]
    fn report_section_has_both_runs_tables_and_method() {
        let out = output(Results::from_trials(settings(), healthy_run(3)), false);
        let with_mps = output(Results::from_trials(settings(), healthy_run(2)), true);
        let section = report_section(Some(&out), Some(&with_mps), &mut Plots::default());
        assert_eq!(section.question, QUESTION);
        assert!(section.answer.starts_with("without MPS: Yes: in 18 of 18"), "{}", section.answer);
        assert!(section.answer.contains("with MPS: Yes: in 12 of 12"), "{}", section.answer);
        assert!(section.body.contains("### without MPS"));
        assert!(section.body.contains("### with MPS"));
        assert!(
            section.body.contains(
                "| legacy | importer SIGKILL holding GPU-side waits | 3 | 3 | 3 | 3 | 3 | 3 | - | 3 / 0 / 0 / 0 | 0 |"
            ),
            "{}",
            section.body
        );
        assert!(section.body.contains("**Method.**"));
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
        let out = output(Results::from_trials(settings(), trials), false);
        let text = render_text(&out);
        assert!(text.contains("failures of legacy / exporter exits without freeing:"), "{text}");
        let section = report_section(Some(&out), None, &mut Plots::default());
        assert!(section.body.contains("1 child hung (killed)"), "{}", section.body);
        assert!(section.answer.starts_with("without MPS: Partly"), "{}", section.answer);
    }
}

/// Tests on a recorded run: `testdata/recorded-quick.json` holds a whole `--json` document (a quick pass on both
/// backends, with one hung survivor and VMM exporter deaths that return memory at the death). Regenerate it with
/// `cargo test -p gpu-ipc-probes write_recorded_fixture -- --ignored` after a schema change.
#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod recorded {
    use super::*;
    use crate::probe::crash::model::tests::{healthy_run, trace};
    use crate::probe::crash::model::{FailureKind, TrialFailure};
    use crate::probe::crash::{CrashSettings, Results};
    use crate::probe::env::ProbeEnv;

    const RECORDED: &str = include_str!("testdata/recorded-quick.json");

    fn sample() -> ProbeOutput<Results> {
        let mut trials = healthy_run(3);
        for t in trials.iter_mut().filter(|t| t.backend == "vmm" && t.case.exporter_dies()) {
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
            backends: vec!["legacy".into(), "vmm".into()],
            hammer_ms: 600,
            kill_after_ms: 300,
            nvidia_smi: true,
        };
        let results = Results::from_trials(settings, trials);
        let verdict = model::verdict(&results.cells);
        ProbeOutput {
            probe: "crash".into(),
            schema: crate::probe::SCHEMA_VERSION,
            quick: true,
            env: ProbeEnv {
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
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/src/probe/crash/testdata/recorded-quick.json");
        std::fs::write(path, serde_json::to_string_pretty(&sample()).unwrap() + "\n").unwrap();
    }

    #[test]
    fn a_recorded_run_reads_back_and_its_counts_and_verdict_are_recomputed() {
        let output: ProbeOutput<Results> = serde_json::from_str(RECORDED).unwrap();
        assert_eq!(output.results.cells, model::summarize(&output.results.trials));
        assert_eq!(output.verdict, model::verdict(&output.results.cells));
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
}
