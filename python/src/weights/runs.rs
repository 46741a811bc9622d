//! The runs of a generation as the Python layer takes them (`ipc_toolkit::weights::find_runs`): what
//! `arena()`'s cut is made of.

use gpu_ipc::core::wire::{DType, TensorDesc};
use gpu_ipc::weights::{TensorEntry, find_runs};
use pyo3::prelude::*;

use crate::errors::ArgumentError;

/// One run as the Python layer takes it: element type name, tensor count, each tensor's shape and strides (in
/// elements), the byte offset of the first one's first element, and the bytes from one tensor to the next.
pub(crate) type RunSpec = (&'static str, usize, Vec<u64>, Vec<u64>, u64, u64);

/// [`find_runs`] as the Python layer takes it: the runs as [`RunSpec`]s, and each entry's place among their tensors.
pub(crate) fn run_specs(entries: &[TensorEntry]) -> (Vec<RunSpec>, Vec<usize>) {
    let (runs, order) = find_runs(entries);
    let specs = runs.into_iter().map(|r| (r.dtype.name(), r.count, r.shape, r.strides, r.offset, r.step)).collect();
    (specs, order)
}

/// One entry as ``_weights_runs`` takes it: element type name, shape, strides in elements (``None``: contiguous),
/// byte offset.
type EntrySpec = (String, Vec<u64>, Option<Vec<u64>>, u64);

/// ``_weights_runs(entries)``: the runs ``arena()`` gives for a manifest of ``entries`` (``(dtype, shape, strides,
/// offset)`` each; strides in elements or ``None``, offsets in bytes, each a multiple of its element size), and each
/// entry's place among the runs' tensors. For tests of the cut on layouts no owner makes.
#[pyfunction]
#[pyo3(name = "_weights_runs")]
pub fn runs_of(entries: Vec<EntrySpec>) -> PyResult<(Vec<RunSpec>, Vec<usize>)> {
    let entries = entries
        .into_iter()
        .enumerate()
        .map(|(i, (dtype, shape, strides, offset))| {
            let invalid = |e: String| ArgumentError::new_err(format!("entry {i}: {e}"));
            let dtype: DType = dtype.parse().map_err(|e| invalid(format!("{e}")))?;
            let desc = TensorDesc::new(dtype, shape, strides).map_err(|e| invalid(e.to_string()))?;
            if !offset.is_multiple_of(dtype.size_bytes().max(1)) {
                return Err(invalid(format!("offset {offset} is not a whole number of {dtype} elements")));
            }
            Ok(TensorEntry { name: format!("t{i}"), desc, offset, checksum: None })
        })
        .collect::<PyResult<Vec<_>>>()?;
    Ok(run_specs(&entries))
}
