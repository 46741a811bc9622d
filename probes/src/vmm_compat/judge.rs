//! One import run and how its evidence is judged: the order of writing, importing and reading back, and the
//! attempt each step earns. Pure (no CUDA), so it is tested with plain vectors as the exporter's memory.

use super::importer::{Pattern, Step, pattern_words};
use super::model::{Attempt, DATA_MISMATCH, Outcome, SUCCESS};

/// What the exporter read back from one region straight after a run's reply, or why it could not.
pub type ReadBack = Result<Vec<u32>, Attempt>;

/// The steps a run returned, or why it has none.
pub type Steps = Result<Vec<Step>, Attempt>;

/// One run of an import (in the child, or in this process as the control), with all its evidence: the
/// importer's steps, the patterns it was given (region `i` uses `patterns[i]`), and what the exporter read back
/// from each region right after the reply, before anything else wrote to that memory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Run {
    /// The importer's steps.
    pub steps: Steps,
    /// The patterns, one per region.
    pub patterns: Vec<Pattern>,
    /// The exporter's read-back, one per region (empty when the import did not run).
    pub read_back: Vec<ReadBack>,
}

impl Run {
    /// A run that has no data check (the IPC event).
    pub(super) fn without_data(steps: Steps) -> Self {
        Self { steps, patterns: Vec::new(), read_back: Vec::new() }
    }
}

/// The exporter's memory as the import sequence sees it: the allocation's regions on the GPU in the probe, plain
/// vectors in the tests.
pub trait ExporterMemory {
    /// Writes the pattern starting at `base` into region `region` and waits until it has landed.
    ///
    /// # Errors
    /// The failed attempt, as the cell should record it.
    fn write(&mut self, region: usize, base: u32, words: u32) -> Result<(), Attempt>;
    /// Reads `words` words of region `region`.
    fn read(&mut self, region: usize, words: u32) -> ReadBack;
}

/// One import run, in the only order in which the exporter's read-back means something: write the exporter's
/// pattern into every region; let the importer run to its reply (it reads that pattern, writes its own and
/// synchronises before replying); then read every region back at once, before the next run rewrites it.
///
/// Reading back later (the probe once read back after the control run had rewritten the memory) compares the
/// importer's pattern with somebody else's and reports a spurious `DATA_MISMATCH`.
pub fn run_import<M: ExporterMemory>(
    memory: &mut M,
    patterns: Vec<Pattern>,
    import: impl FnOnce(&mut M, &[Pattern]) -> Steps,
) -> Run {
    for (region, p) in patterns.iter().enumerate() {
        if let Err(failed) = memory.write(region, p.expect, p.words) {
            return Run { steps: Err(failed), patterns, read_back: Vec::new() };
        }
    }
    let steps = import(memory, &patterns);
    let read_back = if steps.is_ok() {
        patterns.iter().enumerate().map(|(region, p)| memory.read(region, p.words)).collect()
    } else {
        Vec::new()
    };
    Run { steps, patterns, read_back }
}

/// Both runs of one import on the same memory: first between two processes, then the same-process control, each
/// one prepared, served and read back before the next begins.
pub fn run_both<M: ExporterMemory>(
    memory: &mut M,
    cross: (Vec<Pattern>, impl FnOnce(&mut M, &[Pattern]) -> Steps),
    control: (Vec<Pattern>, impl FnOnce(&mut M, &[Pattern]) -> Steps),
) -> (Run, Run) {
    let cross = run_import(memory, cross.0, cross.1);
    let control = run_import(memory, control.0, control.1);
    (cross, control)
}

/// The first word of a read-back, for a mismatch's detail.
fn first_word(words: &[u32]) -> String {
    words.first().map_or_else(|| "nothing".to_owned(), |w| format!("{w:#010x}"))
}

/// The attempt of step `step` of `run`; with `region` set the import also wrote data, and the exporter's
/// read-back of that region must be the importer's pattern.
pub fn judge(run: &Run, step: usize, region: Option<usize>) -> Attempt {
    let steps = match &run.steps {
        Err(failed) => return failed.clone(),
        Ok(steps) => steps,
    };
    let attempt = attempt_of(steps.get(step));
    let Some(region) = region else { return attempt };
    if attempt.outcome != Outcome::Works {
        return attempt;
    }
    let Some(pattern) = run.patterns.get(region) else {
        return Attempt::fails(DATA_MISMATCH, "no pattern for this region");
    };
    match run.read_back.get(region) {
        None => Attempt::fails(DATA_MISMATCH, "the exporter did not read this region back"),
        Some(Err(failed)) => failed.clone(),
        Some(Ok(seen)) if *seen == pattern_words(pattern.write, pattern.words) => attempt,
        Some(Ok(seen)) if *seen == pattern_words(pattern.expect, pattern.words) => Attempt::fails(
            DATA_MISMATCH,
            "the exporter read back its own pattern: the importer's write did not reach the exporter's memory",
        ),
        Some(Ok(seen)) => Attempt::fails(
            DATA_MISMATCH,
            format!(
                "the exporter did not read back the importer's pattern (first word {}, expected {:#010x})",
                first_word(seen),
                pattern.write
            ),
        ),
    }
}

/// The legacy import of every region: each handle must open, carry its own data, and each write come back.
pub fn judge_every_region(run: &Run, regions: usize) -> Attempt {
    (0..regions).map(|i| judge(run, i, Some(i))).find(|a| a.outcome != Outcome::Works).unwrap_or_else(Attempt::works)
}

fn attempt_of(step: Option<&Step>) -> Attempt {
    match step {
        None => Attempt::fails(DATA_MISMATCH, "the importer sent no result for this step"),
        Some(s) if s.code != SUCCESS => Attempt::fails(&s.code, s.call.clone()),
        Some(s) if s.read_ok == Some(false) => {
            Attempt::fails(DATA_MISMATCH, "the importer did not read the exporter's pattern")
        }
        Some(_) => Attempt::works(),
    }
}
