//! The validated control block mapping both sides share, and its read-only queries.

use std::os::fd::OwnedFd;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use super::{RingConfig, monotonic_ns};
use crate::ring::error::RingError;
use crate::ring::layout::{
    ConsumerId, ConsumerState, MAGIC, MAX_CONSUMERS, MAX_SLOTS, POISON, ProducerState, RingLayout, Sequence, SlotIndex,
    header, state_epoch, state_word,
};
use crate::shm::SharedMemory;

/// The control block mapping, validated: what both sides share. Read-only queries live here.
///
/// Every word is reached through the offsets of the block's [`RingLayout`], the same numbers GPU strategies add to
/// the mapping's device base.
#[derive(Debug)]
pub struct ControlBlock {
    pub(super) memory: Arc<SharedMemory>,
    pub(super) layout: RingLayout,
    pub(super) slot_count: u32,
    pub(super) max_consumers: u32,
}

/// One consumer record of a [`ControlBlock`], as its words.
#[derive(Debug, Clone, Copy)]
pub struct ConsumerRecord<'a> {
    block: &'a ControlBlock,
    index: u32,
}

impl<'a> ConsumerRecord<'a> {
    /// `epoch << 8 | ConsumerState`, see [`state_word`].
    pub fn state(&self) -> &'a AtomicU64 {
        self.block.word(self.block.layout.consumer_state_offset(self.index))
    }

    /// Consumer's pid as the producer saw it (`SO_PEERCRED`).
    pub fn pid(&self) -> &'a AtomicU64 {
        self.block.word(self.block.layout.consumer_pid_offset(self.index))
    }

    /// First frame this consumer reads; frames before it never wait for it.
    pub fn join_sequence(&self) -> &'a AtomicU64 {
        self.block.word(self.block.layout.join_sequence_offset(self.index))
    }

    /// The consumer's kernel abort word ([`RingLayout::kernel_abort_offset`]): raised by the producer when it
    /// declares the consumer dead, so that kernels the consumer launched on the ring leave.
    pub fn kernel_abort(&self) -> &'a AtomicU64 {
        self.block.word(self.block.layout.kernel_abort_offset(self.index))
    }

    /// `CLOCK_MONOTONIC` nanoseconds of the consumer's last sign of life.
    pub fn heartbeat_ns(&self) -> &'a AtomicU64 {
        self.block.word(self.block.layout.consumer_heartbeat_offset(self.index))
    }

    /// `released[slot]`: `s + 1` once this consumer is done with frame `s` in that slot; 0 = nothing yet;
    /// [`POISON`] once the consumer is gone. `slot` must be below the ring's slot count.
    pub fn released(&self, slot: SlotIndex) -> &'a AtomicU64 {
        self.block.word(self.block.layout.released_offset(self.index, slot))
    }

    /// The `released` counters of the ring's slots, slot 0 first.
    pub fn released_counters(&self) -> impl Iterator<Item = &'a AtomicU64> + use<'a> {
        let record = *self;
        (0..record.block.slot_count).map(move |slot| record.released(SlotIndex(slot)))
    }
}

impl ControlBlock {
    pub(super) fn create(config: RingConfig) -> Result<Self, RingError> {
        check_range("slot_count", config.slot_count, MAX_SLOTS)?;
        check_range("max_consumers", config.max_consumers, MAX_CONSUMERS)?;
        let layout = RingLayout::for_slots(config.slot_count).ok_or(RingError::InvalidConfig {
            what: "slot_count",
            value: u64::from(config.slot_count),
            max: u64::from(MAX_SLOTS),
        })?;
        let bytes = layout.block_bytes();
        let memory = Arc::new(SharedMemory::create("gpu-ipc-ring-control", bytes)?);
        let block = Self { memory, layout, slot_count: config.slot_count, max_consumers: config.max_consumers };
        // Nobody else can see the memfd yet; Relaxed stores, then the magic with Release so that a peer that
        // checks the magic with Acquire sees a complete header however the fd reached it.
        for (offset, value) in [
            (header::LAYOUT_VERSION, layout.version()),
            (header::TOTAL_BYTES, bytes as u64),
            (header::SLOT_COUNT, u64::from(config.slot_count)),
            (header::MAX_CONSUMERS, u64::from(config.max_consumers)),
            (header::GENERATION, config.generation),
            (header::PRODUCER_PID, rustix::process::getpid().as_raw_pid() as u64),
            (header::PRODUCER_STATE, ProducerState::Running as u64),
            (layout.producer_heartbeat_offset(), monotonic_ns()),
        ] {
            block.word(offset).store(value, Ordering::Relaxed);
        }
        block.word(header::MAGIC).store(MAGIC, Ordering::Release);
        tracing::debug!(?config, %layout, bytes, "created ring control block");
        Ok(block)
    }

