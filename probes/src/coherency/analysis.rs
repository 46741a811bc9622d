//! The verdict and the renderings of the coherency probe, pure functions of its results.

use std::collections::BTreeMap;

use gpu_ipc::kernels::probe::{FlagLoad, FlagStore, PayloadLoad};

use harness::report::{Plots, ReportSection};
use harness::stats::Distribution;
use harness::{MeasurementOutput, Verdict};

use super::*;

/// The pair the project's rule names: publish with `st.release.sys`, poll with `ld.acquire.sys`, plain payload
/// loads, no extra fence.
pub const RULE_WRITER: Writer = Writer::Kernel { store: FlagStore::ReleaseSys };
/// The reader of the rule pair.
pub const RULE_READER: Reader =
    Reader::Kernel { load: FlagLoad::AcquireSys, payload: PayloadLoad::Plain, fence: false };

/// The outcome of a writer-reader pair over the placements it ran in (cross-process only, or the control only).
#[derive(Debug, Clone, PartialEq)]
pub struct PairSummary {
    /// The writer.
    pub writer: Writer,
    /// The reader.
    pub reader: Reader,
    /// Handoffs done over all its cells.
    pub handoffs: u64,
    /// Stale rounds over all its cells.
    pub stale_rounds: u64,
    /// Cells that timed out.
    pub timeouts: u64,
    /// Cells that failed otherwise.
    pub failed: u64,
    /// Cells.
    pub cells: u64,
    /// The worst outcome: Stale over Timeout over Failed over Correct.
    pub outcome: Outcome,
    /// Median of the cells' p50 latencies (ns), for correct one-way cells.
    pub p50_ns: Option<f64>,
    /// Largest of the cells' p99 latencies (ns).
    pub p99_ns: Option<f64>,
}

/// Summarises the cells per pair, over the cross-process placements (`cross = true`) or the control.
pub fn summarise(cells: &[Cell], cross: bool) -> Vec<PairSummary> {
    let mut pairs: BTreeMap<(Writer, Reader), Vec<&Cell>> = BTreeMap::new();
    for cell in cells.iter().filter(|c| c.placement.cross_process() == cross) {
        pairs.entry((cell.writer, cell.reader)).or_default().push(cell);
    }
    pairs
        .into_iter()
        .map(|((writer, reader), list)| {
            let rank = |o: Outcome| match o {
                Outcome::Stale => 3,
                Outcome::Timeout => 2,
                Outcome::Failed => 1,
                Outcome::Correct => 0,
            };
            let outcome = list.iter().map(|c| c.outcome).max_by_key(|&o| rank(o)).unwrap_or(Outcome::Failed);
            let mut p50s: Vec<f64> = list
                .iter()
                .filter(|c| c.outcome == Outcome::Correct)
                .filter_map(|c| c.latency_ns.map(|d| d.p50))
                .collect();
            let p99 = list
                .iter()
                .filter(|c| c.outcome == Outcome::Correct)
                .filter_map(|c| c.latency_ns.map(|d| d.p99))
                .fold(None, |acc: Option<f64>, x| Some(acc.map_or(x, |a| a.max(x))));
            PairSummary {
                writer,
                reader,
                handoffs: list.iter().map(|c| c.rounds_done).sum(),
                stale_rounds: list.iter().map(|c| c.stale_rounds).sum(),
                timeouts: list.iter().filter(|c| c.outcome == Outcome::Timeout).count() as u64,
                failed: list.iter().filter(|c| c.outcome == Outcome::Failed).count() as u64,
                cells: list.len() as u64,
                outcome,
                p50_ns: Distribution::from_samples(&mut p50s).map(|d| d.p50),
                p99_ns: p99,
            }
        })
        .collect()
}

/// The distinct labels of `items`, in first-seen order, joined with " / ".
fn distinct_labels(items: impl Iterator<Item = String>) -> String {
    let mut seen: Vec<String> = Vec::new();
    for item in items {
        if !seen.contains(&item) {
            seen.push(item);
        }
    }
    seen.join(" / ")
}

