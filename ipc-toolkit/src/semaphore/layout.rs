//! Byte layout of the semaphore's shared block (version [`LAYOUT_VERSION`]): a sealed memfd of
//! [`SHARED_BYTES`] seen as 64-bit atomic words, so that GPU stream memory operations (`cuStreamWaitValue64`) wait
//! on the very word the CPU reads, through a `cuMemHostRegister`ed mapping at `device base + byte offset`.
//!
//! The block is an array of words (`[AtomicU64; SHARED_WORDS]`, whose "made only of atomics" promise the shm layer
//! already makes), and this file names the words. Every word the hot path writes (`posted`, `taken`) sits alone on
//! a 128-byte line; each peer record starts on its own line.
//!
//! | word | field |
//! |---:|---|
//! | 0 | magic `"GIPCSEMA"` |
//! | 1 | layout version |
//! | 2 | total bytes of the memfd |
//! | 3 | peer records in use |
//! | 4 | owner pid (in the owner's PID namespace) |
//! | 5 | generation |
//! | 6 | semaphore state ([`SemaphoreState`]) |
//! | 7 | pid of the peer whose death broke the semaphore (0 = unknown) |
//! | 8 | record of that peer (`epoch << 32 \| index`) |
//! | 9 | what a dead poster does ([`DeadPoster`]: 0 poison, 1 ignore), set at creation |
//! | 10 | resets so far (the owner's [`reset`](super::SemaphoreOwner::reset)) |
//! | 11 | first ticket the last reset found unreached by a post (released by the poison) |
//! | 12 | `taken` at the last reset: tickets `[word 11, word 12)` were released by the poison |
//! | 16 | `posted`: posts so far (bit 62 = poison) |
//! | 32 | `taken`: tickets handed out so far |
//! | 48 + 128 r | record `r`: state word (`epoch << 8 \| RecordState`) |
//! | 48 + 128 r + 1 | record `r`: pid |
//! | 48 + 128 r + 2 | record `r`: flags (bit 0: the peer has posted, set by the peer before its first post) |
//! | 48 + 128 r + 8 + i | record `r`: ticket slot `i` (0 = empty, `t + 1` = ticket `t`, bit 63 = being taken) |

use std::sync::atomic::AtomicU64;

/// First header word: "GIPCSEMA" in little-endian bytes.
pub const MAGIC: u64 = u64::from_le_bytes(*b"GIPCSEMA");

/// Version of this layout; bumped on any change to offsets or meanings.
pub const LAYOUT_VERSION: u32 = 2;

/// Size of the memfd: 64 KiB, a whole number of pages on every Linux page size, as `cuMemHostRegister` wants.
pub const SHARED_BYTES: usize = 64 * 1024;

/// Words in the block.
pub const SHARED_WORDS: usize = SHARED_BYTES / 8;

/// The block as the shm layer maps it.
pub type SharedWords = [AtomicU64; SHARED_WORDS];

/// Words per 128-byte line.
pub const LINE_WORDS: usize = 16;

/// Header word: [`MAGIC`], written last at creation with release ordering.
pub const MAGIC_WORD: usize = 0;
/// Header word: [`LAYOUT_VERSION`].
pub const VERSION_WORD: usize = 1;
/// Header word: [`SHARED_BYTES`].
pub const TOTAL_BYTES_WORD: usize = 2;
/// Header word: peer records in use, `1..=MAX_PEERS`.
pub const MAX_PEERS_WORD: usize = 3;
/// Header word: the owner's pid.
pub const OWNER_PID_WORD: usize = 4;
/// Header word: the owner's generation (any value that tells this semaphore from an earlier one).
pub const GENERATION_WORD: usize = 5;
/// Header word: a [`SemaphoreState`].
pub const STATE_WORD: usize = 6;
/// Header word: the pid of the peer whose death broke the semaphore, 0 when unknown (another PID namespace).
pub const BROKEN_PID_WORD: usize = 7;
/// Header word: the record of that peer, `epoch << 32 | index`.
pub const BROKEN_RECORD_WORD: usize = 8;

/// Header word: what a dead poster does, a [`DeadPoster`] (written at creation, never changed).
pub const DEAD_POSTER_WORD: usize = 9;
/// Header word: resets so far.
pub const RESETS_WORD: usize = 10;
/// Header word: the real count of `posted` when the last reset happened: tickets from here ...
pub const RESET_FROM_WORD: usize = 11;
/// Header word: ... up to `taken` at the last reset (this word, excluded) were released by the poison.
pub const RESET_TO_WORD: usize = 12;

