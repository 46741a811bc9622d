//! A host backend, so the ring, the protocol and the frame API run end to end on machines without a
//! GPU (CI). "Device memory" is a sealed memfd mapped `MAP_SHARED`; its "device pointer" is the host address of
//! the mapping; export passes the memfd with `SCM_RIGHTS`, like the VMM backend passes its fd.
//!
//! Nothing here can run a stream: the CPU sync strategies work with it, and so does `IpcEvent`, through
//! [`HostEvent`]s that stand in for CUDA IPC events (the fake's "device work" is done when the call that made it
//! returns, so every event is complete). [`set_ipc_events_openable`] (or the environment variable
//! [`UNOPENABLE_EVENTS_ENV`]) makes importing them fail as `cuIpcOpenEventHandle` fails in a container with its own
//! IPC namespace, so that the consumer's way around that runs in CI.

use std::sync::{Arc, Mutex, PoisonError, Weak};

use crate::backend::{
    Backend, BackendError, ExistingExport, ExportedHandle, MemoryAccess, ReachableRegion, SharedRegion, SpanPiece,
    check_span, walk_allocations,
};
use crate::shm::SharedMemory;
use crate::wire::BackendKind;
use gpu_ipc_driver::{DevicePtr, DriverError};

/// The host backend: "device" memory in shared host memory (a memfd), so that the API runs without a GPU.
#[derive(Debug, Clone, Copy, Default)]
pub struct Host;

/// The host backend's type before it was [`Host`].
#[deprecated(since = "0.1.0", note = "renamed `Host`")]
pub type HostFake = Host;

/// A mapping of fake "device" memory (in the exporter or an importer).
#[derive(Debug, Clone)]
pub struct HostRegion {
    memory: Arc<SharedMemory>,
}

impl HostRegion {
    /// The shared memory behind the region.
    pub fn memory(&self) -> &Arc<SharedMemory> {
        &self.memory
    }

    fn offset_of(&self, ptr: DevicePtr, bytes: usize) -> Result<usize, BackendError> {
        let base = self.memory.as_ptr() as u64;
        ptr.0
            .checked_sub(base)
            .and_then(|o| usize::try_from(o).ok())
            .filter(|o| o.checked_add(bytes).is_some_and(|end| end <= self.memory.len()))
            .ok_or_else(|| BackendError::MalformedHandle {
                backend: Host::KIND.name(),
                problem: format!("{bytes} bytes at {ptr} are outside the region"),
            })
    }

    /// Writes `src` at the "device address" `ptr` (a frame's or a slot's), as a kernel would.
    ///
    /// # Errors
    /// An address range outside the region.
    pub fn write(&self, ptr: DevicePtr, src: &[u8]) -> Result<(), BackendError> {
        let offset = self.offset_of(ptr, src.len())?;
        self.memory.write_bytes(offset, src).map_err(|e| BackendError::Os { operation: "writing", source: e.into() })
    }

    /// Reads `dst.len()` bytes at the "device address" `ptr`.
    ///
    /// # Errors
    /// An address range outside the region.
    pub fn read(&self, ptr: DevicePtr, dst: &mut [u8]) -> Result<(), BackendError> {
        let offset = self.offset_of(ptr, dst.len())?;
        self.memory.read_bytes(offset, dst).map_err(|e| BackendError::Os { operation: "reading", source: e.into() })
    }
}

impl ReachableRegion for HostRegion {
    fn access(&self) -> MemoryAccess<'_> {
        MemoryAccess::Host(self.memory())
    }
}

impl SharedRegion for HostRegion {
    fn ptr(&self) -> DevicePtr {
        DevicePtr(self.memory.as_ptr() as u64)
    }
    fn len(&self) -> u64 {
        self.memory.len() as u64
    }
}

/// Every region [`Host::allocate`] and [`Host::allocate_side_by_side`] made that is still alive: the fake's
/// stand-in for what the driver knows about the allocations of a process, so that [`Backend::export_existing`] can
/// find the one that holds an address (each memfd of a region made side by side is an allocation of its own).
static ALLOCATIONS: Mutex<Vec<Weak<SharedMemory>>> = Mutex::new(Vec::new());

/// One allocation the fake knows: the memfd `piece` of `memory`, at `start`, `size` bytes.
struct HeldAllocation {
    memory: Arc<SharedMemory>,
    piece: usize,
    start: DevicePtr,
    size: u64,
}

/// The live allocation that holds `ptr`, if any (dead entries are dropped on the way).
fn allocation_holding(ptr: DevicePtr) -> Option<HeldAllocation> {
    let mut allocations = ALLOCATIONS.lock().unwrap_or_else(PoisonError::into_inner);
    allocations.retain(|weak| weak.strong_count() > 0);
    allocations.iter().filter_map(Weak::upgrade).find_map(|memory| {
        let base = memory.as_ptr() as u64;
        let within = ptr.0.checked_sub(base).filter(|offset| *offset < memory.len() as u64)?;
        let (piece, (offset, len)) =
            memory.pieces().into_iter().enumerate().find(|(_, (offset, len))| within < (offset + len) as u64)?;
        Some(HeldAllocation { start: DevicePtr(base + offset as u64), size: len as u64, piece, memory })
    })
}

