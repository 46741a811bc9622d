//! Byte layout of the frame ring's control block in host shared memory (version [`LAYOUT_VERSION`]).
//!
//! Every counter is a naturally aligned `AtomicU64` so that GPU stream memory operations
//! (`cuStreamWaitValue64`, `cuStreamWriteValue64`) can wait on and write the same words through a
//! `cuMemHostRegister`ed mapping: their device address is the mapping's device base plus the byte offset returned by
//! [`published_offset`], [`released_offset`] and friends. Each counter written per frame sits alone on a 128-byte
//! line (two 64-byte lines: adjacent-line prefetch pairs them on x86), so no two writers share a line.
//!
//! The layout has a fixed size whatever the ring's `slot_count` and `max_consumers` (up to [`MAX_SLOTS`] and
//! [`MAX_CONSUMERS`]), so every offset is a compile-time function of the indices alone.

use std::fmt;
use std::mem::offset_of;
use std::sync::atomic::AtomicU64;

use crate::sys::shm::AtomicPlainData;

/// First header word: "GIPCRING" in little-endian bytes.
pub const MAGIC: u64 = u64::from_le_bytes(*b"GIPCRING");

/// Version of this byte layout; bumped on any change to offsets or meanings.
pub const LAYOUT_VERSION: u64 = 1;

/// Most slots a ring can have.
pub const MAX_SLOTS: u32 = 32;

/// Most consumers that can be attached at once.
pub const MAX_CONSUMERS: u32 = 16;

/// Bytes each hot counter occupies, so no two of them share a cache line (or an adjacent-line prefetch pair).
pub const COUNTER_STRIDE: usize = 128;

/// Size of the control block memfd: the layout rounded up to 64 KiB, a whole number of pages on every Linux page
/// size (4 KiB, 16 KiB, 64 KiB), as `cuMemHostRegister` of the full mapping wants.
pub const CONTROL_BLOCK_BYTES: usize = size_of::<ControlBlockLayout>().next_multiple_of(64 * 1024);

/// Value a survivor writes into a counter of a dead peer to release every GPU-side wait on it.
///
/// All waits in the ring are "counter >= value" (`CU_STREAM_WAIT_VALUE_GEQ`), and counters only grow, so a value
/// above every sequence number satisfies any pending or future wait. It is `2^62`, not `u64::MAX`: the GPU's
/// comparison is the wrap-around `(int64)(*addr - value) >= 0`, which `u64::MAX` fails for every small `value`
/// (it reads as -1 - value); `2^62` passes it for every sequence below `2^62` (146,000 years at 1M frames/s). It is sticky: the host-side writers use `fetch_max`, so a late
/// write from a peer that was declared dead cannot lower it (`released` counters get `fetch_max(POISON)`; `published`
/// counters get `fetch_or(POISON)`, which keeps the last frame in the low bits: a value with this bit set is poison).
/// A consumer that reads a poisoned `published` reports
/// [`ProducerGone`](super::RingError::ProducerGone); what a GPU kernel released by poison computed is garbage and the
/// host discards it when it sees the error.
pub const POISON: u64 = 1 << 62;

/// A frame's position in the stream: frame `s` is the `s`-th frame the producer publishes, starting at 0.
///
/// 64-bit, so it never wraps (at 40,000 frames/s a 32-bit counter would wrap in 30 hours).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Sequence(pub u64);

impl Sequence {
    /// The frame after this one.
    pub const fn next(self) -> Self {
        Self(self.0 + 1)
    }

    /// Counter value that marks this frame done: `s + 1`, so that 0 can mean "never".
    pub const fn done_value(self) -> u64 {
        self.0 + 1
    }
}

impl fmt::Display for Sequence {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "#{}", self.0)
    }
}

/// Index of a slot of the ring: frame `s` lives in slot `s % slot_count`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct SlotIndex(pub u32);

/// One attached consumer: its record index in the control block and the registration epoch of that record.
///
/// The epoch changes every time a record is claimed, so a stale id (of a consumer that detached or was declared
/// dead, and whose record now serves someone else) is refused instead of acting on the newcomer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ConsumerId {
    index: u32,
    epoch: u32,
}

impl ConsumerId {
    pub(crate) const fn new(index: u32, epoch: u32) -> Self {
        Self { index, epoch }
    }

    /// Record index, `0..max_consumers`: what [`released_offset`] and [`consumer_state_offset`] take.
    pub const fn index(self) -> u32 {
        self.index
    }

