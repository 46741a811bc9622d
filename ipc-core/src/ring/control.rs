//! The ring's state machine over the control block's atomics: producer side, consumer side, bounded waits.
//!
//! Memory ordering, in one place:
//! - `published[slot]` is written with `Release` after the frame's contents are complete and read with `Acquire`
//!   by consumers, so a consumer that sees `s + 1` also sees frame `s`.
//! - `released[c][slot]` is written with `Release` after the consumer's last read of the frame and read with
//!   `Acquire` by the producer, so the producer's overwrite happens after those reads.
//! - Registration and the producer's reuse check form a store-then-load pair on each side (`next_sequence` /
//!   record state), which needs `SeqCst` on all four operations (see [`ProducerControl::register_consumer`]).
//! - State words are read with `Acquire` (or `SeqCst`) before the fields their writer set before a `Release`
//!   store of the state (pid, join sequence, reset counters).
//! - Counters only grow, and host-side writers use `fetch_max`, so [`POISON`] is sticky.
//!
//! GPU strategies use the same counters through the offsets in [`super::layout`]; the conditions are the ones
//! [`ProducerControl::pending_releases`] and [`ConsumerControl::is_published`] evaluate.

use std::os::fd::OwnedFd;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use rustix::io::Errno;
use rustix::process::Pid;

use super::error::{GoneReason, RingError, WaitTarget};
use super::layout::{
    CONTROL_BLOCK_BYTES, ConsumerId, ConsumerRecord, ConsumerState, ControlBlockLayout, LAYOUT_VERSION, MAGIC,
    MAX_CONSUMERS, MAX_SLOTS, POISON, ProducerState, Sequence, SlotIndex, released_offset, state_epoch, state_word,
};
use crate::sys::shm::{SharedMemory, SharedObject};

/// Geometry and identity of a ring, chosen by the producer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RingConfig {
    /// Number of slots N, `1..=MAX_SLOTS`. Frame `s` lives in slot `s % N`; the producer runs at most N frames
    /// ahead of the slowest live consumer.
    pub slot_count: u32,
    /// Consumer records in use, `1..=MAX_CONSUMERS`.
    pub max_consumers: u32,
    /// Any value that tells this ring instance from an earlier one (e.g. start time); carried in the header.
    pub generation: u64,
}

/// How peers are judged alive.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LivenessPolicy {
    /// A peer whose heartbeat is older than this is gone. `None` (the default) disables the check: an idle but
    /// healthy producer does not heartbeat. Set it when peers live in different PID namespaces.
    pub heartbeat_timeout: Option<Duration>,
    /// Check peer pids with `kill(pid, 0)`. Only meaningful in one PID namespace (default true).
    pub check_pid: bool,
    /// How often a waiting side checks liveness (and beats its own heartbeat). Default 1 ms.
    pub check_interval: Duration,
}

impl Default for LivenessPolicy {
    fn default() -> Self {
        Self { heartbeat_timeout: None, check_pid: true, check_interval: Duration::from_millis(1) }
    }
}

/// How a CPU-side wait passes time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WaitMode {
    /// Busy-wait with `std::hint::spin_loop`; yields the CPU once per liveness check (about every 1 ms) so an
    /// oversubscribed machine still makes progress.
    Spin,
    /// Sleep this long between checks.
    Sleep(Duration),
}

/// A counter the producer must see reach a value before it may rewrite a slot: exactly what a GPU strategy turns
/// into `cuStreamWaitValue64(stream, base + offset, at_least, CU_STREAM_WAIT_VALUE_GEQ)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReleaseRequirement {
    /// The consumer that has not released yet.
    pub consumer: ConsumerId,
    /// The slot.
    pub slot: SlotIndex,
    /// Byte offset of `released[consumer][slot]` in the control block.
    pub offset: usize,
    /// Value the counter must reach: `(seq - N) + 1`.
    pub at_least: u64,
}

