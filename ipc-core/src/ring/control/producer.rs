//! The producer's side of the control block: registration, reuse checks, poisoning, closing.

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::time::Instant;

use rustix::process::Pid;

use super::{
    ConsumerRecord, ControlBlock, LivenessPolicy, ReleaseRequirement, RingConfig, WaitMode, is_poisoned, monotonic_ns,
    peer_gone, wait_until,
};
use crate::ring::error::{GoneReason, RingError, WaitTarget};
use crate::ring::layout::{ConsumerId, ConsumerState, ProducerState, Sequence, SlotIndex, state_epoch, state_word};

/// The producer's side of the control block. Dropping it closes the ring, unless it was
/// [`abandon`](Self::abandon)ed.
#[derive(Debug)]
pub struct ProducerControl {
    block: ControlBlock,
    policy: LivenessPolicy,
    /// Set by [`abandon`](Self::abandon): dropping leaves the ring running.
    abandoned: AtomicBool,
    /// Per record, the host-side poisonings of it in flight in this process (the watchdog's thread, the
    /// producer's). [`reclaim_consumer`](Self::reclaim_consumer) waits for its record's count to reach zero after
    /// freeing it, so no poison that checked the old state can land in the counters of the record's next owner.
    poisoning: Vec<AtomicU32>,
}

impl ProducerControl {
    /// Creates the control block in a new sealed memfd, with this process as the running producer.
    pub fn create(config: RingConfig, policy: LivenessPolicy) -> Result<Self, RingError> {
        let poisoning = (0..config.max_consumers).map(|_| AtomicU32::new(0)).collect();
        Ok(Self { block: ControlBlock::create(config)?, policy, abandoned: AtomicBool::new(false), poisoning })
    }

    /// Runs `poison` for record `index` counted as in flight (see `poisoning`). `SeqCst` on the count and on the
    /// state loads inside `poison` pairs with `reclaim_consumer`: either the poisoner sees the record freed and
    /// writes nothing, or the reclaimer sees the count and waits for the write to land before the record is reused.
    fn poisoning<T>(&self, index: u32, poison: impl FnOnce() -> T) -> T {
        let Some(count) = self.poisoning.get(index as usize) else {
            return poison();
        };
        count.fetch_add(1, Ordering::SeqCst);
        let result = poison();
        count.fetch_sub(1, Ordering::SeqCst);
        result
    }

    /// The shared control block (fd to send, base address, layout).
    pub fn block(&self) -> &ControlBlock {
        &self.block
    }

    /// Slot of frame `seq`.
    pub fn slot_for(&self, seq: Sequence) -> SlotIndex {
        self.block.slot_for(seq)
    }

