//! The directory of named buffers in shared memory: the owner's writer, and the seqlock reader that importers
//! (and the owner's own tests) use. Layout: [`super::layout`].
//!
//! Memory ordering: the owner, the only writer, makes an entry's `seq` odd, fences (release), stores the fields,
//! then stores the next even `seq` with release. A reader loads `seq`, fences (acquire), copies the fields, fences
//! (acquire), and loads `seq` again: equal and even means the copy is one the owner wrote whole. All loads are
//! relaxed 64-bit loads, the only atomic access Rust defines on the importers' read-only mapping.

use std::sync::atomic::{AtomicU64, Ordering, fence};
use std::time::{Duration, Instant};

use super::layout::{
    BlockId, BlockKind, ENTRY_WORDS, EntryState, FLAG_STRIDES, Geometry, HEADER_WORDS, LAYOUT_VERSION, MAGIC,
    MAX_NAME_BYTES, OwnerState, block, entry, header, name_hash,
};
use ipc_core::shm::{ReadOnlyMemory, SharedMemory, ShmError};
use ipc_core::wire::{DType, MAX_TENSOR_DIMS as MAX_DIMS, TensorDesc};

/// How long a reader keeps trying to copy an entry the owner keeps writing (it writes one in well under a
/// microsecond) before it calls the entry locked: an owner that died in the middle of a write.
const LOCKED_AFTER: Duration = Duration::from_secs(1);

/// Words of the directory, however they are mapped: loaded relaxed.
pub(crate) trait Words {
    /// Word `index`, or `None` past the end.
    fn word(&self, index: usize) -> Option<u64>;
}

impl Words for [AtomicU64] {
    fn word(&self, index: usize) -> Option<u64> {
        self.get(index).map(|w| w.load(Ordering::Relaxed))
    }
}

impl Words for ReadOnlyMemory {
    fn word(&self, index: usize) -> Option<u64> {
        self.load(index)
    }
}

/// Why the directory could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum DirectoryProblem {
    /// An entry stayed half-written (the owner died while writing it).
    #[error("entry {slot} stayed locked for writing (the owner died while writing it?)")]
    Locked {
        /// The slot.
        slot: u32,
    },
    /// The directory holds something no owner of this layout writes.
    #[error("{0}")]
    Corrupt(String),
}

/// One entry, decoded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct EntryRecord {
    pub(crate) state: EntryState,
    pub(crate) generation: u64,
    pub(crate) block: BlockId,
    pub(crate) offset: u64,
    pub(crate) len: u64,
    pub(crate) name: String,
    pub(crate) desc: Option<TensorDesc>,
}

/// The words of one entry, copied out under its sequence lock.
struct RawEntry([u64; ENTRY_WORDS]);

impl RawEntry {
    fn get(&self, word: usize) -> u64 {
        self.0.get(word).copied().unwrap_or(0)
    }

    fn state(&self) -> Option<EntryState> {
        EntryState::from_code(self.get(entry::STATE))
    }

    fn name_bytes(&self) -> Option<Vec<u8>> {
        let len = usize::try_from(self.get(entry::NAME_LEN)).ok().filter(|l| *l <= MAX_NAME_BYTES)?;
        let words = self.0.get(entry::NAME..entry::NAME + MAX_NAME_BYTES / 8)?;
        let bytes: Vec<u8> = words.iter().flat_map(|w| w.to_le_bytes()).take(len).collect();
        Some(bytes)
    }

    fn has_name(&self, name: &[u8], hash: u64) -> bool {
        self.get(entry::NAME_HASH) == hash && self.name_bytes().as_deref() == Some(name)
    }