/// Word of `posted`, the number of posts so far; bit 62 ([`POISON`]) once the semaphore is broken or closed.
pub const POSTED_WORD: usize = LINE_WORDS;
/// Word of `taken`, the number of tickets handed out so far (post `t + 1` is ticket `t`'s).
pub const TAKEN_WORD: usize = 2 * LINE_WORDS;

/// Byte offset of `posted`: what a stream's `cuStreamWaitValue64` waits on.
pub const POSTED_OFFSET: usize = POSTED_WORD * 8;

/// First word of record 0.
pub const RECORDS_WORD: usize = 3 * LINE_WORDS;
/// Words per peer record.
pub const RECORD_WORDS: usize = 128;
/// Most peers (the owner included, in record 0) attached at once.
pub const MAX_PEERS: u32 = 32;
/// Record word: `epoch << 8 | RecordState`.
pub const RECORD_STATE: usize = 0;
/// Record word: the peer's pid as the owner saw it (0 = unknown).
pub const RECORD_PID: usize = 1;
/// Record word: flags, [`FLAG_POSTED`].
pub const RECORD_FLAGS: usize = 2;
/// Record word: first ticket slot.
pub const RECORD_TICKETS: usize = 8;
/// Ticket slots per record: how many stream waits of one peer may wait at once.
pub const TICKETS_PER_PEER: usize = RECORD_WORDS - RECORD_TICKETS;

/// Record flag: the peer has posted (or queued a stream post), so its death without detaching may leave posts it
/// owed unmade. The peer sets it itself, atomically, before its first post can land: a peer that never posted
/// never has it, so its death never poisons.
pub const FLAG_POSTED: u64 = 1;

/// Ticket slot bit: the peer is taking ticket `(slot & !TAKING) - 1` (the compare-and-swap on `taken` may or may
/// not have happened).
pub const TAKING: u64 = 1 << 63;

/// What a survivor ORs into `posted` to release every GPU-side wait: the ring's poison, `2^62`, for the same
/// reason: `cuStreamWaitValue64`'s `GEQ` is the wrap-around `(int64)(*addr - value) >= 0`, which `2^62 + low`
/// passes for every ticket below `2^62`. The low bits keep the real count, so a ticket can still tell whether a
/// real post released it.
pub use ipc_core::ring::POISON;

/// Mask of the real count in `posted`.
pub const COUNT_MASK: u64 = POISON - 1;

/// Most a single `post` may add: keeps the count far from the poison bit.
pub const MAX_POST: u64 = 1 << 32;

/// The semaphore's state (header word [`STATE_WORD`]). It leaves `Open` once, to the first reason that ends it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u64)]
pub enum SemaphoreState {
    /// Being initialised (all zeros).
    Uninitialised = 0,
    /// Working.
    Open = 1,
    /// A peer that posts died without detaching: posts it owed will never come. `posted` holds the poison.
    Broken = 2,
    /// The owner's process is gone (an importer saw its connection hang up). `posted` holds the poison.
    OwnerGone = 3,
    /// The owner closed the semaphore. `posted` holds the poison.
    Closed = 4,
}

impl SemaphoreState {
    /// Decodes the state word; an unknown value (corrupt or newer peer) is `None`.
    pub const fn from_raw(raw: u64) -> Option<Self> {
        match raw {
            0 => Some(Self::Uninitialised),
            1 => Some(Self::Open),
            2 => Some(Self::Broken),
            3 => Some(Self::OwnerGone),
            4 => Some(Self::Closed),
            _ => None,
        }
    }
}

/// What the death of a peer that has posted does to the semaphore, chosen by the owner at creation
/// ([`OwnerOptions::dead_poster`](super::OwnerOptions::dead_poster)) and kept in the shared block (header word
/// [`DEAD_POSTER_WORD`]), so every peer sees the same rule.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[repr(u64)]
pub enum DeadPoster {
    /// The semaphore breaks (state `Broken`, `posted` poisoned): every waiter learns that posts may never come.
    /// The owner can [`reset`](super::SemaphoreOwner::reset) it.
    #[default]
    Poison = 0,
    /// The death is logged and its unreached stream waits are made good, as a waiter's; the semaphore goes on.
    /// For posters that are interchangeable (any live one will post what is needed).
    Ignore = 1,
}

