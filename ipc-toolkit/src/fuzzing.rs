//! Entry points for the coverage-guided fuzz targets in `fuzz/` (cargo feature `fuzzing`, off by default): the
//! readers of shared memory that a hostile peer can write, which are crate-internal, each run on the fuzzer's bytes.
//! Each panics only where the reader broke a rule it promises (no panic, no view outside its buffer, a bounded
//! wait). The decoders with a public API (wire messages, offers, the semaphore block) are fuzzed through it
//! directly (`fuzz/src/lib.rs`). See `docs/fuzzing.md`.

pub use crate::pool::fuzzing::pool_directory;
pub use crate::queue::fuzzing::queue_memory;

use crate::semaphore::layout::{
    MAGIC, MAGIC_WORD, MAX_PEERS, MAX_PEERS_WORD, RECORD_STATE, RESET_FROM_WORD, RESET_TO_WORD, SHARED_BYTES,
    STATE_WORD, TOTAL_BYTES_WORD, VERSION_WORD, record_epoch, record_word_index,
};
use std::sync::atomic::Ordering;

use crate::semaphore::{DeadPoster, PeerRecord, SemaphoreBlock, SemaphoreState};

/// Runs the semaphore block's readers, on a peer's side and on the owner's, on a block whose words a fuzzer
/// chose: byte 0 says whether the header stays valid (bit 0, so the checks after attaching are reached), which
/// record the tickets are taken in (bits 1 to 5) and how many operations run (bits 6 and 7); the rest is written
/// over the block (after the header's fixed words when it stays valid).
///
/// # Panics
/// When a reader breaks its promise: a block with more peers than [`MAX_PEERS`] accepted, a value outside the
/// counts, or any arithmetic on the shared counters that overflows.
pub fn semaphore_block(data: &[u8]) {
    let [mode, rest @ ..] = data else { return };
    let mode = *mode;
    // The dead-poster rule from the input's length: both rules' owner paths are reached.
    let rule = if rest.len() % 2 == 0 { DeadPoster::Poison } else { DeadPoster::Ignore };
    let Ok(owner) = SemaphoreBlock::create(1, 7, rule) else { return };
    let memory = owner.shared().memory();
    let keep_header = mode & 1 != 0;
    let at = if keep_header { 8 * (STATE_WORD) } else { 0 };
    let image = rest.get(..rest.len().min(SHARED_BYTES - at)).unwrap_or_default();
    let _ = memory.write_bytes(at, image);
    if keep_header {
        // The fixed words as the owner wrote them; the state word and everything after come from the input.
        for (word, value) in [
            (MAGIC_WORD, MAGIC),
            (VERSION_WORD, u64::from(crate::semaphore::layout::LAYOUT_VERSION)),
            (TOTAL_BYTES_WORD, SHARED_BYTES as u64),
            (MAX_PEERS_WORD, u64::from(MAX_PEERS)),
        ] {
            let _ = memory.write_bytes(8 * word, &value.to_le_bytes());
        }
        if mode & 0x40 != 0 {
            let _ = memory.write_bytes(8 * STATE_WORD, &(SemaphoreState::Open as u64).to_le_bytes());
        }
    }
    // The peer's side: what `Semaphore::attach` reads.
    let Ok(fd) = memory.try_clone_fd() else { return };
    let Ok(peer) = SemaphoreBlock::attach(fd) else { return };
    assert!((1..=MAX_PEERS).contains(&peer.max_peers()), "{} peers accepted", peer.max_peers());
    let _ = (peer.check(), peer.state(), peer.owner_pid(), peer.generation());
    let value = peer.value();
    assert!(i128::from(value) == i128::from(peer.posted()) - i128::from(peer.taken()) || value == i64::MIN);
    let index = u32::from(mode >> 1 & 0x1f) % peer.max_peers();
    let state = memory.words(record_word_index(index) + RECORD_STATE, 1).ok().and_then(|w| w.first());
    let epoch = state.map_or(0, |w| record_epoch(w.load(Ordering::Relaxed)));
    let record = PeerRecord { index, epoch };
    let mut hint = usize::from(mode);
    for _ in 0..=(mode >> 6) {
        let _ = peer.ticket_released(peer.taken());
        let _ = peer.try_take();
        let _ = peer.post_as(record, 1);
        let _ = peer.has_posted(record);
        if let Ok(ticket) = peer.take_ticket(record, &mut hint) {
            // A fresh ticket is released, pending, or the semaphore ended; or the block's reset range (which a
            // peer could write) says the poison released it: an error, never a panic.
            let reset_range = || {
                let word = |w| memory.words(w, 1).ok().and_then(|w| w.first()).map(|w| w.load(Ordering::Relaxed));
                word(RESET_FROM_WORD).unwrap_or(0)..word(RESET_TO_WORD).unwrap_or(0)
            };
            assert!(peer.ticket_released(ticket).is_ok() || peer.check().is_err() || reset_range().contains(&ticket));
            peer.give_back(record, ticket);
        }
        let _ = peer.peer_summary(record);
    }
    // The owner's side: a peer's connection ends, and the owner reads the record the peer could write.
    for index in 0..=MAX_PEERS {
        let word = memory.words(record_word_index(index.min(MAX_PEERS - 1)) + RECORD_STATE, 1).ok();
        let epoch = word.and_then(|w| w.first()).map_or(0, |w| record_epoch(w.load(Ordering::Relaxed)));
        let _ = owner.peer_summary(PeerRecord { index, epoch });
        let _ = owner.peer_gone(PeerRecord { index, epoch });
    }
    let _ = owner.claim_record(Some(1));
    let _ = owner.reset();
}

