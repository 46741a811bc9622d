//! One `MAP_SHARED` mapping of a sealed memfd ([`SharedMemory`]), and the checks every received memfd passes.

use std::ffi::c_void;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, Ordering};

use rustix::fs::{MemfdFlags, SealFlags};
use rustix::io::Errno;
use rustix::mm::{MapFlags, ProtFlags};

use super::error::ShmError;

/// Seals every shared mapping must carry: with them no peer can shrink the file under a mapping (which would turn
/// accesses into `SIGBUS`) or grow it.
const REQUIRED_SEALS: SealFlags = SealFlags::SHRINK.union(SealFlags::GROW);

/// One `MAP_SHARED`, read-write mapping of a sealed memfd, and the fd itself. Unmapped on drop.
///
/// Or, made by [`SharedMemory::side_by_side`], several sealed memfds mapped one after the other in one reserved
/// address range (the host's model of VMM allocations mapped side by side, as PyTorch's expandable segments map
/// them): one contiguous range to read and write, whose pieces are sent one by one.
///
/// The mapping starts on a page boundary (`mmap` guarantees it), which is what `cuMemHostRegister` needs.
#[derive(Debug)]
pub struct SharedMemory {
    pub(super) ptr: NonNull<c_void>,
    pub(super) len: usize,
    /// The memfd (the first one, for memfds side by side).
    pub(super) fd: OwnedFd,
    /// The memfds mapped after the first one, each at its offset; empty for one memfd.
    pub(super) rest: Vec<SidePiece>,
}

/// A memfd mapped after the first one, side by side.
#[derive(Debug)]
pub(super) struct SidePiece {
    pub(super) offset: usize,
    pub(super) len: usize,
    pub(super) fd: OwnedFd,
}

// SAFETY: `SharedMemory` owns its mapping and fd; the raw pointer is only an address of memory that stays mapped
// until `Drop`, which `&mut self`/ownership rules make unique. Moving the owner to another thread moves nothing
// thread-bound (mappings and fds are per process, not per thread).
unsafe impl Send for SharedMemory {}
// SAFETY: through `&SharedMemory` the memory is reachable only as a raw pointer (whose use is the caller's unsafe
// business), through `read_bytes`/`write_bytes`, which access it as aligned `AtomicU64` words, or through
// `SharedObject`, whose views are made only of `AtomicU64`s; so sharing `&SharedMemory` between threads gives no
// data race (and no mixed-size race: every CPU access is a whole, aligned 64-bit atomic).
unsafe impl Sync for SharedMemory {}

impl SharedMemory {
    /// Creates a sealed memfd of `len` bytes (zero-filled by the kernel) and maps it shared, read-write.
    ///
    /// `memfd_create(2)` with `MFD_CLOEXEC | MFD_ALLOW_SEALING`, `ftruncate(2)`, `F_ADD_SEALS` with
    /// `F_SEAL_SHRINK | F_SEAL_GROW`, then `mmap(2)` `MAP_SHARED`.
    pub fn create(name: &str, len: usize) -> Result<Self, ShmError> {
        Self::map(sealed_memfd(name, len)?, len)
    }
}

/// A sealed memfd of `len` bytes (zero-filled by the kernel).
pub(super) fn sealed_memfd(name: &str, len: usize) -> Result<OwnedFd, ShmError> {
    if len == 0 {
        return Err(ShmError::ZeroLength { name: name.to_owned() });
    }
    let fd = rustix::fs::memfd_create(name, MemfdFlags::CLOEXEC | MemfdFlags::ALLOW_SEALING)
        .map_err(|source| ShmError::Create { name: name.to_owned(), source })?;
    rustix::fs::ftruncate(&fd, len as u64).map_err(|source| ShmError::Resize { name: name.to_owned(), len, source })?;
    rustix::fs::fcntl_add_seals(&fd, REQUIRED_SEALS)
        .map_err(|source| ShmError::Seal { call: "F_ADD_SEALS", source })?;
    tracing::debug!(name, len, "created sealed memfd");
    Ok(fd)
}

