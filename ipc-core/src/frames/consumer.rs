//! The consuming side of a frame ring.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use crate::backend::{Backend, ExportedHandle, SharedRegion};
use crate::frames::FrameError;
use crate::frames::strategy::{Closed, ConsumerShared, ConsumerSide, Setup, Strategy};
use crate::frames::watchdog::Watchdog;
use crate::resident::{FrameStamp, ResidentSide, device_words};
use crate::ring::layout::ConsumerState;
use crate::ring::{ConsumerControl, LivenessPolicy, RingError, Sequence, SlotIndex, WaitMode};
use crate::shm::SharedMemory;
use gpu_ipc_driver::{DeviceMemory, DevicePtr, DeviceSpan, Stream};

use crate::wire::{
    Attached, ClientHello, Detach, DetachReason, FrameGeometry, Message, OfferFds, PROTOCOL_VERSION, PeerConnection,
    PeerPolicy, RingOffer, SlotLayout, SyncStrategy, WITHOUT_EVENTS_VERSION, WireError,
};

/// How a consumer attaches.
#[derive(Debug, Clone)]
pub struct AttachOptions {
    /// A name for the producer's logs.
    pub name: String,
    /// Bound on connecting and the handshake once a producer listens (default 5 s).
    pub timeout: Duration,
    /// How long to wait for a producer to appear at the socket path (no socket file yet, or nobody listening)
    /// before giving up with [`WireError::NoProducer`] ("start the producer first"). Default zero: fail at once,
    /// so that a consumer started by mistake says so; set it when consumers may start before their producer.
    pub wait_for_producer: Duration,
    /// Poll interval of `CpuSleep`.
    pub sleep_interval: Duration,
    /// Bound on each CPU wait for GPU work made without a caller's timeout: a CPU strategy's wait for the
    /// frame's reads in `release`, and the wait at teardown for the work queued on the ring (default 10 s).
    pub gpu_timeout: Duration,
    /// Which users the producer may run as (default: ours alone; e.g. `PeerPolicy::Users(vec![uid])` for a
    /// producer run by service user `uid`).
    pub producer: PeerPolicy,
}

impl Default for AttachOptions {
    fn default() -> Self {
        Self {
            name: "consumer".into(),
            timeout: Duration::from_secs(5),
            wait_for_producer: Duration::ZERO,
            sleep_interval: Duration::from_micros(20),
            gpu_timeout: Duration::from_secs(10),
            producer: PeerPolicy::SameUser,
        }
    }
}

/// The right to read one published frame in place, until [`Consumer::release`] takes it back (by value, so a
/// frame cannot be released twice, nor used after its release):
///
/// ```compile_fail,E0382
/// # use std::time::Duration;
/// # use ipc_core::host::Host;
/// # use ipc_core::frames::{Consumer, FrameError};
/// # fn twice(consumer: &mut Consumer<Host>) -> Result<(), FrameError> {
/// let frame = consumer.next_frame(None, Duration::from_secs(1))?;
/// consumer.release(frame, None)?;
/// println!("{}", frame.seq()); // error[E0382]: borrow of moved value: `frame`
/// # Ok(())
/// # }
/// ```
///
/// A frame of another consumer (or of an earlier attachment) is refused by `release` before anything is queued.
#[derive(Debug, PartialEq, Eq)]
#[must_use = "release the frame, or the producer stalls"]
pub struct Frame {
    seq: Sequence,
    slot: SlotIndex,
    ptr: DevicePtr,
    bytes: u64,
    /// Where a kernel checks that the frame is the producer's (GPU-side strategies).
    stamp: Option<FrameStamp>,
    /// The consumer that received it ([`super::owner_token`]).
    owner: u64,
}

impl Frame {
    /// Its sequence number (0, 1, 2, ... as the producer published them).
    pub fn seq(&self) -> Sequence {
        self.seq
    }

    /// The slot it occupies.
    pub fn slot(&self) -> SlotIndex {
        self.slot
    }

    /// Where it is, in this process's device address space (host address with the host backend).
    /// [`Consumer::frame_span`] gives the same memory as a bounds-checked span.
    pub fn ptr(&self) -> DevicePtr {
        self.ptr
    }

