//! Events, including inter-process events (legacy IPC).

use super::borrowed::Borrowed;
use super::context::Context;
use super::error::Result;
use super::loader::{Driver, entry, release_quietly};
use super::stream::Stream;
use super::sys;

/// How an event is created.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct EventFlags {
    /// Record timestamps (needed by [`Event::elapsed_ms`]; not allowed with `interprocess`).
    pub timing: bool,
    /// Make [`Event::synchronize`] sleep instead of spinning.
    pub blocking_sync: bool,
    /// Shareable with another process through [`Event::ipc_handle`].
    pub interprocess: bool,
}

impl EventFlags {
    /// Flags for timing measurements.
    pub const TIMING: Self = Self { timing: true, blocking_sync: false, interprocess: false };
    /// Flags for an event shared with another process (which requires disabling timing).
    pub const INTERPROCESS: Self = Self { timing: false, blocking_sync: false, interprocess: true };

    fn raw(self) -> u32 {
        let mut flags = 0;
        if !self.timing {
            flags |= sys::CU_EVENT_DISABLE_TIMING;
        }
        if self.blocking_sync {
            flags |= sys::CU_EVENT_BLOCKING_SYNC;
        }
        if self.interprocess {
            flags |= sys::CU_EVENT_INTERPROCESS;
        }
        flags
    }
}

/// The 64 opaque bytes that name an inter-process event in another process.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct IpcEventHandle(pub [u8; 64]);

impl std::fmt::Debug for IpcEventHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "IpcEventHandle({:02x?}..)", &self.0[..8])
    }
}

/// A CUDA event; destroyed on drop.
pub struct Event {
    ctx: Context,
    raw: sys::CUevent,
}

// SAFETY: a CUevent handle may be used from any thread; the driver serialises access.
unsafe impl Send for Event {}
// SAFETY: every method passes the handle to thread-safe driver calls only.
unsafe impl Sync for Event {}

impl std::fmt::Debug for Event {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Event").field("raw", &self.raw).finish()
    }
}

impl Event {
    /// Creates an event.
    ///
    /// # Errors
    /// A failing `cuEventCreate` (e.g. `CUDA_ERROR_INVALID_VALUE` for timing + interprocess).
    pub fn new(ctx: &Context, flags: EventFlags) -> Result<Self> {
        let _entered = ctx.enter()?;
        let d = Driver::get()?;
        let f = entry!(d, cuEventCreate, "cuEventCreate")?;
        let mut raw: sys::CUevent = std::ptr::null_mut();
        // SAFETY: the out-pointer is a valid local; the context is current.
        d.check("cuEventCreate", unsafe { f(&mut raw, flags.raw()) })?;
        Ok(Self { ctx: ctx.clone(), raw })
    }

    pub(crate) fn raw(&self) -> sys::CUevent {
        self.raw
    }

    /// The raw `CUevent`, for code built on other CUDA libraries. The handle stays this event's.
    pub fn as_raw(&self) -> sys::CUevent {
        self.raw
    }

    /// An event that another library owns (a cudarc `CudaEvent::cu_event()`, a torch or CuPy event's handle),
    /// borrowed so that gpu-ipc streams can wait on it or record it. Dropping the borrow does not destroy it.
    ///
    /// # Safety
    /// `raw` must be a valid event of `ctx`'s context and stay valid for `'a`; the returned value must not outlive
    /// it.
    pub unsafe fn borrow_raw<'a>(ctx: &Context, raw: sys::CUevent) -> Borrowed<'a, Event> {
        Borrowed::new(Self { ctx: ctx.clone(), raw })
    }

    /// Takes ownership of an event created elsewhere: it is destroyed when the returned `Event` drops.
    ///
    /// # Safety
    /// `raw` must be a valid event of `ctx`'s context that nothing else destroys.
    pub unsafe fn from_raw_owned(ctx: &Context, raw: sys::CUevent) -> Self {
        Self { ctx: ctx.clone(), raw }
    }

    /// Gives up ownership: the caller destroys the returned event (`cuEventDestroy`) when done.
    pub fn into_raw(self) -> sys::CUevent {
        let this = std::mem::ManuallyDrop::new(self);
        // SAFETY: `this` is never used again, so `ctx` is moved out (and released) exactly once.
        let _ctx = unsafe { std::ptr::read(&this.ctx) };
        this.raw
    }

    /// Records the event after the work queued so far on `stream`.
    ///
    /// # Errors
    /// A failing `cuEventRecord`.
    pub fn record(&self, stream: &Stream) -> Result<()> {
        let d = Driver::get()?;
        let f = entry!(d, cuEventRecord, "cuEventRecord")?;
        // SAFETY: both handles are alive for the borrows.
        d.check("cuEventRecord", unsafe { f(self.raw, stream.raw()) })
    }

