//! Streams, including the stream memory operations that let the GPU wait on and write 64-bit counters.

use super::address::DevicePtr;
use super::borrowed::Borrowed;
use super::context::Context;
use super::error::Result;
use super::loader::{Driver, entry, release_quietly};
use super::sys;

/// A CUDA stream; destroyed on drop (after its queued work completes, as the driver does).
pub struct Stream {
    ctx: Context,
    raw: sys::CUstream,
}

// SAFETY: a CUstream handle may be used from any thread whose current context owns it; the driver serialises it.
unsafe impl Send for Stream {}
// SAFETY: every method passes the handle to thread-safe driver calls only.
unsafe impl Sync for Stream {}

/// The comparison of a GPU-side wait ([`Stream::wait_value_u64`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WaitCondition {
    /// Until `(int64)(*addr - value) >= 0`: wrap-safe "at least", the one a sequence counter needs.
    AtLeast,
    /// Until `*addr == value`.
    Equal,
    /// Until `(*addr & value) != 0`.
    AnyBit,
}

impl WaitCondition {
    pub(super) fn flags(self) -> u32 {
        match self {
            Self::AtLeast => sys::CU_STREAM_WAIT_VALUE_GEQ,
            Self::Equal => sys::CU_STREAM_WAIT_VALUE_EQ,
            Self::AnyBit => sys::CU_STREAM_WAIT_VALUE_AND,
        }
    }
}

impl std::fmt::Debug for Stream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Stream").field("raw", &self.raw).finish()
    }
}

impl Stream {
    /// Creates a stream that does not synchronise with the legacy default stream.
    ///
    /// # Errors
    /// A failing `cuStreamCreate`.
    pub fn new(ctx: &Context) -> Result<Self> {
        let _entered = ctx.enter()?;
        let d = Driver::get()?;
        let f = entry!(d, cuStreamCreate, "cuStreamCreate")?;
        let mut raw: sys::CUstream = std::ptr::null_mut();
        // SAFETY: the out-pointer is a valid local; the context is current.
        d.check("cuStreamCreate", unsafe { f(&mut raw, sys::CU_STREAM_NON_BLOCKING) })?;
        Ok(Self { ctx: ctx.clone(), raw })
    }

    pub(crate) fn raw(&self) -> sys::CUstream {
        self.raw
    }

    /// The raw `CUstream`, for code built on other CUDA libraries (cudarc's `CudaContext::wrap_borrowed_stream`,
    /// `torch.cuda.ExternalStream`, CuPy's `ExternalStream`): they then queue work in order with what gpu-ipc
    /// queues here. The handle stays this stream's: it is destroyed when the `Stream` drops.
    pub fn as_raw(&self) -> sys::CUstream {
        self.raw
    }

    /// A stream that another library owns (a cudarc `CudaStream::cu_stream()`, a torch or CuPy stream's handle,
    /// or null for the legacy default stream), borrowed so that the frame API queues its waits and publishes on
    /// it: nothing gpu-ipc queues then needs a CPU synchronisation to be ordered with that library's work.
    /// Dropping the borrow does not destroy the stream.
    ///
    /// # Safety
    /// `raw` must be a valid stream of `ctx`'s context (or null) and stay valid for `'a`; the returned value must
    /// not outlive it (`'a` says so to the borrow checker; choose it no longer than the owner lives).
    pub unsafe fn borrow_raw<'a>(ctx: &Context, raw: sys::CUstream) -> Borrowed<'a, Stream> {
        Borrowed::new(Self { ctx: ctx.clone(), raw })
    }

    /// Takes ownership of a stream created elsewhere: it is destroyed when the returned `Stream` drops.
    ///
    /// # Safety
    /// `raw` must be a valid stream of `ctx`'s context that nothing else destroys.
    pub unsafe fn from_raw_owned(ctx: &Context, raw: sys::CUstream) -> Self {
        Self { ctx: ctx.clone(), raw }
    }

    /// Gives up ownership: the caller destroys the returned stream (`cuStreamDestroy`) when done.
    pub fn into_raw(self) -> sys::CUstream {
        let this = std::mem::ManuallyDrop::new(self);
        // The context clone must still be released: read it out of the value whose Drop will not run.
        // SAFETY: `this` is never used again, so `ctx` is moved out exactly once.
        let _ctx = unsafe { std::ptr::read(&this.ctx) };
        this.raw
    }

    /// The stream's context.
    pub fn context(&self) -> &Context {
        &self.ctx
    }

    /// Blocks until all queued work is done.
    ///
    /// # Errors
    /// A failing `cuStreamSynchronize`, including errors of kernels queued earlier.
    pub fn synchronize(&self) -> Result<()> {
        let d = Driver::get()?;
        let f = entry!(d, cuStreamSynchronize, "cuStreamSynchronize")?;
        // SAFETY: the stream is alive for the borrow of `self`.
        d.check("cuStreamSynchronize", unsafe { f(self.raw) })
    }

    /// True when all queued work is done (non-blocking).
    ///
    /// # Errors
    /// Any result of `cuStreamQuery` other than success and `CUDA_ERROR_NOT_READY`.
    pub fn is_idle(&self) -> Result<bool> {
        let d = Driver::get()?;
        let f = entry!(d, cuStreamQuery, "cuStreamQuery")?;
        // SAFETY: the stream is alive for the borrow of `self`.
        let rc = unsafe { f(self.raw) };
        if rc == sys::cudaError_enum::CUDA_ERROR_NOT_READY {
            return Ok(false);
        }
        d.check("cuStreamQuery", rc).map(|()| true)
    }