    /// Registration epoch of the record.
    pub const fn epoch(self) -> u32 {
        self.epoch
    }

    /// Encoding for the wire: `epoch << 32 | index`.
    pub const fn to_u64(self) -> u64 {
        ((self.epoch as u64) << 32) | self.index as u64
    }

    /// Decodes [`ConsumerId::to_u64`].
    pub const fn from_u64(raw: u64) -> Self {
        Self { index: raw as u32, epoch: (raw >> 32) as u32 }
    }
}

impl fmt::Display for ConsumerId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "consumer {} (epoch {})", self.index, self.epoch)
    }
}

/// State of the producer, in [`Header::producer_state`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u64)]
pub enum ProducerState {
    /// The block is being initialised (all zeros).
    Uninitialised = 0,
    /// Publishing.
    Running = 1,
    /// Closed cleanly; no more frames will come.
    Closed = 2,
}

impl ProducerState {
    /// Decodes a raw header word; unknown values (a newer or corrupt peer) are `None`.
    pub const fn from_raw(raw: u64) -> Option<Self> {
        match raw {
            0 => Some(Self::Uninitialised),
            1 => Some(Self::Running),
            2 => Some(Self::Closed),
            _ => None,
        }
    }
}

/// State of a consumer record, in the low 8 bits of [`ConsumerRecord::state`] (the registration epoch is in the
/// bits above, so a compare-and-swap on the word checks both at once).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u64)]
pub enum ConsumerState {
    /// Unused; may be claimed by `register_consumer`.
    Free = 0,
    /// Claimed; its join sequence is being decided. The producer must not reuse slots until it is `Live`.
    Joining = 1,
    /// Attached: counts for back-pressure on frames from its join sequence on.
    Live = 2,
    /// Left cleanly; does not count. Becomes `Free` when the producer reclaims it.
    Detached = 3,
    /// Declared dead by the producer; does not count; its released counters hold [`POISON`].
    Dead = 4,
}

impl ConsumerState {
    /// Decodes the low 8 bits of a state word; unknown values are `None`.
    pub const fn from_raw(raw: u64) -> Option<Self> {
        match raw & STATE_MASK {
            0 => Some(Self::Free),
            1 => Some(Self::Joining),
            2 => Some(Self::Live),
            3 => Some(Self::Detached),
            4 => Some(Self::Dead),
            _ => None,
        }
    }
}

/// Low bits of a consumer state word that hold the [`ConsumerState`].
pub const STATE_MASK: u64 = 0xff;

/// Builds a consumer state word: `epoch << 8 | state`.
pub const fn state_word(epoch: u32, state: ConsumerState) -> u64 {
    ((epoch as u64) << 8) | state as u64
}

/// Registration epoch stored in a consumer state word.
pub const fn state_epoch(word: u64) -> u32 {
    (word >> 8) as u32
}

/// One 64-bit counter alone on a [`COUNTER_STRIDE`]-byte line.
#[derive(Debug, Default)]
#[repr(C, align(128))]
pub struct PaddedCounter {
    /// The counter.
    pub value: AtomicU64,
}

/// Fields written once at creation (and the producer state, written twice), on their own line.
#[derive(Debug, Default)]
#[repr(C, align(128))]
pub struct Header {
    /// [`MAGIC`], written last at creation with release ordering.
    pub magic: AtomicU64,
    /// [`LAYOUT_VERSION`].
    pub layout_version: AtomicU64,
    /// Size of the control block memfd, [`CONTROL_BLOCK_BYTES`].
    pub total_bytes: AtomicU64,
    /// Number of slots N in use, `1..=MAX_SLOTS`.
    pub slot_count: AtomicU64,
    /// Number of consumer records in use, `1..=MAX_CONSUMERS`.
    pub max_consumers: AtomicU64,
    /// Chosen by the producer per ring instance, to tell a restarted producer's ring from the old one.
    pub generation: AtomicU64,
    /// Producer's pid (in its own PID namespace).
    pub producer_pid: AtomicU64,
    /// A [`ProducerState`].
    pub producer_state: AtomicU64,
}

/// One consumer's record.
#[derive(Debug, Default)]
#[repr(C, align(128))]
pub struct ConsumerRecord {
    /// `epoch << 8 | ConsumerState`, see [`state_word`].
    pub state: AtomicU64,
    /// Consumer's pid as the producer saw it (`SO_PEERCRED`).
    pub pid: AtomicU64,
    /// First frame this consumer reads; frames before it never wait for it.
    pub join_sequence: AtomicU64,
    /// `CLOCK_MONOTONIC` nanoseconds of the consumer's last sign of life.
    pub heartbeat_ns: PaddedCounter,
    /// Per slot: `s + 1` once this consumer is done with frame `s` in that slot; 0 = nothing yet; [`POISON`] once
    /// the consumer is gone.
    pub released: [PaddedCounter; MAX_SLOTS as usize],
}

