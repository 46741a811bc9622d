//! What the CPU strategies share: the CPU polls the control block's counters, spinning or napping.

use std::time::Instant;

use super::{ConsumerShared, ConsumerSide, ProducerSide};
use crate::frames::FrameError;
use crate::ring::{ProducerControl, RingError, Sequence, SlotIndex, WaitMode};
use gpu_ipc_driver::{Event, EventFlags, Stream};

/// Waits on the CPU until frame `seq`'s slot may be rewritten; a consumer found dead meanwhile stops counting.
pub(crate) fn wait_reusable(
    ring: &ProducerControl,
    seq: Sequence,
    mode: WaitMode,
    deadline: Instant,
) -> Result<(), FrameError> {
    loop {
        match ring.wait_reusable(seq, deadline, mode) {
            Ok(()) => return Ok(()),
            // A consumer died while we waited: stop counting it and wait again.
            Err(RingError::ConsumerGone { consumer, .. }) => {
                tracing::info!(consumer = consumer.index(), "consumer gone while the producer waited");
                ring.mark_consumer_dead(consumer)?;
            }
            Err(RingError::Timeout { waiting_for, waited }) => {
                return Err(FrameError::Timeout { what: waiting_for.to_string(), waited });
            }
            Err(e) => return Err(e.into()),
        }
    }
}

/// Waits, until `deadline`, for the work queued on `stream` so far: an event recorded there and polled, because
/// `cuStreamSynchronize` has no timeout. The event is made on first use, in the stream's context.
pub(crate) struct StreamFence {
    event: Option<Event>,
    mode: WaitMode,
}

impl StreamFence {
    pub(crate) fn new(mode: WaitMode) -> Self {
        Self { event: None, mode }
    }

    pub(crate) fn wait(&mut self, stream: &Stream, deadline: Instant) -> Result<(), FrameError> {
        let event = match &mut self.event {
            Some(event) => event,
            slot => {
                let flags = EventFlags { timing: false, blocking_sync: false, interprocess: false };
                slot.insert(Event::new(stream.context(), flags)?)
            }
        };
        event.record(stream)?;
        let nap = match self.mode {
            WaitMode::Spin => None,
            WaitMode::Sleep(d) => Some(d),
        };
        crate::frames::wait_for_event(event, deadline, nap, || true, || "the stream's queued work".to_owned())
    }
}

/// The producer's side of `CpuSpin` and `CpuSleep`.
pub(crate) struct CpuProducer {
    mode: WaitMode,
    fence: StreamFence,
}

impl CpuProducer {
    pub(crate) fn new(mode: WaitMode) -> Self {
        Self { mode, fence: StreamFence::new(mode) }
    }
}

impl ProducerSide for CpuProducer {
    fn wait_slot_free(
        &mut self,
        ring: &ProducerControl,
        seq: Sequence,
        _stream: Option<&Stream>,
        deadline: Instant,
    ) -> Result<(), FrameError> {
        wait_reusable(ring, seq, self.mode, deadline)
    }

    fn publish(
        &mut self,
        ring: &ProducerControl,
        seq: Sequence,
        _slot: SlotIndex,
        stream: Option<&Stream>,
        gpu_deadline: Instant,
    ) -> Result<(), FrameError> {
        if let Some(stream) = stream {
            self.fence.wait(stream, gpu_deadline)?;
        }
        Ok(ring.publish(seq)?)
    }

    fn drain(&mut self, stream: Option<&Stream>, deadline: Instant) -> Result<(), FrameError> {
        // Only our own work is queued (the consumers' releases were awaited on the CPU).
        match stream {
            Some(stream) => self.fence.wait(stream, deadline),
            None => Ok(()),
        }
    }
}

/// A consumer's side of `CpuSpin` and `CpuSleep`.
pub(crate) struct CpuConsumer {
    mode: WaitMode,
    fence: StreamFence,
}

impl CpuConsumer {
    pub(crate) fn new(mode: WaitMode) -> Self {
        Self { mode, fence: StreamFence::new(mode) }
    }
}

impl ConsumerSide for CpuConsumer {
    fn wait_frame(
        &mut self,
        shared: &ConsumerShared,
        seq: Sequence,
        _slot: SlotIndex,
        _stream: Option<&Stream>,
        deadline: Instant,
    ) -> Result<(), FrameError> {
        shared.wait_published(seq, self.mode, deadline)
    }

    fn release(
        &mut self,
        shared: &ConsumerShared,
        seq: Sequence,
        _slot: SlotIndex,
        stream: Option<&Stream>,
        gpu_deadline: Instant,
    ) -> Result<(), FrameError> {
        if let Some(stream) = stream {
            self.fence.wait(stream, gpu_deadline)?;
        }
        shared.ring.release(seq).map_err(|e| shared.map_ring(e, "release"))
    }
}
