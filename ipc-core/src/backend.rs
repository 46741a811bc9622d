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

/// Memory that another allocator made (not [`Backend::allocate`]), exported in place by
/// [`Backend::export_existing`]: what an importer maps is the whole allocation that holds the range.
#[derive(Debug)]
pub struct ExistingExport {
    /// What an importer passes to [`Backend::import`]; its `size` is the allocation's (the part of it that is
    /// mapped here), not the range's.
    pub handle: ExportedHandle,
    /// Start of that allocation in this process: the same allocation exported twice has the same base.
    pub base: DevicePtr,
    /// Where the range starts inside the allocation.
    pub offset: u64,
    /// What keeps the allocation alive for importers even if its allocator frees it here (VMM: a retained
    /// allocation handle; host fake: the mapping); dropped with the export.
    pub keep_alive: Option<Box<dyn std::any::Any + Send + Sync>>,
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
    /// for the host-memory fake.
    type Context: Clone + Send + Sync;
    /// The producer's allocation.
    type Exported: SharedRegion;
    /// A consumer's mapping of it.
    type Imported: SharedRegion;

    /// Which backend this is: its wire code and its name (`B::KIND.name()`, as `--backend` spells it).
    const KIND: BackendKind;

    /// The CUDA context behind `ctx`; `None` for the host fake, which therefore runs only the CPU sync strategies.
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
    /// handle type (`CU_POINTER_ATTRIBUTE_ALLOWED_HANDLE_TYPES`), retained by address; host fake: a region made by
    /// its `allocate`. The range must lie inside one allocation.
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
    /// An operating-system call failed (shared memory of the host fake).
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
/// [`Backend::export_existing`]: the one check every backend makes before exporting a range in place.
///
/// # Errors
/// [`BackendError::Unsupported`] for an empty range, or one that runs past the end of the allocation (it spans
/// several allocations, which no single export covers).
pub fn offset_in_allocation(
    backend: &'static str,
    ptr: DevicePtr,
    len: u64,
    base: DevicePtr,
    size: u64,
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
                 more than one allocation, and one export covers one allocation"
            ),
            "share each allocation's part separately, or allocate the buffer in one piece",
        ));
    }
    Ok(offset)
}
