//! `gpu-ipc report`: runs every probe (without MPS, then under a private MPS daemon) or reads their JSON, and
//! writes the answers: Markdown with the four answers first, then each probe's tables and plots (SVG), and the raw
//! JSON beside them.
//!
//! Each probe renders its own section (`harness::report::ReportSection`) from its runs without and with MPS, and
//! asks for plots through `harness::report::Plots`; this module assembles the document and draws the plots.
//!
//! The parts, in the order data flows: [`run`] starts the probes as child processes of this binary (and the MPS
//! daemon of the second pass), [`load`] reads their JSON and hands it to each probe's typed `report_section`,
//! [`render`] assembles the Markdown and has `harness::plot` draw the charts.

pub mod load;
pub mod render;
pub mod run;

use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use harness::exit::{EXIT_FAILED, EXIT_NO_CUDA, EXIT_OK, EXIT_USAGE};
use harness::mps::MpsControl;

use crate::ProbeName;

/// Where the report goes by default: a folder of its own in the current directory, never the committed report.
pub const DEFAULT_OUT: &str = "gpu-ipc-report";

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
    #[arg(long, value_name = "PROBE", value_parser = ProbeName::parse)]
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
        let mut probes = if self.only.is_empty() { ProbeName::all() } else { self.only.clone() };
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
            if let Err((line, code)) = harness::env::collect("gpu-ipc report") {
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
                mps_control: MpsControl::from_path(),
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
                    return EXIT_FAILED;
                }
            }
        }
    };
    let inputs = load::load_inputs(&source, &probes, &passes, run_log, &command);
    let report = render::build(&inputs, &load::TypedSections);
    if let Err(e) = render::write(&report, &inputs, &args.out) {
        eprintln!("gpu-ipc report: could not write the report to {}: {e}", args.out.display());
        return EXIT_FAILED;
    }
    print_answers(&report, &args.out, args.json);
    if report.complete { EXIT_OK } else { EXIT_FAILED }
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
        assert_eq!(args.probes(), ProbeName::all());
        assert_eq!(args.passes(), vec![Pass::NoMps, Pass::Mps]);
        assert_eq!(args.out, PathBuf::from("gpu-ipc-report"));
        assert_eq!(args.timeout, 900);
        assert!(!args.quick && !args.json && args.from.is_none());
    }

    #[test]
    fn only_is_repeatable_and_ordered() {
        let args = parse(&["--only", "crash", "--only", "vmm-compat", "--only", "crash", "--mps-only"]).unwrap();
        assert_eq!(args.probes(), vec![crate::test_name("vmm-compat"), crate::test_name("crash")]);
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
    fn file_names() {
        assert_eq!(Pass::Mps.file_name(crate::test_name("vmm-compat")), "vmm-compat-mps.json");
        assert_eq!(Pass::NoMps.file_name(crate::test_name("overhead")), "overhead-no-mps.json");
        assert_eq!(serde_json::to_string(&crate::test_name("vmm-compat")).unwrap(), "\"vmm-compat\"");
    }
}