    fn decode(&self, slot: u32) -> Result<EntryRecord, DirectoryProblem> {
        let corrupt = |what: String| DirectoryProblem::Corrupt(format!("entry {slot}: {what}"));
        let state = self.state().ok_or_else(|| corrupt(format!("unknown state {}", self.get(entry::STATE))))?;
        let name = self
            .name_bytes()
            .and_then(|bytes| String::from_utf8(bytes).ok())
            .ok_or_else(|| corrupt("a name that is too long or not UTF-8".into()))?;
        let desc = match self.get(entry::DTYPE) {
            0 => None,
            code => {
                let dtype = u16::try_from(code)
                    .ok()
                    .and_then(|c| DType::from_code(c, "entry.dtype").ok())
                    .ok_or_else(|| corrupt(format!("unknown element type {code}")))?;
                let ndim = usize::try_from(self.get(entry::NDIM)).ok().filter(|n| *n <= MAX_DIMS);
                let ndim = ndim.ok_or_else(|| corrupt(format!("{} dimensions", self.get(entry::NDIM))))?;
                let shape = self.0.get(entry::SHAPE..entry::SHAPE + ndim).unwrap_or_default().to_vec();
                let strides = (self.get(entry::FLAGS) & FLAG_STRIDES != 0)
                    .then(|| self.0.get(entry::STRIDES..entry::STRIDES + ndim).unwrap_or_default().to_vec());
                Some(TensorDesc::new(dtype, shape, strides).map_err(|e| corrupt(e.to_string()))?)
            }
        };
        // The owner never writes a tensor larger than its buffer (`book.rs`); an importer hands the tensor out as a
        // view of the buffer's memory (DLPack), so one that is larger would reach past it.
        let len = self.get(entry::LEN);
        if let Some(desc) = desc.as_ref().filter(|d| d.span_bytes() > len) {
            return Err(corrupt(format!("a tensor of {} bytes in a buffer of {len} bytes", desc.span_bytes())));
        }
        Ok(EntryRecord {
            state,
            generation: self.get(entry::GENERATION),
            block: BlockId::from_word(self.get(entry::BLOCK)),
            offset: self.get(entry::OFFSET),
            len,
            name,
            desc,
        })
    }
}

/// Copies entry `slot` under its sequence lock: the `seq` it was read at (even) and its words.
fn read_raw<W: Words + ?Sized>(words: &W, geometry: Geometry, slot: u32) -> Result<(u64, RawEntry), DirectoryProblem> {
    let first = geometry.entry_word(slot);
    let out_of_range = || DirectoryProblem::Corrupt(format!("entry {slot} lies outside the directory"));
    let mut since: Option<Instant> = None;
    for spin in 0u32.. {
        let before = words.word(first + entry::SEQ).ok_or_else(out_of_range)?;
        fence(Ordering::Acquire);
        if before % 2 == 0 {
            let mut raw = [0u64; ENTRY_WORDS];
            for (i, value) in raw.iter_mut().enumerate() {
                *value = words.word(first + i).ok_or_else(out_of_range)?;
            }
            fence(Ordering::Acquire);
            if words.word(first + entry::SEQ) == Some(before) {
                return Ok((before, RawEntry(raw)));
            }
        }
        if spin % 64 == 63 {
            let started = *since.get_or_insert_with(Instant::now);
            if started.elapsed() > LOCKED_AFTER {
                break;
            }
            std::thread::yield_now();
        } else {
            std::hint::spin_loop();
        }
    }
    Err(DirectoryProblem::Locked { slot })
}

/// The `seq` word of entry `slot` now (relaxed: the caller fences).
pub(crate) fn entry_seq<W: Words + ?Sized>(words: &W, geometry: Geometry, slot: u32) -> Option<u64> {
    words.word(geometry.entry_word(slot) + entry::SEQ)
}

