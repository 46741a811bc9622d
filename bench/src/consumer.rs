//! The consumer side of a row, run in a `gpu-ipc probe-child` process with role `bench-consumer`: it reads and
//! verifies every frame on the GPU and reports its latencies, CPU time and mismatches. (The three-stage rows' middle
//! stage is `bench-stage`, [`super::stage`].)

use std::os::fd::OwnedFd;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use gpu_ipc::GpuBackendVisitor;
use gpu_ipc::core::backend::GpuBackend;
use gpu_ipc::core::frames::{AttachOptions, Consumer, FrameError};
use gpu_ipc::core::shm::SharedMemory;
use gpu_ipc::core::wire::WireError;
use gpu_ipc::driver::{Context, DeviceBuffer, DeviceMemory, HostRegistration, Stream};
use gpu_ipc::kernels::launch::PatternKernels;
use gpu_ipc::kernels::pattern::xor_sequence;
use serde::{Deserialize, Serialize};

use super::results::ConsumerReport;
use super::rows::{RowSpec, StudyDesign};
use super::shared::{CompletionClock, PublishStamps, StudyFlags, cpu_ns, flag, monotonic_ns};
use harness::ProbeError;
use harness::child::{Channel, ChildTask};
use harness::regions::{HandleMessage, ImportedRegion};

/// What a helper of the bench is asked to do (the envelope is [`ChildTask`]).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "role", content = "params")]
pub enum BenchTask {
    /// A consumer process of one row.
    #[serde(rename = "bench-consumer")]
    Consumer(ConsumerPlan),
    /// The middle stage of a three-stage row.
    #[serde(rename = "bench-stage")]
    Stage(super::stage::StagePlan),
    /// The exporter of an imported-buffer row.
    #[serde(rename = "bench-exporter")]
    Exporter(super::memory::ExporterPlan),
}

/// Frames a consumer may have queued before it waits for the oldest to finish (the completion clock's depth): above
/// the deepest run-ahead of the library (2 x 256 slots), so that the clock never holds the consumer back or spins
/// where the library itself would not.
const IN_FLIGHT: usize = 4 * gpu_ipc::core::ring::layout::MAX_SLOTS as usize;

/// What a consumer process is asked to do (the task's parameters).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ConsumerPlan {
    /// The row.
    pub spec: RowSpec,
    /// The device.
    pub device: i32,
    /// Bytes of a frame.
    pub frame_bytes: u64,
    /// Frames in all, warm-up included.
    pub frames_total: u64,
    /// Frames before the measured window.
    pub warmup: u64,
    /// The producer's rendezvous socket (our rows).
    pub socket: Option<PathBuf>,
    /// This consumer's number within the row.
    pub index: u32,
    /// Bound of every wait for one frame, in milliseconds.
    pub frame_timeout_ms: u64,
    /// The mask every word of the frames was XORed with on the way (three-stage rows): frame `seq` is checked
    /// against the pattern of `xor_sequence(seq, mask)`. `None`: the producer's frames as they are.
    #[serde(default)]
    pub expect_xor: Option<u32>,
}

/// Sent by the producer right after the task, with fds: the publish stamps, then (study rows) the flags, then
/// (designs a and b) the host frame buffer.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Setup {
    /// The shared device buffer (designs c and d).
    pub handle: Option<HandleMessage>,
}

/// What a consumer sends to the producer.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "message", rename_all = "kebab-case")]
pub enum ConsumerMessage {
    /// Set up and waiting for frames (study rows; our rows attach instead).
    Ready,
    /// Done: the figures.
    Report(ConsumerReport),
}

/// Runs a bench child: a consumer, a three-stage row's middle stage, or an imported-buffer row's exporter.
///
/// # Errors
/// Anything that stops it; the caller reports it to the parent.
pub fn child(task: ChildTask, channel: &Channel) -> Result<(), ProbeError> {
    match task.decode().map_err(|source| ProbeError::Malformed { what: "bench task".to_owned(), source })? {
        BenchTask::Consumer(plan) => consumer_child(plan, channel),
        BenchTask::Stage(plan) => super::stage::child(&plan, channel),
        BenchTask::Exporter(plan) => super::memory::exporter_child(&plan, channel),
    }
}

