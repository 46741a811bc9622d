//! The device's primary context, retained for as long as any owner needs it.

use std::sync::Arc;

use super::device::Device;
use super::error::Result;
use super::loader::{Driver, entry, release_quietly};
use super::sys;

/// A retained primary context of one device. Cloning shares it; the last clone releases it.
///
/// The primary context is the one the CUDA runtime and PyTorch use too, so memory and streams made here can be
/// handed to code built on them in the same process.
#[derive(Clone)]
pub struct Context {
    inner: Arc<Retained>,
}

struct Retained {
    device: Device,
    raw: sys::CUcontext,
}

// SAFETY: a CUcontext is a driver handle that may be used from any thread (after cuCtxSetCurrent there); the
// driver serialises access internally. We never hand out the raw pointer mutably.
unsafe impl Send for Retained {}
// SAFETY: as above; all methods only pass the handle to thread-safe driver calls.
unsafe impl Sync for Retained {}

impl std::fmt::Debug for Context {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Context").field("device", &self.inner.device.ordinal()).finish()
    }
}

impl Context {
    /// Retains the primary context of `device` and makes it current on the calling thread.
    ///
    /// # Errors
    /// A failing `cuDevicePrimaryCtxRetain` (for example when the compute mode forbids contexts) or
    /// `cuCtxSetCurrent`.
    pub fn primary(device: Device) -> Result<Self> {
        let d = Driver::get()?;
        let f = entry!(d, cuDevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain")?;
        let mut raw: sys::CUcontext = std::ptr::null_mut();
        // SAFETY: the out-pointer is a valid local; the device came from cuDeviceGet.
        d.check("cuDevicePrimaryCtxRetain", unsafe { f(&mut raw, device.raw()) })?;
        let ctx = Self { inner: Arc::new(Retained { device, raw }) };
        ctx.bind()?;
        Ok(ctx)
    }

    /// Opens device `ordinal` and retains its primary context: the usual first line of a CUDA program.
    ///
    /// # Errors
    /// As [`Device::get`] and [`Context::primary`].
    pub fn for_ordinal(ordinal: i32) -> Result<Self> {
        Self::primary(Device::get(ordinal)?)
    }

    /// Makes this context current on the calling thread (each thread that uses it calls this once).
    ///
    /// # Errors
    /// A failing `cuCtxSetCurrent`.
    pub fn bind(&self) -> Result<()> {
        let d = Driver::get()?;
        let f = entry!(d, cuCtxSetCurrent, "cuCtxSetCurrent")?;
        // SAFETY: the context is retained for as long as `self` lives.
        d.check("cuCtxSetCurrent", unsafe { f(self.inner.raw) })
    }

    /// The raw `CUcontext` (the device's primary context), for code built on other CUDA libraries. It stays
    /// retained while any clone of this `Context` lives.
    pub fn as_raw(&self) -> sys::CUcontext {
        self.inner.raw
    }

    /// The `Context` of a raw context handle that another library holds (cudarc's `CudaContext::cu_ctx()`,
    /// PyTorch's current context): it must be the primary context of one of this machine's devices, the one
    /// cudarc, the CUDA runtime, PyTorch, CuPy and gpu-ipc all use. Retains it, so the returned value owns a
    /// reference of its own. Only compares handles: `raw` is never dereferenced, so any value is safe to pass.
    ///
    /// # Errors
    /// [`DriverError::NotPrimaryContext`](super::DriverError) when `raw` is no device's primary context (a context
    /// made with `cuCtxCreate`: gpu-ipc works in the primary context; make the other library use it), driver
    /// errors.
    pub fn from_raw_primary(raw: sys::CUcontext) -> Result<Self> {
        for ordinal in 0..Device::count()? {
            let ctx = Self::for_ordinal(ordinal)?;
            if ctx.inner.raw == raw {
                return Ok(ctx);
            }
        }
        Err(super::DriverError::NotPrimaryContext)
    }

    /// The context current on the calling thread (what another library made current), as a `Context`: see
    /// [`Context::from_raw_primary`].
    ///
    /// # Errors
    /// [`DriverError::NoCurrentContext`](super::DriverError) when the thread has none, else as
    /// [`Context::from_raw_primary`].
    pub fn current() -> Result<Self> {
        let d = Driver::get()?;
        let f = entry!(d, cuCtxGetCurrent, "cuCtxGetCurrent")?;
        let mut raw: sys::CUcontext = std::ptr::null_mut();
        // SAFETY: the out-pointer is a valid local.
        d.check("cuCtxGetCurrent", unsafe { f(&mut raw) })?;
        if raw.is_null() {
            return Err(super::DriverError::NoCurrentContext);
        }
        Self::from_raw_primary(raw)
    }

    /// The device this context belongs to.
    pub fn device(&self) -> Device {
        self.inner.device
    }

    /// Waits for all work in the context.
    ///
    /// # Errors
    /// A failing `cuCtxSynchronize`, which also reports earlier asynchronous errors (e.g. an illegal address).
    pub fn synchronize(&self) -> Result<()> {
        self.bind()?;
        let d = Driver::get()?;
        let f = entry!(d, cuCtxSynchronize, "cuCtxSynchronize")?;
        // SAFETY: no arguments; the context is current.
        d.check("cuCtxSynchronize", unsafe { f() })
    }

    /// Free and total device memory in bytes.
    ///
    /// # Errors
    /// A failing `cuMemGetInfo`.
    pub fn memory_info(&self) -> Result<(u64, u64)> {
        self.bind()?;
        let d = Driver::get()?;
        let f = entry!(d, cuMemGetInfo_v2, "cuMemGetInfo")?;
        let (mut free, mut total) = (0usize, 0usize);
        // SAFETY: both out-pointers are valid locals.
        d.check("cuMemGetInfo", unsafe { f(&mut free, &mut total) })?;
        Ok((free as u64, total as u64))
    }

    /// Lets kernels of this context access memory of `peer`'s context (for cross-GPU imports).
    /// Succeeds when access is already enabled.
    ///
    /// # Errors
    /// A failing `cuCtxEnablePeerAccess`, e.g. `CUDA_ERROR_PEER_ACCESS_UNSUPPORTED`.
    pub fn enable_peer_access(&self, peer: &Context) -> Result<()> {
        self.bind()?;
        let d = Driver::get()?;
        let f = entry!(d, cuCtxEnablePeerAccess, "cuCtxEnablePeerAccess")?;
        // SAFETY: the peer context is retained by `peer`; flags must be 0.
        let rc = unsafe { f(peer.inner.raw, 0) };
        if rc == sys::cudaError_enum::CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED {
            return Ok(());
        }
        d.check("cuCtxEnablePeerAccess", rc)
    }
}

impl Drop for Retained {
    fn drop(&mut self) {
        release_quietly("releasing the primary context", |d| {
            let f = entry!(d, cuDevicePrimaryCtxRelease_v2, "cuDevicePrimaryCtxRelease")?;
            // SAFETY: we retained this device's primary context exactly once in `Context::primary`.
            d.check("cuDevicePrimaryCtxRelease", unsafe { f(self.device.raw()) })
        });
    }
}
