//! `gpu_ipc.Frame` and `gpu_ipc.Stamp`: the right to read one frame of a consumer's ring in place, and the frame's
//! stamp word, each as arrays (DLPack, `__cuda_array_interface__`, and the slot's cached array, `array(library)`).

use std::sync::{Arc, Mutex};

use dlpark::ffi::DLDevice;
use gpu_ipc::core::frames::Frame as CoreFrame;
use pyo3::prelude::*;
use pyo3::types::PyTuple;

use crate::consumer::Consumer;
use crate::errors::{ClosedError, EndOfStream, GpuIpcError, ReleasedError};
use crate::mapping::MappingHold;
use crate::ring::lock;
use crate::slot_arrays::{SlotWord, slot_array};
use crate::stream::{LEGACY_DEFAULT_STREAM, stream_handle};
use crate::view::{ArrayMemory, Layout, Memory, View};

/// The layout of every frame's stamp word: one 0-d `int64`.
static STAMP_LAYOUT: std::sync::LazyLock<Layout> = std::sync::LazyLock::new(Layout::word);

/// A frame's token, shared by the `Frame` object and (for the frame iteration handed out last) the consumer.
pub type Token = Arc<FrameToken>;

/// The core's frame (until released) and the streams that took it through DLPack or `array`: its release is ordered
/// after the work they queued, so a tensor read on another stream than the release's is never overwritten under it.
#[derive(Default)]
pub struct FrameToken {
    /// The core's frame; `None` once released.
    pub frame: Mutex<Option<CoreFrame>>,
    /// The streams other than the frame's own that took it.
    pub readers: Mutex<Vec<u64>>,
}

impl FrameToken {
    /// The token of `frame`, just handed out.
    pub fn new(frame: CoreFrame) -> Token {
        Arc::new(Self { frame: Mutex::new(Some(frame)), readers: Mutex::new(Vec::new()) })
    }
}

/// The right to read one published frame in place, until it is released.
///
/// ``torch.from_dlpack(frame)``, ``cupy.from_dlpack(frame)``, ``jax.dlpack.from_dlpack(frame)``,
/// ``numpy.from_dlpack(frame)`` (host backend): no copy. ``frame.array("torch")`` (``"cupy"``, ``"numpy"``) gives
/// the same array for a fraction of the cost: the slot's array, made once, handed out again. Once the frame is
/// released (or its consumer closed) the slot is the producer's again: this object raises ``ReleasedError`` on
/// ``ptr``, ``array`` and the array protocols, but tensors already made from it still point at the slot and will see
/// later frames: copy what you keep (``tensor.clone()``), or ``__dlpack__(copy=True)`` on the host backend. Such a
/// tensor never points at unmapped memory: it (and this object) keeps the ring mapped in this process, even after
/// the consumer closed, until the last of them is gone.
///
/// A frame is writable, and it is shared: its views are the slot itself, the memory every consumer of the ring
/// reads that frame from. What one consumer writes into a frame (``numpy.from_dlpack(frame)[:] = 0``, an in-place
/// torch op) the others read too, if they read it after the write; nothing marks the views read-only. Treat frames
/// as read-only, or copy first (``tensor.clone()``) and change the copy.
#[pyclass(frozen, module = "gpu_ipc._gpu_ipc")]
pub struct Frame {
    /// The core's frame, and the streams that took it.
    pub(crate) token: Token,
    /// The consumer that received it.
    pub(crate) consumer: Py<Consumer>,
    /// Its sequence number.
    pub(crate) seq: u64,
    /// Its slot.
    pub(crate) index: u32,
    /// The address of its first byte.
    pub(crate) ptr: u64,
    /// Bytes in its slot.
    pub(crate) nbytes: u64,
    /// The stream `next_frame` queued its wait on (GPU backends), the default of `release`.
    pub(crate) stream: Option<u64>,
    /// The device address of the frame's stamp word and the value it must hold (GPU-side strategies).
    pub(crate) stamp: Option<(u64, u64)>,
    /// Keeps the ring mapped while this object lives (GPU backends): the consumer's own hold, shared, so that
    /// handing out a frame costs no allocation.
    pub(crate) hold: Option<Arc<MappingHold>>,
}

