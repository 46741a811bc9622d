//! `gpu-ipc probe crash`: does shared GPU memory survive the death of the process that exported it, or of one
//! that imported it?
//!
//! Per trial the parent starts an exporter and an importer child (two processes, the backend's own export and
//! import; a VMM fd travels through the parent with `SCM_RIGHTS`), lets one of them die in one of five ways
//! ([`CrashCase`]), and asks the other to check the memory: host read, a kernel launch, every word of the pattern
//! written before the death, a rewrite, and a GPU-side wait on a flag inside the memory. A third child, the
//! observer, reads `cuMemGetInfo` from a context of its own before, during and after the trial (with
//! `nvidia-smi` at the key points), which tells when the allocation's memory was given back. Every case runs on
//! every backend, many times; the result is counts per outcome and distributions of times, and a verdict computed
//! from them ([`summary::verdict`]).
//!
//! Under MPS every client shares one server, and a death can fault the server: every client connected at that
//! moment (the observer too, which never touches the shared memory) loses its context with a sticky error. Such a
//! trial is recorded as an MPS server fault ([`model::FailureKind::MpsServerFault`]), not as a failure of the next
//! trial. The plan ([`schedule`]) therefore runs the gentle cases first, both backends interleaved, and the cases
//! that kill a victim whose own kernel runs on the memory last; after a fault the probe starts a fresh observer
//! (a new client: does the server take clients again?), does not repeat a case that faulted, and marks what it did
//! not run, with the reason, when no client can start any more or `--max-seconds` is reached.

mod child;
pub mod model;
pub mod protocol;
pub mod render;
pub mod summary;
mod trial;

use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use gpu_ipc::BackendKind;

use harness::env::MeasurementEnv;
use harness::progress::Progress;
use harness::report::{Plots, ReportSection};
use harness::{CommonArgs, MeasurementError, MeasurementOutput, Verdict};

pub use child::child;
pub use model::{CrashCase, TrialRecord};
pub use render::render_text;
pub use summary::CellSummary;

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
    pub backend: Vec<BackendKind>,
    /// Start no new trial after this many seconds; the trials left are reported as not run.
    #[arg(long, value_name = "S", value_parser = clap::value_parser!(u64).range(1..))]
    pub max_seconds: Option<u64>,
}

/// The settings a run used (recorded in its JSON).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CrashSettings {
    /// Repetitions of each case on each backend.
    pub repetitions: u32,
    /// Bytes asked for per allocation.
    pub allocation_bytes: u64,
    /// Backends run.
    pub backends: Vec<BackendKind>,
    /// How long the survivor's hammer kernel runs across the death, in ms.
    pub hammer_ms: u64,
    /// How long after the hammer (or wait) is launched the victim dies, in ms.
    pub kill_after_ms: u64,
    /// Whether `nvidia-smi` answered.
    pub nvidia_smi: bool,
    /// The `--max-seconds` bound, if one was given.
    #[serde(default)]
    pub max_seconds: Option<u64>,
}

/// What the probe measured.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Results {
    /// The settings.
    pub settings: CrashSettings,
    /// Counts and distributions per backend and case (computed from `trials`).
    pub cells: Vec<CellSummary>,
    /// Every trial of the plan, in the order run (not-run trials included, as such).
    pub trials: Vec<TrialRecord>,
    /// Why the pass stopped starting trials before the end of its plan; `None` when every trial was started.
    #[serde(default)]
    pub stopped: Option<String>,
}

impl Results {
    /// Results from recorded trials: the cells are recomputed from them.
    pub fn from_trials(settings: CrashSettings, trials: Vec<TrialRecord>, stopped: Option<String>) -> Self {
        Self { settings, cells: summary::summarize(&trials), trials, stopped }
    }

    /// The results as the current probe reads them: trials recorded by an older probe that had no fault outcome
    /// are reinterpreted ([`model::reinterpret_recorded`]) and the cells recomputed.
    pub fn normalized(&self, mps: bool) -> Self {
        let mut trials = self.trials.clone();
        model::reinterpret_recorded(&mut trials, mps);
        if trials == self.trials {
            return self.clone();
        }
        let stopped = self.stopped.clone().or_else(|| {
            trials.iter().filter(|t| !t.started()).find_map(|t| t.failure.as_ref().map(|f| f.detail.clone()))
        });
        Self::from_trials(self.settings.clone(), trials, stopped)
    }

