//! The producer side of every row, in the bench process: the references, and ours through the real `Producer` API
//! (unpaced, paced at a frame rate, or three-stage); the study's designs are in [`super::study`], the memory
//! benchmarks and the kernels alone in [`super::memory`]. Consumers are `bench-consumer` children
//! ([`super::consumer`]), a three-stage row's middle stage a `bench-stage` child ([`super::stage`]).

use std::os::fd::OwnedFd;
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use gpu_ipc::GpuBackendVisitor;
use gpu_ipc::core::backend::{Backend, GpuBackend};
use gpu_ipc::core::frames::{FrameError, Producer, ProducerConfig};
use gpu_ipc::core::wire::SyncStrategy;
use gpu_ipc::driver::{Context, DeviceBuffer, DeviceMemory, Event, EventFlags, Stream};
use gpu_ipc::kernels::launch::PatternKernels;

use super::consumer::{BenchTask, ConsumerMessage, ConsumerPlan, Setup};
use super::paced::{PaceSchedule, paced_note, sleep_until};
use super::results::{ConsumerReport, Measurement, RowOutcome, cpu_us_per_frame, fps, merge_consumers};
use super::rows::{RowSpec, THREE_STAGE_MASK};
use super::shared::{PublishStamps, cpu_ns, monotonic_ns};
use super::stage::StagePlan;
use harness::ProbeError;
use harness::child::{ChildProcess, ChildTask};

/// How long a consumer process has to start, set up CUDA and attach or say it is ready.
pub(crate) const SETUP_TIMEOUT: Duration = Duration::from_secs(60);

/// The bench process's GPU state, made once for every row.
pub struct BenchGpu {
    ctx: Context,
    kernels: PatternKernels,
    stream: Stream,
}

impl BenchGpu {
    /// Opens device `ordinal`, loads the pattern kernels, makes a stream.
    ///
    /// # Errors
    /// No device, no kernel image for it, driver errors.
    pub fn open(ordinal: i32) -> Result<Self, ProbeError> {
        let ctx = Context::for_ordinal(ordinal)?;
        let kernels = PatternKernels::load(&ctx)?;
        let stream = Stream::new(&ctx)?;
        Ok(Self { ctx, kernels, stream })
    }

    /// The bench process's context.
    pub fn context(&self) -> &Context {
        &self.ctx
    }

    /// The pattern kernels, loaded in [`BenchGpu::context`].
    pub fn kernels(&self) -> &PatternKernels {
        &self.kernels
    }

    /// The stream the references use.
    pub fn stream(&self) -> &Stream {
        &self.stream
    }
}

/// What every row runs with.
#[derive(Debug, Clone)]
pub struct RunConfig {
    /// The device.
    pub device: i32,
    /// Frame width, height and bytes per pixel.
    pub shape: [u32; 3],
    /// Frames measured.
    pub frames: u64,
    /// Frames before the measured window.
    pub warmup: u64,
    /// Bound of every wait for one frame.
    pub frame_timeout: Duration,
    /// Bound of the whole row.
    pub row_timeout: Duration,
}

impl RunConfig {
    /// Bytes of one frame.
    pub fn frame_bytes(&self) -> u64 {
        self.shape.iter().map(|&x| u64::from(x)).product()
    }

    pub(crate) fn total(&self) -> u64 {
        self.warmup + self.frames
    }

    /// This configuration with the frames and warm-up of `spec` ([`RowSpec::budget`]).
    pub fn for_row(&self, spec: RowSpec) -> Self {
        let (frames, warmup) = spec.budget(self.frames, self.warmup);
        Self { frames, warmup, ..self.clone() }
    }
}

