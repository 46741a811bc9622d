//! The work queue's shared layout: one allocation of device memory (host memory for the host backend) holding a
//! header, a table of per-worker counters, and `capacity` cells, each a 64-bit state word, the task's id, attempt
//! and length, and the record. Every offset here is also in `kernels/cuda/work_queue.cuh` (the kernels' side) and
//! in `docs/work-queue.md` (for peers in other languages); `the_header_offsets_match_the_cuda_header` checks the
//! first against this file.
//!
//! A cell's state word packs three fields: `lap << 24 | state << 16 | holder`. The lap is the cell's round
//! (`position / capacity`, wrapping in 40 bits), so a cell's word names the one position it is about and a stale
//! compare-and-swap can never succeed on a later round. The holder is the worker slot that is writing (`WRITING`)
//! or holds (`LEASED`) the task ([`GIVEN_BACK`] and [`TAKEN`] on the way back to the owner); the other states
//! carry 0.

use crate::queue::error::QueueError;

/// `"GPUIPCWQ"`, the first 8 bytes of the header.
pub const MAGIC: u64 = u64::from_le_bytes(*b"GPUIPCWQ");
/// Version of this layout (the header's and the offer's `version`).
pub const LAYOUT_VERSION: u32 = 1;
/// Bytes of the header, before the worker table.
pub const HEADER_BYTES: u64 = 512;
/// Bytes of one worker's counters in the worker table.
pub const WORKER_ENTRY_BYTES: u64 = 64;
/// Bytes of a cell before its record (the record starts 16-byte aligned).
pub const CELL_HEADER_BYTES: u64 = 32;
/// Alignment of the first cell.
pub const CELLS_ALIGN: u64 = 256;
/// Largest record.
pub const MAX_RECORD_BYTES: u32 = 4096;
/// Fewest cells.
pub const MIN_CAPACITY: u64 = 2;
/// Most cells (2^26).
pub const MAX_CAPACITY: u64 = 1 << 26;
/// Fewest worker slots (the owner's and one more).
pub const MIN_WORKERS: u32 = 2;
/// Most worker slots (slot numbers fit the state word's 16-bit holder field with room to spare).
pub const MAX_WORKERS: u32 = 4096;
/// The owner's worker slot; attached workers get 1 and up.
pub const OWNER_SLOT: u16 = 0;
/// The holder of a LEASED cell whose holder gave the task back ([`Task::give_back`](super::Task::give_back), or a
/// `Task` dropped without being completed): the owner's next sweep takes it and pushes it again. Never a worker
/// slot (those stop at [`MAX_WORKERS`]).
pub const GIVEN_BACK: u16 = 0xfffe;
/// The holder of a LEASED cell the owner has taken over (its holder gone, its lease expired, or given back) while
/// it copies the task out and frees the cell: nobody else can complete it any more.
pub const TAKEN: u16 = 0xffff;
// Neither is ever a worker slot, so no worker's compare-and-swap matches a task on its way back.
const _: () = assert!(GIVEN_BACK as u32 >= MAX_WORKERS && TAKEN as u32 >= MAX_WORKERS);
/// Bit 63 of the enqueue position: the queue is closed to new pushes.
pub const CLOSED: u64 = 1 << 63;
/// Bits of the lap in a state word.
pub const LAP_BITS: u32 = 40;
/// The lap's mask.
pub const LAP_MASK: u64 = (1 << LAP_BITS) - 1;

