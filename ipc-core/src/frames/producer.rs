//! The producing side of a frame ring.

use std::os::fd::OwnedFd;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rustix::process::Pid;

use crate::backend::{Backend, SharedRegion};
use crate::driver::{DeviceMemory, DevicePtr, DeviceSpan, Stream};
use crate::frames::FrameError;
use crate::frames::admission::{Admission, AdmissionConfig, AdmissionEvent, OfferKit};
use crate::frames::strategy::{ProducerSide, Setup, Strategy};
use crate::frames::watchdog::Watchdog;
use crate::ring::layout::{CONTROL_BLOCK_BYTES, ConsumerState};
use crate::ring::{ConsumerId, LivenessPolicy, ProducerControl, RingConfig, RingError, Sequence, SlotIndex};
use crate::wire::{
    Detach, DetachReason, DeviceUuid, FrameGeometry, Message, PeerConnection, RefusalCode, RendezvousListener,
    RingOffer, SocketAccess, SyncStrategy,
};

/// How a producer sets up its ring.
#[derive(Debug, Clone)]
pub struct ProducerConfig {
    /// Where the rendezvous socket is created (mode 0600 unless `access` says otherwise).
    pub socket_path: PathBuf,
    /// Who may attach: the socket file's mode and group and the uid check on each consumer (default: the
    /// producer's user alone). See [`SocketAccess`] for serving consumers of other users.
    pub access: SocketAccess,
    /// Layout of each frame.
    pub geometry: FrameGeometry,
    /// Number of slots (1 to 32; 2 to 4 lets the producer work ahead of the consumers).
    pub slots: u32,
    /// How producer and consumers wait for each other.
    pub sync: SyncStrategy,
    /// Consumer records (consumers attached at the same time, at most 16).
    pub max_consumers: u32,
    /// Poll interval of `CpuSleep`.
    pub sleep_interval: Duration,
    /// Bound on each handshake with a new consumer, from accepting its connection to its `Attached` (default
    /// 10 s: long enough for a Python consumer to start CUDA and import the ring). Handshakes run on the
    /// producer's admission thread: frames never wait for one, however long it is allowed to take.
    pub handshake_timeout: Duration,
    /// Connections in flight at most (default 64): when a new one arrives and there is no room, the oldest that
    /// has not said a valid hello is closed. Bounds the fds that slow or silent clients can hold.
    pub max_pending_handshakes: usize,
    /// What to do about a live consumer that stops releasing frames (default: wait for it).
    pub slow_consumer: SlowConsumerPolicy,
    /// Bound on each CPU wait for GPU work the producer makes without a caller's timeout: a CPU strategy's wait
    /// for the frame's work in `publish`, and the wait at teardown for the work queued on the ring (default 10 s).
    pub gpu_timeout: Duration,
}

impl ProducerConfig {
    /// A configuration with the usual defaults (16 consumers, 20 us sleeps, 10 s handshakes, 64 in flight, slow
    /// consumers waited for, 10 s bound on waits for GPU work).
    pub fn new(socket_path: impl Into<PathBuf>, geometry: FrameGeometry, slots: u32, sync: SyncStrategy) -> Self {
        Self {
            socket_path: socket_path.into(),
            access: SocketAccess::default(),
            geometry,
            slots,
            sync,
            max_consumers: 16,
            sleep_interval: Duration::from_micros(20),
            handshake_timeout: Duration::from_secs(10),
            max_pending_handshakes: 64,
            slow_consumer: SlowConsumerPolicy::Block,
            gpu_timeout: Duration::from_secs(10),
        }
    }
}

