//! `gpu_ipc.PoolImporter` and `BufferView`: the importers' side of named buffers shared between processes (the core's
//! `pool`): attach once, find buffers by name, read them in place as tensors.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use gpu_ipc::BackendKind;
use gpu_ipc::core::wire::ObjectKind;
use gpu_ipc::host::{Host, HostContext};
use gpu_ipc::legacy::Legacy;
use gpu_ipc::pool::{AttachOptions, BufferView as CoreView, PoolError, PoolImporter as CoreImporter};
use gpu_ipc::toolkit::door::{self, DoorError};
use gpu_ipc::vmm::Vmm;
use pyo3::prelude::*;
use pyo3::types::PyTuple;

use crate::each_backend;
use crate::errors::{ReleasedError, door_to_py, pool_to_py};
use crate::mapping::MappingHold;
use crate::ring::{Gpu, PerBackend, SLICE, Shared, lock, parse_backend, seconds};
use crate::view::pool_view;
use crate::view::{ArrayMemory, Layout, View};

type Importer = PerBackend<CoreImporter<Legacy>, CoreImporter<Vmm>, CoreImporter<Host>>;
type Viewed = PerBackend<CoreView<Legacy>, CoreView<Vmm>, CoreView<Host>>;

/// One process's attachment to a pool: finds its buffers by name, with no round trip to the owner.
///
/// ``backend``: the pool's (``None``, the default: asked of the owner). Usually made for you by ``gpu_ipc.open``.
#[pyclass(frozen, module = "gpu_ipc._gpu_ipc")]
pub struct PoolImporter {
    importer: Shared<Importer>,
    gpu: Option<Gpu>,
    backend: BackendKind,
    socket: PathBuf,
}

impl PoolImporter {
    fn importer(&self) -> PyResult<Arc<Importer>> {
        self.importer.get("pool importer")
    }
}

#[pymethods]
impl PoolImporter {
    #[new]
    #[pyo3(signature = (socket, backend=None, device=0, name="pool-importer", timeout=5.0, wait_for_owner=0.0))]
    fn new(
        py: Python<'_>,
        socket: PathBuf,
        backend: Option<&str>,
        device: i32,
        name: &str,
        timeout: f64,
        wait_for_owner: f64,
    ) -> PyResult<Self> {
        let timeout = seconds(timeout)?;
        let give_up = Instant::now() + seconds(wait_for_owner)?;
        // Attaching (and asking the owner its backend) is tried again while nobody listens, in slices: Ctrl-C works.
        let backend = loop {
            let asked = match backend {
                Some(name) => Ok(parse_backend(name)?),
                None => py.detach(|| door::status(&socket, timeout).map(|report| report.backend)),
            };
            match asked {
                Err(DoorError::NoOwner { .. }) if Instant::now() < give_up => {
                    py.check_signals()?;
                    std::thread::sleep(Duration::from_millis(20).min(SLICE));
                }
                // The status request names no kind: nothing listening here means no pool.
                Err(DoorError::NoOwner { path, .. }) => {
                    return Err(door_to_py(DoorError::NoOwner { path, kind: ObjectKind::Pool }));
                }
                other => break other.map_err(door_to_py)?,
            }
        };
        let gpu = Gpu::for_backend(py, backend, device)?;
        let options = AttachOptions { name: name.to_owned(), timeout };
        let importer = loop {
            let attached = py.detach(|| -> Result<Importer, PoolError> {
                Ok(match (backend, &gpu) {
                    (BackendKind::Host, _) => PerBackend::Host(CoreImporter::attach(&HostContext, &socket, &options)?),
                    (BackendKind::Legacy, Some(g)) => {
                        PerBackend::Legacy(CoreImporter::attach(&g.ctx, &socket, &options)?)
                    }
                    (_, Some(g)) => PerBackend::Vmm(CoreImporter::attach(&g.ctx, &socket, &options)?),
                    (other, None) => return Err(PoolError::Unsupported(format!("backend {other} needs a GPU"))),
                })
            });
            match attached {
                Err(PoolError::Door(DoorError::NoOwner { .. })) if Instant::now() < give_up => {
                    py.check_signals()?;
                    std::thread::sleep(Duration::from_millis(20).min(SLICE));
                }
                other => break other.map_err(pool_to_py)?,
            }
        };
        Ok(Self { importer: Shared::new(importer), gpu, backend, socket })
    }

    /// The live buffer named ``name``, as a view pinned for as long as it (or a tensor made from it) lives: its
    /// bytes are not reused meanwhile, even if the owner frees it. Raises ``NotFound``, ``OwnerGone``.
    fn lookup(&self, py: Python<'_>, name: &str) -> PyResult<BufferView> {
        let importer = self.importer()?;
        let viewed = py
            .detach(|| -> Result<Viewed, PoolError> {
                Ok(match &*importer {
                    PerBackend::Legacy(i) => PerBackend::Legacy(i.lookup(name)?),
                    PerBackend::Vmm(i) => PerBackend::Vmm(i.lookup(name)?),
                    PerBackend::Host(i) => PerBackend::Host(i.lookup(name)?),
                })
            })
            .map_err(pool_to_py)?;
        BufferView::new(viewed, self.gpu.clone())
    }

