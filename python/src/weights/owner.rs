//! `WeightsOwner`: the owner of a weight set, under `gpu_ipc.weights.Publisher`.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use gpu_ipc::BackendKind;
use gpu_ipc::core::backend::GpuBackend;
use gpu_ipc::core::wire::{DType, TensorDesc};
use gpu_ipc::driver::Stream;
use gpu_ipc::driver::{Context, DeviceUuid};
use gpu_ipc::host::{Host, HostContext};
use gpu_ipc::legacy::Legacy;
use gpu_ipc::pool::PoolError;
use gpu_ipc::vmm::Vmm;
use gpu_ipc::weights::{
    ArenaBytes, BoundCopies, CopyDirection, TensorCopier, WeightsError, WeightsOptions, WeightsOwner as CoreOwner,
    WeightsPartsOwner as CoreParts,
};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList, PyType};

use super::bound::WeightsBound;
use super::sets::OwnedSet;
use super::sources::{Expected, copy_batches};
use super::tensor::{ArenaCut, WeightsTensor, arena_of};
use super::{Served, caller_copies, served_getters};
use crate::each_backend;
use crate::errors::{ArgumentError, driver_to_py, weights_to_py};
use crate::mapping::MappingHold;
use crate::ring::{Gpu, PerBackend, Shared, lock, parse_backend};
use crate::stream::{LEGACY_DEFAULT_STREAM, borrow, stream_handle};
use crate::view::Layout;

type Owner = PerBackend<OwnedSet<Legacy>, OwnedSet<Vmm>, OwnedSet<Host>>;

/// One tensor's description as the Python layer gives it: name, element type name, shape.
type TensorSpec = (String, String, Vec<u64>);

/// Queues on `stream` the copies of `ptrs` (the caller's memory of tensors `first..`, 0: none) into `owner`'s
/// staged arena, staging one first if none is.
fn copy_into_staged(
    owner: &mut Owner,
    part: usize,
    copier: &mut TensorCopier,
    first: usize,
    ptrs: &[u64],
    stream: &Stream,
) -> PyResult<()> {
    fn copy<B: ArenaBytes + GpuBackend>(
        o: &mut OwnedSet<B>,
        part: usize,
        copier: &mut TensorCopier,
        first: usize,
        ptrs: &[u64],
        stream: &Stream,
    ) -> PyResult<()> {
        let staged = o.stage(part).map_err(weights_to_py)?;
        let copies = caller_copies(&staged.manifest().entries, first, ptrs)?;
        staged.copy_in(copier, &copies, stream).map_err(weights_to_py)
    }
    match owner {
        PerBackend::Legacy(o) => copy(o, part, copier, first, ptrs, stream),
        PerBackend::Vmm(o) => copy(o, part, copier, first, ptrs, stream),
        PerBackend::Host(_) => Err(ArgumentError::new_err("copy_in is for GPU backends; use write")),
    }
}

/// The owner of a weight set (``gpu_ipc.weights.publish`` makes one): its tensors' layout is fixed when made. For
/// a set on several devices (``WeightsOwner.parts``), one handle per part: each stages, copies and describes its
/// part's tensors on its device; ``commit``, ``generation`` and ``close`` are the set's.
#[pyclass(frozen, module = "gpu_ipc._gpu_ipc")]
pub struct WeightsOwner {
    owner: Shared<Mutex<Owner>>,
    /// The part this handle stands for (0 for a set on one device).
    part: usize,
    /// Every part's context (a set on one device: its own), synchronized before a commit.
    contexts: Vec<Context>,
    served: Served,
}

impl WeightsOwner {
    fn owner(&self) -> PyResult<Arc<Mutex<Owner>>> {
        self.owner.get("weight set owner")
    }
}

