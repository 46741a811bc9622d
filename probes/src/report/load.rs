//! Reading the probes' JSON for the report: every file first as a [`MeasurementOutput`] of untyped results (for the
//! envelope: where it ran, how long it took, its verdict), then handed to the probe's own
//! [`Probe::report_section`](crate::Probe::report_section), which types the results. A missing or unreadable file is a problem the report names, never a panic.

use std::panic::AssertUnwindSafe;
use std::path::{Path, PathBuf};

use serde_json::Value;

use super::Pass;
use super::run::{RUN_LOG_FILE, RunLog, RunStatus};
use crate::ProbeName;
use harness::report::{Plots, ReportSection};
use harness::{MeasurementOutput, SCHEMA_VERSION};

/// What the report is made from.
#[derive(Debug)]
pub struct ReportInputs {
    /// Each probe, in report order.
    pub probes: Vec<ProbeInputs>,
    /// The passes asked for.
    pub passes: Vec<Pass>,
    /// The log of the report run that produced the documents, when known.
    pub run_log: Option<RunLog>,
    /// This report's command line.
    pub command: String,
    /// Where the documents were read from.
    pub source_dir: PathBuf,
}

/// One probe's documents.
#[derive(Debug)]
pub struct ProbeInputs {
    /// Which probe.
    pub probe: ProbeName,
    /// One per pass asked for.
    pub passes: Vec<PassInput>,
}

/// One probe's document in one pass.
#[derive(Debug)]
pub struct PassInput {
    /// Which pass.
    pub pass: Pass,
    /// The file it was read from.
    pub source: PathBuf,
    /// The document, or why there is none.
    pub document: Result<MeasurementOutput<Value>, DocumentError>,
    /// How its run ended, when the run log says.
    pub run: Option<RunStatus>,
}

impl PassInput {
    pub(crate) fn doc(&self) -> Option<&MeasurementOutput<Value>> {
        self.document.as_ref().ok()
    }

    /// Why this pass has no document: its run's failure when known, else the loading error.
    pub(crate) fn why_missing(&self) -> Option<String> {
        let error = self.document.as_ref().err()?;
        Some(match &self.run {
            // A file that is there but does not read is named with its error even when the run failed.
            Some(status) if !status.is_ok() && self.source.exists() => {
                format!("{}: {}; {error}", self.pass.label(), status.describe())
            }
            Some(status) if !status.is_ok() => format!("{}: {}", self.pass.label(), status.describe()),
            _ => format!("{}: {error}", self.pass.label()),
        })
    }
}

/// Why a probe's document could not be read; each names the file as the report shows it.
#[derive(Debug, thiserror::Error)]
pub enum DocumentError {
    /// There is no such file (the probe did not run, or wrote elsewhere).
    #[error("{shown_as}: not found")]
    NotFound {
        /// The file, as the report names it.
        shown_as: String,
    },
    /// The file is there but could not be read.
    #[error("{shown_as}: cannot be read: {source}")]
    Unreadable {
        /// The file, as the report names it.
        shown_as: String,
        /// The OS error.
        source: std::io::Error,
    },
    /// The file is not a probe's JSON document.
    #[error("{shown_as}: not a probe's JSON document: {source}")]
    NotProbeJson {
        /// The file, as the report names it.
        shown_as: String,
        /// The decoding error.
        source: serde_json::Error,
    },
}

/// Reads `path` as a probe's document; `Err` names the file (as `shown_as`, so that a report reads the same
/// wherever its documents were read from) and says what is wrong with it.
///
/// # Errors
/// A missing or unreadable file, or one that is not a probe's JSON document.
pub fn load_document(path: &Path, shown_as: &str) -> Result<MeasurementOutput<Value>, DocumentError> {
    let shown_as = shown_as.to_owned();
    let text = match std::fs::read_to_string(path) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Err(DocumentError::NotFound { shown_as }),
        Err(source) => return Err(DocumentError::Unreadable { shown_as, source }),
    };
    serde_json::from_str(&text).map_err(|source| DocumentError::NotProbeJson { shown_as, source })
}

/// Reads `dir/runs.json`, the log of the report run that produced `dir`, when there is one.
pub fn read_run_log(dir: &Path) -> Option<RunLog> {
    let path = dir.join(RUN_LOG_FILE);
    let text = std::fs::read_to_string(&path).ok()?;
    match serde_json::from_str(&text) {
        Ok(log) => Some(log),
        Err(e) => {
            tracing::warn!(path = %path.display(), %e, "the run log is not readable; ignoring it");
            None
        }
    }
}