    /// The verdict on these results (`mps`: whether they were measured under MPS).
    pub fn verdict(&self, mps: bool) -> Verdict {
        summary::verdict(&self.cells, mps, self.stopped.as_deref())
    }
}

/// The order of a pass: repetition by repetition, every case that does not kill a victim while its own kernel
/// runs on the shared memory, each on every backend in turn; then, last, the cases that do (under MPS they can
/// fault the server for every client), again interleaved by backend.
pub fn schedule<B: Copy>(backends: &[B], repetitions: u32) -> Vec<(B, CrashCase, u32)> {
    let mut plan = Vec::new();
    for destructive in [false, true] {
        for repetition in 0..repetitions {
            for case in CrashCase::ALL.into_iter().filter(|c| c.kills_running_victim_kernel() == destructive) {
                for &backend in backends {
                    plan.push((backend, case, repetition));
                }
            }
        }
    }
    plan
}

/// Runs the probe; returns the exit status.
pub fn main(args: &ProbeArgs) -> u8 {
    harness::execute("crash", &args.common, |env, progress| run(args, env, progress), render_text)
}

fn backends(args: &ProbeArgs) -> Result<Vec<BackendKind>, MeasurementError> {
    if args.backend.is_empty() {
        return Ok(gpu_ipc::COMPILED_GPU.to_vec());
    }
    match args.backend.iter().find(|backend| !gpu_ipc::COMPILED_GPU.contains(backend)) {
        Some(backend) => {
            Err(MeasurementError::Unavailable(format!("the {backend} backend is not a GPU backend of this build")))
        }
        None => Ok(args.backend.clone()),
    }
}

fn run(args: &ProbeArgs, env: &MeasurementEnv, progress: &Progress) -> Result<(Results, Verdict), MeasurementError> {
    let backends = backends(args)?;
    let repetitions = args.repetitions.unwrap_or(if args.common.quick { QUICK_REPETITIONS } else { FULL_REPETITIONS });
    let plan = trial::Plan { device: args.common.device, allocation_bytes: args.mib << 20, mps: env.mps };
    let uuid = env.device(plan.device).map(|d| d.uuid.clone());
    let mut observer = Some(trial::Observer::spawn(plan.device, uuid.clone())?);
    let mut smi_answered = false;
    let schedule = schedule(&backends, repetitions);
    let started = Instant::now();
    let mut stopped: Option<String> = None;
    // Cells whose death faulted the server: not repeated (each repetition would break every client again).
    let mut faulted: Vec<(BackendKind, CrashCase, String)> = Vec::new();
    let mut trials = Vec::new();
    let destructive_from = schedule.iter().position(|(_, c, _)| c.kills_running_victim_kernel());
    for (i, &(backend, case, repetition)) in schedule.iter().enumerate() {
        if i == 0 || Some(i) == destructive_from {
            let left = schedule.len() - i;
            let stage = if Some(i) == destructive_from {
                "kills during the victim's own kernel (last: they can break an MPS server)"
            } else {
                "crash cases, backends interleaved"
            };
            progress.stage(stage, destructive_from.filter(|&d| d > i).map_or(left, |d| d - i) as u64);
        }
        if stopped.is_none()
            && let Some(max) = args.max_seconds
            && started.elapsed() >= Duration::from_secs(max)
        {
            stopped = Some(format!("--max-seconds {max} reached after {i} of {} trials", schedule.len()));
        }
        let skip = stopped
            .clone()
            .or_else(|| faulted.iter().find(|(b, c, _)| *b == backend && *c == case).map(|(_, _, why)| why.clone()));
        let Some(current) = observer.as_ref().filter(|_| skip.is_none()) else {
            let reason = skip.unwrap_or_else(|| "no observer".to_owned());
            trials.push(TrialRecord::not_run(backend, case, repetition, &reason));
            progress.step("not run");
            continue;
        };
        let record = trial::run_trial(&plan, current, backend, case, repetition);
        let note = record.failure.as_ref().map_or(String::new(), |f| f.kind.label().to_owned());
        let fault = record.faulted();
        let observer_lost = fault || (record.failure.is_some() && !current.healthy());
        trials.push(record);
        progress.step(&note);
        if fault {
            let name = if plan.mps { "the MPS server" } else { "a process that was never killed" };
            faulted.push((
                backend,
                case,
                format!("not repeated: its first trial ({backend}, repetition {repetition}) faulted {name}"),
            ));
        }
        if observer_lost {
            smi_answered |= current.nvidia_smi_answered();
            // Dropping the old observer kills it (its context is gone or it does not answer).
            drop(observer.take());
            // A new client: the server (or driver) takes clients again, or nothing more can run.
            match respawn_observer(plan.device, uuid.as_deref()) {
                Ok(fresh) => observer = Some(fresh),
                Err(e) => {
                    let after = if fault {
                        format!("the fault of {backend} {}", case.label())
                    } else {
                        "a failed trial".into()
                    };
                    stopped = Some(format!("after {after}, a new CUDA client (the observer) could not start: {e}"));
                }
            }
        }
    }
    if let Some(observer) = observer {
        smi_answered |= observer.nvidia_smi_answered();
        observer.quit();
    }
    let settings = CrashSettings {
        repetitions,
        allocation_bytes: plan.allocation_bytes,
        backends: backends.clone(),
        hammer_ms: trial::HAMMER_MS,
        kill_after_ms: trial::KILL_AFTER_MS,
        nvidia_smi: smi_answered,
        max_seconds: args.max_seconds,
    };
    let results = Results::from_trials(settings, trials, stopped);
    let verdict = results.verdict(env.mps);
    Ok((results, verdict))
}