    /// Its size in bytes.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// Where a kernel checks, on the device, that this frame is the one the producer published, before it reads a
    /// word of it: the device address of the `published` word of its slot and the value it must hold (the stamp
    /// rule: `(word & STAMP_MASK) == expected`, see [`FrameStamp`] and `docs/ring.md`). `Some` with the GPU-side
    /// strategies (`GpuStreamOps`, `GpuPoll`), which register the control block for the device: their stream waits
    /// are released by a dead producer's poison too, and a kernel queued behind them would otherwise read a frame
    /// that was never written. `None` with the CPU strategies and `IpcEvent`, which hand out a frame only once the
    /// host saw it published. The address is valid while the consumer is attached; [`Consumer::stamp_span`] gives
    /// it as a span borrowed from the consumer.
    pub fn stamp(&self) -> Option<FrameStamp> {
        self.stamp
    }
}

/// The consuming end of a frame ring: attached once, then frames are read in place, in order.
///
/// The fields marked `pub(crate)` are what the GPU-resident path (`crate::resident`: kernels launched on the ring,
/// frame graphs) reads and moves when it adds its methods to the consumer.
pub struct Consumer<B: Backend> {
    watchdog: Watchdog,
    pub(crate) sync: Box<dyn ConsumerSide>,
    /// In an `Arc` so that teardown can leak it on purpose (see `Drop`) without `unsafe`.
    pub(crate) region: Arc<B::Imported>,
    pub(crate) shared: ConsumerShared,
    conn: PeerConnection,
    pub(crate) offer: RingOffer,
    /// The protocol version agreed with the producer (its offer's): what this consumer's messages go out in.
    version: u16,
    pub(crate) next_seq: u64,
    /// Tells this consumer's frames from any other's.
    owner: u64,
    gpu_timeout: Duration,
    /// Poll interval of `CpuSleep` ([`AttachOptions::sleep_interval`]).
    sleep_interval: Duration,
    /// Set once teardown ran (by `detach`), so `Drop` does not run it again.
    left: bool,
    /// The work launched on the ring ([`Consumer::launch_on_ring`], frame graphs): its abort word (raised by the
    /// watchdog at the producer's hang-up) and port.
    pub(crate) resident: ResidentSide,
    /// Byte offset of the ring's device words in the allocation ([`device_words`]), 0: none, or this consumer is
    /// on another GPU than the ring.
    pub(crate) device_words: u64,
}

