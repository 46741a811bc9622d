//! `GpuStreamOps`: the GPU does the waiting. `cuStreamWaitValue64` on the control block's counters (registered
//! for the device) holds the caller's stream until a frame is published or released; `cuStreamWriteValue64`
//! stores the counter after the stream's work. No CPU in the per-frame path: calls return once work is queued,
//! and the run-ahead bound keeps the CPU at most `2 * slots` frames ahead of the stream.

use std::time::Instant;

use super::{ConsumerShared, ConsumerSide, ProducerSide, Setup, Strategy, need_cuda, need_stream, unavailable};
use crate::driver::{Context, HostRegistration, Stream, WaitCondition, sys};
use crate::frames::FrameError;
use crate::frames::run_ahead::RunAhead;
use crate::ring::layout::{ControlBlockLayout, published_offset, released_offset};
use crate::ring::{ConsumerId, ProducerControl, ReleaseRequirement, RingError, Sequence, SlotIndex};
use crate::sys::shm::SharedObject;
use crate::wire::SyncStrategy;

const KIND: SyncStrategy = SyncStrategy::GpuStreamOps;

/// The `GpuStreamOps` strategy.
pub(crate) struct GpuStreamOps;

impl Strategy for GpuStreamOps {
    fn kind(&self) -> SyncStrategy {
        KIND
    }

    fn gpu_writes_counters(&self) -> bool {
        true
    }

    fn check(&self, cuda: Option<&Context>) -> Result<(), FrameError> {
        let cuda = need_cuda(KIND, cuda)?;
        let device = cuda.device();
        // The ring's counters are 64-bit: 32-bit stream operations would compare only their low halves.
        let ops = device.flag(sys::CU_DEVICE_ATTRIBUTE_CAN_USE_64_BIT_STREAM_MEM_OPS)?;
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
            registration: HostRegistration::new(cuda, setup.block)?,
            run_ahead: RunAhead::new(cuda, 2 * setup.slots as usize)?,
            pending: Vec::new(),
            done_below: 0,
        }))
    }

    fn consumer(&self, setup: Setup<'_>, _events: &[[u8; 64]]) -> Result<Box<dyn ConsumerSide>, FrameError> {
        let cuda = need_cuda(KIND, setup.cuda)?;
        Ok(Box::new(GpuConsumer {
            registration: HostRegistration::new(cuda, setup.block)?,
            run_ahead: RunAhead::new(cuda, 2 * setup.slots as usize)?,
        }))
    }
}

struct GpuProducer {
    registration: HostRegistration<SharedObject<ControlBlockLayout>>,
    run_ahead: RunAhead,
    pending: Vec<ReleaseRequirement>,
    /// Every frame below this has gone through the producer's stream.
    done_below: u64,
}

impl ProducerSide for GpuProducer {
    fn wait_slot_free(
        &mut self,
        ring: &ProducerControl,
        seq: u64,
        stream: Option<&Stream>,
        deadline: Instant,
    ) -> Result<(), FrameError> {
        let stream = need_stream(stream, KIND)?;
        self.run_ahead.before(seq, deadline)?;
        // Frame `seq - depth` and all before it have gone through the stream.
        self.done_below = self.done_below.max((seq + 1).saturating_sub(self.run_ahead.depth()));
        loop {
            self.pending.clear();
            match ring.pending_releases(Sequence(seq), &mut self.pending) {
                Ok(()) => break,
                Err(RingError::JoinInProgress { .. }) if Instant::now() < deadline => std::thread::yield_now(),
                Err(e) => return Err(e.into()),
            }
        }
        for need in &self.pending {
            self.registration.wait_value_u64(stream, need.offset, need.at_least, WaitCondition::AtLeast)?;
        }
        if !self.pending.is_empty() {
            // Marks the waits, so that teardown can tell when the stream is past them (see `settle`).
            self.run_ahead.mark_tail(stream)?;
        }
        Ok(())
    }

    fn publish(
        &mut self,
        ring: &ProducerControl,
        seq: u64,
        slot: u32,
        stream: Option<&Stream>,
        _gpu_deadline: Instant,
    ) -> Result<(), FrameError> {
        let stream = need_stream(stream, KIND)?;
        self.registration.write_value_u64(stream, published_offset(SlotIndex(slot)), Sequence(seq).done_value())?;
        self.run_ahead.after(seq, stream)?;
        Ok(ring.advance(Sequence(seq))?)
    }

    fn record_reusable(&self, left_at: u64) -> bool {
        // The stream may still hold waits on the record's counters, queued before the consumer left; a new owner
        // starts them at 0, which would hold the stream forever.
        left_at <= self.done_below
    }

    fn holding_up(&self, ring: &ProducerControl, seq: u64, out: &mut Vec<ConsumerId>) {
        // The stream is stuck behind a wait queued for some frame in flight: whoever has not released for any of
        // them holds it up.
        let mut pending = Vec::new();
        for s in self.done_below..=seq {
            pending.clear();
            if ring.pending_releases(Sequence(s), &mut pending).is_ok() {
                out.extend(pending.iter().map(|p| p.consumer));
            }
        }
        out.sort_by_key(|id| id.to_u64());
        out.dedup();
    }

    fn drain(&mut self, stream: Option<&Stream>, deadline: Instant) -> Result<(), FrameError> {
        // The stream holds the waits for the consumers' releases: bounded, since a consumer may be stuck.
        self.run_ahead.drain(need_stream(stream, KIND)?, deadline)
    }

    fn settle(&mut self, deadline: Instant) -> bool {
        self.run_ahead.settle(deadline).is_ok()
    }
}

struct GpuConsumer {
    registration: HostRegistration<SharedObject<ControlBlockLayout>>,
    run_ahead: RunAhead,
}

impl ConsumerSide for GpuConsumer {
    fn wait_frame(
        &mut self,
        _shared: &ConsumerShared,
        seq: Sequence,
        slot: SlotIndex,
        stream: Option<&Stream>,
        deadline: Instant,
    ) -> Result<(), FrameError> {
        let stream = need_stream(stream, KIND)?;
        self.run_ahead.before(seq.0, deadline)?;
        self.registration.wait_value_u64(stream, published_offset(slot), seq.done_value(), WaitCondition::AtLeast)?;
        // Marks the wait, so that teardown can tell when the stream is past it (see `settle`).
        Ok(self.run_ahead.mark_tail(stream)?)
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
        let offset = released_offset(shared.ring.id().index(), slot);
        self.registration.write_value_u64(stream, offset, seq.done_value())?;
        self.run_ahead.after(seq.0, stream)?;
        // The stream's wait for this frame may have been satisfied by the poison written when the producer
        // died, not by the frame: say so, so the caller discards what it computed from it.
        if shared.hung_up() && !shared.published_before_hang_up(seq.0) {
            return Err(shared.gone(format!(
                "it died before it published frame {}: what was computed from that frame is garbage",
                seq.0
            )));
        }
        Ok(())
    }

    fn settle(&mut self, deadline: Instant) -> bool {
        self.run_ahead.settle(deadline).is_ok()
    }
}
