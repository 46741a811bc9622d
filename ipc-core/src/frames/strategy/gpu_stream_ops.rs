//! `GpuStreamOps`: the GPU does the waiting. `cuStreamWaitValue64` on the control block's counters (registered
//! for the device) holds the caller's stream until a frame is published or released; `cuStreamWriteValue64`
//! stores the counter after the stream's work. No CPU in the per-frame path: calls return once work is queued,
//! and the run-ahead bound keeps the CPU at most `max(2 * slots, 32)` frames ahead of the stream.
//!
//! CPU cost per frame: each call queues its operations as one `cuStreamBatchMemOp` (the producer's waits for
//! every consumer; the publish write and the run-ahead mark; a consumer's wait; the release write and its mark),
//! and queues nothing when the CPU already sees the counter satisfied. The run-ahead reads the stream's progress
//! from a word of host memory the stream writes: no event per frame. Waits carry no mark (the frame's next mark
//! covers them); a wait left after the last mark at teardown leaks this side's registration of the control block
//! (64 or 128 KiB of page-locked host memory) rather than unregister memory the stream may still poll.

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use super::{ConsumerShared, ConsumerSide, ProducerSide, Setup, Strategy, need_cuda, need_stream, unavailable};
use crate::frames::FrameError;
use crate::resident::{RunAhead, Tail, run_ahead_depth as depth_for};
use crate::ring::{ConsumerId, ProducerControl, ReleaseRequirement, Sequence, SlotIndex};
use crate::shm::SharedMemory;
use crate::wire::SyncStrategy;
use gpu_ipc_driver::{
    Context, DeviceFeature, DeviceMemory, DeviceSpan, HostRegistration, MemOpBatch, MemOpScratch, Stream, WaitCondition,
};

const KIND: SyncStrategy = SyncStrategy::GpuStreamOps;

/// The `GpuStreamOps` strategy.
pub(crate) struct GpuStreamOps;

impl Strategy for GpuStreamOps {
    fn kind(&self) -> SyncStrategy {
        KIND
    }

    fn check(&self, cuda: Option<&Context>) -> Result<(), FrameError> {
        let cuda = need_cuda(KIND, cuda)?;
        let device = cuda.device();
        // The ring's counters are 64-bit: 32-bit stream operations would compare only their low halves.
        let ops = device.supports(DeviceFeature::StreamMemOps64)?;
        if !ops {
            return Err(unavailable(
                KIND,
                "this device or driver does not offer 64-bit stream memory operations \
                 (CU_DEVICE_ATTRIBUTE_CAN_USE_64_BIT_STREAM_MEM_OPS is 0); use ipc-event or cpu-spin, or a newer driver",
            ));
        }
        Ok(())
    }

    fn producer(&self, setup: Setup<'_>) -> Result<Box<dyn ProducerSide>, FrameError> {
        let cuda = need_cuda(KIND, setup.cuda)?;
        Ok(Box::new(GpuProducer {
            registration: Arc::new(HostRegistration::new(cuda, setup.block)?),
            trailing: Vec::new(),
            run_ahead: RunAhead::new(cuda, depth_for(setup.slots))?,
            pending: Vec::new(),
            scratch: MemOpScratch::default(),
            waits: QueuedWaits::new(u64::from(setup.slots)),
        }))
    }

    fn consumer(&self, setup: Setup<'_>, _events: &[[u8; 64]]) -> Result<Box<dyn ConsumerSide>, FrameError> {
        let cuda = need_cuda(KIND, setup.cuda)?;
        Ok(Box::new(GpuConsumer {
            registration: Arc::new(HostRegistration::new(cuda, setup.block)?),
            trailing: Vec::new(),
            run_ahead: RunAhead::new(cuda, depth_for(setup.slots))?,
            scratch: MemOpScratch::default(),
        }))
    }
}

/// The producer's batches of stream waits on consumers' counters that the stream may not have passed yet: what
/// decides when a retired consumer record may be reused, and who holds up the stream.
#[derive(Debug)]
struct QueuedWaits {
    slots: u64,
    /// `(frame, mark)` per batch, oldest first: the batch queued for frame `frame`, which run-ahead mark `mark`
    /// (the next one queued after it) covers.
    batches: VecDeque<(u64, u64)>,
}

