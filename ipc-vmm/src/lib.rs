//! The VMM backend: memory from `cuMemCreate` with the POSIX-fd handle type, exported as a file descriptor
//! (`cuMemExportToShareableHandle`) that travels with `SCM_RIGHTS`, imported with
//! `cuMemImportFromShareableHandle`, then reserved, mapped and made accessible.
//!
//! ```no_run
//! use ipc_core::backend::Backend;
//! use gpu_ipc_driver::Context;
//! use ipc_vmm::Vmm;
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let ctx = Context::for_ordinal(0)?;
//! let region = Vmm::allocate(&ctx, 24_883_200)?; // rounded up to the 2 MiB granularity
//! let handle = Vmm::export(&region)?; // a new fd: send it with SCM_RIGHTS, then drop it
//! assert!(handle.fd.is_some());
//! # Ok(()) }
//! ```

#![forbid(unsafe_code)] // Only ipc-core's driver and sys layers may contain `unsafe`.

use gpu_ipc_driver::{
    Context, DeviceFeature, DeviceMemory, DevicePtr, DeviceSpan, HandleTypes, VmmAllocation, VmmGranularity,
    VmmMapping, address_range, pointer_allowed_handle_types, pointer_is_from_pool, pointer_is_legacy_ipc_capable,
};
use ipc_core::backend::{
    Backend, BackendError, ExistingExport, ExportedHandle, SharedRegion, SpanPiece, check_span, walk_allocations,
};
use ipc_core::wire::BackendKind;

/// The VMM backend.
#[derive(Debug, Clone, Copy, Default)]
pub struct Vmm;

/// A mapped VMM allocation, in the producer or in a consumer.
#[derive(Debug)]
pub struct VmmRegion {
    mapping: VmmMapping,
}

impl SharedRegion for VmmRegion {
    fn ptr(&self) -> DevicePtr {
        self.mapping.ptr()
    }
    fn len(&self) -> u64 {
        self.mapping.size()
    }
}

impl DeviceMemory for VmmRegion {
    fn span(&self) -> DeviceSpan<'_> {
        self.mapping.span()
    }
}

impl Backend for Vmm {
    type Exported = VmmRegion;
    type Imported = VmmRegion;
    type Context = Context;
    const KIND: BackendKind = BackendKind::Vmm;

    fn cuda_context(ctx: &Context) -> Option<&Context> {
        Some(ctx)
    }

    fn check_support(ctx: &Context) -> Result<(), BackendError> {
        let device = ctx.device();
        let unsupported = |reason: String| BackendError::Unsupported {
            backend: Self::KIND.name(),
            reason,
            fix: "use the legacy backend, or a driver and GPU with VMM POSIX-fd support".into(),
        };
        if !device.supports(DeviceFeature::VirtualMemoryManagement)? {
            return Err(unsupported(format!("device {} does not support virtual memory management", device.ordinal())));
        }
        if !device.supports(DeviceFeature::PosixFdHandles)? {
            return Err(unsupported(format!(
                "device {} cannot export memory as POSIX file descriptors",
                device.ordinal()
            )));
        }
        Ok(())
    }

    fn allocate(ctx: &Context, min_bytes: u64) -> Result<Self::Exported, BackendError> {
        Self::check_support(ctx)?;
        let size = VmmGranularity::for_device(ctx.device())?.round_up(min_bytes.max(1));
        let mapping = VmmMapping::map(VmmAllocation::create(ctx, size)?)?;
        Ok(VmmRegion { mapping })
    }

    fn zero(region: &Self::Exported, offset: u64, len: u64) -> Result<(), BackendError> {
        ipc_core::backend::zero_words(region, Self::KIND, offset, len)
    }

