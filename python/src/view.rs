//! A frame's or slot's memory as a tensor without a copy: DLPack (through `dlpark`) and, for the GPU backends,
//! `__cuda_array_interface__` v3. What `Slot` and `Frame` share.

use std::sync::{Arc, Mutex};

use dlpark::ffi::{DLDataType, DLDataTypeCode, DLDevice, DLManagedTensor, DLManagedTensorVersioned};
use dlpark::metadata::Dynamic;
use dlpark::python::{DlpackExporter, ExportRequest, export_dlpack};
use dlpark::{DlpackFlags, Managed, ManagedTensorBase};
use gpu_ipc::core::shm::SharedMemory;
use gpu_ipc::core::wire::{DType, PixelFormat, SlotLayout, TensorDesc};
use gpu_ipc::driver::{Context, Event, EventFlags};
use gpu_ipc::host::HostRegion;
use pyo3::exceptions::PyBufferError;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyTuple};

use crate::errors::{ArgumentError, driver_to_py};
use crate::mapping::MappingHold;
use crate::ring::lock;
use crate::stream::{LEGACY_DEFAULT_STREAM, borrow, same_stream, stream_handle};

/// How a slot (or a shared buffer) is laid out as an array: `shape` of one element type, `strides` in elements.
#[derive(Debug, Clone)]
pub struct Layout {
    /// The extents (`(height, width, channels)` for a pixel frame).
    pub shape: Vec<i64>,
    /// Strides in elements.
    pub strides: Vec<i64>,
    /// The element type.
    pub dtype: DLDataType,
    /// NumPy's name of the element type.
    pub dtype_name: &'static str,
    /// `__cuda_array_interface__`'s `typestr` (`|V<n>`, raw bytes, for types NumPy has no letter for).
    pub typestr: String,
    /// Bytes from the first element to one past the last one.
    pub span_bytes: u64,
}

impl Layout {
    /// The layout of the tensor `desc` describes.
    pub fn of_tensor(desc: &TensorDesc) -> PyResult<Self> {
        let too_large = |_| ArgumentError::new_err(format!("tensor {desc} has an extent or stride beyond 2^63"));
        let shape = desc.shape().iter().map(|&d| i64::try_from(d).map_err(too_large)).collect::<PyResult<_>>()?;
        let strides = desc
            .strides_or_contiguous()
            .into_iter()
            .map(|d| i64::try_from(d).map_err(too_large))
            .collect::<PyResult<_>>()?;
        let dtype = desc.dtype();
        let dl = dtype.dlpack();
        Ok(Self {
            shape,
            strides,
            dtype: DLDataType { code: DLDataTypeCode(dl.code), bits: dl.bits, lanes: dl.lanes },
            dtype_name: dtype.name(),
            typestr: typestr(dtype),
            span_bytes: desc.span_bytes(),
        })
    }

    /// The layout of a ring's slots: its tensor (a pixel frame is `(height, width, channels)`), else the slot's bytes
    /// as a 1-D `uint8` array.
    pub fn of_slot(slot: &SlotLayout) -> PyResult<Self> {
        match slot.tensor() {
            Some(desc) => Self::of_tensor(desc),
            None => Self::bytes(slot.bytes()),
        }
    }

    /// One 64-bit word as a 0-d `int64` array (a frame's stamp word: its values stay below 2^63).
    pub fn word() -> Self {
        Self {
            shape: Vec::new(),
            strides: Vec::new(),
            dtype: DLDataType { code: DLDataTypeCode::INT, bits: 64, lanes: 1 },
            dtype_name: "int64",
            typestr: "<i8".to_owned(),
            span_bytes: 8,
        }
    }

    /// `bytes` bytes as a 1-D `uint8` array.
    pub fn bytes(bytes: u64) -> PyResult<Self> {
        let desc = TensorDesc::contiguous(DType::U8, [bytes]).map_err(|e| ArgumentError::new_err(e.to_string()))?;
        Self::of_tensor(&desc)
    }
}

/// `__cuda_array_interface__`'s `typestr` of `dtype`.
fn typestr(dtype: DType) -> String {
    let size = dtype.size_bytes();
    let kind = match dtype {
        DType::I8 | DType::I16 | DType::I32 | DType::I64 => 'i',
        DType::U8 | DType::U16 | DType::U32 | DType::U64 => 'u',
        DType::F16 | DType::F32 | DType::F64 => 'f',
        DType::C64 | DType::C128 => 'c',
        DType::Bool => 'b',
        _ => 'V',
    };
    let order = if size == 1 || kind == 'V' { '|' } else { '<' };
    format!("{order}{kind}{size}")
}

