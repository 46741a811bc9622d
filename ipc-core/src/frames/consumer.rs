//! The consuming side of a frame ring.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use crate::backend::{Backend, ExportedHandle, SharedRegion};
use crate::driver::{DevicePtr, Event, HostRegistration, IpcEventHandle, Stream, WaitCondition};
use crate::frames::FrameError;
use crate::frames::run_ahead::RunAhead;
use crate::frames::watchdog::Watchdog;
use crate::ring::layout::{ControlBlockLayout, published_offset, released_offset};
use crate::ring::{ConsumerControl, GoneReason, LivenessPolicy, RingError, Sequence, WaitMode};
use crate::sys::shm::SharedObject;
use crate::wire::{
    Attached, ClientHello, Detach, DetachReason, FrameGeometry, Message, PROTOCOL_VERSION, PeerConnection, RingOffer,
    SyncStrategy,
};

/// How a consumer attaches.
#[derive(Debug, Clone)]
pub struct AttachOptions {
    /// A name for the producer's logs.
    pub name: String,
    /// Bound on connecting and the handshake.
    pub timeout: Duration,
    /// Poll interval of `CpuSleep`.
    pub sleep_interval: Duration,
}

impl Default for AttachOptions {
    fn default() -> Self {
        Self { name: "consumer".into(), timeout: Duration::from_secs(5), sleep_interval: Duration::from_micros(20) }
    }
}

/// A published frame, readable in place until it is released.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[must_use = "release the frame, or the producer stalls"]
pub struct Frame {
    /// Its sequence number.
    pub seq: u64,
    /// Its slot.
    pub slot: u32,
    /// Where it is, in this process's device address space.
    pub ptr: DevicePtr,
    /// Its size in bytes.
    pub bytes: u64,
}

enum ConsumerSync {
    Cpu(WaitMode),
    Events { published: Vec<Event>, released: Vec<Event> },
    Gpu { registration: HostRegistration<SharedObject<ControlBlockLayout>>, run_ahead: RunAhead },
}

/// The consuming end of a frame ring: attached once, then frames are read in place, in order.
pub struct Consumer<B: Backend> {
    // Field order is drop order: stop the watchdog and the stream helpers before unmapping anything.
    watchdog: Watchdog,
    sync: ConsumerSync,
    region: B::Imported,
    ring: Arc<ConsumerControl>,
    conn: PeerConnection,
    producer_hung_up: Arc<AtomicBool>,
    offer: RingOffer,
    next_seq: u64,
}

