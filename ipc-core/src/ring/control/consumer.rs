//! One consumer's side of the control block: joining, waiting for frames, releasing, detaching.

use std::os::fd::OwnedFd;
use std::sync::atomic::Ordering;
use std::time::Instant;

use super::{ControlBlock, LivenessPolicy, WaitMode, is_poisoned, monotonic_ns, peer_gone, wait_until};
use crate::ring::error::{GoneReason, RingError, WaitTarget};
use crate::ring::layout::{ConsumerId, ConsumerState, POISON, ProducerState, Sequence, state_epoch, state_word};

/// One consumer's side of the control block. Dropping it detaches.
#[derive(Debug)]
pub struct ConsumerControl {
    block: ControlBlock,
    id: ConsumerId,
    join: Sequence,
    policy: LivenessPolicy,
    /// Whether dropping this leaves the ring (see [`ConsumerControl::abandon`]).
    leave_on_drop: bool,
}

impl ConsumerControl {
    /// Maps the control block received from the producer, as the consumer `id` the producer registered.
    pub fn attach(fd: OwnedFd, id: ConsumerId, policy: LivenessPolicy) -> Result<Self, RingError> {
        let block = ControlBlock::attach(fd)?;
        let record = block.record_in(id, ConsumerState::Live)?;
        let join = Sequence(record.join_sequence().load(Ordering::Relaxed));
        Ok(Self { block, id, join, policy, leave_on_drop: true })
    }

    /// Maps the control block and joins as record `index`, in the epoch the producer registered it under (the
    /// wire carries only the index).
    pub fn attach_index(fd: OwnedFd, index: u32, policy: LivenessPolicy) -> Result<Self, RingError> {
        Self::join_index(ControlBlock::attach(fd)?, index, policy)
    }

    /// As [`attach_index`](Self::attach_index), for the ring an offer describes: a block whose slot count or
    /// generation differs is refused before its record is read, so a wrong block is never touched (no join, and
    /// so no detach when this fails).
    pub fn attach_offered(
        fd: OwnedFd,
        index: u32,
        slot_count: u32,
        generation: u64,
        policy: LivenessPolicy,
    ) -> Result<Self, RingError> {
        let block = ControlBlock::attach(fd)?;
        if (block.slot_count(), block.generation()) != (slot_count, generation) {
            return Err(RingError::NotTheOfferedRing {
                found_slots: block.slot_count(),
                found_generation: block.generation(),
                offered_slots: slot_count,
                offered_generation: generation,
            });
        }
        Self::join_index(block, index, policy)
    }

    fn join_index(block: ControlBlock, index: u32, policy: LivenessPolicy) -> Result<Self, RingError> {
        let epoch = block.record_at(index).map(|record| state_epoch(record.state().load(Ordering::Acquire))).ok_or(
            RingError::UnknownConsumer { consumer: ConsumerId::new(index, 0), max_consumers: block.max_consumers },
        )?;
        let id = ConsumerId::new(index, epoch);
        let record = block.record_in(id, ConsumerState::Live)?;
        let join = Sequence(record.join_sequence().load(Ordering::Relaxed));
        Ok(Self { block, id, join, policy, leave_on_drop: true })
    }

    /// The shared control block.
    pub fn block(&self) -> &ControlBlock {
        &self.block
    }

    /// Unmaps the control block without leaving the ring: for a record that may no longer be this consumer's
    /// (its handshake was dropped by the producer, which may have given the record to someone else), where a
    /// detach would act on the newcomer's record.
    pub fn abandon(mut self) {
        self.leave_on_drop = false;
    }

    /// This consumer's id.
    pub fn id(&self) -> ConsumerId {
        self.id
    }

    /// First frame this consumer reads.
    pub fn join_sequence(&self) -> Sequence {
        self.join
    }

    /// Whether frame `seq` is complete: `published[seq % N] == seq + 1`. A larger value means the frame was
    /// overwritten (`Overrun`); [`POISON`] means the producer is gone.
    pub fn is_published(&self, seq: Sequence) -> Result<bool, RingError> {
        self.check_joined(seq)?;
        // Acquire: pairs with the producer's Release in `publish`, making the frame's contents visible.
        let value = self.block.published(self.block.slot_for(seq)).load(Ordering::Acquire);
        if is_poisoned(value) {
            // The producer's hang-up poisons every slot. After a clean close that hides frames it did publish:
            // they are intact (nothing writes the slots any more), so they are still delivered.
            let closed = self.block.producer_state().load(Ordering::Acquire) == ProducerState::Closed as u64;
            if closed && seq < self.block.next_sequence() {
                return Ok(true);
            }
            return Err(RingError::ProducerGone { pid: self.block.producer_pid(), reason: GoneReason::Poisoned });
        }
        if value > seq.done_value() {
            return Err(RingError::Overrun { consumer: self.id, seq, found: value });
        }
        Ok(value == seq.done_value())
    }

    /// Waits until frame `seq` is published, beating this consumer's heartbeat and checking the producer every
    /// `check_interval`.
    pub fn wait_published(&self, seq: Sequence, deadline: Instant, mode: WaitMode) -> Result<(), RingError> {
        wait_until(
            WaitTarget::Published(seq),
            deadline,
            mode,
            self.policy.check_interval,
            || self.is_published(seq),
            || {
                self.heartbeat();
                self.check_producer()
            },
        )
    }