impl ArrayMemory for Frame {
    fn layout(&self) -> &Layout {
        &self.consumer.get().layout
    }

    fn device(&self) -> PyResult<DLDevice> {
        self.usable()?;
        Ok(match &self.consumer.get().gpu {
            Some(gpu) => DLDevice::cuda(gpu.ordinal),
            None => DLDevice::CPU,
        })
    }

    fn view(&self) -> PyResult<View> {
        self.usable()?;
        let consumer = self.consumer.get();
        let memory = match (&consumer.gpu, &self.hold, &consumer.host) {
            (Some(gpu), Some(hold), _) => Memory::Cuda {
                ctx: gpu.ctx.clone(),
                ordinal: gpu.ordinal,
                stream: self.stream.unwrap_or(LEGACY_DEFAULT_STREAM),
                hold: MappingHold::clone(hold),
            },
            (None, _, Some(host)) => Memory::Host(host.clone()),
            _ => return Err(ClosedError::new_err("the consumer holds no memory")),
        };
        Ok(View { ptr: self.ptr, layout: consumer.layout.clone(), memory })
    }

    /// The frame's release waits for the work queued on `stream` (ordered after the frame's wait when it took it).
    fn taken_on(&self, stream: u64) {
        let mut readers = lock(&self.token.readers);
        if !readers.contains(&stream) {
            readers.push(stream);
        }
    }
}

crate::array_protocols!(Frame);

impl Frame {
    /// Raises `ReleasedError` once the frame is released or its consumer closed.
    pub(crate) fn usable(&self) -> PyResult<()> {
        if self.consumer.get().closed() {
            return Err(ReleasedError::new_err(format!(
                "frame {}: its consumer is closed, the ring is no longer mapped here",
                self.seq
            )));
        }
        if lock(&self.token.frame).is_none() {
            return Err(ReleasedError::new_err(format!(
                "frame {} was released: its slot is the producer's again",
                self.seq
            )));
        }
        Ok(())
    }

    fn release_here(&self, py: Python<'_>, raw: Option<u64>) -> PyResult<()> {
        self.consumer.get().release_token(py, &self.token, self.seq, raw.or(self.stream))
    }
}

#[pymethods]
impl Frame {
    #[getter]
    pub(crate) fn seq(&self) -> u64 {
        self.seq
    }

    #[getter]
    fn slot(&self) -> u32 {
        self.index
    }

    #[getter]
    pub(crate) fn nbytes(&self) -> u64 {
        self.nbytes
    }

    #[getter]
    fn ptr(&self) -> PyResult<u64> {
        self.usable()?;
        Ok(self.ptr)
    }

    /// The stream ``next_frame`` queued its wait on (GPU backends).
    #[getter]
    fn stream(&self) -> Option<u64> {
        self.stream
    }

    /// This frame as an array of ``library``: ``"torch"`` (a ``torch.Tensor``), ``"cupy"`` or ``"numpy"`` (host
    /// backend). The same array as ``torch.from_dlpack(frame)`` (the frame in place, no copy), for a fraction of its
    /// cost: a slot's memory never moves, so its array is made once (through DLPack, the first time a frame of that
    /// slot is asked for as that library) and kept by the consumer, and each call hands out a new array object over
    /// it (``Tensor.detach()``, ``ndarray.view()``): what you do to your array's shape or flags in place never
    /// reaches the next frame.
    ///
    /// Streams as with ``from_dlpack``: the library's current stream (``torch.cuda.current_stream()``) is ordered
    /// after the stream the frame's wait was queued on (nothing to do when they are the same: pass your stream to
    /// ``next_frame``), and the frame's release waits for the work queued on it.
    ///
    /// The array is valid for this frame until the frame is released: afterwards it shows whatever the producer
    /// writes into the slot next (copy what you keep, ``tensor.clone()``), and the array of the slot's next frame
    /// is the same memory. Ask each frame for its own array: ``frame.array("torch")`` inside the loop, never one
    /// kept from an earlier frame. Raises ``ReleasedError`` once the frame is released or its consumer closed;
    /// ``ArgumentError`` for another library (JAX: its arrays are immutable; use ``jax.dlpack.from_dlpack(frame)``).
    ///
    /// Example::
    ///
    ///     for frame in consumer:
    ///         image = frame.array("torch")      # (height, width, channels) uint8 on cuda, the frame in place
    ///         total += image.float().mean()
    fn array(slf: &Bound<'_, Self>, library: &str) -> PyResult<Py<PyAny>> {
        let frame = slf.get();
        frame.usable()?;
        let consumer = frame.consumer.get();
        let ready = consumer.gpu.as_ref().map(|gpu| (gpu, frame.stream.unwrap_or(LEGACY_DEFAULT_STREAM)));
        slot_array(
            slf.as_any(),
            (&consumer.arrays, &consumer.order),
            library,
            SlotWord::Frame,
            frame.index,
            ready,
            |s| frame.taken_on(s),
        )
    }

