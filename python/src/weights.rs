//! `gpu_ipc._gpu_ipc.WeightsOwner`, `WeightsReader` and `WeightsTensor`: the native layer under `gpu_ipc.weights`
//! (the core's `weights`): a whole state_dict in one arena per generation, read by other processes as tensors.
//! The Python module (`gpu_ipc/weights.py`) turns framework tensors into plain descriptions and pointers; this layer
//! copies, publishes and makes DLPack views.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use gpu_ipc::BackendKind;
use gpu_ipc::core::wire::{DType, ObjectKind, TensorDesc};
use gpu_ipc::driver::{DevicePtr, DeviceSpan};
use gpu_ipc::host::{HostContext, HostFake};
use gpu_ipc::legacy::Legacy;
use gpu_ipc::pool::PoolError;
use gpu_ipc::toolkit::door::{self, DoorError};
use gpu_ipc::vmm::Vmm;
use gpu_ipc::weights::{
    ArenaBytes, HeldGeneration, Manifest, TensorCopier, TensorEntry, WeightsError, WeightsOptions,
    WeightsOwner as CoreOwner, WeightsReader as CoreReader,
};
use pyo3::prelude::*;
use pyo3::types::PyBytes;

use crate::each_backend;
use crate::errors::{ArgumentError, door_to_py, driver_to_py, weights_to_py};
use crate::mapping::{MappingHold, pool_view};
use crate::ring::{Gpu, PerBackend, SLICE, Shared, lock, parse_backend, seconds};
use crate::stream::{borrow, stream_handle};
use crate::view::{ArrayMemory, Layout, View};

type Owner = PerBackend<CoreOwner<Legacy>, CoreOwner<Vmm>, CoreOwner<HostFake>>;
type Reader = PerBackend<CoreReader<Legacy>, CoreReader<Vmm>, CoreReader<HostFake>>;
type Held = PerBackend<Arc<HeldGeneration<Legacy>>, Arc<HeldGeneration<Vmm>>, Arc<HeldGeneration<HostFake>>>;

/// One tensor's description as the Python layer gives it: name, element type name, shape.
type TensorSpec = (String, String, Vec<u64>);
/// A generation's tensors as ``arena()`` gives them, one list per field (no tuple per tensor): names, element type
/// names, shapes, strides (elements), offsets (bytes from the arena's first byte), and whether each is contiguous.
type ArenaColumns = (Vec<String>, Vec<&'static str>, Vec<Vec<u64>>, Vec<Vec<u64>>, Vec<u64>, Vec<bool>);

fn gpu_of(gpu: Option<&Gpu>) -> PyResult<&Gpu> {
    gpu.ok_or_else(|| ArgumentError::new_err("this weight set is on the host backend: there is no device to copy on"))
}

/// A device span over memory a Python caller named by pointer (a framework tensor's storage).
fn caller_span<'a>(ptr: u64, bytes: u64) -> DeviceSpan<'a> {
    #[allow(unsafe_code)]
    // SAFETY: `ptr` and `bytes` come from the tensor's own description (`data_ptr()` and its byte span, or its
    // `__cuda_array_interface__`), taken by `gpu_ipc.weights` from a tensor it holds for the whole call; it is
    // device memory of the set's device (the Python layer checks the device), and no Rust reference covers it. That
    // the object describes its memory truthfully is the caller's word, as with every library that takes a pointer.
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

/// `copier`, loaded in `gpu`'s context on first use.
fn copier_of<'a>(copier: &'a mut Option<TensorCopier>, gpu: &Gpu) -> PyResult<&'a mut TensorCopier> {
    Ok(match copier {
        Some(c) => c,
        None => copier.insert(TensorCopier::new(&gpu.ctx).map_err(weights_to_py)?),
    })
}

