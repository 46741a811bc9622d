//! The frame-graph rows (`graphs-BACKEND-STRATEGY-sN`): a `Producer` here and one `Consumer` process, each side
//! on its frame graphs (`capture_frame_graphs`: per slot one CUDA graph holding the ring's wait, the pattern kernel
//! and the publish or release; a lap of the ring per `cuGraphLaunch` when the row is whole laps), so that no ring
//! call is made on the CPU per frame. What they measure is the CPU's cost per frame of that mode and its rate
//! beside the same ring driven call by call (`ours-BACKEND-STRATEGY-sN-c1`). The row's name ends with how the graphs
//! wait: `kernel-waits` (kernels that poll: under MPS only, as `gpu-poll`) or `stream-op-waits` (nodes of stream
//! waits: with and without MPS). There is no latency figure: the CPU sees no frame.

use std::time::{Duration, Instant};

use gpu_ipc::GpuBackendVisitor;
use gpu_ipc::core::backend::GpuBackend;
use gpu_ipc::core::frames::{FrameError, GraphOptions, Producer, ProducerConfig};
use gpu_ipc::core::wire::SyncStrategy;
use gpu_ipc::driver::mps::MpsEvidence;
use gpu_ipc::driver::{DeviceMemory, Stream};
use gpu_ipc::kernels::launch::KernelError;

use super::consumer::{ConsumerGpu, attach};
use super::results::{ConsumerReport, Measurement};
use super::rig::{
    RunConfig, base_plan, check_deadline, collect_reports, failed_row, frame_error, frame_geometry, measurement,
    socket_path, spawn_consumers, wait_for_consumers, wait_stream,
};
use super::rows::{GraphWait, RowSpec, graph_lap};
use super::shared::{PublishStamps, cpu_ns};
use super::tasks::{ConsumerPlan, Setup};
use harness::MeasurementError;
use harness::gpu::GpuSetup;

/// Runs a frame-graph row: with kernel waits unavailable without MPS, else the producer here and one consumer
/// process.
pub(crate) fn row(
    gpu: &GpuSetup,
    cfg: &RunConfig,
    spec: RowSpec,
    backend: gpu_ipc::BackendKind,
    strategy: SyncStrategy,
    slots: u32,
    waits: GraphWait,
) -> Result<Measurement, MeasurementError> {
    if waits == GraphWait::Kernels
        && let Some(why) = MpsEvidence::gather(gpu.context().device()).why_not()
    {
        return Err(MeasurementError::Unavailable(format!(
            "these frame graphs wait for slots and frames in kernels, which without MPS hold their context's time \
             slice: MPS is not running ({why}); the stream-op-waits rows run without it"
        )));
    }
    gpu_ipc::dispatch_gpu(backend, GraphProducer { gpu, cfg, spec, strategy, slots, waits })
        .unwrap_or_else(|e| Err(e.into()))
}

/// A kernel's launch error where the graphs' recording wants a frame error.
fn kernel_error(e: KernelError) -> FrameError {
    FrameError::Config(e.to_string())
}

/// How long the last graphs launched may take to finish: twice one step's bound. A step that gives up raises the
/// abort word, and every step queued behind it then returns at once, so the graphs in flight end within one bound
/// of the first give-up.
fn finish_bound(per_frame: Duration) -> Duration {
    per_frame * 2
}

struct GraphProducer<'a> {
    gpu: &'a GpuSetup,
    cfg: &'a RunConfig,
    spec: RowSpec,
    strategy: SyncStrategy,
    slots: u32,
    waits: GraphWait,
}