/// Waits until `condition` holds, `deadline` passes, or `liveness` reports a gone peer. Never unbounded.
///
/// `condition` is evaluated first and once more after a failed liveness check or at the deadline, so a frame
/// published just before its producer closed is still delivered. In [`WaitMode::Spin`] liveness is checked every
/// `check_interval` (measured every 64 spins); in [`WaitMode::Sleep`] after each sleep that ends past it.
pub fn wait_until(
    waiting_for: WaitTarget,
    deadline: Instant,
    mode: WaitMode,
    check_interval: Duration,
    mut condition: impl FnMut() -> Result<bool, RingError>,
    mut liveness: impl FnMut() -> Result<(), RingError>,
) -> Result<(), RingError> {
    let start = Instant::now();
    let mut last_check = start;
    let mut spins: u32 = 0;
    loop {
        if condition()? {
            return Ok(());
        }
        match mode {
            WaitMode::Spin => {
                std::hint::spin_loop();
                spins = spins.wrapping_add(1);
                if !spins.is_multiple_of(64) {
                    continue;
                }
            }
            WaitMode::Sleep(nap) => {
                std::thread::sleep(nap.min(deadline.saturating_duration_since(Instant::now())));
            }
        }
        let now = Instant::now();
        if now.duration_since(last_check) >= check_interval {
            last_check = now;
            if let Err(gone) = liveness() {
                return if condition()? { Ok(()) } else { Err(gone) };
            }
            if mode == WaitMode::Spin {
                std::thread::yield_now();
            }
        }
        if now >= deadline {
            return if condition()? {
                Ok(())
            } else {
                Err(RingError::Timeout { waiting_for, waited: now.duration_since(start) })
            };
        }
    }
}

/// Whether a counter holds the poison: bit 62 set (`published` counters keep their last value in the low bits, see
/// [`ConsumerControl::poison_published`]; `released` counters hold exactly [`POISON`]).
pub fn is_poisoned(value: u64) -> bool {
    value & POISON != 0
}

/// `CLOCK_MONOTONIC` in nanoseconds: one clock for every process on the machine, so heartbeats compare across them.
pub fn monotonic_ns() -> u64 {
    let now = rustix::time::clock_gettime(rustix::time::ClockId::Monotonic);
    (now.tv_sec as u64).saturating_mul(1_000_000_000).saturating_add(now.tv_nsec as u64)
}

/// `kill(pid, 0)`: false only when the process certainly does not exist (`ESRCH`). A zombie still counts as alive
/// until its parent reaps it.
fn process_exists(raw_pid: u64) -> bool {
    let Some(pid) = i32::try_from(raw_pid).ok().and_then(Pid::from_raw) else {
        // Pid 0 or out of range: unknown, so it cannot be proven gone.
        return true;
    };
    !matches!(rustix::process::test_kill_process(pid), Err(Errno::SRCH))
}

/// Judges a peer from its pid and heartbeat under `policy`.
fn peer_gone(policy: &LivenessPolicy, pid: u64, heartbeat_ns: u64) -> Option<GoneReason> {
    if policy.check_pid && !process_exists(pid) {
        return Some(GoneReason::ProcessExited);
    }
    let timeout = policy.heartbeat_timeout?;
    let age = Duration::from_nanos(monotonic_ns().saturating_sub(heartbeat_ns));
    (age > timeout).then_some(GoneReason::HeartbeatStale { age })
}

/// The control block mapping, validated: what both sides share. Read-only queries live here.
#[derive(Debug)]
pub struct ControlBlock {
    object: Arc<SharedObject<ControlBlockLayout>>,
    slot_count: u32,
    max_consumers: u32,
}