/// Parses a pixel format name: `rgb8`, `rgba8`, `bgra8`, `gray8`, `gray16`, `rgbaf16`, `rgbaf32`.
pub fn parse_format(name: &str) -> PyResult<PixelFormat> {
    Ok(match name {
        "rgb8" => PixelFormat::Rgb8,
        "rgba8" => PixelFormat::Rgba8,
        "bgra8" => PixelFormat::Bgra8,
        "gray8" => PixelFormat::Gray8,
        "gray16" => PixelFormat::Gray16,
        "rgbaf16" => PixelFormat::RgbaF16,
        "rgbaf32" => PixelFormat::RgbaF32,
        other => {
            return Err(ArgumentError::new_err(format!(
                "unknown pixel format {other:?}; use rgb8, rgba8, bgra8, gray8, gray16, rgbaf16 or rgbaf32"
            )));
        }
    })
}

/// Where a view's memory is, and what keeps it there.
#[derive(Clone)]
pub enum Memory {
    /// Host memory of the host backend: the exported tensor holds a reference to the mapping, so an array made
    /// from a frame never points at unmapped memory (its contents still belong to the producer once released).
    Host(HostRegion),
    /// Device memory of a GPU backend, ready on `stream` (a raw `CUstream`) of `ctx`'s device.
    Cuda {
        /// The device's primary context.
        ctx: Context,
        /// The device ordinal.
        ordinal: i32,
        /// The stream the frame's GPU-side wait (or the slot's) was queued on.
        stream: u64,
        /// Keeps the ring mapped: the exported tensor holds a clone, so it never points at unmapped memory (its
        /// contents still belong to the producer once released).
        hold: MappingHold,
    },
    /// A pool buffer's memory, kept mapped (and, for an importer, pinned) by `hold`: on device `ordinal`, or host
    /// memory (`None`). No stream to order after: when it is ready is for the processes sharing it to agree on.
    Pool {
        /// The device ordinal; `None` with the host backend.
        ordinal: Option<i32>,
        /// Keeps it mapped.
        hold: MappingHold,
    },
    /// A word of a ring's control block, in host memory read by the CPU (a frame's stamp on the host backend and
    /// with the CPU strategies): the exported tensor keeps the mapping.
    Control(Arc<SharedMemory>),
}

/// What a capsule keeps alive: the memory it points at (held, never read: dropping it is the point).
#[allow(dead_code)]
enum Keep {
    Host(HostRegion),
    Held(MappingHold),
    Control(Arc<SharedMemory>),
}

/// One view: what `__dlpack__` exports.
pub struct View {
    /// Address of the first element.
    pub ptr: u64,
    /// The layout.
    pub layout: Layout,
    /// The memory behind it.
    pub memory: Memory,
}

impl View {
    /// `__dlpack_device__()`: `(kDLCPU, 0)` or `(kDLCUDA, ordinal)`.
    pub fn device(&self) -> DLDevice {
        match &self.memory {
            Memory::Host(_) | Memory::Pool { ordinal: None, .. } | Memory::Control(_) => DLDevice::CPU,
            Memory::Cuda { ordinal, .. } | Memory::Pool { ordinal: Some(ordinal), .. } => DLDevice::cuda(*ordinal),
        }
    }

    /// `__dlpack__`: a fresh capsule. `copy=True` copies a host frame into memory the capsule owns (flagged
    /// `IS_COPIED`); on a GPU it is refused (copy the tensor on your stream instead: `torch.from_dlpack(f).clone()`).
    pub fn dlpack(
        &self,
        py: Python<'_>,
        stream: Option<&Bound<'_, PyAny>>,
        max_version: Option<(u32, u32)>,
        dl_device: Option<(u32, i32)>,
        copy: Option<bool>,
    ) -> PyResult<Py<PyAny>> {
        if copy == Some(true) {
            return self.copied(py, max_version);
        }
        let request = ExportRequest::parse(stream, max_version, dl_device, copy)?;
        export_dlpack(self, py, request)
    }