impl Host {
    /// Allocates one region made of several allocations side by side, one per size (each a whole number of pages),
    /// in one contiguous range: the host's model of what PyTorch's expandable segments make on a GPU (many
    /// `cuMemCreate` allocations mapped one after the other), so that sharing a range over several allocations
    /// ([`Backend::export_existing`], [`Backend::import_span`]) runs without a GPU.
    ///
    /// # Errors
    /// No size, a size that is not a whole number of pages, or the OS's error.
    pub fn allocate_side_by_side(_ctx: &HostContext, sizes: &[u64]) -> Result<HostRegion, BackendError> {
        let sizes = sizes.iter().map(|&size| usize::try_from(size)).collect::<Result<Vec<_>, _>>().map_err(|_| {
            BackendError::Unsupported {
                backend: Self::KIND.name(),
                reason: "a size does not fit this address space".into(),
                fix: "use smaller allocations".into(),
            }
        })?;
        let memory = SharedMemory::create_side_by_side("gpu-ipc-fake-segment", &sizes)
            .map_err(|source| BackendError::Os { operation: "creating fake device memory", source: source.into() })?;
        let memory = Arc::new(memory);
        ALLOCATIONS.lock().unwrap_or_else(PoisonError::into_inner).push(Arc::downgrade(&memory));
        Ok(HostRegion { memory })
    }
}

/// The fake needs no context.
#[derive(Debug, Clone, Copy, Default)]
pub struct HostContext;

impl Backend for Host {
    type Context = HostContext;
    type Exported = HostRegion;
    type Imported = HostRegion;
    const KIND: BackendKind = BackendKind::Host;

    fn cuda_context(_ctx: &HostContext) -> Option<&gpu_ipc_driver::Context> {
        None
    }

    fn check_support(_ctx: &HostContext) -> Result<(), BackendError> {
        Ok(())
    }

    fn allocate(_ctx: &HostContext, min_bytes: u64) -> Result<Self::Exported, BackendError> {
        let len = usize::try_from(min_bytes.max(1)).map_err(|_| BackendError::Unsupported {
            backend: Self::KIND.name(),
            reason: format!("{min_bytes} bytes do not fit this address space"),
            fix: "use a smaller ring".into(),
        })?;
        let memory = SharedMemory::create("gpu-ipc-fake-frames", len)
            .map_err(|source| BackendError::Os { operation: "creating fake device memory", source: source.into() })?;
        let memory = Arc::new(memory);
        ALLOCATIONS.lock().unwrap_or_else(PoisonError::into_inner).push(Arc::downgrade(&memory));
        Ok(HostRegion { memory })
    }

    fn export_existing(_ctx: &HostContext, ptr: DevicePtr, len: u64) -> Result<ExistingExport, BackendError> {
        let mut found = Vec::new();
        let walk = walk_allocations(Self::KIND.name(), ptr, len, |at| {
            let held = allocation_holding(at).ok_or_else(|| BackendError::Unsupported {
                backend: Self::KIND.name(),
                reason: format!("no live region made by Host::allocate holds the address {at}"),
                fix: "share memory the host backend allocated (Host::allocate)".into(),
            })?;
            // Regions the fake made separately may lie side by side by chance (mmap places them as it likes): the
            // fake walks only the allocations of one region, its model of one reserved range, so that what it
            // refuses does not depend on where the kernel put things.
            if let Some(first) = found.first().map(|first: &HeldAllocation| &first.memory)
                && !Arc::ptr_eq(first, &held.memory)
            {
                return Err(BackendError::Unsupported {
                    backend: Self::KIND.name(),
                    reason: format!("{at} is in another region than the range's start"),
                    fix: "share a range inside one region".into(),
                });
            }
            let reported = (held.start, held.size);
            found.push(held);
            Ok(reported)
        })?;
        // Each successful lookup of the walk is one of its allocations, in order.
        let mut pieces = Vec::with_capacity(found.len());
        let mut kept = Vec::with_capacity(found.len());
        for held in found {
            let fd = held.memory.try_clone_piece_fd(held.piece).map_err(|source| BackendError::Os {
                operation: "duplicating the fake memory fd",
                source: source.into(),
            })?;
            let handle = ExportedHandle { bytes: Vec::new(), fd: Some(fd), size: held.size };
            pieces.push(SpanPiece { offset: held.start.0 - walk.base.0, handle });
            kept.push(held.memory);
        }
        Ok(ExistingExport { pieces, base: walk.base, offset: walk.offset, keep_alive: Some(Box::new(kept)) })
    }

    fn zero(region: &Self::Exported, offset: u64, len: u64) -> Result<(), BackendError> {
        // Regions are fresh memfds, which the kernel fills with zeros; only the range is checked.
        if offset.checked_add(len).is_none_or(|end| end > region.len()) {
            return Err(BackendError::Unsupported {
                backend: Self::KIND.name(),
                reason: format!("{len} bytes at {offset} lie outside a region of {} bytes", region.len()),
                fix: "zero a range inside the region".into(),
            });
        }
        Ok(())
    }