/// Runs a `bench-consumer` child.
fn consumer_child(plan: ConsumerPlan, channel: &Channel) -> Result<(), ProbeError> {
    let (setup, mut fds): (Setup, Vec<OwnedFd>) = channel.recv(Duration::from_secs(30))?;
    if fds.is_empty() {
        return Err(ProbeError::Missing("the producer sent no publish-stamp memfd"));
    }
    let stamps = PublishStamps::open(fds.remove(0))?;
    let report = match plan.spec {
        RowSpec::Ours { backend, .. } | RowSpec::ThreeStage { backend, .. } | RowSpec::Paced { backend, .. } => {
            gpu_ipc::dispatch_gpu(backend, OursConsumer { plan: &plan, stamps: &stamps })
                .unwrap_or_else(|e| Err(e.into()))?
        }
        RowSpec::Graphs { backend, .. } => gpu_ipc::dispatch_gpu(backend, super::graphs::GraphConsumer { plan: &plan })
            .unwrap_or_else(|e| Err(e.into()))?,
        RowSpec::Study { design } => study_consumer(&plan, design, &setup, fds, &stamps, channel)?,
        RowSpec::SingleProcess
        | RowSpec::SingleProcessPipelined { .. }
        | RowSpec::SingleProcessMemOps { .. }
        | RowSpec::Bandwidth
        | RowSpec::Memory { .. }
        | RowSpec::Imported { .. }
        | RowSpec::Kernel { .. } => {
            return Err(ProbeError::Missing("the references and the memory rows run without a consumer process"));
        }
    };
    channel.send(&ConsumerMessage::Report(report), Vec::new())?;
    Ok(())
}

/// The GPU state every consumer sets up.
pub(crate) struct ConsumerGpu {
    pub(crate) ctx: Context,
    pub(crate) kernels: PatternKernels,
    pub(crate) stream: Stream,
    /// The verify kernels' count of mismatched words.
    pub(crate) mismatches: DeviceBuffer,
}

impl ConsumerGpu {
    pub(crate) fn open(device: i32) -> Result<Self, ProbeError> {
        let ctx = Context::for_ordinal(device)?;
        let kernels = PatternKernels::load(&ctx)?;
        let stream = Stream::new(&ctx)?;
        let mismatches = DeviceBuffer::alloc(&ctx, 8)?;
        mismatches.write(0, &[0u64])?;
        Ok(Self { ctx, kernels, stream, mismatches })
    }

    pub(crate) fn mismatches(&self) -> Result<u64, ProbeError> {
        self.stream.synchronize()?;
        let mut count = [0u64];
        self.mismatches.read(0, &mut count)?;
        Ok(count[0])
    }
}

/// Collects a consumer's measured window: latencies against the publish stamps, CPU time from the first measured
/// frame on.
struct Window<'a> {
    stamps: &'a PublishStamps,
    warmup: u64,
    latencies_ns: Vec<u64>,
    missing: u64,
    frames: u64,
    measured: u64,
    cpu_start: Option<u64>,
}

impl<'a> Window<'a> {
    fn new(stamps: &'a PublishStamps, plan: &ConsumerPlan) -> Self {
        let capacity = plan.frames_total.saturating_sub(plan.warmup).min(1 << 20) as usize;
        Self {
            stamps,
            warmup: plan.warmup,
            latencies_ns: Vec::with_capacity(capacity),
            missing: 0,
            frames: 0,
            measured: 0,
            cpu_start: None,
        }
    }

    /// Called when frame `seq`'s work starts being queued.
    fn started(&mut self, seq: u64) {
        if seq >= self.warmup && self.cpu_start.is_none() {
            self.cpu_start = Some(cpu_ns());
        }
    }

    /// Called when frame `seq`'s verify was seen complete at `done_ns`.
    fn done(&mut self, seq: u64, done_ns: u64) {
        self.frames += 1;
        if seq < self.warmup {
            return;
        }
        self.measured += 1;
        match self.stamps.get(seq) {
            Some(published) => self.latencies_ns.push(done_ns.saturating_sub(published)),
            None => self.missing += 1,
        }
    }

    fn report(self, mismatches: u64) -> ConsumerReport {
        ConsumerReport {
            frames: self.frames,
            measured_frames: self.measured,
            cpu_ns: self.cpu_start.map_or(0, |start| cpu_ns().saturating_sub(start)),
            mismatches,
            latencies_ns: self.latencies_ns,
            missing_stamps: self.missing,
        }
    }
}

struct OursConsumer<'a> {
    plan: &'a ConsumerPlan,
    stamps: &'a PublishStamps,
}