    /// Claims a free consumer record for the process `pid` (as seen through `SO_PEERCRED`; `None`, stored as 0,
    /// for a peer in a PID namespace we cannot see, whose pid then never declares it gone) and decides its join
    /// sequence: the first sequence not yet published. The consumer reads frames from there on; earlier frames
    /// never wait for it.
    ///
    /// Safe to call from another thread than the one publishing: the claim (`SeqCst` compare-and-swap to
    /// `Joining`) comes before the `SeqCst` load of `next_sequence`, and [`publish`](Self::publish) stores
    /// `next_sequence` (`SeqCst`) before [`can_reuse`](Self::can_reuse) loads record states (`SeqCst`). So either
    /// the reuse check sees the record (`Joining` holds it back until the join sequence is set) or this load sees
    /// a `next_sequence` past every frame that check was for, and the consumer never reads those frames.
    pub fn register_consumer(&self, pid: impl Into<Option<Pid>>) -> Result<ConsumerId, RingError> {
        let pid = pid.into().map_or(0, |pid| pid.as_raw_pid());
        let mut reclaimable = 0;
        for (index, record) in self.block.active_records() {
            let word = record.state().load(Ordering::Acquire);
            match ConsumerState::from_raw(word) {
                Some(ConsumerState::Free) => {}
                Some(ConsumerState::Detached | ConsumerState::Dead) => {
                    reclaimable += 1;
                    continue;
                }
                _ => continue,
            }
            let epoch = state_epoch(word).wrapping_add(1);
            if record
                .state()
                .compare_exchange(word, state_word(epoch, ConsumerState::Joining), Ordering::SeqCst, Ordering::Relaxed)
                .is_err()
            {
                continue;
            }
            record.pid().store(pid as u64, Ordering::Relaxed);
            record.heartbeat_ns().store(monotonic_ns(), Ordering::Relaxed);
            // The record's last owner may have died with its kernel abort word raised.
            record.kernel_abort().store(0, Ordering::Relaxed);
            for counter in record.released_counters() {
                counter.store(0, Ordering::Relaxed);
            }
            let join = self.block.next_sequence_counter().load(Ordering::SeqCst);
            record.join_sequence().store(join, Ordering::Relaxed);
            // Release: the pid, heartbeat, zeroed counters and join sequence are visible to whoever sees Live.
            record.state().store(state_word(epoch, ConsumerState::Live), Ordering::Release);
            let id = ConsumerId::new(index, epoch);
            tracing::info!(%id, pid, join, "consumer registered");
            return Ok(id);
        }
        Err(RingError::RingFull { max_consumers: self.block.max_consumers, reclaimable })
    }

    /// Whether the slot of frame `seq` may be rewritten now: every `Live` consumer whose join sequence is at most
    /// `seq - N` has released frame `seq - N`. `Joining` records make it false until they are decided.
    pub fn can_reuse(&self, seq: Sequence) -> Result<bool, RingError> {
        let mut blocked = false;
        let scan = self.scan_releases(seq, |_| {
            blocked = true;
            false
        });
        match scan {
            Ok(()) => Ok(!blocked),
            Err(RingError::JoinInProgress { .. }) => Ok(false),
            Err(other) => Err(other),
        }
    }

    /// Appends to `out` every release the producer still needs before rewriting the slot of frame `seq` (for a
    /// GPU strategy: one stream wait each). `JoinInProgress` if a consumer is mid-registration: retry.
    pub fn pending_releases(&self, seq: Sequence, out: &mut Vec<ReleaseRequirement>) -> Result<(), RingError> {
        self.scan_releases(seq, |requirement| {
            out.push(requirement);
            true
        })
    }

    /// As [`pending_releases`](Self::pending_releases) into a cleared `out`, asking again while a consumer is
    /// mid-registration (a join takes microseconds) until `deadline`: the one retry the GPU-side waits share (the
    /// stream-op and polling strategies, frame graphs' stream-op waits).
    ///
    /// # Errors
    /// `JoinInProgress` when a registration is still in progress at `deadline`; a frame out of order.
    pub(crate) fn pending_releases_by(
        &self,
        seq: Sequence,
        deadline: Instant,
        out: &mut Vec<ReleaseRequirement>,
    ) -> Result<(), RingError> {
        loop {
            out.clear();
            match self.pending_releases(seq, out) {
                Err(RingError::JoinInProgress { .. }) if Instant::now() < deadline => std::thread::yield_now(),
                done => return done,
            }
        }
    }