/// Runs one row; a failure (including a hang cut short by a bound) is its outcome, not an error.
pub fn run_row(gpu: &BenchGpu, cfg: &RunConfig, spec: RowSpec) -> RowOutcome {
    let cfg = &cfg.for_row(spec);
    let result = match spec {
        RowSpec::SingleProcess => single_process(gpu, cfg),
        RowSpec::SingleProcessPipelined { slots } => single_process_pipelined(gpu, cfg, slots),
        RowSpec::SingleProcessMemOps { slots } => single_process_memops(gpu, cfg, slots),
        RowSpec::Bandwidth => bandwidth(gpu, cfg),
        RowSpec::Study { design } => super::study::study(gpu, cfg, spec, design),
        RowSpec::Ours { backend, strategy, slots, consumers } => {
            let ours = OursProducer { gpu, cfg, spec, strategy, slots, consumers, three_stage: false, pace: None };
            gpu_ipc::dispatch_gpu(backend, ours).unwrap_or_else(|e| Err(e.into()))
        }
        RowSpec::ThreeStage { backend, strategy, slots } => {
            let ours = OursProducer { gpu, cfg, spec, strategy, slots, consumers: 1, three_stage: true, pace: None };
            gpu_ipc::dispatch_gpu(backend, ours).unwrap_or_else(|e| Err(e.into()))
        }
        RowSpec::Paced { backend, strategy, slots, fps } => {
            let ours =
                OursProducer { gpu, cfg, spec, strategy, slots, consumers: 1, three_stage: false, pace: Some(fps) };
            gpu_ipc::dispatch_gpu(backend, ours).unwrap_or_else(|e| Err(e.into()))
        }
        RowSpec::Memory { test } => super::memory::memory(gpu, cfg, test),
        RowSpec::Imported { backend, copy } => super::memory::imported(gpu, cfg, backend, copy),
        RowSpec::Kernel { kernel } => super::memory::kernel_alone(gpu, cfg, kernel),
        RowSpec::Graphs { backend, strategy, slots, waits } => {
            super::graphs::row(gpu, cfg, spec, backend, strategy, slots, waits)
        }
    };
    // Leave nothing of a failed row queued for the next one.
    if let Err(e) = wait_stream(&gpu.ctx, &gpu.stream, cfg.frame_timeout) {
        tracing::warn!(%e, "the bench stream did not drain after a row");
    }
    match result {
        Ok(m) => RowOutcome::Measured(m),
        Err(ProbeError::Unavailable(reason)) => RowOutcome::Unavailable { reason },
        Err(e) => RowOutcome::Failed { reason: e.to_string() },
    }
}

/// Waits for the work queued on `stream`, at most `timeout` (an event polled, never an unbounded synchronise).
pub(crate) fn wait_stream(ctx: &Context, stream: &Stream, timeout: Duration) -> Result<(), ProbeError> {
    let event = Event::new(ctx, EventFlags::default())?;
    event.record(stream)?;
    let deadline = Instant::now() + timeout;
    while !event.is_complete()? {
        if Instant::now() >= deadline {
            return Err(ProbeError::Wait(format!("queued GPU work not done within {timeout:?}")));
        }
        std::thread::yield_now();
    }
    Ok(())
}

fn read_counter(counter: &DeviceBuffer) -> Result<u64, ProbeError> {
    let mut count = [0u64];
    counter.read(0, &mut count)?;
    Ok(count[0])
}

/// The single-process limit: fill then verify of each frame in one buffer on one stream, back to back.
fn single_process(gpu: &BenchGpu, cfg: &RunConfig) -> Result<Measurement, ProbeError> {
    let bytes = cfg.frame_bytes();
    let frame = DeviceBuffer::alloc(&gpu.ctx, bytes)?;
    let counter = DeviceBuffer::alloc(&gpu.ctx, 8)?;
    counter.write(0, &[0u64])?;
    let run = |from: u64, to: u64| -> Result<(), ProbeError> {
        for seq in from..to {
            gpu.kernels.fill(&gpu.stream, frame.span(), seq)?;
            gpu.kernels.verify(&gpu.stream, frame.span(), seq, counter.span())?;
        }
        wait_stream(&gpu.ctx, &gpu.stream, cfg.row_timeout)
    };
    in_process(
        cfg,
        run,
        &counter,
        "one process, one stream, one frame buffer: fill then verify, frames queued back to back".into(),
    )
}

