//! The producing side of a frame ring.

use std::os::fd::OwnedFd;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::backend::{Backend, SharedRegion};
use crate::driver::{DevicePtr, Event, EventFlags, HostRegistration, Stream, WaitCondition};
use crate::frames::FrameError;
use crate::frames::admission::{Admission, AdmissionConfig, AdmissionEvent, OfferKit};
use crate::frames::run_ahead::RunAhead;
use crate::frames::watchdog::Watchdog;
use crate::ring::layout::{CONTROL_BLOCK_BYTES, ConsumerState, ControlBlockLayout, published_offset};
use crate::ring::{
    ConsumerId, LivenessPolicy, ProducerControl, ReleaseRequirement, RingConfig, RingError, Sequence, WaitMode,
};
use crate::sys::shm::SharedObject;
use crate::wire::{DeviceUuid, FrameGeometry, Message, PeerConnection, RendezvousListener, RingOffer, SyncStrategy};

/// How a producer sets up its ring.
#[derive(Debug, Clone)]
pub struct ProducerConfig {
    /// Where the rendezvous socket is created (mode 0600).
    pub socket_path: PathBuf,
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
}

impl ProducerConfig {
    /// A configuration with the usual defaults (16 consumers, 20 us sleeps, 10 s handshakes, 64 in flight).
    pub fn new(socket_path: impl Into<PathBuf>, geometry: FrameGeometry, slots: u32, sync: SyncStrategy) -> Self {
        Self {
            socket_path: socket_path.into(),
            geometry,
            slots,
            sync,
            max_consumers: 16,
            sleep_interval: Duration::from_micros(20),
            handshake_timeout: Duration::from_secs(10),
            max_pending_handshakes: 64,
        }
    }
}

/// A slot the producer may write: frame `seq` goes to `slot`, at `ptr`, `bytes` long.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[must_use = "publish the slot, or the ring stalls"]
pub struct SlotLease {
    /// The frame's sequence number (0, 1, 2, ...).
    pub seq: u64,
    /// The slot it occupies.
    pub slot: u32,
    /// Where to write it, in this process's device address space.
    pub ptr: DevicePtr,
    /// Frame size in bytes.
    pub bytes: u64,
}

/// Per-strategy state of the producer.
enum ProducerSync {
    /// CPU spin or sleep on the control block.
    Cpu(WaitMode),
    /// IPC events: one "published" event per slot; per consumer record, the consumer it was offered to and one
    /// "released" event per slot (made with the offer, so they exist before that consumer can release anything).
    Events { published: Vec<Event>, released: Vec<Option<(ConsumerId, Vec<Event>)>> },
    /// Stream memory operations on the control block, registered for the device.
    Gpu { registration: HostRegistration<SharedObject<ControlBlockLayout>>, run_ahead: RunAhead },
}

/// The producing end of a frame ring.
pub struct Producer<B: Backend> {
    ctx: B::Context,
    region: B::Exported,
    ring: Arc<ProducerControl>,
    admission: Admission,
    peers: Vec<Peer>,
    watchdog: Watchdog,
    sync: ProducerSync,
    config: ProducerConfig,
    stride: u64,
    next_seq: u64,
    generation: u64,
    device_uuid: DeviceUuid,
    pending: Vec<ReleaseRequirement>,
    lost: usize,
    /// Records of consumers that left, with the sequence the producer was at: reused once no queued GPU wait can
    /// still read their counters.
    retired: Vec<(ConsumerId, u64)>,
    /// With `GpuStreamOps`: every frame below this has gone through the producer's stream.
    stream_done_below: u64,
}

struct Peer {
    id: ConsumerId,
    pid: u32,
    /// Kept open for the consumer's lifetime: its hang-up is how the watchdog learns that the consumer died.
    _conn: PeerConnection,
}

