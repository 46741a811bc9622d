//! What the runs found, as data: a child process's end, the classification of a kill trial, the per-cell counts
//! and the checks every part ends in. Pure (no processes, no GPU): unit-tested here.

use std::time::Duration;

use gpu_ipc::core::frames::run_ahead_depth;
use serde::Serialize;

use super::schedule::{Cell, KillPoint};

/// Exit status of a consumer that saw its producer go (`examples/src/lib.rs`, `EXIT_PRODUCER_GONE`).
pub const EXIT_PRODUCER_GONE: i32 = 4;
/// Exit status of a consumer the producer evicted (`EXIT_EVICTED`).
pub const EXIT_EVICTED: i32 = 5;

/// The verdict of one check.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Status {
    /// It held.
    Passed,
    /// It did not: the run exits 1.
    Failed,
    /// Something worth recording that is documented as expected (legacy IPC across PID namespaces, an MPS server
    /// fault after a kill), or the driver's answer to an open question (a CUDA import refused to a process of
    /// another user): reported, not a failure.
    Finding,
    /// Not run, with why (no root, no MPS, an API not there yet).
    #[default]
    NotRun,
}

impl Status {
    /// Its word in tables.
    pub fn word(self) -> &'static str {
        match self {
            Self::Passed => "passed",
            Self::Failed => "FAILED",
            Self::Finding => "finding",
            Self::NotRun => "not run",
        }
    }
}

/// One check of one part, with what was seen.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Check {
    /// `hostile`, `namespace`, `users`, `kills`, `cycles`, `evict`.
    pub part: String,
    /// What was checked, e.g. `vmm: the producer's longest publish gap < 100 ms`.
    pub name: String,
    /// The verdict.
    pub status: Status,
    /// What was seen (figures, errors).
    pub detail: String,
}

impl Check {
    /// A check that passed when `ok`, else failed.
    pub fn pass_if(part: &str, name: impl Into<String>, ok: bool, detail: impl Into<String>) -> Self {
        Self::new(part, name, if ok { Status::Passed } else { Status::Failed }, detail)
    }

    /// A check with this status.
    pub fn new(part: &str, name: impl Into<String>, status: Status, detail: impl Into<String>) -> Self {
        Self { part: part.to_owned(), name: name.into(), status, detail: detail.into() }
    }
}

/// How a child process ended.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct ProcEnd {
    /// `producer`, `consumer a`, ...
    pub name: String,
    /// Its exit code; `None` when a signal ended it (ours, for a victim or a hang).
    pub exit: Option<i32>,
    /// It was still running at its deadline and was killed: a hang.
    pub hung: bool,
    /// Seconds from the kill of the trial's victim to this process's end (kill trials).
    pub after_kill_s: Option<f64>,
    /// Its `--json` summary, when it printed one.
    pub summary: Option<serde_json::Value>,
    /// The last lines of its stderr.
    pub stderr_tail: String,
}

impl ProcEnd {
    /// A number from its summary.
    pub fn num(&self, key: &str) -> Option<f64> {
        self.summary.as_ref()?.get(key)?.as_f64()
    }

    /// A whole number from its summary.
    pub fn count(&self, key: &str) -> Option<u64> {
        self.summary.as_ref()?.get(key)?.as_u64()
    }

    /// A string from its summary.
    pub fn text(&self, key: &str) -> Option<&str> {
        self.summary.as_ref()?.get(key)?.as_str()
    }

    /// `exit N` / `killed` / `hung`, with the last stderr line when it failed.
    pub fn describe(&self) -> String {
        let how = match (self.hung, self.exit) {
            (true, _) => "hung (killed at its deadline)".to_owned(),
            (false, Some(code)) => format!("exit {code}"),
            (false, None) => "killed by a signal".to_owned(),
        };
        let last = self.stderr_tail.lines().rev().find(|l| !l.trim().is_empty()).unwrap_or("");
        if self.exit == Some(0) || last.is_empty() {
            format!("{}: {how}", self.name)
        } else {
            format!("{}: {how}: {last}", self.name)
        }
    }
}

