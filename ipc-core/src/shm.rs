//! Host shared memory: a sealed `memfd` mapped `MAP_SHARED` into every process that holds its fd.
//!
//! The ring's control block lives in such a mapping so that producer and consumers (and later, through
//! `cuMemHostRegister`, their GPU streams) read and write the very same 64-bit counters. The fd travels to peers
//! over the rendezvous socket with `SCM_RIGHTS`; each peer rebuilds a [`SharedMemory`] with
//! [`SharedMemory::from_fd`].
//!
//! With the wire layer's `SO_PEERCRED` read, this is the only code of ipc-core that needs `unsafe`: the only pointer
//! casts the ring needs (a mapping viewed as a `#[repr(C)]` struct of atomics) are made here, once, behind
//! [`AtomicPlainData`].

use std::ffi::c_void;
use std::marker::PhantomData;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, Ordering};

use rustix::fs::{MemfdFlags, SealFlags};
use rustix::io::Errno;
use rustix::mm::{MapFlags, ProtFlags};

/// Seals every shared mapping must carry: with them no peer can shrink the file under a mapping (which would turn
/// accesses into `SIGBUS`) or grow it.
const REQUIRED_SEALS: SealFlags = SealFlags::SHRINK.union(SealFlags::GROW);

/// What went wrong while creating, opening or mapping shared memory.
#[derive(Debug, thiserror::Error)]
pub enum ShmError {
    /// A copy in or out of the mapping would pass its end.
    #[error("{bytes} bytes at offset {offset} do not fit in the {len}-byte shared memory")]
    OutOfRange {
        /// Start of the copy.
        offset: usize,
        /// Its length.
        bytes: usize,
        /// The mapping's length.
        len: usize,
    },
    /// A zero-length mapping was requested; `mmap` cannot map it.
    #[error("shared memory `{name}` must be at least one byte long")]
    ZeroLength {
        /// Name given to `memfd_create` (`"<from fd>"` when attaching).
        name: String,
    },
    /// `memfd_create` failed.
    #[error("memfd_create(\"{name}\") failed: {source} (is /proc or memfd available in this sandbox?)")]
    Create {
        /// Name given to `memfd_create`.
        name: String,
        /// OS error.
        source: Errno,
    },
    /// `ftruncate` to the requested length failed.
    #[error("ftruncate of shared memory `{name}` to {len} bytes failed: {source}")]
    Resize {
        /// Name given to `memfd_create`.
        name: String,
        /// Requested length in bytes.
        len: usize,
        /// OS error.
        source: Errno,
    },
    /// Adding or reading the `F_SEAL_SHRINK | F_SEAL_GROW` seals failed.
    #[error("sealing shared memory failed in {call}: {source}")]
    Seal {
        /// The `fcntl` operation that failed.
        call: &'static str,
        /// OS error.
        source: Errno,
    },
    /// A received fd lacks the size seals, so a peer could shrink it under our mapping.
    #[error(
        "shared memory fd is not sealed against resizing (seals {found:#x}); the peer must create it with \
         SharedMemory::create"
    )]
    NotSealed {
        /// Seal bits found on the fd.
        found: u32,
    },
    /// `fstat` on a received fd failed.
    #[error("fstat of shared memory fd failed: {source}")]
    Stat {
        /// OS error.
        source: Errno,
    },
    /// A received fd has another size than the layout expects (different build or protocol version of the peer).
    #[error("shared memory fd is {actual} bytes, expected {expected}; peer and this process disagree on the layout")]
    SizeMismatch {
        /// Size this process expects.
        expected: usize,
        /// Size reported by `fstat`.
        actual: u64,
    },
    /// `mmap` failed.
    #[error("mmap of {len} bytes of shared memory failed: {source}")]
    Map {
        /// Requested length.
        len: usize,
        /// OS error.
        source: Errno,
    },
    /// Duplicating the fd (to send it to a peer) failed.
    #[error("duplicating the shared memory fd failed: {source}")]
    CloneFd {
        /// OS error.
        source: Errno,
    },
    /// Memory made of several memfds side by side has no single fd to send: each piece is sent on its own.
    #[error("this shared memory is {pieces} memfds side by side, not one: send each piece's fd (try_clone_piece_fd)")]
    SideBySide {
        /// How many memfds it is made of.
        pieces: usize,
    },
    /// A memfd mapped side by side with others must be a whole number of pages, so the next one starts on a page.
    #[error(
        "a memfd mapped side by side with others must be a positive multiple of the {page}-byte page, not {len} bytes"
    )]
    NotWholePages {
        /// Its length.
        len: usize,
        /// The page size.
        page: usize,
    },
    /// A typed view does not fit the mapping.
    #[error("cannot view {len}-byte mapping as `{type_name}` ({size} bytes, alignment {align})")]
    ViewDoesNotFit {
        /// Mapping length.
        len: usize,
        /// Viewed type.
        type_name: &'static str,
        /// `size_of` the viewed type.
        size: usize,
        /// `align_of` the viewed type.
        align: usize,
    },
}