    /// Device address of the frame's stamp word (gpu-stream-ops, gpu-poll; ``None`` otherwise): check it in your
    /// kernel before reading the frame (``(word & STAMP_MASK) == stamp_expected``, read with ld.acquire.sys); a dead
    /// producer's poison releases the stream's wait for a frame it never wrote. Raises ``ReleasedError`` once the
    /// frame is released or its consumer closed (the word is unregistered when the consumer closes).
    #[getter]
    fn stamp_ptr(&self) -> PyResult<Option<u64>> {
        self.view()?;
        Ok(self.stamp.map(|(ptr, _)| ptr))
    }

    /// The value the stamp word holds, under ``STAMP_MASK``, while the frame is the producer's: ``seq + 1``.
    #[getter]
    fn stamp_expected(&self) -> u64 {
        self.seq + 1
    }

    /// The frame's stamp word as a 0-d ``int64`` array, no copy, to check on the device (no host sync) that the
    /// frame is the producer's before using what was computed from it::
    ///
    ///     valid = (torch.from_dlpack(frame.stamp) & gpu_ipc.STAMP_MASK) == frame.stamp_expected
    ///
    /// (or ``frame.stamp.array("torch")``, the slot's word as a cached array, as ``Frame.array``). With
    /// gpu-stream-ops and gpu-poll the word is device-readable host memory (a CUDA tensor; ordered after the
    /// frame's wait like the frame); a dead producer's poison releases the stream's wait for a frame it never
    /// wrote, and ``valid`` is then false. With the CPU strategies, ipc-event and the host backend it is the same
    /// word read by the CPU (a CPU tensor, ``numpy.from_dlpack(frame.stamp)``): such a frame was seen published
    /// before it was handed out, and its stamp matches until its slot carries a later frame. Read the array before
    /// the frame is released (queue the comparison before ``release``): afterwards the word belongs to the next
    /// frame of the slot, and with a GPU-side strategy it is unregistered when the consumer closes. Raises
    /// ``ReleasedError`` once the frame is released or its consumer closed.
    #[getter]
    fn stamp(slf: &Bound<'_, Self>) -> PyResult<Stamp> {
        slf.get().usable()?;
        Ok(Stamp { frame: slf.clone().unbind() })
    }

    #[getter]
    fn released(&self) -> bool {
        lock(&self.token.frame).is_none()
    }

    /// ``consumer.release(self, stream)``.
    #[pyo3(signature = (stream=None))]
    fn release(&self, py: Python<'_>, stream: Option<&Bound<'_, PyAny>>) -> PyResult<()> {
        let raw = stream_handle(stream)?;
        self.release_here(py, raw)
    }