/// The verdict from the counts: which pairs are correct, which readers read stale data and why, which polls never
/// saw the flag, the fastest correct pair, and whether the project's rule pair held.
pub fn verdict(results: &Results) -> Verdict {
    let pairs = summarise(&results.cells, true);
    let count = |o: Outcome| pairs.iter().filter(|p| p.outcome == o).count();
    let (correct, stale, timeout, failed) =
        (count(Outcome::Correct), count(Outcome::Stale), count(Outcome::Timeout), count(Outcome::Failed));
    let rule = pairs.iter().find(|p| p.writer == RULE_WRITER && p.reader == RULE_READER);
    let fastest = pairs
        .iter()
        .filter(|p| p.outcome == Outcome::Correct && p.writer != Writer::Cpu)
        .filter_map(|p| p.p50_ns.map(|l| (l, p)))
        .min_by(|a, b| a.0.total_cmp(&b.0));
    let mut answer =
        format!("Across processes, {correct} of {} writer/reader pairs were correct in every handoff", pairs.len());
    let stale_pairs: Vec<&PairSummary> = pairs.iter().filter(|p| p.outcome == Outcome::Stale).collect();
    if stale_pairs.is_empty() {
        answer.push_str(", none read a stale payload");
    } else {
        let (rounds, handoffs) = stale_pairs.iter().fold((0, 0), |(r, h), p| (r + p.stale_rounds, h + p.handoffs));
        answer.push_str(&format!(
            "; {stale} read stale payload words ({rounds} of {handoffs} rounds), all with readers that polled with {} \
             and then read the payload with {}",
            distinct_labels(stale_pairs.iter().filter_map(|p| match p.reader {
                Reader::Kernel { load, .. } => Some(load.label().to_owned()),
                Reader::StreamWait => None,
            })),
            distinct_labels(stale_pairs.iter().map(|p| match p.reader {
                Reader::Kernel { payload, fence, .. } => {
                    format!("{}{}", payload.label(), if fence { " after a fence" } else { " and no fence" })
                }
                Reader::StreamWait => "a check kernel".to_owned(),
            }))
        ));
    }
    if timeout > 0 {
        let loads = distinct_labels(pairs.iter().filter(|p| p.outcome == Outcome::Timeout).map(|p| match p.reader {
            Reader::Kernel { load, .. } => load.label().to_owned(),
            Reader::StreamWait => "a stream wait".to_owned(),
        }));
        answer.push_str(&format!("; {timeout} never saw the flag (polls with a {loads})"));
    }
    if failed > 0 {
        answer.push_str(&format!("; {failed} did not finish"));
    }
    answer.push('.');
    let acquire: Vec<&PairSummary> = pairs
        .iter()
        .filter(|p| matches!(p.reader, Reader::Kernel { load: FlagLoad::AcquireGpu | FlagLoad::AcquireSys, .. }))
        .collect();
    if !acquire.is_empty() && acquire.iter().all(|p| p.outcome == Outcome::Correct) {
        answer.push_str(&format!(" Every ld.acquire reader was correct with every writer ({} pairs).", acquire.len()));
    }
    let key_figure = match rule {
        Some(rule) if rule.outcome == Outcome::Correct => {
            answer.push_str(
                " Rule: publish with st.release.sys (cuStreamWriteValue64 from the host side), poll with \
                 ld.acquire.sys (cuStreamWaitValue64); plain or volatile flag stores without a release were not \
                 caught stale here, but the PTX memory model does not promise them.",
            );
            format!(
                "st.release.sys -> ld.acquire.sys: 0 stale in {} cross-process handoffs, visible after p50 {} (p99 {})",
                rule.handoffs,
                fmt_ns(rule.p50_ns),
                fmt_ns(rule.p99_ns)
            )
        }
        Some(rule) => {
            answer.push_str(" The rule pair st.release.sys / ld.acquire.sys did NOT hold: see the table.");
            format!(
                "st.release.sys -> ld.acquire.sys: {:?}, {} stale rounds in {} handoffs",
                rule.outcome, rule.stale_rounds, rule.handoffs
            )
        }
        None => "the rule pair did not run".to_owned(),
    };
    if let Some((latency, pair)) = fastest {
        answer.push_str(&format!(
            " Fastest correct pair: {} -> {} (p50 {}).",
            pair.writer.label(),
            pair.reader.label(),
            fmt_ns(Some(latency))
        ));
    }
    Verdict { answer, key_figure }
}

fn fmt_ns(ns: Option<f64>) -> String {
    match ns {
        None => "-".to_owned(),
        Some(ns) if ns >= 1e6 => format!("{:.2} ms", ns / 1e6),
        Some(ns) if ns >= 1e3 => format!("{:.2} us", ns / 1e3),
        Some(ns) => format!("{ns:.0} ns"),
    }
}

