//! Stream-ordered memory pools (`cuMemAllocAsync`, `cuMemPoolCreate`): allocations from them, the pool's export
//! as a POSIX file descriptor, and the per-pointer export that lets another process open one allocation of an
//! imported pool. Also [`address_range`], which says which allocation block an address belongs to.
//!
//! Pool memory is neither legacy-IPC memory nor a VMM handle: the compatibility probe (`gpu-ipc probe
//! vmm-compat`) records what each sharing route does with it.

use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::sync::Arc;

use super::address::DevicePtr;
use super::context::Context;
use super::device::HandleTypes;
use super::error::{DriverError, Result};
use super::loader::{Driver, entry, release_quietly};
use super::span::{DeviceMemory, DeviceSpan};
use super::stream::Stream;
use super::sys;

/// A memory pool: the device's default pool, one created with [`MemoryPool::create`], or one imported from
/// another process. Cloning shares it; a created or imported pool is destroyed when the last clone (and every
/// allocation made from it, which keeps a clone) is gone.
#[derive(Clone)]
pub struct MemoryPool {
    inner: Arc<PoolInner>,
}

struct PoolInner {
    ctx: Context,
    raw: sys::CUmemoryPool,
    /// False for the device's default pool, which the driver owns and must not be destroyed.
    owned: bool,
}

// SAFETY: a CUmemoryPool is a driver handle usable from any thread; the driver serialises access to it.
unsafe impl Send for PoolInner {}
// SAFETY: as above; methods only pass the handle to thread-safe driver calls.
unsafe impl Sync for PoolInner {}

impl std::fmt::Debug for MemoryPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemoryPool").field("raw", &self.inner.raw).field("owned", &self.inner.owned).finish()
    }
}

impl MemoryPool {
    /// The device's default pool (`cuDeviceGetDefaultMemPool`), the one `cuMemAllocAsync` uses.
    ///
    /// # Errors
    /// A failing `cuDeviceGetDefaultMemPool` (e.g. `CUDA_ERROR_NOT_SUPPORTED` without memory-pool support).
    pub fn device_default(ctx: &Context) -> Result<Self> {
        let _entered = ctx.enter()?;
        let d = Driver::get()?;
        let f = entry!(d, cuDeviceGetDefaultMemPool, "cuDeviceGetDefaultMemPool")?;
        let mut raw: sys::CUmemoryPool = std::ptr::null_mut();
        // SAFETY: the out-pointer is a valid local; the device came from cuDeviceGet.
        d.check("cuDeviceGetDefaultMemPool", unsafe { f(&mut raw, ctx.device().raw()) })?;
        Ok(Self { inner: Arc::new(PoolInner { ctx: ctx.clone(), raw, owned: false }) })
    }

    /// Creates a pool of pinned device memory on the context's device whose memory may be exported as the
    /// `handle_types` ([`HandleTypes::POSIX_FD`] to share it).
    ///
    /// # Errors
    /// A failing `cuMemPoolCreate` (e.g. `CUDA_ERROR_NOT_SUPPORTED` for a handle type the device lacks).
    pub fn create(ctx: &Context, handle_types: HandleTypes) -> Result<Self> {
        let _entered = ctx.enter()?;
        let d = Driver::get()?;
        let f = entry!(d, cuMemPoolCreate, "cuMemPoolCreate")?;
        let props = sys::CUmemPoolProps {
            allocType: sys::CU_MEM_ALLOCATION_TYPE_PINNED,
            handleTypes: handle_types.raw(),
            location: sys::CUmemLocation { type_: sys::CU_MEM_LOCATION_TYPE_DEVICE, id: ctx.device().ordinal() },
            win32SecurityAttributes: std::ptr::null_mut(),
            maxSize: 0,
            usage: 0,
            reserved: [0; 54],
        };
        let mut raw: sys::CUmemoryPool = std::ptr::null_mut();
        // SAFETY: the out-pointer is a valid local; `props` is fully initialised (reserved bytes zero).
        d.check("cuMemPoolCreate", unsafe { f(&mut raw, &props) })?;
        Ok(Self { inner: Arc::new(PoolInner { ctx: ctx.clone(), raw, owned: true }) })
    }

    /// Exports the pool as a new POSIX file descriptor (`cuMemPoolExportToShareableHandle`), owned by the caller.
    ///
    /// # Errors
    /// A failing `cuMemPoolExportToShareableHandle` (e.g. `CUDA_ERROR_INVALID_VALUE` for a pool created without
    /// the POSIX-fd handle type, such as the default pool).
    pub fn export_fd(&self) -> Result<OwnedFd> {
        let d = Driver::get()?;
        let f = entry!(d, cuMemPoolExportToShareableHandle, "cuMemPoolExportToShareableHandle")?;
        let mut fd: std::ffi::c_int = -1;
        // SAFETY: for the POSIX-fd handle type the driver writes one int (a new fd) into the valid local; flags 0.
        d.check("cuMemPoolExportToShareableHandle", unsafe {
            f(
                (&mut fd as *mut std::ffi::c_int).cast(),
                self.inner.raw,
                sys::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
                0,
            )
        })?;
        if fd < 0 {
            return Err(DriverError::InvalidArgument {
                function: "cuMemPoolExportToShareableHandle",
                problem: format!("the driver returned fd {fd}"),
            });
        }
        // SAFETY: the driver created this descriptor for us and nothing else owns it.
        Ok(unsafe { OwnedFd::from_raw_fd(fd) })
    }

