//! `gpu-ipc probe vmm-compat`: what can be shared how? A matrix of allocation kinds (`cuMemAlloc`, pools,
//! `cuMemCreate` with each handle type, small allocations, pinned host, managed) against sharing operations
//! (legacy IPC, POSIX-fd and fabric export and import, pool export, IPC events), each cell a CUDA result code and
//! a verdict, with exporter and importer in two processes and a same-process control; and whether the pointer
//! and device attributes predict every cell, and the backends' capability checks agree.
//!
//! [`verdict`] and [`render`] are pure functions of the recorded [`Results`], tested without a GPU.

pub mod importer;
pub mod matrix;
pub mod model;
pub mod render;
pub mod verdict;

use super::channel::{Channel, ChildTask};
use super::env::ProbeEnv;
use super::progress::Progress;
use super::{CommonArgs, ProbeError, Verdict};
use gpu_ipc::core::driver::Context;

use super::ProbeOutput;
use crate::answers::{Plots, ReportSection};
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
    super::execute("vmm-compat", &args.common, |env, progress| run(args, env, progress), render_text)
}

fn run(args: &ProbeArgs, _env: &ProbeEnv, progress: &Progress) -> Result<(Results, Verdict), ProbeError> {
    let ctx = Context::for_ordinal(args.common.device)?;
    let results = matrix::run_matrix(&ctx, args.common.device, progress, true);
    let verdict = verdict::verdict(&results);
    Ok((results, verdict))
}

/// The child process's side (role `compat-importer`).
///
/// # Errors
/// An unknown role, or the importer's failure.
pub fn child(task: ChildTask, channel: &Channel) -> Result<(), ProbeError> {
    match task.role.as_str() {
        "compat-importer" => importer::child(task, channel),
        role => Err(ProbeError::Other(format!("unknown vmm-compat child role {role:?}"))),
    }
}

/// The report's section, from the runs without and with MPS.
pub fn report_section(
    no_mps: Option<&ProbeOutput<Results>>,
    mps: Option<&ProbeOutput<Results>>,
    plots: &mut Plots,
) -> ReportSection {
    render::report_section(no_mps, mps, plots)
}
