//! The legacy CUDA IPC backend: memory from `cuMemAlloc`, exported with `cuIpcGetMemHandle` as 64 opaque bytes
//! and opened in another process with `cuIpcOpenMemHandle`.
//!
//! ```no_run
//! use ipc_core::backend::Backend;
//! use gpu_ipc_driver::Context;
//! use ipc_legacy::Legacy;
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let ctx = Context::for_ordinal(0)?;
//! let region = Legacy::allocate(&ctx, 24_883_200)?; // rounded up to 2 MiB (`ALLOCATION_GRANULE`)
//! let handle = Legacy::export(&region)?; // 64 bytes: send them to the consumer
//! assert_eq!(handle.bytes.len(), 64);
//! # Ok(()) }
//! ```

#![forbid(unsafe_code)] // Only ipc-core's driver and sys layers may contain `unsafe`.

use gpu_ipc_driver::{
    Context, DeviceBuffer, DeviceFeature, DeviceMemory, DevicePtr, DeviceSpan, IpcMapping, IpcMemHandle, address_range,
    pointer_allowed_handle_types, pointer_is_from_pool, pointer_is_legacy_ipc_capable,
};
use ipc_core::backend::{
    Backend, BackendError, ExistingExport, ExportedHandle, SharedRegion, SpanPiece, offset_in_allocation,
};
use ipc_core::wire::BackendKind;

/// The legacy IPC backend.
#[derive(Debug, Clone, Copy, Default)]
pub struct Legacy;

/// [`Legacy::allocate`] rounds every allocation up to a multiple of this (2 MiB, the GPU's large page). An
/// importer's `cuIpcOpenMemHandle` and `cuIpcCloseMemHandle` of a `cuMemAlloc` allocation whose size is not a
/// multiple of it take time in proportion to its size: on an H200 (driver 580, 2026-11-29) 146 ms to open and 44 ms
/// to close 22 GiB + 256 bytes, against 1.1 ms and 0.3 ms for 22 GiB (docs/weights.md, "Legacy backend: open time").
pub const ALLOCATION_GRANULE: u64 = 2 << 20;

/// A `cuMemAlloc` allocation the producer owns.
#[derive(Debug)]
pub struct LegacyAllocation {
    buffer: DeviceBuffer,
}

impl SharedRegion for LegacyAllocation {
    fn ptr(&self) -> DevicePtr {
        self.buffer.ptr()
    }
    fn len(&self) -> u64 {
        self.buffer.len()
    }
}

impl DeviceMemory for LegacyAllocation {
    fn span(&self) -> DeviceSpan<'_> {
        self.buffer.span()
    }
}

/// A consumer's mapping of a legacy allocation.
#[derive(Debug)]
pub struct LegacyImport {
    mapping: IpcMapping,
    len: u64,
}

impl SharedRegion for LegacyImport {
    fn ptr(&self) -> DevicePtr {
        self.mapping.ptr()
    }
    fn len(&self) -> u64 {
        self.len
    }
}

impl DeviceMemory for LegacyImport {
    fn span(&self) -> DeviceSpan<'_> {
        // `import` checked that the size the producer sent fits the mapping the driver reports.
        self.mapping.span().prefix(self.len)
    }
}

impl Legacy {
    /// Exports any device address with a legacy handle, after checking that its allocation allows it.
    ///
    /// # Errors
    /// [`BackendError::Unsupported`] for memory that is not legacy-IPC capable (VMM memory names the vmm
    /// backend as the fix), or the driver's error.
    pub fn export_ptr(ptr: DevicePtr) -> Result<[u8; 64], BackendError> {
        if !pointer_is_legacy_ipc_capable(ptr)? {
            let vmm = pointer_allowed_handle_types(ptr).unwrap_or(0) != 0;
            let pool = !vmm && pointer_is_from_pool(ptr).unwrap_or(false);
            let (reason, fix) = if vmm {
                (
                    format!(
                        "memory at {ptr} is a VMM (cuMemCreate) allocation, which cannot be exported as a legacy handle"
                    ),
                    "use the vmm backend",
                )
            } else if pool {
                (
                    format!(
                        "memory at {ptr} comes from a stream-ordered memory pool (cuMemAllocAsync), which has no \
                         legacy IPC handle"
                    ),
                    "allocate it with cuMemAlloc (PyTorch: the default caching allocator, not cudaMallocAsync)",
                )
            } else {
                (
                    format!("memory at {ptr} is not legacy-IPC capable (not from cuMemAlloc: host, managed or other)"),
                    "allocate it with cuMemAlloc",
                )
            };
            return Err(BackendError::Unsupported { backend: Self::KIND.name(), reason, fix: fix.into() });
        }
        Ok(IpcMemHandle::of(ptr)?.0)
    }
}

impl Backend for Legacy {
    type Exported = LegacyAllocation;
    type Imported = LegacyImport;
    type Context = Context;
    const KIND: BackendKind = BackendKind::Legacy;

    fn cuda_context(ctx: &Context) -> Option<&Context> {
        Some(ctx)
    }

    fn check_support(ctx: &Context) -> Result<(), BackendError> {
        let device = ctx.device();
        if !device.supports(DeviceFeature::UnifiedAddressing)? {
            return Err(BackendError::Unsupported {
                backend: Self::KIND.name(),
                reason: format!("device {} has no unified addressing, which legacy IPC requires", device.ordinal()),
                fix: "use a 64-bit Linux system with a supported GPU".into(),
            });
        }
        Ok(())
    }

