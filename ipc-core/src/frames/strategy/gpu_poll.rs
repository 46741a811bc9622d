//! `GpuPoll`: the GPU does the waiting, in a kernel. A one-thread kernel queued on the caller's stream polls the
//! ring's counters until a frame is published or released, and another stores the counter after the stream's work
//! (`kernels/cuda/ring_poll.cu`). The counters are the control block's (registered for the device, the same words
//! the other strategies use: `ld.acquire.sys` / `st.release.sys`, the rule `gpu-ipc probe coherency` established,
//! docs/kernels.md) and, on the ring's GPU, their copies among the ring's device words ([`device_words`]): the store
//! writes the device copy first (`st.release.gpu`), and the wait polls it (`ld.acquire.gpu`), looking at the control
//! block's copy as the device API does, so a peer that writes only that one (another implementation, a peer GPU, a
//! poison) is still seen. Each kernel also stores the side's run-ahead mark when it is done: no stream memory
//! operation between two kernels. No CPU in the per-frame path: calls return once the kernels are queued, and the
//! run-ahead bound keeps the CPU at most `max(2 * slots, 32)` frames ahead of the stream.
//!
//! Only where MPS runs: without it two processes' kernels never run at the same time, so a kernel that polls for
//! another process's kernel waits out whole time slices (milliseconds per frame). [`Strategy::check`] refuses then.
//!
//! Every poll is bounded by `%globaltimer`: the kernel gives up [`gpu_budget`] after it starts (twice what was left
//! of the caller's timeout, plus a second, so the CPU's own bounded waits and the producer's eviction act first)
//! and stores the outcome, satisfied or gave up, into this side's outcome word for the frame. Giving up also sets
//! the side's abort word, so the polls queued behind it give up at once (teardown sets it too: see `settle`). The
//! CPU reads the outcome words at every call; a poll that gave up means the stream went on without the counter it
//! waited for, so the side fails from then on (a typed error: [`FrameError::ProducerGone`] when the producer is
//! gone, else [`FrameError::GpuWaitGaveUp`], which says to attach or create again). A dead peer's POISON (`2^62`)
//! satisfies every poll (the comparison is unsigned `>=`), so the watchdog still ends them at once.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use super::{ConsumerShared, ConsumerSide, ProducerSide, Setup, Strategy, need_cuda, need_stream, unavailable};
use crate::frames::FrameError;
use crate::resident::{
    ExitWords, RunAhead, device_words, run_ahead_depth as depth_for, select_ring_image as select_image,
};
use crate::ring::layout::{MAX_CONSUMERS, MAX_SLOTS, RingLayout};
use crate::ring::{ConsumerId, ProducerControl, ReleaseRequirement, RingError, Sequence, SlotIndex};
use crate::shm::{SharedMemory, SharedObject};
use crate::wire::SyncStrategy;
use gpu_ipc_driver::image;
use gpu_ipc_driver::mps::MpsEvidence;
use gpu_ipc_driver::{
    Context, DeviceBuffer, DeviceFeature, DeviceMemory, DeviceSpan, Function, HostRegistration, KernelArg,
    LaunchConfig, Module, Stream,
};

const KIND: SyncStrategy = SyncStrategy::GpuPoll;

/// Bit 63 of an outcome word: the poll gave up at its deadline (the low bits are the frame's `seq + 1`).
const TIMED_OUT: u64 = 1 << 63;

/// Outcome words per side: one per frame in flight, and at most `depth_for(MAX_SLOTS)` = `2 * MAX_SLOTS` frames
/// are in flight (512 at 256 slots: 4 KiB, inside the 64 KiB status memfd).
const OUTCOME_WORDS: usize = 2 * MAX_SLOTS as usize;

/// The index of the side's abort word, after the outcome words: non-zero makes every poll give up. It is the first of
/// the exit words the device API reads (`struct gpu_ipc_ring_exit`), whose others stay 0 here: no kernel lease and no
/// survivor's abort word, since a poll ends by itself within its budget.
const ABORT_WORD: usize = OUTCOME_WORDS;

/// Bytes of the status words' memfd: 64 KiB, a whole number of pages on every Linux page size, as
/// `cuMemHostRegister` wants (as for the control block).
const OUTCOME_BYTES: usize = 64 * 1024;

/// What a poll gets beyond twice the caller's remaining time.
const GRACE: Duration = Duration::from_secs(1);

