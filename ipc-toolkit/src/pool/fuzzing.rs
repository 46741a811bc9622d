//! The directory reader on bytes a fuzzer chose (feature `fuzzing`): what an importer reads from the directory
//! memfd, which the owner writes and a hostile or broken owner can fill with anything.

use std::sync::atomic::AtomicU64;

use super::directory::{block_record, check_header, entry_seq, find, live_entries, owner_state};
use super::layout::{ENTRY_WORDS, Geometry, MAX_NAME_BYTES, entry};

/// Runs every directory reader on a directory made of `data`: byte 0 picks the entry slots (1 to 16), byte 1 the
/// block records (1 to 4), byte 2 whether the mapping is cut short; the rest are the words, little-endian.
///
/// # Panics
/// When a reader breaks its promise: a live entry with a name too long, a tensor description that does not fit
/// its buffer, or a lookup that returns another name than the one asked for.
pub fn pool_directory(data: &[u8]) {
    let [slots, blocks, cut, rest @ ..] = data else { return };
    let geometry = Geometry { entry_slots: 1 << (slots % 5), block_slots: 1 + u32::from(blocks % 4) };
    let full = geometry.entry_word(geometry.entry_slots);
    // A mapping shorter than the geometry says (an owner that lied about it): readers must say so, not index past.
    let len = if cut % 8 == 7 { usize::from(cut / 8) * 8 % full } else { full };
    let mut words: Vec<u64> = rest.chunks(8).map(|c| c.iter().rev().fold(0, |w, b| w << 8 | u64::from(*b))).collect();
    words.resize(len, 0);
    // Keep every entry's sequence word even: an odd one is an owner that died mid-write, which the reader waits out
    // for a second before it says so (tested in `directory.rs`); here it would only slow the fuzzer down.
    for slot in 0..geometry.entry_slots {
        if let Some(seq) = words.get_mut(geometry.entry_word(slot) + entry::SEQ) {
            *seq &= !1;
        }
    }
    let words: Vec<AtomicU64> = words.into_iter().map(AtomicU64::new).collect();
    let words = words.as_slice();

    let pool_id = words.first().map_or(0, |w| w.load(std::sync::atomic::Ordering::Relaxed));
    let _ = check_header(words, geometry, pool_id);
    let _ = owner_state(words);
    for index in 0..=geometry.block_slots {
        let _ = block_record(words, geometry, index);
    }
    for slot in 0..=geometry.entry_slots {
        let _ = entry_seq(words, geometry, slot);
    }
    let Ok(live) = live_entries(words, geometry) else { return };
    for (slot, record) in &live {
        assert!(*slot < geometry.entry_slots, "slot {slot} of {}", geometry.entry_slots);
        assert!(record.name.len() <= MAX_NAME_BYTES, "a name of {} bytes", record.name.len());
        if let Some(desc) = &record.desc {
            // What an importer hands out as a tensor (DLPack, `__cuda_array_interface__`) spans `span_bytes` from
            // the buffer's start: it must lie inside the buffer's `len` bytes, which the lookup checks against
            // the block.
            assert!(
                desc.span_bytes() <= record.len,
                "entry {slot}: a tensor of {} bytes accepted in a buffer of {} bytes",
                desc.span_bytes(),
                record.len
            );
        }
        if let Ok(Some((found, seq, by_name))) = find(words, geometry, &record.name) {
            assert_eq!(by_name.name, record.name, "find returned another name");
            assert_eq!(seq % 2, 0, "a record read at an odd sequence");
            assert!(found < geometry.entry_slots);
        }
    }
    // A name from the input, looked up: found only under that name.
    let name = String::from_utf8_lossy(rest.get(..rest.len().min(ENTRY_WORDS)).unwrap_or_default());
    if let Ok(Some((_, _, record))) = find(words, geometry, &name) {
        assert_eq!(record.name, name);
    }
}

/// Inputs for [`pool_directory`] that the owner's writer made: a directory of 4 entry slots and 2 block records
/// with a plain buffer and a tensor in it, one retired entry, and the same directory cut short.
pub fn pool_directory_seeds() -> Vec<Vec<u8>> {
    use super::directory::{DirectoryWriter, EntryRecord};
    use super::layout::{BlockId, BlockKind, EntryState, name_hash};
    use ipc_core::wire::{DType, TensorDesc};

    let geometry = Geometry { entry_slots: 4, block_slots: 2 };
    let Ok(writer) = DirectoryWriter::create(geometry, 0x5eed) else { return Vec::new() };
    writer.set_block(0, 1, BlockKind::Pool, 1 << 20);
    writer.set_block(1, 3, BlockKind::Existing, 4096);
    let entries = [
        ("frames/raw", 0, 0, 4096, None, EntryState::Live),
        ("weights/w0", 1, 0, 2 * 3 * 4 * 2, TensorDesc::contiguous(DType::F16, [2, 3, 4]).ok(), EntryState::Live),
        ("t", 1, 64, 64, TensorDesc::strided(DType::U8, [4, 4], [8, 1]).ok(), EntryState::Live),
        ("old", 0, 8192, 16, None, EntryState::Retired),
    ];
    for (generation, (name, block, offset, len, desc, state)) in entries.into_iter().enumerate() {
        let mut slot = geometry.home_slot(name_hash(name.as_bytes()));
        while super::directory::entry_seq(writer.words(), geometry, slot) != Some(0) {
            slot = geometry.next_slot(slot);
        }
        let serial = if block == 0 { 1 } else { 3 };
        let record = EntryRecord {
            state,
            generation: generation as u64 + 1,
            block: BlockId { index: block, serial },
            offset,
            len,
            name: name.to_owned(),
            desc,
        };
        writer.write_entry(slot, &record);
    }
    let words = writer.words();
    // The owner's pid changes from run to run: the seeds do not.
    if let Some(pid) = words.get(super::layout::header::OWNER_PID) {
        pid.store(0, std::sync::atomic::Ordering::Relaxed);
    }
    let image: Vec<u8> = words
        .iter()
        .take(geometry.entry_word(geometry.entry_slots))
        .flat_map(|w| w.load(std::sync::atomic::Ordering::Relaxed).to_le_bytes())
        .collect();
    // Byte 0 = 2 (4 entry slots), byte 1 = 1 (2 block records), byte 2 = whole or cut to 31 words.
    [0u8, 0xff].iter().map(|cut| [&[2u8, 1, *cut][..], &image].concat()).collect()
}
