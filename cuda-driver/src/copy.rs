//! Raw copies and fills to and from any device address: `unsafe fn`s, since a bare [`DevicePtr`] is only a
//! number. The safe, bounds-checked forms are [`DeviceSpan`](super::DeviceSpan)'s methods.

use super::address::{DeviceCopy, DevicePtr, RegistrableHostMemory};
use super::context::Context;
use super::device::Device;
use super::error::{DriverError, Result};
use super::loader::{Driver, entry};
use super::stream::Stream;
use super::sys;

fn byte_len<T: DeviceCopy>(items: &[T]) -> usize {
    std::mem::size_of_val(items)
}

/// Copies host data to any device address (owned, imported or mapped memory). Synchronous. The safe form is
/// [`DeviceSpan::write`](crate::DeviceSpan::write).
///
/// # Errors
/// A failing `cuMemcpyHtoD` (e.g. an address not mapped in this context).
///
/// # Safety
/// `[dst, dst + size_of_val(src))` must be memory the device can address that no Rust reference covers while the
/// copy runs: device memory, or host memory Rust reaches only through atomics or raw pointers (under unified
/// addressing a host address is a valid `dst`, and the driver would write through it).
pub unsafe fn copy_to_device<T: DeviceCopy>(dst: DevicePtr, src: &[T]) -> Result<()> {
    in_reach(dst, |d| {
        let f = entry!(d, cuMemcpyHtoD_v2, "cuMemcpyHtoD")?;
        // SAFETY: the source is a live slice readable for its byte length; the caller vouches for the destination.
        d.check("cuMemcpyHtoD", unsafe { f(dst.0, src.as_ptr().cast(), byte_len(src)) })?;
        finish_default_stream(d)
    })
}

/// Runs `copy`, a synchronous copy to or from device memory at `ptr`, in the current context; when the driver
/// refuses it there as an invalid value or context (VMM memory is mapped for its own device only: a copy made from
/// another device's context is `CUDA_ERROR_INVALID_VALUE`; a thread may have no current context), runs it once more
/// in the primary context of the device `ptr` lies on, and puts the caller's context back after. A copy the current
/// context reaches costs nothing more.
fn in_reach(ptr: DevicePtr, copy: impl Fn(&Driver) -> Result<()>) -> Result<()> {
    let d = Driver::get()?;
    let refused = match copy(d) {
        Err(e) if matches!(e.cuda_code(), Some(c) if c == INVALID_VALUE || c == INVALID_CONTEXT) => e,
        done => return done,
    };
    let Some(ordinal) = pointer_device(d, ptr) else { return Err(refused) };
    let ctx = Context::retain(Device::get(ordinal)?)?;
    let _entered = ctx.enter()?;
    copy(d)
}

const INVALID_VALUE: u32 = sys::cudaError_enum::CUDA_ERROR_INVALID_VALUE.0;
const INVALID_CONTEXT: u32 = sys::cudaError_enum::CUDA_ERROR_INVALID_CONTEXT.0;

/// The ordinal of the device whose memory `ptr` is (`CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL`); `None` when the driver
/// does not know it (not device memory).
fn pointer_device(d: &Driver, ptr: DevicePtr) -> Option<i32> {
    let f = entry!(d, cuPointerGetAttribute, "cuPointerGetAttribute").ok()?;
    let mut ordinal: i32 = -1;
    // SAFETY: this attribute writes one int into the valid local.
    let rc = unsafe { f((&mut ordinal as *mut i32).cast(), sys::CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, ptr.0) };
    (d.check("cuPointerGetAttribute", rc).is_ok() && ordinal >= 0).then_some(ordinal)
}

/// Waits for the legacy default stream, where `cuMemcpyHtoD` runs: from pageable memory that call returns once the
/// source is staged, its DMA possibly still under way, and work on a non-blocking stream (every stream this crate
/// makes) does not wait for the default stream. Without this, a kernel queued right after the copy could read the
/// destination's old bytes (seen on an H100 under MPS: the pipeline bench's study design (a) read 92,256 stale
/// words of one run). Non-blocking streams are not waited for, so a stream held by a GPU-side wait cannot block
/// this.
fn finish_default_stream(d: &Driver) -> Result<()> {
    let f = entry!(d, cuStreamSynchronize, "cuStreamSynchronize")?;
    // SAFETY: the null handle names the legacy default stream of the current context, which the copy just used.
    d.check("cuStreamSynchronize", unsafe { f(std::ptr::null_mut()) })
}