/// The wait kernel (`kernels/cuda/ring_poll.cu`).
const WAIT_KERNEL: &str = "gpu_ipc_ring_wait";
/// The release kernel (`kernels/cuda/ring_poll.cu`).
const RELEASE_KERNEL: &str = "gpu_ipc_ring_release";

/// The `GpuPoll` strategy.
pub(crate) struct GpuPoll;

impl Strategy for GpuPoll {
    fn kind(&self) -> SyncStrategy {
        KIND
    }

    fn check(&self, cuda: Option<&Context>) -> Result<(), FrameError> {
        let cuda = need_cuda(KIND, cuda)?;
        let device = cuda.device();
        let (major, minor) = device.compute_capability()?;
        if select_image((major, minor), false).is_none() {
            return Err(unavailable(
                KIND,
                format!(
                    "its kernels need compute capability 7.5 or newer (ld.acquire.sys, %globaltimer); this device \
                     is {major}.{minor}; use gpu-stream-ops or ipc-event"
                ),
            ));
        }
        for feature in [DeviceFeature::UnifiedAddressing, DeviceFeature::MapHostMemory] {
            if !device.supports(feature)? {
                let name = feature.name();
                return Err(unavailable(
                    KIND,
                    format!(
                        "its kernels read the control block in registered host memory, which this device cannot \
                         address ({name} is 0); use gpu-stream-ops, ipc-event or cpu-spin"
                    ),
                ));
            }
        }
        let evidence = MpsEvidence::gather(device);
        tracing::debug!(?evidence, "gpu-poll: MPS detection");
        mps_verdict(&evidence).map_err(|reason| unavailable(KIND, reason))
    }

    fn producer(&self, setup: Setup<'_>) -> Result<Box<dyn ProducerSide>, FrameError> {
        let cuda = need_cuda(KIND, setup.cuda)?;
        Ok(Box::new(PollProducer { poller: Poller::new(cuda, setup)?, pending: Vec::new(), done_below: 0 }))
    }

    fn consumer(&self, setup: Setup<'_>, _events: &[[u8; 64]]) -> Result<Box<dyn ConsumerSide>, FrameError> {
        let cuda = need_cuda(KIND, setup.cuda)?;
        Ok(Box::new(PollConsumer { poller: Poller::new(cuda, setup)? }))
    }
}

/// `Ok` when MPS runs (or is assumed to); else the reason, with the fix.
fn mps_verdict(evidence: &MpsEvidence) -> Result<(), String> {
    match evidence.why_not() {
        None => Ok(()),
        Some(how) => Err(format!(
            "it needs MPS, and MPS is not running ({how}): without MPS two processes' kernels never run at the same \
             time, so a polling kernel waits out whole time slices; start MPS: nvidia-cuda-mps-control -d, or use \
             gpu-stream-ops"
        )),
    }
}

/// How long a poll may run once it starts, with `left` until the caller's deadline: twice that, plus [`GRACE`].
fn gpu_budget(left: Duration) -> Duration {
    left.checked_mul(2).unwrap_or(Duration::MAX).saturating_add(GRACE)
}

/// The first frame whose poll timed out, among outcome words.
fn first_timed_out(words: impl Iterator<Item = u64>) -> Option<u64> {
    words.filter(|word| word & TIMED_OUT != 0).map(|word| (word & !TIMED_OUT).saturating_sub(1)).min()
}

/// The status words of one side, host memory registered for the device: an outcome word per frame in flight,
/// where each poll stores whether it was satisfied, then the abort word. The CPU side reaches them only as atomics.
type StatusWords = [AtomicU64; OUTCOME_WORDS + ExitWords::WORDS];

const _: () = assert!(size_of::<StatusWords>() <= OUTCOME_BYTES);

/// Words of the waits' choice of copy, one per bit of a wait's mask.
const HOST_FIRST_WORDS: usize = u32::BITS as usize;

/// A zeroed buffer of `words` 64-bit words of device memory.
fn zeroed(cuda: &Context, words: usize) -> Result<DeviceBuffer, FrameError> {
    let buffer = DeviceBuffer::alloc(cuda, 8 * words as u64)?;
    buffer.write(0, &vec![0u64; words])?;
    Ok(buffer)
}

