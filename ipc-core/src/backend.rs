//! The backend trait: how one allocation of GPU memory is made exportable, exported, and imported in another
//! process. `ipc-legacy` and `ipc-vmm` implement it; the ring and everything above are generic over it.

use std::os::fd::OwnedFd;

use crate::shm::SharedMemory;
use crate::wire::BackendKind;
use gpu_ipc_driver::{Context, DeviceMemory, DevicePtr, DeviceSpan, DriverError};

/// What travels from the exporting process to an importer for one allocation.
#[derive(Debug)]
pub struct ExportedHandle {
    /// Opaque handle bytes (the 64-byte `CUipcMemHandle` for legacy IPC; empty for fd-based backends).
    pub bytes: Vec<u8>,
    /// The file descriptor, for fd-based backends (sent with `SCM_RIGHTS`, then closed by the sender).
    pub fd: Option<OwnedFd>,
    /// The allocation's size in bytes, as the importer must map it.
    pub size: u64,
}

/// Most allocations one span may be made of: each is one fd, held by the owner while the span is shared, in
/// flight on the socket and held by an importer while it maps them (so, with the usual limit of 1024 open fds, at
/// most half of it): 512 of PyTorch's 20 MiB expandable-segment allocations are 10 GiB.
pub const MAX_SPAN_ALLOCATIONS: usize = 512;

/// One allocation of a span that several allocations make side by side, as an importer maps it.
#[derive(Debug)]
pub struct SpanPiece {
    /// Where the allocation starts, in bytes from the start of the span.
    pub offset: u64,
    /// What an importer imports; its `size` is the allocation's.
    pub handle: ExportedHandle,
}

/// Memory that another allocator made (not [`Backend::allocate`]), exported in place by
/// [`Backend::export_existing`]: what an importer maps is the whole of every allocation that holds the range, side
/// by side as they are mapped here (one span; [`Backend::import_span`]).
#[derive(Debug)]
pub struct ExistingExport {
    /// The allocations that hold the range, in address order, each exported once, with its offset from `base`:
    /// one when the range lies inside one allocation; several for memory mapped side by side (PyTorch's
    /// expandable segments). Each `handle.size` is its allocation's (the part of it that is mapped here).
    pub pieces: Vec<SpanPiece>,
    /// Start of the first allocation in this process: the same allocations exported twice have the same base.
    pub base: DevicePtr,
    /// Where the range starts, from `base`.
    pub offset: u64,
    /// What keeps the allocations alive for importers even if their allocator frees them here (VMM: retained
    /// allocation handles; host backend: the mappings); dropped with the export.
    pub keep_alive: Option<Box<dyn std::any::Any + Send + Sync>>,
}

impl ExistingExport {
    /// Bytes of the span: every allocation's, side by side.
    pub fn span_bytes(&self) -> u64 {
        self.pieces.iter().map(|piece| piece.handle.size).sum()
    }
}

/// Memory a backend allocated or imported: a device address range that stays valid while the value lives.
pub trait SharedRegion: Send + Sync {
    /// Start of the range, as kernels in this process address it.
    fn ptr(&self) -> DevicePtr;
    /// Size in bytes.
    fn len(&self) -> u64;
    /// True for an empty range (backends never make one).
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// How this process reaches a region's bytes.
#[derive(Debug, Clone, Copy)]
pub enum MemoryAccess<'a> {
    /// Host memory the CPU reaches with atomics (the host backend).
    Host(&'a SharedMemory),
    /// Device memory, reached through kernels.
    Device(DeviceSpan<'a>),
}

/// A backend's region whose bytes this process can reach, in host or device memory: every backend's regions
/// (legacy, vmm, host). What the toolkit's work queue lives in.
pub trait ReachableRegion: SharedRegion + Sync {
    /// How this process reaches it.
    fn access(&self) -> MemoryAccess<'_>;
}

impl<T: DeviceMemory + SharedRegion + Sync> ReachableRegion for T {
    fn access(&self) -> MemoryAccess<'_> {
        MemoryAccess::Device(self.span())
    }
}

/// A way of sharing device memory between processes.
pub trait Backend: Send + Sync + 'static {
    /// What allocations are made in: a CUDA [`Context`] for the GPU backends, nothing
    /// for the host backend.
    type Context: Clone + Send + Sync;
    /// The producer's allocation.
    type Exported: SharedRegion;
    /// A consumer's mapping of it.
    type Imported: SharedRegion;

    /// Which backend this is: its wire code and its name (`B::KIND.name()`, as `--backend` spells it).
    const KIND: BackendKind;