/// The verdict of a recorded run as this version's verdict logic reads its results (the logic is a pure function of
/// the results, so a report rendered later from recorded JSON says what the current code concludes). A document
/// whose results do not fit keeps its recorded verdict (the section reports the mismatch).
pub fn revise_verdict(probe: ProbeName, mut doc: MeasurementOutput<Value>) -> MeasurementOutput<Value> {
    if let Some(verdict) = probe.probe().revise_verdict(&doc.results) {
        doc.verdict = verdict;
    }
    doc
}

/// Loads `source/<probe>-<pass>.json` for every probe and pass, with what the run log says about each run.
/// `command` is this report's command line.
pub fn load_inputs(
    source: &Path,
    probes: &[ProbeName],
    passes: &[Pass],
    run_log: Option<RunLog>,
    command: &str,
) -> ReportInputs {
    let probes = probes
        .iter()
        .map(|&probe| ProbeInputs {
            probe,
            passes: passes
                .iter()
                .map(|&pass| {
                    let name = pass.file_name(probe);
                    let path = source.join(&name);
                    PassInput {
                        pass,
                        document: load_document(&path, &name).map(|doc| revise_verdict(probe, doc)),
                        source: path,
                        run: run_log.as_ref().and_then(|log| log.record(probe, pass)).map(|r| r.status.clone()),
                    }
                })
                .collect(),
        })
        .collect();
    ReportInputs {
        probes,
        passes: passes.to_vec(),
        run_log,
        command: command.to_owned(),
        source_dir: PathBuf::from(source),
    }
}

/// Where the report gets each probe's section from: the probes' own `report_section` ([`TypedSections`]), or a
/// stand-in in tests.
pub trait SectionSource {
    /// The section of `probe` from its documents without and with MPS (either may be absent). Charts go to
    /// `plots`; what the report should say went wrong (a document whose results do not fit the probe's type)
    /// goes to `problems`.
    fn section(
        &self,
        probe: ProbeName,
        no_mps: Option<&MeasurementOutput<Value>>,
        mps: Option<&MeasurementOutput<Value>>,
        plots: &mut Plots,
        problems: &mut Vec<String>,
    ) -> ReportSection;
}

/// The probes' own sections: each probe's [`Probe::report_section`](crate::Probe::report_section).
#[derive(Debug, Clone, Copy, Default)]
pub struct TypedSections;

impl SectionSource for TypedSections {
    fn section(
        &self,
        probe: ProbeName,
        no_mps: Option<&MeasurementOutput<Value>>,
        mps: Option<&MeasurementOutput<Value>>,
        plots: &mut Plots,
        problems: &mut Vec<String>,
    ) -> ReportSection {
        probe.probe().report_section(no_mps, mps, plots, problems)
    }
}

/// The section of `probe` from `source`, with a renderer that panics or complains reported as a problem: one
/// probe's rendering bug must not cost the report of a long GPU run. The section's charts are added to `plots`
/// only when it rendered.
pub fn section_or_problem(
    source: &dyn SectionSource,
    probe: ProbeName,
    no_mps: Option<&MeasurementOutput<Value>>,
    mps: Option<&MeasurementOutput<Value>>,
    plots: &mut Plots,
    problems: &mut Vec<String>,
) -> Option<ReportSection> {
    let mut own_plots = Plots::default();
    let mut own_problems = Vec::new();
    let rendered = std::panic::catch_unwind(AssertUnwindSafe(|| {
        source.section(probe, no_mps, mps, &mut own_plots, &mut own_problems)
    }));
    problems.append(&mut own_problems);
    match rendered {
        Ok(mut section) => {
            // Stems are unique within a section; made unique across sections here, and the section's Markdown
            // rewritten to match where one had to change (through placeholders, so that `a` -> `a-2` and
            // `a-2` -> `a-3` do not run into each other).
            let mut renamed = Vec::new();
            for (n, chart) in own_plots.charts.into_iter().enumerate() {
                let old = chart.file_stem.clone();
                plots.line_chart(chart);
                let new = plots.charts.last().map_or_else(String::new, |c| c.file_stem.clone());
                if new != old {
                    let placeholder = format!("\u{0}chart{n}\u{0}");
                    section.body = section.body.replace(&format!("(plots/{old}.svg)"), &placeholder);
                    renamed.push((placeholder, new));
                }
            }
            for (placeholder, new) in renamed {
                section.body = section.body.replace(&placeholder, &format!("(plots/{new}.svg)"));
            }
            Some(section)
        }
        Err(panic) => {
            let what = panic
                .downcast_ref::<&str>()
                .map(|s| (*s).to_owned())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "no message".to_owned());
            problems.push(format!("the {probe} section could not be rendered (it panicked: {what})"));
            None
        }
    }
}

