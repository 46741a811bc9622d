//! Sync strategies: how a producer waits for a free slot and publishes, and how a consumer waits for a frame and
//! releases it. One module per strategy, each implementing [`Strategy`]; [`strategy`] is the only place that maps
//! the wire's [`SyncStrategy`] to its implementation, so adding a strategy touches that match and its own module.
//!
//! Every wait a strategy makes is bounded: the CPU ones by the caller's deadline, the GPU-side ones by the
//! run-ahead bound (the CPU naps until the stream has passed frame `seq - depth`, or the deadline passes), and
//! `GpuPoll`'s polling kernels also by `%globaltimer`.

mod cpu;
mod cpu_sleep;
mod cpu_spin;
mod gpu_poll;
mod gpu_stream_ops;
mod ipc_event;
#[cfg(test)]
mod sixth;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use crate::frames::FrameError;
use crate::ring::{ConsumerControl, ConsumerId, ProducerControl, RingError, Sequence, SlotIndex, WaitMode};
use crate::wire::SyncStrategy;
use gpu_ipc_driver::{Context, DeviceSpan, Stream};

/// What a strategy needs to set up either side.
pub(crate) struct Setup<'a> {
    /// The CUDA context, for backends that have one.
    pub cuda: Option<&'a Context>,
    /// The ring's control block mapping (GPU-side strategies register it for the device).
    pub block: Arc<crate::shm::SharedMemory>,
    /// Its byte layout: where each counter is, from the mapping's start.
    pub layout: crate::ring::RingLayout,
    /// Slots in the ring.
    pub slots: u32,
    /// Consumer records in the ring.
    pub max_consumers: u32,
    /// Poll interval of `CpuSleep`.
    pub sleep_interval: Duration,
    /// Device address of the ring's device words in this process ([`crate::resident::device_words`]), 0 when the
    /// ring has none or this side's GPU is not the ring's (kernels on the ring then use the control block only).
    pub device_words: u64,
}

/// A sync strategy: checks what it needs and builds each side.
pub(crate) trait Strategy: Sync {
    /// Its name on the wire.
    fn kind(&self) -> SyncStrategy;

    /// Whether a peer's GPU work writes the ring's counters: then a dead peer's queued stores can still land after
    /// it died, so its counters are re-poisoned and its record quarantined for a while (see the watchdog).
    fn gpu_writes_counters(&self) -> bool {
        self.kind().traits().gpu_writes_counters
    }

    /// Checks, at `Producer::create` and `Consumer::attach`, that this backend and device can run the strategy:
    /// a typed error naming the fix, rather than a failure at the first frame.
    fn check(&self, cuda: Option<&Context>) -> Result<(), FrameError>;

    /// The producer's side.
    fn producer(&self, setup: Setup<'_>) -> Result<Box<dyn ProducerSide>, FrameError>;

    /// A consumer's side; `event_handles` as offered.
    fn consumer(&self, setup: Setup<'_>, event_handles: &[[u8; 64]]) -> Result<Box<dyn ConsumerSide>, FrameError>;
}

/// The implementation of `sync`: the one match over the wire's strategies.
pub(crate) fn strategy(sync: SyncStrategy) -> &'static dyn Strategy {
    match sync {
        SyncStrategy::CpuSpin => &cpu_spin::CpuSpin,
        SyncStrategy::CpuSleep => &cpu_sleep::CpuSleep,
        SyncStrategy::IpcEvent => &ipc_event::IpcEvent,
        SyncStrategy::GpuStreamOps => &gpu_stream_ops::GpuStreamOps,
        SyncStrategy::GpuPoll => &gpu_poll::GpuPoll,
    }
}

impl SyncStrategy {
    /// Whether this strategy can run here, as the strategy itself judges it: the check `Producer::create` and
    /// `Consumer::attach` make before anything is set up. `cuda` is the context a GPU backend runs in, `None` for a
    /// backend without CUDA (the host backend). Ask this rather than restating what a strategy needs (a device
    /// feature, MPS, a CUDA backend): the strategy's module is the one place that knows.
    ///
    /// # Errors
    /// [`FrameError::StrategyUnavailable`] saying what is missing and what to use instead; a driver error from a
    /// device query.
    pub fn check_available(self, cuda: Option<&Context>) -> Result<(), FrameError> {
        strategy(self).check(cuda)
    }
}

/// The producer's half of a strategy.
pub(crate) trait ProducerSide: Send + Sync {
    /// Makes the CPU, or `stream`, wait until frame `seq`'s slot may be written.
    fn wait_slot_free(
        &mut self,
        ring: &ProducerControl,
        seq: Sequence,
        stream: Option<&Stream>,
        deadline: Instant,
    ) -> Result<(), FrameError>;