    /// Queues a GPU-side wait until the 64-bit word at `addr` satisfies `condition` against `value`.
    ///
    /// No CPU takes part; a wait that is never satisfied blocks the stream, so whoever depends on it must be able
    /// to write the word itself (see the ring's poison value). The safe forms are
    /// [`DeviceSpan::wait_value_u64`](super::DeviceSpan::wait_value_u64) and
    /// [`HostRegistration::wait_value_u64`](super::HostRegistration::wait_value_u64).
    ///
    /// # Errors
    /// A failing `cuStreamWaitValue64` (e.g. `CUDA_ERROR_NOT_SUPPORTED` on devices without 64-bit stream memory
    /// operations).
    ///
    /// # Safety
    /// Until the wait has completed, `addr` must be an aligned 64-bit word the device can address (device memory,
    /// owned or imported, or host memory registered with [`HostRegistration`](super::HostRegistration)) that
    /// nothing writes through a Rust reference.
    pub unsafe fn wait_value_u64(&self, addr: DevicePtr, value: u64, condition: WaitCondition) -> Result<()> {
        let d = Driver::get()?;
        let f = entry!(d, cuStreamWaitValue64_v2, "cuStreamWaitValue64")?;
        // SAFETY: the stream is alive; the caller vouches for the address, which only the GPU dereferences.
        d.check("cuStreamWaitValue64", unsafe { f(self.raw, addr.0, value, condition.flags()) })
    }

    /// Queues a GPU-side write of a 64-bit `value` to `addr` after the stream's earlier work. The safe forms are
    /// [`DeviceSpan::write_value_u64`](super::DeviceSpan::write_value_u64) and
    /// [`HostRegistration::write_value_u64`](super::HostRegistration::write_value_u64).
    ///
    /// # Errors
    /// A failing `cuStreamWriteValue64`.
    ///
    /// # Safety
    /// Until the write has run, `addr` must be an aligned 64-bit word the device can address that no Rust
    /// reference covers (host memory only if Rust reaches it through atomics or raw pointers alone).
    pub unsafe fn write_value_u64(&self, addr: DevicePtr, value: u64) -> Result<()> {
        let d = Driver::get()?;
        let f = entry!(d, cuStreamWriteValue64_v2, "cuStreamWriteValue64")?;
        // SAFETY: the stream is alive; the caller vouches for the address; the write is performed by the GPU.
        d.check("cuStreamWriteValue64", unsafe { f(self.raw, addr.0, value, sys::CU_STREAM_WRITE_VALUE_DEFAULT) })
    }
}

/// A closure queued with [`Stream::launch_host_fn`], boxed twice so that a thin pointer carries it through the
/// driver.
type HostFn = Box<dyn FnOnce() + Send + 'static>;

/// The trampoline the driver calls on its own thread for [`Stream::launch_host_fn`].
unsafe extern "C" fn run_host_fn(user_data: *mut std::ffi::c_void) {
    // SAFETY: `user_data` is the `Box<HostFn>` that `launch_host_fn` leaked for exactly this call; the driver calls
    // each queued host function once, so the box is reclaimed exactly once.
    let host_fn = unsafe { Box::from_raw(user_data.cast::<HostFn>()) };
    // A panic must not unwind into the driver's thread (undefined behaviour across `extern "C"`): log it instead.
    if std::panic::catch_unwind(std::panic::AssertUnwindSafe(host_fn)).is_err() {
        tracing::error!("a host function queued on a stream panicked");
    }
}

impl Stream {
    /// Queues `host_fn` to run on a driver thread once the stream's earlier work is done; the stream's later work
    /// waits until it returns (`cuLaunchHostFunc`).
    ///
    /// The closure runs on a thread of the driver's, must not call CUDA, and must not wait for work queued after
    /// it (the driver's rules): keep it to a few atomic operations. If the process exits first, it never runs.
    ///
    /// # Errors
    /// A failing `cuLaunchHostFunc`; the closure is then dropped without running.
    pub fn launch_host_fn(&self, host_fn: impl FnOnce() + Send + 'static) -> Result<()> {
        let d = Driver::get()?;
        let f = entry!(d, cuLaunchHostFunc, "cuLaunchHostFunc")?;
        let boxed: Box<HostFn> = Box::new(Box::new(host_fn));
        let user_data = Box::into_raw(boxed);
        // SAFETY: the stream is alive; `run_host_fn` matches `CUhostFn` and takes back the leaked box, which lives
        // until the driver calls it.
        let result = d.check("cuLaunchHostFunc", unsafe { f(self.raw, Some(run_host_fn), user_data.cast()) });
        if result.is_err() {
            // SAFETY: the launch failed, so the driver will never call `run_host_fn` with `user_data`: reclaim it.
            drop(unsafe { Box::from_raw(user_data) });
        }
        result
    }
}

impl Drop for Stream {
    fn drop(&mut self) {
        release_quietly("destroying a stream", |d| {
            let f = entry!(d, cuStreamDestroy_v2, "cuStreamDestroy")?;
            // SAFETY: the stream was created by us and is destroyed exactly once, here.
            d.check("cuStreamDestroy", unsafe { f(self.raw) })
        });
    }
}
