//! `gpu_ipc.Producer` and `gpu_ipc.Slot`: the producing end of a ring, and the right to write one slot.

use std::path::PathBuf;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use gpu_ipc::BackendKind;
use gpu_ipc::core::frames::{FrameError, Producer as CoreProducer, ProducerConfig, SlotLease};
use gpu_ipc::core::wire::{DType, FrameGeometry, SlotLayout, SyncStrategy, TensorDesc, UnknownName};
use gpu_ipc::host::{Host, HostContext, HostRegion};
use gpu_ipc::legacy::Legacy;
use gpu_ipc::vmm::Vmm;
use pyo3::prelude::*;
use pyo3::types::PyTuple;

use crate::each_backend;
use crate::errors::{ArgumentError, ClosedError, ForeignToken, ReleasedError, to_py};
use crate::mapping::MappingHold;
use crate::ring::{
    Gpu, Held, PerBackend, lock, parse_backend, parse_sync, seconds, wait_in_slices, waits_in_slices, waits_on_cpu,
};
use crate::stream::{LEGACY_DEFAULT_STREAM, stream_handle};
use crate::view::{ArrayMemory, Layout, Memory, View, order_after, parse_format};

type End = PerBackend<CoreProducer<Legacy>, CoreProducer<Vmm>, CoreProducer<Host>>;

/// The producing end of a frame ring: publishes frames into ``slots`` slots of one shared allocation.
///
/// ``backend``: ``"vmm"`` (default), ``"legacy"`` or ``"host"`` (shared host memory, no GPU needed).
/// ``sync``: ``"gpu-stream-ops"`` (default on a GPU: the GPU waits, no CPU per frame), ``"ipc-event"``,
/// ``"cpu-spin"`` (default with ``backend="host"``), ``"cpu-sleep"``, or ``"gpu-poll"`` (MPS only).
/// ``format``: ``rgb8`` (default), ``rgba8``, ``bgra8``, ``gray8``, ``gray16``, ``rgbaf16``, ``rgbaf32``; frames
/// are ``(height, width, channels)`` arrays (``width`` 3840 and ``height`` 2160 by default). Or slots of any tensor:
/// ``shape=(8, 1024, 1024), dtype="float16"`` (contiguous; ``dtype`` is a NumPy / PyTorch name, ``uint8`` by default,
/// and ``width``, ``height``, ``format`` are then not given).
///
/// Example::
///
///     with gpu_ipc.Producer("/tmp/frames.sock", width=64, height=32, backend="host") as producer:
///         producer.wait_for_consumers(1, timeout=10)
///         slot = producer.acquire()
///         numpy.from_dlpack(slot)[:] = 7     # writes the slot in place
///         producer.publish(slot)
///         producer.drain(timeout=5)
///     # leaving the block closes the ring: consumers get every frame, then the end of the stream
#[pyclass(frozen, module = "gpu_ipc._gpu_ipc")]
pub struct Producer {
    end: Mutex<Held<End>>,
    closed: AtomicBool,
    /// The process that made it (see `Drop`).
    pid: u32,
    gpu: Option<Gpu>,
    host: Option<HostRegion>,
    /// The GPU backends' hold on the ring's allocation, which every slot shares (see `crate::mapping`); dropped at
    /// close, before the core's producer, so that the core's teardown frees it unless a tensor still holds it.
    mapping: Mutex<Option<MappingHold>>,
    backend: BackendKind,
    sync: SyncStrategy,
    layout: Layout,
    nbytes: u64,
    slots: u32,
    socket: PathBuf,
}

/// The right to write one slot, then publish it once (``Producer.publish``).
///
/// Read and write it in place as a tensor: ``torch.from_dlpack(slot)``, ``cupy.from_dlpack(slot)``,
/// ``numpy.from_dlpack(slot)`` (host backend). Once published, this object raises ``ReleasedError`` on ``ptr``
/// and the array protocols; tensors already made from it are the caller's responsibility: do not write them
/// after ``publish``. Such a tensor never points at freed memory: it (and this object) keeps the ring's allocation
/// alive in this process, even after the producer closed, until the last of them is gone.
#[pyclass(frozen, module = "gpu_ipc._gpu_ipc")]
pub struct Slot {
    lease: Mutex<Option<SlotLease>>,
    producer: Py<Producer>,
    seq: u64,
    index: u32,
    ptr: u64,
    nbytes: u64,
    /// The stream `acquire` queued its wait on (GPU backends), the default of `publish`.
    stream: Option<u64>,
    /// Made by ``acquire_after``: a frame past the next, which ``publish`` checks is its turn before taking it.
    ahead: bool,
    /// Other streams that took the slot through DLPack: the publish is ordered after the work they queued.
    writers: Mutex<Vec<u64>>,
    /// Keeps the ring's allocation alive while this object lives (GPU backends).
    hold: Option<MappingHold>,
}