/// The right to write one slot and publish it once: frame [`seq`](Self::seq) goes to [`slot`](Self::slot), at
/// [`ptr`](Self::ptr), [`bytes`](Self::bytes) long. [`Producer::publish`] takes it by value, so a lease cannot be
/// published twice:
///
/// ```compile_fail,E0382
/// # use std::time::Duration;
/// # use ipc_core::fake::HostFake;
/// # use ipc_core::frames::{FrameError, Producer};
/// # fn twice(producer: &mut Producer<HostFake>) -> Result<(), FrameError> {
/// let lease = producer.acquire(None, Duration::from_secs(1))?;
/// producer.publish(lease, None)?;
/// producer.publish(lease, None)?; // error[E0382]: use of moved value: `lease`
/// # Ok(())
/// # }
/// ```
///
/// A lease of another producer (or of an earlier ring at the same path) is refused by `publish` before anything is
/// queued.
#[derive(Debug, PartialEq, Eq)]
#[must_use = "publish the slot, or the ring stalls"]
pub struct SlotLease {
    seq: Sequence,
    slot: SlotIndex,
    ptr: DevicePtr,
    bytes: u64,
    /// The producer that made it ([`super::owner_token`]).
    owner: u64,
}

impl SlotLease {
    /// The frame's sequence number (0, 1, 2, ...).
    pub fn seq(&self) -> Sequence {
        self.seq
    }

    /// The slot the frame occupies.
    pub fn slot(&self) -> SlotIndex {
        self.slot
    }

    /// Where to write the frame, in this process's device address space (host address with the host backend).
    /// [`Producer::slot_span`] gives the same memory as a bounds-checked span.
    pub fn ptr(&self) -> DevicePtr {
        self.ptr
    }

    /// The frame's size in bytes.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }
}

/// The producing end of a frame ring.
pub struct Producer<B: Backend> {
    /// Keeps the context alive as long as the ring.
    _ctx: B::Context,
    /// In an `Arc` so that teardown can leak it on purpose (see `Drop`) without `unsafe`.
    region: Arc<B::Exported>,
    ring: Arc<ProducerControl>,
    admission: Admission,
    peers: Vec<Peer>,
    watchdog: Watchdog,
    strategy: &'static dyn Strategy,
    sync: Box<dyn ProducerSide>,
    config: ProducerConfig,
    stride: u64,
    next_seq: u64,
    /// Tells this producer's leases from any other's.
    owner: u64,
    generation: u64,
    device_uuid: DeviceUuid,
    lost: usize,
    /// Evicted consumers whose records are not free yet (their hang-ups are not losses).
    evicted: Vec<ConsumerId>,
    /// Consumers evicted so far.
    evicted_total: usize,
    /// Records of consumers that left, quarantined until nothing can write them any more (see
    /// [`Retired::reusable`]).
    retired: Vec<Retired>,
    holding_up: Vec<ConsumerId>,
    /// Valid hellos not answered yet: every record was taken, but some were waiting to be freed.
    hellos: Vec<Hello>,
    /// Records offered whose handshake has not ended yet (no `Attached` or `Failed` from the admission thread): given
    /// back here should that thread end without ending them.
    offered: Vec<ConsumerId>,
}

/// A consumer's valid hello, waiting for the producer to take a record for it.
struct Hello {
    /// The admission thread's handshake number.
    token: u64,
    pid: Option<Pid>,
    name: String,
    /// When the producer first tried.
    since: Instant,
}

/// How long a hello waits for a record when every record is taken but some are only waiting to be freed (a
/// consumer that detached a moment ago is freed once the watchdog saw its hang-up, within milliseconds), before
/// it is refused with "ring full".
const RECORD_WAIT: Duration = Duration::from_secs(1);

/// How often `acquire` serves the front door while consumers hold the slot it waits for (strategies whose wait can
/// be cut short and resumed; see `ProducerSide::wait_in_slices`).
const ADMISSION_SLICE: Duration = Duration::from_millis(5);

struct Peer {
    id: ConsumerId,
    pid: u32,
    /// Kept open for the consumer's lifetime: its hang-up is how the watchdog learns that the consumer died.
    conn: PeerConnection,
    /// Held by the watchdog's action for this consumer too: while that action may still run (and re-poison the
    /// record), the count stays above one, and the record is not given to anyone else.
    watched: Arc<()>,
}

/// A record whose consumer left, waiting to be freed.
struct Retired {
    id: ConsumerId,
    /// The producer's next sequence when the consumer left.
    left_at: u64,
    /// The watchdog's hold on the record, if it watches the consumer.
    watched: Option<Arc<()>>,
}