impl GpuBackendVisitor for GraphProducer<'_> {
    type Output = Result<Measurement, MeasurementError>;

    fn visit<B: GpuBackend>(self) -> Self::Output {
        let (gpu, cfg) = (self.gpu, self.cfg);
        let deadline = Instant::now() + cfg.row_timeout;
        let socket = socket_path();
        let config = ProducerConfig::new(&socket, frame_geometry(cfg.shape)?, self.slots, self.strategy);
        let stream = Stream::new(gpu.context())?;
        let mut producer = Producer::<B>::create(gpu.context(), config).map_err(frame_error)?;
        let stamps = PublishStamps::create()?;
        let plan = base_plan(cfg, self.spec, Some(socket));
        let mut children = spawn_consumers(&plan, 1, &stamps, &Setup { handle: None }, &|| Ok(Vec::new()))?;
        let lap = graph_lap(self.slots, cfg.frames, cfg.warmup);
        let produced = (|| -> Result<(f64, u64), MeasurementError> {
            wait_for_consumers(&mut producer, 1, &children)?;
            let kernels = gpu.kernels();
            let options = GraphOptions::new(cfg.frame_timeout).frames_per_launch(lap).waits(self.waits.waits());
            let mut graphs = producer
                .capture_frame_graphs(&stream, options, |slot, s| {
                    kernels.fill_at(s, slot.span, slot.frame_state).map_err(kernel_error)
                })
                .map_err(frame_error)?;
            let (mut t0, mut cpu0) = (Instant::now(), cpu_ns());
            let mut launched = 0u64;
            while launched < cfg.total() {
                check_deadline(deadline, cfg, launched)?;
                if launched == cfg.warmup {
                    // The warm-up's graphs are not part of the window.
                    wait_stream(gpu.context(), &stream, cfg.frame_timeout)?;
                    (t0, cpu0) = (Instant::now(), cpu_ns());
                }
                producer.launch_frame_graph(&mut graphs, &stream).map_err(frame_error)?;
                launched += u64::from(lap);
            }
            producer.finish_frame_graphs(finish_bound(cfg.frame_timeout)).map_err(frame_error)?;
            producer.drain(Some(&stream), cfg.frame_timeout).map_err(frame_error)?;
            Ok((t0.elapsed().as_secs_f64(), cpu_ns().saturating_sub(cpu0)))
        })();
        let (seconds, cpu) = match produced {
            Ok(done) => done,
            Err(e) => return Err(failed_row(e, children, gpu.context(), &stream, cfg.frame_timeout)),
        };
        let reports = collect_reports(&mut children)?;
        let notes = vec![format!(
            "both sides on frame graphs with {} ({}), {lap} frame(s) per cuGraphLaunch; no latency figure (the CPU \
             sees no frame)",
            self.waits.name(),
            match self.waits {
                GraphWait::Kernels => "kernels that poll the ring's words",
                GraphWait::StreamOps => "batch memory operation nodes of stream waits, set at each launch",
            }
        )];
        measurement(cfg, seconds, cpu, &reports, notes)
    }
}

/// The consumer process of a frame-graph row: its graphs verify and release every frame; it reports its CPU time
/// from the first measured frame's launch on, and the words that did not match.
pub(crate) struct GraphConsumer<'a> {
    pub(crate) plan: &'a ConsumerPlan,
}

impl GpuBackendVisitor for GraphConsumer<'_> {
    type Output = Result<ConsumerReport, MeasurementError>;

    fn visit<B: GpuBackend>(self) -> Self::Output {
        let plan = self.plan;
        let RowSpec::Graphs { slots, waits, .. } = plan.spec else {
            return Err(MeasurementError::Other(format!("{} is not a frame-graph row", plan.spec.name())));
        };
        let gpu = ConsumerGpu::open(plan.device)?;
        let mut consumer = attach::<B>(gpu.setup.context(), plan)?;
        let timeout = Duration::from_millis(plan.frame_timeout_ms);
        let measured = plan.frames_total.saturating_sub(plan.warmup);
        let lap = graph_lap(slots, measured, plan.warmup);
        let options = GraphOptions::new(timeout).frames_per_launch(lap).waits(waits.waits());
        let (kernels, mismatches) = (gpu.setup.kernels(), gpu.mismatches.span());
        let mut graphs = consumer
            .capture_frame_graphs(gpu.setup.stream(), options, |slot, s| {
                kernels.verify_at(s, slot.span, slot.frame_state, mismatches).map_err(kernel_error)
            })
            .map_err(frame_error)?;
        let mut cpu_start = None;
        let mut launched = 0u64;
        while launched < plan.frames_total {
            if launched >= plan.warmup && cpu_start.is_none() {
                cpu_start = Some(cpu_ns());
            }
            consumer.launch_frame_graph(&mut graphs, gpu.setup.stream()).map_err(frame_error)?;
            launched += u64::from(lap);
        }
        consumer.finish_frame_graphs(finish_bound(timeout)).map_err(frame_error)?;
        let cpu = cpu_start.map_or(0, |start| cpu_ns().saturating_sub(start));
        let skipped = graphs.skipped().map_err(frame_error)?;
        if skipped > 0 {
            return Err(MeasurementError::Other(format!(
                "the consumer's graphs skipped {skipped} of {launched} frames with the producer alive"
            )));
        }
        let mismatches = gpu.mismatches()?;
        consumer.detach();
        Ok(ConsumerReport {
            frames: launched,
            measured_frames: measured,
            cpu_ns: cpu,
            mismatches,
            latencies_ns: Vec::new(),
            missing_stamps: 0,
            gpu_done_ns: Vec::new(),
        })
    }
}
