//! `IpcEvent`: CUDA IPC events say when the GPU work behind a counter is done.
//!
//! The producer records a "published" event per slot after its frame's work and then stores `published`; each
//! consumer records its own "released" event per slot after its reads and then stores `released`. The waiting side
//! sees the counter on the CPU, then polls the event on the CPU (never makes a stream wait on it: an event
//! recorded by a process that dies before its work completes never completes, and a stream waiting on it could
//! never be freed). The offer carries `2 * slots` handles: the slots' published events, then the released events
//! made for that consumer's record.
//!
//! **Without events.** A consumer in another IPC namespace than the producer (a container's default under Docker
//! and Kubernetes) cannot open them: `cuIpcOpenEventHandle` fails with `CUDA_ERROR_MAP_FAILED`, while the ring's
//! memory imports fine. Such a consumer runs the ring as `CpuSpin` does: it waits for the published counter, and
//! stores `released` only once its own stream has done its reads. It says so at the handshake
//! (`AttachedWithoutEvents`, protocol version 4), and the producer, for it, waits on its released counters alone.
//! Its frames must be done when their counter says published, so the producer stores `published` only after its
//! own published event completed (a CPU poll per frame) from the moment it offers a record until that record's
//! consumer said it opened the events, and for as long as a consumer without events is attached. A producer of an
//! older release cannot do that: the consumer refuses the ring then, with the cause and the fixes
//! (`docs/containers.md`).
//!
//! With the host backend (no CUDA context, no streams) the events are [`HostEvent`]s, complete once recorded:
//! what runs is the strategy's handshake, fallback included.

use std::time::Instant;

use super::cpu::{CpuConsumer, wait_reusable};
use super::{ConsumerShared, ConsumerSide, ProducerSide, Setup, Strategy, need_stream};
use crate::frames::{FrameError, wait_for_event};
use crate::host::HostEvent;
use crate::ring::layout::ConsumerState;
use crate::ring::{ConsumerId, ProducerControl, Sequence, SlotIndex, WaitMode};
use crate::wire::SyncStrategy;
use gpu_ipc_driver::{Context, DriverError, Event, EventFlags, IpcEventHandle, Stream};

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

    fn check(&self, _cuda: Option<&Context>) -> Result<(), FrameError> {
        // Every CUDA backend has IPC events; the host backend has its stand-ins.
        Ok(())
    }

    fn producer(&self, setup: Setup<'_>) -> Result<Box<dyn ProducerSide>, FrameError> {
        let events = Events::of(setup.cuda);
        let published = (0..setup.slots).map(|_| events.create()).collect::<Result<Vec<_>, _>>()?;
        Ok(Box::new(EventProducer {
            events,
            slots: setup.slots,
            last_published: None,
            published,
            released: (0..setup.max_consumers).map(|_| None).collect(),
        }))
    }

    fn consumer(&self, setup: Setup<'_>, event_handles: &[[u8; 64]]) -> Result<Box<dyn ConsumerSide>, FrameError> {
        let events = Events::of(setup.cuda);
        let slots = setup.slots as usize;
        if event_handles.len() != 2 * slots {
            return Err(FrameError::Config(format!(
                "expected {} IPC event handles, got {}",
                2 * slots,
                event_handles.len()
            )));
        }
        match event_handles.iter().map(|h| events.open(h)).collect::<Result<Vec<_>, _>>() {
            Ok(mut published) => {
                let released = published.split_off(slots);
                Ok(Box::new(EventConsumer { events, published, released }))
            }
            Err(DriverError::IpcEventUnreachable) => {
                tracing::warn!(
                    "the producer's IPC events cannot be opened from this process (another IPC namespace: \
                     CUDA_ERROR_MAP_FAILED); running the ring without them, on its counters"
                );
                Ok(Box::new(WithoutEvents(CpuConsumer::new(WaitMode::Spin))))
            }
            Err(e) => Err(e.into()),
        }
    }
}

/// Where this side's events come from: CUDA IPC events, or the host backend's stand-ins.
enum Events {
    Cuda(Context),
    Host,
}

