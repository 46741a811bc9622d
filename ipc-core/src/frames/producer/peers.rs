//! The producer's side of admission: answering hellos with a record and an offer, counting attached consumers
//! in, reaping dead ones and freeing retired records.

use std::collections::HashMap;
use std::os::fd::OwnedFd;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use rustix::process::Pid;

use super::{Producer, granularity_of};
use crate::backend::Backend;
use crate::door::admission::{AdmissionEvent, OfferKit};
use crate::frames::FrameError;
use crate::frames::strategy::ProducerSide;
use crate::ring::layout::{ConsumerState, RingLayout};
use crate::ring::{ConsumerId, ProducerControl, RingError, Sequence, monotonic_ns};
use crate::wire::{
    DEEP_RING_VERSION, Message, ObjectKind, PeerConnection, PeerCredentials, PeerState, PeerStatus, RefusalCode,
    RingOffer, SlotLayout,
};

// The wire's bound on rings that protocol versions 1 and 2 can offer is control-block layout 1's.
const _: () = assert!(crate::wire::SHALLOW_RING_MAX_SLOTS == crate::ring::layout::LAYOUT_1_MAX_SLOTS);

/// A consumer's valid hello, waiting for the producer to take a record for it.
pub(super) struct Hello {
    /// The admission thread's handshake number.
    pub(super) token: u64,
    pub(super) pid: Option<Pid>,
    pub(super) name: String,
    /// Its credentials (`SO_PEERCRED`).
    pub(super) peer: PeerCredentials,
    /// When the producer first tried.
    pub(super) since: Instant,
}

/// How long a hello waits for a record when every record is taken but some are only waiting to be freed (a
/// consumer that detached a moment ago is freed once the watchdog saw its hang-up, within milliseconds), before
/// it is refused with "ring full".
pub(super) const RECORD_WAIT: Duration = Duration::from_secs(1);

pub(super) struct Peer {
    pub(super) id: ConsumerId,
    pub(super) pid: u32,
    /// Kept open for the consumer's lifetime: its hang-up is how the watchdog learns that the consumer died.
    pub(super) conn: PeerConnection,
    /// Held by the watchdog's action for this consumer too: while that action may still run (and re-poison the
    /// record), the count stays above one, and the record is not given to anyone else.
    pub(super) watched: Arc<()>,
}

/// A record whose consumer left, waiting to be freed.
pub(super) struct Retired {
    pub(super) id: ConsumerId,
    /// The producer's next sequence when the consumer left.
    pub(super) left_at: Sequence,
    /// The watchdog's hold on the record, if it watches the consumer.
    pub(super) watched: Option<Arc<()>>,
}

impl Retired {
    /// Whether nothing can write the record any more: the watchdog is done with it (the consumer hung up and, for
    /// strategies where its GPU writes the counters, the re-poisoning window passed), and nothing queued on the
    /// producer's stream still reads it.
    pub(super) fn reusable(&self, sync: &dyn ProducerSide) -> bool {
        self.watched.as_ref().is_none_or(|w| Arc::strong_count(w) == 1) && sync.record_reusable(self.left_at)
    }
}

impl<B: Backend> Producer<B> {
    /// Takes what the admission thread finished: takes a record for each consumer that said a valid hello and
    /// hands it the ring's offer, counts in each consumer that attached, retires the record of each handshake that
    /// failed. Never waits: the handshakes themselves run on the admission thread. A hello that finds every record
    /// taken, some of them only waiting to be freed, is answered by a later call (for up to a second) rather than
    /// refused.
    ///
    /// [`Producer::acquire`] does the same (and goes on publishing to the consumers attached whatever this says).
    ///
    /// # Errors
    /// [`FrameError::Admission`] once the admission thread has stopped accepting: it survives a panic of its own
    /// (a bug) by failing the handshakes in flight and starting afresh, but after 8 it stops, the socket file goes,
    /// and no consumer can attach to this producer any more (every other failure, a client's included, is logged
    /// and survived).
    pub fn admit_pending(&mut self) -> Result<(), FrameError> {
        self.serve_front_door();
        match self.admission.gave_up() {
            Some(why) => Err(FrameError::Admission(why)),
            None => Ok(()),
        }
    }

