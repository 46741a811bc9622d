//! Byte layout of the pool's directory and of an importer's pin table (version [`LAYOUT_VERSION`]), in 64-bit
//! little-endian words, as `docs/pool.md` specifies them for clients in any language.
//!
//! The **directory** is a memfd the owner writes and every importer maps read-only (it is sealed with
//! `F_SEAL_FUTURE_WRITE`): a header, a table of blocks, then an open-addressing hash table of named entries. Each
//! entry is written under a sequence lock (its `seq` word is odd while the owner writes it), so a reader copies the
//! words, checks that `seq` did not move, and never acts on a torn entry. The **pin table** is a memfd per
//! importer, which only that importer and the owner map (read-write): one counter per entry slot, the number of
//! views the importer holds of the buffer in that slot. The owner reuses a freed buffer's bytes only when every
//! live importer's counter for its slot is zero.

use std::fmt;

/// First header word: "GIPCPOOL" in little-endian bytes.
pub const MAGIC: u64 = u64::from_le_bytes(*b"GIPCPOOL");
/// First word of a pin table: "GIPCPINS".
pub const PINS_MAGIC: u64 = u64::from_le_bytes(*b"GIPCPINS");
/// Version of these layouts (and of the offer body and the block channel); bumped on any change. 2: a grant may
/// map several allocations side by side (`BlockPieces`).
pub const LAYOUT_VERSION: u64 = 2;

/// Longest buffer name, in UTF-8 bytes.
pub const MAX_NAME_BYTES: usize = 128;
/// Most entry slots a directory has (a power of two).
pub const MAX_ENTRY_SLOTS: u32 = 1 << 16;
/// Most blocks (the pool's own and shared existing allocations) a directory lists.
pub const MAX_BLOCKS: u32 = 4096;

/// Words of the header.
pub const HEADER_WORDS: usize = 16;
/// Words of one block record.
pub const BLOCK_WORDS: usize = 4;
/// Words of one entry (384 bytes: three 128-byte lines).
pub const ENTRY_WORDS: usize = 48;
/// Words of a pin table's header.
pub const PINS_HEADER_WORDS: usize = 4;

/// Word indices in the header.
pub mod header {
    /// [`MAGIC`](super::MAGIC), written last at creation.
    pub const MAGIC: usize = 0;
    /// [`LAYOUT_VERSION`](super::LAYOUT_VERSION).
    pub const LAYOUT_VERSION: usize = 1;
    /// Size of the directory memfd in bytes.
    pub const TOTAL_BYTES: usize = 2;
    /// Entry slots (a power of two).
    pub const ENTRY_SLOTS: usize = 3;
    /// Block records.
    pub const BLOCK_SLOTS: usize = 4;
    /// The pool instance's id (also in the offer).
    pub const POOL_ID: usize = 5;
    /// The owner's pid, as it sees itself.
    pub const OWNER_PID: usize = 6;
    /// An [`OwnerState`](super::OwnerState) code.
    pub const OWNER_STATE: usize = 7;
    /// Bumped (release) after every change of an entry or a block: a reader that sees the same value twice saw
    /// the same directory.
    pub const CHANGES: usize = 8;
    /// A value the pool's user publishes for every importer to read without a round trip (the weights' newest
    /// generation), 0 until set; stored with release ordering, never decreases.
    pub const NOTE: usize = 9;
}

/// Word indices in a block record.
pub mod block {
    /// `serial << 8 | kind`: kind 0 none, 1 the pool's own block, 2 an existing allocation shared in place; the
    /// serial changes whenever the record is reused. Written (release) after `BYTES`.
    pub const STATE: usize = 0;
    /// Bytes an importer maps for the block.
    pub const BYTES: usize = 1;
}

/// Word indices in an entry.
pub mod entry {
    /// Sequence lock: odd while the owner writes the entry.
    pub const SEQ: usize = 0;
    /// An [`EntryState`](super::EntryState) code.
    pub const STATE: usize = 1;
    /// The buffer's generation: unique in the pool's life, never 0.
    pub const GENERATION: usize = 2;
    /// `block index | block serial << 32`.
    pub const BLOCK: usize = 3;
    /// Start of the buffer in its block.
    pub const OFFSET: usize = 4;
    /// Length of the buffer in bytes.
    pub const LEN: usize = 5;
    /// [`name_hash`](super::name_hash) of the name.
    pub const NAME_HASH: usize = 6;
    /// Bytes of the name.
    pub const NAME_LEN: usize = 7;
    /// [`DType`](ipc_core::wire::DType) code; 0 = no tensor description.
    pub const DTYPE: usize = 8;
    /// Dimensions of the tensor description.
    pub const NDIM: usize = 9;
    /// Bit 0: `STRIDES` holds explicit strides (else the layout is contiguous).
    pub const FLAGS: usize = 10;
    /// Shape, eight words.
    pub const SHAPE: usize = 11;
    /// Strides in elements, eight words.
    pub const STRIDES: usize = 19;
    /// The name, UTF-8, zero padded, sixteen words.
    pub const NAME: usize = 27;
}