impl ControlBlock {
    fn create(config: RingConfig) -> Result<Self, RingError> {
        check_range("slot_count", config.slot_count, MAX_SLOTS)?;
        check_range("max_consumers", config.max_consumers, MAX_CONSUMERS)?;
        let memory = SharedMemory::create("gpu-ipc-ring-control", CONTROL_BLOCK_BYTES)?;
        let object = Arc::new(SharedObject::<ControlBlockLayout>::new(memory)?);
        let layout = object.get();
        let header = &layout.header;
        // Nobody else can see the memfd yet; Relaxed stores, then the magic with Release so that a peer that
        // checks the magic with Acquire sees a complete header however the fd reached it.
        header.layout_version.store(LAYOUT_VERSION, Ordering::Relaxed);
        header.total_bytes.store(CONTROL_BLOCK_BYTES as u64, Ordering::Relaxed);
        header.slot_count.store(u64::from(config.slot_count), Ordering::Relaxed);
        header.max_consumers.store(u64::from(config.max_consumers), Ordering::Relaxed);
        header.generation.store(config.generation, Ordering::Relaxed);
        header.producer_pid.store(rustix::process::getpid().as_raw_pid() as u64, Ordering::Relaxed);
        header.producer_state.store(ProducerState::Running as u64, Ordering::Relaxed);
        layout.producer_heartbeat_ns.value.store(monotonic_ns(), Ordering::Relaxed);
        header.magic.store(MAGIC, Ordering::Release);
        tracing::debug!(?config, bytes = CONTROL_BLOCK_BYTES, "created ring control block");
        Ok(Self { object, slot_count: config.slot_count, max_consumers: config.max_consumers })
    }

    /// Maps a control block received from the producer and validates its header.
    pub fn attach(fd: OwnedFd) -> Result<Self, RingError> {
        let memory = SharedMemory::from_fd(fd, CONTROL_BLOCK_BYTES)?;
        let object = Arc::new(SharedObject::<ControlBlockLayout>::new(memory)?);
        let header = &object.get().header;
        let magic = header.magic.load(Ordering::Acquire);
        if magic != MAGIC {
            return Err(RingError::BadMagic { found: magic });
        }
        let version = header.layout_version.load(Ordering::Relaxed);
        if version != LAYOUT_VERSION {
            return Err(RingError::LayoutVersion { found: version, expected: LAYOUT_VERSION });
        }
        let total = header.total_bytes.load(Ordering::Relaxed);
        if total != CONTROL_BLOCK_BYTES as u64 {
            return Err(RingError::Corrupt { what: "total_bytes", value: total });
        }
        let slot_count = header_count(header.slot_count.load(Ordering::Relaxed), "slot_count", MAX_SLOTS)?;
        let max_consumers = header_count(header.max_consumers.load(Ordering::Relaxed), "max_consumers", MAX_CONSUMERS)?;
        Ok(Self { object, slot_count, max_consumers })
    }

    /// The shared layout. Its fields are atomics; prefer the state-machine methods to writing them directly.
    pub fn layout(&self) -> &ControlBlockLayout {
        self.object.get()
    }

    /// The mapping: its fd to send to consumers, its base address and length for `cuMemHostRegister`.
    pub fn memory(&self) -> &SharedMemory {
        self.object.memory()
    }

    /// The mapping itself, shareable: what GPU strategies register with `cuMemHostRegister` so streams can wait
    /// on and write the counters at `base + offset`.
    pub fn shared(&self) -> Arc<SharedObject<ControlBlockLayout>> {
        self.object.clone()
    }

    /// Number of slots N.
    pub fn slot_count(&self) -> u32 {
        self.slot_count
    }

    /// Number of consumer records.
    pub fn max_consumers(&self) -> u32 {
        self.max_consumers
    }

    /// Generation chosen by the producer.
    pub fn generation(&self) -> u64 {
        self.layout().header.generation.load(Ordering::Relaxed)
    }

    /// Producer pid from the header.
    pub fn producer_pid(&self) -> u64 {
        self.layout().header.producer_pid.load(Ordering::Relaxed)
    }

    /// Slot of frame `seq`: `seq % N`.
    pub fn slot_for(&self, seq: Sequence) -> SlotIndex {
        // The remainder is below slot_count <= MAX_SLOTS, so it fits in u32.
        SlotIndex((seq.0 % u64::from(self.slot_count)) as u32)
    }

    /// First sequence not yet published (or enqueued for publication).
    pub fn next_sequence(&self) -> Sequence {
        Sequence(self.layout().next_sequence.value.load(Ordering::Acquire))
    }