impl SharedMemory {
    /// Maps a memfd received from a peer, after checking that it is exactly `expected_len` bytes and sealed
    /// against shrinking and growing.
    pub fn from_fd(fd: OwnedFd, expected_len: usize) -> Result<Self, ShmError> {
        check_received(&fd, expected_len)?;
        Self::map(fd, expected_len)
    }

    /// As [`from_fd`](Self::from_fd), for a peer whose memfd may have any of several sizes (one per layout version
    /// of what it holds): `accept` picks, from the size `fstat` reports, the size to expect, or `None` to refuse it
    /// with [`ShmError::SizeMismatch`] naming `expected_for_error`. Returns the mapping.
    pub fn from_fd_of_size(
        fd: OwnedFd,
        accept: impl FnOnce(u64) -> Option<usize>,
        expected_for_error: usize,
    ) -> Result<Self, ShmError> {
        let stat = rustix::fs::fstat(&fd).map_err(|source| ShmError::Stat { source })?;
        let actual = u64::try_from(stat.st_size).unwrap_or(u64::MAX);
        let len = accept(actual).ok_or(ShmError::SizeMismatch { expected: expected_for_error, actual })?;
        Self::from_fd(fd, len)
    }

    fn map(fd: OwnedFd, len: usize) -> Result<Self, ShmError> {
        let ptr = map_shared(&fd, len, ProtFlags::READ | ProtFlags::WRITE)?;
        Ok(Self { ptr, len, fd, rest: Vec::new() })
    }

    /// Start of the mapping (page aligned). For `cuMemHostRegister` and for computing device addresses as
    /// `base + offset`; reading or writing through it is the caller's responsibility, and must be done as aligned
    /// 64-bit atomics (the only way this type and [`SharedObject`](super::SharedObject) touch the memory), or other threads' accesses
    /// may race it.
    pub fn as_ptr(&self) -> *mut u8 {
        self.ptr.as_ptr().cast()
    }

    /// Length of the mapping in bytes (the memfd's sealed size).
    pub fn len(&self) -> usize {
        self.len
    }