/// The same kernels in one process, pipelined through `slots` frame buffers: fill on the bench stream, verify on a
/// second stream, frame `seq` in buffer `seq % slots`; the verify of a buffer waits for its fill (an event) and the
/// next fill of it waits for that verify (another event). No IPC and no CPU wait per frame: the ceiling of a design
/// in which the next frame's fill runs while the current one is verified, as in a ring of two or more slots.
fn single_process_pipelined(gpu: &BenchGpu, cfg: &RunConfig, slots: u32) -> Result<Measurement, ProbeError> {
    let bytes = cfg.frame_bytes();
    let slots = slots.max(1) as usize;
    let frames = (0..slots).map(|_| DeviceBuffer::alloc(&gpu.ctx, bytes)).collect::<Result<Vec<_>, _>>()?;
    let events = || (0..slots).map(|_| Event::new(&gpu.ctx, EventFlags::default())).collect::<Result<Vec<_>, _>>();
    let (filled, verified) = (events()?, events()?);
    let counter = DeviceBuffer::alloc(&gpu.ctx, 8)?;
    counter.write(0, &[0u64])?;
    let verify_stream = Stream::new(&gpu.ctx)?;
    let run = |from: u64, to: u64| -> Result<(), ProbeError> {
        for seq in from..to {
            let i = (seq % slots as u64) as usize;
            // The buffer's previous verify (an event never recorded is complete).
            gpu.stream.wait_event(&verified[i])?;
            gpu.kernels.fill(&gpu.stream, frames[i].span(), seq)?;
            filled[i].record(&gpu.stream)?;
            verify_stream.wait_event(&filled[i])?;
            gpu.kernels.verify(&verify_stream, frames[i].span(), seq, counter.span())?;
            verified[i].record(&verify_stream)?;
        }
        wait_stream(&gpu.ctx, &gpu.stream, cfg.row_timeout)?;
        wait_stream(&gpu.ctx, &verify_stream, cfg.row_timeout)
    };
    let note = format!(
        "one process, {slots} frame buffers, fill on one stream and verify on another, handed over with events: the \
         next fill overlaps the current verify"
    );
    in_process(cfg, run, &counter, note)
}

/// As [`single_process_pipelined`], each buffer handed over by stream memory operations on two counters in
/// registered host memory, as `gpu-stream-ops` waits and publishes: the fill of frame `seq` waits until the verify
/// stream has released frame `seq - slots` (`released >= seq + 1 - slots`), then writes `published = seq + 1`;
/// the verify waits for `published >= seq + 1`, then writes `released = seq + 1`.
fn single_process_memops(gpu: &BenchGpu, cfg: &RunConfig, slots: u32) -> Result<Measurement, ProbeError> {
    use gpu_ipc::core::shm::SharedMemory;
    use gpu_ipc::driver::{HostRegistration, WaitCondition};
    const PUBLISHED: usize = 0;
    const RELEASED: usize = 64;
    let bytes = cfg.frame_bytes();
    let depth = u64::from(slots.max(1));
    let frames = (0..depth).map(|_| DeviceBuffer::alloc(&gpu.ctx, bytes)).collect::<Result<Vec<_>, _>>()?;
    let words =
        std::sync::Arc::new(SharedMemory::create("gpu-ipc-bench-memops", 128).map_err(ProbeError::SharedMemory)?);
    let counters = HostRegistration::new(&gpu.ctx, words)?;
    let counter = DeviceBuffer::alloc(&gpu.ctx, 8)?;
    counter.write(0, &[0u64])?;
    let verify_stream = Stream::new(&gpu.ctx)?;
    let run = |from: u64, to: u64| -> Result<(), ProbeError> {
        for seq in from..to {
            let frame = frames[(seq % depth) as usize].span();
            if seq >= depth {
                counters.wait_value_u64(&gpu.stream, RELEASED, seq + 1 - depth, WaitCondition::AtLeast)?;
            }
            gpu.kernels.fill(&gpu.stream, frame, seq)?;
            counters.write_value_u64(&gpu.stream, PUBLISHED, seq + 1)?;
            counters.wait_value_u64(&verify_stream, PUBLISHED, seq + 1, WaitCondition::AtLeast)?;
            gpu.kernels.verify(&verify_stream, frame, seq, counter.span())?;
            counters.write_value_u64(&verify_stream, RELEASED, seq + 1)?;
        }
        wait_stream(&gpu.ctx, &gpu.stream, cfg.row_timeout)?;
        wait_stream(&gpu.ctx, &verify_stream, cfg.row_timeout)
    };
    let note = format!(
        "one process, {depth} frame buffers, fill on one stream and verify on another, handed over by stream memory \
         operations on counters in registered host memory (as gpu-stream-ops): that handoff's own cost"
    );
    in_process(cfg, run, &counter, note)
}

/// A reference row run in this process: `run(from, to)` queues frames `from..to` and waits for them; the warm-up
/// first, then the measured window, timed on the wall clock and this process's CPU clock; `counter` holds the
/// verify kernels' mismatches.
pub(crate) fn in_process(
    cfg: &RunConfig,
    run: impl Fn(u64, u64) -> Result<(), ProbeError>,
    counter: &DeviceBuffer,
    note: String,
) -> Result<Measurement, ProbeError> {
    run(0, cfg.warmup)?;
    let (t0, cpu0) = (Instant::now(), cpu_ns());
    run(cfg.warmup, cfg.total())?;
    let seconds = t0.elapsed().as_secs_f64();
    let cpu = cpu_ns().saturating_sub(cpu0);
    Ok(Measurement {
        frames: cfg.frames,
        seconds,
        fps: fps(cfg.frames, seconds),
        ratio_to_single_process: None,
        latency: None,
        producer_cpu_us_per_frame: cpu_us_per_frame(cpu, cfg.frames),
        consumer_cpu_us_per_frame: Vec::new(),
        mismatches: read_counter(counter)?,
        bandwidth_gb_s: None,
        frame_gb_s: None,
        note: Some(note),
    })
}