/// One `MAP_SHARED`, read-write mapping of a sealed memfd, and the fd itself. Unmapped on drop.
///
/// Or, made by [`SharedMemory::side_by_side`], several sealed memfds mapped one after the other in one reserved
/// address range (the host's model of VMM allocations mapped side by side, as PyTorch's expandable segments map
/// them): one contiguous range to read and write, whose pieces are sent one by one.
///
/// The mapping starts on a page boundary (`mmap` guarantees it), which is what `cuMemHostRegister` needs.
#[derive(Debug)]
pub struct SharedMemory {
    ptr: NonNull<c_void>,
    len: usize,
    /// The memfd (the first one, for memfds side by side).
    fd: OwnedFd,
    /// The memfds mapped after the first one, each at its offset; empty for one memfd.
    rest: Vec<SidePiece>,
}

/// A memfd mapped after the first one, side by side.
#[derive(Debug)]
struct SidePiece {
    offset: usize,
    len: usize,
    fd: OwnedFd,
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

    /// Creates one sealed memfd per size (zero-filled, each a whole number of pages) and maps them side by side in
    /// one address range, in order: see [`side_by_side`](Self::side_by_side).
    ///
    /// # Errors
    /// As [`create`](Self::create); [`ShmError::NotWholePages`].
    pub fn create_side_by_side(name: &str, sizes: &[usize]) -> Result<Self, ShmError> {
        let pieces = sizes.iter().map(|&len| Ok((sealed_memfd(name, len)?, len))).collect::<Result<Vec<_>, _>>()?;
        Self::side_by_side(pieces)
    }