impl DeadPoster {
    /// Decodes the header word; an unknown value (corrupt or newer owner) is `None`.
    pub const fn from_raw(raw: u64) -> Option<Self> {
        match raw {
            0 => Some(Self::Poison),
            1 => Some(Self::Ignore),
            _ => None,
        }
    }
}

/// A peer record's state, in the low 8 bits of its state word (the claim epoch is above).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u64)]
pub enum RecordState {
    /// Unused.
    Free = 0,
    /// Offered to a connecting peer that has not confirmed yet.
    Offered = 1,
    /// Attached: counts.
    Attached = 2,
    /// Left cleanly; the owner frees it when the connection closes.
    Detached = 3,
}

impl RecordState {
    /// Decodes the low 8 bits of a state word; unknown values are `None`.
    pub const fn from_raw(raw: u64) -> Option<Self> {
        match raw & 0xff {
            0 => Some(Self::Free),
            1 => Some(Self::Offered),
            2 => Some(Self::Attached),
            3 => Some(Self::Detached),
            _ => None,
        }
    }
}

/// A record state word: `epoch << 8 | state`.
pub const fn record_word(epoch: u32, state: RecordState) -> u64 {
    ((epoch as u64) << 8) | state as u64
}

/// The epoch of a record state word.
pub const fn record_epoch(word: u64) -> u32 {
    (word >> 8) as u32
}

/// First word of record `index` (below [`MAX_PEERS`]).
pub const fn record_word_index(index: u32) -> usize {
    RECORDS_WORD + index as usize * RECORD_WORDS
}

// The layout is an ABI shared with other processes (and other languages): pin it.
const _: () = {
    assert!(BROKEN_RECORD_WORD < LINE_WORDS);
    assert!(RESET_TO_WORD < LINE_WORDS);
    assert!(POSTED_OFFSET == 128);
    assert!(TAKEN_WORD * 8 == 256);
    assert!(RECORDS_WORD * 8 == 384);
    assert!(record_word_index(MAX_PEERS) <= SHARED_WORDS);
    assert!(TICKETS_PER_PEER == 120);
    assert!(SHARED_BYTES == 65536);
};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn state_words_round_trip_and_unknown_values_are_none() {
        for state in [RecordState::Free, RecordState::Offered, RecordState::Attached, RecordState::Detached] {
            let word = record_word(7, state);
            assert_eq!((RecordState::from_raw(word), record_epoch(word)), (Some(state), 7));
        }
        assert_eq!(RecordState::from_raw(0x1ff), None);
        assert_eq!(SemaphoreState::from_raw(2), Some(SemaphoreState::Broken));
        assert_eq!(SemaphoreState::from_raw(5), None);
        assert_eq!(MAGIC.to_le_bytes(), *b"GIPCSEMA");
    }

    #[test]
    fn the_device_headers_count_mask_is_this_one() {
        let header = include_str!("../../../kernels/cuda/gpu_ipc_semaphore.cuh");
        let line = header.lines().find(|l| l.starts_with("#define GPU_IPC_SEMAPHORE_COUNT_MASK")).unwrap_or_default();
        let hex = line.split_whitespace().nth(2).unwrap_or_default().trim_end_matches("ull").trim_start_matches("0x");
        assert_eq!(u64::from_str_radix(hex, 16).ok(), Some(COUNT_MASK), "{line}");
    }

    #[test]
    fn poison_passes_the_gpu_comparison_for_every_ticket_and_keeps_the_count() {
        // cuStreamWaitValue64 GEQ: (int64)(*addr - value) >= 0.
        let geq = |word: u64, value: u64| (word.wrapping_sub(value) as i64) >= 0;
        for (count, ticket) in [(0u64, 0u64), (5, 1_000_000), (MAX_POST, (1 << 61) - 1)] {
            let poisoned = count | POISON;
            assert!(geq(poisoned, ticket + 1), "count {count}, ticket {ticket}");
            assert_eq!(poisoned & COUNT_MASK, count);
        }
        assert!(!geq(u64::MAX, 2), "u64::MAX would not release a wait");
    }
}
