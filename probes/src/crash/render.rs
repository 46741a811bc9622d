//! The crash probe's text output and its section of the report.

use std::fmt::Write as _;

use super::Results;
use super::model::{self, MemoryReturn, WaitOutcome};
use super::summary::{self, CellSummary};
use harness::ProbeOutput;
use harness::report::{Plots, ReportSection};
use harness::stats::Distribution;

/// The question the probe answers.
pub const QUESTION: &str =
    "Does shared GPU memory survive the death of the process that exported it, or of one that imported it?";

/// The result as text: the verdict, then a table of counts per backend and case, then the times.
pub fn render_text(output: &ProbeOutput<Results>) -> String {
    let mut text = String::new();
    let device = output.env.headline(0);
    let _ = writeln!(text, "gpu-ipc probe crash on {device}{}", if output.quick { " (quick)" } else { "" });
    let _ = writeln!(text, "{}", output.verdict.answer);
    let _ = writeln!(text, "key figure: {}", output.verdict.key_figure);
    let _ = writeln!(text, "{}\n", run_line(&output.results));
    let _ = writeln!(
        text,
        "{:<8} {:<42} {:>6} {:>5} {:>5} {:>5} {:>5} {:>6} {:>6} {:>5} {:>7} {:>8} {:>12}",
        "backend",
        "case",
        "trials",
        "skip",
        "fault",
        "fail",
        "read",
        "launch",
        "intact",
        "write",
        "hammer",
        "wait",
        "memory back"
    );
    for c in &output.results.cells {
        let _ = writeln!(
            text,
            "{:<8} {:<42} {:>6} {:>5} {:>5} {:>5} {:>5} {:>6} {:>6} {:>5} {:>7} {:>8} {:>12}",
            c.backend,
            c.case.label(),
            c.trials,
            c.not_run,
            c.faults,
            c.failed_total() - c.faults,
            c.read_ok,
            c.launch_ok,
            c.data_intact,
            c.write_ok,
            hammer_cell(c),
            format!("{}/{}", c.waits(WaitOutcome::Released), c.wait.iter().map(|(_, n)| n).sum::<u64>()),
            memory_short(c),
        );
    }
    let _ = writeln!(
        text,
        "\nskip: not run; fault: a process that was never killed lost its context (under MPS: the server faulted)\n\
         memory back: D at the death, C when the survivor closed, X when it exited, N never"
    );
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

/// "trials run: 13 of 30 (stopped: ...)", or "trials run: all 30".
fn run_line(results: &Results) -> String {
    let started: u64 = results.cells.iter().map(|c| c.trials).sum();
    let not_run: u64 = results.cells.iter().map(|c| c.not_run).sum();
    let mut line = if not_run == 0 {
        format!("trials run: all {started} of the plan")
    } else {
        format!("trials run: {started} of {}; {not_run} not run", started + not_run)
    };
    if let Some(why) = &results.stopped {
        line.push_str(&format!(" (stopped: {why})"));
    }
    let skipped: Vec<String> = results
        .trials
        .iter()
        .filter_map(|t| t.failure.as_ref().filter(|f| f.kind == model::FailureKind::NotRun).map(|f| f.detail.clone()))
        .filter(|d| results.stopped.as_deref() != Some(d.as_str()))
        .fold(Vec::new(), |mut seen, d| {
            if !seen.contains(&d) {
                seen.push(d);
            }
            seen
        });
    for why in skipped {
        line.push_str(&format!("; also not run: {why}"));
    }
    line
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
    // Read as the current probe reads them (an older probe recorded an MPS fault as setup failures).
    let results: Vec<Results> = runs.iter().map(|(_, run)| run.results.normalized(run.env.mps)).collect();
    let answer = runs
        .iter()
        .zip(&results)
        .map(|((label, run), results)| {
            let v = results.verdict(run.env.mps);
            format!("{label}: {} ({})", v.answer.trim_end_matches('.'), v.key_figure)
        })
        .collect::<Vec<_>>()
        .join("; ");
    let mut body = String::new();
    for ((label, run), results) in runs.iter().zip(&results) {
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
        let _ = writeln!(body, "{}.\n", capitalized(&run_line(results)));
        if let Some(finding) = summary::fault_finding(&results.cells, run.env.mps) {
            let _ = writeln!(body, "{}\n", fault_paragraph(&finding, results, run.env.mps));
        }
        body.push_str(&outcome_table(&results.cells));
        body.push('\n');
        body.push_str(&memory_table(&results.cells));
        body.push('\n');
        body.push_str(&times_table(&results.cells));
        body.push('\n');
        for c in results.cells.iter().filter(|c| !c.failure_examples.is_empty()) {
            let _ = writeln!(body, "Failures, {} / {}:\n", c.backend, c.case.label());
            for line in &c.failure_examples {
                let _ = writeln!(body, "- `{}`", line.replace('`', "'"));
            }
            body.push('\n');
        }
    }
    let settings = &runs[0].1.results.settings;
    body.push_str(&method(settings.hammer_ms, settings.kill_after_ms));
    ReportSection { probe: "crash".into(), question: QUESTION.into(), answer, body }
}

fn capitalized(text: &str) -> String {
    let mut chars = text.chars();
    chars.next().map_or_else(String::new, |first| first.to_uppercase().chain(chars).collect())
}

/// The finding of a fault, in plain words, with each fault's error texts.
fn fault_paragraph(finding: &str, results: &Results, mps: bool) -> String {
    let title = if mps { "MPS server fault" } else { "A process that was never killed lost its context" };
    let mut text = format!("**{title}.** {}.", capitalized(finding));
    if mps {
        text.push_str(
            " Under MPS every client shares one server; a fatal fault there is not contained to the process that \
             died: every client connected at that moment gets a sticky error, the observer included, which never \
             touched the shared memory. Such a trial is a finding, not a failure of the probe; a case that faulted \
             is not repeated, and the probe went on only with a new client that could start.",
        );
    }
    for t in results.trials.iter().filter(|t| t.faulted()) {
        if let Some(f) = &t.failure {
            let _ = write!(
                text,
                "\n\n- {} / {} (repetition {}), {}: `{}`",
                t.backend,
                t.case.label(),
                t.repetition,
                f.stage,
                f.detail.replace('`', "'")
            );
        }
    }
    text
}

fn outcome_table(cells: &[CellSummary]) -> String {
    let mut t = String::from(
        "| backend | case | trials | not run | completed | read ok | launch ok | data intact | write ok | hammer clean \
         | wait released / timed out / stuck / error | failed (how) |\n|---|---|---|---|---|---|---|---|---|---|---|---|\n",
    );
    for c in cells {
        let failed = if c.failed.is_empty() {
            "0".to_owned()
        } else {
            c.failed.iter().map(|(k, n)| format!("{n} {}", k.label())).collect::<Vec<_>>().join(", ")
        };
        let _ = writeln!(
            t,
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} / {} / {} / {} | {} |",
            c.backend,
            c.case.label(),
            c.trials,
            c.not_run,
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

/// How it was measured (`hammer_ms`, `kill_after_ms`: the recorded settings of the run).
fn method(hammer_ms: u64, kill_after_ms: u64) -> String {
    format!(
        "\
**Method.** Each trial starts an exporter and an importer process (children of `gpu-ipc`), which share one \
allocation through the backend (legacy: the 64-byte `cuIpcGetMemHandle` handle in a message; VMM: the POSIX fd \
with `SCM_RIGHTS`). The exporter fills it with a pattern in which every 32-bit word differs from its neighbours \
and from every other sequence's; the importer checks every word. Then one process dies: the exporter calls `exit` \
without freeing anything, or the parent sends SIGKILL, in two cases while the survivor's kernel reads and rewrites \
every word (for {hammer_ms} ms, killed {kill_after_ms} ms in) and in one while the importer holds a polling kernel \
(`ld.acquire.sys`, 10 s deadline) and a `cuStreamWaitValue64` on a flag inside the memory. The survivor then copies \
a sample to the host, counts mismatched words of the whole allocation with a kernel, rewrites and re-checks it, and \
runs its own polling kernel on the flag, which it releases from the host (2 s deadline; a kernel still running 5 s \
later counts as stuck). A third process with its own CUDA context reads `cuMemGetInfo` before the children start, \
after each started, after the allocation, after the death, after the survivor closed its mapping and after it \
exited (a reading after a change counts once it has held for 100 ms); each child's context is measured when it \
starts and subtracted, and the allocation counts as given back at the first point where at least half of it had \
come back. `nvidia-smi` readings are recorded beside the readings with the allocation, after the death, after the \
close and after the exit in the JSON. The trials run repetition by repetition, the backends interleaved, and the \
case that kills a victim whose own kernel runs on the memory comes last. If the observer (which never touches the \
shared memory) loses its context after a death, the trial is recorded as a fault of the MPS server (or, without \
MPS, of a process that was never killed), with the observer's and the survivor's errors; that case is not repeated, \
a new observer is started, and if none can start the rest of the pass is recorded as not run, with the reason.

**Caveats.** Memory readings are device-wide: another process allocating during a trial would move them (run on an \
idle GPU). Under MPS, clients share the server's context, so context costs and the moment memory comes back can \
differ from a run without MPS. Without MPS the two processes' kernels time-slice, so the survivor's hammer may run \
fewer passes while the victim is alive. A survivor check that fails is counted, with its CUDA error, never retried.
"
    )
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::crash::model::FailureKind;
    use crate::crash::model::tests::healthy_run;
    use crate::crash::{CrashSettings, Results};
    use harness::env::ProbeEnv;

    fn output(results: Results, mps: bool) -> ProbeOutput<Results> {
        output_taking(results, mps, 42.0)
    }

    /// A recorded-looking document of `results`, as the probe would write it after `seconds`.
    pub(super) fn output_taking(results: Results, mps: bool, seconds: f64) -> ProbeOutput<Results> {
        let verdict = results.verdict(mps);
        ProbeOutput {
            probe: "crash".into(),
            schema: harness::SCHEMA_VERSION,
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
            seconds,
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
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod faults {
    use super::*;
    use crate::crash::model::CrashCase;
    use crate::crash::model::tests::mps_fault_run;
    use crate::crash::{CrashSettings, Results};

    fn output(results: Results, mps: bool, seconds: f64) -> ProbeOutput<Results> {
        super::tests::output_taking(results, mps, seconds)
    }

    /// The MPS pass of run 2 (H100, driver 580, CUDA 13.0, quick), as the probe of that time recorded it: the
    /// first `importer-kill-during-gpu-wait` trial's observer got error 700 after the death (a setup failure then),
    /// and every later trial failed in setup on the dead observer.
    const RUN2_MPS: &str = include_str!("testdata/run2-crash-mps.json");

    #[test]
    fn the_recorded_mps_fault_of_run_2_is_reported_as_a_fault_with_the_trials_that_could_not_run() {
        let recorded: ProbeOutput<Results> = serde_json::from_str(RUN2_MPS).unwrap();
        assert!(recorded.env.mps);
        // As recorded: "Partly" with 18 setup failures, the fault not named.
        assert!(recorded.verdict.answer.starts_with("Partly: in 9 of 9"), "{}", recorded.verdict.answer);
        let results = recorded.results.normalized(true);
        let gpu_wait =
            results.cells.iter().find(|c| c.backend == "legacy" && c.case == CrashCase::ImporterKillDuringGpuWait);
        let gpu_wait = gpu_wait.unwrap();
        assert_eq!((gpu_wait.trials, gpu_wait.faults, gpu_wait.not_run, gpu_wait.completed), (1, 1, 2, 0));
        assert!(gpu_wait.fault_detail.as_deref().unwrap().contains("CUDA_ERROR_ILLEGAL_ADDRESS (700)"));
        assert!(results.cells.iter().filter(|c| c.backend == "vmm").all(|c| c.trials == 0 && c.not_run == 3));
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
            section.body.contains(
                "| vmm | exporter exits without freeing | 0 | 3 | 0 | 0 | 0 | 0 | 0 | - | 0 / 0 / 0 / 0 | 0 |"
            ),
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
        let back: ProbeOutput<Results> = serde_json::from_str(&serde_json::to_string(&out).unwrap()).unwrap();
        assert_eq!(back.results.normalized(true), out.results);
    }

    #[test]
    fn a_pass_cut_by_max_seconds_says_how_many_ran() {
        let mut trials = crate::crash::model::tests::healthy_run(3);
        let reason = "--max-seconds 10 reached after 25 of 30 trials";
        for t in trials.iter_mut().rev().take(5) {
            *t = model::TrialRecord::not_run(&t.backend.clone(), t.case, t.repetition, reason);
        }
        let settings = CrashSettings {
            repetitions: 3,
            allocation_bytes: 64 << 20,
            backends: vec!["legacy".into(), "vmm".into()],
            hammer_ms: 400,
            kill_after_ms: 150,
            nvidia_smi: true,
            max_seconds: Some(10),
        };
        let out = output(Results::from_trials(settings, trials, Some(reason.into())), false, 10.5);
        assert!(out.verdict.answer.starts_with("Yes: in 18 of 18 exporter deaths"), "{}", out.verdict.answer);
        assert!(
            out.verdict.answer.ends_with(
                "; 5 of 30 trials of the pass could not run (--max-seconds 10 reached after 25 of 30 trials)."
            ),
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
}

/// Tests on a recorded run: `testdata/recorded-quick.json` holds a whole `--json` document (a quick pass on both
/// backends, with one hung survivor and VMM exporter deaths that return memory at the death). Regenerate it with
/// `cargo test -p gpu-ipc-probes write_recorded_fixture -- --ignored` after a schema change.
#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod recorded {
    use super::*;
    use crate::crash::model::tests::{healthy_run, trace};
    use crate::crash::model::{FailureKind, TrialFailure};
    use crate::crash::{CrashSettings, Results};
    use harness::env::ProbeEnv;

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
            max_seconds: None,
        };
        let results = Results::from_trials(settings, trials, None);
        let verdict = results.verdict(false);
        ProbeOutput {
            probe: "crash".into(),
            schema: harness::SCHEMA_VERSION,
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
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/src/crash/testdata/recorded-quick.json");
        std::fs::write(path, serde_json::to_string_pretty(&sample()).unwrap() + "\n").unwrap();
    }

    #[test]
    fn a_recorded_run_reads_back_and_its_counts_and_verdict_are_recomputed() {
        let output: ProbeOutput<Results> = serde_json::from_str(RECORDED).unwrap();
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
}