    /// Whether [`wait_slot_free`](Self::wait_slot_free) may be given a near deadline and called again after its
    /// `Timeout` as if nothing happened (nothing queued, nothing bounded by the deadline but the CPU's own wait),
    /// so that the producer can serve new consumers while it waits.
    fn wait_in_slices(&self) -> bool {
        true
    }

    /// Publishes frame `seq` (in `slot`) once the work queued on `stream` is done. `gpu_deadline` bounds a CPU
    /// wait for that work.
    fn publish(
        &mut self,
        ring: &ProducerControl,
        seq: Sequence,
        slot: SlotIndex,
        stream: Option<&Stream>,
        gpu_deadline: Instant,
    ) -> Result<(), FrameError>;

    /// The IPC event handles offered to record `id`, in offer order (only the IPC-event strategy has any).
    fn offer_event_handles(&mut self, _id: ConsumerId) -> Result<Vec<[u8; 64]>, FrameError> {
        Ok(Vec::new())
    }

    /// The consumer of record `id` finished its handshake; `without_events`: it said `AttachedWithoutEvents` (it
    /// could not open the IPC events offered to it, and runs the ring without them).
    fn consumer_attached(&mut self, _id: ConsumerId, _without_events: bool) {}

    /// Whether nothing this side queued can still read the counters of a record whose consumer left when the
    /// producer was at sequence `left_at`.
    fn record_reusable(&self, _left_at: Sequence) -> bool {
        true
    }

    /// Appends the consumers that hold up frame `seq` (have not released the frame its slot held): what a
    /// slow-consumer policy evicts after a timeout.
    fn holding_up(&self, ring: &ProducerControl, seq: Sequence, out: &mut Vec<ConsumerId>) {
        let mut pending = Vec::new();
        if ring.pending_releases(seq, &mut pending).is_ok() {
            out.extend(pending.iter().map(|p| p.consumer));
        }
    }

    /// Waits, until `deadline`, for everything queued on `stream` so far.
    fn drain(&mut self, stream: Option<&Stream>, deadline: Instant) -> Result<(), FrameError>;

    /// Waits, until `deadline`, for the GPU work this side queued that reads or writes the ring (its control
    /// block registration, its slots). False when it did not finish: the caller must then not free what it uses.
    fn settle(&mut self, _deadline: Instant) -> bool {
        true
    }

    /// The control block as this side registered it for the device (GPU-side strategies), where a kernel launched
    /// on the ring reads and writes the ring's counters; `None` when the strategy does not register it.
    fn control_block(&self) -> Option<DeviceSpan<'_>> {
        None
    }
}

/// What a consumer's side shares with the consumer: its control, the producer's hang-up flag, how to word
/// "the producer is gone".
pub(crate) struct ConsumerShared {
    /// This consumer's view of the control block.
    pub ring: Arc<ConsumerControl>,
    /// Set by the watchdog when the producer's connection hangs up.
    pub producer_hung_up: Arc<AtomicBool>,
    /// The producer's pid, for errors.
    pub producer_pid: u32,
    /// Set by the watchdog at the producer's hang-up, before it poisons the publish counters: the highest
    /// sequence the producer had published, plus one (0: none, or not gone).
    pub published_below_at_hang_up: Arc<AtomicU64>,
}

impl ConsumerShared {
    /// The producer is not there any more: [`FrameError::EndOfStream`] when it closed the ring (a clean end: it
    /// closes only once everything it queued is done), else [`FrameError::ProducerGone`] with `how`.
    pub fn gone(&self, how: impl Into<String>) -> FrameError {
        match self.ring.closed_after() {
            Some(published) => FrameError::EndOfStream { published: published.0, past_end: None },
            None => FrameError::ProducerGone { pid: self.producer_pid, how: how.into() },
        }
    }