/// Copies from any device address into host memory. Synchronous. The safe form is
/// [`DeviceSpan::read`](crate::DeviceSpan::read).
///
/// # Errors
/// A failing `cuMemcpyDtoH`.
///
/// # Safety
/// `[src, src + size_of_val(dst))` must be memory the device can address that nothing writes through a Rust
/// reference while the copy runs (device memory, or host memory Rust reaches only through atomics or raw
/// pointers), and it must not overlap `dst`.
pub unsafe fn copy_from_device<T: DeviceCopy>(dst: &mut [T], src: DevicePtr) -> Result<()> {
    let (to, len) = (dst.as_mut_ptr(), byte_len(dst));
    in_reach(src, |d| {
        let f = entry!(d, cuMemcpyDtoH_v2, "cuMemcpyDtoH")?;
        // SAFETY: the destination is a live, exclusively borrowed slice writable for its byte length, and every bit
        // pattern is a valid `T` (DeviceCopy is sealed to plain numbers); the caller vouches for the source.
        d.check("cuMemcpyDtoH", unsafe { f(to.cast(), src.0, len) })
    })
}

/// Copies `bytes` from device address `src` into `dst[offset..offset + bytes]`, host memory that is not Rust-owned
/// (a shared-memory mapping, registered or not). Synchronous; a pageable copy when `dst` is not registered. The
/// safe form is [`DeviceSpan::copy_to_host_memory`](crate::DeviceSpan::copy_to_host_memory).
///
/// # Errors
/// A range beyond `dst` ([`DriverError::InvalidArgument`]) or a failing `cuMemcpyDtoH`.
///
/// # Safety
/// `[src, src + bytes)` must be memory the device can address that nothing writes through a Rust reference while
/// the copy runs.
pub unsafe fn copy_device_to_host_memory<M: RegistrableHostMemory>(
    dst: &M,
    offset: usize,
    src: DevicePtr,
    bytes: usize,
) -> Result<()> {
    check_host_range(dst, offset, bytes, "cuMemcpyDtoH")?;
    in_reach(src, |d| {
        let f = entry!(d, cuMemcpyDtoH_v2, "cuMemcpyDtoH")?;
        // SAFETY: the range was checked to lie inside `dst`, which the trait keeps mapped while it lives and which
        // Rust code reaches only through raw pointers or atomics, so a byte-wise write there breaks no aliasing
        // rule; the caller vouches for the source.
        d.check("cuMemcpyDtoH", unsafe { f(dst.as_ptr().add(offset).cast(), src.0, bytes) })
    })
}

/// Copies `src[offset..offset + bytes]`, host memory that is not Rust-owned (a shared-memory mapping), to device
/// address `dst`. Synchronous: it returns when the bytes are on the device (see `finish_default_stream`); a pageable
/// copy when `src` is not registered. The safe form is
/// [`DeviceSpan::copy_from_host_memory`](crate::DeviceSpan::copy_from_host_memory).
///
/// # Errors
/// A range beyond `src` ([`DriverError::InvalidArgument`]) or a failing `cuMemcpyHtoD`.
///
/// # Safety
/// `[dst, dst + bytes)` must be memory the device can address that no Rust reference covers while the copy runs.
pub unsafe fn copy_host_memory_to_device<M: RegistrableHostMemory>(
    dst: DevicePtr,
    src: &M,
    offset: usize,
    bytes: usize,
) -> Result<()> {
    check_host_range(src, offset, bytes, "cuMemcpyHtoD")?;
    in_reach(dst, |d| {
        let f = entry!(d, cuMemcpyHtoD_v2, "cuMemcpyHtoD")?;
        // SAFETY: the range was checked to lie inside `src`, which the trait keeps mapped while it lives; it is only
        // read; the caller vouches for the destination.
        d.check("cuMemcpyHtoD", unsafe { f(dst.0, src.as_ptr().add(offset).cast(), bytes) })?;
        finish_default_stream(d)
    })
}