/// Where the counters of a wait or a store are among the ring's device words ([`device_words`]): counter `i` at
/// word `first_word + i * stride_words`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Mirror {
    first_word: u64,
    stride_words: u64,
}

impl Mirror {
    /// `published[slot]`.
    fn published(slot: SlotIndex) -> Self {
        Self { first_word: u64::from(slot.0), stride_words: 0 }
    }

    /// Consumer `consumer`'s `released[slot]`; counter `i` of a wait is consumer `consumer + i`'s.
    fn released(consumer: u32, slot: u32) -> Self {
        let first = device_words::RELEASED + u64::from(consumer) * device_words::RECORD + 8 * u64::from(slot);
        Self { first_word: first / 8, stride_words: device_words::RECORD / 8 }
    }

    /// The device words' address for a kernel whose counters go up to `highest`, or 0 when the ring has none here
    /// (`device_words` 0).
    ///
    /// # Errors
    /// A counter outside the device words.
    fn base(&self, device_words: u64, highest: u64) -> Result<u64, FrameError> {
        if device_words == 0 {
            return Ok(0);
        }
        let last = self.stride_words.checked_mul(highest).and_then(|w| w.checked_add(self.first_word));
        if last.is_none_or(|word| word >= device_words::BYTES / 8) {
            return Err(FrameError::Config(format!(
                "gpu-poll: device word {last:?} is outside the ring's device words"
            )));
        }
        Ok(device_words)
    }
}

/// What both sides share: the kernels, the registered control block, the outcome words, the run-ahead bound.
struct Poller {
    wait: Function,
    release: Function,
    block: HostRegistration<SharedMemory>,
    /// Where the counters are in `block`.
    layout: RingLayout,
    status: HostRegistration<SharedObject<StatusWords>>,
    /// Device address of the ring's device words in this process, 0: none (the waits poll the control block).
    device_words: u64,
    /// The waits' choice of copy per consumer record between launches (`host_first` of the wait kernel).
    host_first: DeviceBuffer,
    run_ahead: RunAhead,
    /// The budget each outcome word's poll was given, for errors.
    budgets: Vec<Duration>,
    /// The first frame whose poll timed out, once seen: the side fails from then on.
    failed: Option<(u64, Duration)>,
}

impl Poller {
    fn new(cuda: &Context, setup: Setup<'_>) -> Result<Self, FrameError> {
        let (major, minor) = cuda.device().compute_capability()?;
        let force_ptx = image::force_ptx_from_env();
        let image = select_image((major, minor), force_ptx).ok_or_else(|| {
            unavailable(KIND, format!("no kernel image for compute capability {major}.{minor}; use gpu-stream-ops"))
        })?;
        let module = Module::load(cuda, image.bytes).map_err(|e| {
            unavailable(
                KIND,
                format!("loading its kernels ({}) failed: {e}; update the driver, or use gpu-stream-ops", image.file),
            )
        })?;
        tracing::debug!(image = image.file, "gpu-poll: ring kernels loaded");
        let depth = depth_for(setup.slots);
        if depth > OUTCOME_WORDS {
            return Err(FrameError::Config(format!(
                "{} slots is more than the {MAX_SLOTS} a ring can have",
                setup.slots
            )));
        }
        let memory = SharedMemory::create("gpu-ipc-poll-status", OUTCOME_BYTES).map_err(RingError::from)?;
        let status = Arc::new(SharedObject::<StatusWords>::new(memory).map_err(RingError::from)?);
        Ok(Self {
            wait: module.function(WAIT_KERNEL)?,
            release: module.function(RELEASE_KERNEL)?,
            block: HostRegistration::new(cuda, setup.block)?,
            layout: setup.layout,
            status: HostRegistration::new(cuda, status)?,
            device_words: setup.device_words,
            host_first: zeroed(cuda, HOST_FIRST_WORDS)?,
            run_ahead: RunAhead::new(cuda, depth)?,
            budgets: vec![Duration::ZERO; depth.max(1)],
            failed: None,
        })
    }

    /// The first frame whose poll timed out, with its budget: from the outcome words of the frames the stream has
    /// passed (the words of frames still queued hold an older frame's outcome, or 0).
    fn timed_out(&mut self) -> Option<(u64, Duration)> {
        if self.failed.is_none() {
            let outcomes = &self.status.memory().get()[..OUTCOME_WORDS];
            let words = outcomes.iter().map(|word| word.load(Ordering::Acquire));
            if let Some(frame) = first_timed_out(words) {
                let budget = self.budgets[(frame % self.run_ahead.depth()) as usize];
                tracing::error!(frame, ?budget, "gpu-poll: a poll kernel gave up at its deadline");
                self.failed = Some((frame, budget));
            }
        }
        self.failed
    }