    /// Maps several sealed memfds (each exactly its given length, a whole number of pages; checked as
    /// [`from_fd`](Self::from_fd) checks one) one after the other in one reserved address range: `mmap` of the
    /// whole length `PROT_NONE`, then each memfd `MAP_FIXED` at its offset inside it. One piece gives what
    /// [`from_fd`](Self::from_fd) gives.
    ///
    /// # Errors
    /// No piece, a piece that fails the checks, [`ShmError::NotWholePages`], a failing `mmap` (what was mapped is
    /// unmapped).
    pub fn side_by_side(mut pieces: Vec<(OwnedFd, usize)>) -> Result<Self, ShmError> {
        if pieces.len() == 1
            && let Some((fd, len)) = pieces.pop()
        {
            return Self::from_fd(fd, len);
        }
        let page = rustix::param::page_size();
        let mut total = 0usize;
        for (fd, len) in &pieces {
            if *len == 0 || !len.is_multiple_of(page) {
                return Err(ShmError::NotWholePages { len: *len, page });
            }
            check_received(fd, *len)?;
            total = total.checked_add(*len).ok_or(ShmError::Map { len: usize::MAX, source: Errno::NOMEM })?;
        }
        if total == 0 {
            return Err(ShmError::ZeroLength { name: "<side by side>".to_owned() });
        }
        // SAFETY: a null hint lets the kernel pick a fresh range, so no existing Rust object is aliased or replaced;
        // `total` is non-zero; the range is anonymous, private and inaccessible until pieces are mapped over it.
        let raw = unsafe {
            rustix::mm::mmap_anonymous(
                std::ptr::null_mut(),
                total,
                ProtFlags::empty(),
                MapFlags::PRIVATE | MapFlags::NORESERVE,
            )
        }
        .map_err(|source| ShmError::Map { len: total, source })?;
        let ptr = NonNull::new(raw).ok_or(ShmError::Map { len: total, source: Errno::FAULT })?;
        let mut offset = 0usize;
        let mut first = None;
        let mut rest = Vec::with_capacity(pieces.len().saturating_sub(1));
        for (fd, len) in pieces {
            // SAFETY: `[offset, offset + len)` lies inside the range reserved above, which this function owns and
            // no Rust object refers to, so MAP_FIXED replaces only our own reservation; `len` is the memfd's
            // sealed size (checked), so every byte stays backed by the file.
            let mapped = unsafe {
                rustix::mm::mmap(
                    ptr.as_ptr().cast::<u8>().add(offset).cast(),
                    len,
                    ProtFlags::READ | ProtFlags::WRITE,
                    MapFlags::SHARED | MapFlags::FIXED,
                    &fd,
                    0,
                )
            };
            if let Err(source) = mapped {
                // SAFETY: the whole reservation (and what was mapped over it) is ours and unmapped once, here.
                let _ = unsafe { rustix::mm::munmap(ptr.as_ptr(), total) };
                return Err(ShmError::Map { len, source });
            }
            if first.is_none() {
                first = Some(fd);
            } else {
                rest.push(SidePiece { offset, len, fd });
            }
            offset += len;
        }
        let Some(fd) = first else {
            // SAFETY: as above.
            let _ = unsafe { rustix::mm::munmap(ptr.as_ptr(), total) };
            return Err(ShmError::ZeroLength { name: "<side by side>".to_owned() });
        };
        Ok(Self { ptr, len: total, fd, rest })
    }

    /// The memfds this memory is made of, as (offset, length) in order: one for a single memfd.
    pub fn pieces(&self) -> Vec<(usize, usize)> {
        let first = self.rest.first().map_or(self.len, |piece| piece.offset);
        std::iter::once((0, first)).chain(self.rest.iter().map(|piece| (piece.offset, piece.len))).collect()
    }

    /// A new close-on-exec descriptor for the memfd of piece `index` (see [`pieces`](Self::pieces)).
    ///
    /// # Errors
    /// [`ShmError::OutOfRange`] for a piece that does not exist; [`ShmError::CloneFd`].
    pub fn try_clone_piece_fd(&self, index: usize) -> Result<OwnedFd, ShmError> {
        let fd = match index.checked_sub(1) {
            None => &self.fd,
            Some(i) => &self.rest.get(i).ok_or(ShmError::OutOfRange { offset: index, bytes: 1, len: self.len })?.fd,
        };
        rustix::io::fcntl_dupfd_cloexec(fd, 0).map_err(|source| ShmError::CloneFd { source })
    }
}