    /// The CUDA context behind `ctx`; `None` for the host backend, which therefore runs only the CPU sync strategies.
    fn cuda_context(ctx: &Self::Context) -> Option<&Context>;

    /// Checks, without allocating, that the context's device supports this backend; the error names the missing
    /// capability.
    ///
    /// # Errors
    /// [`BackendError::Unsupported`] with the reason and the fix.
    fn check_support(ctx: &Self::Context) -> Result<(), BackendError>;

    /// Allocates at least `min_bytes` of exportable memory (rounded up as the backend requires).
    ///
    /// # Errors
    /// Unsupported device, or the driver's allocation error.
    fn allocate(ctx: &Self::Context, min_bytes: u64) -> Result<Self::Exported, BackendError>;

    /// Sets `len` bytes of `region` from byte `offset` to zero (synchronous), in the context it was allocated in.
    ///
    /// # Errors
    /// A range outside the region, or the driver's error.
    fn zero(region: &Self::Exported, offset: u64, len: u64) -> Result<(), BackendError>;

    /// Makes what an importer needs. Fd-based backends create a new fd on each call: send it, then drop it.
    ///
    /// # Errors
    /// The driver's export error, mapped to a typed error where the cause is known.
    fn export(region: &Self::Exported) -> Result<ExportedHandle, BackendError>;

    /// Exports, in place and without a copy, memory that another allocator made: the allocation that holds the
    /// `len` bytes at `ptr` (e.g. a tensor of PyTorch's caching allocator). Legacy: a `cuMemAlloc` allocation
    /// (`CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE`); vmm: a `cuMemCreate` allocation made with the POSIX-fd
    /// handle type (`CU_POINTER_ATTRIBUTE_ALLOWED_HANDLE_TYPES`), retained by address; host backend: a region made by
    /// its `allocate`. A range over several allocations mapped side by side (PyTorch's expandable segments) is
    /// exported as one piece per allocation where the backend can map them side by side again in an importer
    /// ([`import_span`](Self::import_span): vmm, host backend); legacy refuses it ([`walk_allocations`] walks them).
    ///
    /// # Errors
    /// [`BackendError::Unsupported`] naming why this memory cannot be exported by this backend and what to do
    /// instead; the driver's error.
    fn export_existing(ctx: &Self::Context, ptr: DevicePtr, len: u64) -> Result<ExistingExport, BackendError>;

    /// Maps memory exported by another process.
    ///
    /// # Errors
    /// A handle of the wrong shape, or the driver's import error.
    fn import(ctx: &Self::Context, handle: ExportedHandle) -> Result<Self::Imported, BackendError>;

    /// Maps the allocations of a span another process exported ([`ExistingExport::pieces`]) side by side, as one
    /// contiguous range: what [`import`](Self::import) does for one allocation. The pieces are checked first
    /// ([`check_span`]). This default imports a span of one allocation and refuses more (legacy: one
    /// `cuIpcOpenMemHandle` maps one allocation wherever the driver puts it).
    ///
    /// # Errors
    /// [`BackendError::MalformedHandle`] for pieces that overlap, leave gaps or are too many;
    /// [`BackendError::Unsupported`] where the backend cannot map several; the import errors.
    fn import_span(ctx: &Self::Context, pieces: Vec<SpanPiece>) -> Result<Self::Imported, BackendError> {
        check_span(Self::KIND.name(), &pieces)?;
        let count = pieces.len();
        match pieces.into_iter().next() {
            Some(piece) if count == 1 => Self::import(ctx, piece.handle),
            _ => Err(BackendError::Unsupported {
                backend: Self::KIND.name(),
                reason: format!("{count} allocations cannot be mapped side by side by this backend"),
                fix: "use the vmm backend".into(),
            }),
        }
    }
}

/// A backend on a real GPU: a CUDA [`Context`], and regions that lend their memory to kernels and copies as
/// [`DeviceSpan`]s ([`DeviceMemory`]). Implemented for every backend that fits; the host
/// fake does not (its "device memory" is host memory).
pub trait GpuBackend: Backend<Context = Context, Exported: DeviceMemory, Imported: DeviceMemory> {}

impl<B> GpuBackend for B
where
    B: Backend<Context = Context>,
    B::Exported: DeviceMemory,
    B::Imported: DeviceMemory,
{
}

