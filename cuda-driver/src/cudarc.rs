//! Interop with [cudarc](https://docs.rs/cudarc) (feature `cudarc`): its context, streams and events and
//! gpu-ipc's are the same driver objects, so each side can queue work in order with the other's on one stream,
//! with no CPU synchronisation; and gpu-ipc's device memory can be lent to cudarc kernels as views, without a copy.
//!
//! Both libraries work in the device's primary context (cudarc's `CudaContext::new` retains it, as
//! [`Context::for_ordinal`] does), so [`context`] finds gpu-ipc's [`Context`] for a cudarc one.

/// The cudarc crate this module is built against (0.19).
pub use ::cudarc;

use std::marker::PhantomData;
use std::mem::ManuallyDrop;
use std::sync::Arc;

use cudarc::driver::{CudaContext, CudaEvent, CudaSlice, CudaStream, CudaView, CudaViewMut, DeviceRepr};

use super::{Borrowed, Context, DevicePtr, DeviceSpan, DriverError, Event, Result, Stream};

/// gpu-ipc's [`Context`] for a cudarc context: the same primary context, retained once more.
///
/// # Errors
/// [`DriverError::NotPrimaryContext`] when cudarc's context is not a primary context (`CudaContext::new` always
/// makes a primary one; `from_raw_context` may not), driver errors.
pub fn context(cuda: &CudaContext) -> Result<Context> {
    Context::from_raw_primary(cuda.cu_ctx().cast())
}

/// A cudarc stream borrowed as a gpu-ipc [`Stream`]: pass `Some(&*stream)` to the frame API, and the waits and
/// publishes it queues are ordered with the kernels cudarc queues on the same stream. The borrow cannot outlive
/// the cudarc stream.
///
/// # Errors
/// [`DriverError::InvalidArgument`] when the stream is not of `ctx`'s context.
pub fn stream<'a>(ctx: &Context, stream: &'a CudaStream) -> Result<Borrowed<'a, Stream>> {
    same_context(ctx, stream.context(), "gpu_ipc cudarc stream")?;
    // SAFETY: the handle is cudarc's live stream of `ctx`'s context (checked above), and the returned borrow lives
    // no longer than `&'a CudaStream`, which keeps it alive.
    Ok(unsafe { Stream::borrow_raw(ctx, stream.cu_stream().cast()) })
}

/// A cudarc event borrowed as a gpu-ipc [`Event`] (for [`Stream::wait_event`], or to record on a gpu-ipc stream).
///
/// # Errors
/// [`DriverError::InvalidArgument`] when the event is not of `ctx`'s context.
pub fn event<'a>(ctx: &Context, event: &'a CudaEvent) -> Result<Borrowed<'a, Event>> {
    same_context(ctx, event.context(), "gpu_ipc cudarc event")?;
    // SAFETY: as in `stream`: cudarc's live event of this context, borrowed no longer than cudarc's.
    Ok(unsafe { Event::borrow_raw(ctx, event.cu_event().cast()) })
}

/// A gpu-ipc [`Stream`] as a cudarc stream (cudarc's `wrap_borrowed_stream`): cudarc kernels launched on it run
/// in order with what gpu-ipc queued there.
///
/// # Safety
/// The returned `Arc<CudaStream>` (and every clone, and every cudarc object that holds one, such as a
/// `CudaSlice` allocated on it) must be dropped before `stream` is.
pub unsafe fn to_cudarc_stream(cuda: &Arc<CudaContext>, stream: &Stream) -> Arc<CudaStream> {
    // SAFETY: the caller keeps `stream` alive for as long as the wrapper; it belongs to the primary context, which
    // is cudarc's (checked by the caller choosing `cuda`; a stream of another context is the driver's error).
    unsafe { cuda.wrap_borrowed_stream(stream.as_raw().cast()) }
}

fn same_context(ctx: &Context, cuda: &CudaContext, function: &'static str) -> Result<()> {
    if cuda.cu_ctx().cast() == ctx.as_raw() {
        Ok(())
    } else {
        Err(DriverError::InvalidArgument {
            function,
            problem: "the cudarc object belongs to another context than gpu-ipc's (cudarc's CudaContext::new(ordinal) \
                      and gpu-ipc's Context::for_ordinal(ordinal) share the device's primary context)"
                .into(),
        })
    }
}