    /// Queues on `stream` a poll until the 64-bit counters at byte `first_offset + i * stride` of the control
    /// block reach `target`, for every bit `i` of `mask`; frame `seq`'s outcome word records how it ended. `mirror`:
    /// where their copies are among the device words (polled first when the ring has them here).
    #[allow(clippy::too_many_arguments)]
    fn wait(
        &mut self,
        stream: &Stream,
        first_offset: usize,
        stride: usize,
        mirror: Mirror,
        mask: u32,
        target: u64,
        seq: u64,
        deadline: Instant,
    ) -> Result<(), FrameError> {
        let block = self.block.span();
        let words = block.len() / 8;
        let (first_word, stride_words) = (first_offset as u64 / 8, stride as u64 / 8);
        let highest = u64::from(31 - mask.leading_zeros().min(31));
        // The kernel reads only words the mask names: each must be an aligned word of the control block.
        let inside = first_offset.is_multiple_of(8)
            && stride.is_multiple_of(8)
            && stride_words.checked_mul(highest).and_then(|w| w.checked_add(first_word)).is_some_and(|w| w < words);
        if !inside {
            return Err(FrameError::Config(format!(
                "gpu-poll: counters at byte {first_offset} + i * {stride} (mask {mask:#x}) leave the {}-byte \
                 control block",
                block.len()
            )));
        }
        let index = (seq % self.run_ahead.depth()) as usize;
        let status = self.status.span();
        let outcome = status.slice(index as u64 * 8, 8)?;
        let abort = status.slice(ABORT_WORD as u64 * 8, 8 * ExitWords::WORDS as u64)?;
        let budget = gpu_budget(deadline.saturating_duration_since(Instant::now()));
        self.budgets[index] = budget;
        let budget_ns = u64::try_from(budget.as_nanos()).unwrap_or(u64::MAX);
        let copies = mirror.base(self.device_words, highest)?;
        let (progress, mark) = self.run_ahead.kernel_mark()?;
        self.wait.launch_typed(
            stream,
            LaunchConfig::linear(1, 1),
            &[
                KernelArg::Span(block),
                KernelArg::U64(first_word),
                KernelArg::U64(stride_words),
                KernelArg::U32(mask),
                KernelArg::U64(target),
                KernelArg::U64(budget_ns),
                KernelArg::Span(outcome),
                KernelArg::U64(seq + 1),
                KernelArg::Span(abort),
                KernelArg::U64(copies),
                KernelArg::U64(mirror.first_word),
                KernelArg::U64(mirror.stride_words),
                KernelArg::Span(self.host_first.span()),
                KernelArg::Span(progress),
                KernelArg::U64(mark),
            ],
        )?;
        // The kernel stores the mark when it is done: teardown can tell when the stream is past it (see `settle`).
        self.run_ahead.marked(mark, None);
        Ok(())
    }

    /// Makes every poll of this side give up (running or queued, each within about a thousand polls), then waits
    /// until `deadline` for the stream to pass the marks: teardown, after which the side is not used.
    fn abort_and_settle(&self, deadline: Instant) -> bool {
        self.status.memory().get()[ABORT_WORD].store(1, Ordering::Release);
        self.run_ahead.settle(deadline).is_ok()
    }

    /// Queues on `stream`, after its earlier work, a store of `value` into the counter at byte `offset` of the
    /// control block, and first into its copy among the device words (`mirror`, when the ring has them here); the
    /// kernel then stores frame `seq`'s run-ahead mark.
    fn store(
        &self,
        stream: &Stream,
        offset: usize,
        mirror: Mirror,
        value: u64,
        seq: Sequence,
    ) -> Result<(), FrameError> {
        if !offset.is_multiple_of(8) {
            return Err(FrameError::Config(format!("gpu-poll: counter offset {offset} is not 8-byte aligned")));
        }
        let counter = self.block.span().slice(offset as u64, 8)?;
        let copy = match mirror.base(self.device_words, 0)? {
            0 => 0,
            base => base + mirror.first_word * 8,
        };
        let (progress, mark) = self.run_ahead.kernel_mark()?;
        self.release.launch_typed(
            stream,
            LaunchConfig::linear(1, 1),
            &[
                KernelArg::Span(counter),
                KernelArg::U64(value),
                KernelArg::U64(copy),
                KernelArg::Span(progress),
                KernelArg::U64(mark),
            ],
        )?;
        self.run_ahead.marked(mark, Some(seq));
        Ok(())
    }
}