/// The report's section, from the runs without and with MPS (see [`render::report_section`]).
pub fn report_section(
    no_mps: Option<&MeasurementOutput<Results>>,
    mps: Option<&MeasurementOutput<Results>>,
    plots: &mut Plots,
) -> ReportSection {
    render::report_section(no_mps, mps, plots)
}

/// Starts a new observer after the old one lost its context: a few tries, since a server that is still tearing
/// down its clients after a fault may refuse a new one for a moment.
fn respawn_observer(device: i32, uuid: Option<&str>) -> Result<trial::Observer, MeasurementError> {
    let mut last = None;
    for attempt in 0..3 {
        if attempt > 0 {
            std::thread::sleep(Duration::from_millis(500));
        }
        match trial::Observer::spawn(device, uuid.map(str::to_owned)) {
            Ok(observer) => return Ok(observer),
            Err(e) => last = Some(e),
        }
    }
    Err(last.unwrap_or_else(|| MeasurementError::Missing("the observer did not start")))
}

/// The crash probe, as [`crate::PROBES`] lists it.
#[derive(Debug, Clone, Copy)]
pub struct Crash;

crate::probe::impl_probe!(Crash {
    name: "crash",
    title: "Surviving a crash",
    question: "Does shared memory survive the death of the process that exported it, or of one that imported it?",
    args: ProbeArgs,
    main: main,
    child: child,
    results: Results,
    section: report_section,
});

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_plan_interleaves_backends_and_runs_kills_during_a_victim_kernel_last() {
        let plan = schedule(&["legacy", "vmm"], 2);
        assert_eq!(plan.len(), 20);
        assert_eq!(
            plan[..4],
            [
                ("legacy", CrashCase::ExporterExit, 0),
                ("vmm", CrashCase::ExporterExit, 0),
                ("legacy", CrashCase::ExporterKill, 0),
                ("vmm", CrashCase::ExporterKill, 0)
            ]
        );
        assert_eq!(plan[8], ("legacy", CrashCase::ExporterExit, 1));
        assert!(plan[..16].iter().all(|(_, c, _)| !c.kills_running_victim_kernel()));
        assert_eq!(
            plan[16..],
            [
                ("legacy", CrashCase::ImporterKillDuringGpuWait, 0),
                ("vmm", CrashCase::ImporterKillDuringGpuWait, 0),
                ("legacy", CrashCase::ImporterKillDuringGpuWait, 1),
                ("vmm", CrashCase::ImporterKillDuringGpuWait, 1)
            ]
        );
    }
}