/// The whole arena of a generation as one ``uint8`` view, named after its pool buffer, and its tensors.
fn arena_of(
    manifest: &Manifest,
    base: u64,
    ordinal: Option<i32>,
    hold: MappingHold,
) -> PyResult<(WeightsTensor, ArenaColumns)> {
    let n = manifest.entries.len();
    let mut columns: ArenaColumns = (
        Vec::with_capacity(n),
        Vec::with_capacity(n),
        Vec::with_capacity(n),
        Vec::with_capacity(n),
        Vec::with_capacity(n),
        Vec::with_capacity(n),
    );
    for e in &manifest.entries {
        columns.0.push(e.name.clone());
        columns.1.push(e.desc.dtype().name());
        columns.2.push(e.desc.shape().to_vec());
        columns.3.push(e.desc.strides_or_contiguous());
        columns.4.push(e.offset);
        columns.5.push(e.desc.strides().is_none_or(|s| *s == *e.desc.strides_or_contiguous()));
    }
    let arena = WeightsTensor {
        name: format!("{}/{}", manifest.set_name, manifest.generation),
        generation: manifest.generation,
        ptr: base,
        layout: Layout::bytes(manifest.arena_bytes)?,
        ordinal,
        hold,
    };
    Ok((arena, columns))
}

/// The owner of a weight set (``gpu_ipc.weights.publish`` makes one): its tensors' layout is fixed when made.
#[pyclass(frozen, module = "gpu_ipc._gpu_ipc")]
pub struct WeightsOwner {
    owner: Shared<Mutex<Owner>>,
    /// The gather kernel, loaded by the first ``copy_in``.
    copier: Mutex<Option<TensorCopier>>,
    gpu: Option<Gpu>,
    backend: BackendKind,
    socket: PathBuf,
    name: String,
}

impl WeightsOwner {
    fn owner(&self) -> PyResult<Arc<Mutex<Owner>>> {
        self.owner.get("weight set owner")
    }
}