impl QueuedWaits {
    fn new(slots: u64) -> Self {
        Self { slots, batches: VecDeque::new() }
    }

    /// Notes the batch of waits queued for `frame`, covered by `mark`.
    fn queued(&mut self, frame: u64, mark: u64) {
        self.batches.push_back((frame, mark));
    }

    /// Forgets the batches the stream has passed (marks only grow, so they are the oldest).
    fn passed(&mut self, progress: u64) {
        while self.batches.front().is_some_and(|&(_, mark)| mark <= progress) {
            self.batches.pop_front();
        }
    }

    /// Whether no wait still queued can be on the counters of a consumer that left when the producer's next
    /// sequence was `left_at`. Waits on its counters were queued while it counted, for frames up to
    /// `left_at + slots - 1` (`Producer::drain` queues the next `slots` frames' waits); later ones never name it.
    fn none_before(&self, left_at: u64, progress: u64) -> bool {
        let last_frame = left_at.saturating_add(self.slots);
        self.batches.iter().all(|&(frame, mark)| frame >= last_frame || mark <= progress)
    }

    /// The oldest frame whose waits the stream may still hold, if any.
    fn oldest_pending(&self, progress: u64) -> Option<u64> {
        self.batches.iter().filter(|&&(_, mark)| mark > progress).map(|&(frame, _)| frame).min()
    }
}

/// This side's registration of the control block, in an `Arc` so that teardown can leak it (see `settle_side`).
type BlockRegistration = Arc<HostRegistration<SharedMemory>>;

/// A wait queued after the last mark, as the CPU can check it: a counter of the control block that must reach
/// `at_least`.
#[derive(Debug, Clone, Copy)]
struct Trailing {
    /// Byte offset of the counter in the control block (from its layout).
    offset: usize,
    at_least: u64,
}

impl Trailing {
    /// Whether the host word the wait names has reached its value (then the stream passes the wait at its next
    /// look, and the wait reads nothing else). A word outside the block never holds.
    fn holds(&self, block: &SharedMemory) -> bool {
        let word = block.words(self.offset / 8, 1).ok().and_then(|words| words.first());
        self.offset.is_multiple_of(8) && word.is_some_and(|w| w.load(Ordering::Acquire) >= self.at_least)
    }
}

/// Teardown of a side: whether the stream is past what the side queued on the ring (`false`: stuck or still
/// waiting; the caller leaks the ring). Waits queued after the last mark (`trailing`) have no mark to tell whether
/// the stream passed them: they are checked on the host, until `deadline`; once every one holds, the stream passes
/// them without touching the ring, but may still poll the control block, so this side's registration of it is
/// leaked (the 64 or 128 KiB control block, page-locked), never unregistered under the stream.
fn settle_side(
    run_ahead: &RunAhead,
    registration: &BlockRegistration,
    trailing: &[Trailing],
    deadline: Instant,
) -> bool {
    match run_ahead.settle(deadline) {
        Ok(Tail::Clear) => true,
        Ok(Tail::UnmarkedWait) => {
            let block = registration.memory();
            while !trailing.iter().all(|t| t.holds(block)) {
                if Instant::now() >= deadline {
                    return false;
                }
                std::thread::sleep(TRAILING_NAP);
            }
            tracing::debug!(
                "GPU-side waits queued after the last mark: leaking this side's control-block registration"
            );
            std::mem::forget(Arc::clone(registration));
            true
        }
        Err(_) => false,
    }
}

/// How often teardown looks at the host words of waits queued after the last mark.
const TRAILING_NAP: Duration = Duration::from_micros(100);

struct GpuProducer {
    registration: BlockRegistration,
    /// The waits queued since the last mark.
    trailing: Vec<Trailing>,
    run_ahead: RunAhead,
    pending: Vec<ReleaseRequirement>,
    scratch: MemOpScratch,
    waits: QueuedWaits,
}