/// The live entry named `name`: its slot, the `seq` it was read at, and what it says. `None` when no live entry
/// has that name. A probe visits at most every slot once.
pub(crate) fn find<W: Words + ?Sized>(
    words: &W,
    geometry: Geometry,
    name: &str,
) -> Result<Option<(u32, u64, EntryRecord)>, DirectoryProblem> {
    let hash = name_hash(name.as_bytes());
    let mut slot = geometry.home_slot(hash);
    for _ in 0..geometry.entry_slots {
        let (seq, raw) = read_raw(words, geometry, slot)?;
        match raw.state() {
            Some(EntryState::Empty) => return Ok(None),
            Some(EntryState::Live) if raw.has_name(name.as_bytes(), hash) => {
                return Ok(Some((slot, seq, raw.decode(slot)?)));
            }
            _ => {}
        }
        slot = geometry.next_slot(slot);
    }
    Ok(None)
}

/// Every live entry, by slot.
pub(crate) fn live_entries<W: Words + ?Sized>(
    words: &W,
    geometry: Geometry,
) -> Result<Vec<(u32, EntryRecord)>, DirectoryProblem> {
    let mut live = Vec::new();
    for slot in 0..geometry.entry_slots {
        let (_, raw) = read_raw(words, geometry, slot)?;
        if raw.state() == Some(EntryState::Live) {
            live.push((slot, raw.decode(slot)?));
        }
    }
    Ok(live)
}

/// Block record `index`: its kind, serial and bytes (a relaxed snapshot: the state word is read with acquire
/// after `BYTES` was written, so a reader that sees a serial sees that use's size).
pub(crate) fn block_record<W: Words + ?Sized>(
    words: &W,
    geometry: Geometry,
    index: u32,
) -> Option<(BlockKind, u32, u64)> {
    let first = geometry.block_word(index);
    let state = words.word(first + block::STATE)?;
    fence(Ordering::Acquire);
    let bytes = words.word(first + block::BYTES)?;
    Some((BlockKind::from_code(state & 0xff)?, (state >> 8) as u32, bytes))
}

/// Checks a directory's header against what the offer said; the error says what differs.
pub(crate) fn check_header<W: Words + ?Sized>(words: &W, geometry: Geometry, pool_id: u64) -> Result<(), String> {
    let word = |i| words.word(i).unwrap_or(u64::MAX);
    let magic = word(header::MAGIC);
    fence(Ordering::Acquire);
    let expected = [
        ("magic", magic, MAGIC),
        ("layout version", word(header::LAYOUT_VERSION), LAYOUT_VERSION),
        ("size", word(header::TOTAL_BYTES), geometry.directory_bytes() as u64),
        ("entry slots", word(header::ENTRY_SLOTS), u64::from(geometry.entry_slots)),
        ("block records", word(header::BLOCK_SLOTS), u64::from(geometry.block_slots)),
        ("pool id", word(header::POOL_ID), pool_id),
    ];
    for (what, found, wanted) in expected {
        if found != wanted {
            return Err(format!("the directory's {what} is {found:#x}, the offer says {wanted:#x}"));
        }
    }
    Ok(())
}

/// The header's note word (0 until the owner sets one).
pub(crate) fn note<W: Words + ?Sized>(words: &W) -> u64 {
    words.word(header::NOTE).unwrap_or(0)
}

/// The owner's state as the header says it.
pub(crate) fn owner_state<W: Words + ?Sized>(words: &W) -> Option<OwnerState> {
    OwnerState::from_code(words.word(header::OWNER_STATE)?)
}

/// The owner's side: the directory memfd, mapped read-write before it was sealed against new writable mappings.
#[derive(Debug)]
pub(crate) struct DirectoryWriter {
    memory: SharedMemory,
    geometry: Geometry,
}