/// The whole control block, `#[repr(C)]`, mapped at offset 0 of the control memfd.
#[derive(Debug, Default)]
#[repr(C)]
pub struct ControlBlockLayout {
    /// Creation-time fields and producer state.
    pub header: Header,
    /// `CLOCK_MONOTONIC` nanoseconds of the producer's last sign of life.
    pub producer_heartbeat_ns: PaddedCounter,
    /// First sequence the producer has not yet published (or enqueued the publication of): the join sequence of a
    /// consumer registered now.
    pub next_sequence: PaddedCounter,
    /// Per slot: `s + 1` once frame `s` in that slot is complete; 0 = never; [`POISON`] once the producer is gone.
    pub published: [PaddedCounter; MAX_SLOTS as usize],
    /// Consumer records.
    pub consumers: [ConsumerRecord; MAX_CONSUMERS as usize],
}

// The one `unsafe` outside the driver and sys layers: only this file knows what the layout holds, so the promise
// that it is made of atomics alone is made here, next to the fields it is about (sys knows nothing of the ring).
// SAFETY: `ControlBlockLayout` and the structs it nests are `#[repr(C)]` and have only `AtomicU64` fields (directly
// or in arrays and nested `#[repr(C)]` structs); padding bytes from `align(128)` are never read as part of a
// value because atomics are never copied out wholesale.
#[allow(unsafe_code)]
unsafe impl AtomicPlainData for ControlBlockLayout {}

/// Byte offset of `published[slot]`. `slot` must be below [`MAX_SLOTS`] (checked by the ring, not here).
pub const fn published_offset(slot: SlotIndex) -> usize {
    offset_of!(ControlBlockLayout, published) + slot.0 as usize * size_of::<PaddedCounter>()
}

/// Byte offset of consumer record `consumer_index`.
pub const fn consumer_record_offset(consumer_index: u32) -> usize {
    offset_of!(ControlBlockLayout, consumers) + consumer_index as usize * size_of::<ConsumerRecord>()
}

/// Byte offset of consumer `consumer_index`'s `released[slot]`.
pub const fn released_offset(consumer_index: u32, slot: SlotIndex) -> usize {
    consumer_record_offset(consumer_index)
        + offset_of!(ConsumerRecord, released)
        + slot.0 as usize * size_of::<PaddedCounter>()
}

/// Byte offset of consumer `consumer_index`'s state word.
pub const fn consumer_state_offset(consumer_index: u32) -> usize {
    consumer_record_offset(consumer_index) + offset_of!(ConsumerRecord, state)
}

/// Byte offset of consumer `consumer_index`'s heartbeat.
pub const fn consumer_heartbeat_offset(consumer_index: u32) -> usize {
    consumer_record_offset(consumer_index) + offset_of!(ConsumerRecord, heartbeat_ns)
}

/// Byte offset of the header's producer state word.
pub const fn producer_state_offset() -> usize {
    offset_of!(ControlBlockLayout, header) + offset_of!(Header, producer_state)
}

/// Byte offset of the producer heartbeat.
pub const fn producer_heartbeat_offset() -> usize {
    offset_of!(ControlBlockLayout, producer_heartbeat_ns)
}

/// Byte offset of `next_sequence`.
pub const fn next_sequence_offset() -> usize {
    offset_of!(ControlBlockLayout, next_sequence)
}

// The layout is an ABI shared with other processes (and possibly other languages): pin it.
const _: () = {
    assert!(size_of::<PaddedCounter>() == COUNTER_STRIDE);
    assert!(size_of::<Header>() == 128);
    assert!(size_of::<ConsumerRecord>() == 256 + MAX_SLOTS as usize * COUNTER_STRIDE);
    assert!(published_offset(SlotIndex(0)) == 384);
    assert!(consumer_record_offset(0) == 384 + MAX_SLOTS as usize * COUNTER_STRIDE);
    assert!(size_of::<ControlBlockLayout>() == 4480 + MAX_CONSUMERS as usize * size_of::<ConsumerRecord>());
    assert!(CONTROL_BLOCK_BYTES == 128 * 1024);
};