impl Producer {
    /// The Python object of `lease`, acquired with `raw` (the stream its waits were queued on, GPU backends).
    fn slot_of(slf: &Bound<'_, Self>, lease: SlotLease, raw: Option<u64>, ahead: bool) -> Slot {
        let this = slf.get();
        Slot {
            ahead,
            seq: lease.seq().0,
            index: lease.slot().0,
            ptr: lease.ptr().0,
            nbytes: lease.bytes(),
            stream: this.gpu.as_ref().map(|_| raw.unwrap_or(LEGACY_DEFAULT_STREAM)),
            lease: Mutex::new(Some(lease)),
            producer: slf.clone().unbind(),
            writers: Mutex::new(Vec::new()),
            hold: lock(&this.mapping).clone(),
        }
    }

    /// Whether the end is still open (and this process's). The lock is taken with the GIL released: another
    /// thread may hold it for a whole call of the core.
    fn open_end(&self, py: Python<'_>) -> PyResult<()> {
        py.detach(|| lock(&self.end).get("producer").map(|_| ()))
    }

    /// Runs `f` on the core's producer with the GIL released, the lock taken inside.
    fn with_end<T: Send>(
        &self,
        py: Python<'_>,
        timeout: Duration,
        sliced: bool,
        mut f: impl FnMut(&mut End, Duration) -> Result<T, FrameError> + Send,
    ) -> PyResult<T> {
        self.open_end(py)?;
        wait_in_slices(py, timeout, sliced, |t| {
            let mut held = lock(&self.end);
            match held.get("producer") {
                Ok(end) => f(end, t),
                Err(_) => Err(FrameError::Config("the producer was closed by another thread".into())),
            }
        })
    }

    fn close_end(&self, py: Python<'_>) -> PyResult<()> {
        let end = py.detach(|| lock(&self.end).take("producer"))?;
        self.closed.store(true, Ordering::Release);
        lock(&self.mapping).take();
        // Dropping waits (bounded) for the stream's queued work on the ring, then closes it: consumers see the
        // end of the stream after the last frame.
        py.detach(move || drop(end));
        Ok(())
    }
}