impl DirectoryWriter {
    /// A fresh directory: header written (magic last), every entry empty, sealed so that importers can only map it
    /// read-only (where the kernel has `F_SEAL_FUTURE_WRITE`: Linux 5.1).
    pub(crate) fn create(geometry: Geometry, pool_id: u64) -> Result<Self, ShmError> {
        let memory = SharedMemory::create("gpu-ipc-pool-directory", geometry.directory_bytes())?;
        let writer = Self { memory, geometry };
        let words = writer.words();
        let set = |i: usize, v: u64| {
            if let Some(w) = words.get(i) {
                w.store(v, Ordering::Relaxed);
            }
        };
        set(header::LAYOUT_VERSION, LAYOUT_VERSION);
        set(header::TOTAL_BYTES, geometry.directory_bytes() as u64);
        set(header::ENTRY_SLOTS, u64::from(geometry.entry_slots));
        set(header::BLOCK_SLOTS, u64::from(geometry.block_slots));
        set(header::POOL_ID, pool_id);
        set(header::OWNER_PID, u64::from(std::process::id()));
        set(header::OWNER_STATE, OwnerState::Running.code());
        if let Some(magic) = words.get(header::MAGIC) {
            magic.store(MAGIC, Ordering::Release);
        }
        if let Err(error) = writer.memory.seal_future_writes() {
            tracing::warn!(%error, "the pool directory cannot be sealed read-only for importers (Linux < 5.1?)");
        }
        Ok(writer)
    }

    /// The whole directory as atomics.
    pub(crate) fn words(&self) -> &[AtomicU64] {
        // The mapping is a whole number of words (64 KiB multiple), so this cannot fail.
        self.memory.words(0, self.memory.len() / 8).unwrap_or_default()
    }

    /// The memfd, for offers.
    pub(crate) fn memory(&self) -> &SharedMemory {
        &self.memory
    }

    /// The directory's sizes.
    pub(crate) fn geometry(&self) -> Geometry {
        self.geometry
    }

    /// Runs `write` on entry `slot`'s words under its sequence lock (the owner is the only writer).
    fn locked(&self, slot: u32, write: impl FnOnce(&dyn Fn(usize, u64))) {
        let words = self.words();
        let first = self.geometry.entry_word(slot);
        let Some(seq) = words.get(first + entry::SEQ) else { return };
        // Even between writes; odd while this one runs.
        let odd = seq.load(Ordering::Relaxed) | 1;
        seq.store(odd, Ordering::Relaxed);
        fence(Ordering::Release);
        write(&|word, value| {
            if let Some(w) = words.get(first + word) {
                w.store(value, Ordering::Relaxed);
            }
        });
        seq.store(odd.wrapping_add(1), Ordering::Release);
        if let Some(changes) = words.get(header::CHANGES) {
            changes.fetch_add(1, Ordering::Release);
        }
    }

    /// Writes a whole entry.
    pub(crate) fn write_entry(&self, slot: u32, record: &EntryRecord) {
        let name = record.name.as_bytes();
        self.locked(slot, |set| {
            set(entry::STATE, record.state.code());
            set(entry::GENERATION, record.generation);
            set(entry::BLOCK, record.block.to_word());
            set(entry::OFFSET, record.offset);
            set(entry::LEN, record.len);
            set(entry::NAME_HASH, name_hash(name));
            set(entry::NAME_LEN, name.len() as u64);
            let mut padded = [0u8; MAX_NAME_BYTES];
            let n = name.len().min(MAX_NAME_BYTES);
            padded[..n].copy_from_slice(&name[..n]);
            for (i, chunk) in padded.chunks_exact(8).enumerate() {
                let mut word = [0u8; 8];
                word.copy_from_slice(chunk);
                set(entry::NAME + i, u64::from_le_bytes(word));
            }
            let (dtype, shape, strides) = match &record.desc {
                Some(desc) => (u64::from(desc.dtype().code()), desc.shape(), desc.strides()),
                None => (0, &[][..], None),
            };
            set(entry::DTYPE, dtype);
            set(entry::NDIM, shape.len() as u64);
            set(entry::FLAGS, if strides.is_some() { FLAG_STRIDES } else { 0 });
            for i in 0..MAX_DIMS {
                set(entry::SHAPE + i, shape.get(i).copied().unwrap_or(0));
                set(entry::STRIDES + i, strides.and_then(|s| s.get(i)).copied().unwrap_or(0));
            }
        });
    }

