//! The one trait every research probe implements, and the glue that lets the command line and the report treat
//! every probe alike: its subcommand is built from [`Probe::command`], its helper processes are routed by name,
//! its recorded results are typed and rendered through [`Probe::report_section`].

use clap::{ArgMatches, Args, Command, FromArgMatches};
use harness::child::{Channel, ChildTask};
use harness::report::{Plots, ReportSection};
use harness::{MeasurementError, MeasurementOutput, Verdict};
use serde::de::DeserializeOwned;
use serde_json::Value;

/// One research probe: the question it answers, the options of `gpu-ipc probe <name>`, the measurement, its helper
/// processes, its verdict, and its part of the report.
///
/// A probe is a folder of this crate with one type that implements this trait, listed once in [`crate::PROBES`];
/// nothing else names it.
pub trait Probe: Sync {
    /// The subcommand and file name, e.g. `vmm-compat`; the roles of its helper processes start with it and `-`.
    fn name(&self) -> &'static str;

    /// A short title for the list of answers, e.g. "Import overhead".
    fn title(&self) -> &'static str;

    /// The question it answers, as a heading and as the subcommand's help.
    fn question(&self) -> &'static str;

    /// The subcommand `gpu-ipc probe <name>` with its options (usually [`command_for`] of its clap `Args`).
    fn command(&self) -> Command;

    /// Runs the probe with the options parsed from [`Probe::command`]; returns the exit status
    /// ([`harness::exit`]).
    fn run(&self, matches: &ArgMatches) -> u8;

    /// The helper process's side: runs `task`, one of this probe's roles.
    ///
    /// # Errors
    /// An unknown role, or the role's failure (reported to the parent by [`harness::run::serve`]).
    fn child(&self, task: ChildTask, channel: &Channel) -> Result<(), MeasurementError>;

    /// The verdict this version draws from recorded `results`, so that a report rendered later from recorded JSON
    /// says what the current code concludes; `None` keeps the recorded verdict (the default).
    fn revise_verdict(&self, results: &Value) -> Option<Verdict> {
        let _ = results;
        None
    }

    /// The probe's section of the report from its documents without and with MPS (either may be absent). Charts
    /// go to `plots`; what the report should say went wrong (results that do not fit the probe's type) goes to
    /// `problems`. Usually [`typed_section`] of the probe's own typed renderer.
    fn report_section(
        &self,
        no_mps: Option<&MeasurementOutput<Value>>,
        mps: Option<&MeasurementOutput<Value>>,
        plots: &mut Plots,
        problems: &mut Vec<String>,
    ) -> ReportSection;
}

/// Implements [`Probe`] for a probe folder's type from the folder's parts, the way every probe does: its name, title
/// and question; its clap `Args` type and `main` (the subcommand and its run, through [`command_for`] and
/// [`run_with`]); its helper processes' `child`; its typed results and report section renderer (through
/// [`typed_section`]); and, where the probe revises recorded verdicts, its `verdict` function (through
/// [`typed_verdict`]). A probe whose part differs implements the trait by hand instead.
macro_rules! impl_probe {
    (
        $probe:ty {
            name: $name:literal,
            title: $title:literal,
            question: $question:literal,
            args: $args:ty,
            main: $main:path,
            child: $child:path,
            results: $results:ty,
            section: $section:path
            $(, verdict: $verdict:path)?
            $(,)?
        }
    ) => {
        impl $crate::probe::Probe for $probe {
            fn name(&self) -> &'static str {
                $name
            }

            fn title(&self) -> &'static str {
                $title
            }

            fn question(&self) -> &'static str {
                $question
            }

            fn command(&self) -> clap::Command {
                $crate::probe::command_for::<$args>(self.name(), self.question())
            }

            fn run(&self, matches: &clap::ArgMatches) -> u8 {
                $crate::probe::run_with(matches, $main)
            }

            fn child(
                &self,
                task: harness::child::ChildTask,
                channel: &harness::child::Channel,
            ) -> Result<(), harness::MeasurementError> {
                $child(task, channel)
            }

            $(
                fn revise_verdict(&self, results: &serde_json::Value) -> Option<harness::Verdict> {
                    $crate::probe::typed_verdict::<$results>(results, $verdict)
                }
            )?

            fn report_section(
                &self,
                no_mps: Option<&harness::MeasurementOutput<serde_json::Value>>,
                mps: Option<&harness::MeasurementOutput<serde_json::Value>>,
                plots: &mut harness::report::Plots,
                problems: &mut Vec<String>,
            ) -> harness::report::ReportSection {
                $crate::probe::typed_section::<$results>(self.name(), no_mps, mps, plots, problems, $section)
            }
        }
    };
}
pub(crate) use impl_probe;

