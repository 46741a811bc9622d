//! The backend trait: how one allocation of GPU memory is made exportable, exported, and imported in another
//! process. `ipc-legacy` and `ipc-vmm` implement it; the ring and everything above are generic over it.

use std::os::fd::OwnedFd;

use crate::driver::{Context, DeviceMemory, DevicePtr, DriverError};
use crate::wire::BackendKind;

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

/// Memory a backend allocated or imported: a device address range that stays valid while the value lives.
pub trait SharedRegion: Send {
    /// Start of the range, as kernels in this process address it.
    fn ptr(&self) -> DevicePtr;
    /// Size in bytes.
    fn len(&self) -> u64;
    /// True for an empty range (backends never make one).
    fn is_empty(&self) -> bool {
        self.len() == 0
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

    /// Makes what an importer needs. Fd-based backends create a new fd on each call: send it, then drop it.
    ///
    /// # Errors
    /// The driver's export error, mapped to a typed error where the cause is known.
    fn export(region: &Self::Exported) -> Result<ExportedHandle, BackendError>;

    /// Maps memory exported by another process.
    ///
    /// # Errors
    /// A handle of the wrong shape, or the driver's import error.
    fn import(ctx: &Self::Context, handle: ExportedHandle) -> Result<Self::Imported, BackendError>;
}

/// A backend on a real GPU: a CUDA [`Context`], and regions that lend their memory to kernels and copies as
/// [`DeviceSpan`](crate::driver::DeviceSpan)s ([`DeviceMemory`]). Implemented for every backend that fits; the host
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