struct PollProducer {
    poller: Poller,
    pending: Vec<ReleaseRequirement>,
    /// Every frame below this has gone through the producer's stream.
    done_below: u64,
}

impl PollProducer {
    /// The side's error once a poll timed out.
    fn check_polls(&mut self) -> Result<(), FrameError> {
        match self.poller.timed_out() {
            None => Ok(()),
            // Not a `Timeout`: `acquire` would take it for a slow consumer and evict.
            Some((frame, waited)) => Err(FrameError::GpuWaitGaveUp {
                what: format!(
                    "the consumers to release the slot of frame {frame} (gpu-poll); the stream went on, so that \
                     frame may have overwritten one a consumer was still reading: create the producer again (and \
                     give acquire a longer timeout)"
                ),
                waited,
            }),
        }
    }
}

impl ProducerSide for PollProducer {
    fn wait_in_slices(&self) -> bool {
        // False: the deadline also sets the polling kernel's time budget on the GPU: a slice would cut that short.
        KIND.traits().waits_in_slices
    }

    fn wait_slot_free(
        &mut self,
        ring: &ProducerControl,
        seq: Sequence,
        stream: Option<&Stream>,
        deadline: Instant,
    ) -> Result<(), FrameError> {
        let stream = need_stream(stream, KIND)?;
        let ahead = self.poller.run_ahead.before(seq, deadline);
        self.check_polls()?;
        ahead?;
        // Frame `seq - depth` and all before it have gone through the stream.
        self.done_below = self.done_below.max((seq.0 + 1).saturating_sub(self.poller.run_ahead.depth()));
        ring.pending_releases_by(seq, deadline, &mut self.pending)?;
        let Some(first) = self.pending.first() else { return Ok(()) };
        // Every pending requirement of one frame is for the same slot and value (the frame the slot held); the
        // consumers' counters are one record apart.
        let (slot, target) = (first.slot, first.at_least);
        debug_assert!(self.pending.iter().all(|p| p.slot == slot && p.at_least == target));
        let mut mask = 0u32;
        for need in &self.pending {
            let index = need.consumer.index();
            if index >= MAX_CONSUMERS || index >= u32::BITS {
                return Err(FrameError::Config(format!("gpu-poll: consumer record {index} is out of range")));
            }
            mask |= 1 << index;
        }
        // Consumer i's counter of the slot is `i` records after consumer 0's.
        let layout = self.poller.layout;
        let first = layout.released_offset(0, slot);
        let mirror = Mirror::released(0, slot.0);
        self.poller.wait(stream, first, layout.record_stride(), mirror, mask, target, seq.0, deadline)
    }

    fn publish(
        &mut self,
        ring: &ProducerControl,
        seq: Sequence,
        slot: SlotIndex,
        stream: Option<&Stream>,
        _gpu_deadline: Instant,
    ) -> Result<(), FrameError> {
        let stream = need_stream(stream, KIND)?;
        let offset = self.poller.layout.published_offset(slot);
        let mirror = Mirror::published(slot);
        self.poller.store(stream, offset, mirror, seq.done_value(), seq)?;
        Ok(ring.advance(seq)?)
    }

    fn record_reusable(&self, left_at: Sequence) -> bool {
        // The stream may still hold polls of the record's counters, queued before the consumer left; a new owner
        // starts them at 0, which would hold the poll until its deadline.
        left_at.0 <= self.done_below
    }

    fn holding_up(&self, ring: &ProducerControl, seq: Sequence, out: &mut Vec<ConsumerId>) {
        // The stream is stuck behind a poll queued for some frame in flight: whoever has not released for any of
        // them holds it up.
        super::holding_up_frames(ring, Sequence(self.done_below.min(seq.0)), seq, out);
    }