    /// After a GPU-side wait for frame `seq` was queued: an error when that wait may have been released by the
    /// poison written at the producer's hang-up rather than by the frame, i.e. when the producer never published
    /// it: [`FrameError::EndOfStream`] naming the frame (queued past the end of a closed ring) or
    /// [`FrameError::ProducerGone`] (it died first). What was computed from such a frame is garbage.
    pub fn check_queued_frame(&self, seq: Sequence) -> Result<(), FrameError> {
        if !self.hung_up() || self.published_before_hang_up(seq) {
            return Ok(());
        }
        Err(match self.ring.closed_after() {
            Some(published) => FrameError::EndOfStream { published: published.0, past_end: Some(seq.0) },
            None => FrameError::ProducerGone {
                pid: self.producer_pid,
                how: format!(
                    "it died before it published frame {}: what was computed from that frame is garbage",
                    seq.0
                ),
            },
        })
    }

    /// Whether the producer's connection hung up.
    pub fn hung_up(&self) -> bool {
        self.producer_hung_up.load(Ordering::Acquire)
    }

    /// After the producer hung up: whether it had published frame `seq` by then. Frames it had not were never
    /// written; a GPU-side wait for them was released by the poison, and what was computed from them is garbage.
    pub fn published_before_hang_up(&self, seq: Sequence) -> bool {
        seq.0 < self.published_below_at_hang_up.load(Ordering::Acquire)
    }

    /// A ring error in the words of the frame API; this consumer's own record no longer live means it was evicted.
    pub fn map_ring(&self, e: RingError, what: &str) -> FrameError {
        match e {
            // In words (`GoneReason`'s Display), never the variant's name: this reaches users' messages.
            RingError::ProducerGone { reason, .. } => self.gone(reason.to_string()),
            RingError::Timeout { waited, .. } => FrameError::Timeout { what: what.to_owned(), waited },
            RingError::NotLive { consumer, .. } => FrameError::Evicted { consumer: consumer.index() },
            other => other.into(),
        }
    }

    /// Waits on the CPU until frame `seq` is published.
    pub fn wait_published(&self, seq: Sequence, mode: WaitMode, deadline: Instant) -> Result<(), FrameError> {
        self.ring.wait_published(seq, deadline, mode).map_err(|e| {
            if self.hung_up() {
                self.gone("its connection hung up (the process exited or was killed)")
            } else {
                self.map_ring(e, &format!("frame {}", seq.0))
            }
        })
    }
}

/// A consumer's half of a strategy.
pub(crate) trait ConsumerSide: Send + Sync {
    /// Makes the CPU, or `stream`, wait until frame `seq` (in `slot`) is published.
    fn wait_frame(
        &mut self,
        shared: &ConsumerShared,
        seq: Sequence,
        slot: SlotIndex,
        stream: Option<&Stream>,
        deadline: Instant,
    ) -> Result<(), FrameError>;

    /// Releases frame `seq` once the work queued on `stream` has read it. `gpu_deadline` bounds a CPU wait for
    /// that work.
    fn release(
        &mut self,
        shared: &ConsumerShared,
        seq: Sequence,
        slot: SlotIndex,
        stream: Option<&Stream>,
        gpu_deadline: Instant,
    ) -> Result<(), FrameError>;

    /// As [`ProducerSide::settle`].
    fn settle(&mut self, _deadline: Instant) -> bool {
        true
    }

    /// Whether this side runs an `IpcEvent` ring without the IPC events it was offered (it could not open them,
    /// from another IPC namespace): the consumer then says `AttachedWithoutEvents` at the handshake.
    fn without_events(&self) -> bool {
        false
    }

    /// The control block as this side registered it for the device (GPU-side strategies), where a kernel reads the
    /// frames' stamps (`published`) and the ring's counters; `None` when the strategy does not register it.
    fn control_block(&self) -> Option<DeviceSpan<'_>> {
        None
    }
}

