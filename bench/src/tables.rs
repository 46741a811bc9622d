//! The summary tables printed under the row table: latency under a frame rate (each strategy paced at every pace,
//! beside its unpaced row of the same backend and depth), and the research's measurements read against their
//! references (each kernel alone against both in one stream; copies with an imported buffer against the same
//! copies between local buffers).

use std::fmt::Write as _;

use gpu_ipc::core::wire::SyncStrategy;

use super::results::{Measurement, PipelineResults, RowOutcome, RowResult, ratio};
use super::rows::{ImportedCopy, KernelAlone, MemoryTest, PACES, ResidentShape, RowSpec};

/// A number with the digits worth reading (as the row table prints them).
pub fn number(x: f64) -> String {
    if x >= 100.0 {
        format!("{x:.0}")
    } else if x >= 10.0 {
        format!("{x:.1}")
    } else {
        format!("{x:.2}")
    }
}

/// `p50 / p99 / p99.9` of a measured row, `-` without latencies, or how the row ended.
fn latency_cell(row: Option<&RowResult>) -> String {
    match row.map(|r| &r.outcome) {
        None => "not run".to_owned(),
        Some(RowOutcome::Failed { .. }) => "failed".to_owned(),
        Some(RowOutcome::Unavailable { .. }) => "unavailable".to_owned(),
        Some(RowOutcome::Measured(m)) => match &m.latency {
            Some(l) if m.mismatches == 0 => {
                format!("{} / {} / {}", number(l.p50_us), number(l.p99_us), number(l.p999_us))
            }
            Some(_) => "WRONG DATA".to_owned(),
            None => "-".to_owned(),
        },
    }
}

fn find(results: &PipelineResults, spec: RowSpec) -> Option<&RowResult> {
    results.rows.iter().find(|r| r.spec == spec)
}

/// Latency under a frame rate: per backend and depth of the paced rows, one line per strategy with its unpaced
/// one-consumer row (FPS and latency) and its latency at each pace. `None` when no paced row ran.
pub fn paced_table(results: &PipelineResults) -> Option<String> {
    let mut groups: Vec<(gpu_ipc::BackendKind, u32)> = Vec::new();
    for r in &results.rows {
        if let RowSpec::Paced { backend, slots, .. } = r.spec
            && !groups.contains(&(backend, slots))
        {
            groups.push((backend, slots));
        }
    }
    if groups.is_empty() {
        return None;
    }
    let mut out = String::new();
    for (backend, slots) in groups {
        let _ = writeln!(
            out,
            "Latency under a frame rate ({} backend, {slots} slots, 1 consumer), publish to consumer done, p50 / p99 \
             / p99.9 (us):\n",
            backend.name()
        );
        out.push_str("| strategy | unpaced: FPS | unpaced: latency |");
        for fps in PACES {
            let _ = write!(out, " paced {fps} FPS |");
        }
        out.push_str("\n|---|---:|---|");
        out.push_str(&"---|".repeat(PACES.len()));
        out.push('\n');
        for strategy in SyncStrategy::ALL {
            let unpaced = find(results, RowSpec::Ours { backend, strategy, slots, consumers: 1 });
            let paced: Vec<Option<&RowResult>> =
                PACES.iter().map(|&fps| find(results, RowSpec::Paced { backend, strategy, slots, fps })).collect();
            if unpaced.is_none() && paced.iter().all(Option::is_none) {
                continue;
            }
            let fps = unpaced.and_then(RowResult::measured).map_or_else(|| "-".to_owned(), |m| number(m.fps));
            let _ = write!(out, "| {} | {fps} | {} |", strategy.name(), latency_cell(unpaced));
            for row in paced {
                let _ = write!(out, " {} |", latency_cell(row));
            }
            out.push('\n');
        }
    }
    Some(out)
}

/// Microseconds per frame at `m`'s rate.
fn us_per_frame(m: &Measurement) -> Option<f64> {
    (m.fps > 0.0).then(|| 1e6 / m.fps)
}

