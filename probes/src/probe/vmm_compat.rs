//! `gpu-ipc probe vmm-compat` (being built: see issue 7).

use serde::{Deserialize, Serialize};

use super::channel::{Channel, ChildTask};
use super::env::ProbeEnv;
use super::progress::Progress;
use super::{CommonArgs, ProbeError, ProbeOutput, Verdict};
use crate::answers::{Plots, ReportSection};

/// Options of `gpu-ipc probe vmm-compat`.
#[derive(Debug, Clone, clap::Args)]
pub struct ProbeArgs {
    #[command(flatten)]
    /// Options every probe takes.
    pub common: CommonArgs,
}

/// What the probe measured.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Results {}

/// Runs the probe; returns the exit status.
pub fn main(args: &ProbeArgs) -> u8 {
    super::execute("vmm-compat", &args.common, |env, progress| run(args, env, progress), render_text)
}

fn run(_args: &ProbeArgs, _env: &ProbeEnv, _progress: &Progress) -> Result<(Results, Verdict), ProbeError> {
    Err(ProbeError::Other("not built yet".to_owned()))
}

/// The child process's side.
pub fn child(_task: ChildTask, _channel: &Channel) -> Result<(), ProbeError> {
    Err(ProbeError::Other("not built yet".to_owned()))
}

/// The result as text.
pub fn render_text(output: &ProbeOutput<Results>) -> String {
    format!("{}\n", output.verdict.answer)
}

/// The report's section, from the runs without and with MPS.
pub fn report_section(
    _no_mps: Option<&ProbeOutput<Results>>,
    _mps: Option<&ProbeOutput<Results>>,
    _plots: &mut Plots,
) -> ReportSection {
    ReportSection::missing("vmm-compat")
}