    fn export(region: &Self::Exported) -> Result<ExportedHandle, BackendError> {
        if region.mapping.allocations().nth(1).is_some() {
            return Err(BackendError::Unsupported {
                backend: Self::KIND.name(),
                reason: "this region maps several allocations side by side; one fd covers one allocation".into(),
                fix: "export it with export_existing, one piece per allocation".into(),
            });
        }
        let fd = region.mapping.allocation().export_fd()?;
        Ok(ExportedHandle { bytes: Vec::new(), fd: Some(fd), size: region.len() })
    }

    fn export_existing(ctx: &Context, ptr: DevicePtr, len: u64) -> Result<ExistingExport, BackendError> {
        let _entered = ctx.enter()?;
        let allowed = pointer_allowed_handle_types(ptr)?;
        if !HandleTypes::from_bits(allowed).contains(HandleTypes::POSIX_FD) {
            return Err(not_posix_fd_exportable(ptr, allowed));
        }
        // The attribute is only asked to name the cause; a driver that cannot answer it is not a refusal.
        if pointer_is_from_pool(ptr).unwrap_or(false) {
            // Its pool may allow POSIX fds, but its pointers are exported through the pool, never one by one (the
            // vmm-compat probe: cuMemExportToShareableHandle on such memory is CUDA_ERROR_INVALID_VALUE).
            return Err(BackendError::Unsupported {
                backend: Self::KIND.name(),
                reason: format!(
                    "memory at {ptr} comes from a stream-ordered memory pool (cuMemAllocFromPoolAsync), whose \
                     allocations are not exported one by one"
                ),
                fix: "allocate it with cuMemCreate and the POSIX-fd handle type (PyTorch: \
                      PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True), or export the pool itself"
                    .into(),
            });
        }
        // For VMM memory the driver reports the mapping of the one physical allocation that holds an address; an
        // expandable segment maps many of them side by side, so a range is walked allocation by allocation, each
        // checked as the first one was, retained (so it outlives its allocator here) and exported once.
        let walk = walk_allocations(Self::KIND.name(), ptr, len, |at| {
            if at != ptr {
                let allowed = pointer_allowed_handle_types(at)?;
                if !HandleTypes::from_bits(allowed).contains(HandleTypes::POSIX_FD) {
                    return Err(not_posix_fd_exportable(at, allowed));
                }
            }
            Ok(address_range(at)?)
        })?;
        let mut pieces = Vec::with_capacity(walk.allocations.len());
        let mut retained = Vec::with_capacity(walk.allocations.len());
        for (start, size) in walk.allocations {
            let allocation = VmmAllocation::retain(ctx, start, size)?;
            let fd = allocation.export_fd()?;
            pieces.push(SpanPiece {
                offset: start.0 - walk.base.0,
                handle: ExportedHandle { bytes: Vec::new(), fd: Some(fd), size },
            });
            retained.push(allocation);
        }
        if pieces.len() > 1 {
            tracing::debug!(%ptr, len, allocations = pieces.len(), "sharing a range over several VMM allocations");
        }
        Ok(ExistingExport { pieces, base: walk.base, offset: walk.offset, keep_alive: Some(Box::new(retained)) })
    }

    fn import(ctx: &Context, handle: ExportedHandle) -> Result<Self::Imported, BackendError> {
        let Some(fd) = handle.fd else {
            return Err(BackendError::MalformedHandle {
                backend: Self::KIND.name(),
                problem: "no file descriptor came with the handle; the producer uses the legacy backend".into(),
            });
        };
        let allocation = VmmAllocation::import_fd(ctx, std::os::fd::AsFd::as_fd(&fd), handle.size)?;
        // The imported handle keeps the memory alive; our copy of the fd is no longer needed.
        drop(fd);
        Ok(VmmRegion { mapping: VmmMapping::map(allocation)? })
    }

