//! The `stream=` argument: `None`, a raw `CUstream` handle (an int), or any object that names one (the cuda.core
//! `__cuda_stream__` protocol, PyTorch's `.cuda_stream`, CuPy's `.ptr`); and the borrowed [`Stream`] the core's
//! GPU-side strategies queue their waits and publishes on.

use crate::errors::{ArgumentError, ArgumentTypeError};
use gpu_ipc::driver::{Borrowed, Context, Stream, raw};
use pyo3::prelude::*;
use pyo3::types::PyTuple;

/// `CU_STREAM_LEGACY`: the legacy default stream, which PyTorch and CuPy use unless told otherwise. What a GPU
/// backend uses when the caller gives no stream.
pub const LEGACY_DEFAULT_STREAM: u64 = 0x1;

/// The raw stream handle `obj` names, or `None` for `None`.
///
/// # Errors
/// `TypeError` for an object that names no stream; `ValueError` for a negative int.
pub fn stream_handle(obj: Option<&Bound<'_, PyAny>>) -> PyResult<Option<u64>> {
    let Some(obj) = obj else { return Ok(None) };
    if obj.is_none() {
        return Ok(None);
    }
    if let Ok(raw) = obj.extract::<i64>() {
        return u64::try_from(raw)
            .map(Some)
            .map_err(|_| ArgumentError::new_err(format!("a stream handle is a CUstream address, not {raw}")));
    }
    // cuda.core: `__cuda_stream__()` returns `(version, handle)`.
    if let Ok(protocol) = obj.getattr("__cuda_stream__") {
        let value = if protocol.is_callable() { protocol.call0()? } else { protocol };
        let handle = match value.cast::<PyTuple>() {
            Ok(pair) => pair.get_item(1)?,
            Err(_) => value,
        };
        return stream_handle(Some(&handle));
    }
    // torch.cuda.Stream
    if let Ok(handle) = obj.getattr("cuda_stream") {
        return stream_handle(Some(&handle));
    }
    // cupy.cuda.Stream
    if let Ok(handle) = obj.getattr("ptr") {
        return stream_handle(Some(&handle));
    }
    Err(ArgumentTypeError::new_err(format!(
        "stream must be None, an int (a CUstream handle), or an object with __cuda_stream__, .cuda_stream or .ptr; \
         got {}",
        obj.get_type().name()?
    )))
}

/// The caller's stream, borrowed for one call of the core: the core queues its GPU-side waits and publishes on it.
///
/// The handle comes from Python (a PyTorch, CuPy or cuda.core stream, or an int): the caller vouches that it is a
/// stream of the device's primary context, alive for the call, as every CUDA library that takes a raw handle does.
pub fn borrow<'a>(ctx: &Context, raw: u64) -> Borrowed<'a, Stream> {
    #[allow(unsafe_code)]
    // SAFETY: `raw` is a CUstream the Python caller handed us for this call (or CU_STREAM_LEGACY / the NULL stream,
    // always valid); every caller drops the borrow before it returns to Python, and a borrowed stream is never
    // destroyed by us. That the handle is a live stream of the device's primary context is the caller's word, as
    // with every CUDA library that takes raw handles (PyTorch's `ExternalStream`, CuPy's): the stubs say so.
    unsafe {
        Stream::borrow_raw(ctx, raw as usize as raw::CUstream)
    }
}

/// Whether two raw stream handles name the same stream: the NULL stream (0) is the legacy default stream here, as in
/// the driver API and PyTorch's `from_dlpack` (which passes 1 for its default stream).
pub fn same_stream(a: u64, b: u64) -> bool {
    let legacy = |s: u64| if s == 0 { LEGACY_DEFAULT_STREAM } else { s };
    legacy(a) == legacy(b)
}