    /// Maps a control block received from the producer and validates its header, in either layout: its size says
    /// which layout to expect, and its header must say the same.
    pub fn attach(fd: OwnedFd) -> Result<Self, RingError> {
        let sizes = |actual: u64| RingLayout::from_block_bytes(actual).map(RingLayout::block_bytes);
        let memory = Arc::new(SharedMemory::from_fd_of_size(fd, sizes, RingLayout::V1.block_bytes())?);
        let Some(sized) = RingLayout::from_block_bytes(memory.len() as u64) else {
            return Err(RingError::Corrupt { what: "control block size", value: memory.len() as u64 });
        };
        // The header is the same in every layout: read it before trusting the size's layout.
        let probe = Self { memory, layout: sized, slot_count: 1, max_consumers: 1 };
        let magic = probe.word(header::MAGIC).load(Ordering::Acquire);
        if magic != MAGIC {
            return Err(RingError::BadMagic { found: magic });
        }
        let version = probe.word(header::LAYOUT_VERSION).load(Ordering::Relaxed);
        let Some(layout) = RingLayout::from_version(version) else {
            return Err(RingError::LayoutVersion { found: version, newest: RingLayout::V2.version() });
        };
        let total = probe.word(header::TOTAL_BYTES).load(Ordering::Relaxed);
        if layout != sized || total != layout.block_bytes() as u64 {
            return Err(RingError::Corrupt { what: "total_bytes", value: total });
        }
        let slots = probe.word(header::SLOT_COUNT).load(Ordering::Relaxed);
        let slot_count = header_count(slots, "slot_count", layout.max_slots())?;
        let consumers = probe.word(header::MAX_CONSUMERS).load(Ordering::Relaxed);
        let max_consumers = header_count(consumers, "max_consumers", MAX_CONSUMERS)?;
        Ok(Self { memory: probe.memory, layout, slot_count, max_consumers })
    }

    /// The block's byte layout: where every counter is (what GPU strategies add to the mapping's device base).
    pub fn layout(&self) -> RingLayout {
        self.layout
    }

    /// The mapping: its fd to send to consumers, its base address and length for `cuMemHostRegister`.
    pub fn memory(&self) -> &SharedMemory {
        &self.memory
    }

    /// The mapping itself, shareable: what GPU strategies register with `cuMemHostRegister` so streams can wait
    /// on and write the counters at `base + offset`.
    pub fn shared(&self) -> Arc<SharedMemory> {
        self.memory.clone()
    }

    /// The 64-bit word at byte `offset` of the block, if `offset` is an aligned offset inside it: for tests and
    /// tools that look at a counter by the offset a [`RingLayout`] gives. Prefer the state-machine methods to
    /// writing it.
    pub fn counter(&self, offset: usize) -> Option<&AtomicU64> {
        if offset.is_multiple_of(8) { self.memory.as_words().get(offset / 8) } else { None }
    }

    /// The word at `offset`, which the caller computed from the layout for a slot below `slot_count` and a record
    /// below `max_consumers` (the layout's assertions keep every such word inside the block).
    fn word(&self, offset: usize) -> &AtomicU64 {
        &self.memory.as_words()[offset / 8]
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
        self.word(header::GENERATION).load(Ordering::Relaxed)
    }

    /// Producer pid from the header.
    pub fn producer_pid(&self) -> u64 {
        self.word(header::PRODUCER_PID).load(Ordering::Relaxed)
    }

    /// The header's producer state word (a [`ProducerState`]).
    pub fn producer_state(&self) -> &AtomicU64 {
        self.word(self.layout.producer_state_offset())
    }

    /// `CLOCK_MONOTONIC` ns of the producer's last sign of life.
    pub fn producer_heartbeat_ns(&self) -> &AtomicU64 {
        self.word(self.layout.producer_heartbeat_offset())
    }

    /// Byte offset of the ring's device words in the frame allocation (`header.device_words`), 0 when it has none:
    /// what the producer stored before its first offer ([`ProducerControl::set_device_words`](
    /// super::ProducerControl::set_device_words)). Unchecked here: a consumer checks it against the allocation.
    pub fn device_words_offset(&self) -> u64 {
        self.word(header::DEVICE_WORDS).load(Ordering::Acquire)
    }

    pub(super) fn device_words_counter(&self) -> &AtomicU64 {
        self.word(header::DEVICE_WORDS)
    }

