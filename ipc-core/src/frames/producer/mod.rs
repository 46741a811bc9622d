//! The producing side of a frame ring.

mod config;
mod lease;
mod peers;

pub use config::{ProducerConfig, SlowConsumerPolicy};
pub use lease::SlotLease;

use peers::{Hello, Peer, Retired, RingRecords};

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::backend::{Backend, SharedRegion};
use crate::door::admission::{Admission, AdmissionConfig};
use crate::frames::FrameError;
use crate::frames::strategy::{ProducerSide, Setup, Strategy};
use crate::frames::watchdog::Watchdog;
use crate::resident::{Departure, ResidentSide, device_words};
use crate::ring::layout::ConsumerState;
use crate::ring::{ConsumerId, LivenessPolicy, ProducerControl, RingConfig, Sequence};
use crate::wire::{Detach, DetachReason, Message, RendezvousListener, SlotLayout, SyncSide};
use gpu_ipc_driver::DeviceUuid;
use gpu_ipc_driver::{DeviceMemory, DeviceSpan, Stream};

/// The producing end of a frame ring.
///
/// The fields marked `pub(crate)` are what the GPU-resident path (`crate::resident`: kernels launched on the ring,
/// frame graphs) reads and moves when it adds its methods to the producer.
pub struct Producer<B: Backend> {
    /// Keeps the context alive as long as the ring.
    _ctx: B::Context,
    /// In an `Arc` so that teardown can leak it on purpose (see `Drop`) without `unsafe`.
    pub(crate) region: Arc<B::Exported>,
    pub(crate) ring: Arc<ProducerControl>,
    admission: Admission<RingRecords>,
    /// Shared with the admission thread: who took which record (status reports).
    records: Arc<RingRecords>,
    peers: Vec<Peer>,
    watchdog: Watchdog,
    pub(crate) strategy: &'static dyn Strategy,
    pub(crate) sync: Box<dyn ProducerSide>,
    pub(crate) config: ProducerConfig,
    pub(crate) stride: u64,
    /// Byte offset of the ring's device words in the allocation ([`device_words`]), 0: none.
    pub(crate) device_words: u64,
    pub(crate) next_seq: Sequence,
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
    /// The work launched on the ring ([`Producer::launch_on_ring`], frame graphs): its abort word and port.
    pub(crate) resident: ResidentSide,
}