    /// Imports a pool another process exported as a file descriptor (borrowed: the caller may close it after).
    /// An imported pool makes no allocations; it opens the exporter's with [`ImportedPoolPointer::import`].
    ///
    /// # Errors
    /// A failing `cuMemPoolImportFromShareableHandle`.
    pub fn import_fd(ctx: &Context, fd: BorrowedFd<'_>) -> Result<Self> {
        let _entered = ctx.enter()?;
        let d = Driver::get()?;
        let f = entry!(d, cuMemPoolImportFromShareableHandle, "cuMemPoolImportFromShareableHandle")?;
        let mut raw: sys::CUmemoryPool = std::ptr::null_mut();
        // SAFETY: for the POSIX-fd handle type the "handle" argument is the fd's value cast to a pointer; the fd
        // is open for the duration of the call (borrowed); the out-pointer is a valid local; flags 0.
        d.check("cuMemPoolImportFromShareableHandle", unsafe {
            f(
                &mut raw,
                fd.as_raw_fd() as isize as *mut std::ffi::c_void,
                sys::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
                0,
            )
        })?;
        Ok(Self { inner: Arc::new(PoolInner { ctx: ctx.clone(), raw, owned: true }) })
    }
}

impl Drop for PoolInner {
    fn drop(&mut self) {
        if !self.owned {
            return;
        }
        release_quietly("destroying a memory pool", |d| {
            let _entered = self.ctx.enter()?;
            let f = entry!(d, cuMemPoolDestroy, "cuMemPoolDestroy")?;
            // SAFETY: the pool was created or imported by us and is destroyed exactly once, here, after every
            // allocation from it (each holds a clone of the Arc) is gone.
            d.check("cuMemPoolDestroy", unsafe { f(self.raw) })
        });
    }
}

/// The 64 opaque bytes (`CUmemPoolPtrExportData`) that name one allocation of an exported pool.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct PoolPointerExport(pub [u8; 64]);

impl std::fmt::Debug for PoolPointerExport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "PoolPointerExport({:02x?}..)", &self.0[..8])
    }
}

/// A stream-ordered allocation (`cuMemAllocAsync` or `cuMemAllocFromPoolAsync`), complete when returned; freed
/// with `cuMemFreeAsync` on its own stream, waited for, on drop.
pub struct PoolAllocation {
    stream: Stream,
    ptr: DevicePtr,
    len: u64,
    _pool: Option<MemoryPool>,
}

impl std::fmt::Debug for PoolAllocation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PoolAllocation").field("ptr", &self.ptr).field("len", &self.len).finish()
    }
}

impl PoolAllocation {
    /// Allocates `len` bytes from `pool`, or with `cuMemAllocAsync` (the device's current pool, by default its
    /// default pool) when `pool` is `None`, on a new stream, and waits until the allocation is usable.
    ///
    /// # Errors
    /// Zero bytes; a failing `cuStreamCreate`, `cuMemAllocAsync` / `cuMemAllocFromPoolAsync` or
    /// `cuStreamSynchronize`.
    pub fn alloc(ctx: &Context, pool: Option<&MemoryPool>, len: u64) -> Result<Self> {
        let function = if pool.is_some() { "cuMemAllocFromPoolAsync" } else { "cuMemAllocAsync" };
        if len == 0 {
            return Err(DriverError::InvalidArgument { function, problem: "zero bytes".into() });
        }
        let stream = Stream::new(ctx)?;
        let d = Driver::get()?;
        let mut raw: sys::CUdeviceptr = 0;
        match pool {
            Some(pool) => {
                let f = entry!(d, cuMemAllocFromPoolAsync, "cuMemAllocFromPoolAsync")?;
                // SAFETY: the out-pointer is a valid local; the pool and stream are alive for the call.
                d.check(function, unsafe { f(&mut raw, len as usize, pool.inner.raw, stream.raw()) })?;
            }
            None => {
                let f = entry!(d, cuMemAllocAsync, "cuMemAllocAsync")?;
                // SAFETY: the out-pointer is a valid local; the stream is alive for the call.
                d.check(function, unsafe { f(&mut raw, len as usize, stream.raw()) })?;
            }
        }
        // From here on Drop frees it.
        let allocation = Self { stream, ptr: DevicePtr(raw), len, _pool: pool.cloned() };
        allocation.stream.synchronize()?;
        Ok(allocation)
    }

    /// The allocation's device address.
    pub fn ptr(&self) -> DevicePtr {
        self.ptr
    }

    /// Its size in bytes.
    pub fn len(&self) -> u64 {
        self.len
    }

