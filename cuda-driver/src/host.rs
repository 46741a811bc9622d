//! Page-locked host memory: allocations from the driver, and registration of memory we mapped ourselves.

use std::sync::Arc;

use super::address::{DevicePtr, RegistrableHostMemory};
use super::context::Context;
use super::error::{DriverError, Result};
use super::loader::{Driver, entry, release_quietly};
use super::span::owned_device_range;
use super::span::{DeviceMemory, DeviceSpan};
use super::stream::{Stream, WaitCondition};
use super::sys;

/// Page-locked host memory from `cuMemAllocHost`, mapped for the device; freed on drop.
///
/// Its bytes are lent to Rust code as slices ([`PinnedHostBuffer::as_slice`]), so it is deliberately *not*
/// [`DeviceMemory`]: no safe operation lets the GPU touch it. [`PinnedHostBuffer::device_ptr`] is only an address
/// (for pointer queries, or for the `unsafe` raw copies when no slice is borrowed). Host memory the GPU and the CPU
/// share goes through [`HostRegistration`], whose CPU side is atomics only.
pub struct PinnedHostBuffer {
    ctx: Context,
    ptr: *mut u8,
    len: usize,
}

// SAFETY: the buffer is plain host memory exclusively owned by this value; access goes through &self/&mut self.
unsafe impl Send for PinnedHostBuffer {}
// SAFETY: shared references only give out `&[u8]`, which is Sync.
unsafe impl Sync for PinnedHostBuffer {}

impl PinnedHostBuffer {
    /// Allocates `len` bytes of page-locked host memory, zero-filled.
    ///
    /// # Errors
    /// A failing `cuMemAllocHost`; zero bytes is rejected.
    pub fn alloc(ctx: &Context, len: usize) -> Result<Self> {
        if len == 0 {
            return Err(DriverError::InvalidArgument { function: "cuMemAllocHost", problem: "zero bytes".into() });
        }
        let _entered = ctx.enter()?;
        let d = Driver::get()?;
        let f = entry!(d, cuMemAllocHost_v2, "cuMemAllocHost")?;
        let mut ptr: *mut std::ffi::c_void = std::ptr::null_mut();
        // SAFETY: the out-pointer is a valid local; the context is current.
        d.check("cuMemAllocHost", unsafe { f(&mut ptr, len) })?;
        let ptr = ptr.cast::<u8>();
        // SAFETY: the driver returned `len` writable bytes at `ptr`; zeroing makes every byte initialised.
        unsafe { std::ptr::write_bytes(ptr, 0, len) };
        Ok(Self { ctx: ctx.clone(), ptr, len })
    }