    /// Calls `on_pending` for each unsatisfied requirement while it returns true.
    fn scan_releases(
        &self,
        seq: Sequence,
        mut on_pending: impl FnMut(ReleaseRequirement) -> bool,
    ) -> Result<(), RingError> {
        let n = u64::from(self.block.slot_count);
        let Some(previous) = seq.0.checked_sub(n) else {
            // The slot has never held a frame.
            return Ok(());
        };
        let slot = self.block.slot_for(seq);
        for (index, record) in self.block.active_records() {
            // SeqCst: second half of the registration handshake (see register_consumer).
            let word = record.state().load(Ordering::SeqCst);
            match ConsumerState::from_raw(word) {
                Some(ConsumerState::Free | ConsumerState::Detached | ConsumerState::Dead) => {
                    continue;
                }
                Some(ConsumerState::Joining) => return Err(RingError::JoinInProgress { index }),
                Some(ConsumerState::Live) => {}
                None => {
                    return Err(RingError::Corrupt { what: "consumer state", value: word });
                }
            }
            if record.join_sequence().load(Ordering::Relaxed) > previous {
                // Joined after frame `previous`: it never reads it.
                continue;
            }
            let at_least = previous + 1;
            // Acquire: the consumer's reads of frame `previous` happen before our rewrite.
            if record.released(slot).load(Ordering::Acquire) >= at_least {
                continue;
            }
            let requirement = ReleaseRequirement {
                consumer: ConsumerId::new(index, state_epoch(word)),
                slot,
                offset: self.block.layout().released_offset(index, slot),
                at_least,
            };
            if !on_pending(requirement) {
                break;
            }
        }
        Ok(())
    }

    /// Returns `ConsumerGone` for the first live consumer whose process exited or whose heartbeat is stale.
    pub fn check_consumers(&self) -> Result<(), RingError> {
        for (index, record) in self.block.active_records() {
            let word = record.state().load(Ordering::Acquire);
            if ConsumerState::from_raw(word) != Some(ConsumerState::Live) {
                continue;
            }
            let pid = record.pid().load(Ordering::Relaxed);
            let heartbeat = record.heartbeat_ns().load(Ordering::Relaxed);
            if let Some(reason) = peer_gone(&self.policy, pid, heartbeat) {
                return Err(RingError::ConsumerGone {
                    consumer: ConsumerId::new(index, state_epoch(word)),
                    pid,
                    reason,
                });
            }
        }
        Ok(())
    }

    /// Waits until [`can_reuse`](Self::can_reuse)`(seq)`, beating the producer heartbeat and checking consumers
    /// every `check_interval`. A gone consumer ends the wait with `ConsumerGone`: mark it dead and wait again.
    pub fn wait_reusable(&self, seq: Sequence, deadline: Instant, mode: WaitMode) -> Result<(), RingError> {
        wait_until(
            WaitTarget::Reusable(seq),
            deadline,
            mode,
            self.policy.check_interval,
            || self.can_reuse(seq),
            || {
                self.heartbeat();
                self.check_consumers()
            },
        )
    }

    /// Marks frame `seq` complete: `published[seq % N] = seq + 1`, then advances `next_sequence`. Frames must be
    /// published in order. Call it only after [`can_reuse`](Self::can_reuse)`(seq)` held and the frame is written.
    pub fn publish(&self, seq: Sequence) -> Result<(), RingError> {
        self.check_in_order(seq)?;
        // Release: the frame contents written before this are visible to a consumer that Acquire-loads seq + 1.
        let before = self.block.published(self.slot_for(seq)).fetch_max(seq.done_value(), Ordering::Release);
        self.store_next(seq);
        if is_poisoned(before) {
            return Err(RingError::ProducerGone { pid: self.block.producer_pid(), reason: GoneReason::Poisoned });
        }
        Ok(())
    }

    /// Advances `next_sequence` past `seq` without touching `published`: for GPU strategies, whose stream writes
    /// `published` itself; call it when the frame's work is enqueued.
    pub fn advance(&self, seq: Sequence) -> Result<(), RingError> {
        self.check_in_order(seq)?;
        self.store_next(seq);
        Ok(())
    }

    /// Sets `next_sequence` to `seq` whichever way it moves: for taking the ring back from a kernel that published
    /// on it, which may have moved the word up to `GPU_IPC_RING_VIEW_FRAMES` frames past its last frame (a
    /// consumer that registered meanwhile joins there; frames before it are simply not for that consumer). Call it
    /// only when no kernel publishes on the ring.
    pub fn rewind_next(&self, seq: Sequence) {
        self.block.next_sequence_counter().store(seq.0, Ordering::SeqCst);
    }

