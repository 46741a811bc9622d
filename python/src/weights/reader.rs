//! `WeightsReader`: a reader of a weight set, under `gpu_ipc.weights.Reader`.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use gpu_ipc::BackendKind;
use gpu_ipc::core::backend::GpuBackend;
use gpu_ipc::core::wire::ObjectKind;
use gpu_ipc::driver::Stream;
use gpu_ipc::driver::{Context, Device, DeviceUuid};
use gpu_ipc::host::{Host, HostContext};
use gpu_ipc::legacy::Legacy;
use gpu_ipc::pool::PoolError;
use gpu_ipc::toolkit::door::{self, DoorError};
use gpu_ipc::vmm::Vmm;
use gpu_ipc::weights::{ArenaBytes, BoundCopies, CopyDirection, HeldGeneration, OpenedSet, TensorCopier, WeightsError};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyList, PyType};

use super::bound::WeightsBound;
use super::sets::ReadSet;
use super::sources::{Expected, read_all};
use super::tensor::{ArenaCut, WeightsTensor, arena_of};
use super::wait::{GenerationWait, status_tuple};
use super::{Served, caller_copies, served_getters};
use crate::each_backend;
use crate::errors::{ArgumentError, door_to_py, weights_to_py};
use crate::mapping::MappingHold;
use crate::ring::{Gpu, PerBackend, SLICE, Shared, lock, parse_backend, seconds};
use crate::stream::{LEGACY_DEFAULT_STREAM, borrow, stream_handle};
use crate::view::Layout;

type Reader = PerBackend<ReadSet<Legacy>, ReadSet<Vmm>, ReadSet<Host>>;
type Held = PerBackend<Arc<HeldGeneration<Legacy>>, Arc<HeldGeneration<Vmm>>, Arc<HeldGeneration<Host>>>;

/// Queues on `stream` the copies of `held`'s tensors `first..` into the caller's memory `ptrs` (0: none).
fn copy_out_of(held: &Held, copier: &mut TensorCopier, first: usize, ptrs: &[u64], stream: &Stream) -> PyResult<()> {
    fn copy<B: ArenaBytes + GpuBackend>(
        h: &HeldGeneration<B>,
        copier: &mut TensorCopier,
        first: usize,
        ptrs: &[u64],
        stream: &Stream,
    ) -> PyResult<()> {
        let copies = caller_copies(&h.manifest().entries, first, ptrs)?;
        h.copy_out(copier, &copies, stream).map_err(weights_to_py)
    }
    match held {
        PerBackend::Legacy(h) => copy(h, copier, first, ptrs, stream),
        PerBackend::Vmm(h) => copy(h, copier, first, ptrs, stream),
        PerBackend::Host(_) => Err(ArgumentError::new_err("copy_out is for GPU backends; use read")),
    }
}

/// A reader of a weight set (``gpu_ipc.weights.open`` makes one): holds one generation at a time. A set on
/// several devices is read whole (every part at one generation); the handle made stands for part 0, ``part_of(k)``
/// gives part ``k``'s (its tensors, on its device); the generation, ``refresh`` and the owner's end are the set's.
#[pyclass(frozen, module = "gpu_ipc._gpu_ipc")]
pub struct WeightsReader {
    reader: Shared<Mutex<Reader>>,
    /// The part this handle stands for (0 for a set on one device).
    part: usize,
    /// Every part's CUDA device ordinal (`None` on the host backend; one entry for a set on one device).
    ordinals: Vec<Option<i32>>,
    served: Served,
}

impl WeightsReader {
    fn reader(&self) -> PyResult<Arc<Mutex<Reader>>> {
        self.reader.get("weights reader")
    }

    fn held(&self) -> PyResult<Held> {
        let reader = self.reader()?;
        let guard = lock(&*reader);
        Ok(match &*guard {
            PerBackend::Legacy(r) => PerBackend::Legacy(r.held(self.part)),
            PerBackend::Vmm(r) => PerBackend::Vmm(r.held(self.part)),
            PerBackend::Host(r) => PerBackend::Host(r.held(self.part)),
        })
    }

    /// Lets go of `held` through a mapping hold: when it is the last, the unmap waits for the device's queued work.
    fn let_go(&self, held: Held) {
        let ctx = self.served.ctx();
        each_backend!(held, h => drop(MappingHold::new(h, ctx)));
    }
}