    fn __enter__(slf: Bound<'_, Self>) -> Bound<'_, Self> {
        slf
    }

    /// Releases the frame unless it was released already (or its consumer closed); the end of the stream found by
    /// the release (a frame queued past the end) is not an error here.
    #[pyo3(signature = (*_args))]
    fn __exit__(&self, py: Python<'_>, _args: &Bound<'_, PyTuple>) -> PyResult<bool> {
        if self.released() || self.consumer.get().closed() {
            return Ok(false);
        }
        match self.release_here(py, None) {
            Err(e) if e.is_instance_of::<EndOfStream>(py) => Ok(false),
            other => other.map(|()| false),
        }
    }

    fn __repr__(&self) -> String {
        format!(
            "Frame(seq={}, slot={}, nbytes={}{})",
            self.seq,
            self.index,
            self.nbytes,
            if self.released() { ", released" } else { "" }
        )
    }
}

/// A frame's stamp word, as an array (``Frame.stamp``): ``torch.from_dlpack(frame.stamp)``,
/// ``cupy.from_dlpack(frame.stamp)``, ``numpy.from_dlpack(frame.stamp)`` give a 0-d ``int64`` view of it, no copy
/// (``frame.stamp.array("torch")`` the same, cached per slot). ``(view & STAMP_MASK) == frame.stamp_expected`` says
/// whether the frame is the producer's.
#[pyclass(frozen, module = "gpu_ipc._gpu_ipc")]
pub struct Stamp {
    frame: Py<Frame>,
}

impl ArrayMemory for Stamp {
    fn layout(&self) -> &Layout {
        &STAMP_LAYOUT
    }

    fn view(&self) -> PyResult<View> {
        let frame = self.frame.get();
        let memory = frame.view()?.memory;
        Ok(match (memory, frame.stamp) {
            (memory @ Memory::Cuda { .. }, Some((device_ptr, _))) => {
                View { ptr: device_ptr, layout: STAMP_LAYOUT.clone(), memory }
            }
            _ => {
                let (control, offsets) = &frame.consumer.get().stamp_words;
                let offset = offsets.get(frame.index as usize).copied().ok_or_else(|| {
                    GpuIpcError::new_err(format!("frame {}: slot {} is not in the ring", frame.seq, frame.index))
                })?;
                let ptr = control.as_ptr() as u64 + offset as u64;
                View { ptr, layout: STAMP_LAYOUT.clone(), memory: Memory::Control(control.clone()) }
            }
        })
    }

    fn taken_on(&self, stream: u64) {
        self.frame.get().taken_on(stream);
    }
}

crate::array_protocols!(Stamp);

#[pymethods]
impl Stamp {
    /// ``frame.stamp_expected``: the value the word holds, under ``STAMP_MASK``, while the frame is the producer's.
    #[getter]
    fn expected(&self) -> u64 {
        self.frame.get().seq + 1
    }

    /// The word's address: a device address with gpu-stream-ops and gpu-poll (``Frame.stamp_ptr``), else a host
    /// address. Raises ``ReleasedError`` once the frame is released or its consumer closed.
    #[getter]
    fn ptr(&self) -> PyResult<u64> {
        self.view().map(|v| v.ptr)
    }

    /// The word as an array of ``library`` (``"torch"``, ``"cupy"``, ``"numpy"``), as ``Frame.array``: the slot's
    /// word is made an array once and handed out again, ordered on the library's current stream after the frame's
    /// wait. A CUDA tensor with gpu-stream-ops and gpu-poll, a CPU one otherwise (as ``from_dlpack(frame.stamp)``).
    /// Valid until the frame is released (then it is the slot's next frame's word). Raises ``ReleasedError`` once
    /// the frame is released or its consumer closed.
    ///
    /// Example::
    ///
    ///     valid = (frame.stamp.array("torch") & gpu_ipc.STAMP_MASK) == frame.stamp_expected  # a CUDA bool
    fn array(slf: &Bound<'_, Self>, library: &str) -> PyResult<Py<PyAny>> {
        let frame = slf.get().frame.get();
        frame.usable()?;
        let consumer = frame.consumer.get();
        // The word is a device address (a CUDA array, ordered like the frame) only with a GPU-side strategy.
        let ready = match (&consumer.gpu, frame.stamp) {
            (Some(gpu), Some(_)) => Some((gpu, frame.stream.unwrap_or(LEGACY_DEFAULT_STREAM))),
            _ => None,
        };
        slot_array(
            slf.as_any(),
            (&consumer.arrays, &consumer.order),
            library,
            SlotWord::Stamp,
            frame.index,
            ready,
            |s| frame.taken_on(s),
        )
    }

    fn __repr__(&self) -> String {
        format!("Stamp(seq={}, expected={})", self.frame.get().seq, self.frame.get().seq + 1)
    }
}