#[pymethods]
impl WeightsOwner {
    #[new]
    #[pyo3(signature = (socket, name, layout, backend="vmm", device=0, keep=2, checksums=false, max_arenas=None, max_readers=None))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        socket: PathBuf,
        name: &str,
        layout: Vec<TensorSpec>,
        backend: &str,
        device: i32,
        keep: usize,
        checksums: bool,
        max_arenas: Option<u32>,
        max_readers: Option<u32>,
    ) -> PyResult<Self> {
        let backend = parse_backend(backend)?;
        let tensors = layout
            .into_iter()
            .map(|(tensor, dtype, shape)| tensor_desc(tensor, &dtype, shape))
            .collect::<PyResult<Vec<_>>>()?;
        let options = options_of(keep, checksums, max_arenas, max_readers)?;
        let gpu = Gpu::for_backend(py, backend, device)?;
        let owner = py
            .detach(|| -> Result<Owner, WeightsError> {
                Ok(match (backend, &gpu) {
                    (BackendKind::Host, _) => PerBackend::Host(OwnedSet::Whole(CoreOwner::create(
                        &HostContext,
                        &socket,
                        name,
                        tensors,
                        options,
                    )?)),
                    (BackendKind::Legacy, Some(g)) => {
                        PerBackend::Legacy(OwnedSet::Whole(CoreOwner::create(&g.ctx, &socket, name, tensors, options)?))
                    }
                    (_, Some(g)) => {
                        PerBackend::Vmm(OwnedSet::Whole(CoreOwner::create(&g.ctx, &socket, name, tensors, options)?))
                    }
                    (other, None) => {
                        return Err(WeightsError::Pool(PoolError::Unsupported(format!("backend {other} needs a GPU"))));
                    }
                })
            })
            .map_err(weights_to_py)?;
        let contexts = gpu.iter().map(|g| g.ctx.clone()).collect();
        let owner = Shared::new(Mutex::new(owner));
        Ok(Self { owner, part: 0, contexts, served: Served::new(gpu, backend, socket, name) })
    }

    /// Serves a set on several devices, one part per CUDA device of ``devices`` (part order): ``layout`` gives
    /// each tensor's ``(name, dtype, shape, part)`` in the publisher's order; every part holds at least one.
    /// Returns one handle per part. On the host backend (tests: there are no devices), ``devices`` only counts the
    /// parts, and their manifests name made-up distinct device UUIDs.
    #[staticmethod]
    #[pyo3(signature = (socket, name, layout, devices, backend="vmm", keep=2, checksums=false, max_arenas=None, max_readers=None))]
    #[allow(clippy::too_many_arguments)]
    fn parts(
        py: Python<'_>,
        socket: PathBuf,
        name: &str,
        layout: Vec<(String, String, Vec<u64>, usize)>,
        devices: Vec<i32>,
        backend: &str,
        keep: usize,
        checksums: bool,
        max_arenas: Option<u32>,
        max_readers: Option<u32>,
    ) -> PyResult<Vec<Self>> {
        let backend = parse_backend(backend)?;
        let tensors = layout
            .into_iter()
            .map(|(tensor, dtype, shape, part)| {
                let (tensor, desc) = tensor_desc(tensor, &dtype, shape)?;
                Ok((tensor, desc, part))
            })
            .collect::<PyResult<Vec<_>>>()?;
        let options = options_of(keep, checksums, max_arenas, max_readers)?;
        let gpus = devices.iter().map(|&d| Gpu::for_backend(py, backend, d)).collect::<PyResult<Vec<_>>>()?;
        let contexts: Vec<Context> = gpus.iter().flatten().map(|g| g.ctx.clone()).collect();
        let owner = py
            .detach(|| -> Result<Owner, WeightsError> {
                Ok(match backend {
                    BackendKind::Host => {
                        let n = devices.len();
                        let made_up = (0..n).map(|k| DeviceUuid([0xd0 ^ (k as u8); 16])).collect();
                        let (ctxs, pools) = (vec![HostContext; n], vec![DeviceUuid::default(); n]);
                        let parts = CoreParts::create_on(ctxs, pools, made_up, &socket, name, tensors, options)?;
                        PerBackend::Host(OwnedSet::Parts(parts))
                    }
                    BackendKind::Legacy => PerBackend::Legacy(OwnedSet::Parts(CoreParts::create(
                        contexts.clone(),
                        &socket,
                        name,
                        tensors,
                        options,
                    )?)),
                    _ => PerBackend::Vmm(OwnedSet::Parts(CoreParts::create(
                        contexts.clone(),
                        &socket,
                        name,
                        tensors,
                        options,
                    )?)),
                })
            })
            .map_err(weights_to_py)?;
        let owner = Arc::new(Mutex::new(owner));
        Ok(gpus
            .into_iter()
            .enumerate()
            .map(|(part, gpu)| Self {
                owner: Shared::sharing(owner.clone()),
                part,
                contexts: contexts.clone(),
                served: Served::new(gpu, backend, socket.clone(), name),
            })
            .collect())
    }

    /// The part this handle stands for (0 for a set on one device).
    #[getter]
    fn part(&self) -> usize {
        self.part
    }

    /// The newest published generation (0 before the first commit).
    #[getter]
    fn generation(&self) -> PyResult<u64> {
        Ok(each_backend!(&*lock(&*self.owner()?), o => o.generation()))
    }

    /// Makes (or returns) the next generation's arena and returns its tensors, writable, as ``(name, view)`` pairs.
    fn stage(&self, py: Python<'_>) -> PyResult<Vec<(String, WeightsTensor)>> {
        let owner = self.owner()?;
        let staged = py
            .detach(|| -> Result<Vec<(String, TensorDesc, u64, u64)>, WeightsError> {
                let mut guard = lock(&*owner);
                each_backend!(&mut *guard, o => {
                    let staged = o.stage(self.part)?;
                    let base = staged.handle().ptr().0;
                    let generation = staged.generation();
                    Ok(staged
                        .manifest()
                        .entries
                        .iter()
                        .map(|e| (e.name.clone(), e.desc.clone(), base + e.offset, generation))
                        .collect())
                })
            })
            .map_err(weights_to_py)?;
        staged
            .into_iter()
            .map(|(name, desc, ptr, generation)| {
                let tensor = WeightsTensor {
                    name: name.clone(),
                    generation,
                    ptr,
                    layout: Layout::of_tensor(&desc)?,
                    ordinal: self.served.ordinal(),
                    hold: MappingHold::new(owner.clone(), self.served.ctx()),
                };
                Ok((name, tensor))
            })
            .collect()
    }

    /// Makes (or returns) the next generation's arena and returns where it lies, ``(address, bytes)``: what
    /// ``stage_arena`` gives without describing the tensors (``Publisher.stage`` keeps its cuts per arena).
    fn stage_extent(&self, py: Python<'_>) -> PyResult<(u64, u64)> {
        let owner = self.owner()?;
        py.detach(|| {
            each_backend!(&mut *lock(&*owner), o => o.stage(self.part).map(|s| (s.handle().ptr().0, s.manifest().arena_bytes)))
        })
        .map_err(weights_to_py)
    }

    /// Makes (or returns) the next generation's arena and returns it whole, writable, as one ``uint8`` view, with
    /// its tensors as ``(names, runs, order)``: the names (layout order); the runs, ``(dtype, count, shape,
    /// strides, offset, step)`` each (tensors of one element type, shape and strides, ``step`` bytes apart from
    /// byte ``offset``; strides in elements); for each name, its place among the runs' tensors laid end to end.
    fn stage_arena(&self, py: Python<'_>) -> PyResult<(WeightsTensor, ArenaCut)> {
        let owner = self.owner()?;
        let (manifest, base) = py
            .detach(|| {
                each_backend!(&mut *lock(&*owner), o => o.stage(self.part).map(|s| (s.manifest().clone(), s.handle().ptr().0)))
            })
            .map_err(weights_to_py)?;
        arena_of(py, &manifest, base, self.served.ordinal(), MappingHold::new(owner, self.served.ctx()))
    }

    /// Copies the caller's device memory into the staged tensors, on ``stream`` (default: the legacy default
    /// stream) with a few launches of the gather kernel: ``ptrs[i]`` is the address of tensor ``first + i``'s
    /// bytes (layout order; a tensor of the set's device, its whole byte span; 0: not copied). Stages the next
    /// generation first if none is.
    #[pyo3(signature = (ptrs, first=0, stream=None))]
    fn copy_in(&self, py: Python<'_>, ptrs: Vec<u64>, first: usize, stream: Option<&Bound<'_, PyAny>>) -> PyResult<()> {
        let ctx = &self.served.gpu()?.ctx;
        let raw = stream_handle(stream)?.unwrap_or(LEGACY_DEFAULT_STREAM);
        let owner = self.owner()?;
        py.detach(|| {
            self.served.with_copier(|copier| {
                copy_into_staged(&mut lock(&*owner), self.part, copier, first, &ptrs, &borrow(ctx, raw))
            })
        })
    }

    /// Binds the caller's device memory for ``copy_in_bound``: ``ptrs[i]`` is the address of tensor ``i``'s source
    /// (layout order; its whole byte span, on the set's device; 0: not copied). That memory must stay the
    /// caller's while the result lives (``Publisher.bind`` keeps the tensors beside it).
    fn bind_sources(&self, ptrs: Vec<u64>) -> PyResult<WeightsBound> {
        self.served.gpu()?;
        let owner = self.owner()?;
        let guard = lock(&*owner);
        let spans = each_backend!(&*guard, o => caller_copies(&o.part(self.part).layout().entries, 0, &ptrs))?;
        Ok(WeightsBound::new(CopyDirection::IntoArena, spans))
    }

    /// Queues on ``stream`` (default: the legacy default stream) the copies ``bound`` names into the staged tensors
    /// with one launch of the gather kernel (its table prepared once per arena), staging the next generation first
    /// if none is.
    #[pyo3(signature = (bound, stream=None))]
    fn copy_in_bound(&self, py: Python<'_>, bound: &WeightsBound, stream: Option<&Bound<'_, PyAny>>) -> PyResult<()> {
        fn copy<B: ArenaBytes + GpuBackend>(
            o: &mut OwnedSet<B>,
            part: usize,
            copier: &mut TensorCopier,
            bound: &mut BoundCopies<'_>,
            stream: &Stream,
        ) -> PyResult<()> {
            let staged = o.stage(part).map_err(weights_to_py)?;
            staged.copy_in_bound(copier, bound, stream).map_err(weights_to_py)
        }
        let ctx = &self.served.gpu()?.ctx;
        let raw = stream_handle(stream)?.unwrap_or(LEGACY_DEFAULT_STREAM);
        let owner = self.owner()?;
        py.detach(|| {
            self.served.with_copier(|copier| {
                let (mut guard, mut copies, stream) = (lock(&*owner), lock(&bound.copies), borrow(ctx, raw));
                match &mut *guard {
                    PerBackend::Legacy(o) => copy(o, self.part, copier, &mut copies, &stream),
                    PerBackend::Vmm(o) => copy(o, self.part, copier, &mut copies, &stream),
                    PerBackend::Host(_) => Err(ArgumentError::new_err("copy_in_bound is for GPU backends; use write")),
                }
            })
        })
    }

    /// Copies ``tensors[names[i]]`` into staged tensor ``i`` for ``i`` from ``first`` on, while each is a ``kind``
    /// (``torch.Tensor``) whose ``dtype`` is ``dtypes[i]`` (the same object), whose ``shape`` equals
    /// ``shapes[i]``, on the set's device, contiguous: read and launched batch by batch on ``stream`` (the GPU
    /// copies one batch while the next is read). Returns the index of the first tensor that is not (or missing),
    /// after queueing those before it; ``len(names)`` when every one was. Stages the next generation first if
    /// none is. The tensors must stay alive until ``commit``.
    #[pyo3(signature = (tensors, names, first, kind, dtypes, shapes, stream=None))]
    #[allow(clippy::too_many_arguments)]
    fn copy_in_from(
        &self,
        py: Python<'_>,
        tensors: &Bound<'_, PyDict>,
        names: &Bound<'_, PyList>,
        first: usize,
        kind: &Bound<'_, PyType>,
        dtypes: &Bound<'_, PyList>,
        shapes: &Bound<'_, PyList>,
        stream: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<usize> {
        let gpu = self.served.gpu()?;
        let raw = stream_handle(stream)?.unwrap_or(LEGACY_DEFAULT_STREAM);
        let owner = self.owner()?;
        let expected = Expected { kind, names, dtypes, shapes, device: i64::from(gpu.ordinal) };
        copy_batches(tensors, first, &expected, |at, ptrs| {
            py.detach(|| {
                self.served.with_copier(|copier| {
                    copy_into_staged(&mut lock(&*owner), self.part, copier, at, ptrs, &borrow(&gpu.ctx, raw))
                })
            })
        })
    }

    /// Writes ``data`` (the tensor's bytes) into the staged tensor ``name`` (from host memory: ``cuMemcpyHtoD`` on
    /// a GPU). Stages the next generation first if none is.
    fn write(&self, py: Python<'_>, name: &str, data: &[u8]) -> PyResult<()> {
        let owner = self.owner()?;
        py.detach(|| {
            let mut guard = lock(&*owner);
            each_backend!(&mut *guard, o => o.stage(self.part).and_then(|s| s.write(name, data)))
        })
        .map_err(weights_to_py)
    }

    /// Publishes the staged generation (of every part), after the devices' queued work (the copies) has
    /// finished; returns it.
    fn commit(&self, py: Python<'_>) -> PyResult<u64> {
        let owner = self.owner()?;
        py.detach(|| {
            for ctx in &self.contexts {
                ctx.synchronize().map_err(driver_to_py)?;
            }
            let mut guard = lock(&*owner);
            each_backend!(&mut *guard, o => o.commit()).map_err(weights_to_py)
        })
    }

    /// The readers attached now (to this part): ``(pid, generations held)`` each (pid ``None`` in another PID
    /// namespace).
    fn readers(&self) -> PyResult<Vec<(Option<u32>, Vec<u64>)>> {
        let owner = self.owner()?;
        let holds = each_backend!(&*lock(&*owner), o => o.part(self.part).readers());
        Ok(holds.into_iter().map(|h| (h.pid, h.generations)).collect())
    }

    /// Arenas made and not reused yet (published, staged, retired but held by readers), of this part.
    fn arenas(&self) -> PyResult<usize> {
        Ok(each_backend!(&*lock(&*self.owner()?), o => o.part(self.part).arenas()))
    }

    /// The set's (this part's) tensors: ``(name, dtype, shape)`` each, in order.
    fn layout(&self) -> PyResult<Vec<TensorSpec>> {
        let owner = self.owner()?;
        let guard = lock(&*owner);
        let entries = each_backend!(&*guard, o => o.part(self.part).layout().entries.clone());
        Ok(entries.into_iter().map(|e| (e.name, e.desc.dtype().name().to_owned(), e.desc.shape().to_vec())).collect())
    }

    fn __repr__(&self) -> String {
        self.served.repr("WeightsOwner", self.generation().unwrap_or(0))
    }
}

