//! `Frame.array(library)` and `Stamp.array(library)`: a frame (or its stamp word) as a PyTorch, CuPy or NumPy array
//! for the price of a lookup, where `torch.from_dlpack(frame)` builds a tensor from scratch every time.
//!
//! A slot's memory never moves: slot `i` is the same bytes at the same address for the consumer's whole life, and
//! so is its stamp word. So the array of slot `i` is made once per library, through DLPack (the first frame of that
//! slot asked for as that library goes through exactly `torch.from_dlpack(frame)`, stream order included), and
//! the consumer keeps it. Every later frame of the slot gets a new array object over it: the library's cheapest
//! alias (`torch.Tensor.detach`, `ndarray.view`), never the kept array itself, so what a caller does to its
//! array's metadata in place (`unsqueeze_`, `requires_grad_`, a new `shape`) never reaches the slot's next frame.
//!
//! What `from_dlpack` does per frame besides building the tensor is kept: the stream order. Torch's `from_dlpack`
//! passes its current stream to `__dlpack__(stream=)`, which orders that stream after the one the frame's wait was
//! queued on. Here the library's current stream is asked for directly (`torch._C._cuda_getCurrentRawStream`, the
//! C function PyTorch's own compiled code reads it with; the public `torch.cuda.current_stream` where it is
//! missing; `cupy.cuda.get_current_stream`); when it is not the frame's stream, one event of the consumer's is
//! recorded on the frame's stream and waited for on the current one, and the current stream is noted as a reader,
//! so the frame's release waits for the work queued there (as after `from_dlpack`). When it is the same stream,
//! nothing is queued at all.
//!
//! Lifetimes are those of any DLPack view: the kept array holds the ring's mapping (its capsule's hold), so an
//! alias kept past the frame's release, or the consumer's close, never points at unmapped memory; it shows whatever
//! the slot holds by then. The consumer drops its kept arrays when it closes.

use std::sync::{Arc, Mutex};

use pyo3::prelude::*;

use crate::errors::ArgumentError;
use crate::ring::{Gpu, lock};
use crate::stream::{LEGACY_DEFAULT_STREAM, same_stream, stream_handle};
use crate::view::StreamOrder;

/// An array library `Frame.array` hands frames out as.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Library {
    /// PyTorch: `torch.Tensor`.
    Torch,
    /// CuPy: `cupy.ndarray`.
    Cupy,
    /// NumPy (host memory): `numpy.ndarray`.
    Numpy,
}

impl Library {
    /// Parses `library=`.
    pub fn parse(name: &str) -> PyResult<Self> {
        match name {
            "torch" => Ok(Self::Torch),
            "cupy" => Ok(Self::Cupy),
            "numpy" => Ok(Self::Numpy),
            "jax" => Err(ArgumentError::new_err(
                "array(\"jax\") is not offered: JAX arrays are immutable, and a cached one would change under JAX; \
                 use jax.dlpack.from_dlpack(frame)",
            )),
            other => Err(ArgumentError::new_err(format!(
                "unknown array library {other:?}: use \"torch\", \"cupy\" or \"numpy\" (any other library: its \
                 from_dlpack(frame))"
            ))),
        }
    }
}

/// Which memory of a slot: the frame itself, or its stamp word.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SlotWord {
    /// The slot's bytes (`Frame.array`).
    Frame,
    /// The slot's stamp word (`Stamp.array`).
    Stamp,
}

/// How a library's current stream is read.
enum CurrentStream {
    /// NumPy: host arrays, no stream.
    None,
    /// `f(device) -> int | stream object`: `torch._C._cuda_getCurrentRawStream` (the raw `cudaStream_t`, 0 for the
    /// legacy default stream), else `torch.cuda.current_stream`.
    OfDevice(Py<PyAny>),
    /// `f() -> stream object` of the current device: `cupy.cuda.get_current_stream`.
    OfCurrentDevice(Py<PyAny>),
}

/// What a library's arrays are made, aliased and ordered with: looked up once per consumer and library.
struct Glue {
    /// `torch.from_dlpack`, `cupy.from_dlpack`, `numpy.from_dlpack`.
    from_dlpack: Py<PyAny>,
    /// A new array object over the same memory: `torch.Tensor.detach`, `cupy.ndarray.view`, `numpy.ndarray.view`.
    alias: Py<PyAny>,
    /// The library's current stream.
    current_stream: CurrentStream,
}

impl Glue {
    fn of(py: Python<'_>, library: Library) -> PyResult<Self> {
        Ok(match library {
            Library::Torch => {
                let torch = py.import("torch")?;
                let current = match torch.getattr("_C").and_then(|c| c.getattr("_cuda_getCurrentRawStream")) {
                    Ok(raw) => raw,
                    Err(_) => torch.getattr("cuda")?.getattr("current_stream")?,
                };
                Self {
                    from_dlpack: torch.getattr("from_dlpack")?.unbind(),
                    alias: torch.getattr("Tensor")?.getattr("detach")?.unbind(),
                    current_stream: CurrentStream::OfDevice(current.unbind()),
                }
            }
            Library::Cupy => {
                let cupy = py.import("cupy")?;
                Self {
                    from_dlpack: cupy.getattr("from_dlpack")?.unbind(),
                    alias: cupy.getattr("ndarray")?.getattr("view")?.unbind(),
                    current_stream: CurrentStream::OfCurrentDevice(
                        cupy.getattr("cuda")?.getattr("get_current_stream")?.unbind(),
                    ),
                }
            }
            Library::Numpy => {
                let numpy = py.import("numpy")?;
                Self {
                    from_dlpack: numpy.getattr("from_dlpack")?.unbind(),
                    alias: numpy.getattr("ndarray")?.getattr("view")?.unbind(),
                    current_stream: CurrentStream::None,
                }
            }
        })
    }