/// The subcommand `name` with the options of `A` and `about` as its help.
pub fn command_for<A: Args>(name: &'static str, about: &'static str) -> Command {
    // After the options: their struct's doc comment would otherwise be the subcommand's help.
    A::augment_args(Command::new(name)).about(about).long_about(None)
}

/// The options of type `A` from `matches`; `Err` is clap's usage error.
///
/// # Errors
/// Options that do not fit `A` (clap has already checked them, so this is a programming error).
pub fn args_from<A: FromArgMatches>(matches: &ArgMatches) -> Result<A, clap::Error> {
    A::from_arg_matches(matches)
}

/// Runs `main` with the options of type `A` from `matches`, or prints the usage error.
pub fn run_with<A: FromArgMatches>(matches: &ArgMatches, main: impl FnOnce(&A) -> u8) -> u8 {
    match args_from::<A>(matches) {
        Ok(args) => main(&args),
        Err(e) => {
            let _ = e.print();
            harness::exit::EXIT_USAGE
        }
    }
}

/// A probe's section renderer, typed with its results.
pub type TypedRenderer<R> =
    fn(Option<&MeasurementOutput<R>>, Option<&MeasurementOutput<R>>, &mut Plots) -> ReportSection;

/// The section of the probe `name`: each document's results typed as `R` (a document whose results do not fit is
/// named in `problems` and left out), then `render`.
pub fn typed_section<R: DeserializeOwned>(
    name: &str,
    no_mps: Option<&MeasurementOutput<Value>>,
    mps: Option<&MeasurementOutput<Value>>,
    plots: &mut Plots,
    problems: &mut Vec<String>,
    render: TypedRenderer<R>,
) -> ReportSection {
    let mut convert = |suffix: &str, doc: Option<&MeasurementOutput<Value>>| {
        let doc = doc?;
        match typed_output::<R>(doc) {
            Ok(typed) => Some(typed),
            Err(e) => {
                problems
                    .push(format!("{name}-{suffix}.json: the results do not fit this version's {name} probe ({e})"));
                None
            }
        }
    };
    let no_mps = convert("no-mps", no_mps);
    let mps = convert("mps", mps);
    render(no_mps.as_ref(), mps.as_ref(), plots)
}

/// `doc` with its results typed as `R`.
///
/// # Errors
/// Results that do not deserialize as `R`.
pub fn typed_output<R: DeserializeOwned>(
    doc: &MeasurementOutput<Value>,
) -> Result<MeasurementOutput<R>, serde_json::Error> {
    Ok(MeasurementOutput {
        probe: doc.probe.clone(),
        schema: doc.schema,
        quick: doc.quick,
        env: doc.env.clone(),
        seconds: doc.seconds,
        results: serde_json::from_value(doc.results.clone())?,
        verdict: doc.verdict.clone(),
    })
}

/// The verdict `verdict` draws from `results` typed as `R`; `None` when they do not fit.
pub fn typed_verdict<R: DeserializeOwned>(results: &Value, verdict: fn(&R) -> Verdict) -> Option<Verdict> {
    serde_json::from_value::<R>(results.clone()).ok().map(|r| verdict(&r))
}

/// The file `relative` to this crate's directory, found at run time, so the tests built at one path run from a
/// checkout at another (a nextest archive replayed with `--workspace-remap`, a copied tree): cargo test and
/// cargo-nextest set `CARGO_MANIFEST_DIR` in the test process, and the path compiled in is only the fallback for a
/// test binary run by hand. Fails the test, saying how to point it at a checkout, when the file is not there.
#[cfg(test)]
pub(crate) fn package_file(relative: &str) -> std::path::PathBuf {
    let dir = std::path::PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR").unwrap_or_else(|| {
        panic!("CARGO_MANIFEST_DIR is not set: run the tests with cargo or cargo-nextest, or set it to CHECKOUT/probes")
    }));
    let path = dir.join(relative);
    assert!(
        path.exists(),
        "{} does not exist: run the tests from a checkout of the project (cargo nextest run, or an archive with \
         --workspace-remap CHECKOUT), or set CARGO_MANIFEST_DIR=CHECKOUT/probes for a test binary run by hand",
        path.display()
    );
    path
}