/// Whether a survivor's error is the MPS server faulting for every client (the known effect of killing a process
/// whose kernel touches shared memory under MPS: error 700), rather than a fault of ours.
pub fn looks_like_mps_fault(stderr: &str) -> bool {
    ["CUDA_ERROR_ILLEGAL_ADDRESS", "(700)", "CUDA_ERROR_MPS_", "MPS server"].iter().any(|n| stderr.contains(n))
}

/// How one kill trial ended.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "kind", rename_all = "kebab-case")]
pub enum TrialOutcome {
    /// Every survivor did what it must.
    Passed,
    /// A process did not end within its deadline (killed, counted).
    Hang {
        /// Who.
        who: String,
    },
    /// Under MPS, the survivors failed with the server's fault (finding, counted apart).
    MpsFault {
        /// What they said.
        detail: String,
    },
    /// Anything else that is wrong.
    Failed {
        /// Why.
        reason: String,
    },
}

/// One kill trial, as recorded.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Trial {
    /// Its cell.
    pub cell: Cell,
    /// Its number in the cell.
    pub trial: u32,
    /// When the victim was to be killed.
    pub kill: KillPoint,
    /// Milliseconds from the producer's start to the kill (`None`: the kill never happened).
    pub killed_at_ms: Option<f64>,
    /// The verdict.
    pub outcome: TrialOutcome,
    /// Producer killed: seconds from the kill to each consumer's exit.
    pub gone_s: Vec<f64>,
    /// Consumer killed: frames the survivor should have read and did not.
    pub lost_frames: u64,
    /// Mismatched words the survivors' verify kernels counted.
    pub mismatched_words: u64,
    /// Producer killed: frames the consumers took that it had never published (the API says which).
    pub frames_never_published: u64,
    /// Producer killed: frames the consumers' kernels skipped because their stamp was not the producer's.
    pub frames_skipped: u64,
}

/// Ring slots of the kill trials.
pub const KILL_TRIAL_SLOTS: u32 = 2;

/// Frames a GPU-side producer may have queued that its stream never ran before the kill: its run-ahead depth
/// ([`run_ahead_depth`]). The consumers are told such frames were published (the producer's host count passed them
/// when it queued them), but their stamps say the device never wrote them, and a stamped consumer rightly skips
/// them: measured on an H100, 1 or 2 per trial.
pub const QUEUED_NEVER_RUN: u64 = run_ahead_depth(KILL_TRIAL_SLOTS) as u64;