    /// The library's current stream on device `ordinal` (`None`: the library has none).
    fn current_stream(&self, py: Python<'_>, ordinal: i32) -> PyResult<Option<u64>> {
        let handle = match &self.current_stream {
            CurrentStream::None => return Ok(None),
            CurrentStream::OfDevice(f) => f.bind(py).call1((ordinal,))?,
            CurrentStream::OfCurrentDevice(f) => f.bind(py).call0()?,
        };
        Ok(Some(stream_handle(Some(&handle))?.unwrap_or(LEGACY_DEFAULT_STREAM)))
    }
}

/// One library's arrays of a consumer's slots and of their stamp words, made at first use.
struct Kept {
    library: Library,
    glue: Arc<Glue>,
    frames: Vec<Option<Py<PyAny>>>,
    stamps: Vec<Option<Py<PyAny>>>,
}

impl Kept {
    fn of(&mut self, word: SlotWord) -> &mut Vec<Option<Py<PyAny>>> {
        match word {
            SlotWord::Frame => &mut self.frames,
            SlotWord::Stamp => &mut self.stamps,
        }
    }
}

/// A consumer's arrays of its slots, per library (`Frame.array`): made once each, dropped at close.
///
/// The lock is never held while Python runs (a library call may let another thread take the GIL, and that thread
/// may want the lock): what a call needs is cloned out first.
pub struct SlotArrays {
    slots: usize,
    kept: Mutex<Vec<Kept>>,
}

impl SlotArrays {
    /// No arrays yet, for a ring of `slots` slots.
    pub fn new(slots: u32) -> Self {
        Self { slots: slots as usize, kept: Mutex::new(Vec::new()) }
    }

    /// `library`'s glue (looked up at its first use) and slot `index`'s array of `word`, if made already.
    fn lookup(
        &self,
        py: Python<'_>,
        library: Library,
        word: SlotWord,
        index: u32,
    ) -> PyResult<(Arc<Glue>, Option<Py<PyAny>>)> {
        {
            let mut kept = lock(&self.kept);
            if let Some(k) = kept.iter_mut().find(|k| k.library == library) {
                let made = k.of(word).get(index as usize).and_then(|a| a.as_ref().map(|a| a.clone_ref(py)));
                return Ok((k.glue.clone(), made));
            }
        }
        let glue = Arc::new(Glue::of(py, library)?);
        let mut kept = lock(&self.kept);
        // Another thread may have looked it up meanwhile: one entry per library, the first one stays.
        if let Some(k) = kept.iter().find(|k| k.library == library) {
            return Ok((k.glue.clone(), None));
        }
        kept.push(Kept {
            library,
            glue: glue.clone(),
            frames: (0..self.slots).map(|_| None).collect(),
            stamps: (0..self.slots).map(|_| None).collect(),
        });
        Ok((glue, None))
    }

    /// Keeps `array` as slot `index`'s array of `word` for `library` (unless another thread kept one first).
    fn keep(&self, library: Library, word: SlotWord, index: u32, array: Py<PyAny>) {
        let mut kept = lock(&self.kept);
        if let Some(k) = kept.iter_mut().find(|k| k.library == library)
            && let Some(slot @ None) = k.of(word).get_mut(index as usize)
        {
            *slot = Some(array);
        }
    }

    /// Drops every kept array (the consumer closed). Arrays handed out keep the memory mapped themselves.
    pub fn clear(&self) {
        let dropped = std::mem::take(&mut *lock(&self.kept));
        drop(dropped);
    }
}

/// `Frame.array` and `Stamp.array`: slot `index`'s array of `word` as `library`, a new alias of the array kept for
/// the slot; the first time, made from `owner` (the `Frame` or `Stamp`) through the library's `from_dlpack`.
/// `ready`: the device and the stream the memory is ready on (GPU memory); the library's current stream is ordered
/// after it and passed to `taken_on` (the frame's release then waits for its work too).
pub fn slot_array(
    owner: &Bound<'_, PyAny>,
    (arrays, order): (&SlotArrays, &StreamOrder),
    library: &str,
    word: SlotWord,
    index: u32,
    ready: Option<(&Gpu, u64)>,
    taken_on: impl FnOnce(u64),
) -> PyResult<Py<PyAny>> {
    let py = owner.py();
    let library = Library::parse(library)?;
    let (glue, made) = arrays.lookup(py, library, word, index)?;
    let array = match made {
        Some(array) => {
            if let Some((gpu, ready_on)) = ready
                && let Some(current) = glue.current_stream(py, gpu.ordinal)?
                && !same_stream(ready_on, current)
            {
                order.after(&gpu.ctx, ready_on, current)?;
                taken_on(current);
            }
            array
        }
        None => {
            // Exactly `library.from_dlpack(owner)`: its `__dlpack__(stream=)` orders the library's current stream
            // after the frame's and notes it as a reader.
            let array = glue.from_dlpack.bind(py).call1((owner,))?.unbind();
            arrays.keep(library, word, index, array.clone_ref(py));
            array
        }
    };
    Ok(glue.alias.bind(py).call1((array,))?.unbind())
}
