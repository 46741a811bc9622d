//! `GenerationWait`: a wait for a generation (``Reader.wait_on`` on a stream, or ``Reader.watch``), with the
//! reader's status word as a 0-d ``int64`` array (DLPack, ``__cuda_array_interface__``) for device-side checks.

use std::sync::{Arc, LazyLock};

use gpu_ipc::driver::Context;
use gpu_ipc::weights::{GONE_BIT, GenerationWait as CoreWait, GenerationWaitStatus};
use pyo3::prelude::*;

use crate::mapping::MappingHold;
use crate::view::pool_view;
use crate::view::{ArrayMemory, Layout, View};

static WORD_LAYOUT: LazyLock<Layout> = LazyLock::new(Layout::word);

/// ``("waiting" | "published" | "gone", newest)``: what a status says, as Python sees it.
pub(super) fn status_tuple(status: GenerationWaitStatus) -> (&'static str, u64) {
    match status {
        GenerationWaitStatus::Waiting => ("waiting", 0),
        GenerationWaitStatus::Published { newest } => ("published", newest),
        GenerationWaitStatus::OwnerGone { newest } => ("gone", newest),
    }
}

/// A wait for a generation of a weight set (``Reader.wait_on``, ``Reader.watch``). ``Reader.wait_status(wait)``
/// says how it stands; on the device, read the status word (``torch.from_dlpack(wait)``, a 0-d ``int64``, no
/// copy; ordered on the stream you queue the read on, so queue it after the wait): the generation is published
/// iff ``(word & ~GONE_BIT) >= wait.generation``; else ``word & GONE_BIT`` says the owner is gone (or the reader
/// closed). The word stays allocated (and registered) while this object or an array made from it lives.
#[pyclass(frozen, module = "gpu_ipc._gpu_ipc")]
pub struct GenerationWait {
    pub(super) wait: CoreWait,
    pub(super) ordinal: Option<i32>,
    pub(super) ctx: Option<Context>,
}

impl ArrayMemory for GenerationWait {
    fn layout(&self) -> &Layout {
        &WORD_LAYOUT
    }

    fn view(&self) -> PyResult<View> {
        let hold = MappingHold::new(Arc::clone(self.wait.word()), self.ctx.clone());
        Ok(pool_view(self.wait.status_word().raw(), &WORD_LAYOUT, self.ordinal, hold))
    }
}

crate::array_protocols!(GenerationWait);

#[pymethods]
impl GenerationWait {
    /// The generation waited for.
    #[getter]
    fn generation(&self) -> u64 {
        self.wait.generation()
    }

    /// The status word's address for kernels (read-only for them): a device address on a GPU backend, a host
    /// address on the host backend.
    #[getter]
    fn status_word(&self) -> u64 {
        self.wait.status_word().raw()
    }

    /// The bit of the status word that says the owner is gone (or the reader closed): ``1 << 62``.
    #[classattr]
    #[allow(non_snake_case)]
    fn GONE_BIT() -> u64 {
        GONE_BIT
    }

    /// What ``word`` (a value read at ``status_word``) says of this wait: ``"published"``, ``"gone"`` or
    /// ``"waiting"``.
    fn status_of(&self, word: u64) -> &'static str {
        status_tuple(self.wait.status_of(word)).0
    }

    fn __repr__(&self) -> String {
        format!("GenerationWait(generation={}, word={:#x})", self.wait.generation(), self.wait.word().load())
    }
}