/// Byte offsets of the header's fields.
pub mod header {
    /// u64: [`MAGIC`](super::MAGIC).
    pub const MAGIC: u64 = 0;
    /// u32: [`LAYOUT_VERSION`](super::LAYOUT_VERSION).
    pub const VERSION: u64 = 8;
    /// u32: bytes of a record.
    pub const RECORD_BYTES: u64 = 12;
    /// u64: cells, a power of two.
    pub const CAPACITY: u64 = 16;
    /// u32: bytes from one cell to the next.
    pub const CELL_BYTES: u64 = 24;
    /// u32: worker slots, the owner's included.
    pub const MAX_WORKERS: u64 = 28;
    /// u64: offset of the first cell.
    pub const CELLS: u64 = 32;
    /// u64: offset of the worker table.
    pub const WORKERS: u64 = 40;
    /// u64: bytes the layout needs (the allocation may be larger).
    pub const TOTAL: u64 = 48;
    /// u32: log2 of the capacity.
    pub const CAPACITY_LOG2: u64 = 56;
    /// u64 counter: tasks taken back from a gone worker and pushed again.
    pub const REDELIVERED: u64 = 64;
    /// u64 counter: tasks taken back and not pushed again (too many attempts, or the queue closed).
    pub const LOST: u64 = 72;
    /// u64 counter: pushes cut off by their pusher's end (never published, so never tasks).
    pub const ABANDONED: u64 = 80;
    /// u64: nonzero while the owner is taking a gone worker's tasks back or pushing them again; pops do not seal a
    /// closed queue meanwhile.
    pub const RECLAIMING: u64 = 88;
    /// u64: the next position to push at, with [`CLOSED`](super::CLOSED) in bit 63. A 128-byte line of its own.
    pub const ENQUEUE: u64 = 128;
    /// u64: the next position to pop at. A 128-byte line of its own.
    pub const DEQUEUE: u64 = 256;
}

/// Byte offsets of a worker's counters, from its entry in the worker table.
pub mod worker {
    /// u64: tasks this slot pushed (the owner's redeliveries not counted).
    pub const PUSHED: u64 = 0;
    /// u64: tasks this slot popped.
    pub const POPPED: u64 = 8;
    /// u64: tasks this slot completed.
    pub const COMPLETED: u64 = 16;
}

/// Byte offsets of a cell's fields.
pub mod cell {
    /// u64: the state word.
    pub const STATE: u64 = 0;
    /// u64: the task's id (the position of its first push).
    pub const ID: u64 = 8;
    /// u32: how many times it was handed out before (0 the first time).
    pub const ATTEMPT: u64 = 16;
    /// u32: bytes of the record that were pushed (at most the queue's record size).
    pub const LEN: u64 = 20;
    /// The record.
    pub const RECORD: u64 = 32;
}

/// What a cell is doing, the middle field of its state word.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum CellState {
    /// Free for the push of its lap.
    Empty = 0,
    /// Claimed by the holder's push, its record being written.
    Writing = 1,
    /// Holds a task.
    Full = 2,
    /// The task is in the holder's hands.
    Leased = 3,
    /// The queue was closed and drained up to here: every pop ends here.
    Sealed = 4,
}

impl CellState {
    fn from_code(code: u64) -> Option<Self> {
        Some(match code {
            0 => Self::Empty,
            1 => Self::Writing,
            2 => Self::Full,
            3 => Self::Leased,
            4 => Self::Sealed,
            _ => return None,
        })
    }
}

/// A cell's state word, unpacked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CellWord {
    /// The round (`position / capacity`, in 40 bits).
    pub lap: u64,
    /// `None` for a code no peer writes (memory a faulty peer scribbled on): treated as a cell to retry.
    pub state: Option<CellState>,
    /// The worker slot writing or holding it.
    pub holder: u16,
}

impl CellWord {
    /// The word of `state` in lap `lap` (masked to 40 bits) held by `holder`.
    pub const fn pack(lap: u64, state: CellState, holder: u16) -> u64 {
        ((lap & LAP_MASK) << 24) | ((state as u64) << 16) | holder as u64
    }

    /// The fields of `word`.
    pub fn unpack(word: u64) -> Self {
        Self { lap: word >> 24, state: CellState::from_code((word >> 16) & 0xff), holder: (word & 0xffff) as u16 }
    }
}

