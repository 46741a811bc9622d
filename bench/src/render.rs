//! The bench's outputs: the Markdown table, the verdict, and the plots (FPS against ring depth per strategy, and
//! the latency CDF).

use gpu_ipc::core::wire::SyncStrategy;
use std::fmt::Write as _;

use harness::MeasurementError;
use harness::report::{LineChart, Series};
use harness::{MeasurementOutput, Verdict};

use super::results::{PipelineResults, RowOutcome, RowResult};
use super::rows::{RowSpec, StudyDesign};
use super::tables::{number, paced_table, research_table, resident_table, resident_words, verdict_words};

/// The verdict: the best of ours against the single-process limit and the seed architecture (study d), and
/// anything that failed or mismatched.
pub fn verdict(results: &PipelineResults) -> Verdict {
    let limit = results.single_process_fps();
    let clean = |r: &&RowResult| r.measured().is_some_and(|m| m.mismatches == 0);
    let best = results
        .rows
        .iter()
        .filter(|r| matches!(r.spec, RowSpec::Ours { .. } | RowSpec::Graphs { .. } | RowSpec::Resident { .. }))
        .filter(clean)
        .filter_map(|r| r.measured().map(|m| (r, m)))
        .max_by(|a, b| a.1.fps.total_cmp(&b.1.fps));
    let seed = results
        .rows
        .iter()
        .find(|r| r.spec == RowSpec::Study { design: StudyDesign::LegacyIpcSpin })
        .and_then(RowResult::measured);
    let ratio = |x: Option<f64>| x.map_or_else(|| "n/a".to_owned(), |r| format!("{r:.2}x"));
    let mut answer = match (best, limit) {
        (Some((row, m)), Some(limit)) => format!(
            "The fastest of ours, {}, ran {:.0} FPS, {} the single-process limit ({limit:.0} FPS).",
            row.row,
            m.fps,
            ratio(m.ratio_to_single_process)
        ),
        (Some((row, m)), None) => {
            format!("The fastest of ours, {}, ran {:.0} FPS (no single-process limit).", row.row, m.fps)
        }
        (None, _) => "None of our rows ran cleanly.".to_owned(),
    };
    // The in-process references of each depth: handed over by events, then by stream memory operations.
    let depths = |by_events: bool| -> Vec<String> {
        results
            .rows
            .iter()
            .filter_map(|r| match (r.spec, r.measured()) {
                (RowSpec::SingleProcessPipelined { slots }, Some(m)) if by_events => Some((slots, m)),
                (RowSpec::SingleProcessMemOps { slots }, Some(m)) if !by_events => Some((slots, m)),
                _ => None,
            })
            .map(|(slots, m)| format!("{slots} buffers {:.0} FPS ({})", m.fps, ratio(m.ratio_to_single_process)))
            .collect()
    };
    for (by_events, words) in [
        (true, "The same kernels in one process, the next fill overlapping the current verify"),
        (false, "Handed over by stream memory operations instead of events"),
    ] {
        let figures = depths(by_events);
        if !figures.is_empty() {
            let _ = write!(answer, " {words}: {}.", figures.join(", "));
        }
    }
    if let Some(seed) = seed {
        let _ = write!(
            answer,
            " The seed architecture (study d) ran {:.0} FPS ({}).",
            seed.fps,
            ratio(seed.ratio_to_single_process)
        );
    }
    if let Some(line) = three_stage_words(results) {
        let _ = write!(answer, " {line}");
    }
    if let Some(line) = graph_words(results) {
        let _ = write!(answer, " {line}");
    }
    if let Some(line) = resident_words(results) {
        let _ = write!(answer, " {line}");
    }
    for line in verdict_words(results) {
        let _ = write!(answer, " {line}");
    }
    let failed = results.rows.iter().filter(|r| matches!(r.outcome, RowOutcome::Failed { .. })).count();
    let unavailable = results.rows.iter().filter(|r| matches!(r.outcome, RowOutcome::Unavailable { .. })).count();
    let mismatched = results.rows.iter().filter(|r| r.measured().is_some_and(|m| m.mismatches != 0)).count();
    if failed > 0 {
        let _ = write!(answer, " {failed} of {} rows failed.", results.rows.len());
    }
    if unavailable > 0 {
        let _ = write!(answer, " {unavailable} rows not run: their strategy is unavailable here (the table says why).");
    }
    if mismatched > 0 {
        let _ = write!(answer, " {mismatched} rows read WRONG DATA (mismatches).");
    }
    let key_figure = match best {
        Some((_, m)) => format!("best of ours / single-process limit: {}", ratio(m.ratio_to_single_process)),
        None => "best of ours / single-process limit: n/a".to_owned(),
    };
    Verdict { answer, key_figure }
}