    /// [`Producer::admit_pending`] without its verdict on the admission thread.
    pub(crate) fn serve_front_door(&mut self) {
        self.reap_dead_peers();
        // Read before the events: once the thread has ended, every event it sent is in the queue.
        let thread_ended = self.admission.gave_up().is_some();
        while let Some(event) = self.admission.try_next() {
            match event {
                AdmissionEvent::WantsOffer { token, pid, name, peer, .. } => {
                    self.hellos.push(Hello { token, pid, name, peer, since: Instant::now() });
                }
                AdmissionEvent::Attached { id, pid, conn, without_events } => {
                    self.offered.retain(|&o| o != id);
                    self.sync.consumer_attached(id, without_events);
                    self.count_in(id, pid, conn);
                }
                AdmissionEvent::Failed { id } => {
                    self.offered.retain(|&o| o != id);
                    self.retired.push(Retired { id, left_at: self.next_seq, watched: None });
                }
            }
        }
        if thread_ended {
            // Offers it never sent, or handshakes it never ended: nobody will attach on these records.
            for id in std::mem::take(&mut self.offered) {
                tracing::error!(
                    consumer = id.index(),
                    "the admission thread ended with this offer open; giving the record back"
                );
                self.give_back(id);
            }
        }
        self.reclaim_retired();
        self.answer_hellos();
    }

    /// Answers the hellos waiting for a record, in arrival order: an offer, or a refusal, or (every record taken,
    /// some about to be freed, for at most [`RECORD_WAIT`]) nothing yet.
    pub(super) fn answer_hellos(&mut self) {
        for hello in std::mem::take(&mut self.hellos) {
            let kit = self.take_record_and_offer(hello.pid, &hello.name, hello.peer);
            let full = matches!(kit, Err((RefusalCode::RingFull, _)));
            if full && !self.retired.is_empty() && hello.since.elapsed() < RECORD_WAIT {
                self.hellos.push(hello);
            } else {
                let offered = kit.as_ref().ok().map(|(id, _, _)| *id);
                if let Some(id) = self.admission.offer(hello.token, kit) {
                    // The admission thread is gone (it only ends early by panicking): nobody will send this offer.
                    tracing::error!(consumer = id.index(), "the admission thread is gone; giving the record back");
                    self.give_back(id);
                } else if let Some(id) = offered {
                    self.offered.push(id);
                }
            }
        }
    }

    /// Starts counting an attached consumer: the watchdog acts on its hang-up.
    pub(super) fn count_in(&mut self, id: ConsumerId, pid: u32, conn: PeerConnection) {
        let ring = self.ring.clone();
        let watched = Arc::new(());
        let hold = watched.clone();
        let gpu_writes = self.strategy.gpu_writes_counters();
        let action = self.watchdog.watch(
            &conn,
            Box::new(move |first| {
                let _hold = &hold;
                let state = ring.block().consumer_state(id.index());
                if first && state == Some((ConsumerState::Live, id.epoch())) {
                    tracing::warn!(consumer = id.index(), "consumer hung up; releasing what it held");
                    let _ = ring.mark_consumer_dead(id);
                } else if !first {
                    let _ = ring.repoison_released(id);
                }
                // A consumer that detached, or whose GPU never wrote the counters, leaves nothing behind; a dead
                // one's queued GPU stores may still land: repeat the poison (the watchdog bounds how long).
                gpu_writes && ring.block().consumer_state(id.index()) == Some((ConsumerState::Dead, id.epoch()))
            }),
        );
        match action {
            Ok(()) => {
                tracing::info!(consumer = id.index(), pid, "consumer attached");
                self.peers.push(Peer { id, pid, conn, watched });
            }
            Err(e) => {
                // Unwatched, its death would go unnoticed: let it go (closing the connection tells it).
                tracing::warn!(consumer = id.index(), pid, error = %e, "cannot watch a consumer; dropping it");
                self.give_back(id);
            }
        }
    }

    /// Marks record `id`, whose consumer never got (or cannot keep) it, dead and retires it: it is freed once
    /// nothing can write it, like a dead consumer's.
    pub(super) fn give_back(&mut self, id: ConsumerId) {
        let _ = self.ring.mark_consumer_dead(id);
        self.retired.push(Retired { id, left_at: self.next_seq, watched: None });
    }