    /// The producer's kernel abort word ([`header::PRODUCER_KERNEL_ABORT`]): raised by a consumer that saw the
    /// producer's process gone, so that kernels the producer launched on the ring leave.
    pub fn producer_kernel_abort(&self) -> &AtomicU64 {
        self.word(header::PRODUCER_KERNEL_ABORT)
    }

    /// The `next_sequence` word (see [`next_sequence`](Self::next_sequence)).
    pub fn next_sequence_counter(&self) -> &AtomicU64 {
        self.word(self.layout.next_sequence_offset())
    }

    /// Slot of frame `seq`: `seq % N`.
    pub fn slot_for(&self, seq: Sequence) -> SlotIndex {
        // The remainder is below slot_count <= MAX_SLOTS, so it fits in u32.
        SlotIndex((seq.0 % u64::from(self.slot_count)) as u32)
    }

    /// First sequence not yet published (or enqueued for publication).
    pub fn next_sequence(&self) -> Sequence {
        Sequence(self.next_sequence_counter().load(Ordering::Acquire))
    }

    /// State and epoch of consumer record `index`, or `None` for an index outside the ring or an invalid word.
    pub fn consumer_state(&self, index: u32) -> Option<(ConsumerState, u32)> {
        let word = self.record_at(index)?.state().load(Ordering::Acquire);
        Some((ConsumerState::from_raw(word)?, state_epoch(word)))
    }

    /// What record `index` says of its consumer, for a status report: state, epoch, pid, its last sign of life
    /// (`CLOCK_MONOTONIC` ns, see [`super::monotonic_ns`]) and the newest frame it released (`None`: none yet, or
    /// its counters are poisoned).
    pub fn consumer_activity(&self, index: u32) -> Option<ConsumerActivity> {
        let record = self.record_at(index)?;
        let word = record.state().load(Ordering::Acquire);
        let state = ConsumerState::from_raw(word)?;
        let last_released = record
            .released_counters()
            .map(|c| c.load(Ordering::Relaxed))
            .filter(|v| *v != 0 && *v < POISON)
            .max()
            .map(|v| v - 1);
        Some(ConsumerActivity {
            state,
            epoch: state_epoch(word),
            pid: record.pid().load(Ordering::Relaxed),
            heartbeat_ns: record.heartbeat_ns().load(Ordering::Relaxed),
            last_released,
        })
    }

    /// `published[slot]`: `s + 1` once frame `s` in that slot is complete; 0 = never; [`POISON`] once the producer
    /// is gone. `slot` must be below the ring's slot count (as [`slot_for`](Self::slot_for) gives).
    pub fn published(&self, slot: SlotIndex) -> &AtomicU64 {
        self.word(self.layout.published_offset(slot))
    }

    /// The `published` counters of the ring's slots, slot 0 first.
    pub fn published_counters(&self) -> impl Iterator<Item = &AtomicU64> {
        (0..self.slot_count).map(|slot| self.published(SlotIndex(slot)))
    }

    /// Consumer record `index`, or `None` outside the ring's records.
    pub fn record_at(&self, index: u32) -> Option<ConsumerRecord<'_>> {
        (index < self.max_consumers).then_some(ConsumerRecord { block: self, index })
    }

    pub(super) fn record(&self, consumer: ConsumerId) -> Result<ConsumerRecord<'_>, RingError> {
        self.record_at(consumer.index())
            .ok_or(RingError::UnknownConsumer { consumer, max_consumers: self.max_consumers })
    }

    /// The record of `consumer` if it is in `expected` state in the consumer's epoch.
    pub(super) fn record_in(
        &self,
        consumer: ConsumerId,
        expected: ConsumerState,
    ) -> Result<ConsumerRecord<'_>, RingError> {
        let record = self.record(consumer)?;
        let word = record.state().load(Ordering::Acquire);
        if word == state_word(consumer.epoch(), expected) {
            Ok(record)
        } else {
            Err(RingError::NotLive { consumer, found: ConsumerState::from_raw(word), found_epoch: state_epoch(word) })
        }
    }

    pub(super) fn active_records(&self) -> impl Iterator<Item = (u32, ConsumerRecord<'_>)> {
        (0..self.max_consumers).map(|index| (index, ConsumerRecord { block: self, index }))
    }

    /// Writes [`POISON`] into every `released` counter of a record (the owner is gone or left).
    pub(super) fn poison_released(&self, record: ConsumerRecord<'_>) {
        for counter in record.released_counters() {
            counter.fetch_max(POISON, Ordering::Release);
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
