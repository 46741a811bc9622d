//! `gpu_ipc.testing.Pattern`: the frame pattern of the Rust example programs (`kernels/src/pattern.rs`), written
//! into a slot and checked in a frame by the crate's own embedded kernels on the caller's stream, or on the CPU
//! with the host backend. A Python end of a ring can then be tested against a Rust one word for word, and its
//! speed compared with the Rust consumer's with the same GPU work per frame.

use std::sync::Mutex;

use gpu_ipc::driver::{Context, Device, DeviceBuffer, DeviceMemory, DevicePtr, DeviceSpan, Stream};
use gpu_ipc::host::HostRegion;
use gpu_ipc::kernels::launch::{KernelError, PatternKernels};
use gpu_ipc::kernels::pattern::pattern_word;
use pyo3::prelude::*;

use crate::errors::{ArgumentError, ArgumentTypeError, DriverError, driver_to_py};
use crate::frame::Frame;
use crate::pool::SharedBuffer;
use crate::pool_import::BufferView;
use crate::producer::Slot;
use crate::ring::lock;
use crate::stream::{borrow, stream_handle};
use crate::view::{ArrayMemory, Memory, View, order_after};

/// Most per-frame counters a `Pattern` keeps (8 MiB of them).
const MAX_FRAME_COUNTERS: u64 = 1 << 20;

/// The kernels and the mismatch counters of the device first used.
struct OnDevice {
    ordinal: i32,
    ctx: Context,
    kernels: PatternKernels,
    /// One `u64` per counter: mismatched words counted by the verify kernels since the last `reset`.
    counters: DeviceBuffer,
}

/// The pattern every frame of the Rust example programs carries (``gpu_ipc.testing.Pattern``): word ``i`` of
/// frame ``seq`` is ``mix(i * 0x9E3779B1 ^ seq * 0x85EBCA6B ^ 0xA5A5A5A5)`` (32-bit products),
/// ``mix(x) = x ^ (x >> 16)``.
///
/// ``fill`` writes it into a slot, ``verify`` checks a frame against it: on a GPU with the kernels the Rust
/// ``producer`` and ``consumer`` launch (embedded in the package: no CUDA toolkit, no compiler), queued on
/// ``stream`` (default: the stream the slot or frame is ready on) with no CPU synchronisation; with the host
/// backend on the CPU. ``mismatches()`` waits for the device and returns the mismatched words counted so far.
/// ``frames``: keep one counter per sequence below it (so that ``mismatches(below=n)`` leaves out frames queued
/// past the end of a stream), instead of one for every frame.
///
/// A frame or slot is covered whole, as the Rust programs cover it: its ``nbytes``, rows padded to the pitch
/// included (a 33x7 ``rgb8`` frame is 7 rows of 100 bytes, 700 bytes, 175 words). Where the length is not a whole
/// number of words (a tensor ring of odd size), the host backend writes the bytes past the last whole word as zeros
/// and does not check them; the GPU kernels refuse such a length.
///
/// Example::
///
///     check = gpu_ipc.testing.Pattern()
///     with gpu_ipc.Consumer(sock) as consumer:
///         for frame in consumer:
///             check.verify(frame)           # frame.seq's pattern, on frame.stream
///     assert check.mismatches() == 0
#[pyclass(frozen, module = "gpu_ipc._gpu_ipc")]
pub struct Pattern {
    device: Mutex<Option<OnDevice>>,
    /// Mismatched words counted on the CPU (host backend).
    host_mismatches: Mutex<Vec<u64>>,
    /// One counter for every frame (`None`), or one per sequence below this many.
    frames: Option<u64>,
}