    fn drain(&mut self, stream: Option<&Stream>, deadline: Instant) -> Result<(), FrameError> {
        // The stream holds the polls for the consumers' releases: bounded, since a consumer may be stuck.
        self.poller.run_ahead.drain(need_stream(stream, KIND)?, deadline)?;
        self.check_polls()
    }

    fn settle(&mut self, deadline: Instant) -> bool {
        self.poller.abort_and_settle(deadline)
    }

    fn control_block(&self) -> Option<DeviceSpan<'_>> {
        Some(self.poller.block.span())
    }
}

struct PollConsumer {
    poller: Poller,
}

impl PollConsumer {
    /// The side's error once a poll timed out: the producer gone, or a timeout that says to attach again.
    fn check_polls(&mut self, shared: &ConsumerShared) -> Result<(), FrameError> {
        let Some((frame, waited)) = self.poller.timed_out() else { return Ok(()) };
        if shared.hung_up() {
            return Err(shared.gone(format!(
                "its connection hung up; frames from {frame} on may hold partial data (the gpu-poll kernel gave \
                 up waiting for frame {frame})"
            )));
        }
        shared.ring.check_producer().map_err(|e| shared.map_ring(e, &format!("frame {frame}")))?;
        Err(FrameError::GpuWaitGaveUp {
            what: format!(
                "frame {frame} (gpu-poll: twice the caller's timeout plus {GRACE:?}); the stream went on without it, \
                 so frames from {frame} on are not valid: detach and attach again (and give next_frame a longer \
                 timeout)"
            ),
            waited,
        })
    }
}

impl ConsumerSide for PollConsumer {
    fn wait_frame(
        &mut self,
        shared: &ConsumerShared,
        seq: Sequence,
        slot: SlotIndex,
        stream: Option<&Stream>,
        deadline: Instant,
    ) -> Result<(), FrameError> {
        let stream = need_stream(stream, KIND)?;
        let ahead = self.poller.run_ahead.before(seq, deadline);
        self.check_polls(shared)?;
        ahead?;
        let offset = self.poller.layout.published_offset(slot);
        self.poller.wait(stream, offset, 0, Mirror::published(slot), 1, seq.done_value(), seq.0, deadline)
    }

    fn release(
        &mut self,
        shared: &ConsumerShared,
        seq: Sequence,
        slot: SlotIndex,
        stream: Option<&Stream>,
        _gpu_deadline: Instant,
    ) -> Result<(), FrameError> {
        let stream = need_stream(stream, KIND)?;
        let consumer = shared.ring.id().index();
        let offset = self.poller.layout.released_offset(consumer, slot);
        let mirror = Mirror::released(consumer, slot.0);
        self.poller.store(stream, offset, mirror, seq.done_value(), seq)?;
        // The poll for this frame may have been satisfied by the poison written when the producer hung up, not by
        // the frame: say so, so the caller discards what it computed from it.
        shared.check_queued_frame(seq)?;
        self.check_polls(shared)
    }

    fn settle(&mut self, deadline: Instant) -> bool {
        self.poller.abort_and_settle(deadline)
    }

    fn control_block(&self) -> Option<DeviceSpan<'_>> {
        Some(self.poller.block.span())
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn images_follow_the_kernels_crate_rule() {
        let pick = |major, minor| select_image((major, minor), false).map(|image| image.file);
        assert_eq!(pick(9, 0), Some("sm_90.cubin"));
        assert_eq!(pick(8, 7), Some("sm_86.cubin"));
        assert_eq!(pick(10, 3), Some("sm_100.cubin"));
        assert_eq!(pick(11, 0), Some("compute_75.ptx"));
        assert_eq!(pick(7, 0), None);
        assert_eq!(select_image((9, 0), true).map(|image| image.file), Some("compute_75.ptx"));
    }

    #[test]
    fn the_embedded_images_are_what_the_manifest_lists() {
        let images = &crate::resident::RING_IMAGES;
        assert_eq!(images.check_manifest(), Ok(()));
        assert!(images.manifest.contains("\"kernels/cuda/ring_poll.cu\""));
        assert!(images.lists_kernel(RELEASE_KERNEL) && images.lists_kernel(WAIT_KERNEL));
    }