impl GpuBackendVisitor for OursConsumer<'_> {
    type Output = Result<ConsumerReport, ProbeError>;

    fn visit<B: GpuBackend>(self) -> Self::Output {
        let plan = self.plan;
        let gpu = ConsumerGpu::open(plan.device)?;
        let mut consumer = attach::<B>(&gpu.ctx, plan)?;
        let timeout = Duration::from_millis(plan.frame_timeout_ms);
        let mut clock = CompletionClock::new(&gpu.ctx, IN_FLIGHT)?;
        let mut window = Window::new(self.stamps, plan);
        // Paced, the next frame is not due for a while: see each frame's completion before waiting for it.
        let paced = matches!(plan.spec, RowSpec::Paced { .. });
        while consumer.next_sequence() < plan.frames_total {
            let frame = consumer.next_frame(Some(&gpu.stream), timeout).map_err(frame_error)?;
            let seq = frame.seq().0;
            window.started(seq);
            let span = consumer.frame_span(&frame).map_err(frame_error)?;
            let expected = plan.expect_xor.map_or(seq, |mask| xor_sequence(seq, mask));
            gpu.kernels.verify(&gpu.stream, span, expected, gpu.mismatches.span())?;
            consumer.release(frame, Some(&gpu.stream)).map_err(frame_error)?;
            let mut on_done = |seq: u64, ns: u64| window.done(seq, ns);
            clock.after(seq, &gpu.stream, Instant::now() + timeout, &mut on_done)?;
            if paced {
                clock.finish(Instant::now() + timeout, &mut on_done)?;
            }
        }
        let mut on_done = |seq: u64, ns: u64| window.done(seq, ns);
        clock.finish(Instant::now() + timeout, &mut on_done)?;
        let mismatches = gpu.mismatches()?;
        let report = window.report(mismatches);
        consumer.detach();
        Ok(report)
    }
}

/// Attaches a consumer of the row's ring, retrying while the producer's socket is not there yet (at most 60 s).
pub(crate) fn attach<B: GpuBackend>(ctx: &Context, plan: &ConsumerPlan) -> Result<Consumer<B>, ProbeError> {
    let socket = plan.socket.as_deref().ok_or_else(|| ProbeError::Missing("no rendezvous socket given"))?;
    let options = AttachOptions { name: format!("bench-consumer-{}", plan.index), ..AttachOptions::default() };
    let attach_deadline = Instant::now() + Duration::from_secs(60);
    loop {
        match Consumer::<B>::attach(ctx, socket, &options) {
            Ok(c) => return Ok(c),
            Err(FrameError::Wire(WireError::NoProducer { .. })) if Instant::now() < attach_deadline => {
                std::thread::sleep(Duration::from_millis(10));
            }
            Err(e) => return Err(frame_error(e)),
        }
    }
}

fn frame_error(e: FrameError) -> ProbeError {
    ProbeError::Frames(e)
}

