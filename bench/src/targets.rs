//! `gpu-ipc bench targets`: the project's performance targets (docs/benchmarks.md, "Targets"), judged from two
//! pipeline runs of the same session (one without MPS, one under MPS), each figure set against the references
//! measured in its own run.
//!
//! Which strategies count as what: the *GPU-side* strategies are those whose waits the GPU does (`gpu-stream-ops`,
//! `gpu-poll`); the *CPU* strategies are `cpu-spin` and `cpu-sleep`. `ipc-event` (the consumer's CPU polls an IPC
//! event, the producer's stream waits on one) is neither and is compared with nothing; it still counts for "best".
//! A row counts only when it was measured and read no wrong word.
//!
//! The latency under a frame rate and the research's missing measurements have no figure to reach: they are judged
//! on being measured at all, in both runs, and the paced rows on what a real-time user needs of them (each keeps its
//! pace, and finishes its frames within one frame interval at p99.9).

use gpu_ipc::core::wire::SyncStrategy;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use clap::Args;
use serde::{Deserialize, Serialize};

use super::results::{Measurement, PipelineResults, RowOutcome, RowResult};
use super::rows::{ImportedCopy, KernelAlone, MemoryTest, RowSpec, StudyDesign};
use super::tables::number;
use harness::ProbeOutput;

/// With MPS: best of ours over the single-process limit, same run (the project's targets, docs/benchmarks.md).
pub const BEST_MPS_RATIO: f64 = 0.90;
/// Without MPS: best of ours over the seed design (study d), same run.
pub const NO_MPS_OVER_SEED: f64 = 10.0;
/// GPU-side strategies: CPU time per frame per process at full rate, microseconds.
pub const GPU_SIDE_CPU_US: f64 = 5.0;
/// A paced row keeps its pace when its producer's rate is at least this share of it.
pub const PACE_HELD: f64 = 0.99;

const GPU_SIDE: [SyncStrategy; 2] = [SyncStrategy::GpuStreamOps, SyncStrategy::GpuPoll];
const CPU_SIDE: [SyncStrategy; 2] = [SyncStrategy::CpuSpin, SyncStrategy::CpuSleep];

/// Options of `gpu-ipc bench targets`.
#[derive(Debug, Clone, Args)]
pub struct TargetsArgs {
    /// The JSON of `gpu-ipc bench pipeline --json --out FILE` run without MPS.
    #[arg(long, value_name = "FILE")]
    pub no_mps: PathBuf,
    /// The JSON of `gpu-ipc bench pipeline --mps --out FILE` from the same session.
    #[arg(long, value_name = "FILE")]
    pub mps: PathBuf,
    /// Print the judgement as JSON instead of a Markdown table.
    #[arg(long)]
    pub json: bool,
    /// Also write the Markdown table to this file.
    #[arg(long, value_name = "FILE")]
    pub markdown: Option<PathBuf>,
}

/// One target, judged.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Judged {
    /// The target, in words.
    pub target: String,
    /// What the runs measured, in words and figures.
    pub measured: String,
    /// Whether it was met; `None` when the runs hold no figure for it.
    pub met: Option<bool>,
}

/// Rows that ran cleanly: measured, no wrong word.
fn clean(rows: &[RowResult]) -> impl Iterator<Item = (&RowResult, &Measurement)> {
    rows.iter().filter_map(|r| r.measured().filter(|m| m.mismatches == 0).map(|m| (r, m)))
}

/// The fastest clean row of ours.
fn best_of_ours(results: &PipelineResults) -> Option<(&RowResult, &Measurement)> {
    clean(&results.rows)
        .filter(|(r, _)| matches!(r.spec, RowSpec::Ours { .. }))
        .max_by(|a, b| a.1.fps.total_cmp(&b.1.fps))
}

fn seed_fps(results: &PipelineResults) -> Option<f64> {
    clean(&results.rows)
        .find(|(r, _)| r.spec == RowSpec::Study { design: StudyDesign::LegacyIpcSpin })
        .map(|(_, m)| m.fps)
}