impl<B: Backend> Consumer<B> {
    /// Connects to the producer at `socket_path`, imports the ring (one import for all slots) and joins it: the
    /// first frame it gets is the producer's next one.
    ///
    /// # Errors
    /// No producer listening ("start the producer first"), a refusal, a backend mismatch, a producer with no
    /// protocol version in common ([`WireError::VersionRefused`]), a strategy this device cannot run
    /// ([`FrameError::StrategyUnavailable`]), import errors. When the import fails the consumer tells
    /// the producer (`Detach(ImportFailed)`) before it returns.
    pub fn attach(ctx: &B::Context, socket_path: &Path, options: &AttachOptions) -> Result<Self, FrameError> {
        let conn = connect_waiting(socket_path, options)?;
        let deadline = Instant::now() + options.timeout;
        let left = || deadline.saturating_duration_since(Instant::now());
        let hello = ClientHello {
            object: crate::wire::ObjectKind::Ring,
            part: 0,
            protocol_version: PROTOCOL_VERSION,
            client_pid: std::process::id(),
            wanted_backend: Some(B::KIND),
            consumer_name: options.name.clone(),
        };
        // Encoded in version 1, which producers of every release read, announcing the newest version we speak: a
        // producer that speaks only version 1 offers its pixel frames as before (docs/protocol.md, "Versions").
        if let Err(e) = conn.send(&Message::ClientHello(hello), Vec::new(), left()) {
            // A producer that refuses us at once (its uid check) sends `Refused` and hangs up, maybe before our
            // hello went out: its answer is still queued for us, and says more than the broken pipe.
            if let Ok(answer) = conn.recv(left().min(Duration::from_millis(100))) {
                answer.into_ring_offer()?;
            }
            return Err(e.into());
        }
        let (version, (offer, fds)) = match conn.recv(left()) {
            // A producer answers in the newest version both speak (version 1 for a producer of an older release):
            // this consumer speaks that one from now on.
            Ok(answer) => (answer.version, answer.into_ring_offer()?),
            // A producer still running that hangs up before its offer dropped this handshake (it did not make the
            // offer within its handshake timeout): say so, so that the caller may attach again.
            Err(WireError::PeerHungUp { .. }) if conn.peer().pid.is_none_or(still_runs) => {
                return Err(dropped_handshake(&conn));
            }
            Err(e) => return Err(e.into()),
        };
        let joined = Self::join(ctx, &conn, &offer, fds, options, version);
        let (strategy, sync, region, ring, device_words) = match joined {
            Ok(parts) => parts,
            Err(e) => {
                // Tell the producer why, so its handshake ends now rather than at its deadline.
                let bye = Detach { consumer_id: offer.consumer_id, reason: DetachReason::ImportFailed };
                let _ = conn.send_in(version, &Message::Detach(bye), Vec::new(), Duration::from_millis(200));
                return Err(e);
            }
        };
        let next_seq = ring.join_sequence().0;
        let attached = Attached { consumer_id: offer.consumer_id };
        // A consumer that could not open the ring's IPC events says so: the producer then publishes its frames only
        // once they are done, and waits for its releases on the counters alone.
        let attached =
            if sync.without_events() { Message::AttachedWithoutEvents(attached) } else { Message::Attached(attached) };
        conn.send_in(version, &attached, Vec::new(), left())?;
        let watchdog = Watchdog::start();
        let producer_hung_up = Arc::new(AtomicBool::new(false));
        let published_below_at_hang_up = Arc::new(AtomicU64::new(0));
        let resident = ResidentSide::default();
        {
            let (ring, flag, below) = (ring.clone(), producer_hung_up.clone(), published_below_at_hang_up.clone());
            let abort = resident.abort_word();
            let gpu_writes = strategy.gpu_writes_counters();
            watchdog
                .watch(
                    &conn,
                    Box::new(move |first| {
                        if first {
                            let id = ring.id();
                            if ring.block().consumer_state(id.index()) != Some((ConsumerState::Live, id.epoch())) {
                                // The producer dropped us (a handshake it gave up on, marked dead before the
                                // hang-up), it did not die: the ring is not ours to poison.
                                tracing::warn!("the producer hung up on this consumer, whose record is no longer live");
                                return false;
                            }
                            tracing::warn!("the producer hung up; releasing waits on it");
                            // What it really published, read before the poison hides it.
                            below.store(ring.highest_published().map_or(0, |s| s + 1), Ordering::Release);
                            flag.store(true, Ordering::Release);
                            // A kernel launched on the ring leaves at once (docs/kernels.md, persistent kernels),
                            // and so does one the dead producer launched (docs/frames.md, "Kills under MPS").
                            abort.raise();
                            ring.raise_producer_kernel_abort();
                        }
                        ring.poison_published();
                        // The producer's queued GPU stores of `published` may still land: repeat.
                        gpu_writes
                    }),
                )
                .map_err(|e| FrameError::Config(format!("watching the producer's connection: {e}")))?;
        }
        tracing::info!(consumer = offer.consumer_id, backend = B::KIND.name(), sync = %offer.sync, first = next_seq, "attached");
        let shared =
            ConsumerShared { ring, producer_hung_up, producer_pid: offer.producer_pid, published_below_at_hang_up };
        Ok(Self {
            watchdog,
            sync,
            region: Arc::new(region),
            shared,
            conn,
            offer,
            version,
            next_seq,
            owner: super::owner_token(),
            gpu_timeout: options.gpu_timeout,
            sleep_interval: options.sleep_interval,
            left: false,
            resident,
            device_words,
        })
    }