/// Why a backend could not do what was asked.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum BackendError {
    /// The device (or driver, or this memory) does not support the operation.
    #[error("{backend} backend: {reason}; {fix}")]
    Unsupported {
        /// The backend's name.
        backend: &'static str,
        /// What is missing.
        reason: String,
        /// What to do instead.
        fix: String,
    },
    /// The handle received does not fit this backend.
    #[error("{backend} backend: malformed handle: {problem}")]
    MalformedHandle {
        /// The backend's name.
        backend: &'static str,
        /// What is wrong with it.
        problem: String,
    },
    /// A driver call failed.
    #[error(transparent)]
    Driver(#[from] DriverError),
    /// An operating-system call failed (shared memory of the host backend).
    #[error("{operation}: {source}")]
    Os {
        /// What was being done.
        operation: &'static str,
        /// The OS error.
        source: Box<dyn std::error::Error + Send + Sync>,
    },
}

/// [`Backend::zero`] for the GPU backends: `len` bytes (whole 64-bit words) of `region` from byte `offset`, with a
/// synchronous copy of zeros.
///
/// # Errors
/// [`BackendError::Unsupported`] for a length that is not whole words, a range outside the region, or the driver's
/// error.
pub fn zero_words<M: DeviceMemory>(
    region: &M,
    backend: BackendKind,
    offset: u64,
    len: u64,
) -> Result<(), BackendError> {
    let words =
        usize::try_from(len / 8).ok().filter(|_| len.is_multiple_of(8)).ok_or_else(|| BackendError::Unsupported {
            backend: backend.name(),
            reason: format!("zeroing {len} bytes: only whole 64-bit words are zeroed"),
            fix: "zero a multiple of 8 bytes".into(),
        })?;
    Ok(region.span().write(offset, &vec![0u64; words])?)
}

/// Where the `len` bytes at `ptr` start inside the allocation `base .. base + size` that holds `ptr`, for
/// [`Backend::export_existing`] of a backend that exports one allocation per handle (legacy): the range must lie
/// inside it. Backends that map several side by side walk them instead ([`walk_allocations`]).
///
/// # Errors
/// [`BackendError::Unsupported`] for an empty range, or one that runs past the end of the allocation (it spans
/// several allocations, which no single export covers): `why_one` says why this backend exports one, with the fix.
pub fn offset_in_allocation(
    backend: &'static str,
    ptr: DevicePtr,
    len: u64,
    (base, size): (DevicePtr, u64),
    (why_one, fix): (&str, &str),
) -> Result<u64, BackendError> {
    let unsupported = |reason: String, fix: &str| BackendError::Unsupported { backend, reason, fix: fix.to_owned() };
    if len == 0 {
        return Err(unsupported(format!("nothing to export at {ptr}: the range is empty"), "share at least one byte"));
    }
    let offset = ptr.0.checked_sub(base.0).filter(|offset| *offset < size).ok_or_else(|| {
        unsupported(
            format!("{ptr} lies outside the allocation {base}+{size} the driver reports for it"),
            "pass an address inside the allocation",
        )
    })?;
    if offset.checked_add(len).is_none_or(|end| end > size) {
        return Err(unsupported(
            format!(
                "the {len} bytes at {ptr} run past the end of the allocation that holds them ({base}+{size}): they span \
                 more than one allocation, and {why_one}"
            ),
            fix,
        ));
    }
    Ok(offset)
}

/// The allocations that hold a range, as [`walk_allocations`] found them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AllocationWalk {
    /// Start of the first allocation.
    pub base: DevicePtr,
    /// Where the range starts, from `base`.
    pub offset: u64,
    /// Every allocation the range touches, in address order, side by side: (start, size).
    pub allocations: Vec<(DevicePtr, u64)>,
}