    /// Changes only an entry's state.
    pub(crate) fn set_entry_state(&self, slot: u32, state: EntryState) {
        self.locked(slot, |set| set(entry::STATE, state.code()));
    }

    /// Publishes block record `index`.
    pub(crate) fn set_block(&self, index: u32, serial: u32, kind: BlockKind, bytes: u64) {
        let words = self.words();
        let first = self.geometry.block_word(index);
        if let (Some(state), Some(size)) = (words.get(first + block::STATE), words.get(first + block::BYTES)) {
            size.store(bytes, Ordering::Relaxed);
            state.store(u64::from(serial) << 8 | kind.code(), Ordering::Release);
        }
        if let Some(changes) = words.get(header::CHANGES) {
            changes.fetch_add(1, Ordering::Release);
        }
    }

    /// Publishes the header's note word (release ordering).
    pub(crate) fn set_note(&self, value: u64) {
        if let Some(word) = self.words().get(header::NOTE) {
            word.store(value, Ordering::Release);
        }
    }

    /// Records the owner's state.
    pub(crate) fn set_owner_state(&self, state: OwnerState) {
        if let Some(word) = self.words().get(header::OWNER_STATE) {
            word.store(state.code(), Ordering::Release);
        }
    }
}

// The header is one 128-byte line.
const _: () = assert!(HEADER_WORDS * 8 == 128);

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::AtomicBool;
    use std::time::{Duration, Instant};

    use super::*;

    fn record(generation: u64) -> EntryRecord {
        EntryRecord {
            state: EntryState::Live,
            generation,
            block: BlockId { index: (generation % 3) as u32, serial: generation as u32 },
            offset: generation * 3,
            // At least the tensor's span (12 * generation - 10 bytes), as the owner writes it.
            len: generation * 12,
            name: format!("name-{generation}-{}", "x".repeat((generation % 90) as usize)),
            desc: generation
                .is_multiple_of(2)
                .then(|| TensorDesc::strided(DType::F16, vec![generation; 3], [1, 2, 3]).unwrap()),
        }
    }

    #[test]
    fn an_entry_reads_back_as_written_through_a_read_only_mapping() {
        let geometry = Geometry { entry_slots: 16, block_slots: 4 };
        let writer = DirectoryWriter::create(geometry, 77).unwrap();
        let reader =
            ReadOnlyMemory::from_fd(writer.memory().try_clone_fd().unwrap(), geometry.directory_bytes()).unwrap();
        check_header(&reader, geometry, 77).unwrap();
        assert!(check_header(&reader, geometry, 78).unwrap_err().contains("pool id"));
        let name = "weights/layer0";
        let slot = geometry.home_slot(name_hash(name.as_bytes()));
        let mut written = record(42);
        written.name = name.into();
        writer.write_entry(slot, &written);
        let (found_slot, seq, found) = find(&reader, geometry, name).unwrap().unwrap();
        assert_eq!((found_slot, seq % 2, &found), (slot, 0, &written));
        assert_eq!(find(&reader, geometry, "weights/layer1").unwrap(), None);
        writer.set_entry_state(slot, EntryState::Retired);
        assert_eq!(find(&reader, geometry, name).unwrap(), None, "a retired entry is not found by name");
        assert!(entry_seq(&reader, geometry, slot).unwrap() > seq, "every write moves seq");
        writer.set_block(2, 9, BlockKind::Existing, 4096);
        assert_eq!(block_record(&reader, geometry, 2), Some((BlockKind::Existing, 9, 4096)));
        assert_eq!(owner_state(&reader), Some(OwnerState::Running));
        writer.set_owner_state(OwnerState::Closed);
        assert_eq!(owner_state(&reader), Some(OwnerState::Closed));
    }

    #[test]
    fn a_reader_never_sees_a_torn_entry_while_the_owner_rewrites_it() {
        let geometry = Geometry { entry_slots: 4, block_slots: 1 };
        let writer = Arc::new(DirectoryWriter::create(geometry, 1).unwrap());
        let stop = Arc::new(AtomicBool::new(false));
        let rewriter = {
            let (writer, stop) = (writer.clone(), stop.clone());
            std::thread::spawn(move || {
                let mut generation = 1;
                while !stop.load(Ordering::Relaxed) {
                    writer.write_entry(0, &record(generation));
                    generation += 1;
                }
                generation
            })
        };
        let reader =
            ReadOnlyMemory::from_fd(writer.memory().try_clone_fd().unwrap(), geometry.directory_bytes()).unwrap();
        // At least 300 ms and 100 reads (a loaded 2-core machine gave 62 reads in 300 ms of a writer that never
        // pauses: a reader may retry many times), at most 10 s.
        let (mut reads, start) = (0u64, Instant::now());
        while (start.elapsed() < Duration::from_millis(300) || reads <= 100)
            && start.elapsed() < Duration::from_secs(10)
        {
            let (_, raw) = read_raw(&reader, geometry, 0).unwrap();
            if raw.state() == Some(EntryState::Empty) {
                continue;
            }
            let decoded = raw.decode(0).unwrap();
            assert_eq!(decoded, record(decoded.generation), "a torn entry");
            reads += 1;
        }
        stop.store(true, Ordering::Relaxed);
        let written = rewriter.join().unwrap();
        assert!(reads > 100 && written > 100, "{reads} reads of {written} writes");
    }

    #[test]
    fn a_corrupt_entry_is_an_error_never_a_panic() {
        let geometry = Geometry { entry_slots: 4, block_slots: 1 };
        let writer = DirectoryWriter::create(geometry, 1).unwrap();
        let words = writer.words();
        let first = geometry.entry_word(1);
        words[first + entry::STATE].store(1, Ordering::Relaxed);
        words[first + entry::NAME_LEN].store(4096, Ordering::Relaxed);
        assert!(matches!(live_entries(words, geometry), Err(DirectoryProblem::Corrupt(_))));
        words[first + entry::NAME_LEN].store(0, Ordering::Relaxed);
        words[first + entry::DTYPE].store(99, Ordering::Relaxed);
        assert!(matches!(live_entries(words, geometry), Err(DirectoryProblem::Corrupt(_))));
        words[first + entry::DTYPE].store(0, Ordering::Relaxed);
        assert_eq!(live_entries(words, geometry).unwrap().len(), 1);
        // Found by fuzzing (`fuzz/`, pool_directory): a tensor larger than its buffer was accepted, and the
        // importer's DLPack view would have reached past the buffer.
        words[first + entry::LEN].store(48, Ordering::Relaxed);
        words[first + entry::DTYPE].store(u64::from(DType::F32.code()), Ordering::Relaxed);
        words[first + entry::NDIM].store(2, Ordering::Relaxed);
        words[first + entry::SHAPE].store(4, Ordering::Relaxed);
        words[first + entry::SHAPE + 1].store(4, Ordering::Relaxed);
        let error = live_entries(words, geometry).unwrap_err();
        assert!(matches!(&error, DirectoryProblem::Corrupt(e) if e.contains("64 bytes in a buffer of 48")), "{error}");
        words[first + entry::SHAPE + 1].store(3, Ordering::Relaxed);
        assert_eq!(live_entries(words, geometry).unwrap()[0].1.desc.as_ref().unwrap().span_bytes(), 48);
        words[first + entry::DTYPE].store(0, Ordering::Relaxed);
        // An owner that died in the middle of a write leaves seq odd: the reader gives up, boundedly.
        words[first + entry::SEQ].store(7, Ordering::Relaxed);
        assert_eq!(live_entries(words, geometry).unwrap_err(), DirectoryProblem::Locked { slot: 1 });
    }
}
