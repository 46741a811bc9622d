//! The report's Markdown: a header (devices, driver, passes, date, commit, command), the four answers one line
//! each, each probe's section, and how it was measured. Built from loaded documents and a [`SectionSource`], so it
//! is tested without a GPU on recorded JSON and stand-in sections.

use std::collections::BTreeSet;
use std::fmt::Write as _;
use std::path::Path;

use serde::Serialize;
use serde_json::Value;

use super::Pass;
use super::load::{PassInput, ProbeInputs, ReportInputs, SectionSource, envelope_problems, section_or_problem};
use super::run::{RUN_LOG_FILE, RunStatus};
use crate::ProbeName;
use harness::report::{LineChart, Plots, ReportSection};
use harness::{MeasurementOutput, plot};

/// The folder, inside the report's, that holds the probes' JSON and logs.
pub const RAW_DIR: &str = "raw";
/// The folder, inside the report's, that holds the charts.
pub const PLOTS_DIR: &str = "plots";

/// The report, ready to write.
#[derive(Debug)]
pub struct Report {
    /// `README.md`.
    pub markdown: String,
    /// The four answers.
    pub answers: Vec<Answer>,
    /// The charts to draw into `plots/`.
    pub charts: Vec<LineChart>,
    /// Whether every probe run asked for produced a document that rendered without a problem.
    pub complete: bool,
}

/// One probe's answer, as printed and as `--json` writes it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Answer {
    /// Which probe.
    pub probe: ProbeName,
    /// A short title.
    pub title: String,
    /// The question.
    pub question: String,
    /// The answer in one line, with its key figure.
    pub answer: String,
    /// Whether every pass of this probe produced a result.
    pub complete: bool,
    /// Each pass's own verdict or failure.
    pub passes: Vec<PassVerdict>,
    /// What went wrong.
    pub problems: Vec<String>,
}

/// One pass's verdict, as `--json` writes it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PassVerdict {
    /// Which pass.
    pub pass: Pass,
    /// `ok`, or what went wrong (`FAILED (exit 1): ...`, `SKIPPED: ...`, `raw/x.json: not found`).
    pub status: String,
    /// The probe's verdict, when it produced one.
    pub answer: Option<String>,
    /// Its key figure.
    pub key_figure: Option<String>,
    /// Whether the probe saw MPS active.
    pub mps_active: Option<bool>,
}

/// What `gpu-ipc report --json` prints.
#[derive(Debug, Clone, Serialize)]
pub struct JsonSummary {
    /// The Markdown file written.
    pub report: String,
    /// Whether every run produced a result.
    pub complete: bool,
    /// The answers.
    pub answers: Vec<Answer>,
}

/// Builds the report from `inputs`, with each probe's section from `sections`.
pub fn build(inputs: &ReportInputs, sections: &dyn SectionSource) -> Report {
    let mut plots = Plots::default();
    let mut rendered = Vec::new();
    let mut answers = Vec::new();
    for probe_inputs in &inputs.probes {
        let (section, answer) = probe_section(probe_inputs, sections, &mut plots);
        rendered.push((section, probe_inputs));
        answers.push(answer);
    }
    let mut md = String::new();
    md.push_str("# gpu-ipc: the four answers, measured\n\n");
    md.push_str(&header(inputs));
    md.push_str("\n## The four answers\n\n");
    for answer in &answers {
        let _ = writeln!(md, "- **{}.** {}", answer.title, one_line(&answer.answer));
    }
    for (section, probe_inputs) in &rendered {
        md.push('\n');
        md.push_str(&section_markdown(section, probe_inputs, answers.iter().find(|a| a.probe == probe_inputs.probe)));
    }
    md.push_str(&footer(inputs));
    let complete = answers.iter().all(|a| a.complete);
    Report { markdown: md, answers, charts: plots.charts, complete }
}

/// The four answers, one Markdown line each, as printed for the project README.
pub fn answer_lines(report: &Report) -> Vec<String> {
    report.answers.iter().map(|a| format!("- **{}.** {}", a.title, one_line(&a.answer))).collect()
}

