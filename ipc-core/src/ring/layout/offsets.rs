//! The control block's byte layouts, and the one place that computes an offset into it.
//!
//! Both layouts share everything but the spacing of the per-slot counters:
//!
//! - **Version 1** (rings of 1 to [`LAYOUT_1_MAX_SLOTS`] slots): every per-slot counter sits alone on a 128-byte
//!   line (two 64-byte lines: adjacent-line prefetch pairs them on x86). 131,072-byte block.
//! - **Version 2** (rings of more than 32 slots, up to [`MAX_SLOTS`]): the per-slot counters one writer writes are
//!   packed 8 bytes apart: every `published` word is the producer's, and consumer `c`'s `released` words are `c`'s
//!   alone, so packing puts no two writers on a line (each array starts on its own 128-byte line). 65,536-byte block.
//!
//! In both, the header, `producer_heartbeat_ns` and `next_sequence` sit where version 1 put them, and each consumer
//! record starts with the same 256 bytes (state, pid, join sequence; heartbeat on its own line); only the
//! `released` array that follows, and so the record's size, differ. Offsets depend on the layout and the indices,
//! never on the ring's slot or consumer count: unused slots and records are just never touched.

use super::{MAX_CONSUMERS, SlotIndex};

/// Most slots a ring can have (in layout version 2).
pub const MAX_SLOTS: u32 = 256;

/// Most slots a ring of layout version 1 can have; a ring of more slots uses version 2.
pub const LAYOUT_1_MAX_SLOTS: u32 = 32;

/// Byte offsets of the header's words, the same in every layout (the first 80 bytes of the block).
pub mod header {
    /// [`MAGIC`](super::super::MAGIC), written last at creation with release ordering.
    pub const MAGIC: usize = 0;
    /// The layout's version number ([`RingLayout::version`](super::RingLayout::version)).
    pub const LAYOUT_VERSION: usize = 8;
    /// Size of the control block memfd ([`RingLayout::block_bytes`](super::RingLayout::block_bytes)).
    pub const TOTAL_BYTES: usize = 16;
    /// Number of slots N in use.
    pub const SLOT_COUNT: usize = 24;
    /// Number of consumer records in use, `1..=MAX_CONSUMERS`.
    pub const MAX_CONSUMERS: usize = 32;
    /// Chosen by the producer per ring instance, to tell a restarted producer's ring from the old one.
    pub const GENERATION: usize = 40;
    /// Producer's pid (in its own PID namespace).
    pub const PRODUCER_PID: usize = 48;
    /// A [`ProducerState`](super::super::ProducerState).
    pub const PRODUCER_STATE: usize = 56;
    /// Byte offset, in the frame allocation, of the ring's device words (a copy of `published` and of every
    /// consumer's `released` in device memory, for kernels on the ring); 0 when the ring has none. Written once by
    /// the producer before its first offer; a block made before the word existed holds 0 there.
    pub const DEVICE_WORDS: usize = 64;
    /// The producer's kernel abort word: non-zero once a consumer saw the producer's process gone (its hang-up).
    /// Kernels the producer launched on the ring watch it (`peer_abort` of their exit words) and leave, so that a
    /// kernel whose process was killed does not spin on (docs/frames.md, "Kills under MPS"). A block made before
    /// the word existed holds 0 there.
    pub const PRODUCER_KERNEL_ABORT: usize = 72;
}

/// `producer_heartbeat_ns`: `CLOCK_MONOTONIC` ns of the producer's last sign of life, on its own line.
const PRODUCER_HEARTBEAT: usize = 128;
/// `next_sequence`: first sequence not yet published (or enqueued), on its own line.
const NEXT_SEQUENCE: usize = 256;
/// `published[0]`.
const PUBLISHED: usize = 384;
/// Bytes of a consumer record before its `released` array: the state line and the heartbeat line.
const RECORD_PREFIX: usize = 256;
/// Offsets inside a consumer record.
const RECORD_STATE: usize = 0;
const RECORD_PID: usize = 8;
const RECORD_JOIN: usize = 16;
/// The consumer's kernel abort word, on the state line (written at registration and at the consumer's death only).
const RECORD_KERNEL_ABORT: usize = 24;
const RECORD_HEARTBEAT: usize = 128;

