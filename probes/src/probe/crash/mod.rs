//! `gpu-ipc probe crash`: does shared GPU memory survive the death of the process that exported it, or of one
//! that imported it?
//!
//! Per trial the parent starts an exporter and an importer child (two processes, the backend's own export and
//! import; a VMM fd travels through the parent with `SCM_RIGHTS`), lets one of them die in one of five ways
//! ([`CrashCase`]), and asks the other to check the memory: host read, a kernel launch, every word of the pattern
//! written before the death, a rewrite, and a GPU-side wait on a flag inside the memory. A third child, the
//! observer, reads `cuMemGetInfo` from a context of its own before, during and after the trial (with
//! `nvidia-smi` beside it), which tells when the allocation's memory was given back. Every case runs on every
//! backend, many times; the result is counts per outcome and distributions of times, and a verdict computed from
//! them ([`model::verdict`]).

mod child;
pub mod model;
pub mod protocol;
pub mod render;
mod trial;

use serde::{Deserialize, Serialize};

use gpu_ipc::BackendChoice;

use super::env::ProbeEnv;
use super::progress::Progress;
use super::{CommonArgs, ProbeError, ProbeOutput, Verdict};
use crate::answers::{Plots, ReportSection};

pub use child::child;
pub use model::{CellSummary, CrashCase, TrialRecord};
pub use render::render_text;

/// Repetitions of each case on each backend in a full pass.
pub const FULL_REPETITIONS: u32 = 20;
/// Repetitions in a `--quick` pass.
pub const QUICK_REPETITIONS: u32 = 3;

/// Options of `gpu-ipc probe crash`.
#[derive(Debug, Clone, clap::Args)]
pub struct ProbeArgs {
    #[command(flatten)]
    /// Options every probe takes.
    pub common: CommonArgs,
    /// Repetitions of each case on each backend (default 20, or 3 with --quick).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=1000))]
    pub repetitions: Option<u32>,
    /// Size of the shared allocation, in MiB.
    #[arg(long, value_name = "MIB", default_value_t = 64, value_parser = clap::value_parser!(u64).range(4..=16384))]
    pub mib: u64,
    /// Only this backend (repeatable); default every backend compiled in.
    #[arg(long, value_name = "NAME")]
    pub backend: Vec<String>,
}

/// The settings a run used (recorded in its JSON).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CrashSettings {
    /// Repetitions of each case on each backend.
    pub repetitions: u32,
    /// Bytes asked for per allocation.
    pub allocation_bytes: u64,
    /// Backends run.
    pub backends: Vec<String>,
    /// How long the survivor's hammer kernel runs across the death, in ms.
    pub hammer_ms: u64,
    /// How long after the hammer (or wait) is launched the victim dies, in ms.
    pub kill_after_ms: u64,
    /// Whether `nvidia-smi` answered.
    pub nvidia_smi: bool,
}

/// What the probe measured.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Results {
    /// The settings.
    pub settings: CrashSettings,
    /// Counts and distributions per backend and case (computed from `trials`).
    pub cells: Vec<CellSummary>,
    /// Every trial, as recorded.
    pub trials: Vec<TrialRecord>,
}

impl Results {
    /// Results from recorded trials: the cells are recomputed from them.
    pub fn from_trials(settings: CrashSettings, trials: Vec<TrialRecord>) -> Self {
        Self { settings, cells: model::summarize(&trials), trials }
    }
}

/// Runs the probe; returns the exit status.
pub fn main(args: &ProbeArgs) -> u8 {
    super::execute("crash", &args.common, |env, progress| run(args, env, progress), render_text)
}

fn backends(args: &ProbeArgs) -> Result<Vec<BackendChoice>, ProbeError> {
    if args.backend.is_empty() {
        return Ok(BackendChoice::ALL.to_vec());
    }
    args.backend.iter().map(|name| name.parse().map_err(|e| ProbeError::Other(format!("--backend: {e}")))).collect()
}

fn run(args: &ProbeArgs, env: &ProbeEnv, progress: &Progress) -> Result<(Results, Verdict), ProbeError> {
    let backends = backends(args)?;
    let repetitions = args.repetitions.unwrap_or(if args.common.quick { QUICK_REPETITIONS } else { FULL_REPETITIONS });
    let plan = trial::Plan { device: args.common.device, allocation_bytes: args.mib << 20 };
    let uuid = env.device(plan.device).map(|d| d.uuid.clone());
    let observer = trial::Observer::spawn(plan.device, uuid)?;
    let mut trials = Vec::new();
    for &backend in &backends {
        for case in CrashCase::ALL {
            progress.stage(&format!("{backend}: {}", case.label()), u64::from(repetitions));
            for repetition in 0..repetitions {
                let record = trial::run_trial(&plan, &observer, backend, case, repetition);
                let note = record.failure.as_ref().map_or(String::new(), |f| f.kind.label().to_owned());
                trials.push(record);
                progress.step(&note);
            }
        }
    }
    let settings = CrashSettings {
        repetitions,
        allocation_bytes: plan.allocation_bytes,
        backends: backends.iter().map(|b| b.name().to_owned()).collect(),
        hammer_ms: trial::HAMMER_MS,
        kill_after_ms: trial::KILL_AFTER_MS,
        nvidia_smi: observer.nvidia_smi_answered(),
    };
    observer.quit();
    let results = Results::from_trials(settings, trials);
    let verdict = model::verdict(&results.cells);
    Ok((results, verdict))
}

/// The report's section, from the runs without and with MPS (see [`render::report_section`]).
pub fn report_section(
    no_mps: Option<&ProbeOutput<Results>>,
    mps: Option<&ProbeOutput<Results>>,
    plots: &mut Plots,
) -> ReportSection {
    render::report_section(no_mps, mps, plots)
}
