//! `gpu-ipc bench targets`: the project's performance targets (docs/benchmarks.md, "Targets"), judged from two
//! pipeline runs on the same machine (one without MPS, one under MPS), each figure set against the references
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

use gpu_ipc::core::wire::{SyncSide, SyncStrategy};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use clap::Args;
use serde::{Deserialize, Serialize};

use super::results::{Measurement, PipelineResults, RowOutcome, RowResult};
use super::rows::{ImportedCopy, KernelAlone, MemoryTest, ResidentShape, RowSpec, StudyDesign};
use super::tables::number;
use harness::MeasurementOutput;

/// With MPS: best of ours over the single-process limit, same run (the project's targets, docs/benchmarks.md).
pub const BEST_MPS_RATIO: f64 = 0.90;
/// Without MPS: best of ours over the seed design (study d), same run.
pub const NO_MPS_OVER_SEED: f64 = 10.0;
/// GPU-side strategies: CPU time per frame per process at full rate, microseconds.
pub const GPU_SIDE_CPU_US: f64 = 5.0;
/// Frame graphs: CPU time per frame per process at full rate, microseconds.
pub const GRAPH_CPU_US: f64 = 4.0;
/// A paced row keeps its pace when its producer's rate is at least this share of it.
pub const PACE_HELD: f64 = 0.99;
/// ipc-event and gpu-stream-ops, one consumer, against the same kernels pipelined in one process through as many
/// buffers as the ring has slots (with MPS).
pub const OVER_PIPELINED: f64 = 0.95;

/// Most slots of a ring in control-block layout 1; deeper rings use layout 2.
const SHALLOW_MAX_SLOTS: u32 = gpu_ipc::core::ring::layout::LAYOUT_1_MAX_SLOTS;

/// The strategies whose waits the GPU does, as the strategy's descriptor says.
fn gpu_side() -> impl Iterator<Item = SyncStrategy> {
    SyncStrategy::ALL.into_iter().filter(|s| s.is_gpu_side())
}

/// The strategies the CPU does everything for (waits and publishes): what a GPU-side one is compared with.
fn cpu_side() -> impl Iterator<Item = SyncStrategy> {
    SyncStrategy::ALL.into_iter().filter(|s| {
        let t = s.traits();
        t.waits == SyncSide::Cpu && t.publishes == SyncSide::Cpu
    })
}