/// How far the lap `cell_lap` is from `lap`, in laps, as a signed number (40-bit wrapping arithmetic).
pub fn lap_delta(cell_lap: u64, lap: u64) -> i64 {
    let d = cell_lap.wrapping_sub(lap) & LAP_MASK;
    ((d << 24) as i64) >> 24
}

/// Sizes and offsets of one queue, from its capacity, record size and worker slots.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Geometry {
    /// Cells: a power of two.
    pub capacity: u64,
    /// log2 of `capacity`.
    pub capacity_log2: u32,
    /// Bytes of a record.
    pub record_bytes: u32,
    /// Bytes from one cell to the next: the cell header and the record rounded up to 16.
    pub cell_bytes: u32,
    /// Worker slots, the owner's (0) included.
    pub max_workers: u32,
    /// Offset of the worker table.
    pub workers_offset: u64,
    /// Offset of the first cell.
    pub cells_offset: u64,
    /// Bytes the layout needs.
    pub total_bytes: u64,
}

impl Geometry {
    /// Checks the three choices and derives the rest.
    ///
    /// # Errors
    /// [`QueueError::Config`], saying which value is out of range and what is allowed.
    pub fn new(capacity: u64, record_bytes: u32, max_workers: u32) -> Result<Self, QueueError> {
        if !capacity.is_power_of_two() || !(MIN_CAPACITY..=MAX_CAPACITY).contains(&capacity) {
            return Err(QueueError::Config(format!(
                "capacity {capacity}: it must be a power of two from {MIN_CAPACITY} to {MAX_CAPACITY}"
            )));
        }
        if !(1..=MAX_RECORD_BYTES).contains(&record_bytes) {
            return Err(QueueError::Config(format!(
                "record size {record_bytes} bytes: it must be 1 to {MAX_RECORD_BYTES}"
            )));
        }
        if !(MIN_WORKERS..=MAX_WORKERS).contains(&max_workers) {
            return Err(QueueError::Config(format!(
                "{max_workers} worker slots: there must be {MIN_WORKERS} to {MAX_WORKERS} (the owner's included)"
            )));
        }
        let cell_bytes = CELL_HEADER_BYTES as u32 + record_bytes.next_multiple_of(16);
        let workers_offset = HEADER_BYTES;
        let cells_offset = (workers_offset + u64::from(max_workers) * WORKER_ENTRY_BYTES).next_multiple_of(CELLS_ALIGN);
        let total_bytes = cells_offset + capacity * u64::from(cell_bytes);
        Ok(Self {
            capacity,
            capacity_log2: capacity.trailing_zeros(),
            record_bytes,
            cell_bytes,
            max_workers,
            workers_offset,
            cells_offset,
            total_bytes,
        })
    }

    /// Byte offset of the cell of `position`.
    pub fn cell(&self, position: u64) -> u64 {
        self.cells_offset + (position & (self.capacity - 1)) * u64::from(self.cell_bytes)
    }

    /// The lap of `position`, in 40 bits.
    pub fn lap(&self, position: u64) -> u64 {
        (position >> self.capacity_log2) & LAP_MASK
    }

    /// Byte offset of worker slot `slot`'s counters.
    pub fn worker_entry(&self, slot: u16) -> u64 {
        self.workers_offset + u64::from(slot) * WORKER_ENTRY_BYTES
    }

    /// The first 64 bytes of the header as the owner writes them, as eight little-endian words.
    pub fn header_words(&self) -> [u64; 8] {
        [
            MAGIC,
            u64::from(LAYOUT_VERSION) | u64::from(self.record_bytes) << 32,
            self.capacity,
            u64::from(self.cell_bytes) | u64::from(self.max_workers) << 32,
            self.cells_offset,
            self.workers_offset,
            self.total_bytes,
            u64::from(self.capacity_log2),
        ]
    }