    /// Takes a consumer record for a consumer that said a valid hello (it joins at the next frame) and makes its
    /// offer; on failure gives the record back and says what to refuse with. Runs on the producer's thread between
    /// frames, so the offer leaves before the producer can wait for the new record's first release.
    pub(super) fn take_record_and_offer(
        &mut self,
        pid: Option<Pid>,
        name: &str,
        peer: PeerCredentials,
    ) -> OfferKit<ConsumerId> {
        let id = self.ring.register_consumer(pid).map_err(|e| (RefusalCode::RingFull, e.to_string()))?;
        self.records.introduce(id, name, peer);
        match self.make_offer(id) {
            Ok((offer, fds)) => Ok((id, offer, fds)),
            Err(e) => {
                tracing::warn!(consumer = id.index(), name, error = %e, "could not make an offer");
                self.give_back(id);
                Err((RefusalCode::ShuttingDown, format!("the producer could not make its offer: {e}")))
            }
        }
    }

    /// The offer for record `id` and the fds that travel with it (the control memfd, and the data fd where the
    /// backend has one), exported now: the exporter keeps no copy.
    pub(super) fn make_offer(&mut self, id: ConsumerId) -> Result<(Message, Vec<OwnedFd>), FrameError> {
        let exported = B::export(&self.region)?;
        let event_handles = self.sync.offer_event_handles(id)?;
        let legacy_mem_handle = match exported.bytes.len() {
            0 => None,
            _ => Some(<[u8; 64]>::try_from(exported.bytes.as_slice()).map_err(|_| {
                FrameError::Config(format!("a legacy handle is 64 bytes, not {}", exported.bytes.len()))
            })?),
        };
        let offer = RingOffer {
            backend: B::KIND,
            handle_type: B::KIND.handle_type(),
            sync: self.config.sync,
            device_uuid: self.device_uuid,
            producer_pid: std::process::id(),
            generation: self.generation,
            consumer_id: id.index(),
            slot_layout: self.config.slot_layout.clone(),
            slot_count: self.config.slots,
            slot_stride_bytes: self.stride,
            data_offset: 0,
            allocation_bytes: exported.size,
            granularity: granularity_of(exported.size),
            control_bytes: self.ring.block().memory().len() as u64,
            legacy_mem_handle,
            event_handles,
        };
        let mut fds: Vec<OwnedFd> = vec![self.ring.block().memory().try_clone_fd().map_err(RingError::from)?];
        fds.extend(exported.fd);
        // The admission thread sends them and closes our copies right after.
        Ok((Message::RingOffer(offer), fds))
    }

    /// Drops consumers that are no longer live (the watchdog marked them dead when they hung up, they detached,
    /// or they were evicted) and quarantines their records.
    pub(super) fn reap_dead_peers(&mut self) {
        let block = self.ring.block();
        let next_seq = self.next_seq;
        let evicted = &self.evicted;
        let mut lost = 0;
        let mut retired = Vec::new();
        self.peers.retain(|peer| match block.consumer_state(peer.id.index()) {
            Some((ConsumerState::Live, epoch)) if epoch == peer.id.epoch() => true,
            state => {
                // Dead: its hang-up or its pid said it is gone without detaching (or it was evicted). Detached: it
                // left cleanly.
                let died = matches!(state, Some((ConsumerState::Dead, epoch)) if epoch == peer.id.epoch())
                    && !evicted.contains(&peer.id);
                lost += usize::from(died);
                tracing::info!(consumer = peer.id.index(), pid = peer.pid, died, "consumer gone");
                retired.push(Retired { id: peer.id, left_at: next_seq, watched: Some(peer.watched.clone()) });
                false
            }
        });
        self.lost += lost;
        self.retired.append(&mut retired);
    }

    /// Frees the records of consumers that left once nothing can write them any more ([`Retired::reusable`]);
    /// meanwhile re-poisons the dead ones that may still be writing (an evicted consumer that has not hung up).
    pub(super) fn reclaim_retired(&mut self) {
        let ring = &self.ring;
        let sync = &*self.sync;
        self.retired.retain(|retired| {
            if !retired.reusable(sync) {
                let _ = ring.repoison_released(retired.id);
                return true;
            }
            if let Err(e) = ring.reclaim_consumer(retired.id) {
                tracing::warn!(consumer = retired.id.index(), error = %e, "could not free a consumer record");
            }
            false
        });
        // An evicted record is remembered until it is freed (or reused): its consumer may still attach or hang up
        // meanwhile (evicted during its handshake), and must then not count as lost.
        let block = self.ring.block();
        self.evicted.retain(|id| {
            matches!(block.consumer_state(id.index()), Some((state, epoch)) if epoch == id.epoch() && state != ConsumerState::Free)
        });
    }
}

