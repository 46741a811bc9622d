//! Runs one row: the one place that knows which file plays which kind of row ([`run_row`]). The references are in
//! [`super::references`], ours in [`super::ours`], the study's designs in [`super::study`], the memory benchmarks
//! and the kernels alone in [`super::memory`], the frame-graph rows in [`super::graphs`], the resident rows in [`super::resident`]; what they all stand on in
//! [`super::rig`]. The helper processes' side is [`mod@super::child`].

use harness::MeasurementError;
use harness::gpu::GpuSetup;

use super::references::{bandwidth, single_process, single_process_memops, single_process_pipelined};
use super::results::RowOutcome;
use super::rig::{RunConfig, wait_stream};
use super::rows::RowSpec;

/// Runs one row; a failure (including a hang cut short by a bound) is its outcome, not an error.
pub fn run_row(gpu: &GpuSetup, cfg: &RunConfig, spec: RowSpec) -> RowOutcome {
    let cfg = &cfg.for_row(spec);
    let result = match spec {
        RowSpec::SingleProcess => single_process(gpu, cfg),
        RowSpec::SingleProcessPipelined { slots } => single_process_pipelined(gpu, cfg, slots),
        RowSpec::SingleProcessMemOps { slots } => single_process_memops(gpu, cfg, slots),
        RowSpec::Bandwidth => bandwidth(gpu, cfg),
        RowSpec::Study { design } => super::study::study(gpu, cfg, spec, design),
        RowSpec::Ours { .. } | RowSpec::ThreeStage { .. } | RowSpec::Paced { .. } => super::ours::row(gpu, cfg, spec),
        RowSpec::Memory { test } => super::memory::memory(gpu, cfg, test),
        RowSpec::Imported { backend, copy } => super::memory::imported(gpu, cfg, backend, copy),
        RowSpec::Kernel { kernel } => super::memory::kernel_alone(gpu, cfg, kernel),
        RowSpec::Graphs { backend, strategy, slots, waits } => {
            super::graphs::row(gpu, cfg, spec, backend, strategy, slots, waits)
        }
        RowSpec::Resident { backend, slots, shape } => super::resident::row(gpu, cfg, spec, backend, slots, shape),
    };
    // Leave nothing of a failed row queued for the next one.
    if let Err(e) = wait_stream(gpu.context(), gpu.stream(), cfg.frame_timeout) {
        tracing::warn!(%e, "the bench stream did not drain after a row");
    }
    match result {
        Ok(m) => RowOutcome::Measured(m),
        Err(MeasurementError::Unavailable(reason)) => RowOutcome::Unavailable { reason },
        Err(e) => RowOutcome::Failed { reason: e.to_string() },
    }
}
