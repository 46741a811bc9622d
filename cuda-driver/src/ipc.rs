//! Legacy CUDA IPC: memory handles of `cuMemAlloc` allocations, and pointer capability queries.

use super::address::DevicePtr;
use super::context::Context;
use super::error::{DriverError, Result};
use super::loader::{Driver, entry, release_quietly};
use super::pool::address_range;
use super::span::owned_device_range;
use super::sys;

/// The 64 opaque bytes that name a `cuMemAlloc` allocation in another process.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct IpcMemHandle(pub [u8; 64]);

impl std::fmt::Debug for IpcMemHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "IpcMemHandle({:02x?}..)", &self.0[..8])
    }
}

impl IpcMemHandle {
    /// The handle of the allocation that contains `ptr` (`cuIpcGetMemHandle`).
    ///
    /// # Errors
    /// A failing `cuIpcGetMemHandle`; on VMM (`cuMemCreate`) memory it is `CUDA_ERROR_INVALID_VALUE`.
    pub fn of(ptr: DevicePtr) -> Result<Self> {
        let d = Driver::get()?;
        let f = entry!(d, cuIpcGetMemHandle, "cuIpcGetMemHandle")?;
        let mut handle = sys::CUipcMemHandle { reserved: [0; 64] };
        // SAFETY: the out-pointer is a valid local; the driver validates the device address.
        d.check("cuIpcGetMemHandle", unsafe { f(&mut handle, ptr.0) })?;
        Ok(Self(handle.reserved.map(|b| b as u8)))
    }
}

/// Another process's allocation, opened with `cuIpcOpenMemHandle`; closed on drop.
///
/// Its length is what the driver says the mapped allocation spans (`cuMemGetAddressRange`), never what the peer
/// claims, so its [`DeviceSpan`](super::span::DeviceSpan) covers exactly the mapped memory.
pub struct IpcMapping {
    ctx: Context,
    ptr: DevicePtr,
    len: u64,
}

impl IpcMapping {
    /// Opens an allocation exported by another process (with lazy peer access, so it also works across GPUs).
    ///
    /// # Errors
    /// A failing `cuIpcOpenMemHandle`: `CUDA_ERROR_INVALID_CONTEXT`/`CUDA_ERROR_INVALID_VALUE` when the handle
    /// comes from this same process or its exporter freed the memory, `CUDA_ERROR_MAP_FAILED` and others; a
    /// failing `cuMemGetAddressRange` on the mapping (which is then closed again).
    pub fn open(ctx: &Context, handle: IpcMemHandle) -> Result<Self> {
        let _entered = ctx.enter()?;
        let d = Driver::get()?;
        let f = entry!(d, cuIpcOpenMemHandle_v2, "cuIpcOpenMemHandle")?;
        let mut ptr: sys::CUdeviceptr = 0;
        let h = sys::CUipcMemHandle { reserved: handle.0.map(|b| b as std::ffi::c_char) };
        // SAFETY: the out-pointer is a valid local; the handle is passed by value; the context is current.
        d.check("cuIpcOpenMemHandle", unsafe { f(&mut ptr, h, sys::CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS) })?;
        // From here on Drop closes it.
        let mut mapping = Self { ctx: ctx.clone(), ptr: DevicePtr(ptr), len: 0 };
        let (base, size) = address_range(mapping.ptr)?;
        // The span runs from the returned address to the end of the mapped block it lies in.
        let end = base.offset(size);
        if mapping.ptr < base || mapping.ptr >= end {
            return Err(DriverError::InvalidArgument {
                function: "cuMemGetAddressRange",
                problem: format!(
                    "the IPC mapping at {} lies outside the block {base}+{size} reported for it",
                    mapping.ptr
                ),
            });
        }
        mapping.len = end.0 - mapping.ptr.0;
        Ok(mapping)
    }
}

owned_device_range!(IpcMapping, "the imported allocation (the mapped block, as the driver reports it)");

impl Drop for IpcMapping {
    fn drop(&mut self) {
        release_quietly("closing an IPC mapping", |d| {
            let _entered = self.ctx.enter()?;
            let f = entry!(d, cuIpcCloseMemHandle, "cuIpcCloseMemHandle")?;
            // SAFETY: the mapping was opened in `open` and is closed exactly once, here.
            d.check("cuIpcCloseMemHandle", unsafe { f(self.ptr.0) })
        });
    }
}

/// Whether the allocation containing `ptr` can be exported with `cuIpcGetMemHandle`
/// (`CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE`).
///
/// # Errors
/// A failing `cuPointerGetAttribute`.
pub fn pointer_is_legacy_ipc_capable(ptr: DevicePtr) -> Result<bool> {
    let d = Driver::get()?;
    let f = entry!(d, cuPointerGetAttribute, "cuPointerGetAttribute")?;
    let mut value: i32 = 0;
    // SAFETY: this attribute writes one int into the valid local.
    d.check("cuPointerGetAttribute", unsafe {
        f((&mut value as *mut i32).cast(), sys::CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE, ptr.0)
    })?;
    Ok(value != 0)
}

/// The handle types the allocation containing `ptr` may be exported as (a `CU_MEM_HANDLE_TYPE_*` bit mask,
/// `CU_POINTER_ATTRIBUTE_ALLOWED_HANDLE_TYPES`); 0 for `cuMemAlloc` memory.
///
/// # Errors
/// A failing `cuPointerGetAttribute`.
pub fn pointer_allowed_handle_types(ptr: DevicePtr) -> Result<u64> {
    let d = Driver::get()?;
    let f = entry!(d, cuPointerGetAttribute, "cuPointerGetAttribute")?;
    let mut value: u64 = 0;
    // SAFETY: this attribute writes one 64-bit mask into the valid local.
    d.check("cuPointerGetAttribute", unsafe {
        f((&mut value as *mut u64).cast(), sys::CU_POINTER_ATTRIBUTE_ALLOWED_HANDLE_TYPES, ptr.0)
    })?;
    Ok(value)
}

/// Whether the memory at `ptr` comes from a stream-ordered memory pool (`cuMemAllocAsync`,
/// `cuMemAllocFromPoolAsync`: `CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE` is not null). Such memory is shared by
/// exporting its pool ([`MemoryPool::export_fd`](super::MemoryPool::export_fd)), never by pointer alone.
///
/// # Errors
/// A failing `cuPointerGetAttribute`.
pub fn pointer_is_from_pool(ptr: DevicePtr) -> Result<bool> {
    let d = Driver::get()?;
    let f = entry!(d, cuPointerGetAttribute, "cuPointerGetAttribute")?;
    let mut pool: sys::CUmemoryPool = std::ptr::null_mut();
    // SAFETY: this attribute writes one `CUmemoryPool` (a pointer-sized handle) into the valid local.
    d.check("cuPointerGetAttribute", unsafe {
        f((&mut pool as *mut sys::CUmemoryPool).cast(), sys::CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE, ptr.0)
    })?;
    Ok(!pool.is_null())
}