/// The memory-bandwidth floor: device-to-device copies of a frame, back to back.
fn bandwidth(gpu: &BenchGpu, cfg: &RunConfig) -> Result<Measurement, ProbeError> {
    let bytes = cfg.frame_bytes();
    let src = DeviceBuffer::alloc(&gpu.ctx, bytes)?;
    let dst = DeviceBuffer::alloc(&gpu.ctx, bytes)?;
    let run = |count: u64| -> Result<(), ProbeError> {
        for _ in 0..count {
            dst.span().copy_from_async(&src.span(), &gpu.stream)?;
        }
        wait_stream(&gpu.ctx, &gpu.stream, cfg.row_timeout)
    };
    run(cfg.warmup)?;
    let (t0, cpu0) = (Instant::now(), cpu_ns());
    run(cfg.frames)?;
    let seconds = t0.elapsed().as_secs_f64();
    let cpu = cpu_ns().saturating_sub(cpu0);
    let moved = 2.0 * bytes as f64 * cfg.frames as f64;
    Ok(Measurement {
        frames: cfg.frames,
        seconds,
        fps: fps(cfg.frames, seconds),
        ratio_to_single_process: None,
        latency: None,
        producer_cpu_us_per_frame: cpu_us_per_frame(cpu, cfg.frames),
        consumer_cpu_us_per_frame: Vec::new(),
        mismatches: 0,
        bandwidth_gb_s: Some(if seconds > 0.0 { moved / seconds / 1e9 } else { 0.0 }),
        frame_gb_s: None,
        note: Some(
            "cuMemcpyDtoDAsync of one frame between two buffers; a copy reads and writes one frame, as fill + \
             verify do, so the implied FPS is copies per second"
                .into(),
        ),
    })
}

/// A temporary rendezvous socket path for one row.
/// The geometry of the row's frames (RGB, 8 bits a channel) from `[width, height, bytes per pixel]`.
pub(crate) fn frame_geometry(shape: [u32; 3]) -> Result<gpu_ipc::core::wire::FrameGeometry, ProbeError> {
    use gpu_ipc::core::wire::{FrameGeometry, PixelFormat};
    let [width, height, _] = shape;
    FrameGeometry::new(width, height, PixelFormat::Rgb8).map_err(|e| ProbeError::Other(format!("frame geometry: {e}")))
}

/// A fresh rendezvous socket path for one row.
pub(crate) fn socket_path() -> PathBuf {
    use std::sync::atomic::AtomicU64;
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    std::env::temp_dir().join(format!("gpu-ipc-bench-{}-{n}.sock", std::process::id()))
}

/// Starts `count` consumers with `plan` (numbered) and sends each its setup: the stamps' fd, then `extra` fds.
pub(crate) fn spawn_consumers(
    plan: &ConsumerPlan,
    count: u32,
    stamps: &PublishStamps,
    setup: &Setup,
    extra: &dyn Fn() -> Result<Vec<OwnedFd>, ProbeError>,
) -> Result<Vec<ChildProcess>, ProbeError> {
    let shm = ProbeError::SharedMemory;
    let mut children = Vec::with_capacity(count as usize);
    for index in 0..count {
        let plan = ConsumerPlan { index, ..plan.clone() };
        let task = ChildTask::of(&BenchTask::Consumer(plan))
            .map_err(|source| ProbeError::Malformed { what: "bench task".to_owned(), source })?;
        let child = ChildProcess::spawn(&task, &[], Duration::from_secs(30))?;
        let mut fds = vec![stamps.fd().map_err(shm)?];
        fds.extend(extra()?);
        child.channel().send(setup, fds)?;
        children.push(child);
    }
    Ok(children)
}