    fn allocate(ctx: &Context, min_bytes: u64) -> Result<Self::Exported, BackendError> {
        Self::check_support(ctx)?;
        let bytes =
            min_bytes.max(1).checked_next_multiple_of(ALLOCATION_GRANULE).ok_or_else(|| BackendError::Unsupported {
                backend: Self::KIND.name(),
                reason: format!("{min_bytes} bytes cannot be allocated"),
                fix: "ask for less memory".into(),
            })?;
        Ok(LegacyAllocation { buffer: DeviceBuffer::alloc(ctx, bytes)? })
    }

    fn zero(region: &Self::Exported, offset: u64, len: u64) -> Result<(), BackendError> {
        ipc_core::backend::zero_words(region, Self::KIND, offset, len)
    }

    fn export(region: &Self::Exported) -> Result<ExportedHandle, BackendError> {
        let bytes = Self::export_ptr(region.ptr())?;
        Ok(ExportedHandle { bytes: bytes.to_vec(), fd: None, size: region.len() })
    }

    fn export_existing(ctx: &Context, ptr: DevicePtr, len: u64) -> Result<ExistingExport, BackendError> {
        let _entered = ctx.enter()?;
        let bytes = Self::export_ptr(ptr)?;
        // The handle names the whole cuMemAlloc allocation; an importer maps all of it, at its base.
        let (base, size) = address_range(ptr)?;
        // cuIpcOpenMemHandle maps a handle's allocation wherever the importer's driver puts it, so allocations
        // that lie side by side here cannot be put side by side there: a range must lie inside one.
        let one = (
            "cuIpcGetMemHandle covers one cuMemAlloc allocation, which an importer maps wherever its driver chooses, \
             so several cannot be mapped side by side there",
            "use the vmm backend with memory made by cuMemCreate (PyTorch: \
             PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True), which shares a range over several allocations, or \
             share each allocation's part separately",
        );
        let offset = offset_in_allocation(Self::KIND.name(), ptr, len, (base, size), one)?;
        Ok(ExistingExport {
            pieces: vec![SpanPiece { offset: 0, handle: ExportedHandle { bytes: bytes.to_vec(), fd: None, size } }],
            base,
            offset,
            keep_alive: None,
        })
    }

    fn import(ctx: &Context, handle: ExportedHandle) -> Result<Self::Imported, BackendError> {
        let bytes: [u8; 64] = handle.bytes.as_slice().try_into().map_err(|_| BackendError::MalformedHandle {
            backend: Self::KIND.name(),
            problem: format!("a legacy handle is 64 bytes, got {}", handle.bytes.len()),
        })?;
        if handle.fd.is_some() {
            return Err(BackendError::MalformedHandle {
                backend: Self::KIND.name(),
                problem: "a file descriptor came with a legacy handle; the producer uses the vmm backend".into(),
            });
        }
        let mapping = IpcMapping::open(ctx, IpcMemHandle(bytes)).map_err(|e| {
            if e.is_invalid_context() {
                // What the driver answers for a handle this same process exported: say so, rather than leave the
                // caller to look for a context problem it does not have.
                BackendError::Unsupported {
                    backend: Self::KIND.name(),
                    reason: format!(
                        "{e}: the driver's answer to a handle exported by this same process (cuIpcOpenMemHandle \
                         opens only another process's memory), or to one whose exporter has freed it"
                    ),
                    fix: "open it from another process, or use the vmm backend, which also works within one process"
                        .into(),
                }
            } else {
                e.into()
            }
        })?;
        if handle.size > mapping.len() {
            return Err(BackendError::MalformedHandle {
                backend: Self::KIND.name(),
                problem: format!(
                    "the producer says the allocation has {} bytes, but the driver mapped {}",
                    handle.size,
                    mapping.len()
                ),
            });
        }
        Ok(LegacyImport { mapping, len: handle.size })
    }
}

/// The frame-sharing API on the legacy backend, so that an application names the backend once, in its dependency:
/// `ipc_legacy::Producer::create(...)` and `ipc_legacy::Consumer::attach(...)`, no generic parameter.
///
/// ```no_run
/// use std::time::Duration;
/// use gpu_ipc_driver::{Context, Stream};
/// use ipc_legacy::frames::{AttachOptions, FrameGeometry, PixelFormat, ProducerConfig, SyncStrategy};
///
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let ctx = Context::for_ordinal(0)?;
/// let stream = Stream::new(&ctx)?;
/// let geometry = FrameGeometry::new(3840, 2160, PixelFormat::Rgb8)?;
/// let config = ProducerConfig::new("/tmp/frames.sock", geometry, 4, SyncStrategy::GpuStreamOps);
/// let mut producer = ipc_legacy::Producer::create(&ctx, config)?;
/// let slot = producer.acquire(Some(&stream), Duration::from_secs(5))?;
/// // ... write the frame at `slot` with a kernel on `stream` ...
/// producer.publish(slot, Some(&stream))?;
///
/// // In another process:
/// let mut consumer = ipc_legacy::Consumer::attach(&ctx, "/tmp/frames.sock".as_ref(), &AttachOptions::default())?;
/// let frame = consumer.next_frame(Some(&stream), Duration::from_secs(5))?;
/// consumer.release(frame, Some(&stream))?;
/// # Ok(()) }
/// ```
pub mod frames {
    pub use ipc_core::frames::{AttachOptions, Frame, FrameError, ProducerConfig, SlotLease};
    pub use ipc_core::wire::{DType, FrameGeometry, PixelFormat, SlotLayout, SyncStrategy, TensorDesc};

    /// A producer of frames in memory of the legacy backend.
    pub type Producer = ipc_core::frames::Producer<super::Legacy>;
    /// A consumer of frames from a producer of the legacy backend.
    pub type Consumer = ipc_core::frames::Consumer<super::Legacy>;
}

pub use frames::{Consumer, Producer};