fn probe_section(inputs: &ProbeInputs, sections: &dyn SectionSource, plots: &mut Plots) -> (ReportSection, Answer) {
    let probe = inputs.probe;
    let doc = |pass: Pass| inputs.passes.iter().find(|p| p.pass == pass).and_then(PassInput::doc);
    let mut problems = Vec::new();
    for pass in &inputs.passes {
        if let Some(why) = pass.why_missing() {
            problems.push(why);
        }
        if let Some(doc) = pass.doc() {
            problems.extend(envelope_problems(probe, pass.pass, doc));
            if let Some(status) = pass.run.as_ref().filter(|s| !s.is_ok()) {
                problems.push(format!(
                    "{}: the run ended {} but left a document; it may be from an earlier run",
                    pass.pass.label(),
                    status.describe()
                ));
            }
        }
    }
    let (no_mps, mps) = (doc(Pass::NoMps), doc(Pass::Mps));
    let any = no_mps.is_some() || mps.is_some();
    let section = if any { section_or_problem(sections, probe, no_mps, mps, plots, &mut problems) } else { None };
    let section = match section {
        // The probe's module renders nothing yet: the verdicts its runs recorded stand in for it.
        Some(s) if s == ReportSection::missing(probe.name()) && any => verdict_section(probe, no_mps, mps),
        Some(s) => s,
        None if any => verdict_section(probe, no_mps, mps),
        None => ReportSection {
            probe: probe.name().to_owned(),
            question: probe.question().to_owned(),
            answer: format!("no result: {}", problems.join("; ")),
            body: String::new(),
        },
    };
    let passes: Vec<PassVerdict> = inputs
        .passes
        .iter()
        .map(|p| PassVerdict {
            pass: p.pass,
            status: p.doc().map_or_else(|| p.why_missing().unwrap_or_default(), |_| "ok".to_owned()),
            answer: p.doc().map(|d| d.verdict.answer.clone()),
            key_figure: p.doc().map(|d| d.verdict.key_figure.clone()),
            mps_active: p.doc().map(|d| d.env.mps),
        })
        .collect();
    let answer = Answer {
        probe,
        title: probe.title().to_owned(),
        question: if section.question.trim().is_empty() || section.question == probe.name() {
            probe.question().to_owned()
        } else {
            section.question.clone()
        },
        answer: section.answer.clone(),
        complete: problems.is_empty() && inputs.passes.iter().all(|p| p.doc().is_some()),
        passes,
        problems,
    };
    (section, answer)
}

/// A section made of the runs' own verdicts, for a probe whose module renders none.
fn verdict_section(
    probe: ProbeName,
    no_mps: Option<&MeasurementOutput<Value>>,
    mps: Option<&MeasurementOutput<Value>>,
) -> ReportSection {
    let verdict = |doc: &MeasurementOutput<Value>| {
        format!("{} ({})", doc.verdict.answer.trim().trim_end_matches('.'), doc.verdict.key_figure)
    };
    let answer = match (no_mps, mps) {
        (Some(a), Some(b)) if a.verdict == b.verdict => verdict(a),
        (Some(a), Some(b)) => format!("{}; under MPS: {}", verdict(a), verdict(b)),
        (Some(a), None) => verdict(a),
        (None, Some(b)) => format!("Under MPS: {}", verdict(b)),
        (None, None) => format!("no result from the {probe} probe"),
    };
    ReportSection {
        probe: probe.name().to_owned(),
        question: probe.question().to_owned(),
        answer,
        body: format!("_The {probe} probe's own section is not available; its runs' verdicts follow._\n"),
    }
}