/// One byte layout of the control block. [`RingLayout::for_slots`] picks it from the slot count; a block's header
/// says which it is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RingLayout {
    /// Version 1: 1 to 32 slots, each per-slot counter alone on a 128-byte line; 131,072 bytes.
    V1,
    /// Version 2: 1 to 256 slots (the reference producer uses it above 32), per-slot counters packed per writer;
    /// 65,536 bytes.
    V2,
}

impl RingLayout {
    /// The layout a ring of `slot_count` slots uses: version 1 up to 32 slots (byte for byte what consumers of
    /// version 1 read), version 2 up to [`MAX_SLOTS`]; `None` for 0 or more than [`MAX_SLOTS`].
    pub const fn for_slots(slot_count: u32) -> Option<Self> {
        match slot_count {
            0 => None,
            1..=LAYOUT_1_MAX_SLOTS => Some(Self::V1),
            _ if slot_count <= MAX_SLOTS => Some(Self::V2),
            _ => None,
        }
    }

    /// The layout a header's `layout_version` word names; `None` for a version this build does not read.
    pub const fn from_version(version: u64) -> Option<Self> {
        match version {
            1 => Some(Self::V1),
            2 => Some(Self::V2),
            _ => None,
        }
    }

    /// The layout whose block is `bytes` long; `None` for any other size.
    pub const fn from_block_bytes(bytes: u64) -> Option<Self> {
        if bytes == Self::V1.block_bytes() as u64 {
            Some(Self::V1)
        } else if bytes == Self::V2.block_bytes() as u64 {
            Some(Self::V2)
        } else {
            None
        }
    }

    /// Every layout this build reads, oldest first.
    pub const ALL: [Self; 2] = [Self::V1, Self::V2];

    /// The number in the header's `layout_version` word.
    pub const fn version(self) -> u64 {
        match self {
            Self::V1 => 1,
            Self::V2 => 2,
        }
    }

    /// Most slots a ring of this layout can have.
    pub const fn max_slots(self) -> u32 {
        match self {
            Self::V1 => LAYOUT_1_MAX_SLOTS,
            Self::V2 => MAX_SLOTS,
        }
    }

    /// Bytes between the counters of two adjacent slots (`published[i]` and `published[i + 1]`, or one consumer's
    /// `released[i]` and `released[i + 1]`): 128 in version 1, 8 in version 2.
    pub const fn counter_stride(self) -> usize {
        match self {
            Self::V1 => 128,
            Self::V2 => 8,
        }
    }

    /// Bytes between two consumer records (consumer `c`'s and `c + 1`'s counters of one slot are this far apart):
    /// 4,352 in version 1, 2,304 in version 2.
    pub const fn record_stride(self) -> usize {
        RECORD_PREFIX + self.max_slots() as usize * self.counter_stride()
    }

    /// Bytes the layout uses: 74,112 in version 1, 39,296 in version 2.
    pub const fn layout_bytes(self) -> usize {
        self.consumer_record_offset(MAX_CONSUMERS)
    }

    /// Size of the control block memfd: the layout rounded up to 64 KiB, a whole number of pages on every Linux
    /// page size (4 KiB, 16 KiB, 64 KiB), as `cuMemHostRegister` of the full mapping wants. 131,072 bytes in
    /// version 1, 65,536 in version 2.
    pub const fn block_bytes(self) -> usize {
        self.layout_bytes().next_multiple_of(64 * 1024)
    }

    /// Byte offset of `published[slot]`. `slot` must be below [`max_slots`](Self::max_slots) (checked by the ring,
    /// not here).
    pub const fn published_offset(self, slot: SlotIndex) -> usize {
        PUBLISHED + slot.0 as usize * self.counter_stride()
    }