/// A sealed memfd of `len` bytes (zero-filled by the kernel).
fn sealed_memfd(name: &str, len: usize) -> Result<OwnedFd, ShmError> {
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
    /// 64-bit atomics (the only way this type and [`SharedObject`] touch the memory), or other threads' accesses
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
    /// receive it can only read it ([`ReadOnlyMemory`]); mappings made before, this one included, stay writable.
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

    /// Copies `src` into the mapping at `offset` (the host fake backend's "device write").
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
fn check_received(fd: &OwnedFd, expected_len: usize) -> Result<(), ShmError> {
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
fn map_shared(fd: &OwnedFd, len: usize, prot: ProtFlags) -> Result<NonNull<c_void>, ShmError> {
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
    /// As [`SharedMemory::from_fd`].
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

/// Types that may be laid over shared memory that other processes write concurrently.
///
/// # Safety
///
/// An implementor guarantees that every bit pattern of `size_of::<Self>()` bytes (including all zeros, which is
/// what a fresh memfd holds, and whatever a buggy or hostile peer wrote) is a valid value, and that every field is
/// an atomic (or an array or `#[repr(C)]` struct of such), so mutation by other processes through a shared
/// reference is ordinary interior mutability and never a data race on a non-atomic.
pub unsafe trait AtomicPlainData: Sync {}

// SAFETY: `AtomicU64` is valid for every 64-bit pattern and is mutated only atomically.
unsafe impl AtomicPlainData for AtomicU64 {}
// SAFETY: an array of valid-for-every-pattern atomics is itself valid for every pattern and has no padding.
unsafe impl<T: AtomicPlainData, const N: usize> AtomicPlainData for [T; N] {}

/// A [`SharedMemory`] whose first `size_of::<T>()` bytes are viewed as a `T` made only of atomics.
#[derive(Debug)]
pub struct SharedObject<T: AtomicPlainData> {
    memory: SharedMemory,
    _type: PhantomData<T>,
}

impl<T: AtomicPlainData> SharedObject<T> {
    /// Checks that `T` fits the mapping (size and alignment) and wraps it.
    pub fn new(memory: SharedMemory) -> Result<Self, ShmError> {
        let fits = memory.len() >= size_of::<T>() && memory.as_ptr().align_offset(align_of::<T>()) == 0;
        if !fits {
            return Err(ShmError::ViewDoesNotFit {
                len: memory.len(),
                type_name: std::any::type_name::<T>(),
                size: size_of::<T>(),
                align: align_of::<T>(),
            });
        }
        Ok(Self { memory, _type: PhantomData })
    }

    /// The shared object. Other processes may change it at any time, through its atomics only.
    pub fn get(&self) -> &T {
        // SAFETY: `new` checked that the mapping is at least `size_of::<T>()` bytes and aligned for `T`; the
        // mapping lives as long as `self.memory`, which the returned borrow of `self` keeps alive; and
        // `T: AtomicPlainData` makes any content valid and all concurrent mutation atomic.
        unsafe { &*self.memory.as_ptr().cast::<T>() }
    }

    /// The underlying mapping (for its fd, base address and length).
    pub fn memory(&self) -> &SharedMemory {
        &self.memory
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

// SAFETY: as for `SharedMemory`, which this owns; `T` is made only of atomics (`AtomicPlainData`).
unsafe impl<T: AtomicPlainData + Send> gpu_ipc_driver::RegistrableHostMemory for SharedObject<T> {
    fn as_ptr(&self) -> *mut u8 {
        self.memory().as_ptr()
    }
    fn len(&self) -> usize {
        self.memory().len()
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;
    use std::sync::atomic::Ordering;

    #[test]
    fn create_map_and_reattach_share_bytes() {
        let first = SharedMemory::create("shm-unit", 4096).unwrap();
        assert_eq!(first.len(), 4096);
        assert_eq!(first.as_ptr() as usize % 4096, 0, "mapping must be page aligned");
        let second = SharedMemory::from_fd(first.try_clone_fd().unwrap(), 4096).unwrap();
        let a = SharedObject::<[AtomicU64; 4]>::new(first).unwrap();
        let b = SharedObject::<[AtomicU64; 4]>::new(second).unwrap();
        a.get()[3].store(0xfeed, Ordering::SeqCst);
        assert_eq!(b.get()[3].load(Ordering::SeqCst), 0xfeed);
        assert_eq!(b.get()[0].load(Ordering::SeqCst), 0, "fresh memfd is zero-filled");
    }

    #[test]
    fn from_fd_rejects_wrong_size_and_missing_seals() {
        let shm = SharedMemory::create("shm-size", 8192).unwrap();
        let err = SharedMemory::from_fd(shm.try_clone_fd().unwrap(), 4096).unwrap_err();
        assert!(matches!(err, ShmError::SizeMismatch { expected: 4096, actual: 8192 }), "{err}");

        let unsealed = rustix::fs::memfd_create("unsealed", MemfdFlags::CLOEXEC).unwrap();
        rustix::fs::ftruncate(&unsealed, 4096).unwrap();
        let err = SharedMemory::from_fd(unsealed, 4096).unwrap_err();
        assert!(matches!(err, ShmError::NotSealed { .. }), "{err}");
        assert!(matches!(SharedMemory::create("z", 0), Err(ShmError::ZeroLength { .. })));
    }

    #[test]
    fn byte_copies_round_trip_at_every_alignment_and_leave_neighbours_alone() {
        let shm = SharedMemory::create("shm-bytes", 100).unwrap();
        let pattern: Vec<u8> = (0..64u8).map(|b| b.wrapping_mul(37).wrapping_add(1)).collect();
        for offset in 0..=20 {
            for len in [0, 1, 3, 7, 8, 9, 15, 16, 17, 33, 64] {
                if offset + len > shm.len() {
                    continue;
                }
                shm.write_bytes(0, &[0xAA; 100]).unwrap();
                shm.write_bytes(offset, &pattern[..len]).unwrap();
                let mut all = [0u8; 100];
                shm.read_bytes(0, &mut all).unwrap();
                assert!(all[..offset].iter().all(|&b| b == 0xAA), "before {offset}+{len}");
                assert_eq!(&all[offset..offset + len], &pattern[..len], "at {offset}+{len}");
                assert!(all[offset + len..].iter().all(|&b| b == 0xAA), "after {offset}+{len}");
                let mut back = vec![0u8; len];
                shm.read_bytes(offset, &mut back).unwrap();
                assert_eq!(back, &pattern[..len]);
            }
        }
        // The last word reaches past the 100-byte file into the rest of the page: still mapped, still correct.
        shm.write_bytes(97, &[1, 2, 3]).unwrap();
        let mut tail = [0u8; 3];
        shm.read_bytes(97, &mut tail).unwrap();
        assert_eq!(tail, [1, 2, 3]);
        assert!(matches!(shm.write_bytes(98, &[0; 3]), Err(ShmError::OutOfRange { offset: 98, bytes: 3, len: 100 })));
        assert!(matches!(shm.read_bytes(usize::MAX, &mut [0; 2]), Err(ShmError::OutOfRange { .. })));
    }

    #[test]
    fn byte_copies_see_the_atomics_of_a_view_and_of_another_mapping() {
        let shm = SharedMemory::create("shm-bytes-view", 4096).unwrap();
        let other = SharedMemory::from_fd(shm.try_clone_fd().unwrap(), 4096).unwrap();
        let view = SharedObject::<[AtomicU64; 4]>::new(shm).unwrap();
        view.get()[1].store(u64::from_ne_bytes(*b"abcdefgh"), Ordering::Release);
        let mut seen = [0u8; 4];
        other.read_bytes(10, &mut seen).unwrap();
        assert_eq!(&seen, b"cdef");
        other.write_bytes(12, b"XY").unwrap();
        assert_eq!(view.get()[1].load(Ordering::Acquire).to_ne_bytes(), *b"abcdXYgh");
    }

    #[test]
    fn a_future_write_seal_leaves_the_owner_writing_and_peers_reading_only() {
        let owner = SharedMemory::create("shm-future-write", 4096).unwrap();
        owner.seal_future_writes().unwrap();
        let words = owner.words(1, 3).unwrap();
        words[2].store(0xabcd, Ordering::Release);
        assert!(matches!(owner.words(511, 2), Err(ShmError::OutOfRange { offset: 4088, bytes: 16, len: 4096 })));
        assert!(matches!(owner.words(usize::MAX, 1), Err(ShmError::OutOfRange { .. })));
        // Nobody can map it writable any more.
        let err = SharedMemory::from_fd(owner.try_clone_fd().unwrap(), 4096).unwrap_err();
        assert!(matches!(err, ShmError::Map { source: Errno::PERM, .. }), "{err}");
        let reader = ReadOnlyMemory::from_fd(owner.try_clone_fd().unwrap(), 4096).unwrap();
        assert_eq!(reader.load(3), Some(0xabcd));
        words[2].store(7, Ordering::Release);
        assert_eq!(reader.load(3), Some(7), "the reader sees the owner's later writes");
        assert_eq!((reader.load(511).is_some(), reader.load(512), reader.load(usize::MAX)), (true, None, None));
        let err = ReadOnlyMemory::from_fd(owner.try_clone_fd().unwrap(), 8192).unwrap_err();
        assert!(matches!(err, ShmError::SizeMismatch { expected: 8192, actual: 4096 }), "{err}");
    }

    #[test]
    fn memfds_side_by_side_are_one_range_here_and_in_a_peer_that_maps_their_pieces() {
        let page = rustix::param::page_size();
        let owner = SharedMemory::create_side_by_side("shm-side", &[2 * page, page, 3 * page]).unwrap();
        assert_eq!(owner.len(), 6 * page);
        assert_eq!(owner.pieces(), vec![(0, 2 * page), (2 * page, page), (3 * page, 3 * page)]);
        // Bytes written across both boundaries.
        let pattern: Vec<u8> = (0..4 * page).map(|i| (i * 7 % 251) as u8).collect();
        owner.write_bytes(page + 5, &pattern).unwrap();
        assert!(matches!(owner.try_clone_fd(), Err(ShmError::SideBySide { pieces: 3 })));
        // A peer maps the three memfds side by side too, and sees the same bytes at the same offsets.
        let fds = (0..3).map(|i| owner.try_clone_piece_fd(i).unwrap());
        let peer = SharedMemory::side_by_side(fds.zip([2 * page, page, 3 * page]).collect()).unwrap();
        let mut seen = vec![0u8; pattern.len()];
        peer.read_bytes(page + 5, &mut seen).unwrap();
        assert_eq!(seen, pattern);
        // Each memfd holds its own part: the middle one, mapped alone, starts where the range's third page does.
        let middle = SharedMemory::from_fd(owner.try_clone_piece_fd(1).unwrap(), page).unwrap();
        let mut first = [0u8; 8];
        middle.read_bytes(0, &mut first).unwrap();
        assert_eq!(first, pattern[page - 5..page + 3]);
        assert!(owner.try_clone_piece_fd(3).is_err());
        // Pieces in another order put other bytes at those offsets (the order is the peer's to keep).
        let fds = [2, 1, 0].map(|i| owner.try_clone_piece_fd(i).unwrap());
        let swapped = SharedMemory::side_by_side(fds.into_iter().zip([3 * page, page, 2 * page]).collect()).unwrap();
        swapped.read_bytes(page + 5, &mut seen).unwrap();
        assert_ne!(seen, pattern);
    }

    #[test]
    fn memfds_side_by_side_are_checked_one_by_one() {
        let page = rustix::param::page_size();
        let owner = SharedMemory::create_side_by_side("shm-side-check", &[page, page]).unwrap();
        let pair = |a: usize, b: usize| {
            vec![(owner.try_clone_piece_fd(0).unwrap(), a), (owner.try_clone_piece_fd(1).unwrap(), b)]
        };
        assert!(matches!(SharedMemory::side_by_side(pair(page, 2 * page)), Err(ShmError::SizeMismatch { .. })));
        assert!(matches!(SharedMemory::side_by_side(pair(page, 100)), Err(ShmError::NotWholePages { len: 100, .. })));
        assert!(matches!(SharedMemory::side_by_side(Vec::new()), Err(ShmError::ZeroLength { .. })));
        let unsealed = rustix::fs::memfd_create("unsealed", MemfdFlags::CLOEXEC).unwrap();
        rustix::fs::ftruncate(&unsealed, page as u64).unwrap();
        let mixed = vec![(owner.try_clone_piece_fd(0).unwrap(), page), (unsealed, page)];
        assert!(matches!(SharedMemory::side_by_side(mixed), Err(ShmError::NotSealed { .. })));
        assert!(matches!(SharedMemory::create_side_by_side("odd", &[page, 12]), Err(ShmError::NotWholePages { .. })));
        // One piece is an ordinary mapping.
        let one = SharedMemory::side_by_side(vec![(owner.try_clone_piece_fd(1).unwrap(), page)]).unwrap();
        assert!(one.try_clone_fd().is_ok() && one.pieces() == vec![(0, page)]);
    }

    #[test]
    fn view_that_does_not_fit_is_refused() {
        let shm = SharedMemory::create("shm-small", 16).unwrap();
        let err = SharedObject::<[AtomicU64; 4]>::new(shm).unwrap_err();
        assert!(matches!(err, ShmError::ViewDoesNotFit { len: 16, size: 32, .. }), "{err}");
    }
}