    /// Stores `header.device_words`: the byte offset of the ring's device words in the frame allocation (see
    /// [`ControlBlock::device_words_offset`]). Call it once, before the first offer leaves.
    pub fn set_device_words(&self, offset: u64) {
        self.block.device_words_counter().store(offset, Ordering::Release);
    }

    fn check_in_order(&self, seq: Sequence) -> Result<(), RingError> {
        // Only the producer writes next_sequence, so its own Relaxed read is current.
        let expected = Sequence(self.block.next_sequence_counter().load(Ordering::Relaxed));
        if seq == expected { Ok(()) } else { Err(RingError::OutOfOrder { expected, got: seq }) }
    }

    fn store_next(&self, seq: Sequence) {
        // SeqCst: first half of the registration handshake (see register_consumer).
        self.block.next_sequence_counter().store(seq.done_value(), Ordering::SeqCst);
        self.heartbeat();
    }

    /// Records a sign of life (`CLOCK_MONOTONIC` now). Publishing and waiting do it; call it when idle for long.
    pub fn heartbeat(&self) {
        self.block.producer_heartbeat_ns().store(monotonic_ns(), Ordering::Relaxed);
    }

    /// Writes [`POISON`](crate::ring::POISON) again into the `released` counters of a consumer already marked dead. A dead process's
    /// GPU work can still land after it was declared dead (its queued `cuStreamWriteValue64` stores are plain
    /// stores, not `max`), lowering the poison; the survivor repeats this until that work must have drained.
    pub fn repoison_released(&self, consumer: ConsumerId) -> Result<(), RingError> {
        let record = self.block.record(consumer)?;
        self.poisoning(consumer.index(), || {
            if record.state().load(Ordering::SeqCst) == state_word(consumer.epoch(), ConsumerState::Dead) {
                self.block.poison_released(record);
            }
        });
        Ok(())
    }

    /// Declares `consumer` dead: it stops counting for back-pressure, and its `released` counters get [`POISON`](crate::ring::POISON)
    /// so that GPU stream waits already enqueued on them complete.
    pub fn mark_consumer_dead(&self, consumer: ConsumerId) -> Result<(), RingError> {
        let record = self.block.record(consumer)?;
        self.poisoning(consumer.index(), || self.mark_dead_now(consumer, record))
    }

    fn mark_dead_now(&self, consumer: ConsumerId, record: ConsumerRecord<'_>) -> Result<(), RingError> {
        let mut word = record.state().load(Ordering::SeqCst);
        loop {
            let state = ConsumerState::from_raw(word);
            let movable = matches!(state, Some(ConsumerState::Live | ConsumerState::Detached));
            if state_epoch(word) != consumer.epoch() || !movable {
                if state == Some(ConsumerState::Dead) && state_epoch(word) == consumer.epoch() {
                    return Ok(());
                }
                return Err(RingError::NotLive { consumer, found: state, found_epoch: state_epoch(word) });
            }
            let dead = state_word(consumer.epoch(), ConsumerState::Dead);
            match record.state().compare_exchange(word, dead, Ordering::SeqCst, Ordering::SeqCst) {
                Ok(_) => break,
                Err(current) => word = current,
            }
        }
        self.block.poison_released(record);
        // Kernels the consumer launched on the ring leave: a dead process's kernel must not spin on (under MPS its
        // teardown faults the server's other clients; docs/frames.md, "Kills under MPS").
        record.kernel_abort().store(1, Ordering::Release);
        tracing::warn!(%consumer, pid = record.pid().load(Ordering::Relaxed), "consumer marked dead");
        Ok(())
    }