fn outcome_cell(p: &PairSummary) -> String {
    match p.outcome {
        Outcome::Correct => format!("ok {}", fmt_ns(p.p50_ns)),
        Outcome::Stale => format!("STALE {}/{}", p.stale_rounds, p.handoffs),
        Outcome::Timeout => "timeout".to_owned(),
        Outcome::Failed => "failed".to_owned(),
    }
}

/// One line per placement: how many of its cells were correct, stale, timed out or failed.
pub fn placement_lines(cells: &[Cell]) -> String {
    let mut out = String::new();
    let mut placements: Vec<Placement> = cells.iter().map(|c| c.placement).collect();
    placements.sort();
    placements.dedup();
    for placement in placements {
        let of = |o: Outcome| cells.iter().filter(|c| c.placement == placement && c.outcome == o).count();
        let handoffs: u64 = cells.iter().filter(|c| c.placement == placement).map(|c| c.rounds_done).sum();
        out.push_str(&format!(
            "- {}: {} cells correct, {} stale, {} timed out, {} failed; {handoffs} handoffs\n",
            placement.label(),
            of(Outcome::Correct),
            of(Outcome::Stale),
            of(Outcome::Timeout),
            of(Outcome::Failed)
        ));
    }
    out
}

/// The pair matrix as a Markdown table: a row per reader, a column per writer; each cell the outcome and, when
/// correct, the median visibility latency (for the CPU writer: the round trip).
pub fn matrix_markdown(pairs: &[PairSummary]) -> String {
    let writers: Vec<Writer> = Writer::all().into_iter().filter(|w| pairs.iter().any(|p| p.writer == *w)).collect();
    let mut out = String::from("| reader \\ writer |");
    for w in &writers {
        out.push_str(&format!(" {} |", w.label()));
    }
    out.push_str("\n|---|");
    out.push_str(&"---|".repeat(writers.len()));
    out.push('\n');
    for r in Reader::all() {
        if !pairs.iter().any(|p| p.reader == r) {
            continue;
        }
        out.push_str(&format!("| {} |", r.label()));
        for w in &writers {
            let text = pairs.iter().find(|p| p.writer == *w && p.reader == r).map_or("-".to_owned(), outcome_cell);
            out.push_str(&format!(" {text} |"));
        }
        out.push('\n');
    }
    out
}

/// The result as text: the verdict, then the cross-process matrix and the control's.
pub fn render_text(output: &MeasurementOutput<Results>) -> String {
    let r = &output.results;
    let mut out = format!(
        "gpu-ipc probe coherency: {} handoffs per cell, {}-byte payload, poll deadline {} ms, {}\n\n",
        r.rounds,
        r.payload_bytes,
        r.round_timeout_ms,
        output.env.headline(0)
    );
    out.push_str(&format!("{}\n{}\n\n", output.verdict.answer, output.verdict.key_figure));
    out.push_str("Across processes (legacy and VMM device memory; the CPU writer through a memfd):\n");
    out.push_str(&matrix_markdown(&summarise(&r.cells, true)));
    let control = summarise(&r.cells, false);
    if !control.is_empty() {
        out.push_str("\nControl, one process:\n");
        out.push_str(&matrix_markdown(&control));
    }
    out
}