    /// Checks that `words` (the header's first 64 bytes, read from the queue's memory) describe this geometry.
    ///
    /// # Errors
    /// [`QueueError::Layout`] naming the first field that differs.
    pub fn check_header(&self, words: &[u64; 8]) -> Result<(), QueueError> {
        let expected = self.header_words();
        const NAMES: [&str; 8] = [
            "magic",
            "version and record size",
            "capacity",
            "cell size and worker slots",
            "cells offset",
            "worker table offset",
            "total size",
            "log2 capacity",
        ];
        for ((name, found), want) in NAMES.iter().zip(words).zip(expected) {
            if *found != want {
                return Err(QueueError::Layout(format!(
                    "header {name} is {found:#x}, the offer said {want:#x}: the memory is not this queue's"
                )));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::queue::ops::Status;

    #[test]
    fn state_words_round_trip_and_laps_wrap() {
        for (lap, state, holder) in
            [(0, CellState::Empty, 0), (LAP_MASK, CellState::Leased, 4095), (12345, CellState::Sealed, 7)]
        {
            let word = CellWord::pack(lap, state, holder);
            assert_eq!(CellWord::unpack(word), CellWord { lap, state: Some(state), holder });
        }
        assert_eq!(CellWord::unpack(0), CellWord { lap: 0, state: Some(CellState::Empty), holder: 0 });
        assert_eq!(CellWord::unpack(9 << 16).state, None);
        // The lap after the last one is 0 again, one lap on.
        assert_eq!(CellWord::unpack(CellWord::pack(LAP_MASK + 1, CellState::Empty, 0)).lap, 0);
        assert_eq!(lap_delta(0, LAP_MASK), 1);
        assert_eq!(lap_delta(LAP_MASK, 0), -1);
        assert_eq!(lap_delta(5, 5), 0);
        assert_eq!(lap_delta(3, 5), -2);
    }

    #[test]
    fn geometry_aligns_records_and_cells_and_refuses_what_does_not_fit() {
        let g = Geometry::new(1024, 16, 64).unwrap();
        assert_eq!((g.cell_bytes, g.capacity_log2, g.workers_offset), (48, 10, 512));
        assert_eq!(g.cells_offset, (512 + 64 * 64_u64).next_multiple_of(256));
        assert_eq!(g.total_bytes, g.cells_offset + 1024 * 48);
        assert_eq!(g.cell(1024 + 3), g.cells_offset + 3 * 48);
        assert_eq!((g.lap(1023), g.lap(1024), g.lap(5000)), (0, 1, 4));
        assert_eq!(Geometry::new(4, 1, 2).unwrap().cell_bytes, 48);
        assert_eq!(Geometry::new(4, 17, 2).unwrap().cell_bytes, 64);
        for (capacity, record, workers) in
            [(3, 16, 4), (1, 16, 4), (MAX_CAPACITY * 2, 16, 4), (4, 0, 4), (4, 4097, 4), (4, 16, 1), (4, 16, 4097)]
        {
            let error = Geometry::new(capacity, record, workers).unwrap_err();
            assert!(matches!(error, QueueError::Config(_)), "{error}");
        }
    }

    #[test]
    fn the_header_check_names_the_field_that_differs() {
        let g = Geometry::new(64, 32, 8).unwrap();
        let mut words = g.header_words();
        assert!(g.check_header(&words).is_ok());
        words[2] = 128;
        let error = g.check_header(&words).unwrap_err().to_string();
        assert!(error.contains("capacity is 0x80"), "{error}");
    }

    /// The holders of a task on its way back to the owner are those of `kernels/cuda/queue_host_ops.cu`.
    #[test]
    fn the_holders_on_the_way_back_match_the_queue_kernels() {
        let cu = include_str!("../../../kernels/cuda/queue_host_ops.cu");
        for (name, value) in [("GPU_IPC_WQ_GIVEN_BACK", GIVEN_BACK), ("GPU_IPC_WQ_TAKEN", TAKEN)] {
            let line = cu.lines().find(|l| l.starts_with(&format!("#define {name} "))).unwrap();
            let hex = line.split_whitespace().nth(2).unwrap().trim_start_matches("0x").trim_end_matches('u');
            assert_eq!(u16::from_str_radix(hex, 16).unwrap(), value, "{name}");
        }
    }

    /// The offsets and constants of `kernels/cuda/work_queue.cuh` are these.
    #[test]
    fn the_header_offsets_match_the_cuda_header() {
        let cuh = include_str!("../../../kernels/cuda/work_queue.cuh");
        let define = |name: &str| -> u64 {
            let line = cuh
                .lines()
                .find(|line| line.split_whitespace().nth(1) == Some(name) && line.starts_with("#define"))
                .unwrap_or_else(|| panic!("{name} is not defined in work_queue.cuh"));
            let value = line.split_whitespace().nth(2).unwrap().trim_end_matches("ull").trim_end_matches('u');
            match value.strip_prefix("0x") {
                Some(hex) => u64::from_str_radix(hex, 16).unwrap(),
                None => value.parse().unwrap(),
            }
        };
        for (name, value) in [
            ("GPU_IPC_WQ_MAGIC", MAGIC),
            ("GPU_IPC_WQ_OFF_RECORD_BYTES", header::RECORD_BYTES),
            ("GPU_IPC_WQ_OFF_CAPACITY", header::CAPACITY),
            ("GPU_IPC_WQ_OFF_CELL_BYTES", header::CELL_BYTES),
            ("GPU_IPC_WQ_OFF_CELLS", header::CELLS),
            ("GPU_IPC_WQ_OFF_WORKERS", header::WORKERS),
            ("GPU_IPC_WQ_OFF_CAPACITY_LOG2", header::CAPACITY_LOG2),
            ("GPU_IPC_WQ_OFF_ABANDONED", header::ABANDONED),
            ("GPU_IPC_WQ_OFF_RECLAIMING", header::RECLAIMING),
            ("GPU_IPC_WQ_OFF_ENQUEUE", header::ENQUEUE),
            ("GPU_IPC_WQ_OFF_DEQUEUE", header::DEQUEUE),
            ("GPU_IPC_WQ_WORKER_ENTRY_BYTES", WORKER_ENTRY_BYTES),
            ("GPU_IPC_WQ_W_PUSHED", worker::PUSHED),
            ("GPU_IPC_WQ_W_POPPED", worker::POPPED),
            ("GPU_IPC_WQ_W_COMPLETED", worker::COMPLETED),
            ("GPU_IPC_WQ_CELL_ID", cell::ID),
            ("GPU_IPC_WQ_CELL_ATTEMPT", cell::ATTEMPT),
            ("GPU_IPC_WQ_CELL_LEN", cell::LEN),
            ("GPU_IPC_WQ_CELL_RECORD", cell::RECORD),
            ("GPU_IPC_WQ_CLOSED_BIT", CLOSED),
            ("GPU_IPC_WQ_LAP_MASK", LAP_MASK),
            ("GPU_IPC_WQ_STATE_EMPTY", CellState::Empty as u64),
            ("GPU_IPC_WQ_STATE_WRITING", CellState::Writing as u64),
            ("GPU_IPC_WQ_STATE_FULL", CellState::Full as u64),
            ("GPU_IPC_WQ_STATE_LEASED", CellState::Leased as u64),
            ("GPU_IPC_WQ_STATE_SEALED", CellState::Sealed as u64),
            ("GPU_IPC_WQ_OK", Status::Ok as u64),
            ("GPU_IPC_WQ_EMPTY", Status::Empty as u64),
            ("GPU_IPC_WQ_FULL", Status::Full as u64),
            ("GPU_IPC_WQ_CLOSED", Status::Closed as u64),
            ("GPU_IPC_WQ_CONTENDED", Status::Contended as u64),
            ("GPU_IPC_WQ_LEASE_LOST", Status::LeaseLost as u64),
        ] {
            assert_eq!(define(name), value, "{name}");
        }
    }
}
