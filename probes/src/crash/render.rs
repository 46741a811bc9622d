//! The crash probe's text output and its section of the report.

use std::fmt::Write as _;

use super::Results;
use super::model::{self, MemoryReturn, WaitOutcome};
use super::summary::{self, CellSummary};
use harness::MeasurementOutput;
use harness::report::{Plots, ReportSection};
use harness::stats::Distribution;

/// The question the probe answers.
pub const QUESTION: &str =
    "Does shared GPU memory survive the death of the process that exported it, or of one that imported it?";

/// The result as text: the verdict, then a table of counts per backend and case, then the times.
pub fn render_text(output: &MeasurementOutput<Results>) -> String {
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
            c.backend.name(),
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
            c.backend.name(),
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
    no_mps: Option<&MeasurementOutput<Results>>,
    mps: Option<&MeasurementOutput<Results>>,
    _plots: &mut Plots,
) -> ReportSection {
    let runs: Vec<(&str, &MeasurementOutput<Results>)> =
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
            s.backends.iter().map(|b| b.name()).collect::<Vec<_>>().join(", "),
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
                t.backend.name(),
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
            c.backend.name(),
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
            c.backend.name(),
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
            c.backend.name(),
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
mod tests;

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod faults;

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod recorded;