#[pymethods]
impl WeightsOwner {
    #[new]
    #[pyo3(signature = (socket, name, layout, backend="vmm", device=0, keep=2, checksums=false, max_arenas=None))]
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
    ) -> PyResult<Self> {
        let backend = parse_backend(backend)?;
        let tensors = layout
            .into_iter()
            .map(|(tensor, dtype, shape)| {
                let dtype: DType =
                    dtype.parse().map_err(|e| ArgumentError::new_err(format!("tensor {tensor:?}: {e}")))?;
                let desc = TensorDesc::contiguous(dtype, shape)
                    .map_err(|e| ArgumentError::new_err(format!("tensor {tensor:?}: {e}")))?;
                Ok((tensor, desc))
            })
            .collect::<PyResult<Vec<_>>>()?;
        let default = WeightsOptions::default();
        let keep = keep.max(1);
        let max_arenas = max_arenas.unwrap_or_else(|| default.max_arenas.max(keep as u32 + 4));
        let options = WeightsOptions { keep, checksums, max_arenas, ..default };
        let gpu = Gpu::for_backend(py, backend, device)?;
        let owner = py
            .detach(|| -> Result<Owner, WeightsError> {
                Ok(match (backend, &gpu) {
                    (BackendKind::HostFake, _) => {
                        PerBackend::Host(CoreOwner::create(&HostContext, &socket, name, tensors, options)?)
                    }
                    (BackendKind::Legacy, Some(g)) => {
                        PerBackend::Legacy(CoreOwner::create(&g.ctx, &socket, name, tensors, options)?)
                    }
                    (_, Some(g)) => PerBackend::Vmm(CoreOwner::create(&g.ctx, &socket, name, tensors, options)?),
                    (other, None) => {
                        return Err(WeightsError::Pool(PoolError::Unsupported(format!("backend {other} needs a GPU"))));
                    }
                })
            })
            .map_err(weights_to_py)?;
        Ok(Self {
            owner: Shared::new(Mutex::new(owner)),
            copier: Mutex::new(None),
            gpu,
            backend,
            socket,
            name: name.to_owned(),
        })
    }

    /// The newest published generation (0 before the first commit).
    #[getter]
    fn generation(&self) -> PyResult<u64> {
        Ok(each_backend!(&*lock(&*self.owner()?), o => o.generation()))
    }

    /// Makes (or returns) the next generation's arena and returns its tensors, writable, as ``(name, view)`` pairs.
    fn stage(&self, py: Python<'_>) -> PyResult<Vec<(String, WeightsTensor)>> {
        let owner = self.owner()?;
        let ordinal = self.gpu.as_ref().map(|g| g.ordinal);
        let ctx = self.gpu.as_ref().map(|g| g.ctx.clone());
        let staged = py
            .detach(|| -> Result<Vec<(String, TensorDesc, u64, u64)>, WeightsError> {
                let mut guard = lock(&*owner);
                each_backend!(&mut *guard, o => {
                    let staged = o.stage()?;
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
                let hold = MappingHold::new(owner.clone(), ctx.clone());
                let tensor = WeightsTensor {
                    name: name.clone(),
                    generation,
                    ptr,
                    layout: Layout::of_tensor(&desc)?,
                    ordinal,
                    hold,
                };
                Ok((name, tensor))
            })
            .collect()
    }

    /// Makes (or returns) the next generation's arena and returns it whole, writable, as one ``uint8`` view, with
    /// its tensors as ``(names, dtypes, shapes, strides, offsets, contiguous)``, one list each: one DLPack import
    /// for every tensor.
    fn stage_arena(&self, py: Python<'_>) -> PyResult<(WeightsTensor, ArenaColumns)> {
        let owner = self.owner()?;
        let ordinal = self.gpu.as_ref().map(|g| g.ordinal);
        let ctx = self.gpu.as_ref().map(|g| g.ctx.clone());
        let (manifest, base) = py
            .detach(|| {
                each_backend!(&mut *lock(&*owner), o => o.stage().map(|s| (s.manifest().clone(), s.handle().ptr().0)))
            })
            .map_err(weights_to_py)?;
        arena_of(&manifest, base, ordinal, MappingHold::new(owner, ctx))
    }

    /// Copies the caller's device memory into the staged tensors, on ``stream`` (default: the legacy default
    /// stream) with a few launches of the gather kernel: ``ptrs[i]`` is the address of tensor ``first + i``'s
    /// bytes (layout order; a tensor of the set's device, its whole byte span; 0: not copied). Stages the next
    /// generation first if none is.
    #[pyo3(signature = (ptrs, first=0, stream=None))]
    fn copy_in(&self, py: Python<'_>, ptrs: Vec<u64>, first: usize, stream: Option<&Bound<'_, PyAny>>) -> PyResult<()> {
        let gpu = gpu_of(self.gpu.as_ref())?;
        let raw = stream_handle(stream)?.unwrap_or(crate::stream::LEGACY_DEFAULT_STREAM);
        let owner = self.owner()?;
        py.detach(|| {
            let stream = borrow(&gpu.ctx, raw);
            let mut copier = lock(&self.copier);
            let copier = copier_of(&mut copier, gpu)?;
            fn copy<B: ArenaBytes + gpu_ipc::core::backend::GpuBackend>(
                o: &mut CoreOwner<B>,
                copier: &mut TensorCopier,
                first: usize,
                ptrs: &[u64],
                stream: &gpu_ipc::driver::Stream,
            ) -> PyResult<()> {
                let staged = o.stage().map_err(weights_to_py)?;
                let copies = caller_copies(&staged.manifest().entries, first, ptrs)?;
                staged.copy_in(copier, &copies, stream).map_err(weights_to_py)
            }
            match &mut *lock(&*owner) {
                PerBackend::Legacy(o) => copy(o, copier, first, &ptrs, &stream),
                PerBackend::Vmm(o) => copy(o, copier, first, &ptrs, &stream),
                PerBackend::Host(_) => Err(ArgumentError::new_err("copy_in is for GPU backends; use write")),
            }
        })
    }

    /// Writes ``data`` (the tensor's bytes) into the staged tensor ``name`` (from host memory: ``cuMemcpyHtoD`` on
    /// a GPU). Stages the next generation first if none is.
    fn write(&self, py: Python<'_>, name: &str, data: &[u8]) -> PyResult<()> {
        let owner = self.owner()?;
        py.detach(|| {
            let mut guard = lock(&*owner);
            each_backend!(&mut *guard, o => o.stage().and_then(|s| s.write(name, data)))
        })
        .map_err(weights_to_py)
    }

    /// Publishes the staged generation, after the device's queued work (the copies) has finished; returns it.
    fn commit(&self, py: Python<'_>) -> PyResult<u64> {
        let owner = self.owner()?;
        let ctx = self.gpu.as_ref().map(|g| g.ctx.clone());
        py.detach(|| {
            if let Some(ctx) = &ctx {
                ctx.synchronize().map_err(driver_to_py)?;
            }
            let mut guard = lock(&*owner);
            each_backend!(&mut *guard, o => o.commit()).map_err(weights_to_py)
        })
    }

    /// The readers attached now: ``(pid, generations held)`` each (pid ``None`` in another PID namespace).
    fn readers(&self) -> PyResult<Vec<(Option<u32>, Vec<u64>)>> {
        let owner = self.owner()?;
        let holds = each_backend!(&*lock(&*owner), o => o.readers());
        Ok(holds.into_iter().map(|h| (h.pid, h.generations)).collect())
    }

    /// Arenas made and not reused yet (published, staged, retired but held by readers).
    fn arenas(&self) -> PyResult<usize> {
        Ok(each_backend!(&*lock(&*self.owner()?), o => o.arenas()))
    }

    /// The set's tensors: ``(name, dtype, shape)`` each, in order.
    fn layout(&self) -> PyResult<Vec<TensorSpec>> {
        let owner = self.owner()?;
        let guard = lock(&*owner);
        let entries = each_backend!(&*guard, o => o.layout().entries.clone());
        Ok(entries.into_iter().map(|e| (e.name, e.desc.dtype().name().to_owned(), e.desc.shape().to_vec())).collect())
    }

    #[getter]
    fn name(&self) -> &str {
        &self.name
    }

    #[getter]
    fn backend(&self) -> &'static str {
        self.backend.name()
    }

    #[getter]
    fn device(&self) -> Option<i32> {
        self.gpu.as_ref().map(|g| g.ordinal)
    }

    #[getter]
    fn socket(&self) -> PathBuf {
        self.socket.clone()
    }

    fn __repr__(&self) -> String {
        let generation = self.generation().unwrap_or(0);
        format!(
            "WeightsOwner(name={:?}, socket={:?}, backend={:?}, generation={generation})",
            self.name,
            self.socket,
            self.backend.name()
        )
    }
}