/// The research's measurements against their references: each kernel alone beside both in one stream, and each
/// copy with an imported buffer beside the same copy between local buffers. `None` when none of them ran.
pub fn research_table(results: &PipelineResults) -> Option<String> {
    let measured = |spec: RowSpec| find(results, spec).and_then(RowResult::measured).filter(|m| m.mismatches == 0);
    let mut lines = Vec::new();
    let fill = measured(RowSpec::Kernel { kernel: KernelAlone::Fill }).and_then(us_per_frame);
    let verify = measured(RowSpec::Kernel { kernel: KernelAlone::Verify }).and_then(us_per_frame);
    let both = measured(RowSpec::SingleProcess).and_then(us_per_frame);
    for (what, us) in [("generation only (fill kernel)", fill), ("processing only (verify kernel)", verify)] {
        if let Some(us) = us {
            lines.push(format!("| {what} | {} us per frame |", number(us)));
        }
    }
    if let (Some(both), Some(fill), Some(verify)) = (both, fill, verify) {
        lines.push(format!(
            "| both, one stream (single-process limit) | {} us per frame ({} the sum of the two alone, {} us) |",
            number(both),
            ratio(both, fill + verify).map_or_else(|| "n/a".to_owned(), |r| format!("{r:.2}x")),
            number(fill + verify)
        ));
    }
    let gb = |spec: RowSpec| measured(spec).and_then(|m| m.bandwidth_gb_s);
    let local_between = gb(RowSpec::Bandwidth);
    let local_within = gb(RowSpec::Memory { test: MemoryTest::LocalWithin });
    let mut backends: Vec<gpu_ipc::BackendKind> = Vec::new();
    for r in &results.rows {
        if let RowSpec::Imported { backend, .. } = r.spec
            && !backends.contains(&backend)
        {
            backends.push(backend);
        }
    }
    for backend in backends {
        for copy in ImportedCopy::ALL {
            let Some(value) = gb(RowSpec::Imported { backend, copy }) else { continue };
            let (reference, name) = match copy {
                ImportedCopy::Within => (local_within, "memory-local-within"),
                ImportedCopy::To | ImportedCopy::From => (local_between, "bandwidth-floor"),
            };
            let against = reference
                .and_then(|r| ratio(value, r))
                .map_or_else(|| format!("{name} not measured"), |r| format!("{r:.3}x {name}"));
            lines.push(format!(
                "| copy {} a {}-imported buffer | {} GB/s read + written, {against} |",
                copy.name(),
                backend.name(),
                number(value)
            ));
        }
    }
    if lines.is_empty() {
        return None;
    }
    Some(format!(
        "The research's measurements against their references (rows with 0 mismatches):\n\n| measurement | figure \
         |\n|---|---|\n{}\n",
        lines.join("\n")
    ))
}

/// The resident rows (both sides persistent kernels on the device-side ring) against the same kernels pipelined in
/// one process through as many buffers as the ring has slots: FPS, that reference, the ratio, latency, CPU per frame
/// and mismatches. `None` when no resident row ran.
pub fn resident_table(results: &PipelineResults) -> Option<String> {
    let rows: Vec<&RowResult> = results.rows.iter().filter(|r| matches!(r.spec, RowSpec::Resident { .. })).collect();
    if rows.is_empty() {
        return None;
    }
    let mut out = String::from(
        "The device-side ring (both sides persistent kernels, one launch each) against the same kernels pipelined in \
         one process at the same depth:\n\n| row | FPS | single-process-pipelined-sN FPS | x pipelined | latency p50 / \
         p99 / p99.9 (us) | CPU us/frame producer / consumer | mismatches |\n|---|---:|---:|---:|---|---|---:|\n",
    );
    for row in rows {
        let RowSpec::Resident { slots, .. } = row.spec else { continue };
        let reference = results.pipelined_fps(slots);
        let reference_cell = reference.map_or_else(|| "not measured".to_owned(), number);
        match &row.outcome {
            RowOutcome::Measured(m) => {
                let ratio_cell =
                    reference.and_then(|r| ratio(m.fps, r)).map_or_else(|| "n/a".to_owned(), |x| format!("{x:.3}"));
                let consumer = m.consumer_cpu_us_per_frame.iter().copied().reduce(f64::max);
                let mismatches =
                    if m.mismatches == 0 { "0".to_owned() } else { format!("**{} (WRONG DATA)**", m.mismatches) };
                let _ = writeln!(
                    out,
                    "| {} | {} | {reference_cell} | {ratio_cell} | {} | {} / {} | {mismatches} |",
                    row.row,
                    number(m.fps),
                    latency_cell(Some(row)),
                    number(m.producer_cpu_us_per_frame),
                    consumer.map_or_else(|| "-".to_owned(), number),
                );
            }
            RowOutcome::Failed { .. } | RowOutcome::Unavailable { .. } => {
                let how = latency_cell(Some(row));
                let _ = writeln!(out, "| {} | {how} | {reference_cell} | - | - | - | - |", row.row);
            }
        }
    }
    Some(out)
}