    fn copied(&self, py: Python<'_>, max_version: Option<(u32, u32)>) -> PyResult<Py<PyAny>> {
        let Memory::Host(region) = &self.memory else {
            return Err(PyBufferError::new_err(
                "copy=True is offered for host ring frames only; elsewhere copy the tensor, e.g. \
                 torch.from_dlpack(frame).clone()",
            ));
        };
        let len = usize::try_from(self.layout.span_bytes).map_err(|_| ArgumentError::new_err("frame too large"))?;
        let mut bytes = vec![0u8; len];
        region.read(gpu_ipc::driver::DevicePtr(self.ptr), &mut bytes).map_err(|e| crate::errors::to_py(e.into()))?;
        let data = bytes.as_mut_ptr().cast();
        let metadata = Dynamic::new(self.layout.shape.clone(), self.layout.strides.clone());
        if max_version.is_some_and(|(major, _)| major >= 1) {
            let mut init = metadata
                .initialize_as::<DLManagedTensorVersioned>(Box::new(bytes))
                .map_err(|e| ArgumentError::new_err(e.to_string()))?;
            init.set_data(data).set_dtype(self.layout.dtype).set_device(DLDevice::CPU);
            #[allow(unsafe_code)]
            // SAFETY: the capsule owns `bytes` (its context), a fresh copy no one else sees: IS_COPIED is true.
            unsafe {
                init.set_flags_unchecked(DlpackFlags::IS_COPIED);
            }
            Ok(finish(init).into_pyobject(py)?.unbind())
        } else {
            let mut init = metadata
                .initialize_as::<DLManagedTensor>(Box::new(bytes))
                .map_err(|e| ArgumentError::new_err(e.to_string()))?;
            init.set_data(data).set_dtype(self.layout.dtype).set_device(DLDevice::CPU);
            Ok(finish(init).into_pyobject(py)?.unbind())
        }
    }

    fn export<M: ManagedTensorBase>(&self) -> PyResult<Managed<M>> {
        let keep = match &self.memory {
            Memory::Host(region) => Keep::Host(region.clone()),
            Memory::Cuda { hold, .. } | Memory::Pool { hold, .. } => Keep::Held(hold.clone()),
            Memory::Control(memory) => Keep::Control(memory.clone()),
        };
        let mut init = Dynamic::new(self.layout.shape.clone(), self.layout.strides.clone())
            .initialize_as::<M>(Box::new(keep))
            .map_err(|e| ArgumentError::new_err(e.to_string()))?;
        init.set_data(self.ptr as usize as *mut std::ffi::c_void)
            .set_dtype(self.layout.dtype)
            .set_device(self.device());
        Ok(finish(init))
    }

    /// `__cuda_array_interface__` (v3) for a GPU view; `None` for host memory (the attribute is then absent).
    pub fn cuda_array_interface<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyDict>>> {
        let stream = match &self.memory {
            Memory::Cuda { stream, .. } => Some(*stream),
            Memory::Pool { ordinal: Some(_), .. } => None,
            Memory::Host(_) | Memory::Pool { ordinal: None, .. } | Memory::Control(_) => return Ok(None),
        };
        let d = PyDict::new(py);
        d.set_item("shape", PyTuple::new(py, &self.layout.shape)?)?;
        d.set_item("typestr", &self.layout.typestr)?;
        d.set_item("data", (self.ptr, false))?;
        d.set_item("version", 3)?;
        let element = i64::from(self.layout.dtype.bits / 8);
        d.set_item("strides", PyTuple::new(py, self.layout.strides.iter().map(|s| s * element))?)?;
        // 0 (the NULL stream) is not allowed there: it means the legacy default stream, which is 1. None: no sync.
        d.set_item("stream", stream.map(|s| if s == 0 { LEGACY_DEFAULT_STREAM } else { s }))?;
        Ok(Some(d))
    }
}

/// Finishes a descriptor whose pointer and metadata were set by this module.
fn finish<M: ManagedTensorBase, S>(init: dlpark::allocation::Initialized<M, S>) -> Managed<M> {
    #[allow(unsafe_code)]
    // SAFETY: the shape and strides were copied into the allocation (explicit strides, rank 3); the data pointer is
    // either the capsule's own copy, or the ring's host or device memory, which the capsule keeps mapped (its context
    // holds the region, or a hold on the GPU mapping); what the memory holds once the frame is released is the
    // documented contract of every view (see `Frame`).
    unsafe {
        init.finish()
    }
}

impl DlpackExporter for View {
    fn device(&self) -> DLDevice {
        View::device(self)
    }

    fn flags(&self) -> DlpackFlags {
        DlpackFlags::empty()
    }

