//! `WeightsBound`: a caller's tensors bound once for copies into a staged arena (`Publisher.bind`) or out of a held
//! one (`Reader.bind`), with the gather's table kept on the device per arena (the core's `BoundCopies`), so that
//! `update(bound)` and `load_into(bound)` cost one launch however many tensors move.

use std::sync::Mutex;

use gpu_ipc::driver::DeviceSpan;
use gpu_ipc::weights::{BoundCopies, CopyDirection};
use pyo3::prelude::*;

use crate::ring::lock;

/// Tensors bound once for a weight set's copies (``gpu_ipc.weights`` keeps one in ``BoundSources`` and
/// ``BoundTargets``, beside the tensors it names, which must stay alive while it does).
#[pyclass(frozen, module = "gpu_ipc._gpu_ipc")]
pub struct WeightsBound {
    pub(super) copies: Mutex<BoundCopies<'static>>,
}

impl WeightsBound {
    pub(super) fn new(direction: CopyDirection, spans: Vec<(usize, DeviceSpan<'static>)>) -> Self {
        Self { copies: Mutex::new(BoundCopies::new(direction, spans)) }
    }
}

#[pymethods]
impl WeightsBound {
    /// Tensors bound.
    fn __len__(&self) -> usize {
        lock(&self.copies).len()
    }

    /// Arenas whose copies are prepared (their tables kept on the device; at most 8).
    #[getter]
    fn prepared_arenas(&self) -> usize {
        lock(&self.copies).prepared_arenas()
    }

    /// Tables prepared so far (one per arena met, one more when an arena's tensors moved): stops growing once
    /// every arena was met.
    #[getter]
    fn preparations(&self) -> u64 {
        lock(&self.copies).preparations()
    }

    fn __repr__(&self) -> String {
        let copies = lock(&self.copies);
        let way = match copies.direction() {
            CopyDirection::IntoArena => "sources",
            CopyDirection::OutOfArena => "targets",
        };
        format!("WeightsBound({way}, tensors={}, prepared_arenas={})", copies.len(), copies.prepared_arenas())
    }
}
