//! The control block's shared vocabulary (sequences, slots, consumer ids, states, [`POISON`]) and, in
//! [`RingLayout`], its byte layouts: version 1 for rings of up to 32 slots, version 2 for up to [`MAX_SLOTS`].
//!
//! Every counter is a naturally aligned 64-bit word so that GPU stream memory operations (`cuStreamWaitValue64`,
//! `cuStreamWriteValue64`) can wait on and write the same words through a `cuMemHostRegister`ed mapping: their
//! device address is the mapping's device base plus the byte offset a [`RingLayout`] gives
//! ([`RingLayout::published_offset`], [`RingLayout::released_offset`] and friends). Nothing else computes an offset.

mod offsets;

pub use offsets::{LAYOUT_1_MAX_SLOTS, MAX_SLOTS, RingLayout, header};

use std::fmt;

/// First header word: "GIPCRING" in little-endian bytes.
pub const MAGIC: u64 = u64::from_le_bytes(*b"GIPCRING");

/// Most consumers that can be attached at once, in every layout.
pub const MAX_CONSUMERS: u32 = 16;

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

    /// Record index, `0..max_consumers`: what [`RingLayout::released_offset`] and
    /// [`RingLayout::consumer_state_offset`] take.
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

/// State of the producer, in the header word at [`header::PRODUCER_STATE`].
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

/// State of a consumer record, in the low 8 bits of its state word ([`RingLayout::consumer_state_offset`]) (the registration epoch is in the
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