/// Judges every target from the two runs.
pub fn judge(no_mps: &PipelineResults, mps: &PipelineResults) -> Vec<Judged> {
    vec![
        best_under_mps(mps),
        gpu_side_at_every_slot_count(mps),
        no_mps_over_seed(no_mps),
        gpu_side_cpu(mps),
        paced_latency(no_mps, "without MPS"),
        paced_latency(mps, "with MPS"),
        research_measured(no_mps, "without MPS"),
        research_measured(mps, "with MPS"),
    ]
}

/// Every paced row of `run`: measured cleanly, its pace kept, p99.9 within one frame interval.
fn paced_latency(run: &PipelineResults, label: &str) -> Judged {
    let target = format!(
        "{label}: every strategy paced at 60, 240 and 1,000 FPS measured (p50 / p99 / p99.9), each keeping its pace \
         (>= {PACE_HELD:.2}x) and finishing its frames within one frame interval at p99.9"
    );
    let (mut good, mut ran, mut unavailable) = (0, 0, 0);
    let mut missed = Vec::new();
    let mut fastest: Option<(f64, String)> = None;
    for r in &run.rows {
        let RowSpec::Paced { strategy, fps, .. } = r.spec else { continue };
        let interval_us = 1e6 / f64::from(fps.max(1));
        match &r.outcome {
            RowOutcome::Unavailable { .. } => unavailable += 1,
            RowOutcome::Failed { reason } => {
                ran += 1;
                missed.push(format!("{} failed ({reason})", r.row));
            }
            RowOutcome::Measured(m) => {
                ran += 1;
                let Some(l) = m.latency.as_ref().filter(|_| m.mismatches == 0) else {
                    missed.push(format!("{}: no clean latency", r.row));
                    continue;
                };
                let held = m.fps / f64::from(fps.max(1));
                if held < PACE_HELD {
                    missed.push(format!("{}: ran {} FPS ({held:.3}x its pace)", r.row, number(m.fps)));
                } else if l.p999_us > interval_us {
                    missed.push(format!(
                        "{}: p99.9 {} us > interval {} us",
                        r.row,
                        number(l.p999_us),
                        number(interval_us)
                    ));
                } else {
                    good += 1;
                }
                if fps == super::rows::PACES[super::rows::PACES.len() - 1]
                    && fastest.as_ref().is_none_or(|(best, _)| l.p999_us < *best)
                {
                    fastest = Some((l.p999_us, format!("{} at {fps} FPS", strategy.name())));
                }
            }
        }
    }
    if ran == 0 {
        return Judged { target, measured: "no paced row in this run".into(), met: None };
    }
    let mut measured = format!("{good} of {ran} rows");
    if unavailable > 0 {
        let _ = write!(measured, " ({unavailable} unavailable here)");
    }
    if let Some((p999, which)) = fastest {
        let _ = write!(measured, "; lowest p99.9 {} us ({which})", number(p999));
    }
    if !missed.is_empty() {
        let shown = missed.len().min(3);
        let _ = write!(measured, "; missed: {}", missed[..shown].join("; "));
        if missed.len() > shown {
            let _ = write!(measured, "; and {} more", missed.len() - shown);
        }
    }
    Judged { target, measured, met: Some(missed.is_empty()) }
}