/// The allocations, mapped side by side, that hold the `len` bytes at `ptr`, for [`Backend::export_existing`] of
/// a backend that exports a range over several ([`Backend::import_span`]): `holding(address)` says which
/// allocation holds an address, as (start, size) (VMM: `cuMemGetAddressRange`, which reports the one physical
/// allocation mapped there), or why none does; it is asked at `ptr`, then at the end of each allocation until the
/// range is covered.
///
/// # Errors
/// [`BackendError::Unsupported`] for an empty range, an address outside what `holding` reports for it, a range
/// that runs into memory `holding` does not know (not mapped, or another kind) or over more than
/// [`MAX_SPAN_ALLOCATIONS`] allocations; the first lookup's own error.
pub fn walk_allocations(
    backend: &'static str,
    ptr: DevicePtr,
    len: u64,
    mut holding: impl FnMut(DevicePtr) -> Result<(DevicePtr, u64), BackendError>,
) -> Result<AllocationWalk, BackendError> {
    let unsupported = |reason: String, fix: &str| BackendError::Unsupported { backend, reason, fix: fix.to_owned() };
    if len == 0 {
        return Err(unsupported(format!("nothing to export at {ptr}: the range is empty"), "share at least one byte"));
    }
    let end = ptr.0.checked_add(len).ok_or_else(|| {
        unsupported(format!("the {len} bytes at {ptr} run past the end of the address space"), "pass a real range")
    })?;
    let (base, size) = holding(ptr)?;
    let offset = ptr.0.checked_sub(base.0).filter(|offset| *offset < size).ok_or_else(|| {
        unsupported(
            format!("{ptr} lies outside the allocation {base}+{size} reported for it"),
            "pass an address inside the allocation",
        )
    })?;
    let mut allocations = vec![(base, size)];
    let mut next = base.0.saturating_add(size);
    while next < end {
        if allocations.len() >= MAX_SPAN_ALLOCATIONS {
            return Err(unsupported(
                format!("the {len} bytes at {ptr} span more than {MAX_SPAN_ALLOCATIONS} allocations"),
                "share the tensor in parts (each over fewer allocations)",
            ));
        }
        let at = DevicePtr(next);
        let (start, size) = holding(at).map_err(|error| {
            unsupported(
                format!(
                    "the {len} bytes at {ptr} run past the memory mapped there: at {at}, {} bytes in, no shareable \
                     allocation ({error})",
                    next - ptr.0
                ),
                "share only memory that is allocated (the tensor's own bytes)",
            )
        })?;
        if start != at || size == 0 {
            return Err(unsupported(
                format!(
                    "at {at}, inside the range, the allocation reported is {start}+{size}, not one that starts there"
                ),
                "share a range of allocations mapped side by side",
            ));
        }
        allocations.push((start, size));
        next = next.saturating_add(size);
    }
    Ok(AllocationWalk { base, offset, allocations })
}