fn section_markdown(section: &ReportSection, inputs: &ProbeInputs, answer: Option<&Answer>) -> String {
    let mut md = String::new();
    let question = answer.map_or(section.question.as_str(), |a| a.question.as_str());
    let _ = writeln!(md, "## {}\n", one_line(question));
    let _ = writeln!(md, "**Answer:** {}\n", one_line(&section.answer));
    if let Some(answer) = answer.filter(|a| !a.problems.is_empty()) {
        for problem in &answer.problems {
            let _ = writeln!(md, "> **Problem:** {}", one_line(problem));
        }
        md.push('\n');
    }
    for pass in &inputs.passes {
        if let Some(doc) = pass.doc() {
            match (pass.pass, doc.env.mps) {
                (Pass::NoMps, true) => {
                    let _ = writeln!(
                        md,
                        "> **Note:** the run without MPS found an MPS daemon on this machine (its pipe directory \
                         pointed at an empty one, so the probe's clients should not have joined it).\n"
                    );
                }
                (Pass::Mps, false) => {
                    let _ = writeln!(
                        md,
                        "> **Note:** the run under MPS did not see the daemon active: its figures may be without \
                         MPS.\n"
                    );
                }
                _ => {}
            }
        }
    }
    let body = section.body.trim();
    if !body.is_empty() {
        md.push_str(body);
        md.push_str("\n\n");
    }
    md.push_str("| Pass | Verdict | Key figure | Time | Raw |\n|---|---|---|---|---|\n");
    for pass in &inputs.passes {
        let file = pass.source.file_name().map(|f| f.to_string_lossy().into_owned()).unwrap_or_default();
        match pass.doc() {
            Some(doc) => {
                let _ = writeln!(
                    md,
                    "| {} | {} | {} | {:.1} s | [JSON]({RAW_DIR}/{file}) |",
                    pass.pass.label(),
                    cell(&doc.verdict.answer),
                    cell(&doc.verdict.key_figure),
                    doc.seconds,
                );
            }
            None => {
                let why = pass.why_missing().unwrap_or_default();
                let why = why.strip_prefix(&format!("{}: ", pass.pass.label())).unwrap_or(&why);
                let _ = writeln!(md, "| {} | {} | | | |", pass.pass.label(), cell(why));
            }
        }
    }
    md
}

fn header(inputs: &ReportInputs) -> String {
    let docs: Vec<&MeasurementOutput<Value>> =
        inputs.probes.iter().flat_map(|p| p.passes.iter().filter_map(PassInput::doc)).collect();
    let mut devices = BTreeSet::new();
    for doc in &docs {
        for d in &doc.env.devices {
            let gib = d.total_memory_bytes as f64 / f64::from(1u32 << 30);
            devices.insert(format!(
                "{} ({}, compute capability {}.{}, {gib:.0} GiB)",
                d.name, d.uuid, d.compute_capability.major, d.compute_capability.minor
            ));
        }
    }
    let distinct = |f: &dyn Fn(&MeasurementOutput<Value>) -> String| -> String {
        let set: BTreeSet<String> = docs.iter().map(|d| f(d)).collect();
        if set.is_empty() {
            "unknown (no probe produced a result)".to_owned()
        } else {
            set.into_iter().collect::<Vec<_>>().join(", ")
        }
    };
    let dates: BTreeSet<&str> = docs.iter().map(|d| d.env.date.as_str()).collect();
    let date = match (dates.first(), dates.last()) {
        (Some(first), Some(last)) if first != last => format!("{first} to {last}"),
        (Some(first), _) => (*first).to_owned(),
        _ => inputs.run_log.as_ref().map_or_else(|| "unknown".to_owned(), |l| l.date.clone()),
    };
    let quick = docs.iter().any(|d| d.quick) || inputs.run_log.as_ref().is_some_and(|l| l.quick);
    let mut md = String::from("| | |\n|---|---|\n");
    let mut row = |name: &str, value: &str| {
        let _ = writeln!(md, "| {name} | {} |", cell(value));
    };
    let devices = if devices.is_empty() {
        "unknown (no probe produced a result)".to_owned()
    } else {
        devices.into_iter().collect::<Vec<_>>().join("; ")
    };
    row("Devices", &devices);
    row("CUDA driver", &distinct(&|d| d.env.driver.clone()));
    row("Host", &distinct(&|d| d.env.host.clone()));
    row("Passes", &passes_summary(inputs));
    row("Date (UTC)", &date);
    row("Commit", &distinct(&|d| d.env.commit.clone()));
    let report_command = inputs.run_log.as_ref().map_or(inputs.command.as_str(), |l| l.command.as_str());
    row("Report command", &format!("`{report_command}`"));
    if inputs.run_log.as_ref().is_some_and(|l| l.command != inputs.command) {
        row("Rendered by", &format!("`{}`", inputs.command));
    }
    row("Quick pass", if quick { "yes: fewer repetitions and sizes, figures are rough" } else { "no" });
    md
}