impl<B: Backend> Producer<B> {
    /// Allocates the ring (one exported allocation for every slot), creates the control block and starts
    /// listening on the socket. Consumers are admitted by the producer's admission thread; the producer hands
    /// each its offer, without waiting, in [`Producer::acquire`] (and [`Producer::wait_for_consumers`],
    /// [`Producer::admit_pending`]).
    ///
    /// # Errors
    /// A strategy the backend or device cannot run, allocation or export errors, or a socket that cannot be bound.
    pub fn create(ctx: &B::Context, config: ProducerConfig) -> Result<Self, FrameError> {
        B::check_support(ctx)?;
        let generation = generation_now();
        let ring = Arc::new(ProducerControl::create(
            RingConfig { slot_count: config.slots, max_consumers: config.max_consumers, generation },
            LivenessPolicy::default(),
        )?);
        let stride = super::slot_stride(config.geometry.frame_bytes());
        let region = B::allocate(ctx, stride * u64::from(config.slots))?;
        let cuda = B::cuda_context(ctx);
        let device_uuid = match cuda {
            Some(c) => c.device().uuid()?,
            None => DeviceUuid([0; 16]),
        };
        let unavailable = |reason: &str| super::unavailable(config.sync, reason);
        let sync = match config.sync {
            SyncStrategy::CpuSpin => ProducerSync::Cpu(WaitMode::Spin),
            SyncStrategy::CpuSleep => ProducerSync::Cpu(WaitMode::Sleep(config.sleep_interval)),
            SyncStrategy::IpcEvent => {
                let cuda = cuda.ok_or_else(|| unavailable("IPC events need a CUDA backend"))?;
                let published = (0..config.slots)
                    .map(|_| Event::new(cuda, EventFlags::INTERPROCESS))
                    .collect::<Result<Vec<_>, _>>()?;
                ProducerSync::Events { published, released: (0..config.max_consumers).map(|_| None).collect() }
            }
            SyncStrategy::GpuStreamOps => {
                let cuda = cuda.ok_or_else(|| unavailable("stream memory operations need a CUDA backend"))?;
                ProducerSync::Gpu {
                    registration: HostRegistration::new(cuda, ring.block().shared())?,
                    run_ahead: RunAhead::new(cuda, 2 * config.slots as usize)?,
                }
            }
        };
        let listener = RendezvousListener::bind(&config.socket_path)?;
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
            backend = B::NAME,
            sync = %config.sync,
            slots = config.slots,
            frame_bytes = config.geometry.frame_bytes(),
            path = %config.socket_path.display(),
            "producer ready"
        );
        Ok(Self {
            ctx: ctx.clone(),
            region,
            ring,
            admission,
            peers: Vec::new(),
            watchdog: Watchdog::start(),
            sync,
            config,
            stride,
            next_seq: 0,
            generation,
            device_uuid,
            pending: Vec::new(),
            lost: 0,
            retired: Vec::new(),
            stream_done_below: 0,
        })
    }

    /// Number of consumers attached and alive.
    pub fn consumers(&mut self) -> usize {
        self.reap_dead_peers();
        self.peers.len()
    }

    /// Number of consumers that vanished without detaching (killed, crashed): each was noticed by its hang-up,
    /// marked dead, and stopped counting.
    pub fn consumers_lost(&mut self) -> usize {
        self.reap_dead_peers();
        self.lost
    }

    /// Admits consumers until `count` are attached, or `timeout` passes.
    ///
    /// # Errors
    /// [`FrameError::Timeout`] with the number that did attach.
    pub fn wait_for_consumers(&mut self, count: usize, timeout: Duration) -> Result<(), FrameError> {
        let deadline = Instant::now() + timeout;
        loop {
            self.admit_pending()?;
            if self.consumers() >= count {
                return Ok(());
            }
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

    /// Waits (on the CPU or, with `GpuStreamOps`, on `stream`) until the next frame's slot is free, and returns it.
    ///
    /// A slot is rewritten only after every live consumer released the frame it held; a consumer that dies stops
    /// counting. GPU strategies need `stream`; CPU ones ignore it.
    ///
    /// # Errors
    /// [`FrameError::Timeout`] when consumers do not release in time, driver errors.
    pub fn acquire(&mut self, stream: Option<&Stream>, timeout: Duration) -> Result<SlotLease, FrameError> {
        self.admit_pending()?;
        self.reap_dead_peers();
        let seq = self.next_seq;
        self.wait_slot_free(seq, stream, timeout)?;
        let slot = self.ring.slot_for(Sequence(seq)).0;
        Ok(SlotLease {
            seq,
            slot,
            ptr: self.region.ptr().offset(self.stride * u64::from(slot)),
            bytes: self.config.geometry.frame_bytes(),
        })
    }

    /// Waits until every live consumer has released every published frame (and the stream is synchronised):
    /// the end of a run.
    ///
    /// # Errors
    /// As [`Producer::acquire`].
    pub fn drain(&mut self, stream: Option<&Stream>, timeout: Duration) -> Result<(), FrameError> {
        self.reap_dead_peers();
        // Frame `s` may be overwritten once `s - slots` is released: the next `slots` sequences cover every frame
        // still held.
        for seq in self.next_seq..self.next_seq + u64::from(self.config.slots) {
            self.wait_slot_free(seq, stream, timeout)?;
        }
        match (&self.sync, stream) {
            // The stream holds the waits for the consumers' releases: bounded, since a consumer may be stuck.
            (ProducerSync::Gpu { run_ahead, .. }, Some(stream)) => run_ahead.drain(stream, Instant::now() + timeout),
            // Only our own work is queued (the peers' were awaited on the CPU above).
            (_, Some(stream)) => Ok(stream.synchronize()?),
            (_, None) => Ok(()),
        }
    }

    /// Makes the CPU (CPU strategies) or `stream` (GPU strategies) wait until frame `seq`'s slot may be written.
    fn wait_slot_free(&mut self, seq: u64, stream: Option<&Stream>, timeout: Duration) -> Result<(), FrameError> {
        let deadline = Instant::now() + timeout;
        match &self.sync {
            ProducerSync::Cpu(mode) => self.wait_reusable(seq, *mode, deadline),
            ProducerSync::Events { released, .. } => {
                super::need_stream(stream, "IpcEvent")?;
                self.wait_reusable(seq, WaitMode::Spin, deadline)?;
                // The counter says a consumer recorded its release event; the event says its reads are done. The
                // CPU polls the event rather than making the stream wait on it: an event recorded by a process that
                // dies before the work completes never completes, and a stream waiting on it could never be freed.
                let slot = self.ring.slot_for(Sequence(seq)).0 as usize;
                let block = self.ring.block();
                // Every consumer offered the ring, attached or still finishing its handshake: one that is not live
                // any more (gone, or its handshake failed) no longer reads anything.
                for (id, events) in released.iter().flatten() {
                    if let Some(event) = events.get(slot) {
                        let alive = || block.consumer_state(id.index()) == Some((ConsumerState::Live, id.epoch()));
                        let what = || format!("consumer {} to finish reading its frame in slot {slot}", id.index());
                        match super::wait_for_event(event, deadline, None, alive, what) {
                            // A consumer that died no longer reads anything: nothing to wait for.
                            Ok(()) | Err(FrameError::PeerGone) => {}
                            Err(e) => return Err(e),
                        }
                    }
                }
                Ok(())
            }
            ProducerSync::Gpu { registration, run_ahead } => {
                let stream = super::need_stream(stream, "GpuStreamOps")?;
                run_ahead.before(seq, deadline)?;
                // Frame `seq - depth` and all before it have gone through the stream.
                self.stream_done_below = self.stream_done_below.max((seq + 1).saturating_sub(run_ahead.depth()));
                loop {
                    self.pending.clear();
                    match self.ring.pending_releases(Sequence(seq), &mut self.pending) {
                        Ok(()) => break,
                        Err(RingError::JoinInProgress { .. }) if Instant::now() < deadline => std::thread::yield_now(),
                        Err(e) => return Err(e.into()),
                    }
                }
                for need in &self.pending {
                    registration.wait_value_u64(stream, need.offset, need.at_least, WaitCondition::AtLeast)?;
                }
                Ok(())
            }
        }
    }

    fn wait_reusable(&self, seq: u64, mode: WaitMode, deadline: Instant) -> Result<(), FrameError> {
        loop {
            match self.ring.wait_reusable(Sequence(seq), deadline, mode) {
                Ok(()) => return Ok(()),
                // A consumer died while we waited: stop counting it and wait again.
                Err(RingError::ConsumerGone { consumer, .. }) => {
                    tracing::info!(consumer = consumer.index(), "consumer gone while the producer waited");
                    self.ring.mark_consumer_dead(consumer)?;
                }
                Err(e) => return Err(e.into()),
            }
        }
    }

    /// Publishes the frame in `lease` once the work queued on `stream` (if any) is done.
    ///
    /// # Errors
    /// Driver errors; a GPU strategy without a stream.
    pub fn publish(&mut self, lease: SlotLease, stream: Option<&Stream>) -> Result<(), FrameError> {
        let seq = Sequence(lease.seq);
        match &self.sync {
            ProducerSync::Cpu(_) => {
                if let Some(stream) = stream {
                    stream.synchronize()?;
                }
                self.ring.publish(seq)?;
            }
            ProducerSync::Events { published, .. } => {
                let stream = super::need_stream(stream, "IpcEvent")?;
                published[lease.slot as usize].record(stream)?;
                self.ring.publish(seq)?;
            }
            ProducerSync::Gpu { registration, run_ahead } => {
                let stream = super::need_stream(stream, "GpuStreamOps")?;
                registration.write_value_u64(stream, published_offset(self.ring.slot_for(seq)), seq.done_value())?;
                run_ahead.after(lease.seq, stream)?;
                self.ring.advance(seq)?;
            }
        }
        self.next_seq = lease.seq + 1;
        Ok(())
    }

    /// Takes what the admission thread finished: hands the ring's offer to each consumer that said a valid hello,
    /// counts in each consumer that attached, retires the record of each handshake that failed. Never waits: the
    /// handshakes themselves run on the admission thread.
    ///
    /// # Errors
    /// None today (every failure is logged and survived); the `Result` stays for callers written against it.
    pub fn admit_pending(&mut self) -> Result<(), FrameError> {
        self.reap_dead_peers();
        while let Some(event) = self.admission.try_next() {
            match event {
                AdmissionEvent::WantsOffer { id, name } => {
                    let kit: OfferKit = self.make_offer(id).map_err(|e| {
                        tracing::warn!(consumer = id.index(), name, error = %e, "could not make an offer");
                        format!("the producer could not make its offer: {e}")
                    });
                    self.admission.offer(id, kit);
                }
                AdmissionEvent::Attached { id, pid, conn } => self.count_in(id, pid, conn),
                AdmissionEvent::Failed { id } => self.retired.push((id, self.next_seq)),
            }
        }
        self.reclaim_retired();
        Ok(())
    }

    /// Starts counting an attached consumer: the watchdog acts on its hang-up.
    fn count_in(&mut self, id: ConsumerId, pid: u32, conn: PeerConnection) {
        let ring = self.ring.clone();
        let watched = self.watchdog.watch(
            &conn,
            Box::new(move |first| {
                if !first {
                    let _ = ring.repoison_released(id);
                } else if ring.block().consumer_state(id.index()) == Some((ConsumerState::Live, id.epoch())) {
                    // (A consumer that detached first closes its connection too: nothing to do.)
                    tracing::warn!(consumer = id.index(), "consumer hung up; releasing what it held");
                    let _ = ring.mark_consumer_dead(id);
                }
            }),
        );
        match watched {
            Ok(()) => {
                tracing::info!(consumer = id.index(), pid, "consumer attached");
                self.peers.push(Peer { id, pid, _conn: conn });
            }
            Err(e) => {
                // Unwatched, its death would go unnoticed: let it go (closing the connection tells it).
                tracing::warn!(consumer = id.index(), pid, error = %e, "cannot watch a consumer; dropping it");
                let _ = self.ring.mark_consumer_dead(id);
                self.retired.push((id, self.next_seq));
            }
        }
    }

    /// The offer for record `id` and the fds that travel with it (the control memfd, and the data fd where the
    /// backend has one), exported now: the exporter keeps no copy.
    fn make_offer(&mut self, id: ConsumerId) -> Result<(Message, Vec<OwnedFd>), FrameError> {
        let exported = B::export(&self.region)?;
        let mut event_handles = Vec::new();
        if let ProducerSync::Events { published, released } = &mut self.sync {
            let cuda = B::cuda_context(&self.ctx)
                .ok_or_else(|| FrameError::Config("IPC events without a CUDA context".into()))?;
            let fresh = (0..self.config.slots)
                .map(|_| Event::new(cuda, EventFlags::INTERPROCESS))
                .collect::<Result<Vec<_>, _>>()?;
            for event in published.iter().chain(fresh.iter()) {
                event_handles.push(event.ipc_handle()?.0);
            }
            if let Some(record) = released.get_mut(id.index() as usize) {
                *record = Some((id, fresh));
            }
        }
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

    /// Drops consumers that are no longer live (the watchdog marked them dead when they hung up).
    fn reap_dead_peers(&mut self) {
        let block = self.ring.block();
        let next_seq = self.next_seq;
        let mut lost = 0;
        let mut retired = Vec::new();
        self.peers.retain(|peer| match block.consumer_state(peer.id.index()) {
            Some((ConsumerState::Live, epoch)) if epoch == peer.id.epoch() => true,
            state => {
                // Dead: its hang-up or its pid said it is gone without detaching. Detached: it left cleanly.
                let died = matches!(state, Some((ConsumerState::Dead, epoch)) if epoch == peer.id.epoch());
                lost += usize::from(died);
                tracing::info!(consumer = peer.id.index(), pid = peer.pid, died, "consumer gone");
                retired.push((peer.id, next_seq));
                false
            }
        });
        self.lost += lost;
        self.retired.append(&mut retired);
    }

    /// Frees the records of consumers that left, so later consumers can take them. With `GpuStreamOps` the stream
    /// may still hold waits on a record's counters (queued before the consumer left), and a new owner starts them
    /// at 0: such a record is freed only once the stream has passed every frame queued before the consumer left.
    fn reclaim_retired(&mut self) {
        let gpu = matches!(self.sync, ProducerSync::Gpu { .. });
        let done_below = self.stream_done_below;
        let ring = &self.ring;
        self.retired.retain(|&(id, left_at)| {
            if gpu && left_at > done_below {
                return true;
            }
            if let Err(e) = ring.reclaim_consumer(id) {
                tracing::warn!(consumer = id.index(), error = %e, "could not free a consumer record");
            }
            false
        });
    }
}

impl<B: Backend> Drop for Producer<B> {
    fn drop(&mut self) {
        // Consumers' waits end with ProducerGone.
        self.ring.close();
        self.admission.stop();
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
