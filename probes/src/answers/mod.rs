//! `gpu-ipc report`: runs every probe (without MPS, then under a private MPS daemon) or reads their JSON, and
//! writes the answers: Markdown with the four answers first, then each probe's tables and plots (SVG), and the raw
//! JSON beside them.
//!
//! Each probe renders its own section ([`ReportSection`]) from its runs without and with MPS, and asks for plots
//! through [`Plots`]; this module assembles the document and draws the plots.
//!
//! The parts, in the order data flows: [`run`] starts the probes as child processes of this binary (and the MPS
//! daemon of the second pass), [`load`] reads their JSON and hands it to each probe's typed `report_section`,
//! [`render`] assembles the Markdown, [`plot`] draws the charts.

pub mod load;
pub mod plot;
pub mod render;
pub mod run;

use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::doctor::render::{EXIT_NO_CUDA, EXIT_USAGE};

/// Exit status: the report was written and every requested probe run produced a result.
pub const EXIT_OK: u8 = 0;
/// Exit status: the report was written, but a probe run failed, timed out, was skipped or left no readable JSON
/// (the report says which); or the report could not be written.
pub const EXIT_INCOMPLETE: u8 = 1;

/// Where the report goes by default: a folder of its own in the current directory, never the committed report.
pub const DEFAULT_OUT: &str = "gpu-ipc-report";

/// One probe's part of the report.
#[derive(Debug, Clone, PartialEq)]
pub struct ReportSection {
    /// The probe's name (`overhead`, `coherency`, `vmm-compat`, `crash`).
    pub probe: String,
    /// The question it answers, as a heading.
    pub question: String,
    /// The answer in one line, with its key figure (shown first in the report and in the README).
    pub answer: String,
    /// The section's body: Markdown tables, plot references, method and caveats.
    pub body: String,
}

impl ReportSection {
    /// The section of a probe that has no results to show.
    pub fn missing(probe: &str) -> Self {
        Self {
            probe: probe.to_owned(),
            question: probe.to_owned(),
            answer: format!("no result: the {probe} probe did not run or produced no JSON"),
            body: String::new(),
        }
    }
}

/// One line of a chart.
#[derive(Debug, Clone, PartialEq)]
pub struct Series {
    /// Legend label.
    pub name: String,
    /// Points `(x, y)`, in x order.
    pub points: Vec<(f64, f64)>,
}

/// A line chart a section asks for.
#[derive(Debug, Clone, PartialEq)]
pub struct LineChart {
    /// File name without extension (letters, digits, `-`), unique within the report.
    pub file_stem: String,
    /// Title above the chart.
    pub title: String,
    /// X axis label (with unit).
    pub x_label: String,
    /// Y axis label (with unit).
    pub y_label: String,
    /// Logarithmic x axis.
    pub x_log: bool,
    /// Logarithmic y axis.
    pub y_log: bool,
    /// The lines.
    pub series: Vec<Series>,
}

/// The plots the sections asked for; drawn when the report is written.
#[derive(Debug, Default)]
pub struct Plots {
    /// Charts in the order they were asked for.
    pub charts: Vec<LineChart>,
}

impl Plots {
    /// Records `chart` and returns the Markdown that shows it (`![title](plots/stem.svg)`).
    ///
    /// A stem with other characters than letters, digits and `-` has them replaced by `-`; a stem already taken
    /// gets `-2`, `-3`, ... appended; the Markdown names the file that will be written.
    pub fn line_chart(&mut self, mut chart: LineChart) -> String {
        chart.file_stem = self.unique_stem(&chart.file_stem);
        let alt = chart.title.replace(['[', ']'], "");
        let markdown = format!("![{alt}](plots/{}.svg)", chart.file_stem);
        self.charts.push(chart);
        markdown
    }

    fn unique_stem(&self, wanted: &str) -> String {
        let clean: String =
            wanted.chars().map(|c| if c.is_ascii_alphanumeric() || c == '-' { c } else { '-' }).collect();
        let base = if clean.is_empty() { "chart".to_owned() } else { clean };
        let taken = |stem: &str| self.charts.iter().any(|c| c.file_stem == stem);
        if !taken(&base) {
            return base;
        }
        (2..).map(|n| format!("{base}-{n}")).find(|stem| !taken(stem)).unwrap_or(base)
    }
}

/// One of the four research probes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum ProbeName {
    /// `gpu-ipc probe overhead`.
    Overhead,
    /// `gpu-ipc probe coherency`.
    Coherency,
    /// `gpu-ipc probe vmm-compat`.
    VmmCompat,
    /// `gpu-ipc probe crash`.
    Crash,
}

impl ProbeName {
    /// All four, in report order.
    pub const ALL: [Self; 4] = [Self::Overhead, Self::Coherency, Self::VmmCompat, Self::Crash];