/// Device memory of gpu-ipc (a [`DeviceSpan`]: a frame, a slot, a buffer) lent to cudarc as a slice of `T`,
/// without a copy. It borrows the span: it cannot outlive the memory, and dropping it frees nothing.
pub struct SpanSlice<'a, T> {
    slice: ManuallyDrop<CudaSlice<T>>,
    _memory: PhantomData<DeviceSpan<'a>>,
}

impl<'a, T: DeviceRepr> SpanSlice<'a, T> {
    /// Lends `span` to cudarc as `span.len() / size_of::<T>()` elements, used on `stream`.
    ///
    /// # Errors
    /// [`DriverError::InvalidArgument`] when the span's length is not a whole number of `T`s or its address is
    /// not aligned for `T`.
    pub fn new(span: DeviceSpan<'a>, stream: &Arc<CudaStream>) -> Result<Self> {
        let len = elements::<T>(span.ptr(), span.len())?;
        // SAFETY: the span is live device memory of `len` elements of `T` (bounds and alignment checked above) for
        // 'a, which this value cannot outlive; the slice is never freed by cudarc (`leak` in Drop). Any bit pattern
        // is a valid `T` for cudarc's `DeviceRepr` types.
        let slice = unsafe { stream.upgrade_device_ptr::<T>(span.ptr().raw(), len) };
        Ok(Self { slice: ManuallyDrop::new(slice), _memory: PhantomData })
    }

    /// The memory as a cudarc view, for kernel arguments (`launch_builder(..).arg(&view)`) and copies.
    pub fn view(&self) -> CudaView<'_, T> {
        self.slice.as_view()
    }

    /// The memory as a mutable cudarc view.
    pub fn view_mut(&mut self) -> CudaViewMut<'_, T> {
        self.slice.as_view_mut()
    }

    /// Elements in the view.
    pub fn len(&self) -> usize {
        self.slice.len()
    }

    /// Whether the view has no elements.
    pub fn is_empty(&self) -> bool {
        self.slice.len() == 0
    }
}

impl<T> Drop for SpanSlice<'_, T> {
    fn drop(&mut self) {
        // SAFETY: taken exactly once, here; `leak` gives the address back without freeing it (the memory is
        // gpu-ipc's), after making the stream wait for cudarc's pending reads and writes of it.
        let slice = unsafe { ManuallyDrop::take(&mut self.slice) };
        let _ = slice.leak();
    }
}

/// How many `T`s the `bytes` at `ptr` hold: an error unless it is a whole number of them, aligned for `T`.
fn elements<T>(ptr: DevicePtr, bytes: u64) -> Result<usize> {
    let size = std::mem::size_of::<T>().max(1) as u64;
    let align = std::mem::align_of::<T>() as u64;
    if !bytes.is_multiple_of(size) || !ptr.raw().is_multiple_of(align) {
        return Err(DriverError::InvalidArgument {
            function: "gpu_ipc cudarc view",
            problem: format!("{bytes} bytes at {ptr} are not a whole, aligned number of {size}-byte elements"),
        });
    }
    usize::try_from(bytes / size).map_err(|_| DriverError::InvalidArgument {
        function: "gpu_ipc cudarc view",
        problem: "the span is larger than this machine's address space".into(),
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn a_view_holds_whole_aligned_elements_only() {
        assert_eq!(elements::<u8>(DevicePtr(0x1001), 24_883_200).unwrap(), 24_883_200);
        assert_eq!(elements::<u32>(DevicePtr(0x1000), 24_883_200).unwrap(), 6_220_800);
        let err = elements::<u32>(DevicePtr(0x1000), 10).unwrap_err();
        assert!(err.to_string().contains("10 bytes at 0x1000 are not a whole, aligned number of 4-byte"), "{err}");
        assert!(elements::<u64>(DevicePtr(0x1004), 16).is_err(), "misaligned");
    }

    #[test]
    fn a_cudarc_context_without_a_driver_is_an_error_not_a_panic() {
        // gpu-ipc's side of the conversion needs the driver: without one it says so (cudarc itself panics when it
        // cannot load libcuda, so applications open gpu-ipc's Context first).
        if super::super::Driver::get().is_err() {
            let err = Context::from_raw_primary(std::ptr::null_mut()).unwrap_err();
            assert!(matches!(err, DriverError::LibraryNotFound { .. }), "{err}");
        }
    }
}