/// What the verdict says of the resident rows: the fastest clean grid row against the pipelined reference at its
/// depth, and the one-block rows beside it. `None` when no resident row ran cleanly.
pub fn resident_words(results: &PipelineResults) -> Option<String> {
    let clean = |r: &&RowResult| r.measured().is_some_and(|m| m.mismatches == 0);
    let against = |row: &RowResult| -> Option<(f64, f64)> {
        let RowSpec::Resident { slots, .. } = row.spec else { return None };
        let m = row.measured()?;
        Some((m.fps, ratio(m.fps, results.pipelined_fps(slots)?)?))
    };
    let is = |r: &&RowResult, want: ResidentShape| matches!(r.spec, RowSpec::Resident { shape, .. } if shape == want);
    let best = results
        .rows
        .iter()
        .filter(|r| is(r, ResidentShape::Grid))
        .filter(clean)
        .filter_map(|r| against(r).map(|figures| (r, figures)))
        .max_by(|a, b| a.1.1.total_cmp(&b.1.1));
    let one_block: Vec<String> = results
        .rows
        .iter()
        .filter(|r| is(r, ResidentShape::OneBlock))
        .filter(clean)
        .filter_map(|r| against(r).map(|(fps, x)| format!("{} {fps:.0} FPS ({x:.2}x)", r.row)))
        .collect();
    let mut line = match best {
        Some((row, (fps, x))) => format!(
            "On the device-side ring (persistent kernels, one launch per side) the best, {}, ran {fps:.0} FPS, \
             {x:.3}x the same kernels pipelined in one process at its depth",
            row.row
        ),
        None if one_block.is_empty() => return None,
        None => "No grid row of the device-side ring ran cleanly".to_owned(),
    };
    if !one_block.is_empty() {
        let _ = write!(line, "; in one block per side: {}", one_block.join(", "));
    }
    line.push('.');
    Some(line)
}