    /// The subcommand and file name: `overhead`, `coherency`, `vmm-compat`, `crash`.
    pub fn name(self) -> &'static str {
        match self {
            Self::Overhead => "overhead",
            Self::Coherency => "coherency",
            Self::VmmCompat => "vmm-compat",
            Self::Crash => "crash",
        }
    }

    /// A short title for the list of answers.
    pub fn title(self) -> &'static str {
        match self {
            Self::Overhead => "Import overhead",
            Self::Coherency => "Cross-process coherency",
            Self::VmmCompat => "What can be shared how",
            Self::Crash => "Surviving a crash",
        }
    }

    /// The question, used as the heading when the probe's own section has none.
    pub fn question(self) -> &'static str {
        match self {
            Self::Overhead => {
                "Is memory imported from another process slower for kernels than the process's own memory?"
            }
            Self::Coherency => {
                "When does one process's write become visible to another process's polling kernel, and which loads \
                 and fences are needed?"
            }
            Self::VmmCompat => "What can be shared how: legacy IPC and VMM handles against every kind of allocation?",
            Self::Crash => {
                "Does shared memory survive the death of the process that exported it, or of one that imported it?"
            }
        }
    }
}

impl std::fmt::Display for ProbeName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// One of the two passes every probe runs in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Pass {
    /// Without MPS: two processes' kernels are time-sliced.
    NoMps,
    /// Under a private MPS daemon started by the report.
    Mps,
}

impl Pass {
    /// Both passes, in the order they run.
    pub const ALL: [Self; 2] = [Self::NoMps, Self::Mps];

    /// The file-name suffix: `no-mps`, `mps`.
    pub fn suffix(self) -> &'static str {
        match self {
            Self::NoMps => "no-mps",
            Self::Mps => "mps",
        }
    }

    /// In words: `without MPS`, `under MPS`.
    pub fn label(self) -> &'static str {
        match self {
            Self::NoMps => "without MPS",
            Self::Mps => "under MPS",
        }
    }

    /// The JSON file of `probe` in this pass: `<probe>-<pass>.json`.
    pub fn file_name(self, probe: ProbeName) -> String {
        format!("{}-{}.json", probe.name(), self.suffix())
    }
}

impl std::fmt::Display for Pass {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.suffix())
    }
}

/// Options of `gpu-ipc report`.
#[derive(Debug, Clone, clap::Args)]
pub struct ReportArgs {
    /// A short pass of every probe (each probe's `--quick`).
    #[arg(long, conflicts_with = "from")]
    pub quick: bool,
    /// Read the probes' JSON from DIR (`DIR/<probe>-no-mps.json`, `DIR/<probe>-mps.json`, and `DIR/runs.json` when
    /// present) instead of running them.
    #[arg(long, value_name = "DIR")]
    pub from: Option<PathBuf>,
    /// Where the report goes: `DIR/README.md`, `DIR/plots/*.svg`, `DIR/raw/*.json` and the probes' logs. Files of
    /// this run replace those of the same name; nothing else in DIR is deleted. The committed report is
    /// docs/answers/: write there only to replace it on purpose.
    #[arg(long, value_name = "DIR", default_value = DEFAULT_OUT)]
    pub out: PathBuf,
    /// Only this probe (repeatable; default: overhead, coherency, vmm-compat, crash).
    #[arg(long, value_name = "PROBE")]
    pub only: Vec<ProbeName>,
    /// Only the pass without MPS.
    #[arg(long, conflicts_with = "mps_only")]
    pub no_mps: bool,
    /// Only the pass under a private MPS daemon.
    #[arg(long)]
    pub mps_only: bool,
    /// Print the four answers as JSON on stdout (instead of one Markdown line each).
    #[arg(long)]
    pub json: bool,
    /// Time limit of each probe run, in seconds; a probe still running then is killed and reported as timed out.
    #[arg(long, value_name = "SECS", default_value_t = 900, value_parser = clap::value_parser!(u64).range(1..))]
    pub timeout: u64,
}

impl ReportArgs {
    /// The probes to report on, in report order, without repeats.
    pub fn probes(&self) -> Vec<ProbeName> {
        let mut probes = if self.only.is_empty() { ProbeName::ALL.to_vec() } else { self.only.clone() };
        probes.sort();
        probes.dedup();
        probes
    }

    /// The passes to run or read.
    pub fn passes(&self) -> Vec<Pass> {
        if self.no_mps {
            vec![Pass::NoMps]
        } else if self.mps_only {
            vec![Pass::Mps]
        } else {
            Pass::ALL.to_vec()
        }
    }
}