impl Retired {
    /// Whether nothing can write the record any more: the watchdog is done with it (the consumer hung up and, for
    /// strategies where its GPU writes the counters, the re-poisoning window passed), and nothing queued on the
    /// producer's stream still reads it.
    fn reusable(&self, sync: &dyn ProducerSide) -> bool {
        self.watched.as_ref().is_none_or(|w| Arc::strong_count(w) == 1) && sync.record_reusable(self.left_at)
    }
}

/// What a producer does about a live consumer that stops releasing frames.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum SlowConsumerPolicy {
    /// Wait for it (the default): `acquire` returns [`FrameError::Timeout`] at its own timeout and can be called
    /// again, or the application calls [`Producer::evict`].
    #[default]
    Block,
    /// Evict a consumer that has held up the next frame for this long: it stops counting, the producer goes on,
    /// and its next call returns [`FrameError::Evicted`].
    Evict {
        /// How long a consumer may hold up a frame.
        after: Duration,
    },
}

impl<B: Backend> Producer<B> {
    /// Allocates the ring (one exported allocation for every slot), creates the control block and starts
    /// listening on the socket. Consumers are admitted by the producer's admission thread; the producer hands
    /// each its offer, without waiting, in [`Producer::acquire`] (and [`Producer::wait_for_consumers`],
    /// [`Producer::admit_pending`]).
    ///
    /// # Errors
    /// [`FrameError::StrategyUnavailable`] when the backend or device cannot run the strategy (with what to use
    /// instead), allocation or export errors, or a socket that cannot be bound.
    pub fn create(ctx: &B::Context, config: ProducerConfig) -> Result<Self, FrameError> {
        B::check_support(ctx)?;
        let cuda = B::cuda_context(ctx);
        let strategy = super::strategy::strategy(config.sync);
        strategy.check(cuda)?;
        let generation = generation_now();
        let ring = Arc::new(ProducerControl::create(
            RingConfig { slot_count: config.slots, max_consumers: config.max_consumers, generation },
            LivenessPolicy::default(),
        )?);
        let stride = super::slot_stride(config.geometry.frame_bytes());
        let region = Arc::new(B::allocate(ctx, stride * u64::from(config.slots))?);
        let device_uuid = match cuda {
            Some(c) => c.device().uuid()?,
            None => DeviceUuid([0; 16]),
        };
        let sync = strategy.producer(Setup {
            cuda,
            block: ring.block().shared(),
            slots: config.slots,
            max_consumers: config.max_consumers,
            sleep_interval: config.sleep_interval,
        })?;
        let listener = RendezvousListener::bind_with(&config.socket_path, &config.access)?;
        let admission = Admission::start(
            listener,
            ring.clone(),
            AdmissionConfig {
                backend: B::KIND,
                handshake_timeout: config.handshake_timeout,
                max_pending: config.max_pending_handshakes.max(1),
            },
        )
        .map_err(|e| FrameError::Config(format!("starting the admission thread: {e}")))?;
        tracing::info!(
            backend = B::KIND.name(),
            sync = %strategy.kind(),
            slots = config.slots,
            frame_bytes = config.geometry.frame_bytes(),
            path = %config.socket_path.display(),
            "producer ready"
        );
        Ok(Self {
            _ctx: ctx.clone(),
            region,
            ring,
            admission,
            peers: Vec::new(),
            watchdog: Watchdog::start(),
            strategy,
            sync,
            config,
            stride,
            next_seq: 0,
            owner: super::owner_token(),
            generation,
            device_uuid,
            lost: 0,
            evicted: Vec::new(),
            evicted_total: 0,
            retired: Vec::new(),
            holding_up: Vec::new(),
            hellos: Vec::new(),
            offered: Vec::new(),
        })
    }

    /// Number of consumers attached and alive.
    pub fn consumers(&mut self) -> usize {
        self.reap_dead_peers();
        self.peers.len()
    }