/// Flag in `entry::FLAGS`: explicit strides.
pub const FLAG_STRIDES: u64 = 1;

/// What an entry slot holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EntryState {
    /// Never used: a name lookup that reaches it stops (the name is not in the table).
    Empty,
    /// A live buffer, found by name.
    Live,
    /// A freed buffer whose bytes are not reused yet (importers still pin it); not found by name.
    Retired,
    /// Free for reuse; a name lookup goes past it.
    Vacant,
}

impl EntryState {
    /// Code in `entry::STATE`.
    pub const fn code(self) -> u64 {
        match self {
            Self::Empty => 0,
            Self::Live => 1,
            Self::Retired => 2,
            Self::Vacant => 3,
        }
    }

    /// Decodes a state word; `None` for codes this build does not know.
    pub const fn from_code(code: u64) -> Option<Self> {
        match code {
            0 => Some(Self::Empty),
            1 => Some(Self::Live),
            2 => Some(Self::Retired),
            3 => Some(Self::Vacant),
            _ => None,
        }
    }
}

/// The owner's state, in `header::OWNER_STATE`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OwnerState {
    /// Being set up.
    Starting,
    /// Serving.
    Running,
    /// Closed cleanly: no buffer will be added or freed any more.
    Closed,
}

impl OwnerState {
    /// Code in the header.
    pub const fn code(self) -> u64 {
        match self {
            Self::Starting => 0,
            Self::Running => 1,
            Self::Closed => 2,
        }
    }

    /// Decodes the header word.
    pub const fn from_code(code: u64) -> Option<Self> {
        match code {
            0 => Some(Self::Starting),
            1 => Some(Self::Running),
            2 => Some(Self::Closed),
            _ => None,
        }
    }
}

/// What a block is, in the low byte of `block::STATE`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BlockKind {
    /// The record is unused.
    None,
    /// Memory the pool allocated and sub-allocates.
    Pool,
    /// An existing allocation shared in place (`SharedPool::share_existing`).
    Existing,
}

impl BlockKind {
    /// Code in the low byte of the state word.
    pub const fn code(self) -> u64 {
        match self {
            Self::None => 0,
            Self::Pool => 1,
            Self::Existing => 2,
        }
    }

    /// Decodes the low byte of a state word.
    pub const fn from_code(code: u64) -> Option<Self> {
        match code {
            0 => Some(Self::None),
            1 => Some(Self::Pool),
            2 => Some(Self::Existing),
            _ => None,
        }
    }
}

/// A block's index in the table and its serial (which changes whenever the index is reused).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct BlockId {
    /// Index in the block table.
    pub index: u32,
    /// Serial of the record's current use.
    pub serial: u32,
}

impl BlockId {
    /// The `entry::BLOCK` word.
    pub const fn to_word(self) -> u64 {
        self.index as u64 | (self.serial as u64) << 32
    }

    /// Decodes the `entry::BLOCK` word.
    pub const fn from_word(word: u64) -> Self {
        Self { index: word as u32, serial: (word >> 32) as u32 }
    }
}

impl fmt::Display for BlockId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "block {} (serial {})", self.index, self.serial)
    }
}

/// Sizes of one directory, fixed at creation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Geometry {
    /// Entry slots, a power of two up to [`MAX_ENTRY_SLOTS`].
    pub entry_slots: u32,
    /// Block records, up to [`MAX_BLOCKS`].
    pub block_slots: u32,
}

impl Geometry {
    /// Checks the sizes (what a reader of an offer checks too).
    pub fn check(self) -> Result<Self, String> {
        if !self.entry_slots.is_power_of_two() || self.entry_slots > MAX_ENTRY_SLOTS {
            return Err(format!("{} entry slots: a power of two up to {MAX_ENTRY_SLOTS}", self.entry_slots));
        }
        if self.block_slots == 0 || self.block_slots > MAX_BLOCKS {
            return Err(format!("{} block records: 1 to {MAX_BLOCKS}", self.block_slots));
        }
        Ok(self)
    }

    /// First word of block record `index`.
    pub const fn block_word(self, index: u32) -> usize {
        HEADER_WORDS + index as usize * BLOCK_WORDS
    }

    /// First word of the entry table (on a 128-byte line).
    pub const fn entries_word(self) -> usize {
        (HEADER_WORDS + self.block_slots as usize * BLOCK_WORDS).next_multiple_of(16)
    }

    /// First word of entry `slot`.
    pub const fn entry_word(self, slot: u32) -> usize {
        self.entries_word() + slot as usize * ENTRY_WORDS
    }

    /// Size of the directory memfd: every word, rounded up to 64 KiB (a whole number of pages on every Linux
    /// page size).
    pub const fn directory_bytes(self) -> usize {
        (self.entry_word(self.entry_slots) * 8).next_multiple_of(64 * 1024)
    }

    /// Size of a pin table memfd, rounded up like the directory.
    pub const fn pins_bytes(self) -> usize {
        ((PINS_HEADER_WORDS + self.entry_slots as usize) * 8).next_multiple_of(64 * 1024)
    }