/// The fastest clean three-stage row beside the two-process row of the same backend, strategy and depth (one
/// consumer): FPS and latency p50 / p99 of each.
fn three_stage_words(results: &PipelineResults) -> Option<String> {
    let clean = |r: &&RowResult| r.measured().is_some_and(|m| m.mismatches == 0);
    let (row, m) = results
        .rows
        .iter()
        .filter(|r| matches!(r.spec, RowSpec::ThreeStage { .. }))
        .filter(clean)
        .filter_map(|r| r.measured().map(|m| (r, m)))
        .max_by(|a, b| a.1.fps.total_cmp(&b.1.fps))?;
    let figures = |m: &crate::results::Measurement| match &m.latency {
        Some(l) => format!("{:.0} FPS, latency p50 {} / p99 {} us", m.fps, number(l.p50_us), number(l.p99_us)),
        None => format!("{:.0} FPS", m.fps),
    };
    let mut line = format!("The fastest three-stage pipeline, {}, ran {} end to end", row.row, figures(m));
    if let RowSpec::ThreeStage { backend, strategy, slots } = row.spec {
        let two = RowSpec::Ours { backend, strategy, slots, consumers: 1 };
        if let Some(t) = results.rows.iter().find(|r| r.spec == two).and_then(RowResult::measured) {
            let _ = write!(line, "; the two-process ring {} ran {}", two.name(), figures(t));
        }
    }
    line.push('.');
    Some(line)
}

/// The frame-graph rows' CPU per frame (producer, consumer: the most of any clean row) and the fastest of them
/// beside the same ring driven call by call.
fn graph_words(results: &PipelineResults) -> Option<String> {
    let graphs: Vec<(&RowResult, &crate::results::Measurement)> = results
        .rows
        .iter()
        .filter(|r| matches!(r.spec, RowSpec::Graphs { .. }))
        .filter_map(|r| r.measured().filter(|m| m.mismatches == 0).map(|m| (r, m)))
        .collect();
    let (row, m) = graphs.iter().max_by(|a, b| a.1.fps.total_cmp(&b.1.fps))?;
    let producer = graphs.iter().map(|(_, m)| m.producer_cpu_us_per_frame).fold(0.0, f64::max);
    let consumer = graphs.iter().flat_map(|(_, m)| m.consumer_cpu_us_per_frame.iter().copied()).fold(0.0, f64::max);
    let mut line = format!(
        "On frame graphs ({} rows) the CPU spent at most {} us per frame in the producer and {} us in the consumer; \
         the fastest, {}, ran {:.0} FPS",
        graphs.len(),
        number(producer),
        number(consumer),
        row.row,
        m.fps
    );
    if let RowSpec::Graphs { backend, strategy, slots, .. } = row.spec {
        let calls = RowSpec::Ours { backend, strategy, slots, consumers: 1 };
        if let Some(c) = results.rows.iter().find(|r| r.spec == calls).and_then(RowResult::measured) {
            let _ = write!(line, " ({} call by call: {:.0} FPS)", calls.name(), c.fps);
        }
    }
    line.push('.');
    Some(line)
}