/// Classifies a trial whose producer was killed: each consumer must exit with `ProducerGone` within `bound`.
/// A consumer that checks frames behind their stamp (it reports `skipped_frames`: the GPU-side strategies) reads
/// only frames the producer wrote, so any mismatched word of it fails the trial, and so does skipping more frames
/// than it took unpublished, beyond [`QUEUED_NEVER_RUN`] (a published frame skipped). For one that does not, mismatched words are allowed only in
/// frames it was told the dead producer never published (its `frames_never_published`, `frame_words` each).
pub fn producer_killed(
    consumers: &[ProcEnd],
    bound: Duration,
    mps: bool,
    frame_words: u64,
) -> (TrialOutcome, Vec<f64>, u64) {
    let gone_s: Vec<f64> = consumers.iter().filter_map(|c| c.after_kill_s).collect();
    let mismatched = consumers.iter().filter_map(|c| c.count("mismatched_words")).sum();
    if let Some(hung) = consumers.iter().find(|c| c.hung) {
        return (TrialOutcome::Hang { who: hung.name.clone() }, gone_s, mismatched);
    }
    let wrong: Vec<&ProcEnd> = consumers.iter().filter(|c| c.exit != Some(EXIT_PRODUCER_GONE)).collect();
    if !wrong.is_empty() {
        if mps && wrong.iter().any(|c| looks_like_mps_fault(&c.stderr_tail)) {
            let detail = wrong.iter().map(|c| c.describe()).collect::<Vec<_>>().join("; ");
            return (TrialOutcome::MpsFault { detail }, gone_s, mismatched);
        }
        let reason = wrong
            .iter()
            .map(|c| format!("{} (expected exit {EXIT_PRODUCER_GONE}, ProducerGone)", c.describe()))
            .collect::<Vec<_>>()
            .join("; ");
        return (TrialOutcome::Failed { reason }, gone_s, mismatched);
    }
    if let Some(slow) = consumers.iter().find(|c| c.after_kill_s.is_some_and(|s| s > bound.as_secs_f64())) {
        let reason = format!(
            "{} saw ProducerGone {:.3} s after the kill (bound {:?})",
            slow.name,
            slow.after_kill_s.unwrap_or(0.0),
            bound
        );
        return (TrialOutcome::Failed { reason }, gone_s, mismatched);
    }
    for c in consumers {
        let Some(skipped) = c.count("skipped_frames") else { continue };
        let (words, never) = (c.count("mismatched_words").unwrap_or(0), c.count("frames_never_published").unwrap_or(0));
        let problem = if words != 0 {
            format!("{words} mismatched words in frames whose stamp said the producer wrote them")
        } else if skipped > never + QUEUED_NEVER_RUN {
            format!(
                "{skipped} frames skipped, more than the {never} it took that the producer never published and the \
                 {QUEUED_NEVER_RUN} it may have queued that its stream never ran"
            )
        } else {
            continue;
        };
        return (TrialOutcome::Failed { reason: format!("{}: {problem}", c.name) }, gone_s, mismatched);
    }
    let unstamped = consumers.iter().filter(|c| c.count("skipped_frames").is_none());
    let flagged: u64 = unstamped.filter_map(|c| c.count("frames_never_published")).sum();
    if mismatched > flagged.saturating_mul(frame_words) {
        return (
            TrialOutcome::Failed {
                reason: format!(
                    "{mismatched} mismatched words, more than in the {flagged} frames the consumers were told were \
                     never published"
                ),
            },
            gone_s,
            mismatched,
        );
    }
    (TrialOutcome::Passed, gone_s, mismatched)
}

/// Classifies a trial whose first consumer was killed: the producer must produce all `frames` and count one
/// consumer lost; the survivor must read every one of them with 0 mismatched words.
pub fn consumer_killed(producer: &ProcEnd, survivor: &ProcEnd, frames: u64, mps: bool) -> (TrialOutcome, u64, u64) {
    let read = survivor.count("frames").unwrap_or(0);
    let lost = frames.saturating_sub(read);
    let mismatched = survivor.count("mismatched_words").unwrap_or(0);
    for p in [producer, survivor] {
        if p.hung {
            return (TrialOutcome::Hang { who: p.name.clone() }, lost, mismatched);
        }
    }
    if producer.exit != Some(0) || survivor.exit != Some(0) {
        let both = [producer, survivor].iter().filter(|p| p.exit != Some(0)).map(|p| p.describe()).collect::<Vec<_>>();
        if mps && [producer, survivor].iter().any(|p| looks_like_mps_fault(&p.stderr_tail)) {
            return (TrialOutcome::MpsFault { detail: both.join("; ") }, lost, mismatched);
        }
        return (TrialOutcome::Failed { reason: both.join("; ") }, lost, mismatched);
    }
    let produced = producer.count("frames").unwrap_or(0);
    let lost_consumers = producer.count("consumers_lost").unwrap_or(0);
    let mut problems = Vec::new();
    if produced != frames {
        problems.push(format!("the producer made {produced} of {frames} frames"));
    }
    if lost != 0 {
        problems.push(format!("the survivor read {read} of {frames} frames"));
    }
    if mismatched != 0 {
        problems.push(format!("{mismatched} mismatched words"));
    }
    if lost_consumers != 1 {
        problems.push(format!("the producer counted {lost_consumers} consumers lost, not 1"));
    }
    if problems.is_empty() {
        (TrialOutcome::Passed, lost, mismatched)
    } else {
        (TrialOutcome::Failed { reason: problems.join("; ") }, lost, mismatched)
    }
}