/// The report's section, from the runs without and with MPS.
pub fn report_section(
    no_mps: Option<&MeasurementOutput<Results>>,
    mps: Option<&MeasurementOutput<Results>>,
    _plots: &mut Plots,
) -> ReportSection {
    let Some(main) = mps.or(no_mps) else { return ReportSection::missing("coherency") };
    let mut body = String::new();
    body.push_str(
        "A writer publishes a 2 KiB payload (16 lines of 128 bytes) and then a flag; a reader polls the flag and \
         then reads every payload word, which it already holds in its caches from the previous round. Each cell \
         counts handoffs, rounds with a stale word, and polls that never saw the flag; `ok` shows the median \
         visibility latency (reader's `%globaltimer` on seeing the flag minus the writer's just before storing it; \
         for the CPU writer the CPU's round trip to the reader's ack). `%globaltimer` advances in steps (32 ns on the \
         H100), so one-way latencies are multiples of it. Kernels: `kernels/cuda/probe_coherency.cu`.\n\n",
    );
    for (name, run) in [("With MPS", mps), ("Without MPS", no_mps)] {
        let Some(run) = run else {
            body.push_str(&format!("### {name}\n\nNot run.\n\n"));
            continue;
        };
        let r = &run.results;
        body.push_str(&format!(
            "### {name}: {} handoffs per cell, poll deadline {} ms\n\n{}\n\n**Across processes** (device memory of \
             each backend, merged; the CPU writer through a memfd):\n\n{}\n",
            r.rounds,
            r.round_timeout_ms,
            run.verdict.key_figure,
            matrix_markdown(&summarise(&r.cells, true))
        ));
        body.push_str(&format!("\nPer placement:\n\n{}", placement_lines(&r.cells)));
        let control = summarise(&r.cells, false);
        if !control.is_empty() {
            body.push_str(&format!(
                "\n**Control, one process** (the process's own `cuMemAlloc` memory, or its own registered host memory \
                 for the CPU writer; kernel and CPU writers against the kernel readers only: in one process a \
                 `cuStreamWaitValue64` that is not yet satisfied can hold back the process's other streams, which \
                 stalled such a cell under MPS on the H100):\n\n{}\n",
                matrix_markdown(&control)
            ));
        }
        if !run.env.mps && r.rounds < 1000 {
            body.push_str(
                "\nWithout MPS the two processes' kernels never run at the same time: each handoff waits for GPU \
                 time slices, so these cells run fewer handoffs.\n\n",
            );
        }
    }
    if !main.results.sass.is_empty() {
        body.push_str(&format!(
            "### What each variant became (`cuobjdump -sass`, {})\n\n| kernel | memory, fence and cache instructions |\n|---|---|\n",
            main.results.image
        ));
        for (kernel, instructions) in &main.results.sass {
            body.push_str(&format!("| `{kernel}` | {} |\n", instructions.join(", ")));
        }
        body.push('\n');
    } else if let Some(note) = &main.results.sass_note {
        body.push_str(&format!("SASS not recorded: {note}\n\n"));
    }
    ReportSection {
        probe: "coherency".to_owned(),
        question: "When does one process's write become visible to another process's polling kernel, and which loads \
                   and fences are needed?"
            .to_owned(),
        answer: format!("{} {}", main.verdict.answer, main.verdict.key_figure),
        body,
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::coherency::sass::parse_sass;
    use crate::coherency::sides::classify;

    fn cell(writer: Writer, reader: Reader, placement: Placement, outcome: Outcome, stale: u64, p50: f64) -> Cell {
        let latency = Distribution {
            count: 100,
            min: p50,
            p50,
            p99: p50 * 2.0,
            p999: Some(p50 * 3.0),
            max: p50 * 3.0,
            mean: p50,
        };
        Cell {
            writer,
            reader,
            placement,
            rounds_planned: 100,
            rounds_done: if outcome == Outcome::Timeout { 0 } else { 100 },
            stale_rounds: stale,
            stale_words: stale * 3,
            first_stale_round: u64::from(stale > 0),
            reader_timeouts: u64::from(outcome == Outcome::Timeout),
            writer_timeouts: 0,
            outcome,
            latency_ns: Some(latency),
            latency_is_round_trip: writer == Writer::Cpu,
            note: None,
        }
    }

    fn recorded() -> Results {
        let plain = Reader::Kernel { load: FlagLoad::Plain, payload: PayloadLoad::Plain, fence: false };
        let volatile = Reader::Kernel { load: FlagLoad::Volatile, payload: PayloadLoad::Plain, fence: false };
        let w = Writer::Kernel { store: FlagStore::Volatile };
        Results {
            rounds: 100,
            round_timeout_ms: 50,
            payload_bytes: 2048,
            cells: vec![
                cell(RULE_WRITER, RULE_READER, Placement::Legacy, Outcome::Correct, 0, 1500.0),
                cell(RULE_WRITER, RULE_READER, Placement::Vmm, Outcome::Correct, 0, 1700.0),
                cell(RULE_WRITER, plain, Placement::Vmm, Outcome::Timeout, 0, 0.0),
                cell(w, volatile, Placement::Legacy, Outcome::Stale, 7, 900.0),
                cell(w, volatile, Placement::Vmm, Outcome::Correct, 0, 900.0),
                cell(RULE_WRITER, RULE_READER, Placement::SameProcess, Outcome::Correct, 0, 600.0),
            ],
            sass: BTreeMap::new(),
            sass_note: Some("cuobjdump not run".to_owned()),
            image: "sm_90.cubin".to_owned(),
        }
    }

    #[test]
    fn pairs_take_their_worst_outcome_and_merge_placements() {
        let pairs = summarise(&recorded().cells, true);
        assert_eq!(pairs.len(), 3);
        let rule = pairs.iter().find(|p| p.writer == RULE_WRITER && p.reader == RULE_READER).unwrap();
        assert_eq!((rule.outcome, rule.handoffs, rule.cells), (Outcome::Correct, 200, 2));
        assert_eq!(rule.p50_ns, Some(1500.0));
        assert_eq!(rule.p99_ns, Some(3400.0));
        let stale = pairs.iter().find(|p| p.outcome == Outcome::Stale).unwrap();
        assert_eq!((stale.stale_rounds, stale.handoffs), (7, 200));
        assert_eq!(summarise(&recorded().cells, false).len(), 1);
    }

    #[test]
    fn verdict_counts_and_names_the_rule() {
        let v = verdict(&recorded());
        assert!(v.answer.contains("1 of 3 writer/reader pairs were correct"), "{}", v.answer);
        assert!(v.answer.contains("1 read stale payload words (7 of 200 rounds)"), "{}", v.answer);
        assert!(
            v.answer.contains("polled with ld.volatile and then read the payload with plain loads and no fence"),
            "{}",
            v.answer
        );
        assert!(v.answer.contains("1 never saw the flag (polls with a plain load)"), "{}", v.answer);
        assert!(v.answer.contains("Rule: publish with st.release.sys"), "{}", v.answer);
        assert!(v.key_figure.contains("0 stale in 200 cross-process handoffs"), "{}", v.key_figure);
        assert!(v.key_figure.contains("1.50 us"), "{}", v.key_figure);
    }

    #[test]
    fn a_stale_rule_pair_is_reported_as_broken() {
        let mut results = recorded();
        results.cells[1].outcome = Outcome::Stale;
        results.cells[1].stale_rounds = 2;
        let v = verdict(&results);
        assert!(v.answer.contains("did NOT hold"), "{}", v.answer);
    }

    #[test]
    fn classify_ranks_stale_over_timeout() {
        let mut c = cell(RULE_WRITER, RULE_READER, Placement::Vmm, Outcome::Correct, 0, 1.0);
        assert_eq!(classify(&c, false), Outcome::Correct);
        c.reader_timeouts = 1;
        assert_eq!(classify(&c, false), Outcome::Timeout);
        c.stale_rounds = 1;
        assert_eq!(classify(&c, false), Outcome::Stale);
        c.stale_rounds = 0;
        c.reader_timeouts = 0;
        c.rounds_done = 10;
        assert_eq!(classify(&c, false), Outcome::Failed);
    }

    #[test]
    fn sass_parser_keeps_memory_and_fence_instructions_per_kernel() {
        let text = "\n\tcode for sm_90\n\t\tFunction : gpu_ipc_coh_read_acquiresys_plain_nofence\n\
            \t.headerflags\t@\"EF_CUDA_SM90\"\n\
            /*0000*/                   LDC R1, c[0x0][0x28] ;               /* 0x00000a00ff017b82 */\n\
            /*0010*/                   LDG.E.64.STRONG.SYS R4, desc[UR4][R2.64] ;  /* 0x0 */\n\
            /*0020*/              @!P0 LDG.E.64.STRONG.SYS R4, desc[UR4][R2.64] ;  /* 0x0 */\n\
            /*0030*/                   CCTL.IVALL ;  /* 0x0 */\n\
            /*0040*/                   LDG.E R7, desc[UR4][R2.64] ;  /* 0x0 */\n\
            \t\tFunction : gpu_ipc_mem_read\n\
            /*0000*/                   LDG.E.128 R4, desc[UR4][R2.64] ;  /* 0x0 */\n";
        let sass = parse_sass(text);
        assert_eq!(sass.len(), 1);
        assert_eq!(
            sass["gpu_ipc_coh_read_acquiresys_plain_nofence"],
            vec!["LDG.E.64.STRONG.SYS x2", "CCTL.IVALL x1", "LDG.E x1"]
        );
    }

    #[test]
    fn matrix_lists_each_reader_and_writer_once() {
        let md = matrix_markdown(&summarise(&recorded().cells, true));
        assert!(md.contains("STALE 7/200"), "{md}");
        assert!(md.contains("timeout"), "{md}");
        assert!(md.contains("ok 1.50 us"), "{md}");
        assert_eq!(md.lines().count(), 2 + 3);
    }

    #[test]
    fn results_round_trip_through_json() {
        let results = recorded();
        let json = serde_json::to_string(&results).unwrap();
        assert_eq!(serde_json::from_str::<Results>(&json).unwrap(), results);
    }
}