#[pymethods]
impl WeightsReader {
    #[new]
    #[pyo3(signature = (socket, name, backend=None, device=None, timeout=10.0))]
    fn new(
        py: Python<'_>,
        socket: PathBuf,
        name: &str,
        backend: Option<&str>,
        device: Option<i32>,
        timeout: f64,
    ) -> PyResult<Self> {
        let timeout = seconds(timeout)?;
        // `timeout` bounds the whole open: the status request (the backend's, when none is given) and the open.
        let started = std::time::Instant::now();
        let backend = match backend {
            Some(b) => parse_backend(b)?,
            None => py.detach(|| door::status(&socket, timeout).map(|report| report.backend)).map_err(|e| match e {
                DoorError::NoOwner { path, .. } => door_to_py(DoorError::NoOwner { path, kind: ObjectKind::Pool }),
                other => door_to_py(other),
            })?,
        };
        // No device asked for: the set's own (each part's, for a set of parts), found by the UUID its owner names.
        let gpu = match device {
            Some(ordinal) => Gpu::for_backend(py, backend, ordinal)?,
            None => {
                // As `Gpu::for_backend` does before any CUDA call: a forked child is refused in words.
                if backend.is_gpu() {
                    Gpu::not_in_forked_child()?;
                }
                None
            }
        };
        let left = timeout.saturating_sub(started.elapsed());
        let (reader, ordinals) =
            py.detach(|| open_set(backend, gpu.as_ref(), &socket, name, left)).map_err(weights_to_py)?;
        let gpu = match ordinals.first().copied().flatten() {
            Some(ordinal) if gpu.as_ref().is_none_or(|g| g.ordinal != ordinal) => {
                Gpu::for_backend(py, backend, ordinal)?
            }
            _ => gpu,
        };
        let served = Served::new(gpu, backend, socket, name);
        Ok(Self { reader: Shared::new(Mutex::new(reader)), part: 0, ordinals, served })
    }

    /// The number of parts the set lies in (1: one device).
    #[getter]
    fn part_count(&self) -> usize {
        self.ordinals.len()
    }

    /// The part this handle stands for (0 for a set on one device).
    #[getter]
    fn part(&self) -> usize {
        self.part
    }

    /// A handle of the same reader for part ``part``: its tensors, on its device.
    #[pyo3(name = "part_of")]
    fn part_handle(&self, py: Python<'_>, part: usize) -> PyResult<Self> {
        let Some(&ordinal) = self.ordinals.get(part) else {
            return Err(ArgumentError::new_err(format!("part {part} of a set of {} parts", self.ordinals.len())));
        };
        let reader = self.reader()?;
        let gpu = match ordinal {
            Some(ordinal) => Gpu::for_backend(py, self.served.backend, ordinal)?,
            None => None,
        };
        let served = Served::new(gpu, self.served.backend, self.served.socket.clone(), &self.served.name);
        Ok(Self { reader: Shared::sharing(reader), part, ordinals: self.ordinals.clone(), served })
    }