    /// Tells the producer this consumer is done with frame `seq`: `released[me][seq % N] = seq + 1`.
    pub fn release(&self, seq: Sequence) -> Result<(), RingError> {
        self.check_joined(seq)?;
        let record = self.block.record_in(self.id, ConsumerState::Live)?;
        // Release: our reads of the frame happen before the producer, Acquire-loading this, rewrites the slot.
        // fetch_max: never lowers a POISON written by a producer that declared us dead meanwhile.
        record.released(self.block.slot_for(seq)).fetch_max(seq.done_value(), Ordering::Release);
        record.heartbeat_ns().store(monotonic_ns(), Ordering::Relaxed);
        Ok(())
    }

    /// Records a sign of life.
    pub fn heartbeat(&self) {
        if let Ok(record) = self.block.record(self.id) {
            record.heartbeat_ns().store(monotonic_ns(), Ordering::Relaxed);
        }
    }

    /// `ProducerGone` if the producer closed the ring, its process exited, or its heartbeat is stale.
    pub fn check_producer(&self) -> Result<(), RingError> {
        let pid = self.block.producer_pid();
        let state = self.block.producer_state().load(Ordering::Acquire);
        let reason = match ProducerState::from_raw(state) {
            Some(ProducerState::Running) => {
                let heartbeat = self.block.producer_heartbeat_ns().load(Ordering::Relaxed);
                peer_gone(&self.policy, pid, heartbeat)
            }
            Some(ProducerState::Closed) => Some(GoneReason::Closed),
            Some(ProducerState::Uninitialised) | None => {
                return Err(RingError::Corrupt { what: "producer state", value: state });
            }
        };
        match reason {
            Some(reason) => Err(RingError::ProducerGone { pid, reason }),
            None => Ok(()),
        }
    }

    /// `Some(n)` once the producer closed the ring cleanly after publishing frames `0..n` (a producer closes only
    /// when everything it queued is done); `None` while it runs, or when it died without closing.
    pub fn closed_after(&self) -> Option<Sequence> {
        (self.block.producer_state().load(Ordering::Acquire) == ProducerState::Closed as u64)
            .then(|| self.block.next_sequence())
    }

    /// The highest sequence published so far according to the `published` counters (POISON ignored), or `None`
    /// when none is. Read before poisoning them, it says which frames a dead producer really wrote.
    pub fn highest_published(&self) -> Option<u64> {
        self.block
            .published_counters()
            .map(|counter| counter.load(Ordering::Acquire) & !POISON)
            .filter(|&value| value != 0)
            .max()
            .map(|value| value - 1)
    }

    /// Raises the producer's kernel abort word ([`ControlBlock::producer_kernel_abort`]): this consumer saw the
    /// producer's process gone, and kernels it launched on the ring must leave rather than spin on.
    pub fn raise_producer_kernel_abort(&self) {
        self.block().producer_kernel_abort().store(1, Ordering::Release);
    }

    /// Survivor duty after `ProducerGone`: writes [`POISON`] into every `published` counter, so GPU stream waits
    /// of every consumer on frames that will never come complete (their results are to be discarded).
    pub fn poison_published(&self) {
        // `fetch_or`, not `fetch_max`: the value keeps the frame it held in its low bits, so whoever poisons first
        // (every consumer of the ring does it at the producer's hang-up) does not hide from the others which frames
        // the producer really published (`highest_published`).
        for counter in self.block.published_counters() {
            counter.fetch_or(POISON, Ordering::Release);
        }
    }

    /// Leaves the ring: stops counting for back-pressure and poisons this consumer's `released` counters so that
    /// GPU waits the producer already enqueued on them complete.
    pub fn detach(self) -> Result<(), RingError> {
        self.detach_in_place()
    }

    /// As [`detach`](Self::detach), through a shared reference (the consumer's control is shared with its
    /// watchdog); detaching twice is not an error.
    pub fn leave(&self) -> Result<(), RingError> {
        self.detach_in_place()
    }

    fn detach_in_place(&self) -> Result<(), RingError> {
        let record = self.block.record(self.id)?;
        let live = state_word(self.id.epoch(), ConsumerState::Live);
        let detached = state_word(self.id.epoch(), ConsumerState::Detached);
        // Poison first, while the record is still ours: once it says Detached the producer may free it and give
        // it to the next consumer, whose counters a late poison from here would corrupt. (Poisoned counters of a
        // live record read as "released", which is true: a detaching consumer reads nothing more.)
        if record.state().load(Ordering::Acquire) == live {
            self.block.poison_released(record);
        }
        match record.state().compare_exchange(live, detached, Ordering::AcqRel, Ordering::Acquire) {
            Ok(_) => {
                tracing::info!(consumer = %self.id, "consumer detached");
                Ok(())
            }
            Err(word) if word == detached => Ok(()),
            Err(word) => Err(RingError::NotLive {
                consumer: self.id,
                found: ConsumerState::from_raw(word),
                found_epoch: state_epoch(word),
            }),
        }
    }

    fn check_joined(&self, seq: Sequence) -> Result<(), RingError> {
        if seq < self.join { Err(RingError::BeforeJoin { consumer: self.id, seq, join: self.join }) } else { Ok(()) }
    }
}

impl Drop for ConsumerControl {
    fn drop(&mut self) {
        if !self.leave_on_drop {
            return;
        }
        // Already detached, declared dead or reclaimed: nothing to do, and nothing to report from drop.
        if let Err(error) = self.detach_in_place() {
            tracing::debug!(%error, "consumer drop: record no longer live");
        }
    }
}