    fn import_span(ctx: &Context, pieces: Vec<SpanPiece>) -> Result<Self::Imported, BackendError> {
        check_span(Self::KIND.name(), &pieces)?;
        let mut allocations = Vec::with_capacity(pieces.len());
        for (index, piece) in pieces.into_iter().enumerate() {
            let Some(fd) = piece.handle.fd else {
                return Err(BackendError::MalformedHandle {
                    backend: Self::KIND.name(),
                    problem: format!("no file descriptor came with allocation {index} of the span"),
                });
            };
            // The imported handle keeps the memory alive; the fd closes at the end of this iteration.
            allocations.push(VmmAllocation::import_fd(ctx, std::os::fd::AsFd::as_fd(&fd), piece.handle.size)?);
        }
        Ok(VmmRegion { mapping: VmmMapping::map_side_by_side(allocations)? })
    }
}

/// Why memory that does not allow the POSIX-fd handle type cannot be exported by the vmm backend, and what to do.
fn not_posix_fd_exportable(ptr: DevicePtr, allowed: u64) -> BackendError {
    let legacy = pointer_is_legacy_ipc_capable(ptr).unwrap_or(false);
    let (reason, fix) = if legacy {
        (format!("memory at {ptr} is a cuMemAlloc allocation, which has no POSIX-fd handle"), "use the legacy backend")
    } else if allowed == 0 {
        (
            format!(
                "memory at {ptr} allows no shareable handle type (CU_POINTER_ATTRIBUTE_ALLOWED_HANDLE_TYPES is 0): \
                 it was made by cuMemCreate without CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, or it is host, \
                 managed or stream-ordered pool memory"
            ),
            "allocate it with cuMemCreate and the POSIX-fd handle type (PyTorch: \
             PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True)",
        )
    } else {
        (
            format!(
                "memory at {ptr} allows the handle types {allowed:#x} but not POSIX file descriptors ({:#x})",
                HandleTypes::POSIX_FD.bits()
            ),
            "allocate it with cuMemCreate and the POSIX-fd handle type",
        )
    };
    BackendError::Unsupported { backend: Vmm::KIND.name(), reason, fix: fix.into() }
}

/// The frame-sharing API on the vmm backend, so that an application names the backend once, in its dependency:
/// `ipc_vmm::Producer::create(...)` and `ipc_vmm::Consumer::attach(...)`, no generic parameter.
///
/// ```no_run
/// use std::time::Duration;
/// use gpu_ipc_driver::{Context, Stream};
/// use ipc_vmm::frames::{AttachOptions, FrameGeometry, PixelFormat, ProducerConfig, SyncStrategy};
///
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let ctx = Context::for_ordinal(0)?;
/// let stream = Stream::new(&ctx)?;
/// let geometry = FrameGeometry::new(3840, 2160, PixelFormat::Rgb8)?;
/// let config = ProducerConfig::new("/tmp/frames.sock", geometry, 4, SyncStrategy::GpuStreamOps);
/// let mut producer = ipc_vmm::Producer::create(&ctx, config)?;
/// let slot = producer.acquire(Some(&stream), Duration::from_secs(5))?;
/// // ... write the frame at `slot` with a kernel on `stream` ...
/// producer.publish(slot, Some(&stream))?;
///
/// // In another process:
/// let mut consumer = ipc_vmm::Consumer::attach(&ctx, "/tmp/frames.sock".as_ref(), &AttachOptions::default())?;
/// let frame = consumer.next_frame(Some(&stream), Duration::from_secs(5))?;
/// consumer.release(frame, Some(&stream))?;
/// # Ok(()) }
/// ```
pub mod frames {
    pub use ipc_core::frames::{AttachOptions, Frame, FrameError, ProducerConfig, SlotLease};
    pub use ipc_core::wire::{DType, FrameGeometry, PixelFormat, SlotLayout, SyncStrategy, TensorDesc};

    /// A producer of frames in memory of the vmm backend.
    pub type Producer = ipc_core::frames::Producer<super::Vmm>;
    /// A consumer of frames from a producer of the vmm backend.
    pub type Consumer = ipc_core::frames::Consumer<super::Vmm>;
}

pub use frames::{Consumer, Producer};