    /// Always false: a mapping has at least one byte (zero-length creation is rejected).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The memfd, borrowed: to send over `SCM_RIGHTS` (the kernel duplicates it into the peer). For memfds side
    /// by side, the first one's (see [`pieces`](Self::pieces)).
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }

    /// A new close-on-exec descriptor for the same memfd.
    ///
    /// # Errors
    /// [`ShmError::SideBySide`] for several memfds side by side; [`ShmError::CloneFd`].
    pub fn try_clone_fd(&self) -> Result<OwnedFd, ShmError> {
        if !self.rest.is_empty() {
            return Err(ShmError::SideBySide { pieces: self.rest.len() + 1 });
        }
        rustix::io::fcntl_dupfd_cloexec(&self.fd, 0).map_err(|source| ShmError::CloneFd { source })
    }

    /// Adds `F_SEAL_FUTURE_WRITE` (Linux 5.1): from now on nobody can map the memfd writable, so peers that
    /// receive it can only read it ([`ReadOnlyMemory`](super::ReadOnlyMemory)); mappings made before, this one included, stay writable.
    ///
    /// # Errors
    /// [`ShmError::Seal`] (`EINVAL` on a kernel older than 5.1).
    pub fn seal_future_writes(&self) -> Result<(), ShmError> {
        for fd in std::iter::once(&self.fd).chain(self.rest.iter().map(|piece| &piece.fd)) {
            rustix::fs::fcntl_add_seals(fd, SealFlags::FUTURE_WRITE)
                .map_err(|source| ShmError::Seal { call: "F_ADD_SEALS(F_SEAL_FUTURE_WRITE)", source })?;
        }
        Ok(())
    }

    /// The `count` aligned 64-bit words from word index `first` on, as atomics: for layouts addressed by word
    /// index rather than by a `#[repr(C)]` struct (the memory pool's directory, whose size is chosen at run time).
    ///
    /// # Errors
    /// [`ShmError::OutOfRange`] when they do not all lie inside the mapping.
    pub fn words(&self, first: usize, count: usize) -> Result<&[AtomicU64], ShmError> {
        let range = first.checked_mul(8).zip(count.checked_mul(8));
        let Some((offset, bytes)) = range else {
            return Err(ShmError::OutOfRange { offset: usize::MAX, bytes: usize::MAX, len: self.len });
        };
        self.check_range(offset, bytes)?;
        // SAFETY: the words lie inside the mapping (checked above), which is page aligned, so each is aligned; the
        // mapping lives as long as the returned borrow of `self`; any bit pattern is a valid `AtomicU64`, and Rust
        // code reaches this memory only through `AtomicU64`s, so concurrent use from other threads or processes is
        // atomic.
        Ok(unsafe { std::slice::from_raw_parts(self.ptr.as_ptr().cast::<AtomicU64>().add(first), count) })
    }

    /// Every whole aligned 64-bit word of the mapping, as atomics: for layouts addressed by byte offset whose size
    /// depends on a version read at run time (the ring's control block). Word `i` is bytes `8 * i ..`.
    pub fn as_words(&self) -> &[AtomicU64] {
        // SAFETY: `len / 8` words from the start lie inside the mapping, which is page aligned, so each is aligned;
        // the mapping lives as long as the returned borrow of `self`; any bit pattern is a valid `AtomicU64`, and
        // Rust code reaches this memory only through `AtomicU64`s, so concurrent use from other threads or
        // processes is atomic.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr().cast::<AtomicU64>(), self.len / 8) }
    }

    fn check_range(&self, offset: usize, bytes: usize) -> Result<(), ShmError> {
        match offset.checked_add(bytes) {
            Some(end) if end <= self.len => Ok(()),
            _ => Err(ShmError::OutOfRange { offset, bytes, len: self.len }),
        }
    }

    /// The aligned 64-bit word `index` of the mapping (bytes `8 * index ..`), as an atomic.
    ///
    /// Callers pass only indices of words that overlap `0..len`; such a word lies inside the mapping, because
    /// `mmap` maps whole pages and a page is a multiple of 8 bytes.
    fn word(&self, index: usize) -> &AtomicU64 {
        debug_assert!(index * 8 < self.len);
        // SAFETY: the word starts inside the mapping, which is page aligned, so the word is aligned and (pages
        // being multiples of 8 bytes) wholly mapped; the mapping lives as long as the returned borrow of `self`;
        // any bit pattern is a valid `AtomicU64`, and Rust code reaches this memory only through `AtomicU64`s (here
        // and in `SharedObject`), so concurrent use from other threads or processes is atomic.
        unsafe { &*self.ptr.as_ptr().cast::<AtomicU64>().add(index) }
    }

    /// Copies `src` into the mapping at `offset` (the host backend's "device write").
    ///
    /// The bytes are stored as relaxed atomic writes of the aligned 64-bit words they fall in (a partial word is
    /// merged with a compare-and-swap, leaving its other bytes as they are), so a concurrent reader or writer, in
    /// this or another process, is never a data race. The copy as a whole is not atomic: a reader racing it may see
    /// some words old and some new. Keeping readers off a range while it is written, and publishing it with a
    /// release store that readers acquire, is the caller's protocol (the ring's), as it is for device memory.
    ///
    /// # Errors
    /// [`ShmError::OutOfRange`].
    pub fn write_bytes(&self, offset: usize, src: &[u8]) -> Result<(), ShmError> {
        self.check_range(offset, src.len())?;
        let mut pos = offset;
        for chunk in word_chunks(offset, src) {
            let (index, within) = (pos / 8, pos % 8);
            let word = self.word(index);
            if let Ok(whole) = <[u8; 8]>::try_from(chunk) {
                word.store(u64::from_ne_bytes(whole), Ordering::Relaxed);
            } else {
                // The closure always returns `Some`, so `fetch_update` cannot fail.
                let _ = word.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |old| {
                    let mut bytes = old.to_ne_bytes();
                    bytes[within..within + chunk.len()].copy_from_slice(chunk);
                    Some(u64::from_ne_bytes(bytes))
                });
            }
            pos += chunk.len();
        }
        Ok(())
    }

    /// Copies bytes at `offset` out of the mapping into `dst`, as relaxed atomic reads of the aligned 64-bit words
    /// they fall in (see [`SharedMemory::write_bytes`] for what that does and does not promise).
    ///
    /// # Errors
    /// [`ShmError::OutOfRange`].
    pub fn read_bytes(&self, offset: usize, dst: &mut [u8]) -> Result<(), ShmError> {
        self.check_range(offset, dst.len())?;
        let mut pos = offset;
        let mut rest = dst;
        while !rest.is_empty() {
            let (index, within) = (pos / 8, pos % 8);
            let n = (8 - within).min(rest.len());
            let bytes = self.word(index).load(Ordering::Relaxed).to_ne_bytes();
            let (head, tail) = rest.split_at_mut(n);
            head.copy_from_slice(&bytes[within..within + n]);
            rest = tail;
            pos += n;
        }
        Ok(())
    }
}