/// Checks the pieces of a span a peer sent ([`SpanPiece`]): at least one, at most [`MAX_SPAN_ALLOCATIONS`], each
/// at least one byte, the first at offset 0 and each where the one before ends (no overlap, no gap). Returns the
/// span's size.
///
/// # Errors
/// [`BackendError::MalformedHandle`] naming the piece that breaks a rule.
pub fn check_span(backend: &'static str, pieces: &[SpanPiece]) -> Result<u64, BackendError> {
    let malformed = |problem: String| BackendError::MalformedHandle { backend, problem };
    if pieces.is_empty() || pieces.len() > MAX_SPAN_ALLOCATIONS {
        return Err(malformed(format!("a span of {} allocations: between 1 and {MAX_SPAN_ALLOCATIONS}", pieces.len())));
    }
    let mut end = 0u64;
    for (index, piece) in pieces.iter().enumerate() {
        let size = piece.handle.size;
        if size == 0 {
            return Err(malformed(format!("allocation {index} of the span has 0 bytes")));
        }
        if piece.offset != end {
            let how = if piece.offset < end { "overlaps the one before" } else { "leaves a gap after the one before" };
            return Err(malformed(format!(
                "allocation {index} of the span is at offset {}, where the allocations before end at {end}: it {how}",
                piece.offset
            )));
        }
        end = end.checked_add(size).ok_or_else(|| malformed(format!("allocation {index} ends past 2^64 bytes")))?;
    }
    Ok(end)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    /// Allocations side by side at 0x1000 (sizes 0x100, 0x200, 0x100), then a hole, then one at 0x1500.
    fn table(at: DevicePtr) -> Result<(DevicePtr, u64), BackendError> {
        let allocations = [(0x1000u64, 0x100u64), (0x1100, 0x200), (0x1300, 0x100), (0x1500, 0x100)];
        allocations.iter().find(|(start, size)| at.0 >= *start && at.0 < start + size).map_or_else(
            || Err(BackendError::Unsupported { backend: "t", reason: format!("nothing at {at}"), fix: String::new() }),
            |&(start, size)| Ok((DevicePtr(start), size)),
        )
    }

    #[test]
    fn a_walk_finds_every_allocation_a_range_touches_and_nothing_more() {
        let inside = walk_allocations("t", DevicePtr(0x1010), 0x20, table).unwrap();
        assert_eq!(
            inside,
            AllocationWalk { base: DevicePtr(0x1000), offset: 0x10, allocations: vec![(DevicePtr(0x1000), 0x100)] }
        );
        // Up to the last byte of the second allocation: two; one byte more: three.
        let two = walk_allocations("t", DevicePtr(0x10f0), 0x210, table).unwrap();
        assert_eq!(two.allocations, vec![(DevicePtr(0x1000), 0x100), (DevicePtr(0x1100), 0x200)]);
        assert_eq!(two.offset, 0xf0);
        let three = walk_allocations("t", DevicePtr(0x10f0), 0x211, table).unwrap();
        assert_eq!(three.allocations.len(), 3);
        // Starting in the middle one: the walk starts there.
        let later = walk_allocations("t", DevicePtr(0x1200), 0x180, table).unwrap();
        assert_eq!((later.base, later.offset, later.allocations.len()), (DevicePtr(0x1100), 0x100, 2));
    }

    #[test]
    fn a_walk_refuses_holes_empty_ranges_and_too_many_allocations_with_the_reason() {
        let reason = |e: BackendError| match e {
            BackendError::Unsupported { reason, .. } => reason,
            other => panic!("{other}"),
        };
        let hole = reason(walk_allocations("t", DevicePtr(0x1300), 0x101, table).unwrap_err());
        assert!(hole.contains("run past the memory mapped there") && hole.contains("at 0x1400"), "{hole}");
        assert!(reason(walk_allocations("t", DevicePtr(0x1000), 0, table).unwrap_err()).contains("empty"));
        assert!(
            reason(walk_allocations("t", DevicePtr(u64::MAX - 4), 8, table).unwrap_err()).contains("address space")
        );
        // A lookup that reports an allocation not holding the address.
        let liar = |_at: DevicePtr| Ok((DevicePtr(0x1000), 0x10));
        assert!(reason(walk_allocations("t", DevicePtr(0x2000), 8, liar).unwrap_err()).contains("lies outside"));
        // ... or one that does not start where the one before ended.
        let mut calls = 0;
        let overlapping = |at: DevicePtr| {
            calls += 1;
            Ok(if calls == 1 { (at, 0x100) } else { (DevicePtr(at.0 - 0x10), 0x100) })
        };
        assert!(
            reason(walk_allocations("t", DevicePtr(0x1000), 0x200, overlapping).unwrap_err())
                .contains("not one that starts there")
        );
        // Endless allocations of one byte: refused past the limit.
        let tiny = |at: DevicePtr| Ok((at, 1));
        let many = reason(walk_allocations("t", DevicePtr(0x1000), 4096, tiny).unwrap_err());
        assert!(many.contains(&format!("more than {MAX_SPAN_ALLOCATIONS} allocations")), "{many}");
        assert_eq!(
            walk_allocations("t", DevicePtr(0x1000), MAX_SPAN_ALLOCATIONS as u64, tiny).unwrap().allocations.len(),
            MAX_SPAN_ALLOCATIONS
        );
    }

    fn piece(offset: u64, size: u64) -> SpanPiece {
        SpanPiece { offset, handle: ExportedHandle { bytes: Vec::new(), fd: None, size } }
    }

    #[test]
    fn a_peers_pieces_must_follow_one_another_from_zero() {
        assert_eq!(check_span("t", &[piece(0, 4096), piece(4096, 8192), piece(12_288, 4096)]).unwrap(), 16_384);
        let problem = |pieces: &[SpanPiece]| match check_span("t", pieces).unwrap_err() {
            BackendError::MalformedHandle { problem, .. } => problem,
            other => panic!("{other}"),
        };
        assert!(problem(&[piece(0, 4096), piece(2048, 4096)]).contains("overlaps"));
        assert!(problem(&[piece(0, 4096), piece(8192, 4096)]).contains("gap"));
        assert!(problem(&[piece(4096, 4096)]).contains("gap"), "the first starts at 0");
        assert!(problem(&[piece(0, 0)]).contains("0 bytes"));
        assert!(problem(&[]).contains("between 1 and"));
        assert!(problem(&[piece(0, u64::MAX), piece(u64::MAX, 2)]).contains("2^64"));
        let too_many: Vec<SpanPiece> = (0..=MAX_SPAN_ALLOCATIONS as u64).map(|i| piece(i, 1)).collect();
        assert!(problem(&too_many).contains("between 1 and"));
    }

    #[test]
    fn a_range_past_one_allocation_is_refused_with_the_backends_reason_and_fix() {
        let err =
            offset_in_allocation("legacy", DevicePtr(0x1080), 0x100, (DevicePtr(0x1000), 0x100), ("why", "fix it"))
                .unwrap_err()
                .to_string();
        assert!(err.contains("more than one allocation, and why") && err.ends_with("fix it"), "{err}");
        assert_eq!(
            offset_in_allocation("legacy", DevicePtr(0x1080), 0x80, (DevicePtr(0x1000), 0x100), ("", "")).unwrap(),
            0x80
        );
    }
}
