//! A read-only mapping of a memfd that a peer writes ([`ReadOnlyMemory`]).

use std::ffi::c_void;
use std::os::fd::OwnedFd;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, Ordering};

use rustix::mm::ProtFlags;

use super::error::ShmError;
use super::memory::{check_received, map_shared};

/// A read-only `MAP_SHARED` mapping of a sealed memfd that a peer writes (the memory pool's directory), and the
/// fd; unmapped on drop. Read only as relaxed 64-bit atomic loads: the one atomic access Rust defines on memory
/// mapped read-only (on x86-64 and AArch64, the targets of this crate); readers order them with fences.
#[derive(Debug)]
pub struct ReadOnlyMemory {
    ptr: NonNull<c_void>,
    len: usize,
    _fd: OwnedFd,
}

// Relaxed 64-bit loads are guaranteed not to write (and so not to fault on a read-only page) only on targets whose
// 64-bit atomic load is a plain load.
const _: () = assert!(
    cfg!(any(target_arch = "x86_64", target_arch = "aarch64")),
    "ReadOnlyMemory relies on 64-bit relaxed atomic loads working on read-only pages (x86-64, AArch64)"
);

// SAFETY: as for `SharedMemory`: the value owns its mapping and fd, nothing in it is bound to a thread.
unsafe impl Send for ReadOnlyMemory {}
// SAFETY: through `&ReadOnlyMemory` the memory is only read, with atomic loads, so sharing it between threads
// gives no data race.
unsafe impl Sync for ReadOnlyMemory {}

impl ReadOnlyMemory {
    /// Maps a memfd received from a peer read-only, after checking that it is exactly `expected_len` bytes and
    /// sealed against shrinking and growing (a memfd sealed with `F_SEAL_FUTURE_WRITE` can only be mapped so).
    ///
    /// # Errors
    /// As [`SharedMemory::from_fd`](super::SharedMemory::from_fd).
    pub fn from_fd(fd: OwnedFd, expected_len: usize) -> Result<Self, ShmError> {
        check_received(&fd, expected_len)?;
        let ptr = map_shared(&fd, expected_len, ProtFlags::READ)?;
        Ok(Self { ptr, len: expected_len, _fd: fd })
    }

    /// Length of the mapping in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Always false: a mapping has at least one byte.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The aligned 64-bit word at index `word` (bytes `8 * word ..`), loaded with `Ordering::Relaxed`; `None` when
    /// it does not lie wholly inside the mapping.
    pub fn load(&self, word: usize) -> Option<u64> {
        let end = word.checked_add(1)?.checked_mul(8)?;
        if end > self.len {
            return None;
        }
        // SAFETY: the word lies inside the mapping (checked above), which is page aligned, so it is aligned and
        // mapped for as long as `self`; any bit pattern is a valid `AtomicU64`; the access is a relaxed 64-bit
        // load, which Rust defines on read-only memory on this crate's targets (asserted above) and which races
        // with the writer's atomic stores without a data race.
        let atomic = unsafe { &*self.ptr.as_ptr().cast::<AtomicU64>().add(word) };
        Some(atomic.load(Ordering::Relaxed))
    }
}

impl Drop for ReadOnlyMemory {
    fn drop(&mut self) {
        // SAFETY: `ptr`/`len` are exactly the range `from_fd` mapped, unmapped only here, once; no reference into
        // it outlives `self` (`load` returns values).
        if let Err(error) = unsafe { rustix::mm::munmap(self.ptr.as_ptr(), self.len) } {
            tracing::warn!(%error, len = self.len, "munmap of read-only shared memory failed");
        }
    }
}