    /// Byte offset of consumer record `consumer_index` (its state word).
    pub const fn consumer_record_offset(self, consumer_index: u32) -> usize {
        PUBLISHED + self.max_slots() as usize * self.counter_stride() + consumer_index as usize * self.record_stride()
    }

    /// Byte offset of consumer `consumer_index`'s `released[slot]`.
    pub const fn released_offset(self, consumer_index: u32, slot: SlotIndex) -> usize {
        self.consumer_record_offset(consumer_index) + RECORD_PREFIX + slot.0 as usize * self.counter_stride()
    }

    /// Byte offset of consumer `consumer_index`'s state word (`epoch << 8 | state`).
    pub const fn consumer_state_offset(self, consumer_index: u32) -> usize {
        self.consumer_record_offset(consumer_index) + RECORD_STATE
    }

    /// Byte offset of consumer `consumer_index`'s pid.
    pub const fn consumer_pid_offset(self, consumer_index: u32) -> usize {
        self.consumer_record_offset(consumer_index) + RECORD_PID
    }

    /// Byte offset of consumer `consumer_index`'s join sequence.
    pub const fn join_sequence_offset(self, consumer_index: u32) -> usize {
        self.consumer_record_offset(consumer_index) + RECORD_JOIN
    }

    /// Byte offset of consumer `consumer_index`'s kernel abort word: 0 while it lives; the producer raises it when
    /// it declares the consumer dead (and zeroes it when a new consumer takes the record). Kernels the consumer
    /// launched on the ring watch it (`peer_abort` of their exit words) and leave.
    pub const fn kernel_abort_offset(self, consumer_index: u32) -> usize {
        self.consumer_record_offset(consumer_index) + RECORD_KERNEL_ABORT
    }

    /// Byte offset of the header's producer kernel abort word ([`header::PRODUCER_KERNEL_ABORT`]).
    pub const fn producer_kernel_abort_offset(self) -> usize {
        header::PRODUCER_KERNEL_ABORT
    }

    /// Byte offset of consumer `consumer_index`'s heartbeat.
    pub const fn consumer_heartbeat_offset(self, consumer_index: u32) -> usize {
        self.consumer_record_offset(consumer_index) + RECORD_HEARTBEAT
    }

    /// Byte offset of the header's producer state word.
    pub const fn producer_state_offset(self) -> usize {
        header::PRODUCER_STATE
    }

    /// Byte offset of the producer heartbeat.
    pub const fn producer_heartbeat_offset(self) -> usize {
        PRODUCER_HEARTBEAT
    }

    /// Byte offset of `next_sequence`.
    pub const fn next_sequence_offset(self) -> usize {
        NEXT_SEQUENCE
    }
}

impl std::fmt::Display for RingLayout {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "control-block layout {} (1 to {} slots)", self.version(), self.max_slots())
    }
}