    /// The names of the live buffers, as the pool's directory lists them now.
    fn names(&self, py: Python<'_>) -> PyResult<Vec<String>> {
        let importer = self.importer()?;
        let listed = py.detach(|| each_backend!(&*importer, i => i.list())).map_err(pool_to_py)?;
        Ok(listed.into_iter().map(|info| info.name).collect())
    }

    /// Whether the owner closed the pool or went away (views already held stay valid).
    #[getter]
    fn owner_gone(&self) -> PyResult<bool> {
        Ok(each_backend!(&*self.importer()?, i => i.owner_gone()))
    }

    #[getter]
    fn backend(&self) -> &'static str {
        self.backend.name()
    }

    #[getter]
    fn socket(&self) -> PathBuf {
        self.socket.clone()
    }
}

crate::closable!(PoolImporter, importer, "Detaches (views already made stay valid). Idempotent.");

impl Drop for PoolImporter {
    fn drop(&mut self) {
        if self.importer.made_elsewhere() {
            std::mem::forget(self.gpu.take());
        }
    }
}

/// A pool buffer as seen by an importer: read and write it in place as a tensor (``torch.from_dlpack(view)``,
/// ``cupy.from_dlpack(view)``, ``numpy.from_dlpack(view)`` on the host backend), no copy.
///
/// The view (and every tensor made from it) pins the buffer: its bytes are not reused, even after the owner freed
/// it, until the last of them is gone; then GPU work queued so far is waited for before the pin goes. No stream
/// orders it: when the bytes are ready is for the processes sharing it to agree on (a ``Semaphore``, say).
/// ``release()`` gives up this object's pin; tensors made from it keep theirs.
#[pyclass(frozen, module = "gpu_ipc._gpu_ipc")]
pub struct BufferView {
    view: Mutex<Option<Arc<Viewed>>>,
    gpu: Option<Gpu>,
    name: String,
    generation: u64,
    ptr: u64,
    layout: Layout,
    /// The process that looked it up (see `release`).
    pid: u32,
}

impl BufferView {
    fn new(viewed: Viewed, gpu: Option<Gpu>) -> PyResult<Self> {
        let (name, generation, ptr, len, desc) = each_backend!(&viewed, v => (
            v.name().to_owned(),
            v.generation(),
            v.ptr().0,
            v.len(),
            v.desc().cloned()
        ));
        let layout = match &desc {
            Some(desc) => Layout::of_tensor(desc)?,
            None => Layout::bytes(len)?,
        };
        Ok(Self {
            view: Mutex::new(Some(Arc::new(viewed))),
            gpu,
            name,
            generation,
            ptr,
            layout,
            pid: std::process::id(),
        })
    }

    fn held(&self) -> PyResult<Arc<Viewed>> {
        lock(&self.view).clone().ok_or_else(|| ReleasedError::new_err(format!("view of `{}` was released", self.name)))
    }
}

impl ArrayMemory for BufferView {
    fn layout(&self) -> &Layout {
        &self.layout
    }

    fn view(&self) -> PyResult<View> {
        let viewed = self.held()?;
        let hold = MappingHold::new(viewed, self.gpu.as_ref().map(|g| g.ctx.clone()));
        Ok(pool_view(self.ptr, &self.layout, self.gpu.as_ref().map(|g| g.ordinal), hold))
    }
}

crate::array_protocols!(BufferView);

#[pymethods]
impl BufferView {
    #[getter]
    fn name(&self) -> &str {
        &self.name
    }

    /// The generation this view holds (a buffer freed and allocated again under its name has another).
    #[getter]
    fn generation(&self) -> u64 {
        self.generation
    }

    #[getter]
    fn nbytes(&self) -> u64 {
        self.layout.span_bytes
    }

    /// The address of its first byte in this process (a device address on a GPU).
    #[getter]
    fn ptr(&self) -> PyResult<u64> {
        self.held().map(|_| self.ptr)
    }

    /// Raises ``StaleBuffer`` once the owner freed the buffer (the view's bytes stay valid), ``ReleasedError`` after
    /// ``release``.
    fn check_current(&self) -> PyResult<()> {
        each_backend!(&*self.held()?, v => v.check_current()).map_err(pool_to_py)
    }

    /// Gives up this object's pin (tensors made from it keep theirs). Idempotent.
    fn release(&self) {
        let Some(viewed) = lock(&self.view).take() else { return };
        if self.pid == std::process::id() {
            drop(MappingHold::new(viewed, self.gpu.as_ref().map(|g| g.ctx.clone())));
        } else {
            // A forked child's copy: the pin and the mapping are the parent's.
            std::mem::forget(viewed);
        }
    }

    #[getter]
    fn released(&self) -> bool {
        lock(&self.view).is_none()
    }

    fn __enter__(slf: Bound<'_, Self>) -> Bound<'_, Self> {
        slf
    }

    #[pyo3(signature = (*_args))]
    fn __exit__(&self, _args: &Bound<'_, PyTuple>) -> bool {
        self.release();
        false
    }

    fn __repr__(&self) -> String {
        format!(
            "BufferView(name={:?}, generation={}, shape={:?}, dtype={:?}{})",
            self.name,
            self.generation,
            self.layout.shape,
            self.layout.dtype_name,
            if self.released() { ", released" } else { "" }
        )
    }
}

impl Drop for BufferView {
    fn drop(&mut self) {
        // Through a hold: the pin goes only after the device's queued work (or is forgotten in a forked child).
        self.release();
    }
}