impl<B: Backend> Consumer<B> {
    /// Connects to the producer at `socket_path`, imports the ring (one import for all slots) and joins it: the
    /// first frame it gets is the producer's next one.
    ///
    /// # Errors
    /// No producer listening ("start the producer first"), a refusal, a backend mismatch, import errors.
    pub fn attach(ctx: &B::Context, socket_path: &Path, options: &AttachOptions) -> Result<Self, FrameError> {
        let deadline = Instant::now() + options.timeout;
        let left = || deadline.saturating_duration_since(Instant::now());
        let conn = PeerConnection::connect(socket_path, left())?;
        let hello = ClientHello {
            protocol_version: PROTOCOL_VERSION,
            client_pid: std::process::id(),
            wanted_backend: Some(B::KIND),
            consumer_name: options.name.clone(),
        };
        conn.send(&Message::ClientHello(hello), Vec::new(), left())?;
        let (offer, fds) = conn.recv(left())?.into_ring_offer()?;
        let ring = Arc::new(ConsumerControl::attach_index(fds.control, offer.consumer_id, LivenessPolicy::default())?);
        let handle = ExportedHandle {
            bytes: offer.legacy_mem_handle.map(|h| h.to_vec()).unwrap_or_default(),
            fd: fds.data,
            size: offer.allocation_bytes,
        };
        let region = B::import(ctx, handle)?;
        let cuda = B::cuda_context(ctx);
        let unavailable = |reason: &str| super::unavailable(offer.sync, reason);
        let sync = match offer.sync {
            SyncStrategy::CpuSpin => ConsumerSync::Cpu(WaitMode::Spin),
            SyncStrategy::CpuSleep => ConsumerSync::Cpu(WaitMode::Sleep(options.sleep_interval)),
            SyncStrategy::IpcEvent => {
                let cuda = cuda.ok_or_else(|| unavailable("IPC events need a CUDA backend"))?;
                let slots = offer.slot_count as usize;
                if offer.event_handles.len() != 2 * slots {
                    return Err(FrameError::Config(format!(
                        "expected {} IPC event handles, got {}",
                        2 * slots,
                        offer.event_handles.len()
                    )));
                }
                let mut events = offer
                    .event_handles
                    .iter()
                    .map(|h| Event::open_ipc(cuda, IpcEventHandle(*h)))
                    .collect::<Result<Vec<_>, _>>()?;
                let released = events.split_off(slots);
                ConsumerSync::Events { published: events, released }
            }
            SyncStrategy::GpuStreamOps => {
                let cuda = cuda.ok_or_else(|| unavailable("stream memory operations need a CUDA backend"))?;
                ConsumerSync::Gpu {
                    registration: HostRegistration::new(cuda, ring.block().shared())?,
                    run_ahead: RunAhead::new(cuda, 2 * offer.slot_count as usize)?,
                }
            }
        };
        let next_seq = ring.join_sequence().0;
        conn.send(&Message::Attached(Attached { consumer_id: offer.consumer_id }), Vec::new(), left())?;
        let watchdog = Watchdog::start();
        let producer_hung_up = Arc::new(AtomicBool::new(false));
        {
            let (ring, flag) = (ring.clone(), producer_hung_up.clone());
            watchdog
                .watch(
                    &conn,
                    Box::new(move |first| {
                        if first {
                            tracing::warn!("the producer hung up; releasing waits on it");
                            flag.store(true, Ordering::Release);
                        }
                        ring.poison_published();
                    }),
                )
                .map_err(|e| FrameError::Config(format!("watching the producer's connection: {e}")))?;
        }
        tracing::info!(consumer = offer.consumer_id, backend = B::NAME, sync = %offer.sync, first = next_seq, "attached");
        Ok(Self { watchdog, sync, region, ring, conn, producer_hung_up, offer, next_seq })
    }

    /// The geometry of every frame.
    pub fn geometry(&self) -> FrameGeometry {
        self.offer.geometry
    }

    /// What the producer offered (backend, strategy, slots, ...).
    pub fn offer(&self) -> &RingOffer {
        &self.offer
    }

    /// This consumer's mapping of the producer's allocation.
    pub fn region(&self) -> &B::Imported {
        &self.region
    }

    /// The sequence number the next [`Consumer::next_frame`] returns.
    pub fn next_sequence(&self) -> u64 {
        self.next_seq
    }

    fn gone(&self, how: impl Into<String>) -> FrameError {
        FrameError::ProducerGone { pid: self.offer.producer_pid, how: how.into() }
    }

    /// Checks that the producer is alive and has not closed the ring.
    ///
    /// # Errors
    /// [`FrameError::ProducerGone`].
    pub fn check_producer(&self) -> Result<(), FrameError> {
        if self.producer_hung_up.load(Ordering::Acquire) {
            return Err(self.gone("its connection hung up (the process exited or was killed)"));
        }
        self.ring.check_producer().map_err(|e| self.map_ring(e, "producer"))
    }

    fn map_ring(&self, e: RingError, what: &str) -> FrameError {
        match e {
            RingError::ProducerGone { reason, .. } => self.gone(match reason {
                GoneReason::Closed => "it closed the ring".to_owned(),
                other => format!("{other:?}"),
            }),
            RingError::Timeout { waited, .. } => FrameError::Timeout { what: what.to_owned(), waited },
            other => other.into(),
        }
    }