    /// State and epoch of consumer record `index`, or `None` for an index outside the ring or an invalid word.
    pub fn consumer_state(&self, index: u32) -> Option<(ConsumerState, u32)> {
        let word = self.record_at(index)?.state.load(Ordering::Acquire);
        Some((ConsumerState::from_raw(word)?, state_epoch(word)))
    }

    fn published(&self, slot: SlotIndex) -> &AtomicU64 {
        // `slot` comes from `slot_for`, below slot_count <= MAX_SLOTS = the array length.
        &self.layout().published[slot.0 as usize].value
    }

    fn record_at(&self, index: u32) -> Option<&ConsumerRecord> {
        if index >= self.max_consumers {
            return None;
        }
        self.layout().consumers.get(index as usize)
    }

    fn record(&self, consumer: ConsumerId) -> Result<&ConsumerRecord, RingError> {
        self.record_at(consumer.index())
            .ok_or(RingError::UnknownConsumer { consumer, max_consumers: self.max_consumers })
    }

    /// The record of `consumer` if it is in `expected` state in the consumer's epoch.
    fn record_in(&self, consumer: ConsumerId, expected: ConsumerState) -> Result<&ConsumerRecord, RingError> {
        let record = self.record(consumer)?;
        let word = record.state.load(Ordering::Acquire);
        if word == state_word(consumer.epoch(), expected) {
            Ok(record)
        } else {
            Err(RingError::NotLive { consumer, found: ConsumerState::from_raw(word), found_epoch: state_epoch(word) })
        }
    }

    fn active_records(&self) -> impl Iterator<Item = (u32, &ConsumerRecord)> {
        self.layout()
            .consumers
            .iter()
            .take(self.max_consumers as usize)
            .enumerate()
            .map(|(index, record)| (index as u32, record))
    }

    /// Writes [`POISON`] into every `released` counter of a record (the owner is gone or left).
    fn poison_released(&self, record: &ConsumerRecord) {
        for counter in record.released.iter().take(self.slot_count as usize) {
            counter.value.fetch_max(POISON, Ordering::Release);
        }
    }
}

fn check_range(what: &'static str, value: u32, max: u32) -> Result<(), RingError> {
    if (1..=max).contains(&value) {
        Ok(())
    } else {
        Err(RingError::InvalidConfig { what, value: u64::from(value), max: u64::from(max) })
    }
}

fn header_count(value: u64, what: &'static str, max: u32) -> Result<u32, RingError> {
    match u32::try_from(value) {
        Ok(count) if (1..=max).contains(&count) => Ok(count),
        _ => Err(RingError::Corrupt { what, value }),
    }
}

/// The producer's side of the control block. Dropping it closes the ring.
#[derive(Debug)]
pub struct ProducerControl {
    block: ControlBlock,
    policy: LivenessPolicy,
    /// Per record, the host-side poisonings of it in flight in this process (the watchdog's thread, the
    /// producer's). [`reclaim_consumer`](Self::reclaim_consumer) waits for its record's count to reach zero after
    /// freeing it, so no poison that checked the old state can land in the counters of the record's next owner.
    poisoning: Vec<AtomicU32>,
}