/// Runs `gpu-ipc report`; returns the exit status.
pub fn main(args: &ReportArgs) -> u8 {
    let probes = args.probes();
    let passes = args.passes();
    let command = std::env::args().collect::<Vec<_>>().join(" ");
    let raw_dir = args.out.join(render::RAW_DIR);
    let (source, run_log) = match &args.from {
        Some(dir) => (dir.clone(), load::read_run_log(dir)),
        None => {
            // Before any file is touched: without a driver, one line and exit status 3.
            if let Err((line, code)) = crate::probe::env::collect("gpu-ipc report") {
                eprintln!("{line}");
                return code;
            }
            let exe = match std::env::current_exe() {
                Ok(exe) => exe,
                Err(e) => {
                    eprintln!("gpu-ipc report: cannot find this program's own path to run the probes: {e}");
                    return EXIT_USAGE;
                }
            };
            let plan = run::RunPlan {
                exe,
                raw_dir: raw_dir.clone(),
                probes: probes.clone(),
                passes: passes.clone(),
                quick: args.quick,
                timeout: Duration::from_secs(args.timeout),
                mps_control: run::MpsControl::from_path(),
                command: command.clone(),
            };
            let progress = run::RunProgress::new(std::io::stderr().is_terminal());
            match run::execute(&plan, &progress) {
                Ok(run::PlanOutcome::Done(log)) => (raw_dir.clone(), Some(log)),
                Ok(run::PlanOutcome::NoCuda(message)) => {
                    eprintln!("{message}");
                    return EXIT_NO_CUDA;
                }
                Err(e) => {
                    eprintln!("gpu-ipc report: {e}");
                    return EXIT_INCOMPLETE;
                }
            }
        }
    };
    let inputs = load::load_inputs(&source, &probes, &passes, run_log, &command);
    let report = render::build(&inputs, &load::TypedSections);
    if let Err(e) = render::write(&report, &inputs, &args.out) {
        eprintln!("gpu-ipc report: could not write the report to {}: {e}", args.out.display());
        return EXIT_INCOMPLETE;
    }
    print_answers(&report, &args.out, args.json);
    if report.complete { EXIT_OK } else { EXIT_INCOMPLETE }
}

/// Prints the four answers on stdout: one Markdown line each (for the project README), or JSON.
fn print_answers(report: &render::Report, out: &Path, json: bool) {
    if json {
        let summary = render::JsonSummary {
            report: out.join("README.md").display().to_string(),
            complete: report.complete,
            answers: report.answers.clone(),
        };
        match serde_json::to_string_pretty(&summary) {
            Ok(text) => println!("{text}"),
            Err(e) => eprintln!("gpu-ipc report: could not encode the answers as JSON: {e}"),
        }
    } else {
        for line in render::answer_lines(report) {
            println!("{line}");
        }
        eprintln!("gpu-ipc report: written to {}", out.join("README.md").display());
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use clap::Parser;

    use super::*;

    #[derive(Debug, Parser)]
    struct Cli {
        #[command(flatten)]
        args: ReportArgs,
    }

    fn parse(args: &[&str]) -> Result<ReportArgs, clap::Error> {
        Cli::try_parse_from(std::iter::once("report").chain(args.iter().copied())).map(|cli| cli.args)
    }

    #[test]
    fn defaults_are_every_probe_both_passes_into_a_folder_of_its_own() {
        let args = parse(&[]).unwrap();
        assert_eq!(args.probes(), ProbeName::ALL.to_vec());
        assert_eq!(args.passes(), vec![Pass::NoMps, Pass::Mps]);
        assert_eq!(args.out, PathBuf::from("gpu-ipc-report"));
        assert_eq!(args.timeout, 900);
        assert!(!args.quick && !args.json && args.from.is_none());
    }

    #[test]
    fn only_is_repeatable_and_ordered() {
        let args = parse(&["--only", "crash", "--only", "vmm-compat", "--only", "crash", "--mps-only"]).unwrap();
        assert_eq!(args.probes(), vec![ProbeName::VmmCompat, ProbeName::Crash]);
        assert_eq!(args.passes(), vec![Pass::Mps]);
        assert_eq!(parse(&["--no-mps"]).unwrap().passes(), vec![Pass::NoMps]);
    }

    #[test]
    fn usage_errors() {
        for bad in [
            &["--no-mps", "--mps-only"][..],
            &["--only", "bandwidth"],
            &["--timeout", "0"],
            &["--quick", "--from", "x"],
        ] {
            let err = parse(bad).unwrap_err();
            assert!(err.use_stderr(), "{bad:?} should be a usage error");
        }
    }

    #[test]
    fn chart_stems_are_cleaned_and_unique() {
        let mut plots = Plots::default();
        let chart = |stem: &str| LineChart {
            file_stem: stem.to_owned(),
            title: "Read [bandwidth]".to_owned(),
            x_label: String::new(),
            y_label: String::new(),
            x_log: false,
            y_log: false,
            series: Vec::new(),
        };
        assert_eq!(plots.line_chart(chart("bw")), "![Read bandwidth](plots/bw.svg)");
        assert_eq!(plots.line_chart(chart("bw")), "![Read bandwidth](plots/bw-2.svg)");
        assert_eq!(plots.line_chart(chart("a b/../c")), "![Read bandwidth](plots/a-b----c.svg)");
        assert_eq!(plots.line_chart(chart("")), "![Read bandwidth](plots/chart.svg)");
        let stems: Vec<_> = plots.charts.iter().map(|c| c.file_stem.as_str()).collect();
        assert_eq!(stems, ["bw", "bw-2", "a-b----c", "chart"]);
    }

    #[test]
    fn file_names() {
        assert_eq!(Pass::Mps.file_name(ProbeName::VmmCompat), "vmm-compat-mps.json");
        assert_eq!(Pass::NoMps.file_name(ProbeName::Overhead), "overhead-no-mps.json");
        assert_eq!(serde_json::to_string(&ProbeName::VmmCompat).unwrap(), "\"vmm-compat\"");
    }
}