#[pymethods]
impl Producer {
    #[new]
    #[pyo3(signature = (socket, width=None, height=None, format=None, slots=4, sync=None, backend="vmm", device=0, max_consumers=16, shape=None, dtype=None))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        socket: PathBuf,
        width: Option<u32>,
        height: Option<u32>,
        format: Option<&str>,
        slots: u32,
        sync: Option<&str>,
        backend: &str,
        device: i32,
        max_consumers: u32,
        shape: Option<Vec<u64>>,
        dtype: Option<&str>,
    ) -> PyResult<Self> {
        let backend = parse_backend(backend)?;
        let sync = match sync {
            Some(name) => parse_sync(name)?,
            None => SyncStrategy::default_for(backend),
        };
        let slot = slot_layout(width, height, format, shape, dtype)?;
        let layout = Layout::of_slot(&slot)?;
        let nbytes = slot.bytes();
        let mut config = ProducerConfig::new(&socket, slot, slots, sync);
        config.max_consumers = max_consumers;
        if backend.is_gpu() {
            Gpu::not_in_forked_child()?;
        }
        let made = py.detach(|| -> Result<(End, Option<Gpu>, Option<HostRegion>), FrameError> {
            Ok(match backend {
                BackendKind::Host => {
                    let p = CoreProducer::<Host>::create(&HostContext, config)?;
                    let host = p.region().clone();
                    (PerBackend::Host(p), None, Some(host))
                }
                BackendKind::Legacy => {
                    let gpu = Gpu::open(device)?;
                    (PerBackend::Legacy(CoreProducer::<Legacy>::create(&gpu.ctx, config)?), Some(gpu), None)
                }
                BackendKind::Vmm => {
                    let gpu = Gpu::open(device)?;
                    (PerBackend::Vmm(CoreProducer::<Vmm>::create(&gpu.ctx, config)?), Some(gpu), None)
                }
                other => return Err(FrameError::Config(format!("backend {other} is not in this build"))),
            })
        });
        let (end, gpu, host) = made.map_err(to_py)?;
        let mapping = match (&end, &gpu) {
            (PerBackend::Legacy(p), Some(g)) => Some(MappingHold::new(p.shared_region(), Some(g.ctx.clone()))),
            (PerBackend::Vmm(p), Some(g)) => Some(MappingHold::new(p.shared_region(), Some(g.ctx.clone()))),
            _ => None,
        };
        Ok(Self {
            end: Mutex::new(Held::new(end)),
            closed: AtomicBool::new(false),
            pid: std::process::id(),
            gpu,
            host,
            mapping: Mutex::new(mapping),
            backend,
            sync,
            layout,
            nbytes,
            slots,
            socket,
        })
    }

    /// Waits until the next frame's slot is free (every live consumer released what it held) and returns it.
    ///
    /// With a GPU-side strategy the wait is queued on ``stream`` and this returns at once. Raises ``Timeout``.
    #[pyo3(signature = (timeout=1.0, stream=None))]
    fn acquire(slf: &Bound<'_, Self>, timeout: f64, stream: Option<&Bound<'_, PyAny>>) -> PyResult<Slot> {
        let this = slf.get();
        let raw = stream_handle(stream)?;
        let gpu = this.gpu.as_ref();
        let lease = this.with_end(slf.py(), seconds(timeout)?, waits_in_slices(this.sync), |end, t| {
            let s = gpu.map(|g| g.stream(raw));
            each_backend!(end, p => p.acquire(s.as_deref(), t))
        })?;
        Ok(Self::slot_of(slf, lease, raw, false))
    }

    /// Waits until the slot of the frame after ``slot``'s is free and returns it, while ``slot`` is still held: a
    /// producer may hold the next frame and up to ``slots - 1`` more at once (written in parallel or out of order),
    /// and publishes them in order (``publish`` refuses a frame before the ones it follows). Strategies whose
    /// waits are on the CPU (``cpu-spin``, ``cpu-sleep``, ``ipc-event``) only, for now. Raises ``Timeout``;
    /// ``ConfigError`` when that frame would take the slot of one this producer still holds, or for a GPU-side
    /// strategy; ``ForeignToken`` for another producer's slot; ``ReleasedError`` for a slot already published.
    #[pyo3(signature = (slot, timeout=1.0, stream=None))]
    fn acquire_after(
        slf: &Bound<'_, Self>,
        slot: &Bound<'_, Slot>,
        timeout: f64,
        stream: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Slot> {
        let this = slf.get();
        let held = slot.get();
        if !held.producer.bind(slf.py()).is(slf) {
            return Err(ForeignToken::new_err(format!("slot (frame {}) is another producer's", held.seq)));
        }
        let raw = stream_handle(stream)?;
        let gpu = this.gpu.as_ref();
        let timeout = seconds(timeout)?;
        // Taken out while the wait lasts (it lets the GIL go between slices: another thread's publish of this slot
        // must not wait on its lock while holding the GIL), then put back.
        let Some(after) = lock(&held.lease).take() else {
            return Err(ReleasedError::new_err(format!("slot (frame {}) was published already", held.seq)));
        };
        let acquired = this.with_end(slf.py(), timeout, waits_in_slices(this.sync), |end, t| {
            let s = gpu.map(|g| g.stream(raw));
            each_backend!(end, p => p.acquire_after(&after, s.as_deref(), t))
        });
        *lock(&held.lease) = Some(after);
        Ok(Self::slot_of(slf, acquired?, raw, true))
    }

    /// Publishes ``slot`` once the work queued on ``stream`` (default: the stream ``acquire`` used) is done.
    ///
    /// Also once the work queued so far on every other stream that took the slot through ``__dlpack__`` is done
    /// (those streams must still exist). A slot is published once: again raises ``ReleasedError``; another
    /// producer's raises ``ForeignToken``.
    #[pyo3(signature = (slot, stream=None))]
    fn publish(slf: &Bound<'_, Self>, slot: &Bound<'_, Slot>, stream: Option<&Bound<'_, PyAny>>) -> PyResult<()> {
        let this = slf.get();
        let slot = slot.get();
        if !slot.producer.bind(slf.py()).is(slf) {
            return Err(ForeignToken::new_err(format!("slot (frame {}) is another producer's", slot.seq)));
        }
        this.open_end(slf.py())?;
        // Before anything is taken: a frame held ahead (``acquire_after``) published before the ones it follows is
        // refused and stays to publish in its turn. (An ``acquire`` slot is never ahead: no look for it.)
        let next = if slot.ahead {
            this.with_end(slf.py(), Duration::ZERO, false, |end, _| Ok(each_backend!(end, p => p.next_sequence())))?
        } else {
            slot.seq
        };
        if slot.seq > next {
            return Err(ForeignToken::new_err(format!(
                "frame {} comes after frame {next}, not published yet: publish the frames in order",
                slot.seq
            )));
        }
        let raw = stream_handle(stream)?.or(slot.stream);
        let gpu = this.gpu.as_ref();
        if let Some(gpu) = gpu {
            // Before the lease is taken: an error here leaves the slot to publish again.
            let publish_stream = raw.unwrap_or(LEGACY_DEFAULT_STREAM);
            for writer in lock(&slot.writers).drain(..) {
                order_after(&gpu.ctx, writer, publish_stream)?;
            }
        }
        let Some(lease) = lock(&slot.lease).take() else {
            return Err(ReleasedError::new_err(format!("slot (frame {}) was published already", slot.seq)));
        };
        let mut lease = Some(lease);
        this.with_end(slf.py(), Duration::ZERO, false, |end, _| {
            let s = gpu.map(|g| g.stream(raw));
            let lease = lease.take().ok_or_else(|| FrameError::Config("publish ran twice".into()))?;
            each_backend!(end, p => p.publish(lease, s.as_deref()))
        })
    }

    /// Admits consumers until ``count`` are attached; raises ``Timeout`` after ``timeout`` seconds.
    #[pyo3(signature = (count=1, timeout=30.0))]
    fn wait_for_consumers(&self, py: Python<'_>, count: usize, timeout: f64) -> PyResult<()> {
        let total = seconds(timeout)?;
        let start = std::time::Instant::now();
        let result = self.with_end(py, total, true, |end, t| each_backend!(end, p => p.wait_for_consumers(count, t)));
        // The core's message names the slice it waited; say the whole wait.
        result.map_err(|e| {
            if e.is_instance_of::<crate::errors::Timeout>(py) {
                to_py(FrameError::Timeout {
                    what: format!("{count} consumer(s) to attach ({} did)", self.consumers(py).unwrap_or(0)),
                    waited: start.elapsed(),
                })
            } else {
                e
            }
        })
    }

    /// Waits until every live consumer released every published frame: the end of a run.
    #[pyo3(signature = (timeout=10.0, stream=None))]
    fn drain(&self, py: Python<'_>, timeout: f64, stream: Option<&Bound<'_, PyAny>>) -> PyResult<()> {
        let raw = stream_handle(stream)?;
        let gpu = self.gpu.as_ref();
        self.with_end(py, seconds(timeout)?, waits_on_cpu(self.sync), |end, t| {
            let s = gpu.map(|g| g.stream(raw));
            each_backend!(end, p => p.drain(s.as_deref(), t))
        })
    }

    /// Consumers attached and alive.
    fn consumers(&self, py: Python<'_>) -> PyResult<usize> {
        self.with_end(py, Duration::ZERO, false, |end, _| Ok(each_backend!(end, p => p.consumers())))
    }

    /// Consumers that vanished without detaching (killed, crashed).
    fn consumers_lost(&self, py: Python<'_>) -> PyResult<usize> {
        self.with_end(py, Duration::ZERO, false, |end, _| Ok(each_backend!(end, p => p.consumers_lost())))
    }

    /// The sequence number the next ``acquire`` returns.
    #[getter]
    fn next_sequence(&self, py: Python<'_>) -> PyResult<u64> {
        self.with_end(py, Duration::ZERO, false, |end, _| Ok(each_backend!(end, p => p.next_sequence())))
    }

    /// Closes the ring (waits, bounded, for the stream's work on it): consumers read the frames published,
    /// then get ``EndOfStream``. Slots not published are lost. Idempotent.
    fn close(&self, py: Python<'_>) -> PyResult<()> {
        if self.closed.load(Ordering::Acquire) {
            return Ok(());
        }
        self.close_end(py)
    }

    #[getter]
    fn closed(&self) -> bool {
        self.closed.load(Ordering::Acquire)
    }

    fn __enter__(slf: Bound<'_, Self>) -> Bound<'_, Self> {
        slf
    }

    #[pyo3(signature = (*_args))]
    fn __exit__(&self, py: Python<'_>, _args: &Bound<'_, PyTuple>) -> PyResult<bool> {
        self.close(py)?;
        Ok(false)
    }

    fn __repr__(&self) -> String {
        format!(
            "Producer(socket={:?}, backend={:?}, sync={:?}, shape={:?}, slots={}{})",
            self.socket.display().to_string(),
            self.backend.name(),
            self.sync.name(),
            self.layout.shape,
            self.slots,
            if self.closed() { ", closed" } else { "" }
        )
    }
}

impl Drop for Producer {
    fn drop(&mut self) {
        if self.pid != std::process::id() {
            // A forked child's copy: CUDA is not usable here, and the context is the parent's to release.
            std::mem::forget(self.gpu.take());
        }
        // Our hold goes first, so that the core's producer (dropped next, with the fields) is the last owner of the
        // ring's memory unless a tensor still holds it, and its own teardown frees it.
        lock(&self.mapping).take();
    }
}

/// What each slot holds: pixel frames (`width`, `height`, `format`, with their defaults) or a contiguous tensor
/// (`shape`, `dtype`), not both.
fn slot_layout(
    width: Option<u32>,
    height: Option<u32>,
    format: Option<&str>,
    shape: Option<Vec<u64>>,
    dtype: Option<&str>,
) -> PyResult<SlotLayout> {
    let Some(shape) = shape else {
        if dtype.is_some() {
            return Err(ArgumentError::new_err("dtype= describes a tensor slot: give shape= too"));
        }
        let format = parse_format(format.unwrap_or("rgb8"))?;
        let geometry =
            FrameGeometry::new(width.unwrap_or(3840), height.unwrap_or(2160), format).map_err(|e| to_py(e.into()))?;
        return Ok(SlotLayout::frames(geometry));
    };
    if width.is_some() || height.is_some() || format.is_some() {
        return Err(ArgumentError::new_err(
            "shape= makes slots of a tensor; width=, height= and format= describe pixel frames: give one or the other",
        ));
    }
    let dtype: DType =
        dtype.unwrap_or("uint8").parse().map_err(|e: UnknownName| ArgumentError::new_err(e.to_string()))?;
    let desc = TensorDesc::contiguous(dtype, shape).map_err(|e| ArgumentError::new_err(e.to_string()))?;
    Ok(SlotLayout::tensors(desc))
}

impl ArrayMemory for Slot {
    fn layout(&self) -> &Layout {
        &self.producer.get().layout
    }

    fn view(&self) -> PyResult<View> {
        let producer = self.producer.get();
        if producer.closed() {
            return Err(ClosedError::new_err(format!("slot (frame {}): the producer is closed", self.seq)));
        }
        if lock(&self.lease).is_none() {
            return Err(ReleasedError::new_err(format!(
                "slot (frame {}) was published: its memory is the consumers' now",
                self.seq
            )));
        }
        let memory = match (&producer.gpu, &self.hold, &producer.host) {
            (Some(gpu), Some(hold), _) => Memory::Cuda {
                ctx: gpu.ctx.clone(),
                ordinal: gpu.ordinal,
                stream: self.stream.unwrap_or(LEGACY_DEFAULT_STREAM),
                hold: hold.clone(),
            },
            (None, _, Some(host)) => Memory::Host(host.clone()),
            _ => return Err(ClosedError::new_err("the producer holds no memory")),
        };
        Ok(View { ptr: self.ptr, layout: producer.layout.clone(), memory })
    }

    /// The slot's publish waits for the work queued on `stream` (ordered after the slot's wait when it took it).
    fn taken_on(&self, stream: u64) {
        let mut writers = lock(&self.writers);
        if !writers.contains(&stream) {
            writers.push(stream);
        }
    }
}

crate::array_protocols!(Slot);

#[pymethods]
impl Slot {
    /// The frame's sequence number (0, 1, 2, ...).
    #[getter]
    pub(crate) fn seq(&self) -> u64 {
        self.seq
    }

    /// The slot index in the ring.
    #[getter]
    fn slot(&self) -> u32 {
        self.index
    }

    #[getter]
    pub(crate) fn nbytes(&self) -> u64 {
        self.nbytes
    }

    /// The slot's address (device address on a GPU, host address with the host backend).
    #[getter]
    fn ptr(&self) -> PyResult<u64> {
        self.view().map(|v| v.ptr)
    }

    /// The stream ``acquire`` queued its wait on (GPU backends).
    #[getter]
    fn stream(&self) -> Option<u64> {
        self.stream
    }

    #[getter]
    fn published(&self) -> bool {
        lock(&self.lease).is_none()
    }

    fn __repr__(&self) -> String {
        format!(
            "Slot(seq={}, slot={}, nbytes={}{})",
            self.seq,
            self.index,
            self.nbytes,
            if self.published() { ", published" } else { "" }
        )
    }
}

crate::ring_end_getters!(Producer);
