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
        let ctx = Self::retain(device)?;
        ctx.bind()?;
        Ok(ctx)
    }

    /// Retains the primary context of `device` without touching the calling thread's current context: what a
    /// library does, which [`enter`](Self::enter)s it around its own calls and leaves its caller's current device
    /// alone.
    ///
    /// # Errors
    /// A failing `cuDevicePrimaryCtxRetain`.
    pub fn retain(device: Device) -> Result<Self> {
        let d = Driver::get()?;
        let f = entry!(d, cuDevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain")?;
        let mut raw: sys::CUcontext = std::ptr::null_mut();
        // SAFETY: the out-pointer is a valid local; the device came from cuDeviceGet.
        d.check("cuDevicePrimaryCtxRetain", unsafe { f(&mut raw, device.raw()) })?;
        Ok(Self { inner: Arc::new(Retained { device, raw }) })
    }

    /// Retains the primary context of `device` as a library does: a context the caller made current (PyTorch's,
    /// CuPy's: the CUDA runtime reads the current device from it) stays current, so opening device 1 does not move
    /// a program's current device off 0; a thread with none gets this one (as [`primary`](Self::primary)), for its
    /// later calls that use the current context. This library's own calls [`enter`](Self::enter) their context.
    ///
    /// # Errors
    /// A failing `cuDevicePrimaryCtxRetain`, `cuCtxGetCurrent` or `cuCtxSetCurrent`.
    pub fn keeping_current(device: Device) -> Result<Self> {
        let ctx = Self::retain(device)?;
        if !Self::any_current()? {
            ctx.bind()?;
        }
        Ok(ctx)
    }

    /// Whether the calling thread has a current context (any: this library's, PyTorch's, another's).
    ///
    /// # Errors
    /// A failing `cuCtxGetCurrent`.
    pub fn any_current() -> Result<bool> {
        Ok(!current_raw()?.is_null())
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

    /// Makes this context current on the calling thread; when another context was current (another device's),
    /// dropping the returned guard makes that one current again: work on one device among several without moving
    /// the thread off the caller's. PyTorch and the CUDA runtime read the current device from the current context,
    /// so a library that [`bind`](Self::bind)s a context and leaves it would move its caller's current device. On a
    /// thread with no current context this context stays current after the guard (as [`bind`](Self::bind)): nobody's
    /// device moves, and the thread's later calls that use the current context (a synchronous copy) find it.
    ///
    /// ```no_run
    /// # fn main() -> gpu_ipc_driver::Result<()> {
    /// use gpu_ipc_driver::Context;
    /// let gpu0 = Context::for_ordinal(0)?; // current now
    /// let gpu1 = Context::for_ordinal(1)?; // current now
    /// gpu0.bind()?;
    /// {
    ///     let _on_gpu1 = gpu1.enter()?;
    ///     // ... copies and launches here run in GPU 1's context ...
    /// }
    /// // GPU 0's context is current again.
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// A failing `cuCtxGetCurrent` or `cuCtxSetCurrent`.
    pub fn enter(&self) -> Result<Entered> {
        let before = current_raw()?;
        if before != self.inner.raw {
            self.bind()?;
        }
        let switched = !before.is_null() && before != self.inner.raw;
        Ok(Entered { before: switched.then_some(before), _thread: std::marker::PhantomData })
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
            let ctx = Self::retain(Device::get(ordinal)?)?;
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
        let raw = current_raw()?;
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
        let _entered = self.enter()?;
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
        let _entered = self.enter()?;
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
        let _entered = self.enter()?;
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

/// The context current on the calling thread, null when none is.
fn current_raw() -> Result<sys::CUcontext> {
    let d = Driver::get()?;
    let f = entry!(d, cuCtxGetCurrent, "cuCtxGetCurrent")?;
    let mut raw: sys::CUcontext = std::ptr::null_mut();
    // SAFETY: the out-pointer is a valid local.
    d.check("cuCtxGetCurrent", unsafe { f(&mut raw) })?;
    Ok(raw)
}

/// A context made current by [`Context::enter`]; dropping it makes current again what was before. It belongs to
/// the thread that entered (the current context is the thread's), so it is neither `Send` nor `Sync`.
#[must_use = "the context stays current only while the guard lives"]
pub struct Entered {
    /// What was current before, when it was another context; `None` when it was this one or none.
    before: Option<sys::CUcontext>,
    _thread: std::marker::PhantomData<*const ()>,
}

impl std::fmt::Debug for Entered {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Entered").field("switched", &self.before.is_some()).finish()
    }
}

impl Drop for Entered {
    fn drop(&mut self) {
        if let Some(before) = self.before {
            release_quietly("making the previous context current again", |d| {
                let f = entry!(d, cuCtxSetCurrent, "cuCtxSetCurrent")?;
                // SAFETY: `before` was current on this thread when the guard was made; it is the caller's, who
                // keeps it alive around the scope that entered another context.
                d.check("cuCtxSetCurrent", unsafe { f(before) })
            });
        }
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