impl Events {
    /// A CUDA backend has a context; only the host backend has none.
    fn of(cuda: Option<&Context>) -> Self {
        cuda.map_or(Self::Host, |ctx| Self::Cuda(ctx.clone()))
    }

    /// A new interprocess event.
    fn create(&self) -> Result<RingEvent, FrameError> {
        Ok(match self {
            Self::Cuda(ctx) => RingEvent::Cuda(Event::new(ctx, EventFlags::INTERPROCESS)?),
            Self::Host => RingEvent::Host(HostEvent),
        })
    }

    /// Opens an event another process exported ([`DriverError::IpcEventUnreachable`] from another IPC namespace).
    fn open(&self, handle: &[u8; 64]) -> Result<RingEvent, DriverError> {
        match self {
            Self::Cuda(ctx) => Event::open_ipc(ctx, IpcEventHandle(*handle)).map(RingEvent::Cuda),
            Self::Host => HostEvent::open_ipc(handle).map(RingEvent::Host),
        }
    }

    /// The stream a CUDA side records on; the host backend has none (its work is done when the call returns).
    fn stream<'s>(&self, stream: Option<&'s Stream>) -> Result<Option<&'s Stream>, FrameError> {
        match self {
            Self::Cuda(_) => need_stream(stream, KIND).map(Some),
            Self::Host => Ok(None),
        }
    }
}

/// One event of the ring.
enum RingEvent {
    Cuda(Event),
    Host(HostEvent),
}

impl RingEvent {
    /// Records the event after the work queued on `stream` (`None` only with the host backend).
    fn record(&self, stream: Option<&Stream>) -> Result<(), FrameError> {
        match (self, stream) {
            (Self::Cuda(event), Some(stream)) => Ok(event.record(stream)?),
            (Self::Cuda(_), None) => need_stream(None, KIND).map(|_| ()),
            (Self::Host(_), _) => Ok(()),
        }
    }

    fn ipc_handle(&self) -> Result<[u8; 64], FrameError> {
        match self {
            Self::Cuda(event) => Ok(event.ipc_handle()?.0),
            Self::Host(_) => Ok(HostEvent::HANDLE),
        }
    }

    /// Polls until the recorded work is done: see [`wait_for_event`].
    fn wait(&self, deadline: Instant, alive: impl Fn() -> bool, what: impl Fn() -> String) -> Result<(), FrameError> {
        match self {
            Self::Cuda(event) => wait_for_event(event, deadline, None, alive, what),
            Self::Host(_) => Ok(()),
        }
    }
}

/// The released events of one consumer record, and whether its consumer uses them.
enum Released {
    /// Offered; its consumer has not said yet whether it could open them.
    Offered(Vec<RingEvent>),
    /// Its consumer opened them: it records one before each `released` store.
    Opened(Vec<RingEvent>),
    /// Its consumer could not open them (`AttachedWithoutEvents`): it stores `released` once its reads are done.
    NotOpened,
}

impl Released {
    /// The events to poll after the counter, if the consumer may use them.
    fn events(&self) -> Option<&[RingEvent]> {
        match self {
            Self::Offered(events) | Self::Opened(events) => Some(events),
            Self::NotOpened => None,
        }
    }
}

/// One "published" event per slot; per consumer record, the consumer it was offered to and its "released" events
/// (made with the offer, so they exist before that consumer can release anything).
struct EventProducer {
    events: Events,
    slots: u32,
    /// The slot whose published event was recorded last, for teardown.
    last_published: Option<usize>,
    published: Vec<RingEvent>,
    released: Vec<Option<(ConsumerId, Released)>>,
}

impl EventProducer {
    /// Whether a live record's consumer may read frames on the published counter alone: one without events, or
    /// one that has not said yet whether it opened them. Then `published` is stored only once the frame is done.
    fn counter_alone_read(&self, ring: &ProducerControl) -> bool {
        let block = ring.block();
        self.released.iter().flatten().any(|(id, released)| {
            !matches!(released, Released::Opened(_))
                && block.consumer_state(id.index()) == Some((ConsumerState::Live, id.epoch()))
        })
    }
}