/// Appends, once each, the consumers that have not released for some frame in `from..=to`: with a GPU-side strategy
/// the stream is stuck behind a wait queued for one of the frames in flight, and whoever these are hold it up.
pub(crate) fn holding_up_frames(ring: &ProducerControl, from: Sequence, to: Sequence, out: &mut Vec<ConsumerId>) {
    let mut pending = Vec::new();
    for s in from.0..=to.0 {
        pending.clear();
        if ring.pending_releases(Sequence(s), &mut pending).is_ok() {
            out.extend(pending.iter().map(|p| p.consumer));
        }
    }
    out.sort_by_key(|id| id.to_u64());
    out.dedup();
}

/// The stream a GPU-side strategy queues its waits and writes on.
pub(crate) fn need_stream(stream: Option<&Stream>, strategy: SyncStrategy) -> Result<&Stream, FrameError> {
    stream.ok_or_else(|| FrameError::Config(format!("the {strategy} strategy needs a stream")))
}

/// A strategy this backend or device cannot run, with what to do instead.
pub(crate) fn unavailable(sync: SyncStrategy, reason: impl Into<String>) -> FrameError {
    FrameError::StrategyUnavailable { strategy: sync.to_string(), reason: reason.into() }
}

/// The CUDA context a CUDA-only strategy needs.
pub(crate) fn need_cuda(sync: SyncStrategy, cuda: Option<&Context>) -> Result<&Context, FrameError> {
    cuda.ok_or_else(|| unavailable(sync, "it needs a CUDA backend (legacy or vmm); use cpu-spin or cpu-sleep"))
}

/// What a side becomes when teardown leaks it on purpose: every call fails.
pub(crate) struct Closed;

impl ProducerSide for Closed {
    fn wait_slot_free(
        &mut self,
        _: &ProducerControl,
        _: Sequence,
        _: Option<&Stream>,
        _: Instant,
    ) -> Result<(), FrameError> {
        Err(FrameError::Config("the producer is shut down".into()))
    }

    fn publish(
        &mut self,
        _: &ProducerControl,
        _: Sequence,
        _: SlotIndex,
        _: Option<&Stream>,
        _: Instant,
    ) -> Result<(), FrameError> {
        Err(FrameError::Config("the producer is shut down".into()))
    }

    fn drain(&mut self, _: Option<&Stream>, _: Instant) -> Result<(), FrameError> {
        Ok(())
    }
}

impl ConsumerSide for Closed {
    fn wait_frame(
        &mut self,
        _: &ConsumerShared,
        _: Sequence,
        _: SlotIndex,
        _: Option<&Stream>,
        _: Instant,
    ) -> Result<(), FrameError> {
        Err(FrameError::Config("the consumer is detached".into()))
    }