    /// Orders the consumer's stream after the stream the frame was waited for on: an event recorded there, waited
    /// for on the consumer's (nothing when they are the same stream, when the consumer asks for no sync (`-1`),
    /// or on the host).
    fn prepare_export(&self, _py: Python<'_>, request: &ExportRequest<'_>) -> PyResult<()> {
        let Memory::Cuda { ctx, stream, .. } = &self.memory else { return Ok(()) };
        match consumer_stream(request.stream())? {
            Some(consumer) => order_after(ctx, *stream, consumer),
            None => Ok(()),
        }
    }

    fn export_legacy(&self, _py: Python<'_>) -> PyResult<Managed<DLManagedTensor>> {
        self.export()
    }

    fn export_versioned(&self, _py: Python<'_>) -> PyResult<Managed<DLManagedTensorVersioned>> {
        self.export()
    }
}

/// A Python object whose memory is one [`View`] (a frame, a slot, a pool buffer): it gets `__dlpack__`,
/// `__dlpack_device__`, `__cuda_array_interface__`, `shape` and `dtype` from
/// [`array_protocols!`](crate::array_protocols).
pub trait ArrayMemory {
    /// The memory now; raises once the object may no longer be used (released, closed, freed).
    fn view(&self) -> PyResult<View>;

    /// What the memory holds (readable after a release too).
    fn layout(&self) -> &Layout;

    /// Where the memory is (`__dlpack_device__`, which DLPack consumers ask before each `__dlpack__`); raises as
    /// `view` does. By default from `view`.
    fn device(&self) -> PyResult<DLDevice> {
        Ok(self.view()?.device())
    }

    /// `stream`, another stream than the one the memory is ready on, took it through DLPack: a frame's release (a
    /// slot's publish) must wait for the work queued there. Nothing by default.
    fn taken_on(&self, _stream: u64) {}
}

/// `__dlpack__` of `memory`: a fresh capsule, the consumer's `stream` ordered after the memory's own (and noted).
pub fn dlpack_of(
    memory: &impl ArrayMemory,
    py: Python<'_>,
    stream: Option<&Bound<'_, PyAny>>,
    max_version: Option<(u32, u32)>,
    dl_device: Option<(u32, i32)>,
    copy: Option<bool>,
) -> PyResult<Py<PyAny>> {
    let view = memory.view()?;
    if let Memory::Cuda { stream: ready, .. } = &view.memory
        && let Some(taker) = consumer_stream(stream)?
        && taker != *ready
    {
        memory.taken_on(taker);
    }
    view.dlpack(py, stream, max_version, dl_device, copy)
}

/// `__dlpack_device__` of `memory`.
pub fn dlpack_device_of(memory: &impl ArrayMemory) -> PyResult<(u32, i32)> {
    let device = memory.device()?;
    Ok((device.device_type.0, device.device_id))
}

/// `__cuda_array_interface__` of `memory`: absent (`AttributeError`) for host memory.
pub fn cuda_array_interface_of<'py>(memory: &impl ArrayMemory, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
    memory.view()?.cuda_array_interface(py)?.ok_or_else(|| {
        pyo3::exceptions::PyAttributeError::new_err("host memory has no __cuda_array_interface__; use __dlpack__")
    })
}

/// The array protocols of a `#[pyclass]` that implements `view::ArrayMemory`, in a `#[pymethods]` block of their own
/// (PyO3's `multiple-pymethods`): one definition for frames, slots and pool buffers.
#[macro_export]
macro_rules! array_protocols {
    ($class:ty) => {
        #[pyo3::pymethods]
        impl $class {
            /// A DLPack capsule of the memory, no copy; the consumer's ``stream`` is ordered after the stream the
            /// memory is ready on.
            #[pyo3(signature = (*, stream=None, max_version=None, dl_device=None, copy=None))]
            fn __dlpack__(
                &self,
                py: pyo3::Python<'_>,
                stream: Option<&pyo3::Bound<'_, pyo3::PyAny>>,
                max_version: Option<(u32, u32)>,
                dl_device: Option<(u32, i32)>,
                copy: Option<bool>,
            ) -> pyo3::PyResult<pyo3::Py<pyo3::PyAny>> {
                $crate::view::dlpack_of(self, py, stream, max_version, dl_device, copy)
            }

            /// ``(2, ordinal)`` (kDLCUDA) on a GPU, ``(1, 0)`` (kDLCPU) in host memory.
            fn __dlpack_device__(&self) -> pyo3::PyResult<(u32, i32)> {
                $crate::view::dlpack_device_of(self)
            }

            /// Its shape as an array: ``(height, width, channels)`` of a pixel frame, else the tensor's (``(nbytes,)``
            /// for bare bytes).
            #[getter]
            fn shape<'py>(&self, py: pyo3::Python<'py>) -> pyo3::PyResult<pyo3::Bound<'py, pyo3::types::PyTuple>> {
                pyo3::types::PyTuple::new(py, &$crate::view::ArrayMemory::layout(self).shape)
            }

            /// The element type's NumPy name (``"uint8"``, ``"float32"``, ``"bfloat16"``, ...).
            #[getter]
            fn dtype(&self) -> &'static str {
                $crate::view::ArrayMemory::layout(self).dtype_name
            }

            /// Version 3, with ``stream``; absent (``AttributeError``) in host memory.
            #[getter]
            fn __cuda_array_interface__<'py>(
                &self,
                py: pyo3::Python<'py>,
            ) -> pyo3::PyResult<pyo3::Bound<'py, pyo3::types::PyDict>> {
                $crate::view::cuda_array_interface_of(self, py)
            }
        }
    };
}