/// What the verdict says of the paced rows (the spread of p99.9 at the highest pace that ran) and of the study's
/// designs added for the research (mapped zero-copy; the basic design with 16 ms sleeps beside 1 ms).
pub fn verdict_words(results: &PipelineResults) -> Vec<String> {
    let clean = |r: &&RowResult| r.measured().is_some_and(|m| m.mismatches == 0);
    let mut words = Vec::new();
    let top = results
        .rows
        .iter()
        .filter(clean)
        .filter_map(|r| match r.spec {
            RowSpec::Paced { fps, .. } => Some(fps),
            _ => None,
        })
        .max();
    if let Some(top) = top {
        let p999: Vec<(f64, &'static str)> = results
            .rows
            .iter()
            .filter(clean)
            .filter_map(|r| match (r.spec, r.measured().and_then(|m| m.latency.as_ref())) {
                (RowSpec::Paced { fps, strategy, .. }, Some(l)) if fps == top => Some((l.p999_us, strategy.name())),
                _ => None,
            })
            .collect();
        let lo = p999.iter().min_by(|a, b| a.0.total_cmp(&b.0));
        let hi = p999.iter().max_by(|a, b| a.0.total_cmp(&b.0));
        if let (Some(lo), Some(hi)) = (lo, hi) {
            words.push(format!(
                "Paced at {top} FPS, p99.9 latency ran from {} us ({}) to {} us ({}).",
                number(lo.0),
                lo.1,
                number(hi.0),
                hi.1
            ));
        }
    }
    let fps = |design| {
        results
            .rows
            .iter()
            .filter(clean)
            .find(|r| r.spec == RowSpec::Study { design })
            .and_then(RowResult::measured)
            .map(|m| number(m.fps))
    };
    use super::rows::StudyDesign;
    if let Some(mapped) = fps(StudyDesign::MappedZeroCopy) {
        words.push(format!("The study's mapped zero-copy design ran {mapped} FPS."));
    }
    if let Some(slow) = fps(StudyDesign::PageableShm16ms) {
        let fast = fps(StudyDesign::PageableShm).map_or_else(String::new, |f| format!(" (with 1 ms sleeps {f} FPS)"));
        words.push(format!("Its basic design with 16 ms sleeps ran {slow} FPS{fast}."));
    }
    words
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use gpu_ipc::BackendKind;

    use super::*;
    use crate::results::LatencySummary;

    fn measured(fps: f64, latency: Option<(f64, f64, f64)>, bandwidth: Option<f64>) -> RowOutcome {
        RowOutcome::Measured(Measurement {
            frames: 1000,
            seconds: 1000.0 / fps,
            fps,
            ratio_to_single_process: None,
            latency: latency.map(|(p50_us, p99_us, p999_us)| LatencySummary {
                count: 1000,
                p50_us,
                p99_us,
                p999_us,
                max_us: p999_us,
                mean_us: p50_us,
                cdf: Vec::new(),
            }),
            producer_cpu_us_per_frame: 1.0,
            consumer_cpu_us_per_frame: vec![1.0],
            mismatches: 0,
            bandwidth_gb_s: bandwidth,
            frame_gb_s: None,
            note: None,
        })
    }

    fn results(rows: Vec<(RowSpec, RowOutcome)>) -> PipelineResults {
        PipelineResults {
            frame_bytes: 24_883_200,
            frame_shape: [3840, 2160, 3],
            frames: 1000,
            warmup: 10,
            latency_method: String::new(),
            rows: rows.into_iter().map(|(spec, outcome)| RowResult { row: spec.name(), spec, outcome }).collect(),
        }
    }

    #[test]
    fn paced_rows_sit_beside_their_unpaced_row() {
        let vmm = BackendKind::Vmm;
        let paced = |strategy, fps| RowSpec::Paced { backend: vmm, strategy, slots: 4, fps };
        let run = results(vec![
            (
                RowSpec::Ours { backend: vmm, strategy: SyncStrategy::CpuSpin, slots: 4, consumers: 1 },
                measured(30_000.0, Some((20.0, 30.0, 40.0)), None),
            ),
            (paced(SyncStrategy::CpuSpin, 60), measured(60.0, Some((12.0, 15.5, 101.0)), None)),
            (paced(SyncStrategy::CpuSpin, 1_000), measured(1_000.0, Some((11.0, 14.0, 19.0)), None)),
            (paced(SyncStrategy::GpuPoll, 60), RowOutcome::Unavailable { reason: "no MPS".into() }),
        ]);
        let table = paced_table(&run).unwrap();
        let lines: Vec<&str> = table.lines().collect();
        assert!(lines[0].starts_with("Latency under a frame rate (vmm backend, 4 slots, 1 consumer)"), "{table}");
        assert_eq!(
            lines[2],
            "| strategy | unpaced: FPS | unpaced: latency | paced 60 FPS | paced 240 FPS | paced 1000 FPS |"
        );
        assert_eq!(
            lines[4],
            "| cpu-spin | 30000 | 20.0 / 30.0 / 40.0 | 12.0 / 15.5 / 101 | not run | 11.0 / 14.0 / 19.0 |"
        );
        assert_eq!(lines[5], "| gpu-poll | - | not run | unavailable | not run | not run |");
        assert_eq!(lines.len(), 6, "strategies with no row are left out: {table}");
        assert!(paced_table(&results(Vec::new())).is_none());
        assert_eq!(
            verdict_words(&run),
            ["Paced at 1000 FPS, p99.9 latency ran from 19.0 us (cpu-spin) to 19.0 us (cpu-spin)."]
        );
        let mut more = run.clone();
        more.rows.push(RowResult {
            row: "paced-1000-vmm-ipc-event-s4".into(),
            spec: paced(SyncStrategy::IpcEvent, 1_000),
            outcome: measured(1_000.0, Some((30.0, 40.0, 55.5)), None),
        });
        for (design, fps) in
            [(crate::rows::StudyDesign::PageableShm16ms, 31.0), (crate::rows::StudyDesign::MappedZeroCopy, 420.0)]
        {
            let spec = RowSpec::Study { design };
            more.rows.push(RowResult { row: spec.name(), spec, outcome: measured(fps, None, None) });
        }
        assert_eq!(
            verdict_words(&more),
            [
                "Paced at 1000 FPS, p99.9 latency ran from 19.0 us (cpu-spin) to 55.5 us (ipc-event).",
                "The study's mapped zero-copy design ran 420 FPS.",
                "Its basic design with 16 ms sleeps ran 31.0 FPS."
            ]
        );
    }

    #[test]
    fn resident_rows_sit_beside_the_pipelined_reference_at_their_depth() {
        let vmm = BackendKind::Vmm;
        let resident = |slots, shape| RowSpec::Resident { backend: vmm, slots, shape };
        let mut wrong = measured(70_000.0, Some((20.0, 30.0, 40.0)), None);
        if let RowOutcome::Measured(m) = &mut wrong {
            m.mismatches = 12;
        }
        let run = results(vec![
            (RowSpec::SingleProcessPipelined { slots: 2 }, measured(62_000.0, None, None)),
            (RowSpec::SingleProcessPipelined { slots: 4 }, measured(64_000.0, None, None)),
            (resident(2, ResidentShape::Grid), measured(60_140.0, Some((25.0, 31.0, 44.0)), None)),
            (resident(4, ResidentShape::Grid), measured(61_440.0, Some((40.0, 52.0, 61.0)), None)),
            (resident(8, ResidentShape::Grid), wrong),
            (resident(4, ResidentShape::OneBlock), measured(3_200.0, None, None)),
        ]);
        let table = resident_table(&run).unwrap();
        let lines: Vec<&str> = table.lines().collect();
        assert!(lines[0].starts_with("The device-side ring (both sides persistent kernels"), "{table}");
        assert_eq!(
            lines[4], "| resident-vmm-s2 | 60140 | 62000 | 0.970 | 25.0 / 31.0 / 44.0 | 1.00 / 1.00 | 0 |",
            "{table}"
        );
        assert_eq!(lines[5], "| resident-vmm-s4 | 61440 | 64000 | 0.960 | 40.0 / 52.0 / 61.0 | 1.00 / 1.00 | 0 |");
        assert_eq!(
            lines[6],
            "| resident-vmm-s8 | 70000 | not measured | n/a | WRONG DATA | 1.00 / 1.00 | **12 (WRONG DATA)** |"
        );
        assert_eq!(lines[7], "| resident-vmm-s4-one-block | 3200 | 64000 | 0.050 | - | 1.00 / 1.00 | 0 |");
        assert!(resident_table(&results(Vec::new())).is_none());
        assert_eq!(
            resident_words(&run).unwrap(),
            "On the device-side ring (persistent kernels, one launch per side) the best, resident-vmm-s2, ran 60140 \
             FPS, 0.970x the same kernels pipelined in one process at its depth; in one block per side: \
             resident-vmm-s4-one-block 3200 FPS (0.05x)."
        );
        let unavailable = results(vec![(
            resident(4, ResidentShape::Grid),
            RowOutcome::Unavailable { reason: "MPS is not running".into() },
        )]);
        assert_eq!(
            resident_table(&unavailable).unwrap().lines().nth(4),
            Some("| resident-vmm-s4 | unavailable | not measured | - | - | - | - |")
        );
        assert!(resident_words(&unavailable).is_none(), "nothing ran cleanly: nothing said");
    }

    #[test]
    fn kernels_alone_and_imported_copies_against_their_references() {
        let run = results(vec![
            (RowSpec::SingleProcess, measured(50_000.0, None, None)),
            (RowSpec::Bandwidth, measured(50_000.0, None, Some(2_000.0))),
            (RowSpec::Kernel { kernel: KernelAlone::Fill }, measured(100_000.0, None, None)),
            (RowSpec::Kernel { kernel: KernelAlone::Verify }, measured(80_000.0, None, None)),
            (RowSpec::Memory { test: MemoryTest::LocalWithin }, measured(50_000.0, None, Some(2_500.0))),
            (
                RowSpec::Imported { backend: BackendKind::Legacy, copy: ImportedCopy::Within },
                measured(1.0, None, Some(2_450.0)),
            ),
            (
                RowSpec::Imported { backend: BackendKind::Legacy, copy: ImportedCopy::To },
                measured(1.0, None, Some(2_000.0)),
            ),
        ]);
        let table = research_table(&run).unwrap();
        assert!(table.contains("| generation only (fill kernel) | 10.0 us per frame |"), "{table}");
        assert!(table.contains("| processing only (verify kernel) | 12.5 us per frame |"), "{table}");
        assert!(table.contains("| both, one stream (single-process limit) | 20.0 us per frame (0.89x the sum of the two alone, 22.5 us) |"), "{table}");
        assert!(
            table.contains("| copy to a legacy-imported buffer | 2000 GB/s read + written, 1.000x bandwidth-floor |"),
            "{table}"
        );
        assert!(
            table.contains(
                "| copy within a legacy-imported buffer | 2450 GB/s read + written, 0.980x memory-local-within |"
            ),
            "{table}"
        );
        assert!(research_table(&results(Vec::new())).is_none());
    }
}
