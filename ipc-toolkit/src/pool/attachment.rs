//! An importer's attachment ([`ImporterInner`]): what a [`PoolImporter`](super::PoolImporter) holds and shares
//! with its views (the offer, the directory, its pin table, the blocks it mapped, the link to the owner), and the
//! pin counts both change. The importer and its views ([`BufferView`](super::BufferView)) stand on it.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use super::blocks::BlockCache;
use super::directory::{DirectoryProblem, owner_state};
use super::error::PoolError;
use super::layout::{OwnerState, PINS_HEADER_WORDS};
use super::wire::PoolOffer;
use crate::door::OwnerLink;
use ipc_core::backend::Backend;
use ipc_core::ring::monotonic_ns;
use ipc_core::shm::{ReadOnlyMemory, SharedMemory};

/// How often a lookup asks the connection whether the owner hung up (a directory marked closed is seen at once).
const OWNER_CHECK_INTERVAL_NS: u64 = 1_000_000;

/// What an importer holds, shared with its views.
pub(crate) struct ImporterInner<B: Backend> {
    pub(super) path: PathBuf,
    pub(super) offer: PoolOffer,
    pub(super) directory: ReadOnlyMemory,
    pub(super) pins: SharedMemory,
    pub(super) blocks: BlockCache<B>,
    pub(super) link: OwnerLink,
    pub(super) last_owner_check_ns: AtomicU64,
    pub(super) owner_hung_up: AtomicBool,
}

impl<B: Backend> ImporterInner<B> {
    fn pin_word(&self, slot: u32) -> Option<&std::sync::atomic::AtomicU64> {
        self.pins.words(PINS_HEADER_WORDS + slot as usize, 1).ok()?.first()
    }

    /// Counts one more view of the buffer in `slot`.
    pub(super) fn pin(&self, slot: u32) {
        if let Some(word) = self.pin_word(slot) {
            word.fetch_add(1, Ordering::SeqCst);
        }
    }

    /// Counts one more view of a slot already pinned (a clone of a view): no recheck needed.
    pub(super) fn pin_again(&self, slot: u32) {
        if let Some(word) = self.pin_word(slot) {
            word.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Counts one view fewer (never below zero).
    pub(super) fn unpin(&self, slot: u32) {
        if let Some(word) = self.pin_word(slot) {
            let _ = word.fetch_update(Ordering::Release, Ordering::Relaxed, |n| n.checked_sub(1));
        }
    }

    /// Views of `slot` this importer holds (what the owner sees).
    pub(super) fn pins_of(&self, slot: u32) -> u64 {
        self.pin_word(slot).map_or(0, |w| w.load(Ordering::Relaxed))
    }

    pub(super) fn directory_error(&self, problem: DirectoryProblem) -> PoolError {
        PoolError::Protocol { path: self.path.clone(), what: "directory", problem: problem.to_string() }
    }

    /// `OwnerGone` once the owner closed the pool or hung up (the connection is asked at most every millisecond).
    pub(super) fn check_owner(&self) -> Result<(), PoolError> {
        if owner_state(&self.directory) == Some(OwnerState::Closed) {
            return Err(PoolError::OwnerGone { path: self.path.clone(), how: "closed the pool" });
        }
        let now = monotonic_ns();
        let last = self.last_owner_check_ns.load(Ordering::Relaxed);
        if !self.owner_hung_up.load(Ordering::Relaxed)
            && now.saturating_sub(last) >= OWNER_CHECK_INTERVAL_NS
            && self.last_owner_check_ns.compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed).is_ok()
            && self.link.owner_gone()
        {
            self.owner_hung_up.store(true, Ordering::Relaxed);
        }
        if self.owner_hung_up.load(Ordering::Relaxed) {
            return Err(PoolError::OwnerGone { path: self.path.clone(), how: "hung up" });
        }
        Ok(())
    }
}