/// The stream a DLPack consumer names in `__dlpack__(stream=...)`: `None` when it asks for no synchronisation
/// (`-1`); omitted, `0` and `1` are the legacy default stream.
///
/// Parsed here rather than with dlpark's `ExportRequest::cuda_stream`, which refuses 0: some consumers pass 0 for
/// the default stream, and the driver API reads the NULL stream as the legacy default one.
pub fn consumer_stream(stream: Option<&Bound<'_, PyAny>>) -> PyResult<Option<u64>> {
    let Some(obj) = stream else { return Ok(Some(LEGACY_DEFAULT_STREAM)) };
    Ok(match obj.extract::<i64>() {
        Ok(-1) => None,
        Ok(0) => Some(LEGACY_DEFAULT_STREAM),
        _ => Some(stream_handle(Some(obj))?.unwrap_or(LEGACY_DEFAULT_STREAM)),
    })
}

/// The flags of the events that order one stream after another: no timing, no blocking.
const ORDER_EVENT: EventFlags = EventFlags { timing: false, blocking_sync: false, interprocess: false };

/// Makes stream `later` wait for the work queued so far on stream `earlier` (nothing when they are the same), with
/// an event of its own.
pub fn order_after(ctx: &Context, earlier: u64, later: u64) -> PyResult<()> {
    if same_stream(earlier, later) {
        return Ok(());
    }
    let event = Event::new(ctx, ORDER_EVENT).map_err(driver_to_py)?;
    event.record(&borrow(ctx, earlier)).map_err(driver_to_py)?;
    borrow(ctx, later).wait_event(&event).map_err(driver_to_py)
}

/// [`order_after`] with one event, made at first use and recorded again for every ordering: a stream's wait for an
/// event waits for the record made before it (`cuStreamWaitEvent`), so recording it again later changes no wait
/// queued already. Saves creating and destroying an event per call (what a consumer does for every frame taken on
/// another stream than its wait's).
#[derive(Default)]
pub struct StreamOrder {
    event: Mutex<Option<Event>>,
}

impl StreamOrder {
    /// Makes stream `later` wait for the work queued so far on stream `earlier` (nothing when they are the same).
    pub fn after(&self, ctx: &Context, earlier: u64, later: u64) -> PyResult<()> {
        if same_stream(earlier, later) {
            return Ok(());
        }
        // The record and the wait under one lock: another thread's record between them would move what we wait for.
        let mut event = lock(&self.event);
        let event = match &mut *event {
            Some(event) => event,
            none => none.insert(Event::new(ctx, ORDER_EVENT).map_err(driver_to_py)?),
        };
        // The legacy default stream's handle names the calling thread's current context's.
        let _entered = ctx.enter().map_err(driver_to_py)?;
        event.record(&borrow(ctx, earlier)).map_err(driver_to_py)?;
        borrow(ctx, later).wait_event(event).map_err(driver_to_py)
    }
}

/// The view of pool memory (a pool buffer, a weight set's tensor or arena) at `ptr`, laid out as `layout` and kept
/// mapped by `hold`: on device `ordinal`, or host memory (`None`). What every pool-backed array object exports.
pub fn pool_view(ptr: u64, layout: &Layout, ordinal: Option<i32>, hold: MappingHold) -> View {
    View { ptr, layout: layout.clone(), memory: Memory::Pool { ordinal, hold } }
}