    /// The set's tensors in the publisher's order: ``(part, index in that part's manifest)`` each.
    fn order(&self) -> PyResult<Vec<(usize, usize)>> {
        Ok(each_backend!(&*lock(&*self.reader()?), r => r.order()))
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

    /// Makes ``stream`` (default: the legacy default stream) wait until ``generation`` or a newer one is published,
    /// or the owner is gone, or this reader closes (a stream wait cannot time out: the end releases it), and
    /// returns at once: the wait, for ``wait_status`` and for the kernels queued after it (its status word). Does
    /// not move the reader: call ``refresh`` when the CPU sees the generation. ``stream`` is a stream of this
    /// handle's device (for a set of parts, part ``part``'s: the wait uses the word of the first part on that
    /// device, which follows the set's generation). Raises ``GpuIpcError`` on the host backend (use ``wait_for``
    /// or ``watch``), ``ArgumentError`` for generation 0, ``OwnerGone``.
    #[pyo3(signature = (generation, stream=None))]
    fn wait_on(&self, py: Python<'_>, generation: u64, stream: Option<&Bound<'_, PyAny>>) -> PyResult<GenerationWait> {
        let reader = self.reader()?;
        let raw = stream_handle(stream)?.unwrap_or(LEGACY_DEFAULT_STREAM);
        let Some(gpu) = self.served.gpu.as_ref() else {
            let set = each_backend!(&*lock(&*reader), r => r.set_name().to_owned());
            return Err(weights_to_py(WeightsError::NoCudaContext { set }));
        };
        let wait = py
            .detach(|| each_backend!(&*lock(&*reader), r => r.wait_on(generation, &borrow(&gpu.ctx, raw))))
            .map_err(weights_to_py)?;
        Ok(GenerationWait { wait, ordinal: Some(gpu.ordinal), ctx: Some(gpu.ctx.clone()) })
    }

    /// Makes the reader's status word follow the published generation until ``generation`` or a newer one is
    /// published or the owner is gone, without a stream wait; returns the wait (read its word on the device, or
    /// ask ``wait_status``). For a set of parts, the word of this handle's part (on its device), following the
    /// set's generation. Works on every backend (on the host backend the word is host memory). Raises
    /// ``ArgumentError`` for generation 0, ``OwnerGone``.
    fn watch(&self, generation: u64) -> PyResult<GenerationWait> {
        let reader = self.reader()?;
        let wait = each_backend!(&*lock(&*reader), r => r.watch(generation, self.part)).map_err(weights_to_py)?;
        Ok(GenerationWait { wait, ordinal: self.served.ordinal(), ctx: self.served.ctx() })
    }

    /// How ``wait`` stands: ``("published", newest)`` (the generation or a newer one is published),
    /// ``("gone", newest)`` (released by the owner's end, or this reader's close, before it came), or
    /// ``("waiting", 0)``.
    fn wait_status(&self, wait: &GenerationWait) -> PyResult<(&'static str, u64)> {
        let reader = self.reader()?;
        Ok(status_tuple(each_backend!(&*lock(&*reader), r => r.wait_status(&wait.wait))))
    }

    /// The held generation's tensors as ``(name, view)`` pairs; each view keeps the generation alive.
    fn tensors(&self) -> PyResult<Vec<(String, WeightsTensor)>> {
        let held = self.held()?;
        let ordinal = self.served.ordinal();
        let ctx = self.served.ctx();
        each_backend!(held, h => {
            let base = h.view().ptr().0;
            let generation = h.generation();
            h.manifest()
                .entries
                .iter()
                .map(|e| {
                    let tensor = WeightsTensor {
                        name: e.name.clone(),
                        generation,
                        ptr: base + e.offset,
                        layout: Layout::of_tensor(&e.desc)?,
                        ordinal,
                        hold: MappingHold::new(h.clone(), ctx.clone()),
                    };
                    Ok((e.name.clone(), tensor))
                })
                .collect()
        })
    }

    /// The held generation's whole arena as one ``uint8`` view (the manifest at byte 0), with its tensors as
    /// ``(names, runs, order)``: the names (manifest order); the runs, ``(dtype, count, shape, strides, offset,
    /// step)`` each (tensors of one element type, shape and strides, ``step`` bytes apart from byte ``offset``;
    /// strides in elements; every entry checked against the mapped extent); for each name, its place among the
    /// runs' tensors laid end to end. One DLPack import for every tensor, which ``gpu_ipc.weights`` cuts the
    /// tensors from, a strided view per run. The view keeps the generation alive.
    fn arena(&self, py: Python<'_>) -> PyResult<(WeightsTensor, ArenaCut)> {
        let held = self.held()?;
        let (ordinal, ctx) = (self.served.ordinal(), self.served.ctx());
        each_backend!(held, h => arena_of(py, h.manifest(), h.view().ptr().0, ordinal, MappingHold::new(h.clone(), ctx)))
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
                    let mut bytes = Vec::new();
                    let n = usize::try_from(len).ok().filter(|&n| bytes.try_reserve_exact(n).is_ok());
                    let Some(n) = n else {
                        let problem = format!("tensor {name:?}: {len} bytes: cannot allocate that much host memory");
                        return Err(WeightsError::Invalid(problem));
                    };
                    bytes.resize(n, 0);
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
        let ctx = &self.served.gpu()?.ctx;
        let raw = stream_handle(stream)?.unwrap_or(LEGACY_DEFAULT_STREAM);
        let held = self.held()?;
        let copied =
            py.detach(|| self.served.with_copier(|copier| copy_out_of(&held, copier, first, &ptrs, &borrow(ctx, raw))));
        self.let_go(held);
        copied
    }

    /// Binds the caller's device memory for ``copy_out_bound``: ``ptrs[i]`` is the address of the destination of
    /// tensor ``i`` (the held generation's manifest order; its whole byte span, on the set's device; 0: not
    /// copied). That memory must stay the caller's while the result lives (``Reader.bind`` keeps the tensors
    /// beside it).
    fn bind_targets(&self, ptrs: Vec<u64>) -> PyResult<WeightsBound> {
        self.served.gpu()?;
        let held = self.held()?;
        let spans = each_backend!(&held, h => caller_copies(&h.manifest().entries, 0, &ptrs));
        self.let_go(held);
        Ok(WeightsBound::new(CopyDirection::OutOfArena, spans?))
    }

    /// Queues on ``stream`` (default: the legacy default stream) the copies ``bound`` names out of the held
    /// generation with one launch of the gather kernel (its table prepared once per arena). The held generation
    /// stays mapped until the device's queued work is done, whatever ``refresh`` does meanwhile.
    #[pyo3(signature = (bound, stream=None))]
    fn copy_out_bound(&self, py: Python<'_>, bound: &WeightsBound, stream: Option<&Bound<'_, PyAny>>) -> PyResult<()> {
        fn copy<B: ArenaBytes + GpuBackend>(
            h: &HeldGeneration<B>,
            copier: &mut TensorCopier,
            bound: &mut BoundCopies<'_>,
            stream: &Stream,
        ) -> PyResult<()> {
            h.copy_out_bound(copier, bound, stream).map_err(weights_to_py)
        }
        let ctx = &self.served.gpu()?.ctx;
        let raw = stream_handle(stream)?.unwrap_or(LEGACY_DEFAULT_STREAM);
        let held = self.held()?;
        let copied = py.detach(|| {
            self.served.with_copier(|copier| {
                let (mut copies, stream) = (lock(&bound.copies), borrow(ctx, raw));
                match &held {
                    PerBackend::Legacy(h) => copy(h, copier, &mut copies, &stream),
                    PerBackend::Vmm(h) => copy(h, copier, &mut copies, &stream),
                    PerBackend::Host(_) => Err(ArgumentError::new_err("copy_out_bound is for GPU backends; use read")),
                }
            })
        });
        self.let_go(held);
        copied
    }

    /// Copies held tensor ``i`` into ``tensors[names[i]]`` for every ``i`` from ``first`` on, on ``stream``, when
    /// each is a ``kind`` (``torch.Tensor``) whose ``dtype`` is ``dtypes[i]`` (the same object), whose ``shape``
    /// equals ``shapes[i]``, on the set's device, contiguous: every one is checked first, so nothing is written
    /// unless all pass. Returns ``len(names)`` once the copies are queued, else the index of the first tensor that
    /// does not pass (or is missing), with nothing queued. ``names`` must be the held generation's, in manifest
    /// order.
    #[pyo3(signature = (tensors, names, first, kind, dtypes, shapes, stream=None))]
    #[allow(clippy::too_many_arguments)]
    fn copy_out_to(
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
        let held = self.held()?;
        let count = each_backend!(&held, h => h.manifest().entries.len());
        if names.len() != count {
            self.let_go(held);
            return Err(ArgumentError::new_err(format!(
                "{} names for a generation of {count} tensors: give the held generation's names",
                names.len()
            )));
        }
        let expected = Expected { kind, names, dtypes, shapes, device: i64::from(gpu.ordinal) };
        let copied = read_all(tensors, first, &expected).and_then(|(ptrs, stop)| {
            if stop < count {
                return Ok(stop);
            }
            py.detach(|| {
                self.served.with_copier(|copier| copy_out_of(&held, copier, first, &ptrs, &borrow(&gpu.ctx, raw)))
            })?;
            Ok(count)
        });
        self.let_go(held);
        copied
    }

    /// Whether the owner closed the set or went away (what is held stays readable).
    #[getter]
    fn owner_gone(&self) -> PyResult<bool> {
        Ok(each_backend!(&*lock(&*self.reader()?), r => r.owner_gone()))
    }

    fn __repr__(&self) -> String {
        self.served.repr("WeightsReader", self.generation().unwrap_or(0))
    }
}

served_getters!(WeightsReader);
crate::closable!(WeightsReader, reader, "Lets go of the set (tensors already made stay valid). Idempotent.");

impl Drop for WeightsReader {
    fn drop(&mut self) {
        if self.reader.made_elsewhere() {
            self.served.forget();
        }
    }
}

/// Opens a set of either kind, attaching once: a set on one device on `gpu` (another device is refused, as
/// `WeightsReader::open` refuses it), a set of parts each part on the device whose UUID its manifest names (on the
/// host backend, the host). Returns the reader and every part's device ordinal (`None` on the host backend).
fn open_set(
    backend: BackendKind,
    gpu: Option<&Gpu>,
    socket: &std::path::Path,
    name: &str,
    timeout: std::time::Duration,
) -> Result<(Reader, Vec<Option<i32>>), WeightsError> {
    if !backend.is_gpu() {
        return Ok(match OpenedSet::<Host>::open(socket, name, |_| Ok(HostContext), timeout)? {
            OpenedSet::Whole(r) => (PerBackend::Host(ReadSet::Whole(r)), vec![None]),
            OpenedSet::Parts(p) => {
                let parts = p.part_count();
                (PerBackend::Host(ReadSet::Parts(p)), vec![None; parts])
            }
        });
    };
    // The device asked for, if any: its UUID, ordinal and context.
    let asked = match gpu {
        Some(g) => Some((g.ctx.device().uuid().map_err(|e| WeightsError::Pool(PoolError::Backend(e.into())))?, g)),
        None => None,
    };
    let mut devices: Vec<(DeviceUuid, i32)> = asked.iter().map(|(uuid, g)| (*uuid, g.ordinal)).collect();
    let mut on_device = |uuid: DeviceUuid| -> Result<Context, PoolError> {
        if let Some((here, g)) = &asked
            && *here == uuid
        {
            return Ok(g.ctx.clone());
        }
        let device = Device::with_uuid(uuid).map_err(|e| PoolError::Backend(e.into()))?.ok_or_else(|| {
            PoolError::Unsupported(format!(
                "weight set `{name}` (or a part of it) lies on device {uuid}, which this process does not see: \
                 make it visible (CUDA_VISIBLE_DEVICES)"
            ))
        })?;
        // The caller's current context (torch's) stays current: a part on device 1 must not move its device off 0.
        let ctx = Context::keeping_current(device).map_err(|e| PoolError::Backend(e.into()))?;
        devices.push((uuid, device.ordinal()));
        Ok(ctx)
    };
    let reader = match backend {
        BackendKind::Legacy => match OpenedSet::<Legacy>::open(socket, name, &mut on_device, timeout)? {
            OpenedSet::Whole(r) => PerBackend::Legacy(ReadSet::Whole(r)),
            OpenedSet::Parts(p) => PerBackend::Legacy(ReadSet::Parts(p)),
        },
        _ => match OpenedSet::<Vmm>::open(socket, name, &mut on_device, timeout)? {
            OpenedSet::Whole(r) => PerBackend::Vmm(ReadSet::Whole(r)),
            OpenedSet::Parts(p) => PerBackend::Vmm(ReadSet::Parts(p)),
        },
    };
    let uuids = each_backend!(&reader, r => match r {
        ReadSet::Parts(p) => p.held().parts().iter().map(|h| h.manifest().device_uuid).collect::<Vec<_>>(),
        ReadSet::Whole(_) => Vec::new(),
    });
    if uuids.is_empty() {
        // A set on one device: refused on another device than the one asked for (part 0 was attached there); with
        // none asked for, on its own.
        return match asked {
            Some((here, _)) if devices.len() > 1 => {
                let offered = devices[1].0;
                Err(WeightsError::Pool(PoolError::WrongDevice { path: socket.to_path_buf(), offered, here }))
            }
            _ => Ok((reader, vec![devices.first().map(|&(_, ordinal)| ordinal)])),
        };
    }
    let ordinals =
        uuids.iter().map(|uuid| devices.iter().find(|(u, _)| u == uuid).map(|&(_, ordinal)| ordinal)).collect();
    Ok((reader, ordinals))
}