    /// The bytes.
    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: `ptr` is valid for `len` initialised bytes for as long as `self` lives.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }

    /// The bytes, writable.
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as for `as_slice`, and `&mut self` guarantees exclusivity.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
    }

    /// The address kernels and copies use for this memory (equal to the host address under unified addressing).
    /// Only a number: using it for GPU access is `unsafe` (the slices above may be borrowed meanwhile).
    pub fn device_ptr(&self) -> DevicePtr {
        DevicePtr(self.ptr as u64)
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Always false: zero-byte allocations are refused.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

impl Drop for PinnedHostBuffer {
    fn drop(&mut self) {
        release_quietly("freeing pinned host memory", |d| {
            let _entered = self.ctx.enter()?;
            let f = entry!(d, cuMemFreeHost, "cuMemFreeHost")?;
            // SAFETY: `ptr` came from cuMemAllocHost and is freed exactly once, here.
            d.check("cuMemFreeHost", unsafe { f(self.ptr.cast()) })
        });
    }
}

/// A range of our own host memory (e.g. a shared-memory control block), registered with `cuMemHostRegister` so
/// the GPU can read and write it (stream memory operations, kernels); unregistered on drop.
///
/// It is [`DeviceMemory`]: its span is safe to hand to the GPU because [`RegistrableHostMemory`] promises that the
/// CPU side reaches the range only through atomics or raw pointers, never through references to plain bytes.
pub struct HostRegistration<M: RegistrableHostMemory> {
    ctx: Context,
    memory: Arc<M>,
    device_ptr: DevicePtr,
}

impl<M: RegistrableHostMemory> HostRegistration<M> {
    /// Page-locks and maps `memory` for the device (`CU_MEMHOSTREGISTER_DEVICEMAP | PORTABLE`).
    ///
    /// # Errors
    /// A failing `cuMemHostRegister` (e.g. `CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED`, or
    /// `CUDA_ERROR_NOT_PERMITTED` where locking memory is not allowed) or `cuMemHostGetDevicePointer`.
    pub fn new(ctx: &Context, memory: Arc<M>) -> Result<Self> {
        let _entered = ctx.enter()?;
        let d = Driver::get()?;
        let register = entry!(d, cuMemHostRegister_v2, "cuMemHostRegister")?;
        let flags = sys::CU_MEMHOSTREGISTER_DEVICEMAP | sys::CU_MEMHOSTREGISTER_PORTABLE;
        // SAFETY: the trait's contract keeps the range mapped while `memory` (kept in `self`) lives.
        d.check("cuMemHostRegister", unsafe { register(memory.as_ptr().cast(), memory.len(), flags) })?;
        let mut registration = Self { ctx: ctx.clone(), memory, device_ptr: DevicePtr(0) };
        let get = entry!(d, cuMemHostGetDevicePointer_v2, "cuMemHostGetDevicePointer")?;
        let mut dptr: sys::CUdeviceptr = 0;
        // SAFETY: the out-pointer is a valid local; the range is registered (dropping `registration` on error
        // unregisters it).
        d.check("cuMemHostGetDevicePointer", unsafe { get(&mut dptr, registration.memory.as_ptr().cast(), 0) })?;
        registration.device_ptr = DevicePtr(dptr);
        Ok(registration)
    }

    /// The device address of the start of the range.
    pub fn device_ptr(&self) -> DevicePtr {
        self.device_ptr
    }

    /// The registered memory.
    pub fn memory(&self) -> &Arc<M> {
        &self.memory
    }

    /// Queues on `stream` a GPU-side wait until the 64-bit word at byte `offset` of the registered range satisfies
    /// `condition` against `value` (`cuStreamWaitValue64`).
    ///
    /// # Errors
    /// An offset outside the range or not 8-byte aligned; a failing `cuStreamWaitValue64`.
    pub fn wait_value_u64(&self, stream: &Stream, offset: usize, value: u64, condition: WaitCondition) -> Result<()> {
        self.span().wait_value_u64(stream, offset as u64, value, condition)
    }

    /// Queues on `stream` a GPU-side write of `value` to the 64-bit word at byte `offset` of the registered range
    /// (`cuStreamWriteValue64`), after the stream's earlier work.
    ///
    /// # Errors
    /// An offset outside the range or not 8-byte aligned; a failing `cuStreamWriteValue64`.
    pub fn write_value_u64(&self, stream: &Stream, offset: usize, value: u64) -> Result<()> {
        self.span().write_value_u64(stream, offset as u64, value)
    }
}

impl<M: RegistrableHostMemory> DeviceMemory for HostRegistration<M> {
    fn span(&self) -> DeviceSpan<'_> {
        DeviceSpan::of_owner(self.device_ptr, self.memory.len() as u64)
    }
}

impl<M: RegistrableHostMemory> Drop for HostRegistration<M> {
    fn drop(&mut self) {
        release_quietly("unregistering host memory", |d| {
            let _entered = self.ctx.enter()?;
            let f = entry!(d, cuMemHostUnregister, "cuMemHostUnregister")?;
            // SAFETY: the range was registered in `new` and is unregistered exactly once, before `memory` drops.
            d.check("cuMemHostUnregister", unsafe { f(self.memory.as_ptr().cast()) })
        });
    }
}

/// Managed (unified) memory from `cuMemAllocManaged`, attached globally; freed on drop.
///
/// It is addressable from the host and every device; whether another process can open it is what the
/// compatibility probe records (it cannot be exported by either backend). Rust code never borrows its bytes, so
/// it is [`DeviceMemory`].
pub struct ManagedBuffer {
    ctx: Context,
    ptr: DevicePtr,
    len: u64,
}

impl ManagedBuffer {
    /// Allocates `len` bytes of managed memory (`CU_MEM_ATTACH_GLOBAL`).
    ///
    /// # Errors
    /// A failing `cuMemAllocManaged` (e.g. `CUDA_ERROR_NOT_SUPPORTED` without managed-memory support); zero
    /// bytes is rejected.
    pub fn alloc(ctx: &Context, len: u64) -> Result<Self> {
        if len == 0 {
            return Err(DriverError::InvalidArgument { function: "cuMemAllocManaged", problem: "zero bytes".into() });
        }
        let _entered = ctx.enter()?;
        let d = Driver::get()?;
        let f = entry!(d, cuMemAllocManaged, "cuMemAllocManaged")?;
        let mut raw: sys::CUdeviceptr = 0;
        // SAFETY: the out-pointer is a valid local; the context is current; the flag is a valid attach mode.
        d.check("cuMemAllocManaged", unsafe { f(&mut raw, len as usize, sys::CU_MEM_ATTACH_GLOBAL) })?;
        Ok(Self { ctx: ctx.clone(), ptr: DevicePtr(raw), len })
    }
}

owned_device_range!(ManagedBuffer, "the managed allocation (the same on the host and the device)");

impl Drop for ManagedBuffer {
    fn drop(&mut self) {
        release_quietly("freeing managed memory", |d| {
            let _entered = self.ctx.enter()?;
            let f = entry!(d, cuMemFree_v2, "cuMemFree")?;
            // SAFETY: `ptr` came from cuMemAllocManaged in this context and is freed exactly once, here.
            d.check("cuMemFree", unsafe { f(self.ptr.0) })
        });
    }
}