/// The results as a Markdown table, one line per row (GB/s: frame bytes x FPS), followed by the summary tables
/// when their rows ran ([`resident_table`], [`paced_table`], [`research_table`]).
pub fn markdown_table(results: &PipelineResults) -> String {
    let mut out = String::new();
    out.push_str(
        "| row | FPS | GB/s | x single-process | latency p50 / p99 / p99.9 (us) | CPU us/frame producer | CPU \
         us/frame consumers (max) | mismatches | note |\n|---|---:|---:|---:|---|---:|---:|---:|---|\n",
    );
    for row in &results.rows {
        match &row.outcome {
            RowOutcome::Measured(m) => {
                let latency = m.latency.as_ref().map_or_else(
                    || "-".to_owned(),
                    |l| format!("{} / {} / {}", number(l.p50_us), number(l.p99_us), number(l.p999_us)),
                );
                let consumer_cpu =
                    m.consumer_cpu_us_per_frame.iter().copied().reduce(f64::max).map_or_else(|| "-".to_owned(), number);
                let mut note = m.note.clone().unwrap_or_default();
                if let Some(gb) = m.bandwidth_gb_s {
                    note = format!("{gb:.0} GB/s read + written; {note}");
                }
                let mismatches =
                    if m.mismatches == 0 { "0".to_owned() } else { format!("**{} (WRONG DATA)**", m.mismatches) };
                let gb = m.frame_gb_s.map_or_else(|| "-".to_owned(), number);
                let _ = writeln!(
                    out,
                    "| {} | {} | {gb} | {} | {latency} | {} | {consumer_cpu} | {mismatches} | {} |",
                    row.row,
                    number(m.fps),
                    m.ratio_to_single_process.map_or_else(|| "-".to_owned(), |r| format!("{r:.2}")),
                    number(m.producer_cpu_us_per_frame),
                    note.replace('|', "/")
                );
            }
            RowOutcome::Failed { reason } => {
                let _ =
                    writeln!(out, "| {} | failed | - | - | - | - | - | - | {} |", row.row, reason.replace('|', "/"));
            }
            RowOutcome::Unavailable { reason } => {
                let _ = writeln!(
                    out,
                    "| {} | unavailable | - | - | - | - | - | - | {} |",
                    row.row,
                    reason.replace('|', "/")
                );
            }
        }
    }
    for table in [resident_table(results), paced_table(results), research_table(results)].into_iter().flatten() {
        out.push('\n');
        out.push_str(&table);
    }
    out
}

/// The text `gpu-ipc bench pipeline` prints: where it ran, the table, the verdict.
pub fn render_text(output: &MeasurementOutput<PipelineResults>, device: i32) -> String {
    let r = &output.results;
    format!(
        "gpu-ipc bench pipeline on {}\n{} frames of {}x{}x{} ({} bytes) per row after {} warm-up frames{}.\n\
         Latency: {}\n\n{}\n{}\n({})\n",
        output.env.headline(device),
        r.frames,
        r.frame_shape[0],
        r.frame_shape[1],
        r.frame_shape[2],
        r.frame_bytes,
        r.warmup,
        if output.quick { ", quick pass" } else { "" },
        r.latency_method,
        markdown_table(r),
        output.verdict.answer,
        output.verdict.key_figure
    )
}

/// The plots: per backend and consumer count, FPS against ring slots with one line per strategy; per backend, the
/// latency CDF of every strategy at 4 slots and 1 consumer, with the study's designs beside them.
pub fn charts(results: &PipelineResults) -> Vec<LineChart> {
    let mut backends = Vec::new();
    let mut consumer_counts = Vec::new();
    for row in &results.rows {
        if let RowSpec::Ours { backend, consumers, .. } = row.spec {
            if !backends.contains(&backend) {
                backends.push(backend);
            }
            if !consumer_counts.contains(&consumers) {
                consumer_counts.push(consumers);
            }
        }
    }
    let mut charts = Vec::new();
    for &backend in &backends {
        for &count in &consumer_counts {
            let series: Vec<Series> = SyncStrategy::ALL
                .iter()
                .map(|&strategy| Series {
                    name: strategy.name().to_owned(),
                    points: results
                        .rows
                        .iter()
                        .filter_map(|r| match (r.spec, r.measured()) {
                            (RowSpec::Ours { backend: b, strategy: s, slots, consumers }, Some(m))
                                if b == backend && s == strategy && consumers == count =>
                            {
                                Some((f64::from(slots), m.fps))
                            }
                            _ => None,
                        })
                        .collect(),
                })
                .filter(|s| !s.points.is_empty())
                .collect();
            if series.is_empty() {
                continue;
            }
            charts.push(LineChart {
                file_stem: format!("pipeline-fps-{}-c{count}", backend.name()),
                title: format!("4K pipeline, {} backend, {count} consumer(s): FPS by ring slots", backend.name()),
                x_label: "ring slots".into(),
                y_label: "frames per second".into(),
                x_log: true,
                y_log: false,
                series,
            });
        }
        let mut series: Vec<Series> = results
            .rows
            .iter()
            .filter(|r| match r.spec {
                RowSpec::Ours { backend: b, slots, consumers, .. } => b == backend && slots == 4 && consumers == 1,
                RowSpec::ThreeStage { backend: b, slots, .. } => b == backend && slots == 4,
                RowSpec::Study { .. } => true,
                _ => false,
            })
            .filter_map(|r| {
                let latency = r.measured()?.latency.as_ref()?;
                Some(Series { name: r.row.clone(), points: latency.cdf.clone() })
            })
            .collect();
        series.retain(|s| !s.points.is_empty());
        if !series.is_empty() {
            charts.push(LineChart {
                file_stem: format!("pipeline-latency-cdf-{}", backend.name()),
                title: format!(
                    "4K pipeline, {} backend: latency CDF (4 slots, 1 consumer; three stages; study designs)",
                    backend.name()
                ),
                x_label: "publish to consumer done (us)".into(),
                y_label: "fraction of frames".into(),
                x_log: true,
                y_log: false,
                series,
            });
        }
    }
    charts
}