    /// Always false: zero-byte allocations are refused.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The data another process passes to [`ImportedPoolPointer::import`] (`cuMemPoolExportPointer`).
    ///
    /// # Errors
    /// A failing `cuMemPoolExportPointer` (e.g. for an allocation of a pool that is not exportable).
    pub fn export_pointer(&self) -> Result<PoolPointerExport> {
        let d = Driver::get()?;
        let f = entry!(d, cuMemPoolExportPointer, "cuMemPoolExportPointer")?;
        let mut data = sys::CUmemPoolPtrExportData { reserved: [0; 64] };
        // SAFETY: the out-pointer is a valid local; the driver validates the device address.
        d.check("cuMemPoolExportPointer", unsafe { f(&mut data, self.ptr.0) })?;
        Ok(PoolPointerExport(data.reserved))
    }
}

impl DeviceMemory for PoolAllocation {
    fn span(&self) -> DeviceSpan<'_> {
        DeviceSpan::of_owner(self.ptr, self.len)
    }
}

impl Drop for PoolAllocation {
    fn drop(&mut self) {
        release_quietly("freeing a stream-ordered allocation", |d| {
            let _entered = self.stream.context().enter()?;
            let f = entry!(d, cuMemFreeAsync, "cuMemFreeAsync")?;
            // SAFETY: `ptr` came from cuMemAllocAsync/cuMemAllocFromPoolAsync and is freed exactly once, here.
            d.check("cuMemFreeAsync", unsafe { f(self.ptr.0, self.stream.raw()) })?;
            // The pool (dropped after this) must not be destroyed while the free is still queued.
            self.stream.synchronize()
        });
    }
}

/// Another process's pool allocation, opened through an imported [`MemoryPool`]; freed (`cuMemFree`) on drop,
/// which must happen before the exporter frees it.
pub struct ImportedPoolPointer {
    pool: MemoryPool,
    ptr: DevicePtr,
}

impl std::fmt::Debug for ImportedPoolPointer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ImportedPoolPointer").field("ptr", &self.ptr).finish()
    }
}

impl ImportedPoolPointer {
    /// Opens the allocation `data` names in `pool` (imported from the exporter with [`MemoryPool::import_fd`]).
    ///
    /// # Errors
    /// A failing `cuMemPoolImportPointer`.
    pub fn import(pool: &MemoryPool, data: PoolPointerExport) -> Result<Self> {
        let _entered = pool.inner.ctx.enter()?;
        let d = Driver::get()?;
        let f = entry!(d, cuMemPoolImportPointer, "cuMemPoolImportPointer")?;
        let mut raw: sys::CUdeviceptr = 0;
        let mut share = sys::CUmemPoolPtrExportData { reserved: data.0 };
        // SAFETY: the out-pointer and the export data are valid locals; the pool is alive for the call.
        d.check("cuMemPoolImportPointer", unsafe { f(&mut raw, pool.inner.raw, &mut share) })?;
        Ok(Self { pool: pool.clone(), ptr: DevicePtr(raw) })
    }

    /// The address of the imported allocation in this process.
    pub fn ptr(&self) -> DevicePtr {
        self.ptr
    }

    /// The imported allocation from its address to the end of its block, as the driver reports it
    /// (`cuMemGetAddressRange`; asked on each call, since the import itself does not say how large it is).
    ///
    /// # Errors
    /// A failing `cuMemGetAddressRange`.
    pub fn span(&self) -> Result<DeviceSpan<'_>> {
        let (base, size) = address_range(self.ptr)?;
        let end = base.offset(size);
        if self.ptr < base || self.ptr >= end {
            return Err(DriverError::InvalidArgument {
                function: "cuMemGetAddressRange",
                problem: format!("the imported pointer {} lies outside its block {base}+{size}", self.ptr),
            });
        }
        Ok(DeviceSpan::of_owner(self.ptr, end.0 - self.ptr.0))
    }
}

impl Drop for ImportedPoolPointer {
    fn drop(&mut self) {
        release_quietly("freeing an imported pool allocation", |d| {
            let _entered = self.pool.inner.ctx.enter()?;
            let f = entry!(d, cuMemFree_v2, "cuMemFree")?;
            // SAFETY: the pointer was imported by `import` and is freed exactly once, here (cuMemFree is the
            // documented way to release an imported pool pointer).
            d.check("cuMemFree", unsafe { f(self.ptr.0) })
        });
    }
}

/// The allocation block that contains `ptr`: its base address and size (`cuMemGetAddressRange`).
///
/// # Errors
/// A failing `cuMemGetAddressRange` (e.g. `CUDA_ERROR_NOT_FOUND` for an address no allocation contains).
pub fn address_range(ptr: DevicePtr) -> Result<(DevicePtr, u64)> {
    let d = Driver::get()?;
    let f = entry!(d, cuMemGetAddressRange_v2, "cuMemGetAddressRange")?;
    let (mut base, mut size): (sys::CUdeviceptr, usize) = (0, 0);
    // SAFETY: both out-pointers are valid locals; the driver validates the address.
    d.check("cuMemGetAddressRange", unsafe { f(&mut base, &mut size, ptr.0) })?;
    Ok((DevicePtr(base), size as u64))
}