/// The research's designs and measurements: each row measured cleanly in `run`, with its figure.
fn research_measured(run: &PipelineResults, label: &str) -> Judged {
    let target = format!(
        "{label}: the research's missing designs and measurements, in the same run: mapped zero-copy, the basic \
         design with 16 ms and 1 ms sleeps, pinned and mapped memory, copies with an imported buffer, each kernel \
         alone"
    );
    let mut wanted: Vec<RowSpec> =
        [StudyDesign::MappedZeroCopy, StudyDesign::PageableShm16ms, StudyDesign::PageableShm]
            .into_iter()
            .map(|design| RowSpec::Study { design })
            .collect();
    wanted.extend(MemoryTest::ALL.map(|test| RowSpec::Memory { test }));
    wanted.extend(KernelAlone::ALL.map(|kernel| RowSpec::Kernel { kernel }));
    let mut backends: Vec<gpu_ipc::BackendKind> = Vec::new();
    for r in &run.rows {
        if let RowSpec::Imported { backend, .. } | RowSpec::Ours { backend, .. } = r.spec
            && !backends.contains(&backend)
        {
            backends.push(backend);
        }
    }
    for &backend in &backends {
        wanted.extend(ImportedCopy::ALL.map(|copy| RowSpec::Imported { backend, copy }));
    }
    let row_of = |spec: RowSpec| run.rows.iter().find(|r| r.spec == spec);
    let clean_of = |spec: RowSpec| row_of(spec).and_then(RowResult::measured).filter(|m| m.mismatches == 0);
    let missing: Vec<String> = wanted.iter().filter(|&&s| clean_of(s).is_none()).map(RowSpec::name).collect();
    if missing.len() == wanted.len() {
        return Judged { target, measured: "none of these rows in this run".into(), met: None };
    }
    let fps = |spec| clean_of(spec).map_or_else(|| "-".to_owned(), |m| number(m.fps));
    let gb = |spec| clean_of(spec).and_then(|m| m.frame_gb_s).map_or_else(|| "-".to_owned(), number);
    let study = |design| RowSpec::Study { design };
    let memory = |test| RowSpec::Memory { test };
    let mut measured = format!(
        "mapped zero-copy {} FPS; basic design 16 ms sleeps {} FPS, 1 ms {} FPS; pinned copies host-to-device {} \
         GB/s, device-to-host {} GB/s; kernels on mapped memory write {} GB/s, read {} GB/s",
        fps(study(StudyDesign::MappedZeroCopy)),
        fps(study(StudyDesign::PageableShm16ms)),
        fps(study(StudyDesign::PageableShm)),
        gb(memory(MemoryTest::PinnedHtoD)),
        gb(memory(MemoryTest::PinnedDtoH)),
        gb(memory(MemoryTest::MappedKernelWrite)),
        gb(memory(MemoryTest::MappedKernelRead)),
    );
    let kernel_us = |kernel| clean_of(RowSpec::Kernel { kernel }).filter(|m| m.fps > 0.0).map(|m| 1e6 / m.fps);
    if let (Some(fill), Some(verify)) = (kernel_us(KernelAlone::Fill), kernel_us(KernelAlone::Verify)) {
        let _ = write!(measured, "; fill alone {} us, verify alone {} us", number(fill), number(verify));
    }
    let local_within = clean_of(memory(MemoryTest::LocalWithin)).and_then(|m| m.bandwidth_gb_s);
    let within: Vec<f64> = backends
        .iter()
        .filter_map(|&backend| clean_of(RowSpec::Imported { backend, copy: ImportedCopy::Within }))
        .filter_map(|m| m.bandwidth_gb_s)
        .filter_map(|gb| local_within.and_then(|local| super::results::ratio(gb, local)))
        .collect();
    if !within.is_empty() {
        let (lo, hi) = range(within.into_iter());
        let _ = write!(measured, "; copies within an imported buffer {lo:.3}-{hi:.3}x the same within a local one");
    }
    if !missing.is_empty() {
        let _ = write!(measured, "; not measured cleanly: {}", missing.join(", "));
    }
    Judged { target, measured, met: Some(missing.is_empty()) }
}

fn best_under_mps(mps: &PipelineResults) -> Judged {
    let target = format!("best configuration with MPS >= {BEST_MPS_RATIO:.2}x the single-process limit");
    match (best_of_ours(mps), mps.single_process_fps()) {
        (Some((row, m)), Some(limit)) if limit > 0.0 => {
            let ratio = m.fps / limit;
            Judged {
                target,
                measured: format!("{:.2}x ({}: {:.0} FPS; limit {limit:.0} FPS)", ratio, row.row, m.fps),
                met: Some(ratio >= BEST_MPS_RATIO),
            }
        }
        _ => Judged { target, measured: "no clean row of ours, or no single-process limit".into(), met: None },
    }
}