/// Options of `gpu-ipc bench targets`.
#[derive(Debug, Clone, Args)]
pub struct TargetsArgs {
    /// The JSON of `gpu-ipc bench pipeline --json --out FILE` run without MPS.
    #[arg(long, value_name = "FILE")]
    pub no_mps: PathBuf,
    /// The JSON of `gpu-ipc bench pipeline --mps --out FILE` on the same machine.
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

/// The fastest clean row of ours: the frame API driven call by call, on frame graphs, or by persistent kernels on
/// the device-side ring.
fn best_of_ours(results: &PipelineResults) -> Option<(&RowResult, &Measurement)> {
    clean(&results.rows)
        .filter(|(r, _)| matches!(r.spec, RowSpec::Ours { .. } | RowSpec::Graphs { .. } | RowSpec::Resident { .. }))
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
        graph_cpu(mps),
        over_pipelined(mps),
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

/// With MPS: each clean one-consumer ipc-event and gpu-stream-ops row of ours against the in-process pipelined
/// reference with as many buffers as its ring has slots (the references run at 2, 4 and 8 buffers); the words also
/// give that handoff's floor ([`memops_floor`]) and the frame-graph rows against the same references.
fn over_pipelined(mps: &PipelineResults) -> Judged {
    let target = format!(
        "with MPS: ipc-event and gpu-stream-ops >= {OVER_PIPELINED:.2}x the same kernels pipelined in one process \
         through as many buffers as the ring has slots"
    );
    let reference = |want: u32| {
        clean(&mps.rows)
            .find(|(r, _)| r.spec == RowSpec::SingleProcessPipelined { slots: want })
            .map(|(_, m)| m.fps)
            .filter(|fps| *fps > 0.0)
    };
    let pairs: Vec<(String, f64)> = clean(&mps.rows)
        .filter_map(|(r, m)| match r.spec {
            RowSpec::Ours {
                strategy: SyncStrategy::IpcEvent | SyncStrategy::GpuStreamOps,
                slots,
                consumers: 1,
                ..
            } => reference(slots).map(|limit| (r.row.clone(), m.fps / limit)),
            _ => None,
        })
        .collect();
    if pairs.is_empty() {
        return Judged {
            target,
            measured: "no one-consumer ipc-event or gpu-stream-ops row at a slot count with a pipelined reference \
                       (2, 4 or 8 slots) in the MPS run"
                .into(),
            met: None,
        };
    }
    let (worst, best) = range(pairs.iter().map(|(_, ratio)| *ratio));
    let below: Vec<&str> =
        pairs.iter().filter(|(_, ratio)| *ratio < OVER_PIPELINED).map(|(row, _)| row.as_str()).collect();
    let mut measured = format!(
        "{:.2}x-{:.2}x over {} rows{}",
        worst,
        best,
        pairs.len(),
        if below.is_empty() { String::new() } else { format!("; below: {}", below.join(", ")) }
    );
    if let Some(floor) = memops_floor(mps, &reference) {
        let _ = write!(measured, "; {floor}");
    }
    let graphs: Vec<f64> = clean(&mps.rows)
        .filter_map(|(r, m)| match r.spec {
            RowSpec::Graphs { slots, .. } => Some(m.fps / reference(slots)?),
            _ => None,
        })
        .collect();
    if !graphs.is_empty() {
        let (lo, hi) = range(graphs.iter().copied());
        let _ = write!(measured, "; the same rings on frame graphs: {lo:.2}x-{hi:.2}x");
    }
    let resident: Vec<f64> = clean(&mps.rows)
        .filter_map(|(r, m)| match r.spec {
            RowSpec::Resident { slots, shape: ResidentShape::Grid, .. } => Some(m.fps / reference(slots)?),
            _ => None,
        })
        .collect();
    if !resident.is_empty() {
        let (lo, hi) = range(resident.iter().copied());
        let _ = write!(measured, "; persistent kernels on the device-side ring: {lo:.2}x-{hi:.2}x");
    }
    Judged { target, measured, met: Some(below.is_empty()) }
}

/// The handoff's own floor, measured in the same run: the same kernels in one process handed over by stream memory
/// operations (`single-process-memops-sN`) against the event-handed reference at the same depth, and each clean
/// one-consumer gpu-stream-ops row against that floor.
fn memops_floor(mps: &PipelineResults, events: &dyn Fn(u32) -> Option<f64>) -> Option<String> {
    let memops = |want: u32| {
        clean(&mps.rows)
            .find(|(r, _)| r.spec == RowSpec::SingleProcessMemOps { slots: want })
            .map(|(_, m)| m.fps)
            .filter(|fps| *fps > 0.0)
    };
    let floors: Vec<f64> = clean(&mps.rows)
        .filter_map(|(r, _)| match r.spec {
            RowSpec::SingleProcessMemOps { slots } => Some(memops(slots)? / events(slots)?),
            _ => None,
        })
        .collect();
    if floors.is_empty() {
        return None;
    }
    let over_floor: Vec<f64> = clean(&mps.rows)
        .filter_map(|(r, m)| match r.spec {
            RowSpec::Ours { strategy: SyncStrategy::GpuStreamOps, slots, consumers: 1, .. } => {
                Some(m.fps / memops(slots)?)
            }
            _ => None,
        })
        .collect();
    let (lo, hi) = range(floors.into_iter());
    let mut words = format!(
        "the same kernels in one process handed over by stream memory operations instead of events reach \
         {lo:.2}x-{hi:.2}x the reference (that handoff's floor, same run)"
    );
    if !over_floor.is_empty() {
        let (lo, hi) = range(over_floor.into_iter());
        let _ = write!(words, "; gpu-stream-ops is {lo:.2}x-{hi:.2}x that floor");
    }
    Some(words)
}

/// With MPS: the frame-graph rows' CPU time per frame, producer and consumer, each at most [`GRAPH_CPU_US`].
fn graph_cpu(mps: &PipelineResults) -> Judged {
    let target = format!(
        "frame graphs: at most {GRAPH_CPU_US:.0} us of CPU per frame for the producer and the consumer (MPS, full rate)"
    );
    let rows: Vec<(&RowResult, &Measurement)> =
        clean(&mps.rows).filter(|(r, _)| matches!(r.spec, RowSpec::Graphs { .. })).collect();
    let failed: Vec<&str> = mps
        .rows
        .iter()
        .filter(|r| matches!(r.spec, RowSpec::Graphs { .. }))
        .filter(|r| !rows.iter().any(|(clean, _)| clean.row == r.row))
        .map(|r| r.row.as_str())
        .collect();
    if rows.is_empty() {
        let measured = if failed.is_empty() {
            "no frame-graph row in the MPS run".to_owned()
        } else {
            format!("no clean frame-graph row (not clean: {})", failed.join(", "))
        };
        return Judged { target, measured, met: None };
    }
    let producer = range(rows.iter().map(|(_, m)| m.producer_cpu_us_per_frame));
    let consumer = range(rows.iter().flat_map(|(_, m)| m.consumer_cpu_us_per_frame.iter().copied()));
    let fps = range(rows.iter().map(|(_, m)| m.fps));
    let mut measured = format!(
        "producer {:.1}-{:.1} us, consumer {:.1}-{:.1} us over {} rows ({}-{} FPS)",
        producer.0,
        producer.1,
        consumer.0,
        consumer.1,
        rows.len(),
        number(fps.0),
        number(fps.1)
    );
    if !failed.is_empty() {
        let _ = write!(measured, "; not clean: {}", failed.join(", "));
    }
    let met = producer.1 <= GRAPH_CPU_US && consumer.1 <= GRAPH_CPU_US && failed.is_empty();
    Judged { target, measured, met: Some(met) }
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
    for strategy in gpu_side() {
        let (mut won, mut compared) = (0, 0);
        let mut worst: Option<(f64, String)> = None;
        for &(backend, consumers, slots) in &cells {
            let Some(gpu) = fps_of(backend, strategy, slots, consumers) else { continue };
            let Some(cpu) = cpu_side().filter_map(|s| fps_of(backend, s, slots, consumers)).reduce(f64::max) else {
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
            measured: format!(
                "{:.1}x ({}: {:.0} FPS; seed {seed:.0} FPS); {}",
                m.fps / seed,
                row.row,
                m.fps,
                best_by_depth(no_mps, seed)
            ),
            met: Some(m.fps / seed >= NO_MPS_OVER_SEED),
        },
        _ => Judged { target, measured: "no clean row of ours, or no seed row".into(), met: None },
    }
}

/// The best clean row of ours up to 32 slots (control-block layout 1) and above (layout 2), each over the seed: where
/// the figure came from, and whether the deeper rings were measured at all.
fn best_by_depth(results: &PipelineResults, seed: f64) -> String {
    let best = |deep: bool| {
        clean(&results.rows)
            .filter(|(r, _)| matches!(r.spec, RowSpec::Ours { slots, .. } if (slots > SHALLOW_MAX_SLOTS) == deep))
            .max_by(|a, b| a.1.fps.total_cmp(&b.1.fps))
            .map_or_else(|| "not measured".to_owned(), |(r, m)| format!("{:.1}x ({})", m.fps / seed, r.row))
    };
    format!("best at 1-{SHALLOW_MAX_SLOTS} slots {}, above {SHALLOW_MAX_SLOTS} slots {}", best(false), best(true))
}

fn gpu_side_cpu(mps: &PipelineResults) -> Judged {
    let target =
        format!("GPU-side strategies: at most {GPU_SIDE_CPU_US:.0} us of CPU per frame per process (MPS, full rate)");
    let mut words = Vec::new();
    let mut all_met = true;
    let mut any = false;
    for strategy in gpu_side() {
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

/// Why a run given to `gpu-ipc bench targets` could not be judged: each names the file and what to give instead.
#[derive(Debug, thiserror::Error)]
pub enum TargetsError {
    /// The file could not be read.
    #[error("{}: {source}", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// The file is not a `gpu-ipc bench pipeline --json` document.
    #[error("{}: not a bench pipeline JSON: {source}", path.display())]
    NotPipelineJson {
        /// The file.
        path: PathBuf,
        /// The decoding error.
        source: serde_json::Error,
    },
    /// The file is another measurement's document.
    #[error("{}: the JSON of probe '{found}', not of bench-pipeline", path.display())]
    OtherMeasurement {
        /// The file.
        path: PathBuf,
        /// What it measured.
        found: String,
    },
    /// The run was (or was not) under MPS, and was given as the other one.
    #[error(
        "{}: that run was {} MPS, but it was given as the run {} MPS",
        path.display(),
        if *was_mps { "under" } else { "without" },
        if *was_mps { "without" } else { "under" }
    )]
    WrongMps {
        /// The file.
        path: PathBuf,
        /// Whether the run was under MPS.
        was_mps: bool,
    },
}

fn load(path: &Path, want_mps: bool) -> Result<PipelineResults, TargetsError> {
    let text = std::fs::read_to_string(path).map_err(|source| TargetsError::Read { path: path.to_owned(), source })?;
    let output: MeasurementOutput<PipelineResults> = serde_json::from_str(&text)
        .map_err(|source| TargetsError::NotPipelineJson { path: path.to_owned(), source })?;
    if output.probe != "bench-pipeline" {
        return Err(TargetsError::OtherMeasurement { path: path.to_owned(), found: output.probe });
    }
    if output.env.mps != want_mps {
        return Err(TargetsError::WrongMps { path: path.to_owned(), was_mps: output.env.mps });
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
mod tests;