// The layouts are an ABI shared with other processes (and other languages): pin them to the numbers docs/ring.md
// states.
const _: () = {
    let (v1, v2) = (RingLayout::V1, RingLayout::V2);
    assert!(v1.published_offset(SlotIndex(1)) == 512);
    assert!(v1.consumer_record_offset(0) == 4480);
    assert!(v1.record_stride() == 4352);
    assert!(v1.released_offset(0, SlotIndex(0)) == 4736);
    assert!(v1.layout_bytes() == 74_112);
    assert!(v1.block_bytes() == 128 * 1024);
    assert!(v2.published_offset(SlotIndex(1)) == 392);
    assert!(v2.consumer_record_offset(0) == 2432);
    assert!(v2.record_stride() == 2304);
    assert!(v2.released_offset(0, SlotIndex(0)) == 2688);
    assert!(v2.layout_bytes() == 39_296);
    assert!(v2.block_bytes() == 64 * 1024);
    // Each writer's packed array starts on its own 128-byte line and ends before the next writer's line.
    assert!(v2.consumer_record_offset(0).is_multiple_of(128) && v2.record_stride().is_multiple_of(128));
    assert!(v1.consumer_record_offset(0).is_multiple_of(128) && v1.record_stride().is_multiple_of(128));
    // The last counter of the last record lies inside the block.
    assert!(v1.released_offset(MAX_CONSUMERS - 1, SlotIndex(LAYOUT_1_MAX_SLOTS - 1)) + 8 <= v1.block_bytes());
    assert!(v2.released_offset(MAX_CONSUMERS - 1, SlotIndex(MAX_SLOTS - 1)) + 8 <= v2.block_bytes());
};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_slot_count_picks_the_layout_and_version_1_stays_below_33_slots() {
        assert_eq!(RingLayout::for_slots(0), None);
        assert_eq!(RingLayout::for_slots(1), Some(RingLayout::V1));
        assert_eq!(RingLayout::for_slots(32), Some(RingLayout::V1));
        assert_eq!(RingLayout::for_slots(33), Some(RingLayout::V2));
        assert_eq!(RingLayout::for_slots(256), Some(RingLayout::V2));
        assert_eq!(RingLayout::for_slots(257), None);
        for layout in RingLayout::ALL {
            assert_eq!(RingLayout::from_version(layout.version()), Some(layout));
            assert_eq!(RingLayout::from_block_bytes(layout.block_bytes() as u64), Some(layout));
        }
        assert_eq!(RingLayout::from_version(3), None);
        assert_eq!(RingLayout::from_block_bytes(4096), None);
    }

    #[test]
    fn no_two_words_overlap_and_no_two_writers_share_a_line() {
        for layout in RingLayout::ALL {
            // (offset, writer): writer 0 is the producer, 1 + c is consumer c; per-frame counters only.
            let mut words = vec![(layout.next_sequence_offset(), 0), (layout.producer_heartbeat_offset(), 0)];
            for slot in 0..layout.max_slots() {
                words.push((layout.published_offset(SlotIndex(slot)), 0));
            }
            for c in 0..MAX_CONSUMERS {
                words.push((layout.consumer_heartbeat_offset(c), 1 + c));
                for slot in 0..layout.max_slots() {
                    words.push((layout.released_offset(c, SlotIndex(slot)), 1 + c));
                }
            }
            let mut lines = std::collections::HashMap::new();
            let mut seen = std::collections::HashSet::new();
            for &(offset, writer) in &words {
                assert!(offset.is_multiple_of(8) && offset + 8 <= layout.block_bytes(), "{layout}: {offset}");
                assert!(seen.insert(offset), "{layout}: two counters at byte {offset}");
                let owner = *lines.entry(offset / 128).or_insert(writer);
                assert_eq!(owner, writer, "{layout}: byte {offset} shares a 128-byte line with another writer");
            }
            for c in 0..MAX_CONSUMERS {
                // The state line (written by the producer and the consumer, at registration and detach) holds no
                // per-frame counter.
                assert!(!lines.contains_key(&(layout.consumer_state_offset(c) / 128)), "{layout}: record {c}");
                assert_eq!(layout.join_sequence_offset(c) / 128, layout.consumer_state_offset(c) / 128);
                // The kernel abort word: on the state line, a word of its own.
                let abort = layout.kernel_abort_offset(c);
                assert_eq!(abort / 128, layout.consumer_state_offset(c) / 128);
                let others =
                    [layout.consumer_state_offset(c), layout.consumer_pid_offset(c), layout.join_sequence_offset(c)];
                assert!(!others.contains(&abort) && !seen.contains(&abort), "{layout}: record {c}");
            }
            // The producer's kernel abort word: in the header's line, after the last header word.
            let abort = layout.producer_kernel_abort_offset();
            assert!(abort > header::DEVICE_WORDS && abort + 8 <= layout.producer_heartbeat_offset());
            assert!(!seen.contains(&abort));
        }
    }
}
