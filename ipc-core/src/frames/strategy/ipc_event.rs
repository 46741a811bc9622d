//! `IpcEvent`: CUDA IPC events say when the GPU work behind a counter is done.
//!
//! The producer records a "published" event per slot after its frame's work and then stores `published`; each
//! consumer records its own "released" event per slot after its reads and then stores `released`. The waiting side
//! sees the counter on the CPU, then polls the event on the CPU (never makes a stream wait on it: an event
//! recorded by a process that dies before its work completes never completes, and a stream waiting on it could
//! never be freed). The offer carries `2 * slots` handles: the slots' published events, then the released events
//! made for that consumer's record.

use std::time::Instant;

use super::cpu::wait_reusable;
use super::{ConsumerShared, ConsumerSide, ProducerSide, Setup, Strategy, need_cuda, need_stream};
use crate::driver::{Context, Event, EventFlags, IpcEventHandle, Stream};
use crate::frames::{FrameError, wait_for_event};
use crate::ring::layout::ConsumerState;
use crate::ring::{ConsumerId, ProducerControl, Sequence, SlotIndex, WaitMode};
use crate::wire::SyncStrategy;

const KIND: SyncStrategy = SyncStrategy::IpcEvent;

// The offer of the deepest ring (2 handles per slot, a tensor of the most dimensions, with strides) fits one message:
// at 256 slots, 512 handles of 64 bytes, about half the payload limit.
const _: () = {
    use crate::ring::layout::MAX_SLOTS;
    use crate::wire::{IPC_HANDLE_BYTES, MAX_PAYLOAD_BYTES, MAX_TENSOR_DIMS, RING_OFFER_V2_FIXED_BYTES};
    let shape_and_strides = 2 * 8 * MAX_TENSOR_DIMS;
    let handles = 2 * MAX_SLOTS as usize * IPC_HANDLE_BYTES;
    assert!(RING_OFFER_V2_FIXED_BYTES + shape_and_strides + handles <= MAX_PAYLOAD_BYTES as usize);
};

/// The `IpcEvent` strategy.
pub(crate) struct IpcEvent;

impl Strategy for IpcEvent {
    fn kind(&self) -> SyncStrategy {
        KIND
    }

    fn check(&self, cuda: Option<&Context>) -> Result<(), FrameError> {
        need_cuda(KIND, cuda).map(|_| ())
    }

    fn producer(&self, setup: Setup<'_>) -> Result<Box<dyn ProducerSide>, FrameError> {
        let cuda = need_cuda(KIND, setup.cuda)?;
        let published =
            (0..setup.slots).map(|_| Event::new(cuda, EventFlags::INTERPROCESS)).collect::<Result<Vec<_>, _>>()?;
        Ok(Box::new(EventProducer {
            ctx: cuda.clone(),
            slots: setup.slots,
            last_published: None,
            published,
            released: (0..setup.max_consumers).map(|_| None).collect(),
        }))
    }

    fn consumer(&self, setup: Setup<'_>, event_handles: &[[u8; 64]]) -> Result<Box<dyn ConsumerSide>, FrameError> {
        let cuda = need_cuda(KIND, setup.cuda)?;
        let slots = setup.slots as usize;
        if event_handles.len() != 2 * slots {
            return Err(FrameError::Config(format!(
                "expected {} IPC event handles, got {}",
                2 * slots,
                event_handles.len()
            )));
        }
        let mut published =
            event_handles.iter().map(|h| Event::open_ipc(cuda, IpcEventHandle(*h))).collect::<Result<Vec<_>, _>>()?;
        let released = published.split_off(slots);
        Ok(Box::new(EventConsumer { published, released }))
    }
}

/// One "published" event per slot; per consumer record, the consumer it was offered to and one "released" event
/// per slot (made with the offer, so they exist before that consumer can release anything).
struct EventProducer {
    ctx: Context,
    slots: u32,
    /// The slot whose published event was recorded last, for teardown.
    last_published: Option<usize>,
    published: Vec<Event>,
    released: Vec<Option<(ConsumerId, Vec<Event>)>>,
}

