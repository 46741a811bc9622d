//! What went wrong while creating, opening or mapping shared memory.

use rustix::io::Errno;

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