/// What `fill` and `verify` act on: a frame, a slot or a pool buffer of this package.
enum Target<'py> {
    Frame(Bound<'py, Frame>),
    Slot(Bound<'py, Slot>),
    Shared(Bound<'py, SharedBuffer>),
    Imported(Bound<'py, BufferView>),
}

impl<'py> Target<'py> {
    fn of(obj: &Bound<'py, PyAny>) -> PyResult<Self> {
        if let Ok(frame) = obj.cast::<Frame>() {
            return Ok(Self::Frame(frame.clone()));
        }
        if let Ok(slot) = obj.cast::<Slot>() {
            return Ok(Self::Slot(slot.clone()));
        }
        if let Ok(buffer) = obj.cast::<SharedBuffer>() {
            return Ok(Self::Shared(buffer.clone()));
        }
        if let Ok(view) = obj.cast::<BufferView>() {
            return Ok(Self::Imported(view.clone()));
        }
        Err(ArgumentTypeError::new_err(format!(
            "Pattern works on a gpu_ipc Frame, Slot, SharedBuffer or BufferView, not {}",
            obj.get_type().name()?
        )))
    }

    fn memory(&self) -> &dyn ArrayMemory {
        match self {
            Self::Frame(frame) => frame.get(),
            Self::Slot(slot) => slot.get(),
            Self::Shared(buffer) => buffer.get(),
            Self::Imported(view) => view.get(),
        }
    }

    /// A frame's or slot's own sequence.
    fn own_seq(&self) -> Option<u64> {
        match self {
            Self::Frame(frame) => Some(frame.get().seq()),
            Self::Slot(slot) => Some(slot.get().seq()),
            Self::Shared(_) | Self::Imported(_) => None,
        }
    }

    /// The bytes the pattern covers, as the Rust example programs count them: a frame's or slot's whole size (a
    /// pixel frame's rows padded to the pitch included, `pitch * height`), a pool buffer's tensor.
    fn pattern_bytes(&self, view: &View) -> u64 {
        match self {
            Self::Frame(frame) => frame.get().nbytes(),
            Self::Slot(slot) => slot.get().nbytes(),
            Self::Shared(_) | Self::Imported(_) => view.layout.span_bytes,
        }
    }

    /// The sequence whose pattern to use: the one given, else a frame's or slot's own.
    fn seq(&self, given: Option<u64>) -> PyResult<u64> {
        given.or(self.own_seq()).ok_or_else(|| ArgumentError::new_err("a pool buffer has no sequence: pass seq="))
    }
}

fn kernel_to_py(e: KernelError) -> PyErr {
    match e {
        KernelError::Driver(e) => driver_to_py(e),
        KernelError::UnalignedSize { .. } => ArgumentError::new_err(e.to_string()),
        other => DriverError::new_err(other.to_string()),
    }
}

impl Pattern {
    /// How many counters: one per frame, or one for all.
    fn counter_count(&self) -> usize {
        self.frames.map_or(1, |n| n as usize)
    }

    /// The counter frame `seq`'s mismatches go to.
    fn counter_index(&self, seq: u64) -> PyResult<usize> {
        match self.frames {
            None => Ok(0),
            Some(n) if seq < n => Ok(seq as usize),
            Some(n) => Err(ArgumentError::new_err(format!(
                "frame {seq}: this Pattern counts frames 0 to {} (Pattern(frames={n}))",
                n - 1
            ))),
        }
    }

    /// Runs `f` with the kernels of `ordinal`'s device (loaded on first use).
    fn with_device<T>(&self, ctx: &Context, ordinal: i32, f: impl FnOnce(&OnDevice) -> PyResult<T>) -> PyResult<T> {
        let mut device = lock(&self.device);
        if device.is_none() {
            let kernels = PatternKernels::load(ctx).map_err(kernel_to_py)?;
            let zeros = vec![0u64; self.counter_count()];
            let counters = DeviceBuffer::alloc(ctx, 8 * zeros.len() as u64).map_err(driver_to_py)?;
            counters.write(0, &zeros).map_err(driver_to_py)?;
            *device = Some(OnDevice { ordinal, ctx: ctx.clone(), kernels, counters });
        }
        let Some(on) = device.as_ref() else { return Err(DriverError::new_err("the pattern kernels did not load")) };
        if on.ordinal != ordinal {
            return Err(ArgumentError::new_err(format!(
                "this Pattern counts on device {}; use another Pattern for device {ordinal}",
                on.ordinal
            )));
        }
        f(on)
    }

    /// Queues `launch` on the stream asked for (default: the one the memory is ready on), ordered after the memory's
    /// own stream, and the target's release or publish after it.
    fn on_gpu(
        &self,
        target: &Target<'_>,
        view: View,
        stream: Option<u64>,
        launch: impl FnOnce(&OnDevice, &Stream, DeviceSpan<'_>) -> Result<(), KernelError>,
    ) -> PyResult<()> {
        let (ctx, ordinal, ready) = match &view.memory {
            Memory::Cuda { ctx, ordinal, stream, .. } => (ctx.clone(), *ordinal, Some(*stream)),
            Memory::Pool { ordinal: Some(ordinal), .. } => (
                Context::keeping_current(Device::get(*ordinal).map_err(driver_to_py)?).map_err(driver_to_py)?,
                *ordinal,
                None,
            ),
            Memory::Host(_) | Memory::Pool { ordinal: None, .. } | Memory::Control(_) => {
                return Err(ArgumentError::new_err(
                    "Pattern checks frames and slots of the host backend, not its pool buffers: read those with numpy.from_dlpack",
                ));
            }
        };
        let bytes = target.pattern_bytes(&view);
        let Some(raw) = stream.or(ready) else {
            return Err(ArgumentError::new_err("a pool buffer has no stream of its own: pass stream="));
        };
        if let Some(ready) = ready
            && ready != raw
        {
            order_after(&ctx, ready, raw)?;
            target.memory().taken_on(raw);
        }
        self.with_device(&ctx, ordinal, |on| {
            #[allow(unsafe_code)]
            // SAFETY: `view` was just taken from a live frame, slot or buffer of this package (its `view()` raises
            // once released, closed or freed), whose memory is device memory of `ordinal`'s device, at least `bytes`
            // long (a frame's or slot's `nbytes` is its slot's frame size; a pool buffer's is its tensor's span),
            // that no Rust reference covers; the mapping outlives the queued kernel: the last hold on a mapping
            // unmaps only after `cuCtxSynchronize` (`crate::mapping`).
            let span = unsafe { DeviceSpan::from_raw_parts(DevicePtr(view.ptr), bytes) };
            launch(on, &borrow(&on.ctx, raw), span).map_err(kernel_to_py)
        })
    }

    /// What `fill` and `verify` start from: the target, the sequence whose pattern to use, its memory now, and the
    /// stream asked for.
    fn prepare<'py>(
        target: &Bound<'py, PyAny>,
        seq: Option<u64>,
        stream: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<(Target<'py>, u64, View, Option<u64>)> {
        let raw = stream_handle(stream)?;
        let target = Target::of(target)?;
        let seq = target.seq(seq)?;
        let view = target.memory().view()?;
        Ok((target, seq, view, raw))
    }

    /// The host memory of `view` (host backend) and the bytes the pattern covers there, or `None` for device memory.
    fn host(target: &Target<'_>, view: &View) -> PyResult<Option<(HostRegion, usize)>> {
        match &view.memory {
            Memory::Host(region) => {
                let bytes = usize::try_from(target.pattern_bytes(view))
                    .map_err(|_| ArgumentError::new_err("too large for this machine"))?;
                Ok(Some((region.clone(), bytes)))
            }
            _ => Ok(None),
        }
    }
}

#[pymethods]
impl Pattern {
    #[new]
    #[pyo3(signature = (frames=None))]
    fn new(frames: Option<u64>) -> PyResult<Self> {
        if frames == Some(0) || frames.is_some_and(|n| n > MAX_FRAME_COUNTERS) {
            return Err(ArgumentError::new_err(format!(
                "frames is the number of per-frame counters, 1 to {MAX_FRAME_COUNTERS} (or None: one for all)"
            )));
        }
        let this = Self { device: Mutex::new(None), host_mismatches: Mutex::new(Vec::new()), frames };
        *lock(&this.host_mismatches) = vec![0; this.counter_count()];
        Ok(this)
    }

    /// Word ``index`` of frame ``seq``'s pattern.
    #[staticmethod]
    fn word(seq: u64, index: u64) -> u32 {
        pattern_word(seq, index)
    }

    /// Writes frame ``seq``'s pattern (default: the slot's own sequence) into every word of ``target`` (a
    /// ``Slot``, or a pool buffer), queued on ``stream`` (default: the stream the slot is ready on; another stream
    /// is ordered after it, and the publish after that stream).
    #[pyo3(signature = (target, seq=None, *, stream=None))]
    fn fill(
        &self,
        py: Python<'_>,
        target: &Bound<'_, PyAny>,
        seq: Option<u64>,
        stream: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<()> {
        let (target, seq, view, raw) = Self::prepare(target, seq, stream)?;
        if let Some((region, n)) = Self::host(&target, &view)? {
            // As the Rust programs' host side: the whole words, then zeros to the end (a length not a multiple of 4).
            let mut bytes: Vec<u8> = (0..(n / 4) as u64).flat_map(|i| pattern_word(seq, i).to_le_bytes()).collect();
            bytes.resize(n, 0);
            return py
                .detach(|| region.write(DevicePtr(view.ptr), &bytes))
                .map_err(|e| crate::errors::BackendError::new_err(e.to_string()));
        }
        self.on_gpu(&target, view, raw, |on, stream, span| on.kernels.fill(stream, span, seq))
    }

    /// Checks every word of ``target`` (a ``Frame``, or a pool buffer) against frame ``seq``'s pattern (default:
    /// the frame's own sequence) and adds the mismatched words to this object's count: queued on ``stream``
    /// (default: the stream the frame is ready on; another stream is ordered after it, and the release after that
    /// stream), no CPU synchronisation. Read the count with ``mismatches()``.
    #[pyo3(signature = (target, seq=None, *, stream=None))]
    fn verify(
        &self,
        py: Python<'_>,
        target: &Bound<'_, PyAny>,
        seq: Option<u64>,
        stream: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<()> {
        let (target, seq, view, raw) = Self::prepare(target, seq, stream)?;
        let index = self.counter_index(target.own_seq().unwrap_or(seq))?;
        if let Some((region, n)) = Self::host(&target, &view)? {
            // The whole words only, as the Rust programs' host side checks them.
            let mut bytes = vec![0u8; n];
            let ptr = DevicePtr(view.ptr);
            py.detach(|| region.read(ptr, &mut bytes))
                .map_err(|e| crate::errors::BackendError::new_err(e.to_string()))?;
            let bad = bytes
                .chunks_exact(4)
                .zip(0u64..)
                .filter(|(w, i)| u32::from_le_bytes([w[0], w[1], w[2], w[3]]) != pattern_word(seq, *i))
                .count();
            lock(&self.host_mismatches)[index] += bad as u64;
            return Ok(());
        }
        self.on_gpu(&target, view, raw, |on, stream, span| {
            on.kernels.verify(stream, span, seq, on.counters.span().slice(8 * index as u64, 8)?)
        })
    }

    /// The mismatched words ``verify`` counted since the last ``reset()`` (with per-frame counters: those of the
    /// frames with a sequence below ``below``, default all): waits for the device's queued work
    /// (``cuCtxSynchronize``) first.
    #[pyo3(signature = (below=None))]
    fn mismatches(&self, py: Python<'_>, below: Option<u64>) -> PyResult<u64> {
        let mut counts = lock(&self.host_mismatches).clone();
        if let Some(on) = lock(&self.device).as_ref() {
            let mut device = vec![0u64; counts.len()];
            py.detach(|| on.ctx.synchronize().and_then(|()| on.counters.read(0, &mut device))).map_err(driver_to_py)?;
            counts.iter_mut().zip(device).for_each(|(count, more)| *count += more);
        }
        let counted = match (self.frames, below) {
            (Some(_), Some(below)) => usize::try_from(below).unwrap_or(usize::MAX).min(counts.len()),
            _ => counts.len(),
        };
        Ok(counts[..counted].iter().sum())
    }

    /// Sets the counts back to 0 (after waiting for the device).
    fn reset(&self, py: Python<'_>) -> PyResult<()> {
        lock(&self.host_mismatches).iter_mut().for_each(|count| *count = 0);
        if let Some(on) = lock(&self.device).as_ref() {
            let zeros = vec![0u64; self.counter_count()];
            py.detach(|| on.ctx.synchronize().and_then(|()| on.counters.write(0, &zeros))).map_err(driver_to_py)?;
        }
        Ok(())
    }

    fn __repr__(&self) -> String {
        match lock(&self.device).as_ref() {
            Some(on) => format!("Pattern(device={}, image={})", on.ordinal, on.kernels.image()),
            None => "Pattern()".to_owned(),
        }
    }
}
