//! Our rows through the real `Producer` API, in the bench process: unpaced, paced at a frame rate, or the first
//! stage of a three-stage row; their consumers are `bench-consumer` helpers ([`super::consumer`]), a three-stage
//! row's middle stage a `bench-stage` helper ([`super::stage`]).

use std::path::PathBuf;
use std::time::{Duration, Instant};

use gpu_ipc::GpuBackendVisitor;
use gpu_ipc::core::backend::GpuBackend;
use gpu_ipc::core::frames::{Producer, ProducerConfig};
use gpu_ipc::core::wire::SyncStrategy;
use gpu_ipc::driver::Stream;
use harness::MeasurementError;
use harness::child::{ChildProcess, ChildTask};
use harness::gpu::GpuSetup;

use super::paced::{PaceSchedule, paced_note, sleep_until};
use super::results::Measurement;
use super::rig::{
    RunConfig, base_plan, check_deadline, collect_reports, failed_row, frame_error, frame_geometry, frame_timeout_ms,
    measurement, socket_path, spawn_consumers, wait_for_consumers, wait_stream,
};
use super::rows::{RowSpec, THREE_STAGE_MASK};
use super::shared::{PublishStamps, cpu_ns, monotonic_ns};
use super::tasks::{BenchTask, ConsumerPlan, Setup, StagePlan};

/// Runs one of our rows (`spec` is [`RowSpec::Ours`], [`RowSpec::ThreeStage`] or [`RowSpec::Paced`]).
///
/// # Errors
/// Anything that stops the row; another kind of row is [`MeasurementError::Missing`].
pub(crate) fn row(gpu: &GpuSetup, cfg: &RunConfig, spec: RowSpec) -> Result<Measurement, MeasurementError> {
    let ours = match spec {
        RowSpec::Ours { backend, strategy, slots, consumers } => {
            (backend, OursProducer { gpu, cfg, spec, strategy, slots, consumers, three_stage: false, pace: None })
        }
        RowSpec::ThreeStage { backend, strategy, slots } => {
            (backend, OursProducer { gpu, cfg, spec, strategy, slots, consumers: 1, three_stage: true, pace: None })
        }
        RowSpec::Paced { backend, strategy, slots, fps } => {
            let pace = Some(fps);
            (backend, OursProducer { gpu, cfg, spec, strategy, slots, consumers: 1, three_stage: false, pace })
        }
        _ => return Err(MeasurementError::Missing("ours::row runs our rows only (ours, three-stage, paced)")),
    };
    let (backend, producer) = ours;
    gpu_ipc::dispatch_gpu(backend, producer).unwrap_or_else(|e| Err(e.into()))
}

/// Our rows: a `Producer` here, `consumers` `Consumer` processes; or, for a three-stage row, a `bench-stage`
/// process attached to our ring and one `Consumer` process attached to the stage's.
struct OursProducer<'a> {
    gpu: &'a GpuSetup,
    cfg: &'a RunConfig,
    spec: RowSpec,
    strategy: SyncStrategy,
    slots: u32,
    consumers: u32,
    three_stage: bool,
    /// Frames per second of a paced row.
    pace: Option<u32>,
}

impl OursProducer<'_> {
    /// The row's child processes: the consumers; or the middle stage, then the consumer of its ring (the first
    /// child is the one attached to our ring).
    fn spawn_children(&self, socket: PathBuf, stamps: &PublishStamps) -> Result<Vec<ChildProcess>, MeasurementError> {
        let setup = Setup { handle: None };
        if !self.three_stage {
            let plan = base_plan(self.cfg, self.spec, Some(socket));
            return spawn_consumers(&plan, self.consumers, stamps, &setup, &|| Ok(Vec::new()));
        }
        let downstream = socket_path();
        let stage = StagePlan {
            spec: self.spec,
            device: self.cfg.device,
            shape: self.cfg.shape,
            upstream: socket,
            downstream: downstream.clone(),
            frames_total: self.cfg.total(),
            warmup: self.cfg.warmup,
            frame_timeout_ms: frame_timeout_ms(self.cfg),
        };
        let task = ChildTask::of(&BenchTask::Stage(stage))
            .map_err(|source| MeasurementError::Malformed { what: "bench task".to_owned(), source })?;
        let mut children = vec![ChildProcess::spawn(&task, &[], Duration::from_secs(30))?];
        let plan =
            ConsumerPlan { expect_xor: Some(THREE_STAGE_MASK), ..base_plan(self.cfg, self.spec, Some(downstream)) };
        children.extend(spawn_consumers(&plan, 1, stamps, &setup, &|| Ok(Vec::new()))?);
        Ok(children)
    }
}