    fn export(region: &Self::Exported) -> Result<ExportedHandle, BackendError> {
        let fd = region.memory.try_clone_fd().map_err(|source| BackendError::Os {
            operation: "duplicating the fake memory fd",
            source: source.into(),
        })?;
        Ok(ExportedHandle { bytes: Vec::new(), fd: Some(fd), size: region.len() })
    }

    fn import(_ctx: &HostContext, handle: ExportedHandle) -> Result<Self::Imported, BackendError> {
        let Some(fd) = handle.fd else {
            return Err(BackendError::MalformedHandle {
                backend: Self::KIND.name(),
                problem: "no file descriptor came with the handle".into(),
            });
        };
        let len = usize::try_from(handle.size).map_err(|_| BackendError::MalformedHandle {
            backend: Self::KIND.name(),
            problem: format!("size {} does not fit this address space", handle.size),
        })?;
        let memory = SharedMemory::from_fd(fd, len)
            .map_err(|source| BackendError::Os { operation: "mapping fake device memory", source: source.into() })?;
        Ok(HostRegion { memory: Arc::new(memory) })
    }

    fn import_span(_ctx: &HostContext, pieces: Vec<SpanPiece>) -> Result<Self::Imported, BackendError> {
        check_span(Self::KIND.name(), &pieces)?;
        let mut memfds = Vec::with_capacity(pieces.len());
        for (index, piece) in pieces.into_iter().enumerate() {
            let malformed = |problem: String| BackendError::MalformedHandle { backend: Self::KIND.name(), problem };
            let fd = piece.handle.fd.ok_or_else(|| malformed(format!("no fd came with allocation {index}")))?;
            let len = usize::try_from(piece.handle.size)
                .map_err(|_| malformed(format!("allocation {index}: {} bytes", piece.handle.size)))?;
            memfds.push((fd, len));
        }
        let memory = SharedMemory::side_by_side(memfds)
            .map_err(|source| BackendError::Os { operation: "mapping fake device memory", source: source.into() })?;
        Ok(HostRegion { memory: Arc::new(memory) })
    }
}

/// Set to `map-failed` in a process's environment, makes every [`HostEvent::open_ipc`] of that process fail with
/// [`DriverError::IpcEventUnreachable`], as `cuIpcOpenEventHandle` fails (`CUDA_ERROR_MAP_FAILED`) in a container
/// with its own IPC namespace; for tests that spawn consumers as processes.
pub const UNOPENABLE_EVENTS_ENV: &str = "GPU_IPC_FAKE_IPC_EVENTS";

std::thread_local! {
    /// Whether [`HostEvent::open_ipc`] succeeds on this thread: `None` while not set (the environment decides).
    static EVENTS_OPENABLE: std::cell::Cell<Option<bool>> = const { std::cell::Cell::new(None) };
}

/// Test knob of the fake backend: `false` makes every later [`HostEvent::open_ipc`] on the calling thread fail with
/// [`DriverError::IpcEventUnreachable`], as `cuIpcOpenEventHandle` does in a container with its own IPC namespace
/// (Docker's and Kubernetes' default); `true` undoes it. Per thread, so that consumers on threads of one test
/// process can stand in for consumers inside and outside a container; it overrides [`UNOPENABLE_EVENTS_ENV`].
pub fn set_ipc_events_openable(openable: bool) {
    EVENTS_OPENABLE.with(|cell| cell.set(Some(openable)));
}

fn ipc_events_openable() -> bool {
    EVENTS_OPENABLE
        .with(std::cell::Cell::get)
        .unwrap_or_else(|| std::env::var_os(UNOPENABLE_EVENTS_ENV).is_none_or(|v| v != "map-failed"))
}

/// The fake's stand-in for a CUDA IPC event. Work on the fake's "device" is done when the call that made it
/// returns (there are no streams), so a `HostEvent` is complete from the moment it is recorded: what it carries is
/// the handshake of the `IpcEvent` strategy (handles offered, opened or not), not a wait.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HostEvent;

impl HostEvent {
    /// The 64 bytes every host event is exported as.
    pub const HANDLE: [u8; 64] = *b"gpu-ipc host fake IPC event: complete once recorded.............";

    /// Opens an exported host event, as [`Event::open_ipc`](gpu_ipc_driver::Event::open_ipc) opens a CUDA one.
    ///
    /// # Errors
    /// [`DriverError::IpcEventUnreachable`] while [`set_ipc_events_openable`]`(false)` (or
    /// [`UNOPENABLE_EVENTS_ENV`]) simulates a separate IPC namespace; [`DriverError::InvalidArgument`] for bytes
    /// that are not a host event's handle.
    pub fn open_ipc(handle: &[u8; 64]) -> Result<Self, DriverError> {
        if !ipc_events_openable() {
            return Err(DriverError::IpcEventUnreachable);
        }
        if *handle != Self::HANDLE {
            return Err(DriverError::InvalidArgument {
                function: "HostEvent::open_ipc",
                problem: "the handle is not a host backend event's".into(),
            });
        }
        Ok(Self)
    }
}