/// Checks a memfd received from a peer: exactly `expected_len` bytes, sealed against shrinking and growing.
pub(super) fn check_received(fd: &OwnedFd, expected_len: usize) -> Result<(), ShmError> {
    if expected_len == 0 {
        return Err(ShmError::ZeroLength { name: "<from fd>".to_owned() });
    }
    let seals = rustix::fs::fcntl_get_seals(fd).map_err(|source| ShmError::Seal { call: "F_GET_SEALS", source })?;
    if !seals.contains(REQUIRED_SEALS) {
        return Err(ShmError::NotSealed { found: seals.bits() });
    }
    let stat = rustix::fs::fstat(fd).map_err(|source| ShmError::Stat { source })?;
    // A negative size cannot happen for a memfd; map it to a value that fails the comparison.
    let actual = u64::try_from(stat.st_size).unwrap_or(u64::MAX);
    if actual != expected_len as u64 {
        return Err(ShmError::SizeMismatch { expected: expected_len, actual });
    }
    Ok(())
}

/// `mmap(2)` of the whole `len`-byte file `MAP_SHARED` with `prot`.
pub(super) fn map_shared(fd: &OwnedFd, len: usize, prot: ProtFlags) -> Result<NonNull<c_void>, ShmError> {
    // SAFETY: a null hint lets the kernel pick a fresh range, so no existing Rust object is aliased or replaced;
    // `len` is non-zero and equals the file size, which the seals keep from shrinking, so every byte of the
    // mapping stays backed by the file.
    let raw = unsafe { rustix::mm::mmap(std::ptr::null_mut(), len, prot, MapFlags::SHARED, fd, 0) }
        .map_err(|source| ShmError::Map { len, source })?;
    NonNull::new(raw).ok_or(ShmError::Map { len, source: Errno::FAULT })
}

/// `src`, written at `offset`, split where it crosses 8-byte boundaries: one chunk per aligned word it touches.
fn word_chunks(offset: usize, src: &[u8]) -> impl Iterator<Item = &[u8]> {
    let head = ((8 - offset % 8) % 8).min(src.len());
    let (first, rest) = src.split_at(head);
    (!first.is_empty()).then_some(first).into_iter().chain(rest.chunks(8))
}

impl Drop for SharedMemory {
    fn drop(&mut self) {
        // SAFETY: `ptr`/`len` are exactly the range `map` obtained from `mmap`, unmapped only here, once. Every
        // reference handed out (`SharedObject::get`) borrows `self`, so none outlives this call.
        let result = unsafe { rustix::mm::munmap(self.ptr.as_ptr(), self.len) };
        // Like memmap2: an unmap error cannot be acted on in `drop`; log it and go on (the fd closes after this).
        if let Err(error) = result {
            tracing::warn!(%error, len = self.len, "munmap of shared memory failed");
        }
    }
}

// SAFETY: the mapping is page aligned (mmap), stays mapped at the same address until the `SharedMemory` drops, and
// Rust code accesses it only through atomics (`SharedObject`) or raw pointers, so the device writing it at any time
// breaks no aliasing rule.
unsafe impl gpu_ipc_driver::RegistrableHostMemory for SharedMemory {
    fn as_ptr(&self) -> *mut u8 {
        SharedMemory::as_ptr(self)
    }
    fn len(&self) -> usize {
        SharedMemory::len(self)
    }
}