/// The ring's records as its front door sees them: the control block, and what the producer learnt of each
/// consumer at its hello (the control block keeps no names), for status reports.
pub(crate) struct RingRecords {
    pub(crate) ring: Arc<ProducerControl>,
    book: Mutex<HashMap<u32, Introduction>>,
    /// What the slots hold: a consumer must speak a protocol version that describes it.
    layout: SlotLayout,
}

/// What a consumer said of itself, for the record it holds in one epoch.
struct Introduction {
    epoch: u32,
    name: String,
    uid: u32,
    gid: u32,
    since: SystemTime,
}

impl RingRecords {
    pub(crate) fn new(ring: Arc<ProducerControl>, layout: SlotLayout) -> Self {
        Self { ring, book: Mutex::default(), layout }
    }

    /// Notes who took record `id`.
    fn introduce(&self, id: ConsumerId, name: &str, peer: PeerCredentials) {
        let intro = Introduction {
            epoch: id.epoch(),
            name: name.to_owned(),
            uid: peer.uid,
            gid: peer.gid,
            since: SystemTime::now(),
        };
        self.book.lock().unwrap_or_else(PoisonError::into_inner).insert(id.index(), intro);
    }
}

impl crate::door::admission::Records for RingRecords {
    type Id = ConsumerId;

    fn object(&self) -> ObjectKind {
        ObjectKind::Ring
    }

    fn wire_id(id: ConsumerId) -> u32 {
        id.index()
    }

    fn mark_dead(&self, id: ConsumerId) -> Result<(), String> {
        self.ring.mark_consumer_dead(id).map_err(|e| e.to_string())
    }

    fn refuse_version(&self, speaks: u16) -> Option<String> {
        let needs = self.layout.oldest_version();
        if speaks < needs {
            return Some(format!(
                "this ring carries tensors, not pixel frames (its slots hold {}), which wire protocol version \
                 {speaks} cannot describe: the consumer needs protocol version {needs} (a gpu-ipc release that reads \
                 tensor rings)",
                self.layout
            ));
        }
        let block = self.ring.block();
        let layout = block.layout();
        (layout != RingLayout::V1 && speaks < DEEP_RING_VERSION).then(|| {
            format!(
                "this ring has {} slots, in control-block layout {} (rings of more than {} slots), which a consumer \
                 of wire protocol version {speaks} cannot map (it reads control-block layout 1 only): the consumer \
                 needs protocol version {DEEP_RING_VERSION} (a gpu-ipc release that reads control-block layout {}), \
                 or the producer must use at most {} slots",
                block.slot_count(),
                layout.version(),
                RingLayout::V1.max_slots(),
                layout.version(),
                RingLayout::V1.max_slots(),
            )
        })
    }

    fn peers(&self) -> Vec<PeerStatus> {
        let block = self.ring.block();
        let next = block.next_sequence().0;
        let now = monotonic_ns();
        let book = self.book.lock().unwrap_or_else(PoisonError::into_inner);
        (0..block.max_consumers())
            .filter_map(|index| {
                let activity = block.consumer_activity(index)?;
                let state = match activity.state {
                    ConsumerState::Free => return None,
                    ConsumerState::Joining => PeerState::Joining,
                    ConsumerState::Live => PeerState::Attached,
                    ConsumerState::Detached => PeerState::Left,
                    ConsumerState::Dead => PeerState::Lost,
                };
                let intro = book.get(&index).filter(|intro| intro.epoch == activity.epoch);
                let since_unix_ms = intro
                    .and_then(|i| i.since.duration_since(UNIX_EPOCH).ok())
                    .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
                let detail = match activity.last_released {
                    Some(seq) => format!("released frame {seq}; the producer is at frame {next}"),
                    None => format!("no frame released yet; the producer is at frame {next}"),
                };
                Some(PeerStatus {
                    id: index,
                    pid: u32::try_from(activity.pid).ok().filter(|pid| *pid != 0),
                    uid: intro.map_or(0, |i| i.uid),
                    gid: intro.map_or(0, |i| i.gid),
                    since_unix_ms,
                    last_sign_ms: (activity.heartbeat_ns != 0)
                        .then(|| now.saturating_sub(activity.heartbeat_ns) / 1_000_000),
                    state,
                    name: intro.map(|i| i.name.clone()).unwrap_or_default(),
                    detail,
                })
            })
            .collect()
    }
}
