//! `gpu-ipc bench targets`: the project's performance targets (docs/benchmarks.md, "Targets"), judged from two
//! pipeline runs of the same session (one without MPS, one under MPS), each figure set against the references
//! measured in its own run.
//!
//! Which strategies count as what: the *GPU-side* strategies are those whose waits the GPU does (`gpu-stream-ops`,
//! `gpu-poll`); the *CPU* strategies are `cpu-spin` and `cpu-sleep`. `ipc-event` (the consumer's CPU polls an IPC
//! event, the producer's stream waits on one) is neither and is compared with nothing; it still counts for "best".
//! A row counts only when it was measured and read no wrong word.

use gpu_ipc::core::wire::SyncStrategy;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use clap::Args;
use serde::{Deserialize, Serialize};

use super::results::{Measurement, PipelineResults, RowResult};
use super::rows::{RowSpec, StudyDesign};
use harness::ProbeOutput;

/// With MPS: best of ours over the single-process limit, same run (the project's targets, docs/benchmarks.md).
pub const BEST_MPS_RATIO: f64 = 0.90;
/// Without MPS: best of ours over the seed design (study d), same run.
pub const NO_MPS_OVER_SEED: f64 = 10.0;
/// GPU-side strategies: CPU time per frame per process at full rate, microseconds.
pub const GPU_SIDE_CPU_US: f64 = 5.0;

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
    vec![best_under_mps(mps), gpu_side_at_every_slot_count(mps), no_mps_over_seed(no_mps), gpu_side_cpu(mps)]
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
    use crate::results::RowOutcome;

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
        assert_eq!(table.lines().count(), 6);
        assert!(table.contains("| **no** |"));
        assert!(table.contains("| not measured |"));
    }
}