impl ProducerSide for GpuProducer {
    fn wait_slot_free(
        &mut self,
        ring: &ProducerControl,
        seq: Sequence,
        stream: Option<&Stream>,
        deadline: Instant,
    ) -> Result<(), FrameError> {
        let stream = need_stream(stream, KIND)?;
        self.run_ahead.before(seq, deadline)?;
        self.waits.passed(self.run_ahead.progress());
        ring.pending_releases_by(seq, deadline, &mut self.pending)?;
        if self.pending.is_empty() {
            // Every consumer already released the slot's previous frame, as the CPU sees: nothing to queue.
            return Ok(());
        }
        let span = self.registration.span();
        let mut batch = MemOpBatch::new(&mut self.scratch);
        for need in &self.pending {
            batch.wait_u64(&span, need.offset as u64, need.at_least, WaitCondition::AtLeast)?;
        }
        // No mark: the publish's mark covers the waits (see `settle`).
        self.waits.queued(seq.0, self.run_ahead.next_mark());
        self.run_ahead.submit_unmarked(batch, stream)?;
        self.trailing.extend(self.pending.iter().map(|need| Trailing { offset: need.offset, at_least: need.at_least }));
        Ok(())
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
        let span = self.registration.span();
        let mut batch = MemOpBatch::new(&mut self.scratch);
        let offset = ring.block().layout().published_offset(slot);
        batch.write_u64(&span, offset as u64, seq.done_value())?;
        self.run_ahead.submit(batch, stream, Some(seq))?;
        self.trailing.clear();
        Ok(ring.advance(seq)?)
    }

    fn record_reusable(&self, left_at: Sequence) -> bool {
        // The stream may still hold waits on the record's counters, queued before the consumer left; a new owner
        // starts them at 0, which would hold the stream forever.
        self.waits.none_before(left_at.0, self.run_ahead.progress())
    }

    fn holding_up(&self, ring: &ProducerControl, seq: Sequence, out: &mut Vec<ConsumerId>) {
        // The stream is stuck behind a wait queued for some frame in flight: whoever has not released for any of
        // them holds it up.
        let first = self.waits.oldest_pending(self.run_ahead.progress()).map_or(seq.0, |frame| frame.min(seq.0));
        super::holding_up_frames(ring, Sequence(first), seq, out);
    }

    fn drain(&mut self, stream: Option<&Stream>, deadline: Instant) -> Result<(), FrameError> {
        // The stream holds the waits for the consumers' releases: bounded, since a consumer may be stuck.
        self.run_ahead.drain(need_stream(stream, KIND)?, deadline)?;
        self.trailing.clear();
        Ok(())
    }

    fn settle(&mut self, deadline: Instant) -> bool {
        settle_side(&self.run_ahead, &self.registration, &self.trailing, deadline)
    }

    fn control_block(&self) -> Option<DeviceSpan<'_>> {
        Some(self.registration.span())
    }
}

struct GpuConsumer {
    registration: BlockRegistration,
    /// The waits queued since the last mark.
    trailing: Vec<Trailing>,
    run_ahead: RunAhead,
    scratch: MemOpScratch,
}

impl ConsumerSide for GpuConsumer {
    fn wait_frame(
        &mut self,
        shared: &ConsumerShared,
        seq: Sequence,
        slot: SlotIndex,
        stream: Option<&Stream>,
        deadline: Instant,
    ) -> Result<(), FrameError> {
        let stream = need_stream(stream, KIND)?;
        self.run_ahead.before(seq, deadline)?;
        if matches!(shared.ring.is_published(seq), Ok(true)) {
            // Published already, as the CPU sees (an acquire load of the counter the producer's stream wrote after
            // a system-wide memory barrier): work queued from now on reads the frame, as with the CPU strategies.
            return Ok(());
        }
        let offset = shared.ring.block().layout().published_offset(slot);
        let span = self.registration.span();
        let mut batch = MemOpBatch::new(&mut self.scratch);
        batch.wait_u64(&span, offset as u64, seq.done_value(), WaitCondition::AtLeast)?;
        // No mark: the release's mark covers the wait (see `settle`).
        self.run_ahead.submit_unmarked(batch, stream)?;
        self.trailing.push(Trailing { offset, at_least: seq.done_value() });
        Ok(())
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
        let offset = shared.ring.block().layout().released_offset(shared.ring.id().index(), slot);
        let span = self.registration.span();
        let mut batch = MemOpBatch::new(&mut self.scratch);
        batch.write_u64(&span, offset as u64, seq.done_value())?;
        self.run_ahead.submit(batch, stream, Some(seq))?;
        self.trailing.clear();
        // The stream's wait for this frame may have been satisfied by the poison written when the producer
        // died, not by the frame: say so, so the caller discards what it computed from it.
        shared.check_queued_frame(seq)
    }

