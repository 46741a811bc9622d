//! The validated control block mapping both sides share, and its read-only queries.

use std::os::fd::OwnedFd;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use super::{RingConfig, monotonic_ns};
use crate::ring::error::RingError;
use crate::ring::layout::{
    CONTROL_BLOCK_BYTES, ConsumerId, ConsumerRecord, ConsumerState, ControlBlockLayout, LAYOUT_VERSION, MAGIC,
    MAX_CONSUMERS, MAX_SLOTS, POISON, ProducerState, Sequence, SlotIndex, state_epoch, state_word,
};
use crate::sys::shm::{SharedMemory, SharedObject};

/// The control block mapping, validated: what both sides share. Read-only queries live here.
#[derive(Debug)]
pub struct ControlBlock {
    pub(super) object: Arc<SharedObject<ControlBlockLayout>>,
    pub(super) slot_count: u32,
    pub(super) max_consumers: u32,
}

impl ControlBlock {
    pub(super) fn create(config: RingConfig) -> Result<Self, RingError> {
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

    /// What record `index` says of its consumer, for a status report: state, epoch, pid, its last sign of life
    /// (`CLOCK_MONOTONIC` ns, see [`super::monotonic_ns`]) and the newest frame it released (`None`: none yet, or
    /// its counters are poisoned).
    pub fn consumer_activity(&self, index: u32) -> Option<ConsumerActivity> {
        let record = self.record_at(index)?;
        let word = record.state.load(Ordering::Acquire);
        let state = ConsumerState::from_raw(word)?;
        let slots = record.released.iter().take(self.slot_count as usize);
        let last_released =
            slots.map(|c| c.value.load(Ordering::Relaxed)).filter(|v| *v != 0 && *v < POISON).max().map(|v| v - 1);
        Some(ConsumerActivity {
            state,
            epoch: state_epoch(word),
            pid: record.pid.load(Ordering::Relaxed),
            heartbeat_ns: record.heartbeat_ns.value.load(Ordering::Relaxed),
            last_released,
        })
    }

    pub(super) fn published(&self, slot: SlotIndex) -> &AtomicU64 {
        // `slot` comes from `slot_for`, below slot_count <= MAX_SLOTS = the array length.
        &self.layout().published[slot.0 as usize].value
    }

    pub(super) fn record_at(&self, index: u32) -> Option<&ConsumerRecord> {
        if index >= self.max_consumers {
            return None;
        }
        self.layout().consumers.get(index as usize)
    }

    pub(super) fn record(&self, consumer: ConsumerId) -> Result<&ConsumerRecord, RingError> {
        self.record_at(consumer.index())
            .ok_or(RingError::UnknownConsumer { consumer, max_consumers: self.max_consumers })
    }

    /// The record of `consumer` if it is in `expected` state in the consumer's epoch.
    pub(super) fn record_in(
        &self,
        consumer: ConsumerId,
        expected: ConsumerState,
    ) -> Result<&ConsumerRecord, RingError> {
        let record = self.record(consumer)?;
        let word = record.state.load(Ordering::Acquire);
        if word == state_word(consumer.epoch(), expected) {
            Ok(record)
        } else {
            Err(RingError::NotLive { consumer, found: ConsumerState::from_raw(word), found_epoch: state_epoch(word) })
        }
    }

    pub(super) fn active_records(&self) -> impl Iterator<Item = (u32, &ConsumerRecord)> {
        self.layout()
            .consumers
            .iter()
            .take(self.max_consumers as usize)
            .enumerate()
            .map(|(index, record)| (index as u32, record))
    }

    /// Writes [`POISON`] into every `released` counter of a record (the owner is gone or left).
    pub(super) fn poison_released(&self, record: &ConsumerRecord) {
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

/// What a consumer record says of its consumer ([`ControlBlock::consumer_activity`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConsumerActivity {
    /// The record's state.
    pub state: ConsumerState,
    /// The record's epoch.
    pub epoch: u32,
    /// The pid the producer recorded (0: a PID namespace it cannot see).
    pub pid: u64,
    /// `CLOCK_MONOTONIC` ns of the consumer's last sign of life.
    pub heartbeat_ns: u64,
    /// The newest frame it released, if any.
    pub last_released: Option<u64>,
}