/// The counts of one cell of the kill matrix.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct CellCounts {
    /// The cell.
    pub cell: Cell,
    /// Trials run (kills attempted).
    pub kills: u32,
    /// Trials that passed.
    pub passed: u32,
    /// Trials with a process past its deadline.
    pub hangs: u32,
    /// Trials that failed otherwise.
    pub failed: u32,
    /// Trials where the MPS server faulted for every client (findings).
    pub mps_faults: u32,
    /// Frames consumers took that the dead producer never published (told by the API; their words may mismatch).
    pub never_published: u64,
    /// Frames consumers' kernels skipped because their stamp was not the producer's.
    pub skipped: u64,
    /// Frames survivors should have read and did not.
    pub lost_frames: u64,
    /// Mismatched words.
    pub mismatched_words: u64,
    /// Producer kills: the slowest and the median `ProducerGone`, in seconds.
    pub gone_max_s: Option<f64>,
    /// Median of the same.
    pub gone_median_s: Option<f64>,
}

impl CellCounts {
    /// Counts `trials` (all of `cell`).
    pub fn of(cell: Cell, trials: &[&Trial]) -> Self {
        let count = |f: &dyn Fn(&TrialOutcome) -> bool| trials.iter().filter(|t| f(&t.outcome)).count() as u32;
        let mut gone: Vec<f64> = trials.iter().flat_map(|t| t.gone_s.iter().copied()).collect();
        gone.sort_by(f64::total_cmp);
        Self {
            cell,
            kills: trials.len() as u32,
            passed: count(&|o| matches!(o, TrialOutcome::Passed)),
            hangs: count(&|o| matches!(o, TrialOutcome::Hang { .. })),
            failed: count(&|o| matches!(o, TrialOutcome::Failed { .. })),
            mps_faults: count(&|o| matches!(o, TrialOutcome::MpsFault { .. })),
            never_published: trials.iter().map(|t| t.frames_never_published).sum(),
            skipped: trials.iter().map(|t| t.frames_skipped).sum(),
            lost_frames: trials.iter().map(|t| t.lost_frames).sum(),
            mismatched_words: trials.iter().map(|t| t.mismatched_words).sum(),
            gone_max_s: gone.last().copied(),
            gone_median_s: (!gone.is_empty()).then(|| gone[gone.len() / 2]),
        }
    }

    /// Counts every cell of `trials`, in the order cells first appear.
    pub fn all(trials: &[Trial]) -> Vec<Self> {
        let mut cells: Vec<Cell> = Vec::new();
        for t in trials {
            if !cells.contains(&t.cell) {
                cells.push(t.cell);
            }
        }
        cells.into_iter().map(|c| Self::of(c, &trials.iter().filter(|t| t.cell == c).collect::<Vec<_>>())).collect()
    }