fn passes_summary(inputs: &ReportInputs) -> String {
    Pass::ALL
        .iter()
        .map(|&pass| {
            if !inputs.passes.contains(&pass) {
                return format!("{}: not asked for", pass.label());
            }
            let of_pass: Vec<&PassInput> =
                inputs.probes.iter().flat_map(|p| p.passes.iter()).filter(|p| p.pass == pass).collect();
            let skipped: BTreeSet<&str> = of_pass
                .iter()
                .filter_map(|p| match &p.run {
                    Some(RunStatus::Skipped { reason }) => Some(reason.as_str()),
                    _ => None,
                })
                .collect();
            let ok = of_pass.iter().filter(|p| p.doc().is_some()).count();
            if ok == 0 && !skipped.is_empty() {
                let reasons: Vec<&str> = skipped.into_iter().collect();
                format!("{}: SKIPPED ({})", pass.label(), reasons.join("; "))
            } else if ok == of_pass.len() {
                format!("{}: ran", pass.label())
            } else {
                format!("{}: {ok} of {} probes produced a result", pass.label(), of_pass.len())
            }
        })
        .collect::<Vec<_>>()
        .join("; ")
}

fn footer(inputs: &ReportInputs) -> String {
    let mut md = String::from("\n## How this was measured\n\n");
    md.push_str(
        "Every probe ran as a child process of `gpu-ipc report`, once without MPS (`CUDA_MPS_PIPE_DIRECTORY` \
         pointed at an empty private directory, so no daemon, not even a system-wide one, was joined: two \
         processes' kernels are time-sliced) and once under a private MPS daemon that the report started \
         (`nvidia-cuda-mps-control -d` with its own pipe and log directories) and stopped afterwards. Each probe \
         compares its figures with a reference measured in the same run. The probes' documents and logs are in \
         [`raw/`](raw/).\n\n",
    );
    md.push_str("| Probe | Pass | Outcome | Seconds | Command |\n|---|---|---|---|---|\n");
    for probe in &inputs.probes {
        for pass in &probe.passes {
            let outcome = match (&pass.run, pass.doc()) {
                (Some(status), _) if !status.is_ok() => status.describe(),
                (_, Some(_)) => "result".to_owned(),
                (_, None) => pass.why_missing().unwrap_or_default(),
            };
            let (seconds, command) = pass.doc().map_or_else(
                || (String::new(), String::new()),
                |d| (format!("{:.1}", d.seconds), format!("`{}`", d.env.command)),
            );
            let _ = writeln!(
                md,
                "| {} | {} | {} | {seconds} | {} |",
                probe.probe,
                pass.pass.label(),
                cell(&outcome),
                cell(&command)
            );
        }
    }
    if let Some(log) = inputs.run_log.as_ref().filter(|l| !l.notes.is_empty()) {
        md.push('\n');
        for note in &log.notes {
            let _ = writeln!(md, "- {}", one_line(note));
        }
    }
    md
}

/// `text` on one line.
fn one_line(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// `text` as a Markdown table cell: one line, pipes escaped.
fn cell(text: &str) -> String {
    one_line(text).replace('|', "\\|")
}

/// Writes `report` into `out`: `README.md`, `plots/<stem>.svg`, and the documents, logs and run log copied into
/// `raw/` when they were read from elsewhere. Files of the same name are replaced; nothing else is deleted (charts
/// of an earlier report in `out` stay, unreferenced).
pub fn write(report: &Report, inputs: &ReportInputs, out: &Path) -> std::io::Result<()> {
    let plots_dir = out.join(PLOTS_DIR);
    std::fs::create_dir_all(&plots_dir)?;
    for chart in &report.charts {
        let svg = plot::render_svg(chart).map_err(std::io::Error::other)?;
        std::fs::write(plots_dir.join(format!("{}.svg", chart.file_stem)), svg)?;
    }
    copy_raw(inputs, &out.join(RAW_DIR))?;
    std::fs::write(out.join("README.md"), &report.markdown)
}

fn copy_raw(inputs: &ReportInputs, raw: &Path) -> std::io::Result<()> {
    std::fs::create_dir_all(raw)?;
    let same = |a: &Path, b: &Path| matches!((a.canonicalize(), b.canonicalize()), (Ok(a), Ok(b)) if a == b);
    if same(&inputs.source_dir, raw) {
        return Ok(());
    }
    let mut names = vec![RUN_LOG_FILE.to_owned()];
    for probe in &inputs.probes {
        for pass in &probe.passes {
            names.push(pass.pass.file_name(probe.probe));
            names.push(format!("{}-{}.log", probe.probe, pass.pass.suffix()));
        }
    }
    for name in names {
        let from = inputs.source_dir.join(&name);
        if from.is_file() {
            std::fs::copy(&from, raw.join(&name))?;
        }
    }
    Ok(())
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
pub(crate) mod tests;