/// Receives a consumer's next message; a child that reported a failure becomes [`ProbeError::Child`].
pub(crate) fn recv_message(child: &ChildProcess, timeout: Duration) -> Result<ConsumerMessage, ProbeError> {
    let value: serde_json::Value = child.channel().recv_plain(timeout)?;
    if let Some(error) = value.get("error").and_then(serde_json::Value::as_str) {
        return Err(ProbeError::Child { role: "bench-consumer".to_owned(), reason: error.to_owned() });
    }
    serde_json::from_value(value)
        .map_err(|source| ProbeError::Malformed { what: "consumer message".to_owned(), source })
}

fn recv_report(child: &ChildProcess, timeout: Duration) -> Result<ConsumerReport, ProbeError> {
    match recv_message(child, timeout)? {
        ConsumerMessage::Report(report) => Ok(report),
        ConsumerMessage::Ready => {
            Err(ProbeError::Unexpected { peer: "consumer", expected: "its report", got: "ready".to_owned() })
        }
    }
}

/// A row whose producer side failed: `e` with what its consumers said; the children are killed (dropped) and the
/// row's stream given `timeout` to drain (killed consumers are noticed by the producer's watchdog, which releases
/// the stream's waits).
pub(crate) fn failed_row(
    e: ProbeError,
    children: Vec<ChildProcess>,
    ctx: &Context,
    stream: &Stream,
    timeout: Duration,
) -> ProbeError {
    let e = with_consumer_failures(e, &children);
    drop(children);
    if let Err(stuck) = wait_stream(ctx, stream, timeout) {
        tracing::warn!(%stuck, "the failed row's stream did not drain");
    }
    e
}

/// After the producer side failed: what the consumers said, if any said something within a moment.
fn with_consumer_failures(error: ProbeError, children: &[ChildProcess]) -> ProbeError {
    let said: Vec<String> = children
        .iter()
        .enumerate()
        .filter_map(|(i, child)| match recv_message(child, Duration::from_millis(300)) {
            Err(ProbeError::Child { reason, .. }) => Some(format!("consumer {i}: {reason}")),
            _ => None,
        })
        .collect();
    if said.is_empty() { error } else { ProbeError::Other(format!("{error} ({})", said.join("; "))) }
}

/// Collects every consumer's report and waits for it to exit.
pub(crate) fn collect_reports(children: &mut [ChildProcess]) -> Result<Vec<ConsumerReport>, ProbeError> {
    let mut reports = Vec::with_capacity(children.len());
    for child in children.iter_mut() {
        reports.push(recv_report(child, SETUP_TIMEOUT)?);
        let status = child.wait(Duration::from_secs(10))?;
        if !status.success() {
            return Err(ProbeError::Other(format!("a consumer exited with {status} after reporting")));
        }
    }
    Ok(reports)
}

/// The row's measurement from the producer's window and the consumers' reports.
pub(crate) fn measurement(
    cfg: &RunConfig,
    seconds: f64,
    producer_cpu_ns: u64,
    reports: &[ConsumerReport],
    mut notes: Vec<String>,
) -> Result<Measurement, ProbeError> {
    let (histogram, mismatches, consumer_cpu, missing) = merge_consumers(reports).map_err(ProbeError::Other)?;
    if missing > 0 {
        notes.push(format!("{missing} frames had no publish time"));
    }
    for (i, r) in reports.iter().enumerate() {
        if r.measured_frames != cfg.frames {
            notes.push(format!("consumer {i} measured {} frames, not {}", r.measured_frames, cfg.frames));
        }
    }
    Ok(Measurement {
        frames: cfg.frames,
        seconds,
        fps: fps(cfg.frames, seconds),
        ratio_to_single_process: None,
        latency: histogram.summary(),
        producer_cpu_us_per_frame: cpu_us_per_frame(producer_cpu_ns, cfg.frames),
        consumer_cpu_us_per_frame: consumer_cpu,
        mismatches,
        bandwidth_gb_s: None,
        frame_gb_s: None,
        note: (!notes.is_empty()).then(|| notes.join("; ")),
    })
}

pub(crate) fn check_deadline(deadline: Instant, cfg: &RunConfig, seq: u64) -> Result<(), ProbeError> {
    if Instant::now() >= deadline {
        return Err(ProbeError::Wait(format!(
            "the row took longer than {:?} (stopped at frame {seq} of {})",
            cfg.row_timeout,
            cfg.total()
        )));
    }
    Ok(())
}

pub(crate) fn frame_error(e: FrameError) -> ProbeError {
    match e {
        e @ FrameError::StrategyUnavailable { .. } => ProbeError::Unavailable(e.to_string()),
        e => ProbeError::Frames(e),
    }
}