    /// Returns a `Detached` or `Dead` record to `Free` so a new consumer can take it. With a GPU strategy, call it
    /// only after the work that waits on this consumer's counters has completed (a new owner resets them to 0).
    ///
    /// Poisonings of the record by this process that are still in flight land before it returns (see
    /// `poisoning`); writers in other processes (a dead consumer's queued GPU stores) are the caller's to wait out
    /// (the frame API quarantines such records).
    pub fn reclaim_consumer(&self, consumer: ConsumerId) -> Result<(), RingError> {
        let record = self.block.record(consumer)?;
        let free = state_word(consumer.epoch(), ConsumerState::Free);
        for from in [ConsumerState::Detached, ConsumerState::Dead] {
            let word = state_word(consumer.epoch(), from);
            if record.state().compare_exchange(word, free, Ordering::SeqCst, Ordering::SeqCst).is_ok() {
                if let Some(count) = self.poisoning.get(consumer.index() as usize) {
                    while count.load(Ordering::SeqCst) != 0 {
                        std::hint::spin_loop();
                    }
                }
                return Ok(());
            }
        }
        let word = record.state().load(Ordering::Acquire);
        Err(RingError::NotLive { consumer, found: ConsumerState::from_raw(word), found_epoch: state_epoch(word) })
    }

    /// Writes [`POISON`](crate::ring::POISON) into the `released` counters of every record in use: at teardown, so that every GPU wait
    /// the producer queued on them completes (nothing reads them after the producer).
    pub fn poison_all_released(&self) {
        for (index, record) in self.block.active_records() {
            self.poisoning(index, || {
                if ConsumerState::from_raw(record.state().load(Ordering::SeqCst)) != Some(ConsumerState::Free) {
                    self.block.poison_released(record);
                }
            });
        }
    }

    /// Marks the ring closed: consumers finish the frames already published, then get `ProducerGone`.
    pub fn close(&self) {
        // Release: everything published before closing is visible to whoever sees Closed.
        self.block.producer_state().store(ProducerState::Closed as u64, Ordering::Release);
    }

    /// Says that the producer goes away without ending its stream: dropping this control then leaves the ring
    /// `Running` instead of closing it, so consumers learn of the producer's end from its hang-up, as of a death
    /// (`ProducerGone`), never as a clean end of stream. Nothing else changes; it cannot be undone.
    pub fn abandon(&self) {
        self.abandoned.store(true, Ordering::Release);
    }

    /// Whether [`abandon`](Self::abandon) was called.
    pub fn is_abandoned(&self) -> bool {
        self.abandoned.load(Ordering::Acquire)
    }
}

impl Drop for ProducerControl {
    fn drop(&mut self) {
        if !self.is_abandoned() {
            self.close();
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn pending_releases_by_asks_again_while_a_join_is_in_progress_and_gives_up_at_the_deadline() {
        let config = RingConfig { slot_count: 2, max_consumers: 2, generation: 7 };
        let producer = ProducerControl::create(config, LivenessPolicy::default()).unwrap();
        producer.publish(Sequence(0)).unwrap();
        producer.publish(Sequence(1)).unwrap();
        let record = producer.block().record_at(1).unwrap();
        record.state().store(state_word(1, ConsumerState::Joining), Ordering::SeqCst);
        let mut out =
            vec![ReleaseRequirement { consumer: ConsumerId::new(0, 0), slot: SlotIndex(0), offset: 0, at_least: 0 }];
        let start = Instant::now();
        let err = producer.pending_releases_by(Sequence(2), start + Duration::from_millis(20), &mut out).unwrap_err();
        assert!(matches!(err, RingError::JoinInProgress { index: 1 }), "{err}");
        assert!(start.elapsed() >= Duration::from_millis(20), "it asked again until the deadline");
        // The join settles while it asks: the answer is the releases still needed (none: no live consumer), in a
        // cleared `out`.
        let settle = std::thread::scope(|scope| {
            scope.spawn(|| {
                std::thread::sleep(Duration::from_millis(5));
                record.state().store(state_word(1, ConsumerState::Free), Ordering::SeqCst);
            });
            producer.pending_releases_by(Sequence(2), Instant::now() + Duration::from_secs(5), &mut out)
        });
        settle.unwrap();
        assert!(out.is_empty(), "{out:?}");
    }
}
