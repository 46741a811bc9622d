//! A state_dict's tensors checked and their addresses read in one native call, batch by batch, each batch's
//! copies launched (by the caller's closure) as soon as it is read, so that the GPU copies one batch while the
//! next is read: what keeps `Publisher.update()` and `Reader.load_into()` of 19,000 tensors near the speed of one
//! memcpy. Only tensors whose every check passes are taken here; the first one that does not stops the call, and
//! the Python layer handles it (and says what is wrong with it) the slow way.
//!
//! The checks, per tensor, are those `gpu_ipc.weights` makes: an instance of the framework's tensor type, its
//! element type the very object expected (torch dtypes are singletons, so compared by identity), its shape equal
//! to the expected one, on the set's CUDA device, contiguous; then its `data_ptr()`.

use pyo3::intern;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList, PyType};

use crate::errors::ArgumentError;

/// Tensors read before the first launch: few, so that the GPU starts early.
const FIRST_BATCH: usize = 64;
/// Tensors per launch at most (the batches double up to it).
const MAX_BATCH: usize = 2048;

/// What every tensor of a copy must be, in the set's order: objects made once per set by the Python layer.
pub(crate) struct Expected<'a, 'py> {
    /// The framework's tensor type (`torch.Tensor`).
    pub kind: &'a Bound<'py, PyType>,
    /// The names, in the set's order: the keys of the state_dict.
    pub names: &'a Bound<'py, PyList>,
    /// Each tensor's element type object (`torch.bfloat16`), compared by identity.
    pub dtypes: &'a Bound<'py, PyList>,
    /// Each tensor's shape (a tuple), compared by equality.
    pub shapes: &'a Bound<'py, PyList>,
    /// The CUDA device ordinal every tensor must be on.
    pub device: i64,
}

impl Expected<'_, '_> {
    /// Refuses lists of different lengths (a bug in the caller, not the user's input).
    fn check(&self) -> PyResult<usize> {
        let n = self.names.len();
        if self.dtypes.len() != n || self.shapes.len() != n {
            return Err(ArgumentError::new_err(format!(
                "{n} names, {} dtypes and {} shapes: one of each per tensor",
                self.dtypes.len(),
                self.shapes.len()
            )));
        }
        Ok(n)
    }

    /// The address of tensor `i` of `tensors` when it passes every check, else `None`.
    fn address(&self, tensors: &Bound<'_, PyDict>, i: usize) -> Option<u64> {
        let py = tensors.py();
        let t = tensors.get_item(self.names.get_item(i).ok()?).ok()??;
        if !t.is_instance(self.kind).ok()? {
            return None;
        }
        if !t.getattr(intern!(py, "dtype")).ok()?.is(&self.dtypes.get_item(i).ok()?) {
            return None;
        }
        if !t.getattr(intern!(py, "shape")).ok()?.eq(self.shapes.get_item(i).ok()?).ok()? {
            return None;
        }
        if t.call_method0(intern!(py, "get_device")).ok()?.extract::<i64>().ok()? != self.device {
            return None;
        }
        if !t.call_method0(intern!(py, "is_contiguous")).ok()?.is_truthy().ok()? {
            return None;
        }
        t.call_method0(intern!(py, "data_ptr")).ok()?.extract::<u64>().ok().filter(|p| *p != 0)
    }
}

/// Reads the addresses of `tensors[names[first..]]` batch by batch (64, 128, ... up to 2,048 tensors) and hands
/// each batch to `launch(first_of_batch, addresses)` as soon as it is read; returns the index of the first tensor
/// that fails a check (or is missing), after launching those before it, or the tensor count when all passed.
pub(crate) fn copy_batches(
    tensors: &Bound<'_, PyDict>,
    first: usize,
    expected: &Expected<'_, '_>,
    mut launch: impl FnMut(usize, &[u64]) -> PyResult<()>,
) -> PyResult<usize> {
    let n = expected.check()?;
    let mut at = first.min(n);
    let mut batch = FIRST_BATCH;
    let mut ptrs = Vec::with_capacity(MAX_BATCH);
    while at < n {
        let end = (at + batch).min(n);
        ptrs.clear();
        ptrs.extend((at..end).map_while(|i| expected.address(tensors, i)));
        if !ptrs.is_empty() {
            launch(at, &ptrs)?;
        }
        if ptrs.len() < end - at {
            return Ok(at + ptrs.len());
        }
        at = end;
        batch = (batch * 2).min(MAX_BATCH);
    }
    Ok(n)
}

/// The addresses of `tensors[names[first..]]` read as [`copy_batches`] reads them, all at once, and the index of the
/// first tensor that fails a check (the tensor count when none does): for a copy that starts only once every
/// tensor passed.
pub(crate) fn read_all(
    tensors: &Bound<'_, PyDict>,
    first: usize,
    expected: &Expected<'_, '_>,
) -> PyResult<(Vec<u64>, usize)> {
    let mut all = Vec::new();
    let stop = copy_batches(tensors, first, expected, |_, ptrs| {
        all.extend_from_slice(ptrs);
        Ok(())
    })?;
    Ok((all, stop))
}

/// ``_weights_read_sources(tensors, names, first, kind, dtypes, shapes, device)``: the addresses
/// ``Publisher.update`` would copy from, read the way it reads them, and the index of the first tensor that fails
/// a check (``len(names)`` when none does). For tests and measurements of that step without a GPU.
#[pyfunction]
#[pyo3(name = "_weights_read_sources")]
pub fn read_sources(
    tensors: &Bound<'_, PyDict>,
    names: &Bound<'_, PyList>,
    first: usize,
    kind: &Bound<'_, PyType>,
    dtypes: &Bound<'_, PyList>,
    shapes: &Bound<'_, PyList>,
    device: i64,
) -> PyResult<(Vec<u64>, usize)> {
    read_all(tensors, first, &Expected { kind, names, dtypes, shapes, device })
}