    fn settle(&mut self, deadline: Instant) -> bool {
        settle_side(&self.run_ahead, &self.registration, &self.trailing, deadline)
    }

    fn control_block(&self) -> Option<DeviceSpan<'_>> {
        Some(self.registration.span())
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn a_trailing_wait_holds_once_its_host_counter_reaches_the_value() {
        use crate::ring::{LivenessPolicy, RingConfig};
        // One ring of each layout: 4 slots (version 1) and 200 (version 2).
        for slot_count in [4, 200] {
            let ring = ProducerControl::create(
                RingConfig { slot_count, max_consumers: 2, generation: 1 },
                LivenessPolicy::default(),
            )
            .unwrap();
            let (block, layout) = (ring.block(), ring.block().layout());
            let published = Trailing { offset: layout.published_offset(SlotIndex(2)), at_least: 5 };
            let released = Trailing { offset: layout.released_offset(1, SlotIndex(3)), at_least: 7 };
            assert!(!published.holds(block.memory()) && !released.holds(block.memory()));
            block.published(SlotIndex(2)).store(5, Ordering::Release);
            block.record_at(1).unwrap().released(SlotIndex(3)).store(crate::ring::POISON, Ordering::Release);
            assert!(published.holds(block.memory()), "reached");
            assert!(released.holds(block.memory()), "poison satisfies every wait");
            assert!(!Trailing { at_least: 6, ..published }.holds(block.memory()));
            // A counter outside the block, or not aligned, never holds.
            assert!(!Trailing { offset: block.memory().len(), at_least: 0 }.holds(block.memory()));
            assert!(!Trailing { offset: 4, at_least: 0 }.holds(block.memory()));
        }
    }

    #[test]
    fn passed_wait_batches_are_forgotten_oldest_first() {
        let mut waits = QueuedWaits::new(2);
        waits.queued(10, 3);
        waits.queued(11, 5);
        waits.queued(12, 7);
        waits.passed(5);
        assert_eq!(waits.batches, [(12, 7)]);
        waits.passed(100);
        assert!(waits.batches.is_empty());
    }

    #[test]
    fn a_record_is_reusable_once_no_wait_queued_while_its_consumer_counted_can_remain() {
        let mut waits = QueuedWaits::new(2);
        // Waits for frames 10..=13 (13 by a drain at next sequence 12), marks 1..=4.
        for (frame, mark) in [(10, 1), (11, 2), (12, 3), (13, 4)] {
            waits.queued(frame, mark);
        }
        // A consumer that left at next sequence 12 may be named by waits up to frame 13.
        assert!(!waits.none_before(12, 3), "frame 13's waits are still queued");
        assert!(waits.none_before(12, 4));
        // One that left at 10 only by waits up to frame 11.
        assert!(!waits.none_before(10, 1));
        assert!(waits.none_before(10, 2));
        // Nothing queued: reusable at once.
        assert!(QueuedWaits::new(2).none_before(0, 0));
    }

    #[test]
    fn the_oldest_pending_frame_is_the_first_whose_mark_the_stream_has_not_passed() {
        let mut waits = QueuedWaits::new(4);
        waits.queued(20, 8);
        waits.queued(21, 9);
        assert_eq!(waits.oldest_pending(7), Some(20));
        assert_eq!(waits.oldest_pending(8), Some(21));
        assert_eq!(waits.oldest_pending(9), None);
    }
}