    /// Waits for the next frame. CPU strategies return when it is published; `IpcEvent` and `GpuStreamOps` make
    /// `stream` wait for it (the GPU does the waiting).
    ///
    /// # Errors
    /// [`FrameError::ProducerGone`] (within about a millisecond of the producer's death), [`FrameError::Timeout`].
    pub fn next_frame(&mut self, stream: Option<&Stream>, timeout: Duration) -> Result<Frame, FrameError> {
        self.check_producer()?;
        let seq = Sequence(self.next_seq);
        let deadline = Instant::now() + timeout;
        let slot = self.ring.block().slot_for(seq);
        match &self.sync {
            ConsumerSync::Cpu(mode) => self.wait_published(seq, *mode, deadline)?,
            ConsumerSync::Events { published, .. } => {
                super::need_stream(stream, "IpcEvent")?;
                self.wait_published(seq, WaitMode::Spin, deadline)?;
                // Polled on the CPU, not waited on by the stream: see `super::wait_for_event`.
                let hung_up = &self.producer_hung_up;
                super::wait_for_event(
                    &published[slot.0 as usize],
                    deadline,
                    None,
                    || !hung_up.load(Ordering::Acquire),
                    || format!("the producer to finish writing frame {}", seq.0),
                )
                .map_err(|e| match e {
                    FrameError::PeerGone => self.gone("it died while the frame was being written"),
                    other => other,
                })?;
            }
            ConsumerSync::Gpu { registration, run_ahead } => {
                let stream = super::need_stream(stream, "GpuStreamOps")?;
                run_ahead.before(seq.0, deadline)?;
                self.check_producer()?;
                registration.wait_value_u64(
                    stream,
                    published_offset(slot),
                    seq.done_value(),
                    WaitCondition::AtLeast,
                )?;
            }
        }
        self.next_seq = seq.0 + 1;
        Ok(Frame {
            seq: seq.0,
            slot: slot.0,
            ptr: self.region.ptr().offset(self.offer.data_offset + self.offer.slot_stride_bytes * u64::from(slot.0)),
            bytes: self.offer.geometry.frame_bytes(),
        })
    }

    fn wait_published(&self, seq: Sequence, mode: WaitMode, deadline: Instant) -> Result<(), FrameError> {
        self.ring.wait_published(seq, deadline, mode).map_err(|e| {
            if self.producer_hung_up.load(Ordering::Acquire) {
                self.gone("its connection hung up (the process exited or was killed)")
            } else {
                self.map_ring(e, &format!("frame {}", seq.0))
            }
        })
    }

    /// Releases `frame` once the work queued on `stream` (if any) has read it; the producer may then rewrite its
    /// slot.
    ///
    /// # Errors
    /// [`FrameError::ProducerGone`] when the producer died meanwhile: the frame may then hold partial data.
    pub fn release(&mut self, frame: Frame, stream: Option<&Stream>) -> Result<(), FrameError> {
        let seq = Sequence(frame.seq);
        match &self.sync {
            ConsumerSync::Cpu(_) => {
                if let Some(stream) = stream {
                    stream.synchronize()?;
                }
                self.ring.release(seq).map_err(|e| self.map_ring(e, "release"))?;
            }
            ConsumerSync::Events { released, .. } => {
                released[frame.slot as usize].record(super::need_stream(stream, "IpcEvent")?)?;
                self.ring.release(seq).map_err(|e| self.map_ring(e, "release"))?;
            }
            ConsumerSync::Gpu { registration, run_ahead } => {
                let stream = super::need_stream(stream, "GpuStreamOps")?;
                let offset = released_offset(self.ring.id().index(), self.ring.block().slot_for(seq));
                registration.write_value_u64(stream, offset, seq.done_value())?;
                run_ahead.after(frame.seq, stream)?;
            }
        }
        self.check_producer()
    }

    /// Leaves the ring cleanly: the producer stops counting this consumer at once.
    pub fn detach(mut self) {
        self.watchdog.stop();
        let bye = Detach { consumer_id: self.offer.consumer_id, reason: DetachReason::ConsumerDone };
        let _ = self.conn.send(&Message::Detach(bye), Vec::new(), Duration::from_millis(200));
        // Dropping the control (last Arc) marks the record detached and poisons its release counters.
    }
}