served_getters!(WeightsOwner);
crate::closable!(WeightsOwner, owner, "Stops serving the set (readers keep what they hold). Idempotent.");

impl Drop for WeightsOwner {
    fn drop(&mut self) {
        if self.owner.made_elsewhere() {
            self.served.forget();
        }
    }
}

/// A tensor of a layout as the Python layer gives it, described.
fn tensor_desc(tensor: String, dtype: &str, shape: Vec<u64>) -> PyResult<(String, TensorDesc)> {
    let dtype: DType = dtype.parse().map_err(|e| ArgumentError::new_err(format!("tensor {tensor:?}: {e}")))?;
    let desc =
        TensorDesc::contiguous(dtype, shape).map_err(|e| ArgumentError::new_err(format!("tensor {tensor:?}: {e}")))?;
    Ok((tensor, desc))
}

/// The options a Python caller's `keep`, `checksums`, `max_arenas` and `max_readers` make.
fn options_of(
    keep: usize,
    checksums: bool,
    max_arenas: Option<u32>,
    max_readers: Option<u32>,
) -> PyResult<WeightsOptions> {
    if max_readers == Some(0) {
        return Err(ArgumentError::new_err("max_readers: at least 1 (readers attached at once)"));
    }
    let default = WeightsOptions::default();
    let keep = keep.max(1);
    let max_arenas = max_arenas.unwrap_or_else(|| default.max_arenas.max(keep as u32 + 4));
    let max_readers = max_readers.unwrap_or(default.max_readers);
    Ok(WeightsOptions { keep, checksums, max_arenas, max_readers, ..default })
}
