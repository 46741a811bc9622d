//! The consumer side of a row, run in a `gpu-ipc helper` process with role `bench-consumer`: it reads and
//! verifies every frame on the GPU and reports its latencies, CPU time and mismatches. (The three-stage rows' middle
//! stage is `bench-stage`, [`super::stage`].)

use std::os::fd::OwnedFd;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use gpu_ipc::GpuBackendVisitor;
use gpu_ipc::core::backend::GpuBackend;
use gpu_ipc::core::frames::{AttachOptions, Consumer, FrameError};
use gpu_ipc::core::shm::SharedMemory;
use gpu_ipc::core::wire::WireError;
use gpu_ipc::driver::{Context, DeviceBuffer, DeviceMemory, HostRegistration};
use gpu_ipc::kernels::pattern::xor_sequence;

use super::results::ConsumerReport;
use super::rows::{RowSpec, StudyDesign};
use super::shared::{CompletionClock, PublishStamps, StudyFlags, cpu_ns, flag, monotonic_ns};
use super::tasks::{ConsumerMessage, ConsumerPlan, Setup};
use harness::MeasurementError;
use harness::child::Channel;
use harness::gpu::GpuSetup;
use harness::regions::ImportedRegion;

/// Frames a consumer may have queued before it waits for the oldest to finish (the completion clock's depth): above
/// the deepest run-ahead of the library (2 x 256 slots), so that the clock never holds the consumer back or spins
/// where the library itself would not.
const IN_FLIGHT: usize = 4 * gpu_ipc::core::ring::layout::MAX_SLOTS as usize;

/// What every consumer sets up: the GPU set-up, and a count of mismatched words for the verify kernels.
pub(crate) struct ConsumerGpu {
    pub(crate) setup: GpuSetup,
    /// The verify kernels' count of mismatched words.
    pub(crate) mismatches: DeviceBuffer,
}

impl ConsumerGpu {
    pub(crate) fn open(device: i32) -> Result<Self, MeasurementError> {
        let setup = GpuSetup::open(device)?;
        let mismatches = DeviceBuffer::alloc(setup.context(), 8)?;
        mismatches.write(0, &[0u64])?;
        Ok(Self { setup, mismatches })
    }

    pub(crate) fn mismatches(&self) -> Result<u64, MeasurementError> {
        self.setup.stream().synchronize()?;
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
            gpu_done_ns: Vec::new(),
        }
    }
}

/// The consumer of our rows (and of the three-stage and paced rows): attaches, verifies every frame, reports.
pub(crate) struct OursConsumer<'a> {
    pub(crate) plan: &'a ConsumerPlan,
    pub(crate) stamps: &'a PublishStamps,
}