/// Per (backend, consumers, slots) cell of the MPS run: does each GPU-side strategy run at least as fast as the
/// fastest CPU strategy of the cell?
fn gpu_side_at_every_slot_count(mps: &PipelineResults) -> Judged {
    let target = "at every slot count, with MPS, the GPU-side strategies at least as fast as the CPU ones".to_owned();
    let fps_of = |backend, strategy, slots, consumers| {
        clean(&mps.rows)
            .find(|(r, _)| r.spec == RowSpec::Ours { backend, strategy, slots, consumers })
            .map(|(_, m)| m.fps)
    };
    let mut cells: Vec<(gpu_ipc::BackendKind, u32, u32)> = mps
        .rows
        .iter()
        .filter_map(|r| match r.spec {
            RowSpec::Ours { backend, slots, consumers, .. } => Some((backend, consumers, slots)),
            _ => None,
        })
        .collect();
    cells.sort_by_key(|&(b, c, s)| (b.name(), c, s));
    cells.dedup();
    let mut words = Vec::new();
    let mut all_met = true;
    let mut any = false;
    for strategy in GPU_SIDE {
        let (mut won, mut compared) = (0, 0);
        let mut worst: Option<(f64, String)> = None;
        for &(backend, consumers, slots) in &cells {
            let Some(gpu) = fps_of(backend, strategy, slots, consumers) else { continue };
            let Some(cpu) = CPU_SIDE.iter().filter_map(|&s| fps_of(backend, s, slots, consumers)).reduce(f64::max)
            else {
                continue;
            };
            compared += 1;
            if gpu >= cpu {
                won += 1;
            } else {
                let deficit = 1.0 - gpu / cpu;
                if worst.as_ref().is_none_or(|(d, _)| deficit > *d) {
                    worst = Some((deficit, format!("{}, {slots} slots, {consumers} consumers", backend.name())));
                }
            }
        }
        if compared == 0 {
            words.push(format!("{}: not measured", strategy.name()));
            continue;
        }
        any = true;
        all_met &= won == compared;
        let mut line = format!("{}: as fast or faster in {won} of {compared} cells", strategy.name());
        if let Some((deficit, cell)) = worst {
            let _ = write!(line, " (worst: {:.1}% slower, {cell})", deficit * 100.0);
        }
        words.push(line);
    }
    Judged { target, measured: words.join("; "), met: any.then_some(all_met) }
}

fn no_mps_over_seed(no_mps: &PipelineResults) -> Judged {
    let target = format!("without MPS, best >= {NO_MPS_OVER_SEED:.0}x the seed design (study d) of the same run");
    match (best_of_ours(no_mps), seed_fps(no_mps)) {
        (Some((row, m)), Some(seed)) if seed > 0.0 => Judged {
            target,
            measured: format!("{:.1}x ({}: {:.0} FPS; seed {seed:.0} FPS)", m.fps / seed, row.row, m.fps),
            met: Some(m.fps / seed >= NO_MPS_OVER_SEED),
        },
        _ => Judged { target, measured: "no clean row of ours, or no seed row".into(), met: None },
    }
}

fn gpu_side_cpu(mps: &PipelineResults) -> Judged {
    let target =
        format!("GPU-side strategies: at most {GPU_SIDE_CPU_US:.0} us of CPU per frame per process (MPS, full rate)");
    let mut words = Vec::new();
    let mut all_met = true;
    let mut any = false;
    for strategy in GPU_SIDE {
        let rows: Vec<&Measurement> = clean(&mps.rows)
            .filter(|(r, _)| matches!(r.spec, RowSpec::Ours { strategy: s, .. } if s == strategy))
            .map(|(_, m)| m)
            .collect();
        if rows.is_empty() {
            words.push(format!("{}: not measured", strategy.name()));
            continue;
        }
        any = true;
        let producer = range(rows.iter().map(|m| m.producer_cpu_us_per_frame));
        let consumer = range(rows.iter().flat_map(|m| m.consumer_cpu_us_per_frame.iter().copied()));
        all_met &= producer.1 <= GPU_SIDE_CPU_US && consumer.1 <= GPU_SIDE_CPU_US;
        words.push(format!(
            "{}: producer {:.1}-{:.1} us, consumers {:.1}-{:.1} us",
            strategy.name(),
            producer.0,
            producer.1,
            consumer.0,
            consumer.1
        ));
    }
    Judged { target, measured: words.join("; "), met: any.then_some(all_met) }
}

/// (min, max) of the values; (NaN, NaN) for none.
fn range(values: impl Iterator<Item = f64>) -> (f64, f64) {
    values.fold((f64::NAN, f64::NAN), |(lo, hi), v| (lo.min(v), hi.max(v)))
}