    /// The consumers attached and alive, for [`Producer::evict`].
    pub fn consumer_ids(&mut self) -> Vec<ConsumerId> {
        self.reap_dead_peers();
        self.peers.iter().map(|p| p.id).collect()
    }

    /// Number of consumers that vanished without detaching (killed, crashed): each was noticed by its hang-up,
    /// marked dead, and stopped counting. Evicted consumers are counted by [`Producer::consumers_evicted`].
    pub fn consumers_lost(&mut self) -> usize {
        self.reap_dead_peers();
        self.lost
    }

    /// Number of consumers evicted so far ([`Producer::evict`], or the [`SlowConsumerPolicy`]), whether or not
    /// they have hung up since.
    pub fn consumers_evicted(&self) -> usize {
        self.evicted_total
    }

    /// Admits consumers until `count` are attached, or `timeout` passes.
    ///
    /// # Errors
    /// [`FrameError::Timeout`] with the number that did attach; [`FrameError::Admission`] when no consumer can
    /// attach any more (see [`Producer::admit_pending`]).
    pub fn wait_for_consumers(&mut self, count: usize, timeout: Duration) -> Result<(), FrameError> {
        let deadline = Instant::now() + timeout;
        loop {
            let admitted = self.admit_pending();
            if self.consumers() >= count {
                return Ok(());
            }
            admitted?;
            if Instant::now() >= deadline {
                return Err(FrameError::Timeout {
                    what: format!("{count} consumers to attach ({} did)", self.peers.len()),
                    waited: timeout,
                });
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// The exported allocation that holds every slot.
    pub fn region(&self) -> &B::Exported {
        &self.region
    }

    /// The sequence number the next [`Producer::acquire`] returns.
    pub fn next_sequence(&self) -> u64 {
        self.next_seq
    }

    /// Waits (on the CPU or, with GPU-side strategies, on `stream`) until the next frame's slot is free, and
    /// returns it.
    ///
    /// A slot is rewritten only after every live consumer released the frame it held; a consumer that dies stops
    /// counting; under [`SlowConsumerPolicy::Evict`] one that holds the slot too long is evicted. GPU strategies
    /// need `stream`; CPU ones ignore it. New consumers are served first ([`Producer::admit_pending`]) and, while
    /// the wait lasts, every 5 ms (every strategy but `GpuPoll`): one that joins now joins at this frame.
    ///
    /// # Errors
    /// [`FrameError::Timeout`] when consumers do not release in time, driver errors.
    pub fn acquire(&mut self, stream: Option<&Stream>, timeout: Duration) -> Result<SlotLease, FrameError> {
        self.serve_front_door();
        let seq = self.next_seq;
        let started = Instant::now();
        let deadline = started + timeout;
        let evict_after = match self.config.slow_consumer {
            SlowConsumerPolicy::Block => None,
            SlowConsumerPolicy::Evict { after } => Some(after),
        };
        let mut evict_at = evict_after.map(|after| started + after);
        // Where the strategy's wait may be cut short and resumed, it is, every `ADMISSION_SLICE`, to serve the
        // front door while consumers hold the slot: a consumer that joins now joins at `seq`, which it does not
        // hold back.
        let slice = self.sync.wait_in_slices().then_some(ADMISSION_SLICE);
        loop {
            let now = Instant::now();
            let until =
                [Some(deadline), evict_at, slice.map(|s| now + s)].into_iter().flatten().min().unwrap_or(deadline);
            match self.sync.wait_slot_free(&self.ring, seq, stream, until) {
                Ok(()) => break,
                Err(FrameError::Timeout { what, .. }) => {
                    let now = Instant::now();
                    if let (Some(at), Some(after)) = (evict_at, evict_after)
                        && now >= at
                    {
                        // The eviction window starts again; someone evicted: look again at once.
                        evict_at = Some(now + after);
                        if self.evict_holding_up(seq) > 0 {
                            continue;
                        }
                    }
                    if now >= deadline {
                        return Err(FrameError::Timeout { what, waited: now.saturating_duration_since(started) });
                    }
                    self.serve_front_door();
                }
                Err(e) => return Err(e),
            }
        }
        let slot = self.ring.slot_for(Sequence(seq));
        Ok(SlotLease {
            seq: Sequence(seq),
            slot,
            ptr: self.region.ptr().offset(self.stride * u64::from(slot.0)),
            bytes: self.config.geometry.frame_bytes(),
            owner: self.owner,
        })
    }

    /// Evicts the consumers holding up frame `seq`; returns how many.
    fn evict_holding_up(&mut self, seq: u64) -> usize {
        let mut holding = std::mem::take(&mut self.holding_up);
        holding.clear();
        self.sync.holding_up(&self.ring, seq, &mut holding);
        let mut count = 0;
        for id in &holding {
            if self.evict(*id).unwrap_or(false) {
                count += 1;
            }
        }
        self.holding_up = holding;
        count
    }

    /// Evicts a live consumer: it stops counting at once (its release counters are poisoned, so every wait the
    /// producer queued on them completes), it is sent `Detach(TooSlow)`, and its next call returns
    /// [`FrameError::Evicted`]. Its record stays taken until it hangs up (it may still write its counters).
    /// Returns false when `consumer` was not live.
    ///
    /// # Errors
    /// A record index outside the ring.
    pub fn evict(&mut self, consumer: ConsumerId) -> Result<bool, FrameError> {
        if self.ring.block().consumer_state(consumer.index()) != Some((ConsumerState::Live, consumer.epoch())) {
            return Ok(false);
        }
        self.ring.mark_consumer_dead(consumer)?;
        if let Some(peer) = self.peers.iter().find(|p| p.id == consumer) {
            let bye = Detach { consumer_id: consumer.index(), reason: DetachReason::TooSlow };
            if let Err(e) = peer.conn.send(&Message::Detach(bye), Vec::new(), Duration::from_millis(10)) {
                tracing::debug!(consumer = consumer.index(), error = %e, "could not tell an evicted consumer");
            }
        }
        tracing::warn!(consumer = consumer.index(), "consumer evicted");
        self.evicted.push(consumer);
        self.evicted_total += 1;
        Ok(true)
    }

    /// Waits until every live consumer has released every published frame (and the stream has done everything
    /// queued on it): the end of a run.
    ///
    /// # Errors
    /// As [`Producer::acquire`].
    pub fn drain(&mut self, stream: Option<&Stream>, timeout: Duration) -> Result<(), FrameError> {
        self.reap_dead_peers();
        let deadline = Instant::now() + timeout;
        // Frame `s` may be overwritten once `s - slots` is released: the next `slots` sequences cover every frame
        // still held.
        for seq in self.next_seq..self.next_seq + u64::from(self.config.slots) {
            self.sync.wait_slot_free(&self.ring, seq, stream, deadline)?;
        }
        self.sync.drain(stream, deadline)
    }

    /// Publishes the frame in `lease` once the work queued on `stream` (if any) is done.
    ///
    /// # Errors
    /// Driver errors; a GPU strategy without a stream; [`FrameError::Timeout`] when a CPU strategy's wait for the
    /// frame's work passes [`ProducerConfig::gpu_timeout`].
    pub fn publish(&mut self, lease: SlotLease, stream: Option<&Stream>) -> Result<(), FrameError> {
        // Checked before the strategy queues anything: a GPU strategy's counter store cannot be taken back.
        if lease.owner != self.owner {
            return Err(FrameError::ForeignToken {
                token: "slot lease",
                problem: format!("frame {} is another producer's (or an earlier ring's)", lease.seq.0),
            });
        }
        if lease.seq.0 != self.next_seq {
            return Err(FrameError::ForeignToken {
                token: "slot lease",
                problem: format!(
                    "frame {} was published already with another lease; the next frame is {}",
                    lease.seq.0, self.next_seq
                ),
            });
        }
        let gpu_deadline = Instant::now() + self.config.gpu_timeout;
        self.sync.publish(&self.ring, lease.seq.0, lease.slot.0, stream, gpu_deadline)?;
        self.next_seq = lease.seq.0 + 1;
        Ok(())
    }

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
    fn serve_front_door(&mut self) {
        self.reap_dead_peers();
        // Read before the events: once the thread has ended, every event it sent is in the queue.
        let thread_ended = self.admission.gave_up().is_some();
        while let Some(event) = self.admission.try_next() {
            match event {
                AdmissionEvent::WantsOffer { token, pid, name } => {
                    self.hellos.push(Hello { token, pid, name, since: Instant::now() });
                }
                AdmissionEvent::Attached { id, pid, conn } => {
                    self.offered.retain(|&o| o != id);
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
    fn answer_hellos(&mut self) {
        for hello in std::mem::take(&mut self.hellos) {
            let kit = self.take_record_and_offer(hello.pid, &hello.name);
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
    fn count_in(&mut self, id: ConsumerId, pid: u32, conn: PeerConnection) {
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
    fn give_back(&mut self, id: ConsumerId) {
        let _ = self.ring.mark_consumer_dead(id);
        self.retired.push(Retired { id, left_at: self.next_seq, watched: None });
    }

    /// Takes a consumer record for a consumer that said a valid hello (it joins at the next frame) and makes its
    /// offer; on failure gives the record back and says what to refuse with. Runs on the producer's thread between
    /// frames, so the offer leaves before the producer can wait for the new record's first release.
    fn take_record_and_offer(&mut self, pid: Option<Pid>, name: &str) -> OfferKit {
        let id = self.ring.register_consumer(pid).map_err(|e| (RefusalCode::RingFull, e.to_string()))?;
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
    fn make_offer(&mut self, id: ConsumerId) -> Result<(Message, Vec<OwnedFd>), FrameError> {
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
            geometry: self.config.geometry,
            slot_count: self.config.slots,
            slot_stride_bytes: self.stride,
            data_offset: 0,
            allocation_bytes: exported.size,
            granularity: granularity_of(exported.size),
            control_bytes: CONTROL_BLOCK_BYTES as u64,
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
    fn reap_dead_peers(&mut self) {
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
    fn reclaim_retired(&mut self) {
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

impl<B: Backend> Producer<B>
where
    B::Exported: DeviceMemory,
{
    /// The device memory of the slot in `lease`, bounds-checked, borrowed from the producer: what the caller's
    /// kernel writes (with [`Function::launch_typed`](crate::driver::Function::launch_typed) or the span's own
    /// copies). It cannot outlive the ring.
    ///
    /// # Errors
    /// A lease that is not from this producer's ring.
    pub fn slot_span(&self, lease: &SlotLease) -> Result<DeviceSpan<'_>, FrameError> {
        Ok(self.region.span().sub_span_at(lease.ptr, lease.bytes)?)
    }
}

impl<B: Backend> Drop for Producer<B> {
    fn drop(&mut self) {
        self.admission.stop();
        // Every wait our stream holds on a consumer's counters completes once they are poisoned; then wait
        // (bounded) for the stream to pass what we queued on the ring before freeing what it uses.
        self.ring.poison_all_released();
        let settled = self.sync.settle(Instant::now() + self.config.gpu_timeout);
        if settled {
            // Every frame queued is published now: consumers finish them, then get EndOfStream.
            self.ring.close();
        } else {
            // Not closed (the ring's own Drop would close it: keep it): frames queued may never be published, so
            // consumers must see a producer that died, not a clean end.
            std::mem::forget(self.ring.clone());
            tracing::error!(
                "the producer's stream did not finish its work on the ring within {:?}: leaking the ring's memory \
                 rather than freeing it under the GPU",
                self.config.gpu_timeout
            );
            std::mem::forget(self.region.clone());
            std::mem::forget(std::mem::replace(&mut self.sync, Box::new(super::strategy::Closed)));
        }
        self.watchdog.stop();
    }
}

/// The largest power of two, up to 2 MiB, that divides the allocation: the granularity the offer reports.
fn granularity_of(bytes: u64) -> u64 {
    1u64 << bytes.trailing_zeros().min(21)
}

/// A number that differs between two rings created on this machine: nanoseconds since the epoch.
fn generation_now() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(1, |d| d.as_nanos() as u64)
}