    /// Maps the control block, imports the data and sets up the strategy's side; `version` is the protocol version
    /// agreed with the producer.
    ///
    /// Also returns the device words' offset in the allocation as this side's kernels use it (0: none).
    #[allow(clippy::type_complexity)]
    fn join(
        ctx: &B::Context,
        conn: &PeerConnection,
        offer: &RingOffer,
        fds: OfferFds,
        options: &AttachOptions,
        version: u16,
    ) -> Result<(&'static dyn Strategy, Box<dyn ConsumerSide>, B::Imported, Arc<ConsumerControl>, u64), FrameError>
    {
        let strategy = super::strategy::strategy(offer.sync);
        let cuda = B::cuda_context(ctx);
        strategy.check(cuda)?;
        // The producer's pid as this process sees it: 0 when the producer is in a PID namespace we cannot see, or
        // another number when we see it under another pid. Then pids say nothing here: the socket's hang-up is
        // how we learn that the producer died.
        let same_pid_namespace = conn.peer().pid == Some(offer.producer_pid);
        let policy = LivenessPolicy { check_pid: same_pid_namespace, ..LivenessPolicy::default() };
        if !same_pid_namespace {
            tracing::info!(
                producer_pid = offer.producer_pid,
                seen_as = ?conn.peer().pid,
                "the producer is in another PID namespace: its liveness comes from the socket"
            );
        }
        // The control block must be the ring the offer describes (docs/protocol.md, attaching, step 4), checked
        // before the record is read (step 5).
        let control = match ConsumerControl::attach_offered(
            fds.control,
            offer.consumer_id,
            offer.slot_count,
            offer.generation,
            policy,
        ) {
            Ok(control) => control,
            // A record already given back (no longer LIVE) by a producer that dropped this handshake: it hangs up
            // right after marking the record dead.
            Err(RingError::NotLive { .. }) if hangs_up_within(conn, Duration::from_millis(100)) => {
                return Err(dropped_handshake(conn));
            }
            Err(e) => return Err(e.into()),
        };
        // The record's epoch was just read from its state word; it is ours only if the producer has not dropped
        // this handshake meanwhile (a consumer slower than the handshake deadline): the producer hangs up on a
        // failed handshake before it gives the record back for reuse, so an open connection now proves that the
        // epoch read above was not a newcomer's.
        if conn.is_peer_gone()? {
            // Let go of the record without leaving it: it may already be someone else's.
            control.abandon();
            return Err(dropped_handshake(conn));
        }
        let ring = Arc::new(control);
        // Kernels on the ring write the device words: they must lie after the slots, inside the allocation.
        let device_words = ring.block().device_words_offset();
        let slots_end =
            offer.slot_stride_bytes.saturating_mul(u64::from(offer.slot_count)).saturating_add(offer.data_offset);
        if device_words != 0 {
            device_words::check(device_words, slots_end, offer.allocation_bytes).map_err(|problem| {
                FrameError::Config(format!("the producer's control block is malformed: {problem}"))
            })?;
        }
        let handle = ExportedHandle {
            bytes: offer.legacy_mem_handle.map(|h| h.to_vec()).unwrap_or_default(),
            fd: fds.data,
            size: offer.allocation_bytes,
        };
        let region = B::import(ctx, handle)?;
        // Written once by the producer before its offers, checked above. Kernels use them only on the ring's own GPU:
        // their stores and polls are scoped to it (gpu_ipc_ring.cuh), so a consumer on a peer GPU hands its kernels
        // none and they use the control block's copy.
        let same_gpu = cuda.and_then(|c| c.device().uuid().ok()) == Some(offer.device_uuid);
        let device_words = if same_gpu && device_words::enabled() { device_words } else { 0 };
        let sync = strategy.consumer(
            Setup {
                cuda,
                block: ring.block().shared(),
                layout: ring.block().layout(),
                slots: offer.slot_count,
                max_consumers: ring.block().max_consumers(),
                sleep_interval: options.sleep_interval,
                device_words: if device_words == 0 { 0 } else { region.ptr().offset(device_words).raw() },
            },
            &offer.event_handles,
        )?;
        if sync.without_events() && version < WITHOUT_EVENTS_VERSION {
            return Err(events_unreachable_and_producer_too_old(version));
        }
        Ok((strategy, sync, region, ring, device_words))
    }

    /// What each slot holds: pixel frames, a tensor (dtype, shape, strides) or bare bytes, as the producer
    /// described it.
    pub fn slot_layout(&self) -> &SlotLayout {
        &self.offer.slot_layout
    }

    /// The geometry of every frame, for code written for rings of pixel frames ([`SlotLayout::pixel_view`]): a
    /// ring of tensors or bytes is seen as rows of `gray8` bytes covering the slot; [`Consumer::slot_layout`]
    /// says what the slots really hold.
    pub fn geometry(&self) -> FrameGeometry {
        self.offer.slot_layout.pixel_view()
    }

    /// The wire protocol version agreed with the producer: [`PROTOCOL_VERSION`] with a producer of this release,
    /// 1 with one that speaks only version 1 (which offers pixel frames only).
    pub fn protocol_version(&self) -> u16 {
        self.version
    }

    /// Whether this consumer runs an `ipc-event` ring without the IPC events it was offered: it could not open them
    /// (`cuIpcOpenEventHandle` fails with `CUDA_ERROR_MAP_FAILED` from another IPC namespace, a container's
    /// default), so it waits for frames on the ring's counters as `cpu-spin` does, and its producer publishes frames
    /// only once they are done while it is attached (`docs/containers.md`). False with every other strategy.
    pub fn without_ipc_events(&self) -> bool {
        self.sync.without_events()
    }

    /// What the producer offered (backend, strategy, slots, ...).
    pub fn offer(&self) -> &RingOffer {
        &self.offer
    }

    /// This consumer's mapping of the producer's allocation.
    pub fn region(&self) -> &B::Imported {
        &self.region
    }

    /// The same mapping, shared: a view of a frame that may outlive this consumer (a DLPack tensor in Python)
    /// holds a clone, so the memory stays mapped until the last holder drops it. Whoever drops the last clone
    /// unmaps it, and must first make sure no queued GPU work still reads it (this consumer's own teardown waits
    /// only for the work it queued).
    pub fn shared_region(&self) -> Arc<B::Imported> {
        self.region.clone()
    }

    /// The `published` word of slot `slot` in the ring's control block, as host memory: the mapping (it stays
    /// mapped while the `Arc` lives, even after this consumer is gone) and the word's byte offset in it, or `None`
    /// for a slot the ring does not have. While a frame of that slot is the producer's the word holds its stamp,
    /// `(word & STAMP_MASK) == frame.seq().done_value()`, whatever the strategy; once the slot carries a later frame
    /// (or a dead producer's poison) it does not. What a host-side stamp check reads (the Python package's
    /// `Frame.stamp` on the host backend and with the CPU strategies), where [`Frame::stamp`] gives the device
    /// address. Read it only as an aligned 64-bit atomic.
    pub fn published_word(&self, slot: SlotIndex) -> Option<(Arc<SharedMemory>, usize)> {
        let block = self.shared.ring.block();
        (slot.0 < block.slot_count()).then(|| (block.shared(), block.layout().published_offset(slot)))
    }

    /// The sequence number the next [`Consumer::next_frame`] returns.
    pub fn next_sequence(&self) -> u64 {
        self.next_seq
    }

    /// Checks that the producer is alive and has not closed the ring, and that it has not evicted this consumer.
    ///
    /// # Errors
    /// [`FrameError::EndOfStream`] when the producer closed the ring (a clean end), [`FrameError::ProducerGone`]
    /// when it died (or abandoned the ring), [`FrameError::Evicted`].
    pub fn check_producer(&self) -> Result<(), FrameError> {
        if self.shared.hung_up() || self.shared.ring.closed_after().is_some() {
            return Err(self.shared.gone("its connection hung up (the process exited or was killed)"));
        }
        self.shared.ring.check_producer().map_err(|e| self.shared.map_ring(e, "producer"))?;
        self.check_evicted()
    }

    /// [`FrameError::Evicted`] when this consumer's record is no longer live (the producer declared it dead).
    fn check_evicted(&self) -> Result<(), FrameError> {
        let id = self.shared.ring.id();
        match self.shared.ring.block().consumer_state(id.index()) {
            Some((ConsumerState::Live, epoch)) if epoch == id.epoch() => Ok(()),
            _ => Err(FrameError::Evicted { consumer: id.index() }),
        }
    }

    /// Waits for the next frame. CPU strategies return when it is published; GPU-side strategies make `stream`
    /// wait for it (the GPU does the waiting). Frames published before the producer closed the ring are still
    /// delivered; after them comes [`FrameError::EndOfStream`] (the clean end of the stream), never
    /// [`FrameError::ProducerGone`], which means the producer died (or abandoned the ring).
    ///
    /// # Errors
    /// [`FrameError::EndOfStream`] once every frame of a closed ring was handed out, [`FrameError::ProducerGone`]
    /// (within about a millisecond of the producer's death), [`FrameError::Evicted`], [`FrameError::Timeout`].
    pub fn next_frame(&mut self, stream: Option<&Stream>, timeout: Duration) -> Result<Frame, FrameError> {
        let seq = Sequence(self.next_seq);
        self.check_no_ring_kernel()?;
        self.check_evicted()?;
        // The end of a closed ring is known from the control block before any wait is queued for a frame past it.
        if let Some(end) = self.shared.ring.closed_after()
            && seq >= end
        {
            return Err(FrameError::EndOfStream { published: end.0, past_end: None });
        }
        if !matches!(self.shared.ring.is_published(seq), Ok(true)) {
            self.check_producer()?;
        }
        let deadline = Instant::now() + timeout;
        let slot = self.shared.ring.block().slot_for(seq);
        if let Err(e) = self.sync.wait_frame(&self.shared, seq, slot, stream, deadline) {
            // The slot already holding a later frame happens only to a consumer that no longer counts (one that was
            // stopped, say, long enough to be evicted): say that, rather than the overrun it caused.
            if matches!(e, FrameError::Ring(RingError::Overrun { .. })) {
                self.check_evicted()?;
            }
            return Err(e);
        }
        self.next_seq = seq.0 + 1;
        let stamp = self.sync.control_block().map(|control| FrameStamp {
            device_ptr: control.ptr().offset(self.shared.ring.block().layout().published_offset(slot) as u64),
            expected: seq.done_value(),
        });
        Ok(Frame {
            seq,
            slot,
            ptr: self.region.ptr().offset(self.offer.data_offset + self.offer.slot_stride_bytes * u64::from(slot.0)),
            bytes: self.offer.slot_layout.bytes(),
            stamp,
            owner: self.owner,
        })
    }

    /// Waits on the CPU, at most `timeout`, until `frame` is known to be published by its producer. With a CPU
    /// strategy [`Consumer::next_frame`] hands out a frame only once it is, so this returns at once. With a GPU-side
    /// strategy (`GpuStreamOps`, `GpuPoll`) `next_frame` only queued the stream's wait, and the end of the stream or
    /// the producer's death releases that wait without the frame: call this before doing, with what was computed
    /// from the frame, something that cannot be taken back, such as publishing it into another ring (what a
    /// pipeline [`Stage`](crate::frames::Stage) does). It spins (sleeps between looks with `CpuSleep`).
    ///
    /// # Errors
    /// [`FrameError::EndOfStream`] with `past_end` naming the frame when the producer closed the ring before it
    /// (the frame was never written), [`FrameError::ProducerGone`], [`FrameError::Timeout`], a frame that is not
    /// this consumer's ([`FrameError::ForeignToken`]).
    pub fn wait_published(&self, frame: &Frame, timeout: Duration) -> Result<(), FrameError> {
        self.check_owner(frame)?;
        let mode = match self.offer.sync {
            SyncStrategy::CpuSleep => WaitMode::Sleep(self.sleep_interval),
            _ => WaitMode::Spin,
        };
        self.shared.wait_published(frame.seq, mode, Instant::now() + timeout).map_err(|e| match e {
            FrameError::EndOfStream { published, .. } if frame.seq.0 >= published => {
                FrameError::EndOfStream { published, past_end: Some(frame.seq.0) }
            }
            other => other,
        })
    }

    /// [`FrameError::ForeignToken`] for a frame another consumer (or an earlier attachment) received.
    pub(crate) fn check_owner(&self, frame: &Frame) -> Result<(), FrameError> {
        if frame.owner != self.owner {
            return Err(FrameError::ForeignToken {
                token: "frame",
                problem: format!("frame {} was received by another consumer (or an earlier attachment)", frame.seq.0),
            });
        }
        Ok(())
    }

    /// Releases `frame` once the work queued on `stream` (if any) has read it; the producer may then rewrite its
    /// slot.
    ///
    /// # Errors
    /// [`FrameError::EndOfStream`] with `past_end` naming the frame when the producer closed the ring before it
    /// published it (a GPU-side strategy's wait queued past the end: discard what was computed from the frame),
    /// [`FrameError::ProducerGone`] with a GPU-side strategy when the producer died meanwhile (the frame may then
    /// hold partial data), [`FrameError::Evicted`], [`FrameError::Timeout`] when a CPU strategy's wait for the
    /// stream passes [`AttachOptions::gpu_timeout`].
    pub fn release(&mut self, frame: Frame, stream: Option<&Stream>) -> Result<(), FrameError> {
        self.check_owner(&frame)?;
        let gpu_deadline = Instant::now() + self.gpu_timeout;
        self.sync.release(&self.shared, frame.seq, frame.slot, stream, gpu_deadline)
    }

    /// After [`FrameError::ProducerGone`] because the producer died: one past the highest frame it had published
    /// when this consumer saw it hang up (`None` while it has not). With a GPU-side strategy the stream's waits for
    /// later frames were released by the poison, not by a publish: whatever the stream computed from frames at or
    /// above this number is garbage and must be discarded, even where `release` returned `Ok` (it returns before
    /// the GPU reaches the wait).
    pub fn published_below_at_hang_up(&self) -> Option<u64> {
        self.shared.hung_up().then(|| self.shared.published_below_at_hang_up.load(Ordering::Acquire))
    }

    /// Leaves the ring cleanly: waits (bounded by [`AttachOptions::gpu_timeout`]) for the GPU work this consumer
    /// queued on the ring, detaches its record (the producer stops counting it at once), then says `Detach` and
    /// closes the connection. Dropping the consumer does the same without the message.
    pub fn detach(mut self) {
        if self.leave() {
            let bye = Detach { consumer_id: self.offer.consumer_id, reason: DetachReason::ConsumerDone };
            let _ = self.conn.send_in(self.version, &Message::Detach(bye), Vec::new(), Duration::from_millis(200));
        }
    }

    /// Teardown: true when the record was detached; false when the GPU work did not finish in time, in which
    /// case the mappings are leaked on purpose and the record left live, so that the producer sees the hang-up,
    /// counts this consumer as gone and quarantines its record.
    fn leave(&mut self) -> bool {
        if self.left {
            return false;
        }
        self.left = true;
        let deadline = Instant::now() + self.gpu_timeout;
        // A kernel launched on the ring leaves on the abort word; the ring is freed only once it has.
        let kernel_left = self.resident.leave(deadline) != crate::resident::Departure::Stuck;
        let settled = kernel_left && self.sync.settle(deadline);
        if settled {
            if let Err(error) = self.shared.ring.leave() {
                tracing::debug!(%error, "consumer detach: record no longer live");
            }
        } else {
            tracing::error!(
                "this consumer's stream did not finish its work on the ring within {:?}: leaking the ring's \
                 mappings rather than freeing them under the GPU",
                self.gpu_timeout
            );
            std::mem::forget(self.region.clone());
            std::mem::forget(self.shared.ring.clone());
            std::mem::forget(std::mem::replace(&mut self.sync, Box::new(Closed)));
        }
        self.watchdog.stop();
        settled
    }
}

impl<B: Backend> Consumer<B>
where
    B::Imported: DeviceMemory,
{
    /// The device memory of `frame`, bounds-checked, borrowed from the consumer: what the caller's kernel reads. It
    /// cannot outlive the ring.
    ///
    /// # Errors
    /// A frame that is not from this consumer's ring.
    pub fn frame_span(&self, frame: &Frame) -> Result<DeviceSpan<'_>, FrameError> {
        Ok(self.region.span().sub_span_at(frame.ptr, frame.bytes)?)
    }
}