/// Writes `charts` as SVG files into `dir`; returns the files written.
///
/// # Errors
/// A chart that cannot be drawn or a file that cannot be written.
pub fn write_charts(charts: &[LineChart], dir: &std::path::Path) -> Result<Vec<std::path::PathBuf>, MeasurementError> {
    std::fs::create_dir_all(dir).map_err(|source| MeasurementError::Io { op: "create the charts folder", source })?;
    let mut written = Vec::new();
    for chart in charts {
        let svg = harness::plot::render_svg(chart)?;
        let path = dir.join(format!("{}.svg", chart.file_stem));
        std::fs::write(&path, svg).map_err(|source| MeasurementError::Io { op: "write a chart", source })?;
        written.push(path);
    }
    Ok(written)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::results::{LatencySummary, Measurement};
    use crate::rows::GraphWait;

    fn measured(fps: f64, latency: Option<(f64, f64, f64)>, mismatches: u64) -> RowOutcome {
        RowOutcome::Measured(Measurement {
            frames: 2000,
            seconds: 2000.0 / fps,
            fps,
            ratio_to_single_process: None,
            latency: latency.map(|(p50_us, p99_us, p999_us)| LatencySummary {
                count: 2000,
                p50_us,
                p99_us,
                p999_us,
                max_us: p999_us * 2.0,
                mean_us: p50_us,
                cdf: vec![(p50_us / 2.0, 0.0), (p50_us, 0.5), (p99_us, 0.99), (p999_us, 0.999), (p999_us * 2.0, 1.0)],
            }),
            producer_cpu_us_per_frame: 15.0,
            consumer_cpu_us_per_frame: vec![12.0, 20.5],
            mismatches,
            bandwidth_gb_s: None,
            frame_gb_s: None,
            note: None,
        })
    }

    fn row(spec: RowSpec, outcome: RowOutcome) -> RowResult {
        RowResult { row: spec.name(), spec, outcome }
    }

    fn recorded() -> PipelineResults {
        let backend = gpu_ipc::COMPILED_GPU[0];
        let ours = |strategy, slots, consumers| RowSpec::Ours { backend, strategy, slots, consumers };
        let mut results = PipelineResults {
            frame_bytes: 24_883_200,
            frame_shape: [3840, 2160, 3],
            frames: 2000,
            warmup: 200,
            latency_method: "test".into(),
            rows: vec![
                row(RowSpec::SingleProcess, measured(64_000.0, None, 0)),
                row(RowSpec::Bandwidth, measured(80_000.0, None, 0)),
                row(
                    RowSpec::Study { design: StudyDesign::LegacyIpcSpin },
                    measured(16_000.0, Some((60.0, 90.0, 200.0)), 0),
                ),
                row(RowSpec::Study { design: StudyDesign::PageableShm }, RowOutcome::Failed { reason: "a | b".into() }),
                row(ours(SyncStrategy::GpuStreamOps, 4, 1), measured(54_400.0, Some((30.0, 45.0, 80.0)), 0)),
                row(ours(SyncStrategy::GpuStreamOps, 8, 1), measured(56_000.0, Some((35.0, 50.0, 90.0)), 0)),
                row(ours(SyncStrategy::CpuSpin, 4, 1), measured(60_000.0, Some((20.0, 25.0, 30.0)), 7)),
            ],
        };
        results.fill_derived();
        results
    }

    #[test]
    fn ratios_come_from_the_single_process_row() {
        let results = recorded();
        let ratio = |i: usize| results.rows[i].measured().unwrap().ratio_to_single_process.unwrap();
        assert_eq!(ratio(0), 1.0);
        assert_eq!(ratio(2), 0.25);
        assert!((ratio(4) - 0.85).abs() < 1e-12);
    }

    #[test]
    fn the_verdict_quotes_the_pipelined_references() {
        let mut results = recorded();
        assert!(!verdict(&results).answer.contains("overlapping"), "none ran: nothing said");
        results.rows.insert(1, row(RowSpec::SingleProcessPipelined { slots: 2 }, measured(48_000.0, None, 0)));
        results.rows.insert(2, row(RowSpec::SingleProcessPipelined { slots: 8 }, measured(45_000.0, None, 0)));
        results.fill_ratios();
        let v = verdict(&results);
        assert!(
            v.answer.contains("the next fill overlapping the current verify: 2 buffers 48000 FPS (0.75x), 8 buffers 45000 FPS (0.70x)."),
            "{}",
            v.answer
        );
        assert!(!v.answer.contains("stream memory operations"), "{}", v.answer);
        results.rows.insert(3, row(RowSpec::SingleProcessMemOps { slots: 8 }, measured(38_400.0, None, 0)));
        results.fill_ratios();
        let v = verdict(&results);
        assert!(
            v.answer
                .contains("Handed over by stream memory operations instead of events: 8 buffers 38400 FPS (0.60x)."),
            "{}",
            v.answer
        );
    }

    #[test]
    fn the_verdict_gives_the_frame_graphs_cpu_and_their_rate_beside_the_same_ring_call_by_call() {
        let mut results = recorded();
        assert!(graph_words(&results).is_none(), "no graph row: nothing said");
        let backend = gpu_ipc::COMPILED_GPU[0];
        let graphs = |slots, fps, cpu| {
            let mut outcome = measured(fps, None, 0);
            if let RowOutcome::Measured(m) = &mut outcome {
                m.producer_cpu_us_per_frame = cpu;
                m.consumer_cpu_us_per_frame = vec![cpu + 0.5];
            }
            row(
                RowSpec::Graphs { backend, strategy: SyncStrategy::GpuStreamOps, slots, waits: GraphWait::Kernels },
                outcome,
            )
        };
        results.rows.push(graphs(4, 47_000.0, 1.4));
        results.rows.push(graphs(8, 48_000.0, 0.7));
        let line = graph_words(&results).unwrap();
        let b = backend.name();
        assert_eq!(
            line,
            format!(
                "On frame graphs (2 rows) the CPU spent at most 1.40 us per frame in the producer and 1.90 us in the \
                 consumer; the fastest, graphs-{b}-gpu-stream-ops-s8-kernel-waits, ran 48000 FPS (ours-{b}-gpu-stream-ops-s8-c1 \
                 call by call: 56000 FPS)."
            )
        );
    }

    #[test]
    fn the_verdict_names_the_best_clean_row_and_the_seed() {
        let results = recorded();
        let v = verdict(&results);
        let backend = gpu_ipc::COMPILED_GPU[0].name();
        // The cpu-spin row is faster but read wrong data: it is not the best.
        assert!(
            v.answer.contains(&format!("ours-{backend}-gpu-stream-ops-s8-c1, ran 56000 FPS, 0.88x")),
            "{}",
            v.answer
        );
        assert!(v.answer.contains("study d) ran 16000 FPS (0.25x)"), "{}", v.answer);
        assert!(v.answer.contains("1 of 7 rows failed"), "{}", v.answer);
        assert!(v.answer.contains("1 rows read WRONG DATA"), "{}", v.answer);
        assert_eq!(v.key_figure, "best of ours / single-process limit: 0.88x");
    }

    #[test]
    fn the_verdict_puts_the_fastest_clean_three_stage_row_beside_its_two_process_ring() {
        let mut results = recorded();
        assert!(!verdict(&results).answer.contains("three-stage"), "none ran: nothing said");
        let backend = gpu_ipc::COMPILED_GPU[0];
        let three = |strategy| RowSpec::ThreeStage { backend, strategy, slots: 4 };
        results.rows.push(row(three(SyncStrategy::GpuStreamOps), measured(30_000.0, Some((70.0, 120.0, 300.0)), 0)));
        results.rows.push(row(three(SyncStrategy::CpuSpin), measured(40_000.0, Some((50.0, 60.0, 70.0)), 3)));
        let v = verdict(&results);
        let name = backend.name();
        assert!(
            v.answer.contains(&format!(
                "The fastest three-stage pipeline, three-stage-{name}-gpu-stream-ops-s4, ran 30000 FPS, latency p50 \
                 70.0 / p99 120 us end to end; the two-process ring ours-{name}-gpu-stream-ops-s4-c1 ran 54400 FPS, \
                 latency p50 30.0 / p99 45.0 us."
            )),
            "{}",
            v.answer
        );
        // The three-stage rows join the latency CDF of their backend.
        let cdf = charts(&results).into_iter().find(|c| c.file_stem.starts_with("pipeline-latency-cdf")).unwrap();
        assert!(cdf.series.iter().any(|s| s.name == format!("three-stage-{name}-gpu-stream-ops-s4")));
    }

    #[test]
    fn the_table_has_a_line_per_row() {
        let results = recorded();
        let table = markdown_table(&results);
        let lines: Vec<&str> = table.lines().collect();
        assert_eq!(lines.len(), 2 + results.rows.len());
        assert!(lines[2].starts_with("| single-process | 64000 | 1593 | 1.00 | - | 15.0 | 20.5 | 0 |"), "{}", lines[2]);
        assert!(lines[4].contains("| study-d-ipc-spin | 16000 | 398 | 0.25 | 60.0 / 90.0 / 200 |"), "{}", lines[4]);
        assert_eq!(lines[5], "| study-a-pageable-shm | failed | - | - | - | - | - | - | a / b |");
        assert!(lines[8].contains("**7 (WRONG DATA)**"), "{}", lines[8]);
    }

    #[test]
    fn json_round_trips() {
        let results = recorded();
        let json = serde_json::to_string(&results).unwrap();
        assert!(json.contains(r#""status":"failed","reason":"a | b""#), "{json}");
        assert!(json.contains(r#""kind":"ours""#) && json.contains(r#""strategy":"gpu-stream-ops""#), "{json}");
        let back: PipelineResults = serde_json::from_str(&json).unwrap();
        assert_eq!(back, results);
    }

    #[test]
    fn charts_and_svgs() {
        let results = recorded();
        let charts = charts(&results);
        let backend = gpu_ipc::COMPILED_GPU[0].name();
        let stems: Vec<&str> = charts.iter().map(|c| c.file_stem.as_str()).collect();
        assert_eq!(stems, [format!("pipeline-fps-{backend}-c1"), format!("pipeline-latency-cdf-{backend}")]);
        let fps = &charts[0];
        let gso = fps.series.iter().find(|s| s.name == "gpu-stream-ops").unwrap();
        assert_eq!(gso.points, vec![(4.0, 54_400.0), (8.0, 56_000.0)]);
        let cdf = &charts[1];
        let names: Vec<&str> = cdf.series.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(names.len(), 3, "study d and the two 4-slot rows: {names:?}");
        let dir = std::env::temp_dir().join(format!("gpu-ipc-bench-plots-{}", std::process::id()));
        let written = write_charts(&charts, &dir).unwrap();
        assert_eq!(written.len(), 2);
        let svg = std::fs::read_to_string(&written[0]).unwrap();
        assert!(svg.starts_with("<svg") || svg.contains("<svg"), "an SVG document");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