    /// Blocks until the recorded work is done.
    ///
    /// # Errors
    /// A failing `cuEventSynchronize`.
    pub fn synchronize(&self) -> Result<()> {
        let d = Driver::get()?;
        let f = entry!(d, cuEventSynchronize, "cuEventSynchronize")?;
        // SAFETY: the event is alive for the borrow.
        d.check("cuEventSynchronize", unsafe { f(self.raw) })
    }

    /// True when the recorded work is done (non-blocking).
    ///
    /// # Errors
    /// Any result of `cuEventQuery` other than success and `CUDA_ERROR_NOT_READY`.
    pub fn is_complete(&self) -> Result<bool> {
        let d = Driver::get()?;
        let f = entry!(d, cuEventQuery, "cuEventQuery")?;
        // SAFETY: the event is alive for the borrow.
        let rc = unsafe { f(self.raw) };
        if rc == sys::cudaError_enum::CUDA_ERROR_NOT_READY {
            return Ok(false);
        }
        d.check("cuEventQuery", rc).map(|()| true)
    }

    /// Milliseconds between two recorded timing events.
    ///
    /// # Errors
    /// A failing `cuEventElapsedTime` (e.g. events without timing, or not yet complete).
    pub fn elapsed_ms(start: &Event, end: &Event) -> Result<f32> {
        let d = Driver::get()?;
        let f = entry!(d, cuEventElapsedTime_v2, "cuEventElapsedTime")?;
        let mut ms = 0f32;
        // SAFETY: the out-pointer is a valid local; both events are alive.
        d.check("cuEventElapsedTime", unsafe { f(&mut ms, start.raw, end.raw) })?;
        Ok(ms)
    }

    /// The handle another process opens with [`Event::open_ipc`] (the event must be `interprocess`).
    ///
    /// # Errors
    /// A failing `cuIpcGetEventHandle`.
    pub fn ipc_handle(&self) -> Result<IpcEventHandle> {
        let d = Driver::get()?;
        let f = entry!(d, cuIpcGetEventHandle, "cuIpcGetEventHandle")?;
        let mut handle = sys::CUipcEventHandle { reserved: [0; 64] };
        // SAFETY: the out-pointer is a valid local; the event is alive.
        d.check("cuIpcGetEventHandle", unsafe { f(&mut handle, self.raw) })?;
        Ok(IpcEventHandle(handle.reserved.map(|b| b as u8)))
    }

    /// Opens an event exported by another process.
    ///
    /// # Errors
    /// [`DriverError::IpcEventUnreachable`](super::DriverError::IpcEventUnreachable) for `CUDA_ERROR_MAP_FAILED`
    /// (this process is in another IPC namespace than the exporter, e.g. a container's own); any other failing
    /// `cuIpcOpenEventHandle` (e.g. the exporter is gone, or is this very process).
    pub fn open_ipc(ctx: &Context, handle: IpcEventHandle) -> Result<Self> {
        let _entered = ctx.enter()?;
        let d = Driver::get()?;
        let f = entry!(d, cuIpcOpenEventHandle, "cuIpcOpenEventHandle")?;
        let mut raw: sys::CUevent = std::ptr::null_mut();
        let h = sys::CUipcEventHandle { reserved: handle.0.map(|b| b as std::ffi::c_char) };
        // SAFETY: the out-pointer is a valid local; the handle is passed by value.
        let rc = unsafe { f(&mut raw, h) };
        if rc == sys::cudaError_enum::CUDA_ERROR_MAP_FAILED {
            return Err(super::DriverError::IpcEventUnreachable);
        }
        d.check("cuIpcOpenEventHandle", rc)?;
        Ok(Self { ctx: ctx.clone(), raw })
    }

    /// The context the event belongs to.
    pub fn context(&self) -> &Context {
        &self.ctx
    }
}

impl Drop for Event {
    fn drop(&mut self) {
        release_quietly("destroying an event", |d| {
            let f = entry!(d, cuEventDestroy_v2, "cuEventDestroy")?;
            // SAFETY: the event was created or opened by us and is destroyed exactly once, here.
            d.check("cuEventDestroy", unsafe { f(self.raw) })
        });
    }
}

impl Stream {
    /// Makes later work on this stream wait for `event` (which may come from another process).
    ///
    /// # Errors
    /// A failing `cuStreamWaitEvent`.
    pub fn wait_event(&self, event: &Event) -> Result<()> {
        let d = Driver::get()?;
        let f = entry!(d, cuStreamWaitEvent, "cuStreamWaitEvent")?;
        // SAFETY: both handles are alive for the borrows; flags must be 0.
        d.check("cuStreamWaitEvent", unsafe { f(self.raw(), event.raw(), 0) })
    }
}