/// Inputs for [`semaphore_block`]: the block as the owner creates it, whole (mode 0) and after its fixed header
/// words (mode 1), with a few operations.
pub fn semaphore_block_seeds() -> Vec<Vec<u8>> {
    let Ok(owner) = SemaphoreBlock::create(3, 9, DeadPoster::Poison) else { return Vec::new() };
    let Ok(record) = owner.claim_record(Some(42)) else { return Vec::new() };
    let _ = owner.move_record(
        record,
        crate::semaphore::layout::RecordState::Offered,
        crate::semaphore::layout::RecordState::Attached,
    );
    let mut hint = 0;
    let _ = owner.take_ticket(record, &mut hint);
    let mut image = vec![0u8; SHARED_BYTES];
    let _ = owner.shared().memory().read_bytes(0, &mut image);
    // The owner's pid (in the header and in its record) changes from run to run: the seeds do not.
    for word in [crate::semaphore::layout::OWNER_PID_WORD, record_word_index(0) + crate::semaphore::layout::RECORD_PID]
    {
        image[8 * word..8 * word + 8].fill(0);
    }
    // Trailing zero words add nothing a fuzzer cannot add: keep the seeds small.
    let used = image.iter().rposition(|b| *b != 0).map_or(0, |i| i + 1).next_multiple_of(8);
    let image = &image[..used];
    let after_header = image.get(8 * STATE_WORD..).unwrap_or_default();
    let mode_record = (record.index as u8) << 1;
    vec![
        [&[0u8][..], image].concat(),
        [&[1 | mode_record][..], after_header].concat(),
        [&[1 | mode_record | 0xc0][..], after_header].concat(),
    ]
}

/// Seeds for the targets whose writers are crate-internal, by target name.
pub fn seeds() -> Vec<(&'static str, Vec<Vec<u8>>)> {
    vec![
        ("pool_directory", crate::pool::fuzzing::pool_directory_seeds()),
        ("queue_memory", crate::queue::fuzzing::queue_memory_seeds()),
        ("semaphore_block", semaphore_block_seeds()),
    ]
}