    /// The slot a name's probe starts at.
    pub const fn home_slot(self, hash: u64) -> u32 {
        (hash & (self.entry_slots as u64 - 1)) as u32
    }

    /// The slot after `slot` (the table wraps around).
    pub const fn next_slot(self, slot: u32) -> u32 {
        (slot + 1) & (self.entry_slots - 1)
    }
}

/// 64-bit FNV-1a of the name's bytes: where a name's probe starts (`hash & (entry_slots - 1)`), and a quick
/// mismatch test before comparing names.
pub const fn name_hash(name: &[u8]) -> u64 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    let mut i = 0;
    while i < name.len() {
        hash ^= name[i] as u64;
        hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
        i += 1;
    }
    hash
}

// The layout is an ABI shared with other processes (and other languages): pin it.
const _: () = {
    assert!(entry::NAME + MAX_NAME_BYTES / 8 <= ENTRY_WORDS);
    assert!(entry::STRIDES + ipc_core::wire::MAX_TENSOR_DIMS == entry::NAME);
    assert!(entry::SHAPE + ipc_core::wire::MAX_TENSOR_DIMS == entry::STRIDES);
    let g = Geometry { entry_slots: 4096, block_slots: 64 };
    assert!(g.entries_word() == 272);
    assert!(g.directory_bytes() == 1_638_400);
    assert!(g.pins_bytes() == 65_536);
    assert!(name_hash(b"") == 0xcbf2_9ce4_8422_2325);
    assert!(name_hash(b"a") == 0xaf63_dc4c_8601_ec8c);
};

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use ipc_core::wire::DType;

    const POOL_MD: &str = include_str!("../../../docs/pool.md");

    /// The first cells of the rows of every `| word | field |` table of `docs/pool.md`, table by table.
    fn word_tables() -> Vec<Vec<(String, String)>> {
        let mut tables = Vec::new();
        let mut lines = POOL_MD.lines().peekable();
        while let Some(line) = lines.next() {
            if line.trim() != "| word | field |" {
                continue;
            }
            lines.next(); // the |---| row
            let mut rows = Vec::new();
            while let Some(row) = lines.next_if(|l| l.starts_with('|')) {
                let cells: Vec<&str> = row.split('|').map(str::trim).collect();
                rows.push((cells[1].to_owned(), cells[2].to_owned()));
            }
            tables.push(rows);
        }
        tables
    }

    #[test]
    fn the_word_tables_of_docs_pool_md_are_the_layout() {
        let tables = word_tables();
        assert_eq!(tables.len(), 2, "the header table and the entry table");
        let header_words: Vec<String> = tables[0].iter().map(|(w, _)| w.clone()).collect();
        let expected = [
            header::MAGIC,
            header::LAYOUT_VERSION,
            header::TOTAL_BYTES,
            header::ENTRY_SLOTS,
            header::BLOCK_SLOTS,
            header::POOL_ID,
            header::OWNER_PID,
            header::OWNER_STATE,
            header::CHANGES,
            header::NOTE,
        ];
        assert_eq!(header_words, expected.map(|w| w.to_string()));
        let entry_words: Vec<String> = tables[1].iter().map(|(w, _)| w.clone()).collect();
        let ranges = |first: usize, words: usize| format!("{first} .. {}", first + words - 1);
        let expected = [
            entry::SEQ.to_string(),
            entry::STATE.to_string(),
            entry::GENERATION.to_string(),
            entry::BLOCK.to_string(),
            entry::OFFSET.to_string(),
            entry::LEN.to_string(),
            entry::NAME_HASH.to_string(),
            entry::NAME_LEN.to_string(),
            entry::DTYPE.to_string(),
            entry::NDIM.to_string(),
            entry::FLAGS.to_string(),
            ranges(entry::SHAPE, 8),
            ranges(entry::STRIDES, 8),
            ranges(entry::NAME, MAX_NAME_BYTES / 8),
        ];
        assert_eq!(entry_words, expected);
        // The element type codes, as the entry table lists them.
        let dtypes = &tables[1].iter().find(|(w, _)| *w == entry::DTYPE.to_string()).unwrap().1;
        for d in DType::ALL {
            assert!(dtypes.contains(&format!("{} {}", d.code(), d.name())), "{d} (code {}) in: {dtypes}", d.code());
        }
        let states = &tables[1].iter().find(|(w, _)| *w == entry::STATE.to_string()).unwrap().1;
        for (state, name) in [
            (EntryState::Empty, "empty"),
            (EntryState::Live, "live"),
            (EntryState::Retired, "retired"),
            (EntryState::Vacant, "vacant"),
        ] {
            assert!(states.contains(&format!("{} {name}", state.code())), "{states}");
        }
        assert!(POOL_MD.contains(&format!("{} words ({} bytes) each", ENTRY_WORDS, ENTRY_WORDS * 8)));
        assert!(POOL_MD.contains(&format!("at word {HEADER_WORDS}, {BLOCK_WORDS} words each")));
    }
}