pub(crate) fn base_plan(cfg: &RunConfig, spec: RowSpec, socket: Option<PathBuf>) -> ConsumerPlan {
    ConsumerPlan {
        spec,
        device: cfg.device,
        frame_bytes: cfg.frame_bytes(),
        frames_total: cfg.total(),
        warmup: cfg.warmup,
        socket,
        index: 0,
        frame_timeout_ms: frame_timeout_ms(cfg),
        expect_xor: None,
    }
}

fn frame_timeout_ms(cfg: &RunConfig) -> u64 {
    u64::try_from(cfg.frame_timeout.as_millis()).unwrap_or(u64::MAX)
}

/// Our rows: a `Producer` here, `consumers` `Consumer` processes; or, for a three-stage row, a `bench-stage`
/// process attached to our ring and one `Consumer` process attached to the stage's.
struct OursProducer<'a> {
    gpu: &'a BenchGpu,
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
    fn spawn_children(&self, socket: PathBuf, stamps: &PublishStamps) -> Result<Vec<ChildProcess>, ProbeError> {
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
            .map_err(|source| ProbeError::Malformed { what: "bench task".to_owned(), source })?;
        let mut children = vec![ChildProcess::spawn(&task, &[], Duration::from_secs(30))?];
        let plan =
            ConsumerPlan { expect_xor: Some(THREE_STAGE_MASK), ..base_plan(self.cfg, self.spec, Some(downstream)) };
        children.extend(spawn_consumers(&plan, 1, stamps, &setup, &|| Ok(Vec::new()))?);
        Ok(children)
    }
}

impl GpuBackendVisitor for OursProducer<'_> {
    type Output = Result<Measurement, ProbeError>;

    fn visit<B: GpuBackend>(self) -> Self::Output {
        let (gpu, cfg) = (self.gpu, self.cfg);
        let deadline = Instant::now() + cfg.row_timeout;
        let geometry = frame_geometry(cfg.shape)?;
        let socket = socket_path();
        let config = ProducerConfig::new(&socket, geometry, self.slots, self.strategy);
        // A stream of the row's own: a row that fails with GPU waits still queued cannot stall the next one.
        let stream = Stream::new(&gpu.ctx)?;
        let mut producer = Producer::<B>::create(&gpu.ctx, config).map_err(frame_error)?;
        let stamps = PublishStamps::create()?;
        let mut children = self.spawn_children(socket, &stamps)?;
        let mut schedule = None;
        let produced = (|| -> Result<(f64, u64), ProbeError> {
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
                    wait_stream(&gpu.ctx, &stream, cfg.frame_timeout)?;
                    (t0, cpu0) = (Instant::now(), cpu_ns());
                }
                let slot = producer.acquire(Some(&stream), cfg.frame_timeout).map_err(frame_error)?;
                let span = producer.slot_span(&slot).map_err(frame_error)?;
                gpu.kernels.fill(&stream, span, slot.seq().0)?;
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
            Err(e) => return Err(failed_row(e, children, &gpu.ctx, &stream, cfg.frame_timeout)),
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

/// Admits `count` consumers, in short bounded waits between which it looks for a child that failed to start (it
/// says why over its channel, or hangs up), so such a row fails at once instead of after the limit.
pub(crate) fn wait_for_consumers<B: Backend>(
    producer: &mut Producer<B>,
    count: usize,
    children: &[ChildProcess],
) -> Result<(), ProbeError> {
    use gpu_ipc::core::wire::WireError;
    use harness::child::ChannelError;
    let deadline = Instant::now() + SETUP_TIMEOUT;
    loop {
        match producer.wait_for_consumers(count, Duration::from_millis(200)) {
            Ok(()) => return Ok(()),
            Err(FrameError::Timeout { what, .. }) => {
                for (i, child) in children.iter().enumerate() {
                    // Before it attached, a consumer sends nothing but a failure.
                    match recv_message(child, Duration::from_millis(1)) {
                        Err(ProbeError::Channel(ChannelError::Wire(WireError::Timeout { .. }))) => {}
                        Err(e) => return Err(ProbeError::Other(format!("consumer {i} did not attach: {e}"))),
                        Ok(other) => {
                            return Err(ProbeError::Unexpected {
                                peer: "consumer",
                                expected: "attached",
                                got: format!("{other:?}"),
                            });
                        }
                    }
                }
                if Instant::now() >= deadline {
                    return Err(ProbeError::Wait(format!("waited {SETUP_TIMEOUT:?} for {what}")));
                }
            }
            Err(e) => return Err(frame_error(e)),
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests;