impl<B: Backend> Drop for Consumer<B> {
    fn drop(&mut self) {
        self.leave();
    }
}

/// Why a consumer that cannot open the ring's IPC events cannot run it without them: the producer, speaking protocol
/// `version`, is of a release that cannot be told so.
fn events_unreachable_and_producer_too_old(version: u16) -> FrameError {
    FrameError::StrategyUnavailable {
        strategy: SyncStrategy::IpcEvent.to_string(),
        reason: format!(
            "this process cannot open the producer's CUDA IPC events (cuIpcOpenEventHandle: CUDA_ERROR_MAP_FAILED): \
             it runs in another IPC namespace than the producer (a container's default under Docker and Kubernetes) \
             or with a private /dev/shm; the producer speaks wire protocol version {version}, older than \
             {WITHOUT_EVENTS_VERSION}, so it cannot run the ring without events for this consumer; use the \
             gpu-stream-ops, cpu-spin or cpu-sleep strategy, share the IPC namespace (docker run --ipc=host, \
             Kubernetes hostIPC: true), or upgrade the producer"
        ),
    }
}

/// Connects to the producer, retrying while none listens for up to [`AttachOptions::wait_for_producer`].
fn connect_waiting(socket_path: &Path, options: &AttachOptions) -> Result<PeerConnection, FrameError> {
    let give_up = Instant::now() + options.wait_for_producer;
    loop {
        match PeerConnection::connect_with(socket_path, options.timeout, &options.producer) {
            Err(WireError::NoProducer { .. }) if Instant::now() < give_up => {
                std::thread::sleep(Duration::from_millis(20).min(give_up.saturating_duration_since(Instant::now())));
            }
            other => return Ok(other?),
        }
    }
}