/// A study design's consumer: waits for the flag, brings the frame in (designs a and b) or reads it in place
/// (mapped zero-copy: in host memory; c and d: in the producer's device buffer), verifies it, synchronises, and
/// says it is done.
fn study_consumer(
    plan: &ConsumerPlan,
    design: StudyDesign,
    setup: &Setup,
    mut fds: Vec<OwnedFd>,
    stamps: &PublishStamps,
    channel: &Channel,
) -> Result<ConsumerReport, ProbeError> {
    let gpu = ConsumerGpu::open(plan.device)?;
    if fds.is_empty() {
        return Err(ProbeError::Missing("the producer sent no flag memfd"));
    }
    let flags = StudyFlags::open(fds.remove(0))?;
    let bytes = usize::try_from(plan.frame_bytes).map_err(|_| ProbeError::Other("frame too large".into()))?;
    // Where the verify reads: our own device copy (a, b) or the producer's buffer in place (c, d).
    let mut own_copy = None;
    let mut host = None;
    let mut registration = None;
    let mut imported = None;
    if design.in_host_memory() {
        if fds.is_empty() {
            return Err(ProbeError::Missing("the producer sent no host frame buffer"));
        }
        let memory = Arc::new(SharedMemory::from_fd(fds.remove(0), bytes)?);
        if design.pinned() {
            registration = Some(HostRegistration::new(&gpu.ctx, Arc::clone(&memory))?);
        }
        host = Some(memory);
    } else {
        let handle = setup.handle.as_ref().ok_or_else(|| ProbeError::Missing("no device buffer handle sent"))?;
        imported = Some(ImportedRegion::import(&gpu.ctx, handle, None)?);
    }
    if design.through_host() {
        own_copy = Some(DeviceBuffer::alloc(&gpu.ctx, plan.frame_bytes)?);
    }
    let frame = match (&own_copy, &registration, &imported) {
        (Some(buffer), _, _) => buffer.span(),
        (None, Some(mapped), _) => mapped.span(),
        (None, None, Some(region)) => region.span(),
        (None, None, None) => return Err(ProbeError::Missing("no frame buffer")),
    }
    .slice(0, plan.frame_bytes)?;
    channel.send(&ConsumerMessage::Ready, Vec::new())?;
    let nap = design.poll_interval();
    let timeout = Duration::from_millis(plan.frame_timeout_ms);
    let mut window = Window::new(stamps, plan);
    let result = (|| -> Result<(), ProbeError> {
        for seq in 0..plan.frames_total {
            if design.through_host() {
                flags.wait(flag::READY, 1, true, nap, timeout)?;
            } else {
                flags.wait(flag::PUBLISHED, seq + 1, false, nap, timeout)?;
            }
            window.started(seq);
            match (&host, &registration) {
                // Mapped zero-copy: the verify reads the host memory in place.
                _ if !design.through_host() => {}
                (Some(_), Some(pinned)) => {
                    frame.copy_from_async(&pinned.span().slice(0, plan.frame_bytes)?, &gpu.stream)?;
                    gpu.stream.synchronize()?;
                }
                // Synchronous, DMA included (see `copy_from_host_memory`), as the study's cudaMemcpy before a
                // default-stream kernel was.
                (Some(memory), None) => frame.copy_from_host_memory(memory.as_ref(), 0)?,
                _ => {}
            }
            if design.through_host() {
                // The staging buffer is free again; the verify reads our own copy.
                flags.word(flag::READY).store(0, Ordering::Release);
            }
            gpu.kernels.verify(&gpu.stream, frame, seq, gpu.mismatches.span())?;
            gpu.stream.synchronize()?;
            window.done(seq, monotonic_ns());
            flags.word(flag::CONSUMED).store(seq + 1, Ordering::Release);
        }
        Ok(())
    })();
    if let Err(e) = result {
        flags.abort();
        return Err(e);
    }
    let mismatches = gpu.mismatches()?;
    drop(registration);
    Ok(window.report(mismatches))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn plan(frames_total: u64, warmup: u64) -> ConsumerPlan {
        ConsumerPlan {
            spec: RowSpec::SingleProcess,
            device: 0,
            frame_bytes: 24_883_200,
            frames_total,
            warmup,
            socket: None,
            index: 0,
            frame_timeout_ms: 1000,
            expect_xor: None,
        }
    }

    #[test]
    fn the_window_measures_only_after_the_warm_up_against_the_publish_stamps() {
        let stamps = PublishStamps::create().unwrap();
        for seq in 0..10 {
            stamps.record(seq, 1_000 + seq * 100);
        }
        let mut window = Window::new(&stamps, &plan(12, 2));
        for seq in 0..12 {
            window.started(seq);
            window.done(seq, 1_050 + seq * 100);
        }
        let report = window.report(0);
        assert_eq!(report.frames, 12);
        assert_eq!(report.measured_frames, 10);
        // Frames 2..10 were stamped (50 ns each); 10 and 11 were not.
        assert_eq!(report.latencies_ns, vec![50; 8]);
        assert_eq!(report.missing_stamps, 2);
        assert_eq!(report.mismatches, 0);
    }

    #[test]
    fn a_consumer_done_before_the_stamp_counts_zero_not_a_wrapped_value() {
        let stamps = PublishStamps::create().unwrap();
        stamps.record(0, 5_000);
        let mut window = Window::new(&stamps, &plan(1, 0));
        window.done(0, 4_000);
        assert_eq!(window.report(3).latencies_ns, vec![0]);
    }

    #[test]
    fn plans_and_messages_round_trip_as_json() {
        let p = plan(100, 10);
        let back: ConsumerPlan = serde_json::from_value(serde_json::to_value(&p).unwrap()).unwrap();
        assert_eq!((back.frames_total, back.warmup, back.spec), (100, 10, RowSpec::SingleProcess));
        let ready = serde_json::to_value(&ConsumerMessage::Ready).unwrap();
        assert_eq!(ready, serde_json::json!({"message": "ready"}));
        assert!(ready.get("error").is_none(), "never mistaken for a ChildFailure");
    }
}
