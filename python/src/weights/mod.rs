//! `gpu_ipc._gpu_ipc.WeightsOwner`, `WeightsReader` and `WeightsTensor`: the native layer under `gpu_ipc.weights`
//! (the core's `weights`): a whole state_dict in one arena per generation, read by other processes as tensors.
//! The Python module (`gpu_ipc/weights.py`) hands framework tensors (or their addresses) over; this layer checks
//! them, copies, publishes and makes DLPack views.
//!
//! - [`owner`]: `WeightsOwner` (stage, copy in, write, commit); [`reader`]: `WeightsReader` (hold, refresh, copy
//!   out, read); [`tensor`]: `WeightsTensor` and the whole arena as one view with the runs it is cut by.
//! - [`bound`]: `WeightsBound`, a caller's tensors bound once (`bind()`), copied with one launch per switch.
//! - [`runs`]: tensors of one element type, shape and strides a constant step apart, cut by one strided view.
//! - [`sources`]: a state_dict's torch tensors checked and their addresses read in one native call, each batch's
//!   copies launched as soon as it is read.
//! - Here: what the owner and the reader share (the device, the gather kernel, their getters).

mod bound;
mod owner;
mod reader;
mod runs;
mod sets;
mod sources;
mod tensor;
mod wait;

use std::path::PathBuf;
use std::sync::Mutex;

use gpu_ipc::BackendKind;
use gpu_ipc::driver::{Context, DevicePtr, DeviceSpan};
use gpu_ipc::weights::{TensorCopier, TensorEntry};
use pyo3::prelude::*;

pub use bound::WeightsBound;
pub use owner::WeightsOwner;
pub use reader::WeightsReader;
pub use runs::runs_of;
pub use sources::read_sources;
pub use tensor::WeightsTensor;
pub use wait::GenerationWait;

use crate::errors::{ArgumentError, weights_to_py};
use crate::ring::{Gpu, lock};

/// What an owner and a reader both keep: the device (none on the host backend), the gather kernel (loaded by the
/// first copy), the backend, the socket and the set's name.
pub(crate) struct Served {
    copier: Mutex<Option<TensorCopier>>,
    gpu: Option<Gpu>,
    backend: BackendKind,
    socket: PathBuf,
    name: String,
}

impl Served {
    fn new(gpu: Option<Gpu>, backend: BackendKind, socket: PathBuf, name: &str) -> Self {
        Self { copier: Mutex::new(None), gpu, backend, socket, name: name.to_owned() }
    }

    /// The device ordinal (`None` on the host backend).
    fn ordinal(&self) -> Option<i32> {
        self.gpu.as_ref().map(|g| g.ordinal)
    }

    /// The device's context (`None` on the host backend).
    fn ctx(&self) -> Option<Context> {
        self.gpu.as_ref().map(|g| g.ctx.clone())
    }

    /// The device, or the error that says a host set has none.
    fn gpu(&self) -> PyResult<&Gpu> {
        self.gpu.as_ref().ok_or_else(|| {
            ArgumentError::new_err("this weight set is on the host backend: there is no device to copy on")
        })
    }

    /// Runs `f` with the gather kernel, loaded in the device's context on first use.
    fn with_copier<R>(&self, f: impl FnOnce(&mut TensorCopier) -> PyResult<R>) -> PyResult<R> {
        let gpu = self.gpu()?;
        let mut copier = lock(&self.copier);
        let copier = match &mut *copier {
            Some(c) => c,
            None => copier.insert(TensorCopier::new(&gpu.ctx).map_err(weights_to_py)?),
        };
        f(copier)
    }

    fn repr(&self, class: &str, generation: u64) -> String {
        format!(
            "{class}(name={:?}, socket={:?}, backend={:?}, generation={generation})",
            self.name,
            self.socket,
            self.backend.name()
        )
    }

    /// In a process forked from the one that made it: the kernel and the context are the parent's, forgotten
    /// rather than released.
    fn forget(&mut self) {
        std::mem::forget(lock(&self.copier).take());
        std::mem::forget(self.gpu.take());
    }
}

/// The getters an owner and a reader share (`name`, `backend`, `device`, `socket`), from their `served` field.
macro_rules! served_getters {
    ($class:ty) => {
        #[pyo3::pymethods]
        impl $class {
            /// The weight set's name.
            #[getter]
            fn name(&self) -> &str {
                &self.served.name
            }

            /// The backend: ``"vmm"``, ``"legacy"`` or ``"host"``.
            #[getter]
            fn backend(&self) -> &'static str {
                self.served.backend.name()
            }

            /// The CUDA device ordinal (``None`` on the host backend).
            #[getter]
            fn device(&self) -> Option<i32> {
                self.served.ordinal()
            }

            /// The socket the set is served at.
            #[getter]
            fn socket(&self) -> std::path::PathBuf {
                self.served.socket.clone()
            }
        }
    };
}
use served_getters;

/// A device span over memory a Python caller named by pointer (a framework tensor's storage).
fn caller_span<'a>(ptr: u64, bytes: u64) -> DeviceSpan<'a> {
    #[allow(unsafe_code)]
    // SAFETY: `ptr` and `bytes` come from the tensor's own description (`data_ptr()` and its byte span, or its
    // `__cuda_array_interface__`), taken from a tensor the caller holds for the whole call and until the device
    // finished the copy; it is device memory of the set's device (its device is checked first), and no Rust
    // reference covers it. That the object describes its memory truthfully is the caller's word, as with every
    // library that takes a pointer.
    unsafe {
        DeviceSpan::from_raw_parts(DevicePtr(ptr), bytes)
    }
}

/// The copies `ptrs` names: `ptrs[i]` is the caller's memory for tensor `first + i` of `entries` (its whole byte
/// span), 0 for none.
fn caller_copies(entries: &[TensorEntry], first: usize, ptrs: &[u64]) -> PyResult<Vec<(usize, DeviceSpan<'static>)>> {
    if first.checked_add(ptrs.len()).is_none_or(|end| end > entries.len()) {
        return Err(ArgumentError::new_err(format!(
            "tensors {first}..{} asked of a set of {} tensors",
            first.saturating_add(ptrs.len()),
            entries.len()
        )));
    }
    Ok(ptrs
        .iter()
        .zip(&entries[first..])
        .enumerate()
        .filter(|(_, (ptr, _))| **ptr != 0)
        .map(|(i, (ptr, entry))| (first + i, caller_span(*ptr, entry.span_bytes())))
        .collect())
}