impl GpuBackendVisitor for OursConsumer<'_> {
    type Output = Result<ConsumerReport, MeasurementError>;

    fn visit<B: GpuBackend>(self) -> Self::Output {
        let plan = self.plan;
        let gpu = ConsumerGpu::open(plan.device)?;
        let mut consumer = attach::<B>(gpu.setup.context(), plan)?;
        let timeout = Duration::from_millis(plan.frame_timeout_ms);
        let mut clock = CompletionClock::new(gpu.setup.context(), IN_FLIGHT)?;
        let mut window = Window::new(self.stamps, plan);
        // Paced, the next frame is not due for a while: see each frame's completion before waiting for it.
        let paced = matches!(plan.spec, RowSpec::Paced { .. });
        while consumer.next_sequence() < plan.frames_total {
            let frame = consumer.next_frame(Some(gpu.setup.stream()), timeout).map_err(MeasurementError::Frames)?;
            let seq = frame.seq().0;
            window.started(seq);
            let span = consumer.frame_span(&frame).map_err(MeasurementError::Frames)?;
            let expected = plan.expect_xor.map_or(seq, |mask| xor_sequence(seq, mask));
            gpu.setup.kernels().verify(gpu.setup.stream(), span, expected, gpu.mismatches.span())?;
            consumer.release(frame, Some(gpu.setup.stream())).map_err(MeasurementError::Frames)?;
            let mut on_done = |seq: u64, ns: u64| window.done(seq, ns);
            clock.after(seq, gpu.setup.stream(), Instant::now() + timeout, &mut on_done)?;
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
pub(crate) fn attach<B: GpuBackend>(ctx: &Context, plan: &ConsumerPlan) -> Result<Consumer<B>, MeasurementError> {
    let socket = plan.socket.as_deref().ok_or_else(|| MeasurementError::Missing("no rendezvous socket given"))?;
    let options = AttachOptions { name: format!("bench-consumer-{}", plan.index), ..AttachOptions::default() };
    let attach_deadline = Instant::now() + Duration::from_secs(60);
    loop {
        match Consumer::<B>::attach(ctx, socket, &options) {
            Ok(c) => return Ok(c),
            Err(FrameError::Wire(WireError::NoProducer { .. })) if Instant::now() < attach_deadline => {
                std::thread::sleep(Duration::from_millis(10));
            }
            Err(e) => return Err(MeasurementError::Frames(e)),
        }
    }
}

/// A study design's consumer: waits for the flag, brings the frame in (designs a and b) or reads it in place
/// (mapped zero-copy: in host memory; c and d: in the producer's device buffer), verifies it, synchronises, and
/// says it is done.
pub(crate) fn study_consumer(
    plan: &ConsumerPlan,
    design: StudyDesign,
    setup: &Setup,
    mut fds: Vec<OwnedFd>,
    stamps: &PublishStamps,
    channel: &Channel,
) -> Result<ConsumerReport, MeasurementError> {
    let gpu = ConsumerGpu::open(plan.device)?;
    if fds.is_empty() {
        return Err(MeasurementError::Missing("the producer sent no flag memfd"));
    }
    let flags = StudyFlags::open(fds.remove(0))?;
    let bytes = usize::try_from(plan.frame_bytes).map_err(|_| MeasurementError::Other("frame too large".into()))?;
    // Where the verify reads: our own device copy (a, b) or the producer's buffer in place (c, d).
    let mut own_copy = None;
    let mut host = None;
    let mut registration = None;
    let mut imported = None;
    if design.in_host_memory() {
        if fds.is_empty() {
            return Err(MeasurementError::Missing("the producer sent no host frame buffer"));
        }
        let memory = Arc::new(SharedMemory::from_fd(fds.remove(0), bytes)?);
        if design.pinned() {
            registration = Some(HostRegistration::new(gpu.setup.context(), Arc::clone(&memory))?);
        }
        host = Some(memory);
    } else {
        let handle = setup.handle.as_ref().ok_or_else(|| MeasurementError::Missing("no device buffer handle sent"))?;
        imported = Some(ImportedRegion::import(gpu.setup.context(), handle, None)?);
    }
    if design.through_host() {
        own_copy = Some(DeviceBuffer::alloc(gpu.setup.context(), plan.frame_bytes)?);
    }
    let frame = match (&own_copy, &registration, &imported) {
        (Some(buffer), _, _) => buffer.span(),
        (None, Some(mapped), _) => mapped.span(),
        (None, None, Some(region)) => region.span(),
        (None, None, None) => return Err(MeasurementError::Missing("no frame buffer")),
    }
    .slice(0, plan.frame_bytes)?;
    channel.send(&ConsumerMessage::Ready, Vec::new())?;
    let nap = design.poll_interval();
    let timeout = Duration::from_millis(plan.frame_timeout_ms);
    let mut window = Window::new(stamps, plan);
    let result = (|| -> Result<(), MeasurementError> {
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
                    frame.copy_from_async(&pinned.span().slice(0, plan.frame_bytes)?, gpu.setup.stream())?;
                    gpu.setup.stream().synchronize()?;
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
            gpu.setup.kernels().verify(gpu.setup.stream(), frame, seq, gpu.mismatches.span())?;
            gpu.setup.stream().synchronize()?;
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

    use crate::tasks::tests::plan;

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
}