impl ProducerSide for EventProducer {
    fn wait_slot_free(
        &mut self,
        ring: &ProducerControl,
        seq: u64,
        stream: Option<&Stream>,
        deadline: Instant,
    ) -> Result<(), FrameError> {
        need_stream(stream, KIND)?;
        wait_reusable(ring, seq, WaitMode::Spin, deadline)?;
        // The counter says a consumer recorded its release event; the event says its reads are done.
        let slot = ring.slot_for(Sequence(seq)).0 as usize;
        let block = ring.block();
        // Every consumer offered the ring, attached or still finishing its handshake: one that is not live any
        // more (gone, or its handshake failed) no longer reads anything.
        for (id, events) in self.released.iter().flatten() {
            if let Some(event) = events.get(slot) {
                let alive = || block.consumer_state(id.index()) == Some((ConsumerState::Live, id.epoch()));
                let what = || format!("consumer {} to finish reading its frame in slot {slot}", id.index());
                match wait_for_event(event, deadline, None, alive, what) {
                    Ok(()) | Err(FrameError::PeerGone) => {}
                    Err(e) => return Err(e),
                }
            }
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
        self.published[slot as usize].record(stream)?;
        self.last_published = Some(slot as usize);
        Ok(ring.publish(Sequence(seq))?)
    }

    fn settle(&mut self, deadline: Instant) -> bool {
        // The frames' work is what a consumer still reading them needs complete; events are polled, never waited.
        self.last_published.and_then(|slot| self.published.get(slot)).is_none_or(|event| {
            wait_for_event(event, deadline, None, || true, || "the last frame's work".to_owned()).is_ok()
        })
    }

    fn offer_event_handles(&mut self, id: ConsumerId) -> Result<Vec<[u8; 64]>, FrameError> {
        let fresh =
            (0..self.slots).map(|_| Event::new(&self.ctx, EventFlags::INTERPROCESS)).collect::<Result<Vec<_>, _>>()?;
        let mut handles = Vec::with_capacity(2 * fresh.len());
        for event in self.published.iter().chain(fresh.iter()) {
            handles.push(event.ipc_handle()?.0);
        }
        if let Some(record) = self.released.get_mut(id.index() as usize) {
            *record = Some((id, fresh));
        }
        Ok(handles)
    }

    fn drain(&mut self, stream: Option<&Stream>, deadline: Instant) -> Result<(), FrameError> {
        let stream = need_stream(stream, KIND)?;
        super::cpu::StreamFence::new(WaitMode::Spin).wait(stream, deadline)
    }
}

struct EventConsumer {
    published: Vec<Event>,
    released: Vec<Event>,
}

impl ConsumerSide for EventConsumer {
    fn wait_frame(
        &mut self,
        shared: &ConsumerShared,
        seq: Sequence,
        slot: SlotIndex,
        stream: Option<&Stream>,
        deadline: Instant,
    ) -> Result<(), FrameError> {
        need_stream(stream, KIND)?;
        shared.wait_published(seq, WaitMode::Spin, deadline)?;
        wait_for_event(
            &self.published[slot.0 as usize],
            deadline,
            None,
            || !shared.hung_up(),
            || format!("the producer to finish writing frame {}", seq.0),
        )
        .map_err(|e| match e {
            FrameError::PeerGone => shared.gone("it died while the frame was being written"),
            other => other,
        })
    }

    fn release(
        &mut self,
        shared: &ConsumerShared,
        seq: Sequence,
        slot: SlotIndex,
        stream: Option<&Stream>,
        _gpu_deadline: Instant,
    ) -> Result<(), FrameError> {
        // Record first, then store: the producer polls the event only after it sees the counter.
        self.released[slot.0 as usize].record(need_stream(stream, KIND)?)?;
        shared.ring.release(seq).map_err(|e| shared.map_ring(e, "release"))
    }
}
