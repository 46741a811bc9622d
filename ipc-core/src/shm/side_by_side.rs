//! Several sealed memfds mapped one after the other in one reserved address range: the host's model of VMM
//! allocations mapped side by side (as PyTorch's expandable segments map them). One contiguous range to read and
//! write; its pieces are sent one by one.

use std::os::fd::OwnedFd;
use std::ptr::NonNull;

use rustix::io::Errno;
use rustix::mm::{MapFlags, ProtFlags};

use super::error::ShmError;
use super::memory::{SharedMemory, SidePiece, check_received, sealed_memfd};

impl SharedMemory {
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