impl GpuBackendVisitor for OursProducer<'_> {
    type Output = Result<Measurement, MeasurementError>;

    fn visit<B: GpuBackend>(self) -> Self::Output {
        let (gpu, cfg) = (self.gpu, self.cfg);
        let deadline = Instant::now() + cfg.row_timeout;
        let geometry = frame_geometry(cfg.shape)?;
        let socket = socket_path();
        let config = ProducerConfig::new(&socket, geometry, self.slots, self.strategy);
        // A stream of the row's own: a row that fails with GPU waits still queued cannot stall the next one.
        let stream = Stream::new(gpu.context())?;
        let mut producer = Producer::<B>::create(gpu.context(), config).map_err(frame_error)?;
        let stamps = PublishStamps::create()?;
        let mut children = self.spawn_children(socket, &stamps)?;
        let mut schedule = None;
        let produced = (|| -> Result<(f64, u64), MeasurementError> {
            wait_for_consumers(&mut producer, self.consumers as usize, &children)?;
            let (mut t0, mut cpu0) = (Instant::now(), cpu_ns());
            schedule = self.pace.map(|fps| PaceSchedule::new(fps, Instant::now()));
            for seq in 0..cfg.total() {
                check_deadline(deadline, cfg, seq)?;
                if let Some(schedule) = &mut schedule {
                    sleep_until(schedule.start(seq, Instant::now()));
                }
                if seq == cfg.warmup {
                    // GPU strategies run ahead: the warm-up's queued work is not part of the window.
                    wait_stream(gpu.context(), &stream, cfg.frame_timeout)?;
                    (t0, cpu0) = (Instant::now(), cpu_ns());
                }
                let slot = producer.acquire(Some(&stream), cfg.frame_timeout).map_err(frame_error)?;
                let span = producer.slot_span(&slot).map_err(frame_error)?;
                gpu.kernels().fill(&stream, span, slot.seq().0)?;
                if !crate::rows::publishes_on_gpu(self.strategy) {
                    // `publish` would synchronise first anyway; doing it here times the publish after the fill.
                    stream.synchronize()?;
                }
                stamps.record(slot.seq().0, monotonic_ns());
                producer.publish(slot, Some(&stream)).map_err(frame_error)?;
            }
            producer.drain(Some(&stream), cfg.frame_timeout).map_err(frame_error)?;
            Ok((t0.elapsed().as_secs_f64(), cpu_ns().saturating_sub(cpu0)))
        })();
        let (seconds, cpu) = match produced {
            Ok(done) => done,
            Err(e) => return Err(failed_row(e, children, gpu.context(), &stream, cfg.frame_timeout)),
        };
        let reports = collect_reports(&mut children)?;
        let mut notes = Vec::new();
        if self.three_stage {
            notes.push(
                "A (this process) -> B (a Stage process: gpu_ipc_xor_words into its own ring, same strategy and \
                 slots) -> C (a consumer verifying the inverted frames); latency A's publish to C's verify done; \
                 consumer CPU is B's and C's"
                    .to_owned(),
            );
        }
        if crate::rows::publishes_on_gpu(self.strategy) {
            notes.push("publish timed when queued (the fill may still run): latency includes the fill".to_owned());
        }
        if let (Some(fps), Some(schedule)) = (self.pace, &schedule) {
            notes.push(paced_note(fps, schedule.behind()));
        }
        let lost = producer.consumers_lost();
        if lost > 0 {
            notes.push(format!("{lost} consumers lost"));
        }
        measurement(cfg, seconds, cpu, &reports, notes)
    }
}