crate::closable!(WeightsOwner, owner, "Stops serving the set (readers keep what they hold). Idempotent.");

impl Drop for WeightsOwner {
    fn drop(&mut self) {
        if self.owner.made_elsewhere() {
            std::mem::forget(lock(&self.copier).take());
            std::mem::forget(self.gpu.take());
        }
    }
}

/// A reader of a weight set (``gpu_ipc.weights.open`` makes one): holds one generation at a time.
#[pyclass(frozen, module = "gpu_ipc._gpu_ipc")]
pub struct WeightsReader {
    reader: Shared<Mutex<Reader>>,
    /// The gather kernel, loaded by the first ``copy_out``.
    copier: Mutex<Option<TensorCopier>>,
    gpu: Option<Gpu>,
    backend: BackendKind,
    socket: PathBuf,
    name: String,
}

impl WeightsReader {
    fn reader(&self) -> PyResult<Arc<Mutex<Reader>>> {
        self.reader.get("weights reader")
    }

    fn held(&self) -> PyResult<Held> {
        let reader = self.reader()?;
        let guard = lock(&*reader);
        Ok(match &*guard {
            PerBackend::Legacy(r) => PerBackend::Legacy(r.held()),
            PerBackend::Vmm(r) => PerBackend::Vmm(r.held()),
            PerBackend::Host(r) => PerBackend::Host(r.held()),
        })
    }