/// Checks the envelope of a document that loaded: the right probe, a schema this version reads.
pub fn envelope_problems(probe: ProbeName, pass: Pass, doc: &MeasurementOutput<Value>) -> Vec<String> {
    let file = pass.file_name(probe);
    let mut problems = Vec::new();
    if doc.probe != probe.name() {
        problems.push(format!("{file}: says it is from the {:?} probe, not {probe}", doc.probe));
    }
    if doc.schema != SCHEMA_VERSION {
        problems.push(format!(
            "{file}: schema version {} (this gpu-ipc reads version {SCHEMA_VERSION}); figures may be misread",
            doc.schema
        ));
    }
    problems
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;
    use crate::report::render::tests::testdata;

    #[test]
    fn documents_load_or_say_why_not() {
        let dir = testdata();
        let doc = load_document(&dir.join("overhead-no-mps.json"), "overhead-no-mps.json").unwrap();
        assert_eq!(doc.probe, "overhead");
        assert_eq!(doc.env.devices[0].name, "NVIDIA H100 80GB HBM3");
        assert!(!doc.env.mps);
        let missing = load_document(&dir.join("vmm-compat-mps.json"), "vmm-compat-mps.json").unwrap_err();
        assert!(matches!(&missing, DocumentError::NotFound { .. }), "{missing}");
        assert!(missing.to_string().ends_with("vmm-compat-mps.json: not found"), "{missing}");
        let broken = load_document(&dir.join("crash-no-mps.json"), "crash-no-mps.json").unwrap_err();
        assert!(broken.to_string().contains("crash-no-mps.json: not a probe's JSON document: "), "{broken}");
    }

    #[test]
    fn the_typed_sections_accept_recorded_documents() {
        let dir = testdata();
        let no_mps = load_document(&dir.join("overhead-no-mps.json"), "overhead-no-mps.json").unwrap();
        let mps = load_document(&dir.join("overhead-mps.json"), "overhead-mps.json").unwrap();
        for probe in ProbeName::all() {
            let (mut plots, mut problems) = (Plots::default(), Vec::new());
            let section =
                section_or_problem(&TypedSections, probe, Some(&no_mps), Some(&mps), &mut plots, &mut problems);
            assert!(section.is_some(), "{probe}: {problems:?}");
        }
    }

    #[test]
    fn results_of_the_wrong_shape_are_a_problem_not_a_panic() {
        #[derive(Debug, serde::Deserialize)]
        #[allow(dead_code)]
        struct Strict {
            cells: Vec<u32>,
        }
        let mut doc = load_document(&testdata().join("overhead-no-mps.json"), "overhead-no-mps.json").unwrap();
        doc.results = serde_json::json!({"cells": "not a list"});
        let mut problems = Vec::new();
        let section = crate::typed_section::<Strict>(
            "overhead",
            Some(&doc),
            None,
            &mut Plots::default(),
            &mut problems,
            |no_mps, mps, _| {
                assert!(no_mps.is_none() && mps.is_none());
                ReportSection::missing("overhead")
            },
        );
        assert_eq!(section, ReportSection::missing("overhead"));
        assert_eq!(problems.len(), 1);
        assert!(problems[0].starts_with("overhead-no-mps.json: the results do not fit"), "{problems:?}");
    }

    #[test]
    fn envelopes_are_checked() {
        let mut doc = load_document(&testdata().join("overhead-no-mps.json"), "overhead-no-mps.json").unwrap();
        assert!(envelope_problems(crate::test_name("overhead"), Pass::NoMps, &doc).is_empty());
        doc.schema = 99;
        doc.probe = "crash".to_owned();
        let problems = envelope_problems(crate::test_name("overhead"), Pass::NoMps, &doc);
        assert_eq!(problems.len(), 2, "{problems:?}");
    }
}