/// Whether the process that just hung up still runs, looked at twice 20 ms apart: a process on its way out closes
/// its sockets before it turns into a zombie.
fn still_runs(pid: u32) -> bool {
    process_runs(pid) && {
        std::thread::sleep(Duration::from_millis(20));
        process_runs(pid)
    }
}

/// Whether process `pid` (as this process sees it) still runs: false when it does not exist (`ESRCH`) or is a
/// zombie or dying (`/proc/PID/stat` state `Z` or `X`: a producer that crashed closes its sockets before its
/// parent reaps it). Unknown counts as running.
fn process_runs(pid: u32) -> bool {
    let Some(raw) = i32::try_from(pid).ok().and_then(rustix::process::Pid::from_raw) else { return true };
    if matches!(rustix::process::test_kill_process(raw), Err(rustix::io::Errno::SRCH)) {
        return false;
    }
    // The state follows the command name, which is in parentheses and may itself hold any character.
    let state = std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|stat| stat.rsplit_once(')').and_then(|(_, rest)| rest.trim_start().chars().next()));
    !matches!(state, Some('Z' | 'X'))
}

/// Whether the peer hangs up within `limit` (an error polling counts as a hang-up).
fn hangs_up_within(conn: &PeerConnection, limit: Duration) -> bool {
    let end = Instant::now() + limit;
    loop {
        if conn.is_peer_gone().unwrap_or(true) {
            return true;
        }
        if Instant::now() >= end {
            return false;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// Why a handshake the producer hung up on failed: a producer shutting down says so (`Refused`, code 5) before it
/// hangs up: that, not a timeout.
fn dropped_handshake(conn: &PeerConnection) -> FrameError {
    if let Ok(answer) = conn.recv(Duration::ZERO)
        && let Message::Refused(refused) = answer.message
    {
        return refused.into_error().into();
    }
    FrameError::Config(
        "the producer dropped this handshake before the consumer joined (it did not end within the producer's \
         handshake timeout: a producer that does not serve new consumers meanwhile, or a consumer stopped or slow \
         while attaching); attach again, a bounded number of times"
            .into(),
    )
}