    /// Lets go of `held` through a mapping hold: when it is the last, the unmap waits for the device's queued work.
    fn let_go(&self, held: Held) {
        let ctx = self.gpu.as_ref().map(|g| g.ctx.clone());
        each_backend!(held, h => drop(MappingHold::new(h, ctx)));
    }
}

#[pymethods]
impl WeightsReader {
    #[new]
    #[pyo3(signature = (socket, name, backend=None, device=0, timeout=10.0))]
    fn new(
        py: Python<'_>,
        socket: PathBuf,
        name: &str,
        backend: Option<&str>,
        device: i32,
        timeout: f64,
    ) -> PyResult<Self> {
        let timeout = seconds(timeout)?;
        let backend = match backend {
            Some(b) => parse_backend(b)?,
            None => py.detach(|| door::status(&socket, timeout).map(|report| report.backend)).map_err(|e| match e {
                DoorError::NoOwner { path, .. } => door_to_py(DoorError::NoOwner { path, kind: ObjectKind::Pool }),
                other => door_to_py(other),
            })?,
        };
        let gpu = Gpu::for_backend(py, backend, device)?;
        let reader = py
            .detach(|| -> Result<Reader, WeightsError> {
                Ok(match (backend, &gpu) {
                    (BackendKind::HostFake, _) => {
                        PerBackend::Host(CoreReader::open(&HostContext, &socket, name, timeout)?)
                    }
                    (BackendKind::Legacy, Some(g)) => {
                        PerBackend::Legacy(CoreReader::open(&g.ctx, &socket, name, timeout)?)
                    }
                    (_, Some(g)) => PerBackend::Vmm(CoreReader::open(&g.ctx, &socket, name, timeout)?),
                    (other, None) => {
                        return Err(WeightsError::Pool(PoolError::Unsupported(format!("backend {other} needs a GPU"))));
                    }
                })
            })
            .map_err(weights_to_py)?;
        Ok(Self {
            reader: Shared::new(Mutex::new(reader)),
            copier: Mutex::new(None),
            gpu,
            backend,
            socket,
            name: name.to_owned(),
        })
    }

    /// The generation held now.
    #[getter]
    fn generation(&self) -> PyResult<u64> {
        Ok(each_backend!(&*lock(&*self.reader()?), r => r.generation()))
    }

    /// The newest published generation: a word in shared memory, no round trip. Raises ``OwnerGone``.
    fn latest(&self) -> PyResult<u64> {
        each_backend!(&*lock(&*self.reader()?), r => r.latest()).map_err(weights_to_py)
    }

    /// Moves to the newest generation and returns it; tensors of the old one stay valid until dropped.
    fn refresh(&self, py: Python<'_>) -> PyResult<u64> {
        let reader = self.reader()?;
        let old = self.held()?;
        let moved = py.detach(|| each_backend!(&mut *lock(&*reader), r => r.refresh()));
        self.let_go(old);
        moved.map_err(weights_to_py)
    }

    /// Blocks until ``generation`` or a newer one is published (``timeout`` seconds at most, ``None``: no bound),
    /// in 50 ms slices (Ctrl-C works); returns the newest. Raises ``Timeout``, ``OwnerGone``.
    #[pyo3(signature = (generation, timeout=None))]
    fn wait_for(&self, py: Python<'_>, generation: u64, timeout: Option<f64>) -> PyResult<u64> {
        let reader = self.reader()?;
        let bound = timeout.map(seconds).transpose()?;
        let started = Instant::now();
        loop {
            let left = bound.map(|b| b.saturating_sub(started.elapsed()));
            let slice = left.map_or(SLICE, |l| l.min(SLICE));
            let waited = py.detach(|| each_backend!(&*lock(&*reader), r => r.wait_for(generation, Some(slice))));
            match waited {
                Err(WeightsError::Timeout { .. }) if left.is_none_or(|l| l > slice) => py.check_signals()?,
                Err(WeightsError::Timeout { set, wanted, latest, .. }) => {
                    return Err(weights_to_py(WeightsError::Timeout {
                        set,
                        wanted,
                        latest,
                        waited: started.elapsed(),
                    }));
                }
                other => return other.map_err(weights_to_py),
            }
        }
    }