    /// The cell's check: no hang, no failure (MPS faults are findings).
    pub fn status(&self) -> Status {
        if self.hangs + self.failed > 0 {
            Status::Failed
        } else if self.mps_faults > 0 {
            Status::Finding
        } else {
            Status::Passed
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::schedule::Victim;

    fn end(name: &str, exit: Option<i32>, summary: serde_json::Value) -> ProcEnd {
        ProcEnd { name: name.into(), exit, summary: Some(summary), ..ProcEnd::default() }
    }

    fn gone(name: &str, after: f64) -> ProcEnd {
        ProcEnd { after_kill_s: Some(after), ..end(name, Some(4), serde_json::json!({"mismatched_words": 0})) }
    }

    const B: Duration = Duration::from_secs(2);

    #[test]
    fn a_producer_kill_passes_when_every_consumer_saw_producer_gone_in_time() {
        let (o, g, m) = producer_killed(&[gone("a", 0.2), gone("b", 0.3)], B, false, 691_200);
        assert_eq!(o, TrialOutcome::Passed);
        assert_eq!(g, vec![0.2, 0.3]);
        assert_eq!(m, 0);
    }

    #[test]
    fn mismatches_pass_only_inside_the_frames_flagged_never_published() {
        let flagged = |name: &str, words: u64, frames: u64| ProcEnd {
            after_kill_s: Some(0.2),
            ..end(name, Some(4), serde_json::json!({"mismatched_words": words, "frames_never_published": frames}))
        };
        let (o, _, m) = producer_killed(&[flagged("a", 2 * 100, 2), flagged("b", 100, 1)], B, false, 100);
        assert_eq!((o, m), (TrialOutcome::Passed, 300));
        let (o, ..) = producer_killed(&[flagged("a", 301, 2), flagged("b", 0, 1)], B, false, 100);
        assert!(matches!(o, TrialOutcome::Failed { .. }), "{o:?}");
        let (o, ..) = producer_killed(&[flagged("a", 1, 0), flagged("b", 0, 0)], B, false, 100);
        assert!(matches!(o, TrialOutcome::Failed { .. }), "{o:?}");
    }

    #[test]
    fn a_consumer_that_checks_stamps_fails_on_any_mismatch_or_on_skipping_a_published_frame() {
        let stamped = |name: &str, words: u64, never: u64, skipped: u64| ProcEnd {
            after_kill_s: Some(0.2),
            ..end(
                name,
                Some(4),
                serde_json::json!({"mismatched_words": words, "frames_never_published": never, "skipped_frames": skipped}),
            )
        };
        let (o, _, m) = producer_killed(&[stamped("a", 0, 3, 3), stamped("b", 0, 2, 1)], B, false, 100);
        assert_eq!((o, m), (TrialOutcome::Passed, 0));
        // Mismatched words inside the frames flagged never published: no excuse once the stamp was checked.
        let (o, ..) = producer_killed(&[stamped("a", 100, 3, 2), stamped("b", 0, 2, 2)], B, false, 100);
        assert!(matches!(o, TrialOutcome::Failed { ref reason } if reason.contains("a: 100 mismatched")), "{o:?}");
        // Queued by the producer (so counted as published) but never run by its stream: skipped, rightly.
        let (o, ..) =
            producer_killed(&[stamped("a", 0, 3, 4), stamped("b", 0, 2, 2 + QUEUED_NEVER_RUN)], B, false, 100);
        assert_eq!(o, TrialOutcome::Passed);
        let (o, ..) =
            producer_killed(&[stamped("a", 0, 3, 3), stamped("b", 0, 2, 3 + QUEUED_NEVER_RUN)], B, false, 100);
        assert!(matches!(o, TrialOutcome::Failed { ref reason } if reason.contains("b: 35 frames skipped")), "{o:?}");
    }

    #[test]
    fn a_producer_kill_fails_on_a_slow_or_wrong_exit_and_counts_hangs() {
        let (o, ..) = producer_killed(&[gone("a", 0.2), gone("b", 2.5)], B, false, 691_200);
        assert!(matches!(o, TrialOutcome::Failed { ref reason } if reason.contains("b saw ProducerGone 2.500 s")));
        let crashed = ProcEnd { stderr_tail: "consumer: boom\n".into(), ..end("b", Some(1), serde_json::json!({})) };
        let (o, ..) = producer_killed(&[gone("a", 0.2), crashed.clone()], B, false, 691_200);
        assert!(matches!(o, TrialOutcome::Failed { ref reason } if reason.contains("b: exit 1: consumer: boom")));
        let hung = ProcEnd { hung: true, ..crashed };
        assert_eq!(
            producer_killed(&[gone("a", 0.2), hung], B, false, 691_200).0,
            TrialOutcome::Hang { who: "b".into() }
        );
    }

    #[test]
    fn an_illegal_address_under_mps_is_a_finding_and_without_mps_a_failure() {
        let faulted = ProcEnd {
            stderr_tail: "consumer: cuStreamSynchronize failed: CUDA_ERROR_ILLEGAL_ADDRESS (700): ...".into(),
            ..end("b", Some(1), serde_json::json!({}))
        };
        assert!(matches!(
            producer_killed(&[gone("a", 0.2), faulted.clone()], B, true, 691_200).0,
            TrialOutcome::MpsFault { .. }
        ));
        assert!(matches!(
            producer_killed(&[gone("a", 0.2), faulted.clone()], B, false, 691_200).0,
            TrialOutcome::Failed { .. }
        ));
        let producer = end("producer", Some(0), serde_json::json!({"frames": 100, "consumers_lost": 1}));
        assert!(matches!(consumer_killed(&producer, &faulted, 100, true).0, TrialOutcome::MpsFault { .. }));
    }

    #[test]
    fn a_consumer_kill_passes_when_the_survivor_read_everything_intact() {
        let producer = end("producer", Some(0), serde_json::json!({"frames": 2000, "consumers_lost": 1}));
        let survivor = end("b", Some(0), serde_json::json!({"frames": 2000, "mismatched_words": 0}));
        assert_eq!(consumer_killed(&producer, &survivor, 2000, false), (TrialOutcome::Passed, 0, 0));
        let short = end("b", Some(0), serde_json::json!({"frames": 1990, "mismatched_words": 3}));
        let (o, lost, m) = consumer_killed(&producer, &short, 2000, false);
        assert_eq!((lost, m), (10, 3));
        assert!(
            matches!(o, TrialOutcome::Failed { ref reason } if reason.contains("1990 of 2000") && reason.contains("3 mismatched"))
        );
        let unlost = end("producer", Some(0), serde_json::json!({"frames": 2000, "consumers_lost": 0}));
        assert!(
            matches!(consumer_killed(&unlost, &survivor, 2000, false).0, TrialOutcome::Failed { ref reason } if reason.contains("0 consumers lost"))
        );
    }

    #[test]
    fn cells_count_their_trials() {
        let cell = Cell { backend: "vmm", sync: "cpu-spin", victim: Victim::Producer };
        let other = Cell { victim: Victim::Consumer, ..cell };
        let trial = |cell, outcome, gone: Vec<f64>| Trial {
            cell,
            trial: 0,
            kill: KillPoint { after_frames: 50, extra_delay_us: 0 },
            killed_at_ms: Some(1.0),
            outcome,
            gone_s: gone,
            lost_frames: 1,
            mismatched_words: 0,
            frames_never_published: 0,
            frames_skipped: 0,
        };
        let trials = vec![
            trial(cell, TrialOutcome::Passed, vec![0.2, 0.3]),
            trial(cell, TrialOutcome::Hang { who: "a".into() }, vec![0.4]),
            trial(other, TrialOutcome::MpsFault { detail: String::new() }, vec![]),
        ];
        let counts = CellCounts::all(&trials);
        assert_eq!(counts.len(), 2);
        assert_eq!((counts[0].kills, counts[0].passed, counts[0].hangs, counts[0].lost_frames), (2, 1, 1, 2));
        assert_eq!(counts[0].gone_max_s, Some(0.4));
        assert_eq!(counts[0].gone_median_s, Some(0.3));
        assert_eq!(counts[0].status(), Status::Failed);
        assert_eq!(counts[1].status(), Status::Finding);
        assert_eq!(counts[1].gone_max_s, None);
    }

    #[test]
    fn describe_names_the_exit_and_the_last_error_line() {
        let p =
            ProcEnd { stderr_tail: "x\nconsumer: no producer\n\n".into(), ..end("c", Some(1), serde_json::json!({})) };
        assert_eq!(p.describe(), "c: exit 1: consumer: no producer");
        assert_eq!(end("c", Some(0), serde_json::json!({})).describe(), "c: exit 0");
        assert_eq!(ProcEnd { hung: true, ..ProcEnd::default() }.describe(), ": hung (killed at its deadline)");
    }
}
