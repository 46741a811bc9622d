//! `WeightsTensor`: one tensor of a generation, or its whole arena as one `uint8` view with the runs the Python
//! layer cuts every tensor from.

use gpu_ipc::weights::Manifest;
use pyo3::prelude::*;
use pyo3::types::PyList;

use super::runs::{RunSpec, run_specs};
use crate::mapping::MappingHold;
use crate::view::pool_view;
use crate::view::{ArrayMemory, Layout, View};

/// A generation's tensors as ``arena()`` and ``stage_arena()`` give them: the names (manifest order), the runs,
/// and for each name its place among the runs' tensors laid end to end.
pub(crate) type ArenaCut = (Py<PyList>, Vec<RunSpec>, Vec<usize>);

/// The whole arena of a generation as one ``uint8`` view, named after its pool buffer, and its tensors as runs.
pub(crate) fn arena_of(
    py: Python<'_>,
    manifest: &Manifest,
    base: u64,
    ordinal: Option<i32>,
    hold: MappingHold,
) -> PyResult<(WeightsTensor, ArenaCut)> {
    // Python strings straight from the manifest's names (no copy of each as a String first).
    let names = PyList::new(py, manifest.entries.iter().map(|e| e.name.as_str()))?.unbind();
    let (runs, order) = run_specs(&manifest.entries);
    let arena = WeightsTensor {
        name: format!("{}/{}", manifest.set_name, manifest.generation),
        generation: manifest.generation,
        ptr: base,
        layout: Layout::bytes(manifest.arena_bytes)?,
        ordinal,
        hold,
    };
    Ok((arena, (names, runs, order)))
}

/// One tensor of a weight set's generation, in place: ``torch.from_dlpack(t)``, ``cupy.from_dlpack(t)``,
/// ``numpy.from_dlpack(t)`` on the host backend. It keeps its generation (its arena, mapped and held from reuse)
/// alive while it, or a tensor made from it, lives.
#[pyclass(frozen, module = "gpu_ipc._gpu_ipc")]
pub struct WeightsTensor {
    pub(super) name: String,
    pub(super) generation: u64,
    pub(super) ptr: u64,
    pub(super) layout: Layout,
    pub(super) ordinal: Option<i32>,
    pub(super) hold: MappingHold,
}

impl ArrayMemory for WeightsTensor {
    fn layout(&self) -> &Layout {
        &self.layout
    }

    fn view(&self) -> PyResult<View> {
        Ok(pool_view(self.ptr, &self.layout, self.ordinal, self.hold.clone()))
    }
}

crate::array_protocols!(WeightsTensor);

#[pymethods]
impl WeightsTensor {
    /// The tensor's name (``SET/GENERATION`` for a whole arena).
    #[getter]
    fn name(&self) -> &str {
        &self.name
    }

    /// The generation it belongs to.
    #[getter]
    fn generation(&self) -> u64 {
        self.generation
    }

    /// Bytes from its first element to the end of its last.
    #[getter]
    fn nbytes(&self) -> u64 {
        self.layout.span_bytes
    }

    /// The address of its first byte in this process (a device address on a GPU).
    #[getter]
    fn ptr(&self) -> u64 {
        self.ptr
    }

    fn __repr__(&self) -> String {
        format!(
            "WeightsTensor(name={:?}, generation={}, shape={:?}, dtype={:?})",
            self.name, self.generation, self.layout.shape, self.layout.dtype_name
        )
    }
}