    /// The held generation's tensors as ``(name, view)`` pairs; each view keeps the generation alive.
    fn tensors(&self) -> PyResult<Vec<(String, WeightsTensor)>> {
        let held = self.held()?;
        let ordinal = self.gpu.as_ref().map(|g| g.ordinal);
        let ctx = self.gpu.as_ref().map(|g| g.ctx.clone());
        each_backend!(held, h => {
            let base = h.view().ptr().0;
            let generation = h.generation();
            h.manifest()
                .entries
                .iter()
                .map(|e| {
                    let hold = MappingHold::new(h.clone(), ctx.clone());
                    let tensor = WeightsTensor {
                        name: e.name.clone(),
                        generation,
                        ptr: base + e.offset,
                        layout: Layout::of_tensor(&e.desc)?,
                        ordinal,
                        hold,
                    };
                    Ok((e.name.clone(), tensor))
                })
                .collect()
        })
    }

    /// The held generation's whole arena as one ``uint8`` view (the manifest at byte 0), with its tensors as
    /// ``(names, dtypes, shapes, strides, offsets, contiguous)``, one list each (strides in elements, offsets in
    /// bytes from the arena's first byte, every entry checked against the mapped extent): one DLPack import for
    /// every tensor, which ``gpu_ipc.weights`` cuts the tensors from. The view keeps the generation alive.
    fn arena(&self) -> PyResult<(WeightsTensor, ArenaColumns)> {
        let held = self.held()?;
        let ordinal = self.gpu.as_ref().map(|g| g.ordinal);
        let ctx = self.gpu.as_ref().map(|g| g.ctx.clone());
        each_backend!(held, h => arena_of(h.manifest(), h.view().ptr().0, ordinal, MappingHold::new(h.clone(), ctx)))
    }

    /// The held generation's manifest: ``(name, dtype, shape, strides, offset, checksum)`` per tensor.
    #[allow(clippy::type_complexity)]
    fn manifest(&self) -> PyResult<Vec<(String, String, Vec<u64>, Vec<u64>, u64, Option<u64>)>> {
        let held = self.held()?;
        let entries = each_backend!(&held, h => h.manifest().entries.clone());
        Ok(entries
            .into_iter()
            .map(|e| {
                let strides = e.desc.strides_or_contiguous();
                (e.name, e.desc.dtype().name().to_owned(), e.desc.shape().to_vec(), strides, e.offset, e.checksum)
            })
            .collect())
    }

    /// Checks the held generation's bytes against its manifest's checksums; returns how many tensors were checked
    /// (0 when the owner published none). Raises ``GpuIpcError`` naming the first that differs.
    fn verify(&self, py: Python<'_>) -> PyResult<usize> {
        let held = self.held()?;
        py.detach(|| each_backend!(&held, h => h.verify())).map_err(weights_to_py)
    }

