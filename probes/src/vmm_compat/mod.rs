//! `gpu-ipc probe vmm-compat`: what can be shared how? A matrix of allocation kinds (`cuMemAlloc`, pools,
//! `cuMemCreate` with each handle type, small allocations, pinned host, managed) against sharing operations
//! (legacy IPC, POSIX-fd and fabric export and import, pool export, IPC events), each cell a CUDA result code and
//! a verdict, with exporter and importer in two processes and a same-process control; and whether the pointer
//! and device attributes predict every cell, and the backends' capability checks agree.
//!
//! [`verdict`] and [`render`] are pure functions of the recorded [`Results`], tested without a GPU.

pub mod importer;
pub mod judge;
pub mod matrix;
pub mod model;
pub mod render;
pub mod verdict;

use gpu_ipc::driver::Context;
use harness::child::{Channel, ChildTask};
use harness::env::MeasurementEnv;
use harness::progress::Progress;
use harness::{CommonArgs, MeasurementError, Verdict};

use harness::MeasurementOutput;
use harness::report::{Plots, ReportSection};
pub use model::Results;
pub use render::render_text;

/// Options of `gpu-ipc probe vmm-compat`.
#[derive(Debug, Clone, clap::Args)]
pub struct ProbeArgs {
    #[command(flatten)]
    /// Options every probe takes.
    pub common: CommonArgs,
}

/// Runs the probe; returns the exit status.
pub fn main(args: &ProbeArgs) -> u8 {
    harness::execute("vmm-compat", &args.common, |env, progress| run(args, env, progress), render_text)
}

fn run(args: &ProbeArgs, _env: &MeasurementEnv, progress: &Progress) -> Result<(Results, Verdict), MeasurementError> {
    let ctx = Context::for_ordinal(args.common.device)?;
    let results = matrix::run_matrix(&ctx, args.common.device, progress, true);
    let verdict = verdict::verdict(&results);
    Ok((results, verdict))
}

/// The child process's side (its one role, [`importer::CompatTask`]).
///
/// # Errors
/// A task that is not the importer's, or the importer's failure.
pub fn child(task: ChildTask, channel: &Channel) -> Result<(), MeasurementError> {
    importer::child(task, channel)
}

/// The report's section, from the runs without and with MPS.
pub fn report_section(
    no_mps: Option<&MeasurementOutput<Results>>,
    mps: Option<&MeasurementOutput<Results>>,
    plots: &mut Plots,
) -> ReportSection {
    render::report_section(no_mps, mps, plots)
}

/// The vmm-compat probe, as [`crate::PROBES`] lists it.
#[derive(Debug, Clone, Copy)]
pub struct VmmCompat;

crate::probe::impl_probe!(VmmCompat {
    name: "vmm-compat",
    title: "What can be shared how",
    question: "What can be shared how: legacy IPC and VMM handles against every kind of allocation?",
    args: ProbeArgs,
    main: main,
    child: child,
    results: Results,
    section: report_section,
});

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests;