impl ProducerControl {
    /// Creates the control block in a new sealed memfd, with this process as the running producer.
    pub fn create(config: RingConfig, policy: LivenessPolicy) -> Result<Self, RingError> {
        let poisoning = (0..config.max_consumers).map(|_| AtomicU32::new(0)).collect();
        Ok(Self { block: ControlBlock::create(config)?, policy, poisoning })
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
        let layout = self.block.layout();
        let mut reclaimable = 0;
        for (index, record) in self.block.active_records() {
            let word = record.state.load(Ordering::Acquire);
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
                .state
                .compare_exchange(word, state_word(epoch, ConsumerState::Joining), Ordering::SeqCst, Ordering::Relaxed)
                .is_err()
            {
                continue;
            }
            record.pid.store(pid as u64, Ordering::Relaxed);
            record.heartbeat_ns.value.store(monotonic_ns(), Ordering::Relaxed);
            for counter in &record.released {
                counter.value.store(0, Ordering::Relaxed);
            }
            let join = layout.next_sequence.value.load(Ordering::SeqCst);
            record.join_sequence.store(join, Ordering::Relaxed);
            // Release: the pid, heartbeat, zeroed counters and join sequence are visible to whoever sees Live.
            record.state.store(state_word(epoch, ConsumerState::Live), Ordering::Release);
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
            let word = record.state.load(Ordering::SeqCst);
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
            if record.join_sequence.load(Ordering::Relaxed) > previous {
                // Joined after frame `previous`: it never reads it.
                continue;
            }
            let at_least = previous + 1;
            // Acquire: the consumer's reads of frame `previous` happen before our rewrite.
            if record.released[slot.0 as usize].value.load(Ordering::Acquire) >= at_least {
                continue;
            }
            let requirement = ReleaseRequirement {
                consumer: ConsumerId::new(index, state_epoch(word)),
                slot,
                offset: released_offset(index, slot),
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
            let word = record.state.load(Ordering::Acquire);
            if ConsumerState::from_raw(word) != Some(ConsumerState::Live) {
                continue;
            }
            let pid = record.pid.load(Ordering::Relaxed);
            let heartbeat = record.heartbeat_ns.value.load(Ordering::Relaxed);
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

    fn check_in_order(&self, seq: Sequence) -> Result<(), RingError> {
        // Only the producer writes next_sequence, so its own Relaxed read is current.
        let expected = Sequence(self.block.layout().next_sequence.value.load(Ordering::Relaxed));
        if seq == expected { Ok(()) } else { Err(RingError::OutOfOrder { expected, got: seq }) }
    }

    fn store_next(&self, seq: Sequence) {
        // SeqCst: first half of the registration handshake (see register_consumer).
        self.block.layout().next_sequence.value.store(seq.done_value(), Ordering::SeqCst);
        self.heartbeat();
    }

    /// Records a sign of life (`CLOCK_MONOTONIC` now). Publishing and waiting do it; call it when idle for long.
    pub fn heartbeat(&self) {
        self.block.layout().producer_heartbeat_ns.value.store(monotonic_ns(), Ordering::Relaxed);
    }

    /// Writes [`POISON`] again into the `released` counters of a consumer already marked dead. A dead process's
    /// GPU work can still land after it was declared dead (its queued `cuStreamWriteValue64` stores are plain
    /// stores, not `max`), lowering the poison; the survivor repeats this until that work must have drained.
    pub fn repoison_released(&self, consumer: ConsumerId) -> Result<(), RingError> {
        let record = self.block.record(consumer)?;
        self.poisoning(consumer.index(), || {
            if record.state.load(Ordering::SeqCst) == state_word(consumer.epoch(), ConsumerState::Dead) {
                self.block.poison_released(record);
            }
        });
        Ok(())
    }

    /// Declares `consumer` dead: it stops counting for back-pressure, and its `released` counters get [`POISON`]
    /// so that GPU stream waits already enqueued on them complete.
    pub fn mark_consumer_dead(&self, consumer: ConsumerId) -> Result<(), RingError> {
        let record = self.block.record(consumer)?;
        self.poisoning(consumer.index(), || self.mark_dead_now(consumer, record))
    }

    fn mark_dead_now(&self, consumer: ConsumerId, record: &ConsumerRecord) -> Result<(), RingError> {
        let mut word = record.state.load(Ordering::SeqCst);
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
            match record.state.compare_exchange(word, dead, Ordering::SeqCst, Ordering::SeqCst) {
                Ok(_) => break,
                Err(current) => word = current,
            }
        }
        self.block.poison_released(record);
        tracing::warn!(%consumer, pid = record.pid.load(Ordering::Relaxed), "consumer marked dead");
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
            if record.state.compare_exchange(word, free, Ordering::SeqCst, Ordering::SeqCst).is_ok() {
                if let Some(count) = self.poisoning.get(consumer.index() as usize) {
                    while count.load(Ordering::SeqCst) != 0 {
                        std::hint::spin_loop();
                    }
                }
                return Ok(());
            }
        }
        let word = record.state.load(Ordering::Acquire);
        Err(RingError::NotLive { consumer, found: ConsumerState::from_raw(word), found_epoch: state_epoch(word) })
    }

    /// Writes [`POISON`] into the `released` counters of every record in use: at teardown, so that every GPU wait
    /// the producer queued on them completes (nothing reads them after the producer).
    pub fn poison_all_released(&self) {
        for (index, record) in self.block.active_records() {
            self.poisoning(index, || {
                if ConsumerState::from_raw(record.state.load(Ordering::SeqCst)) != Some(ConsumerState::Free) {
                    self.block.poison_released(record);
                }
            });
        }
    }

    /// Marks the ring closed: consumers finish the frames already published, then get `ProducerGone`.
    pub fn close(&self) {
        // Release: everything published before closing is visible to whoever sees Closed.
        self.block.layout().header.producer_state.store(ProducerState::Closed as u64, Ordering::Release);
    }
}

impl Drop for ProducerControl {
    fn drop(&mut self) {
        self.close();
    }
}

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
        let join = Sequence(record.join_sequence.load(Ordering::Relaxed));
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
        let epoch = block.record_at(index).map(|record| state_epoch(record.state.load(Ordering::Acquire))).ok_or(
            RingError::UnknownConsumer { consumer: ConsumerId::new(index, 0), max_consumers: block.max_consumers },
        )?;
        let id = ConsumerId::new(index, epoch);
        let record = block.record_in(id, ConsumerState::Live)?;
        let join = Sequence(record.join_sequence.load(Ordering::Relaxed));
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
            let header = &self.block.layout().header;
            let closed = header.producer_state.load(Ordering::Acquire) == ProducerState::Closed as u64;
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
        record.released[self.block.slot_for(seq).0 as usize].value.fetch_max(seq.done_value(), Ordering::Release);
        record.heartbeat_ns.value.store(monotonic_ns(), Ordering::Relaxed);
        Ok(())
    }

    /// Records a sign of life.
    pub fn heartbeat(&self) {
        if let Ok(record) = self.block.record(self.id) {
            record.heartbeat_ns.value.store(monotonic_ns(), Ordering::Relaxed);
        }
    }

    /// `ProducerGone` if the producer closed the ring, its process exited, or its heartbeat is stale.
    pub fn check_producer(&self) -> Result<(), RingError> {
        let header = &self.block.layout().header;
        let pid = header.producer_pid.load(Ordering::Relaxed);
        let state = header.producer_state.load(Ordering::Acquire);
        let reason = match ProducerState::from_raw(state) {
            Some(ProducerState::Running) => {
                let heartbeat = self.block.layout().producer_heartbeat_ns.value.load(Ordering::Relaxed);
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
        let header = &self.block.layout().header;
        (header.producer_state.load(Ordering::Acquire) == ProducerState::Closed as u64)
            .then(|| self.block.next_sequence())
    }

    /// The highest sequence published so far according to the `published` counters (POISON ignored), or `None`
    /// when none is. Read before poisoning them, it says which frames a dead producer really wrote.
    pub fn highest_published(&self) -> Option<u64> {
        self.block
            .layout()
            .published
            .iter()
            .take(self.block.slot_count as usize)
            .map(|counter| counter.value.load(Ordering::Acquire) & !POISON)
            .filter(|&value| value != 0)
            .max()
            .map(|value| value - 1)
    }

    /// Survivor duty after `ProducerGone`: writes [`POISON`] into every `published` counter, so GPU stream waits
    /// of every consumer on frames that will never come complete (their results are to be discarded).
    pub fn poison_published(&self) {
        // `fetch_or`, not `fetch_max`: the value keeps the frame it held in its low bits, so whoever poisons first
        // (every consumer of the ring does it at the producer's hang-up) does not hide from the others which frames
        // the producer really published (`highest_published`).
        for counter in self.block.layout().published.iter().take(self.block.slot_count as usize) {
            counter.value.fetch_or(POISON, Ordering::Release);
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
        if record.state.load(Ordering::Acquire) == live {
            self.block.poison_released(record);
        }
        match record.state.compare_exchange(live, detached, Ordering::AcqRel, Ordering::Acquire) {
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