    /// Tensor ``name``'s bytes, copied to host memory.
    fn read<'py>(&self, py: Python<'py>, name: &str) -> PyResult<Bound<'py, PyBytes>> {
        let held = self.held()?;
        let bytes = py
            .detach(|| {
                each_backend!(&held, h => {
                    let len = h.entry(name)?.span_bytes();
                    let mut bytes = vec![0u8; usize::try_from(len).unwrap_or(usize::MAX)];
                    h.read(name, &mut bytes).map(|()| bytes)
                })
            })
            .map_err(weights_to_py)?;
        Ok(PyBytes::new(py, &bytes))
    }

    /// Copies the held tensors into the caller's device memory, on ``stream`` (default: the legacy default stream)
    /// with a few launches of the gather kernel: ``ptrs[i]`` is the address of the destination of tensor
    /// ``first + i`` (manifest order; its whole byte span, on the set's device; 0: not copied): what ``load_into``
    /// does. The held generation stays mapped until the device's queued work is done, whatever ``refresh`` does
    /// meanwhile.
    #[pyo3(signature = (ptrs, first=0, stream=None))]
    fn copy_out(
        &self,
        py: Python<'_>,
        ptrs: Vec<u64>,
        first: usize,
        stream: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<()> {
        let gpu = gpu_of(self.gpu.as_ref())?;
        let raw = stream_handle(stream)?.unwrap_or(crate::stream::LEGACY_DEFAULT_STREAM);
        let held = self.held()?;
        let copied = py.detach(|| {
            let stream = borrow(&gpu.ctx, raw);
            let mut copier = lock(&self.copier);
            let copier = copier_of(&mut copier, gpu)?;
            fn copy<B: ArenaBytes + gpu_ipc::core::backend::GpuBackend>(
                h: &HeldGeneration<B>,
                copier: &mut TensorCopier,
                first: usize,
                ptrs: &[u64],
                stream: &gpu_ipc::driver::Stream,
            ) -> PyResult<()> {
                let copies = caller_copies(&h.manifest().entries, first, ptrs)?;
                h.copy_out(copier, &copies, stream).map_err(weights_to_py)
            }
            match &held {
                PerBackend::Legacy(h) => copy(h, copier, first, &ptrs, &stream),
                PerBackend::Vmm(h) => copy(h, copier, first, &ptrs, &stream),
                PerBackend::Host(_) => Err(ArgumentError::new_err("copy_out is for GPU backends; use read")),
            }
        });
        self.let_go(held);
        copied
    }

    /// Whether the owner closed the set or went away (what is held stays readable).
    #[getter]
    fn owner_gone(&self) -> PyResult<bool> {
        Ok(each_backend!(&*lock(&*self.reader()?), r => r.owner_gone()))
    }

    #[getter]
    fn name(&self) -> &str {
        &self.name
    }

    #[getter]
    fn backend(&self) -> &'static str {
        self.backend.name()
    }

    #[getter]
    fn device(&self) -> Option<i32> {
        self.gpu.as_ref().map(|g| g.ordinal)
    }

    #[getter]
    fn socket(&self) -> PathBuf {
        self.socket.clone()
    }

    fn __repr__(&self) -> String {
        let generation = self.generation().unwrap_or(0);
        format!(
            "WeightsReader(name={:?}, socket={:?}, backend={:?}, generation={generation})",
            self.name,
            self.socket,
            self.backend.name()
        )
    }
}

crate::closable!(WeightsReader, reader, "Lets go of the set (tensors already made stay valid). Idempotent.");

impl Drop for WeightsReader {
    fn drop(&mut self) {
        if self.reader.made_elsewhere() {
            std::mem::forget(lock(&self.copier).take());
            std::mem::forget(self.gpu.take());
        }
    }
}

/// One tensor of a weight set's generation, in place: ``torch.from_dlpack(t)``, ``cupy.from_dlpack(t)``,
/// ``numpy.from_dlpack(t)`` on the host backend. It keeps its generation (its arena, mapped and held from reuse)
/// alive while it, or a tensor made from it, lives.
#[pyclass(frozen, module = "gpu_ipc._gpu_ipc")]
pub struct WeightsTensor {
    name: String,
    generation: u64,
    ptr: u64,
    layout: Layout,
    ordinal: Option<i32>,
    hold: MappingHold,
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
    #[getter]
    fn name(&self) -> &str {
        &self.name
    }

    /// The generation it belongs to.
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
