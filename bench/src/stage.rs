//! The middle stage of a three-stage row, run in a `gpu-ipc helper` process with role `bench-stage`: a
//! [`Stage`] from the bench process's ring into its own, its work one `gpu_ipc_xor_words` per frame (every bit
//! inverted), on one stream. It moves the row's frames, drains its ring and reports its CPU time; the row's
//! consumer (`bench-consumer`, attached to this stage's ring) measures the latency end to end.

use std::time::Duration;

use gpu_ipc::GpuBackendVisitor;
use gpu_ipc::core::backend::GpuBackend;
use gpu_ipc::core::frames::{ProducerConfig, Stage, StageConfig, StageError, StageStep};

use super::results::ConsumerReport;
use super::rig::{SETUP_TIMEOUT, frame_geometry};
use super::rows::{RowSpec, THREE_STAGE_MASK};
use super::shared::cpu_ns;
use super::tasks::{ConsumerMessage, StagePlan};
use harness::MeasurementError;
use harness::child::Channel;
use harness::gpu::GpuSetup;

/// Runs a `bench-stage` child: moves the row's frames and sends its report (no latencies: the consumer measures
/// them).
///
/// # Errors
/// Anything that stops it; the caller reports it to the parent.
pub fn child(plan: &StagePlan, channel: &Channel) -> Result<(), MeasurementError> {
    let RowSpec::ThreeStage { backend, .. } = plan.spec else {
        return Err(MeasurementError::Missing("a bench-stage child runs a three-stage row"));
    };
    let report = gpu_ipc::dispatch_gpu(backend, MiddleStage { plan }).unwrap_or_else(|e| Err(e.into()))?;
    channel.send(&ConsumerMessage::Report(report), Vec::new())?;
    Ok(())
}

struct MiddleStage<'a> {
    plan: &'a StagePlan,
}

impl GpuBackendVisitor for MiddleStage<'_> {
    type Output = Result<ConsumerReport, MeasurementError>;

    fn visit<B: GpuBackend>(self) -> Self::Output {
        let plan = self.plan;
        let RowSpec::ThreeStage { strategy, slots, .. } = plan.spec else {
            return Err(MeasurementError::Missing("a bench-stage child runs a three-stage row"));
        };
        let gpu = GpuSetup::open(plan.device)?;
        let (ctx, kernels, stream) = (gpu.context(), gpu.kernels(), gpu.stream());
        let geometry = frame_geometry(plan.shape)?;
        let mut config =
            StageConfig::new(&plan.upstream, ProducerConfig::new(&plan.downstream, geometry, slots, strategy));
        config.attach.name = "bench-stage".into();
        config.attach.wait_for_producer = SETUP_TIMEOUT;
        config.consumer_timeout = SETUP_TIMEOUT;
        config.frame_timeout = Duration::from_millis(plan.frame_timeout_ms);
        let mut stage = Stage::<B, B>::start(ctx, ctx, config).map_err(stage_error)?;
        let mut cpu_start = None;
        let mut measured = 0;
        while stage.frames() < plan.frames_total {
            let step = stage
                .process(Some(stream), |io| {
                    Ok(kernels.xor_words(stream, io.output_span()?, io.input_span()?, THREE_STAGE_MASK)?)
                })
                .map_err(stage_error)?;
            match step {
                StageStep::Frame { upstream, .. } => {
                    if upstream == plan.warmup {
                        cpu_start = Some(cpu_ns());
                    }
                    if upstream >= plan.warmup {
                        measured += 1;
                    }
                }
                other => {
                    return Err(MeasurementError::Other(format!(
                        "the bench's ring ended after {} of {} frames ({other:?})",
                        stage.frames(),
                        plan.frames_total
                    )));
                }
            }
        }
        let cpu = cpu_start.map_or(0, |start| cpu_ns().saturating_sub(start));
        let frames = stage.frames();
        stage.finish(Some(stream), Duration::from_millis(plan.frame_timeout_ms)).map_err(stage_error)?;
        Ok(ConsumerReport {
            frames,
            measured_frames: measured,
            cpu_ns: cpu,
            mismatches: 0,
            latencies_ns: Vec::new(),
            missing_stamps: 0,
            gpu_done_ns: Vec::new(),
        })
    }
}

fn stage_error(e: StageError) -> MeasurementError {
    MeasurementError::Other(e.to_string())
}