/// How often `acquire` serves the front door while consumers hold the slot it waits for (strategies whose wait can
/// be cut short and resumed; see `ProducerSide::wait_in_slices`).
const ADMISSION_SLICE: Duration = Duration::from_millis(5);

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
        let stride = super::slot_stride(config.slot_layout.bytes());
        let slots_end = stride * u64::from(config.slots);
        // Kernels on the ring (GPU-side strategies) poll the device copy of the counters: reserve and zero it.
        let device_words = if strategy.gpu_writes_counters() { device_words::place(slots_end) } else { 0 };
        let bytes = if device_words == 0 { slots_end } else { device_words + device_words::BYTES };
        let region = Arc::new(B::allocate(ctx, bytes)?);
        if device_words != 0 {
            B::zero(&region, device_words, device_words::BYTES)?;
            ring.set_device_words(device_words);
        }
        let device_uuid = match cuda {
            Some(c) => c.device().uuid()?,
            None => DeviceUuid([0; 16]),
        };
        let sync = strategy.producer(Setup {
            cuda,
            block: ring.block().shared(),
            layout: ring.block().layout(),
            slots: config.slots,
            max_consumers: config.max_consumers,
            sleep_interval: config.sleep_interval,
            device_words: if device_words == 0 || !device_words::enabled() {
                0
            } else {
                region.ptr().raw() + device_words
            },
        })?;
        let listener = RendezvousListener::bind_with(&config.socket_path, &config.access)?;
        let records = Arc::new(RingRecords::new(ring.clone(), config.slot_layout.clone()));
        let admission = Admission::start(
            listener,
            records.clone(),
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
            slot = %config.slot_layout,
            path = %config.socket_path.display(),
            "producer ready"
        );
        Ok(Self {
            _ctx: ctx.clone(),
            region,
            ring,
            admission,
            records,
            peers: Vec::new(),
            watchdog: Watchdog::start(),
            strategy,
            sync,
            config,
            stride,
            device_words,
            next_seq: Sequence(0),
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
            resident: ResidentSide::default(),
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

    /// What each slot holds (pixel frames, a tensor, bytes): what consumers find in [`Consumer::slot_layout`](
    /// crate::frames::Consumer::slot_layout).
    pub fn slot_layout(&self) -> &SlotLayout {
        &self.config.slot_layout
    }

    /// The exported allocation that holds every slot.
    pub fn region(&self) -> &B::Exported {
        &self.region
    }

    /// The same allocation, shared: a view of a slot that may outlive this producer (a DLPack tensor in Python)
    /// holds a clone, so the memory stays allocated until the last holder drops it. Whoever drops the last clone
    /// frees it, and must first make sure no queued GPU work still uses it (this producer's own teardown waits
    /// only for the work it queued).
    pub fn shared_region(&self) -> Arc<B::Exported> {
        self.region.clone()
    }

    /// Slots in the ring.
    pub fn slots(&self) -> u32 {
        self.config.slots
    }

    /// The sequence number the next [`Producer::acquire`] returns.
    pub fn next_sequence(&self) -> u64 {
        self.next_seq.0
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
        self.check_no_ring_kernel()?;
        self.acquire_seq(self.next_seq, stream, timeout)
    }

    /// Waits until the slot of the frame after `after`'s is free and returns it, while `after` is still held: a
    /// producer may hold the next frame and up to `slots - 1` more at once (written in parallel, or by someone else
    /// in turn: the bridge's receiving end lets several frames be written into its ring's slots at once), and
    /// publishes them in order ([`Producer::publish`] refuses a frame before the ones it follows, and the lease it
    /// took is spent: acquire that frame again after the one before it; [`Producer::next_sequence`] says which
    /// frame goes next). A lease dropped unpublished holds up every later one: acquire its frame again
    /// ([`Producer::acquire`] gives the next frame's slot) and publish it. The waits are [`Producer::acquire`]'s. Strategies whose waits are on the CPU
    /// (`cpu-spin`, `cpu-sleep`, `ipc-event`) only, for now.
    ///
    /// # Errors
    /// [`FrameError::ForeignToken`] for another producer's lease, or one whose frame was published;
    /// [`FrameError::Config`] when the frame after `after` would take the slot of a frame this producer still holds
    /// (it holds every slot), or with a strategy whose waits are on the GPU; as [`Producer::acquire`].
    pub fn acquire_after(
        &mut self,
        after: &SlotLease,
        stream: Option<&Stream>,
        timeout: Duration,
    ) -> Result<SlotLease, FrameError> {
        self.check_no_ring_kernel()?;
        let traits = self.config.sync.traits();
        if !matches!(traits.waits, SyncSide::Cpu) {
            return Err(FrameError::Config(format!(
                "acquire_after: the ring's strategy {} waits on the GPU; it takes one slot at a time (use one whose \
                 waits are on the CPU: cpu-spin, cpu-sleep, ipc-event)",
                traits.name
            )));
        }
        if after.owner != self.owner {
            return Err(FrameError::ForeignToken {
                token: "slot lease",
                problem: format!("frame {} is another producer's (or an earlier ring's)", after.seq.0),
            });
        }
        if after.seq < self.next_seq {
            return Err(FrameError::ForeignToken {
                token: "slot lease",
                problem: format!("frame {} was published already; the next frame is {}", after.seq.0, self.next_seq.0),
            });
        }
        let seq = after.seq.next();
        let ahead = seq.0 - self.next_seq.0;
        if ahead >= u64::from(self.config.slots) {
            return Err(FrameError::Config(format!(
                "acquire_after: frame {} takes the slot of frame {}, which this producer holds unpublished: {} slots \
                 hold frames {} to {} (publish frame {} first)",
                seq.0,
                seq.0 - u64::from(self.config.slots),
                self.config.slots,
                self.next_seq.0,
                seq.0 - 1,
                self.next_seq.0
            )));
        }
        self.acquire_seq(seq, stream, timeout)
    }

    /// [`Producer::acquire`]'s wait and lease for frame `seq` (the next one, or one after a frame held).
    fn acquire_seq(
        &mut self,
        seq: Sequence,
        stream: Option<&Stream>,
        timeout: Duration,
    ) -> Result<SlotLease, FrameError> {
        self.serve_front_door();
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
        let slot = self.ring.slot_for(seq);
        Ok(SlotLease {
            seq,
            slot,
            ptr: self.region.ptr().offset(self.stride * u64::from(slot.0)),
            bytes: self.config.slot_layout.bytes(),
            owner: self.owner,
        })
    }

    /// Evicts the consumers holding up frame `seq`; returns how many.
    fn evict_holding_up(&mut self, seq: Sequence) -> usize {
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
        for seq in self.next_seq.0..self.next_seq.0 + u64::from(self.config.slots) {
            self.sync.wait_slot_free(&self.ring, Sequence(seq), stream, deadline)?;
        }
        self.sync.drain(stream, deadline)
    }

    /// Publishes the frame in `lease` once the work queued on `stream` (if any) is done.
    ///
    /// # Errors
    /// Driver errors; a GPU strategy without a stream; [`FrameError::Timeout`] when a CPU strategy's wait for the
    /// frame's work passes [`ProducerConfig::gpu_timeout`]; a kernel launched on the ring still running.
    pub fn publish(&mut self, lease: SlotLease, stream: Option<&Stream>) -> Result<(), FrameError> {
        self.check_no_ring_kernel()?;
        // Checked before the strategy queues anything: a GPU strategy's counter store cannot be taken back.
        if lease.owner != self.owner {
            return Err(FrameError::ForeignToken {
                token: "slot lease",
                problem: format!("frame {} is another producer's (or an earlier ring's)", lease.seq.0),
            });
        }
        if lease.seq > self.next_seq {
            return Err(FrameError::ForeignToken {
                token: "slot lease",
                problem: format!(
                    "frame {} comes after frame {}, not published yet: publish the frames in order",
                    lease.seq.0, self.next_seq.0
                ),
            });
        }
        if lease.seq != self.next_seq {
            return Err(FrameError::ForeignToken {
                token: "slot lease",
                problem: format!(
                    "frame {} was published already with another lease; the next frame is {}",
                    lease.seq.0, self.next_seq.0
                ),
            });
        }
        let gpu_deadline = Instant::now() + self.config.gpu_timeout;
        self.sync.publish(&self.ring, lease.seq, lease.slot, stream, gpu_deadline)?;
        self.next_seq = lease.seq.next();
        Ok(())
    }
}

impl<B: Backend> Producer<B> {
    /// Ends this producer without ending its stream: its consumers get [`FrameError::ProducerGone`] (within about a
    /// millisecond, from the hang-up), as after a crash, never the clean [`FrameError::EndOfStream`] that dropping
    /// it gives. For a producer that cannot go on and must not let its consumers take what it published for a
    /// whole stream: a pipeline stage whose upstream died, say ([`Stage`](crate::frames::Stage) does this). The
    /// teardown is otherwise the same as dropping it (bounded waits for the GPU work queued on the ring).
    pub fn abandon(self) {
        self.mark_abandoned();
    }

    /// From now on, dropping this producer abandons its stream (see [`Producer::abandon`]).
    pub(in crate::frames) fn mark_abandoned(&self) {
        self.ring.abandon();
    }
}

impl<B: Backend> Producer<B>
where
    B::Exported: DeviceMemory,
{
    /// The device memory of the slot in `lease`, bounds-checked, borrowed from the producer: what the caller's
    /// kernel writes (with [`Function::launch_typed`](gpu_ipc_driver::Function::launch_typed) or the span's own
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
        // A kernel publishing on the ring leaves on the abort word; the ring is freed only once it has.
        let deadline = Instant::now() + self.config.gpu_timeout;
        match self.resident.leave(deadline) {
            Departure::NoneLaunched => {}
            // Consumers that see the ring closed take frames below next_sequence as published.
            Departure::Left(progress) => {
                self.take_ring_back(progress);
            }
            Departure::Stuck => {
                tracing::error!("the kernel launched on the ring did not leave on its abort word: leaking the ring");
                self.ring.abandon();
                std::mem::forget(self.ring.clone());
                std::mem::forget(self.region.clone());
                std::mem::forget(std::mem::replace(&mut self.sync, Box::new(super::strategy::Closed)));
                self.watchdog.stop();
                return;
            }
        }
        // Every wait our stream holds on a consumer's counters completes once they are poisoned; then wait
        // (bounded) for the stream to pass what we queued on the ring before freeing what it uses.
        self.ring.poison_all_released();
        let settled = self.sync.settle(Instant::now() + self.config.gpu_timeout);
        if settled && self.ring.is_abandoned() {
            // Left running: consumers see the hang-up as a death (`abandon`).
            tracing::warn!("producer abandoned: its consumers get ProducerGone, not the end of the stream");
        } else if settled {
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