/// The Markdown table.
pub fn markdown(judged: &[Judged]) -> String {
    let mut out = String::from("| target | measured | met |\n|---|---|---|\n");
    for j in judged {
        let met = match j.met {
            Some(true) => "yes",
            Some(false) => "**no**",
            None => "not measured",
        };
        let _ = writeln!(out, "| {} | {} | {met} |", j.target, j.measured.replace('|', "/"));
    }
    out
}

fn load(path: &Path, want_mps: bool) -> Result<PipelineResults, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let output: ProbeOutput<PipelineResults> =
        serde_json::from_str(&text).map_err(|e| format!("{}: not a bench pipeline JSON: {e}", path.display()))?;
    if output.probe != "bench-pipeline" {
        return Err(format!("{}: the JSON of probe '{}', not of bench-pipeline", path.display(), output.probe));
    }
    if output.env.mps != want_mps {
        return Err(format!(
            "{}: that run was {} MPS, but it was given as the run {} MPS",
            path.display(),
            if output.env.mps { "under" } else { "without" },
            if want_mps { "under" } else { "without" }
        ));
    }
    Ok(output.results)
}

/// `gpu-ipc bench targets`. Returns the exit status: 0 judged (met or not: read the table), 1 a file could not be
/// read or is not what it was given as.
pub fn targets_main(args: &TargetsArgs) -> u8 {
    let runs = load(&args.no_mps, false).and_then(|a| load(&args.mps, true).map(|b| (a, b)));
    let (no_mps, mps) = match runs {
        Ok(runs) => runs,
        Err(e) => {
            eprintln!("gpu-ipc bench targets: {e}");
            return 1;
        }
    };
    let judged = judge(&no_mps, &mps);
    let table = markdown(&judged);
    if let Some(path) = &args.markdown
        && let Err(e) = std::fs::write(path, &table)
    {
        eprintln!("gpu-ipc bench targets: writing {}: {e}", path.display());
        return 1;
    }
    if args.json {
        match serde_json::to_string_pretty(&judged) {
            Ok(text) => println!("{text}"),
            Err(e) => {
                eprintln!("gpu-ipc bench targets: {e}");
                return 1;
            }
        }
    } else {
        print!("{table}");
    }
    0
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use gpu_ipc::BackendKind;

    use super::*;
    use crate::results::LatencySummary;

    fn measured(fps: f64, producer_cpu: f64) -> Measurement {
        Measurement {
            frames: 1000,
            seconds: 1000.0 / fps,
            fps,
            ratio_to_single_process: None,
            latency: None,
            producer_cpu_us_per_frame: producer_cpu,
            consumer_cpu_us_per_frame: vec![producer_cpu + 1.0],
            mismatches: 0,
            bandwidth_gb_s: None,
            frame_gb_s: None,
            note: None,
        }
    }

    fn row(spec: RowSpec, fps: f64, cpu: f64) -> RowResult {
        RowResult { row: spec.name(), spec, outcome: RowOutcome::Measured(measured(fps, cpu)) }
    }

    fn ours(strategy: SyncStrategy, slots: u32, fps: f64, cpu: f64) -> RowResult {
        row(RowSpec::Ours { backend: BackendKind::Vmm, strategy, slots, consumers: 1 }, fps, cpu)
    }

    fn results(rows: Vec<RowResult>) -> PipelineResults {
        PipelineResults {
            frame_bytes: 24_883_200,
            frame_shape: [3840, 2160, 3],
            frames: 1000,
            warmup: 100,
            latency_method: String::new(),
            rows,
        }
    }

    fn mps_run() -> PipelineResults {
        results(vec![
            row(RowSpec::SingleProcess, 60_000.0, 15.0),
            ours(SyncStrategy::CpuSpin, 1, 30_000.0, 30.0),
            ours(SyncStrategy::CpuSleep, 1, 10_000.0, 20.0),
            ours(SyncStrategy::GpuStreamOps, 1, 33_000.0, 4.0),
            ours(SyncStrategy::CpuSpin, 2, 34_000.0, 30.0),
            ours(SyncStrategy::GpuStreamOps, 2, 32_300.0, 4.5),
            ours(SyncStrategy::IpcEvent, 2, 55_000.0, 20.0),
        ])
    }

    #[test]
    fn best_with_mps_is_judged_against_the_single_process_limit_of_its_run() {
        let j = best_under_mps(&mps_run());
        assert_eq!(j.met, Some(true), "{j:?}");
        assert!(j.measured.starts_with("0.92x (ours-vmm-ipc-event-s2-c1"), "{}", j.measured);
        let mut slow = mps_run();
        slow.rows.retain(|r| !r.row.contains("ipc-event"));
        let j = best_under_mps(&slow);
        assert_eq!(j.met, Some(false));
        assert!(j.measured.starts_with("0.57x"), "{}", j.measured);
    }

    #[test]
    fn gpu_side_strategies_are_compared_with_the_fastest_cpu_strategy_of_each_cell() {
        let j = gpu_side_at_every_slot_count(&mps_run());
        assert_eq!(j.met, Some(false));
        assert!(j.measured.contains("gpu-stream-ops: as fast or faster in 1 of 2 cells"), "{}", j.measured);
        assert!(j.measured.contains("5.0% slower, vmm, 2 slots, 1 consumers"), "{}", j.measured);
        assert!(j.measured.contains("gpu-poll: not measured"), "{}", j.measured);
    }

    #[test]
    fn wrong_data_or_a_failed_row_never_counts() {
        let mut run = mps_run();
        for r in &mut run.rows {
            if r.row == "ours-vmm-gpu-stream-ops-s2-c1" {
                r.outcome = RowOutcome::Failed { reason: "hung".into() };
            }
            if r.row == "ours-vmm-ipc-event-s2-c1"
                && let RowOutcome::Measured(m) = &mut r.outcome
            {
                m.mismatches = 3;
            }
        }
        let j = gpu_side_at_every_slot_count(&run);
        assert_eq!(j.met, Some(true), "{j:?}");
        assert!(best_under_mps(&run).measured.contains("ours-vmm-cpu-spin-s2-c1"));
    }

    #[test]
    fn no_mps_best_over_the_seed_and_the_cpu_cost_of_the_gpu_side_strategies() {
        let no_mps = results(vec![
            row(RowSpec::Study { design: StudyDesign::LegacyIpcSpin }, 3_000.0, 300.0),
            ours(SyncStrategy::IpcEvent, 32, 28_500.0, 35.0),
        ]);
        let j = no_mps_over_seed(&no_mps);
        assert_eq!(j.met, Some(false));
        assert!(j.measured.starts_with("9.5x"), "{}", j.measured);
        let j = gpu_side_cpu(&mps_run());
        // Producers 4.0 and 4.5 us, consumers 5.0 and 5.5 us: the consumers miss.
        assert_eq!(j.met, Some(false), "{j:?}");
        assert!(j.measured.contains("gpu-stream-ops: producer 4.0-4.5 us, consumers 5.0-5.5 us"), "{}", j.measured);
        let j = gpu_side_cpu(&results(vec![]));
        assert_eq!(j.met, None);
    }

    #[test]
    fn the_table_says_which_targets_were_missed() {
        let table = markdown(&judge(&results(vec![]), &mps_run()));
        assert!(table.starts_with("| target | measured | met |"));
        assert_eq!(table.lines().count(), 10);
        assert!(table.contains("| **no** |"));
        assert!(table.contains("| not measured |"));
        assert!(table.contains("| without MPS: every strategy paced at 60, 240 and 1,000 FPS"), "{table}");
    }

    fn paced(strategy: SyncStrategy, fps: u32, achieved: f64, p999_us: f64) -> RowResult {
        let spec = RowSpec::Paced { backend: BackendKind::Vmm, strategy, slots: 4, fps };
        let mut m = measured(achieved, 3.0);
        m.latency = Some(LatencySummary {
            count: 1000,
            p50_us: p999_us / 4.0,
            p99_us: p999_us / 2.0,
            p999_us,
            max_us: p999_us,
            mean_us: p999_us / 4.0,
            cdf: Vec::new(),
        });
        RowResult { row: spec.name(), spec, outcome: RowOutcome::Measured(m) }
    }

    #[test]
    fn paced_rows_must_keep_their_pace_and_finish_each_frame_within_its_interval() {
        let mut run = results(vec![
            paced(SyncStrategy::CpuSpin, 60, 60.1, 50.0),
            paced(SyncStrategy::CpuSpin, 1_000, 1_000.5, 40.0),
            paced(SyncStrategy::IpcEvent, 1_000, 999.0, 900.0),
            RowResult {
                row: "paced-60-vmm-gpu-poll-s4".into(),
                spec: RowSpec::Paced { backend: BackendKind::Vmm, strategy: SyncStrategy::GpuPoll, slots: 4, fps: 60 },
                outcome: RowOutcome::Unavailable { reason: "no MPS".into() },
            },
        ]);
        let j = paced_latency(&run, "with MPS");
        assert_eq!(j.met, Some(true), "{j:?}");
        assert_eq!(j.measured, "3 of 3 rows (1 unavailable here); lowest p99.9 40.0 us (cpu-spin at 1000 FPS)");
        // Too slow for its pace, and too late for its interval.
        run.rows.push(paced(SyncStrategy::GpuStreamOps, 240, 230.0, 100.0));
        run.rows.push(paced(SyncStrategy::CpuSleep, 1_000, 1_000.0, 1_500.0));
        let j = paced_latency(&run, "with MPS");
        assert_eq!(j.met, Some(false));
        assert!(j.measured.starts_with("3 of 5 rows"), "{}", j.measured);
        assert!(
            j.measured.contains("paced-240-vmm-gpu-stream-ops-s4: ran 230 FPS (0.958x its pace)"),
            "{}",
            j.measured
        );
        assert!(j.measured.contains("paced-1000-vmm-cpu-sleep-s4: p99.9 1500 us > interval 1000 us"), "{}", j.measured);
        assert_eq!(paced_latency(&results(vec![]), "x").met, None);
    }

    #[test]
    fn the_research_measurements_are_judged_on_being_measured_cleanly() {
        assert_eq!(research_measured(&results(vec![]), "without MPS").met, None);
        let mut rows = vec![
            row(RowSpec::Study { design: StudyDesign::MappedZeroCopy }, 400.0, 1.0),
            row(RowSpec::Study { design: StudyDesign::PageableShm16ms }, 30.0, 1.0),
            row(RowSpec::Study { design: StudyDesign::PageableShm }, 130.0, 1.0),
            row(RowSpec::Kernel { kernel: KernelAlone::Fill }, 100_000.0, 1.0),
            row(RowSpec::Kernel { kernel: KernelAlone::Verify }, 80_000.0, 1.0),
        ];
        rows.extend(MemoryTest::ALL.map(|test| row(RowSpec::Memory { test }, 2_000.0, 1.0)));
        rows.extend(
            ImportedCopy::ALL.map(|copy| row(RowSpec::Imported { backend: BackendKind::Vmm, copy }, 50_000.0, 1.0)),
        );
        let mut run = results(rows);
        for r in &mut run.rows {
            if let RowOutcome::Measured(m) = &mut r.outcome {
                m.bandwidth_gb_s = Some(if r.row == "memory-local-within" { 2_500.0 } else { 2_450.0 });
            }
        }
        run.fill_derived();
        let j = research_measured(&run, "without MPS");
        assert_eq!(j.met, Some(true), "{j:?}");
        assert!(j.measured.starts_with("mapped zero-copy 400 FPS; basic design 16 ms sleeps 30.0 FPS, 1 ms 130 FPS; pinned copies host-to-device 49.8 GB/s"), "{}", j.measured);
        assert!(j.measured.contains("fill alone 10.0 us, verify alone 12.5 us"), "{}", j.measured);
        assert!(
            j.measured.contains("copies within an imported buffer 0.980-0.980x the same within a local one"),
            "{}",
            j.measured
        );
        // A row that read wrong data is not measured.
        if let RowOutcome::Measured(m) = &mut run.rows[0].outcome {
            m.mismatches = 1;
        }
        let j = research_measured(&run, "without MPS");
        assert_eq!(j.met, Some(false));
        assert!(j.measured.ends_with("not measured cleanly: study-mapped-zero-copy"), "{}", j.measured);
    }
}
