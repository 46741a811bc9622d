//! Owned device memory: [`DeviceBuffer`], an allocation from `cuMemAlloc`.

use super::address::{DeviceCopy, DevicePtr};
use super::context::Context;
use super::error::{DriverError, Result};
use super::loader::{Driver, entry, release_quietly};
use super::span::DeviceMemory;
use super::span::owned_device_range;
use super::stream::Stream;
use super::sys;

/// An owned device allocation from `cuMemAlloc`; freed on drop.
pub struct DeviceBuffer {
    ctx: Context,
    ptr: DevicePtr,
    len: u64,
}

impl DeviceBuffer {
    /// Allocates `len` bytes of device memory (uninitialised).
    ///
    /// # Errors
    /// A failing `cuMemAlloc` (e.g. `CUDA_ERROR_OUT_OF_MEMORY`); zero bytes is rejected.
    pub fn alloc(ctx: &Context, len: u64) -> Result<Self> {
        if len == 0 {
            return Err(DriverError::InvalidArgument { function: "cuMemAlloc", problem: "zero bytes".into() });
        }
        let _entered = ctx.enter()?;
        let d = Driver::get()?;
        let f = entry!(d, cuMemAlloc_v2, "cuMemAlloc")?;
        let mut raw: sys::CUdeviceptr = 0;
        // SAFETY: the out-pointer is a valid local; the context is current.
        d.check("cuMemAlloc", unsafe { f(&mut raw, len as usize) })?;
        Ok(Self { ctx: ctx.clone(), ptr: DevicePtr(raw), len })
    }

    /// The context it was allocated in.
    pub fn context(&self) -> &Context {
        &self.ctx
    }

    /// Copies `src` into the buffer at byte `offset` (synchronous).
    ///
    /// # Errors
    /// Out of bounds, or a failing `cuMemcpyHtoD`.
    pub fn write<T: DeviceCopy>(&self, offset: u64, src: &[T]) -> Result<()> {
        self.span().write(offset, src)
    }

    /// Copies from the buffer at byte `offset` into `dst` (synchronous).
    ///
    /// # Errors
    /// Out of bounds, or a failing `cuMemcpyDtoH`.
    pub fn read<T: DeviceCopy>(&self, offset: u64, dst: &mut [T]) -> Result<()> {
        self.span().read(offset, dst)
    }

    /// Fills the whole buffer with a 32-bit value on `stream` (the size must be a multiple of 4).
    ///
    /// # Errors
    /// A size not a multiple of 4, or a failing `cuMemsetD32Async`.
    pub fn fill_u32_async(&self, value: u32, stream: &Stream) -> Result<()> {
        self.span().fill_u32_async(value, stream)
    }
}

owned_device_range!(DeviceBuffer, "the device allocation");

impl Drop for DeviceBuffer {
    fn drop(&mut self) {
        release_quietly("freeing device memory", |d| {
            let _entered = self.ctx.enter()?;
            let f = entry!(d, cuMemFree_v2, "cuMemFree")?;
            // SAFETY: `ptr` came from cuMemAlloc in this context and is freed exactly once, here.
            d.check("cuMemFree", unsafe { f(self.ptr.0) })
        });
    }
}