fn check_host_range<M: RegistrableHostMemory>(
    memory: &M,
    offset: usize,
    bytes: usize,
    function: &'static str,
) -> Result<()> {
    match offset.checked_add(bytes) {
        Some(end) if end <= memory.len() => Ok(()),
        _ => Err(DriverError::InvalidArgument {
            function,
            problem: format!("{bytes} bytes at offset {offset} do not fit host memory of {} bytes", memory.len()),
        }),
    }
}

/// Copies `bytes` between device addresses on `stream` (asynchronous). The safe form is
/// [`DeviceSpan::copy_from_async`](crate::DeviceSpan::copy_from_async).
///
/// # Errors
/// A failing `cuMemcpyDtoDAsync`.
///
/// # Safety
/// Until the copy has run, `[dst, dst + bytes)` must be memory the device can address that no Rust reference
/// covers, and `[src, src + bytes)` memory the device can address that nothing writes through a Rust reference.
pub unsafe fn copy_device_async(dst: DevicePtr, src: DevicePtr, bytes: u64, stream: &Stream) -> Result<()> {
    let d = Driver::get()?;
    let f = entry!(d, cuMemcpyDtoDAsync_v2, "cuMemcpyDtoDAsync")?;
    // SAFETY: the caller vouches for both ranges; the driver validates the addresses; the stream is alive.
    d.check("cuMemcpyDtoDAsync", unsafe { f(dst.0, src.0, bytes as usize, stream.raw()) })
}

/// Fills `bytes` (a multiple of 4) at `dst` with a 32-bit value on `stream`. The safe form is
/// [`DeviceSpan::fill_u32_async`](crate::DeviceSpan::fill_u32_async).
///
/// # Errors
/// A size not a multiple of 4, or a failing `cuMemsetD32Async`.
///
/// # Safety
/// Until the fill has run, `[dst, dst + bytes)` must be memory the device can address that no Rust reference
/// covers.
pub unsafe fn fill_u32_async(dst: DevicePtr, bytes: u64, value: u32, stream: &Stream) -> Result<()> {
    if !bytes.is_multiple_of(4) {
        return Err(DriverError::InvalidArgument {
            function: "cuMemsetD32Async",
            problem: format!("{bytes} bytes is not a whole number of 32-bit words"),
        });
    }
    let d = Driver::get()?;
    let f = entry!(d, cuMemsetD32Async, "cuMemsetD32Async")?;
    // SAFETY: the caller vouches for the range; the driver validates the addresses; the stream is alive.
    d.check("cuMemsetD32Async", unsafe { f(dst.0, value, (bytes / 4) as usize, stream.raw()) })
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    /// Host memory of the test's own, only ever handed to the range checks.
    struct HostBytes(Box<[std::sync::atomic::AtomicU8]>);

    // SAFETY: the boxed bytes stay allocated and in place while the value lives, and are only reached as atomics.
    unsafe impl RegistrableHostMemory for HostBytes {
        fn as_ptr(&self) -> *mut u8 {
            self.0.as_ptr().cast_mut().cast()
        }
        fn len(&self) -> usize {
            self.0.len()
        }
    }

    #[test]
    fn host_memory_copies_refuse_ranges_beyond_the_memory_before_calling_the_driver() {
        let memory = HostBytes((0..4096).map(|_| std::sync::atomic::AtomicU8::new(0)).collect());
        for (offset, bytes) in [(0, 4097), (4000, 97), (usize::MAX, 2)] {
            // SAFETY: the range check fails before the driver is called, so no device address is used.
            let err = unsafe { copy_device_to_host_memory(&memory, offset, DevicePtr(0), bytes) }.unwrap_err();
            assert!(matches!(err, DriverError::InvalidArgument { function: "cuMemcpyDtoH", .. }), "{err}");
            // SAFETY: as above.
            let err = unsafe { copy_host_memory_to_device(DevicePtr(0), &memory, offset, bytes) }.unwrap_err();
            assert!(matches!(err, DriverError::InvalidArgument { function: "cuMemcpyHtoD", .. }), "{err}");
        }
        assert!(check_host_range(&memory, 96, 4000, "x").is_ok());
    }
}