impl ProducerSide for EventProducer {
    fn wait_slot_free(
        &mut self,
        ring: &ProducerControl,
        seq: Sequence,
        stream: Option<&Stream>,
        deadline: Instant,
    ) -> Result<(), FrameError> {
        self.events.stream(stream)?;
        wait_reusable(ring, seq, WaitMode::Spin, deadline)?;
        // The counter says a consumer recorded its release event; the event says its reads are done. A consumer
        // without events stores the counter only once its reads are done. An offered event its consumer never
        // recorded (one without events, before the producer heard so) is complete.
        let slot = ring.slot_for(seq).0 as usize;
        let block = ring.block();
        // Every consumer offered the ring, attached or still finishing its handshake: one that is not live any
        // more (gone, or its handshake failed) no longer reads anything.
        for (id, released) in self.released.iter().flatten() {
            if let Some(event) = released.events().and_then(|events| events.get(slot)) {
                let alive = || block.consumer_state(id.index()) == Some((ConsumerState::Live, id.epoch()));
                let what = || format!("consumer {} to finish reading its frame in slot {slot}", id.index());
                match event.wait(deadline, alive, what) {
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
        seq: Sequence,
        slot: SlotIndex,
        stream: Option<&Stream>,
        gpu_deadline: Instant,
    ) -> Result<(), FrameError> {
        let stream = self.events.stream(stream)?;
        let event = &self.published[slot.0 as usize];
        event.record(stream)?;
        self.last_published = Some(slot.0 as usize);
        if self.counter_alone_read(ring) {
            // Some consumer sees only the counter: store it once the frame's work is done.
            event.wait(
                gpu_deadline,
                || true,
                || format!("frame {}'s work, for a consumer without IPC events", seq.0),
            )?;
        }
        Ok(ring.publish(seq)?)
    }

    fn settle(&mut self, deadline: Instant) -> bool {
        // The frames' work is what a consumer still reading them needs complete; events are polled, never waited.
        self.last_published
            .and_then(|slot| self.published.get(slot))
            .is_none_or(|event| event.wait(deadline, || true, || "the last frame's work".to_owned()).is_ok())
    }

    fn offer_event_handles(&mut self, id: ConsumerId) -> Result<Vec<[u8; 64]>, FrameError> {
        let fresh = (0..self.slots).map(|_| self.events.create()).collect::<Result<Vec<_>, _>>()?;
        let mut handles = Vec::with_capacity(2 * fresh.len());
        for event in self.published.iter().chain(fresh.iter()) {
            handles.push(event.ipc_handle()?);
        }
        if let Some(record) = self.released.get_mut(id.index() as usize) {
            *record = Some((id, Released::Offered(fresh)));
        }
        Ok(handles)
    }

    fn consumer_attached(&mut self, id: ConsumerId, without_events: bool) {
        let Some(Some((offered_to, released))) = self.released.get_mut(id.index() as usize) else { return };
        if *offered_to != id {
            return;
        }
        *released = match std::mem::replace(released, Released::NotOpened) {
            _ if without_events => {
                tracing::info!(
                    consumer = id.index(),
                    "consumer runs the ring without IPC events (another IPC namespace): frames are published once \
                     their work is done while it is attached"
                );
                Released::NotOpened
            }
            Released::Offered(events) | Released::Opened(events) => Released::Opened(events),
            Released::NotOpened => Released::NotOpened,
        };
    }

    fn drain(&mut self, stream: Option<&Stream>, deadline: Instant) -> Result<(), FrameError> {
        match self.events.stream(stream)? {
            Some(stream) => super::cpu::StreamFence::new(WaitMode::Spin).wait(stream, deadline),
            None => Ok(()),
        }
    }
}

/// A consumer that opened the producer's events.
struct EventConsumer {
    events: Events,
    published: Vec<RingEvent>,
    released: Vec<RingEvent>,
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
        self.events.stream(stream)?;
        shared.wait_published(seq, WaitMode::Spin, deadline)?;
        self.published[slot.0 as usize]
            .wait(deadline, || !shared.hung_up(), || format!("the producer to finish writing frame {}", seq.0))
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
        self.released[slot.0 as usize].record(self.events.stream(stream)?)?;
        shared.ring.release(seq).map_err(|e| shared.map_ring(e, "release"))
    }
}

/// A consumer that could not open the producer's events (another IPC namespace): it runs the ring on its counters,
/// as `CpuSpin` does (the producer publishes a frame for it only once the frame is done, and waits for its releases
/// on the counters alone).
struct WithoutEvents(CpuConsumer);

impl ConsumerSide for WithoutEvents {
    fn wait_frame(
        &mut self,
        shared: &ConsumerShared,
        seq: Sequence,
        slot: SlotIndex,
        stream: Option<&Stream>,
        deadline: Instant,
    ) -> Result<(), FrameError> {
        self.0.wait_frame(shared, seq, slot, stream, deadline)
    }

    fn release(
        &mut self,
        shared: &ConsumerShared,
        seq: Sequence,
        slot: SlotIndex,
        stream: Option<&Stream>,
        gpu_deadline: Instant,
    ) -> Result<(), FrameError> {
        // The counter alone tells the producer: it is stored once the stream has done the reads.
        self.0.release(shared, seq, slot, stream, gpu_deadline)
    }

    fn without_events(&self) -> bool {
        true
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::ring::{LivenessPolicy, RingConfig};

    fn host_producer(slots: u32, max_consumers: u32) -> EventProducer {
        EventProducer {
            events: Events::Host,
            slots,
            last_published: None,
            published: (0..slots).map(|_| RingEvent::Host(HostEvent)).collect(),
            released: (0..max_consumers).map(|_| None).collect(),
        }
    }

    #[test]
    fn frames_are_published_done_while_any_live_consumer_may_read_them_on_the_counter_alone() {
        let ring = ProducerControl::create(
            RingConfig { slot_count: 2, max_consumers: 2, generation: 1 },
            LivenessPolicy::default(),
        )
        .unwrap();
        let mut producer = host_producer(2, 2);
        assert!(!producer.counter_alone_read(&ring), "nobody offered");
        let with = ring.register_consumer(rustix::process::getpid()).unwrap();
        assert_eq!(producer.offer_event_handles(with).unwrap(), vec![HostEvent::HANDLE; 4]);
        assert!(producer.counter_alone_read(&ring), "offered: it has not said whether it opened the events");
        producer.consumer_attached(with, false);
        assert!(!producer.counter_alone_read(&ring), "it opened them");
        let without = ring.register_consumer(rustix::process::getpid()).unwrap();
        producer.offer_event_handles(without).unwrap();
        producer.consumer_attached(without, true);
        assert!(producer.counter_alone_read(&ring), "one runs without events");
        assert!(matches!(producer.released[without.index() as usize], Some((_, Released::NotOpened))));
        // Gone (or its handshake failed and the record was given back), it reads nothing any more.
        ring.mark_consumer_dead(without).unwrap();
        assert!(!producer.counter_alone_read(&ring));
    }

    #[test]
    fn an_attach_for_another_epoch_of_the_record_changes_nothing() {
        let ring = ProducerControl::create(
            RingConfig { slot_count: 2, max_consumers: 1, generation: 1 },
            LivenessPolicy::default(),
        )
        .unwrap();
        let mut producer = host_producer(2, 1);
        let id = ring.register_consumer(rustix::process::getpid()).unwrap();
        producer.offer_event_handles(id).unwrap();
        ring.mark_consumer_dead(id).unwrap();
        ring.reclaim_consumer(id).unwrap();
        let next = ring.register_consumer(rustix::process::getpid()).unwrap();
        assert_ne!(next, id);
        producer.offer_event_handles(next).unwrap();
        producer.consumer_attached(id, true);
        assert!(matches!(producer.released[0], Some((owner, Released::Offered(_))) if owner == next));
    }
}