    /// The coherency probe's rule: poll with ld.acquire.sys, publish with st.release.sys, bound by %globaltimer;
    /// and the comparison is unsigned, so POISON (2^62) satisfies every wait.
    #[test]
    fn the_kernels_use_the_rule_the_coherency_probe_established() {
        let ptx = crate::resident::RING_IMAGES.ptx_text();
        let wait = &ptx[ptx.find(&format!(".entry {WAIT_KERNEL}(")).unwrap()..];
        let wait = &wait[..wait[1..].find(".entry").map_or(wait.len(), |end| end + 1)];
        assert!(wait.contains("ld.acquire.sys.global.u64"), "{wait}");
        assert!(wait.contains("%globaltimer"), "{wait}");
        assert!(wait.contains("setp.ge.u64") || wait.contains("setp.lt.u64"), "unsigned comparison: {wait}");
        assert!(wait.contains("st.release.sys.global.u64"), "{wait}");
        // The device words: polled at .gpu scope, stored at .gpu scope before the control block's copy.
        assert!(wait.contains("ld.acquire.gpu.global.u64"), "{wait}");
        let release = &ptx[ptx.find(&format!(".entry {RELEASE_KERNEL}(")).unwrap()..];
        let release = &release[..release[1..].find(".entry").map_or(release.len(), |end| end + 1)];
        let (device, host) = (release.find("st.release.gpu.global.u64"), release.find("st.release.sys.global.u64"));
        assert!(device.zip(host).is_some_and(|(d, h)| d < h), "device copy first: {release}");
    }

    #[test]
    fn mirrors_are_where_the_device_words_keep_each_counter() {
        use crate::resident::device_words::{BYTES, RECORD, RELEASED};
        assert_eq!(Mirror::published(SlotIndex(5)), Mirror { first_word: 5, stride_words: 0 });
        let released = Mirror::released(2, 7);
        assert_eq!(released.first_word * 8, RELEASED + 2 * RECORD + 56);
        assert_eq!(released.stride_words * 8, RECORD);
        assert_eq!(released.base(0, 31).unwrap(), 0, "no device words here: the control block only");
        assert_eq!(released.base(0x1000, 13).unwrap(), 0x1000);
        // Consumer 2 + 14 = 16 is past the last record.
        assert!(released.base(0x1000, 14).is_err());
        assert!(Mirror::published(SlotIndex(255)).base(0x1000, 0).is_ok());
        assert!(Mirror { first_word: BYTES / 8, stride_words: 0 }.base(0x1000, 0).is_err());
    }

    #[test]
    fn outcome_words_name_the_first_timed_out_frame() {
        assert_eq!(first_timed_out([0, 5, 6].into_iter()), None);
        assert_eq!(first_timed_out([8, 9 | TIMED_OUT, 10, 7 | TIMED_OUT].into_iter()), Some(6));
        assert_eq!(first_timed_out([1 | TIMED_OUT].into_iter()), Some(0));
    }

    #[test]
    fn polls_get_twice_the_time_left_plus_the_grace() {
        assert_eq!(gpu_budget(Duration::from_millis(500)), Duration::from_secs(2));
        assert_eq!(gpu_budget(Duration::ZERO), GRACE, "a passed deadline");
        assert_eq!(gpu_budget(Duration::MAX / 2 + Duration::from_secs(1)), Duration::MAX, "saturates");
    }

    fn evidence(assumed: Option<bool>, attribute: Option<bool>, control_pipe: bool) -> MpsEvidence {
        MpsEvidence { assumed, attribute, pipe_directory: std::path::PathBuf::from("/tmp/nvidia-mps"), control_pipe }
    }

    #[test]
    fn without_mps_it_refuses_and_names_the_fix() {
        for refused in
            [evidence(None, None, false), evidence(None, Some(false), false), evidence(Some(false), Some(true), true)]
        {
            let reason = mps_verdict(&refused).unwrap_err();
            assert!(reason.contains("start MPS: nvidia-cuda-mps-control -d, or use gpu-stream-ops"), "{reason}");
            assert!(reason.contains("time slices"), "{reason}");
        }
        assert!(mps_verdict(&evidence(None, None, false)).unwrap_err().contains("/tmp/nvidia-mps/control"));
        assert!(mps_verdict(&evidence(Some(false), None, false)).unwrap_err().contains("GPU_IPC_ASSUME_MPS=0"));
        for found in
            [evidence(None, Some(true), false), evidence(None, Some(false), true), evidence(Some(true), None, false)]
        {
            assert_eq!(mps_verdict(&found), Ok(()), "{found:?}");
        }
    }
}