    fn release(
        &mut self,
        _: &ConsumerShared,
        _: Sequence,
        _: SlotIndex,
        _: Option<&Stream>,
        _: Instant,
    ) -> Result<(), FrameError> {
        Err(FrameError::Config("the consumer is detached".into()))
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn every_wire_strategy_maps_to_its_own_implementation() {
        for sync in [
            SyncStrategy::CpuSpin,
            SyncStrategy::CpuSleep,
            SyncStrategy::IpcEvent,
            SyncStrategy::GpuStreamOps,
            SyncStrategy::GpuPoll,
        ] {
            assert_eq!(strategy(sync).kind(), sync);
        }
        assert!(strategy(SyncStrategy::GpuStreamOps).gpu_writes_counters());
        assert!(strategy(SyncStrategy::GpuPoll).gpu_writes_counters());
        assert!(!strategy(SyncStrategy::CpuSpin).gpu_writes_counters());
    }

    /// A consumer's view of a ring whose producer published `published` frames, with the watchdog's hang-up flag
    /// set as it sets it (what it read before poisoning, then the flag).
    fn shared_after_hang_up(published: u64, closed: bool) -> (ProducerControl, ConsumerShared) {
        use crate::ring::{LivenessPolicy, RingConfig};
        let producer = ProducerControl::create(
            RingConfig { slot_count: 4, max_consumers: 2, generation: 1 },
            LivenessPolicy::default(),
        )
        .unwrap();
        let id = producer.register_consumer(rustix::process::getpid()).unwrap();
        let fd = producer.block().memory().try_clone_fd().unwrap();
        let ring = Arc::new(ConsumerControl::attach(fd, id, LivenessPolicy::default()).unwrap());
        for seq in 0..published {
            producer.publish(Sequence(seq)).unwrap();
        }
        if closed {
            producer.close();
        }
        let below = ring.highest_published().map_or(0, |s| s + 1);
        ring.poison_published();
        let shared = ConsumerShared {
            ring,
            producer_hung_up: Arc::new(AtomicBool::new(true)),
            producer_pid: 42,
            published_below_at_hang_up: Arc::new(AtomicU64::new(below)),
        };
        (producer, shared)
    }

    #[test]
    fn a_frame_queued_past_a_clean_end_is_the_end_of_the_stream_by_number_and_its_published_frames_are_not() {
        let (_producer, shared) = shared_after_hang_up(10, true);
        // Frames the producer published before it closed are intact, hang-up or not.
        for seq in 0..10 {
            shared.check_queued_frame(Sequence(seq)).unwrap();
        }
        match shared.check_queued_frame(Sequence(10)) {
            Err(FrameError::EndOfStream { published: 10, past_end: Some(10) }) => {}
            other => panic!("{other:?}"),
        }
        assert!(matches!(shared.gone("hung up"), FrameError::EndOfStream { published: 10, past_end: None }));
    }

    #[test]
    fn a_frame_queued_past_what_a_dead_producer_published_is_its_death() {
        let (_producer, shared) = shared_after_hang_up(10, false);
        shared.check_queued_frame(Sequence(9)).unwrap();
        match shared.check_queued_frame(Sequence(10)) {
            Err(FrameError::ProducerGone { pid: 42, how }) => assert!(how.contains("before it published frame 10")),
            other => panic!("{other:?}"),
        }
        assert!(matches!(shared.gone("hung up"), FrameError::ProducerGone { .. }));
    }

    #[test]
    fn a_gone_producer_is_described_in_words() {
        use crate::ring::GoneReason;
        let (_producer, shared) = shared_after_hang_up(10, false);
        let reasons = [
            (GoneReason::ProcessExited, "its process no longer exists"),
            (GoneReason::Poisoned, "a peer declared it dead and poisoned the ring's counters"),
            (GoneReason::HeartbeatStale { age: Duration::from_secs(3) }, "its heartbeat is 3s old"),
        ];
        for (reason, words) in reasons {
            match shared.map_ring(RingError::ProducerGone { pid: 42, reason }, "frame 10") {
                FrameError::ProducerGone { how, .. } => assert_eq!(how, words),
                other => panic!("{reason:?}: {other:?}"),
            }
        }
    }

    #[test]
    fn cuda_strategies_refuse_a_backend_without_cuda_and_say_what_to_use() {
        for sync in [SyncStrategy::GpuStreamOps, SyncStrategy::GpuPoll] {
            match strategy(sync).check(None) {
                Err(FrameError::StrategyUnavailable { reason, .. }) => assert!(reason.contains("cpu-spin"), "{reason}"),
                other => panic!("{sync}: {other:?}"),
            }
        }
        assert!(strategy(SyncStrategy::CpuSleep).check(None).is_ok());
        // The host backend runs IpcEvent with stand-ins for the events (host::HostEvent).
        assert!(strategy(SyncStrategy::IpcEvent).check(None).is_ok());
    }

    #[test]
    fn the_availability_question_is_answered_by_the_strategy_itself() {
        for sync in SyncStrategy::ALL {
            let asked = sync.check_available(None).map_err(|e| e.to_string());
            let checked = strategy(sync).check(None).map_err(|e| e.to_string());
            assert_eq!(asked, checked, "{sync}");
        }
        assert!(SyncStrategy::CpuSpin.check_available(None).is_ok());
        assert!(matches!(
            SyncStrategy::GpuStreamOps.check_available(None),
            Err(FrameError::StrategyUnavailable { .. })
        ));
    }
}
