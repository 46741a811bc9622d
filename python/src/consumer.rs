//! `gpu_ipc.Consumer`: the consuming end of a ring (its frames, `gpu_ipc.Frame`, are in `crate::frame`; their
//! cached arrays in `crate::slot_arrays`).

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError, channel};
use std::sync::{Arc, Mutex, TryLockError};
use std::time::{Duration, Instant};

use gpu_ipc::BackendKind;
use gpu_ipc::core::frames::{AttachOptions, Consumer as CoreConsumer, FrameError};
use gpu_ipc::core::ring::SlotIndex;
use gpu_ipc::core::shm::SharedMemory;
use gpu_ipc::core::wire::{SyncStrategy, WireError};
use gpu_ipc::host::{Host, HostContext, HostRegion};
use gpu_ipc::legacy::Legacy;
use gpu_ipc::vmm::Vmm;
use pyo3::exceptions::{PyKeyboardInterrupt, PySystemExit};
use pyo3::prelude::*;
use pyo3::types::{PyTuple, PyType};

use crate::each_backend;
use crate::errors::{EndOfStream, ForeignToken, GpuIpcError, ReleasedError, to_py};
use crate::frame::{Frame, FrameToken, Token};
use crate::mapping::MappingHold;
use crate::ring::{
    Gpu, Held, PerBackend, SLICE, SlicedError, check_signals, interrupted, lock, parse_backend, seconds,
    wait_in_slices, waits_in_slices, waits_on_cpu,
};
use crate::slot_arrays::SlotArrays;
use crate::stream::{LEGACY_DEFAULT_STREAM, stream_handle};
use crate::view::{Layout, StreamOrder};

type End = PerBackend<CoreConsumer<Legacy>, CoreConsumer<Vmm>, CoreConsumer<Host>>;

/// The consuming end of a frame ring: attaches once, then reads frames in place, in order.
///
/// ``wait_for_producer``: seconds to wait for the producer's socket to appear (default 0: fail at once with
/// ``NoProducer``). ``timeout``: bound on the handshake, and on each frame's wait when iterating.
///
/// Example::
///
///     with gpu_ipc.Consumer("/tmp/frames.sock", backend="host", wait_for_producer=10) as consumer:
///         for frame in consumer:                 # stops cleanly at the end of the stream
///             image = numpy.from_dlpack(frame)   # (height, width, channels), no copy
///             print(frame.seq, image[0, 0])
///             # the frame is released when the next one is asked for
///
///     # or by hand:
///     with consumer.next_frame(timeout=1.0) as frame:
///         use(torch.from_dlpack(frame))
///     # released here
#[pyclass(frozen, module = "gpu_ipc._gpu_ipc")]
pub struct Consumer {
    end: Mutex<Held<End>>,
    closed: AtomicBool,
    /// The process that made it (see `Drop`).
    pid: u32,
    /// The device (GPU backends).
    pub(crate) gpu: Option<Gpu>,
    /// The ring's memory (host backend).
    pub(crate) host: Option<HostRegion>,
    /// The GPU backends' hold on the ring's mapping, which every frame shares (see `crate::mapping`); dropped at
    /// close, before the core's consumer, so that the core's teardown unmaps unless a tensor still holds it.
    mapping: Mutex<Option<Arc<MappingHold>>>,
    backend: BackendKind,
    sync: SyncStrategy,
    /// What each slot is as an array.
    pub(crate) layout: Layout,
    nbytes: u64,
    slots: u32,
    socket: PathBuf,
    timeout: Duration,
    /// The frame iteration handed out last, and its stream: released when the next one is asked for.
    iterated: Mutex<Option<(Token, Option<u64>)>>,
    /// The `EndOfStream` this consumer raised (or that stopped its iteration), for `end`.
    end_of_stream: Mutex<Option<Py<PyAny>>>,
    /// The ring's control block in host memory and the offset there of each slot's `published` word (its frame's
    /// stamp, whatever the strategy): what `Frame.stamp` reads on the CPU.
    pub(crate) stamp_words: (Arc<SharedMemory>, Vec<usize>),
    /// Each slot's array per library, made once (`Frame.array`).
    pub(crate) arrays: SlotArrays,
    /// Orders one stream after another (`Frame.array`, a release after the streams that took the frame).
    pub(crate) order: StreamOrder,
}

impl Consumer {
    /// Whether the end is still open (and this process's).
    fn open_end(&self, py: Python<'_>) -> PyResult<()> {
        self.on_held(py, |held| held.get("consumer").map(|_| ()))
    }

    /// Runs `f` on the held end: with the GIL held when the lock is free (`f` must not wait: a check, a release),
    /// else with the GIL released while the lock is taken, since another thread may hold it for a whole call of the
    /// core (its wait for a frame). Releasing and taking back the GIL around a call of a microsecond was most of
    /// such a call's cost.
    fn on_held<T: Send>(&self, py: Python<'_>, f: impl FnOnce(&mut Held<End>) -> PyResult<T> + Send) -> PyResult<T> {
        match self.end.try_lock() {
            Ok(mut held) => f(&mut held),
            Err(TryLockError::Poisoned(poisoned)) => f(&mut poisoned.into_inner()),
            Err(TryLockError::WouldBlock) => py.detach(|| f(&mut lock(&self.end))),
        }
    }

    /// `f(end)` with the GIL held, at once, when the end's lock is free and the end open; `None` otherwise (the
    /// caller goes the usual way, which says why). For calls that return at once: `f` is given no time to wait.
    fn now<T>(&self, f: impl FnOnce(&mut End) -> Result<T, FrameError>) -> Option<Result<T, FrameError>> {
        let mut held = match self.end.try_lock() {
            Ok(held) => held,
            Err(TryLockError::Poisoned(poisoned)) => poisoned.into_inner(),
            Err(TryLockError::WouldBlock) => return None,
        };
        held.get("consumer").ok().map(f)
    }

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
            match held.get("consumer") {
                Ok(end) => f(end, t),
                Err(_) => Err(FrameError::Config("the consumer was closed by another thread".into())),
            }
        })
    }

    fn take_end(&self, py: Python<'_>) -> PyResult<Option<End>> {
        let end = py.detach(|| lock(&self.end).take("consumer"))?;
        self.closed.store(true, Ordering::Release);
        lock(&self.iterated).take();
        self.arrays.clear();
        lock(&self.mapping).take();
        Ok(end)
    }

    /// Tears the core's end down (`detach`: saying `Detach` to the producer). A GPU-side strategy's teardown waits
    /// (up to `AttachOptions::gpu_timeout`, 10 s) for the stream to pass the waits it queued on the ring, which a
    /// quiet producer may never satisfy: it runs on a thread of its own, and the caller waits for it at most
    /// `wait` (`None`: not at all: from `Drop`, or leaving a `with` block on Ctrl-C; nor once Ctrl-C was seen in
    /// one of the package's waits), so that neither `close()`, the end of a `with` block, nor the process's exit
    /// blocks on the GPU. A process that exits meanwhile leaves the ring as a killed one does: the producer sees the
    /// hang-up and counts the consumer gone.
    fn tear_down(&self, py: Option<Python<'_>>, end: End, detach: bool, wait: Option<Duration>) -> PyResult<()> {
        let finish = move || each_backend!(end, c => if detach { c.detach() } else { drop(c) });
        if waits_on_cpu(self.sync) {
            // No GPU-side wait to settle (CPU strategies, ipc-event, the host backend): at once.
            match py {
                Some(py) => py.detach(finish),
                None => finish(),
            }
            return Ok(());
        }
        let (Some(py), Some(wait), Some(mut finished)) = (py, wait, spawn_teardown(finish)) else { return Ok(()) };
        let deadline = Instant::now() + wait;
        while !interrupted() {
            let left = deadline.saturating_duration_since(Instant::now());
            // The receiver travels into the GIL-free closure and back (it is `Send`, not `Sync`).
            let (back, outcome) = py.detach(move || {
                let outcome = finished.recv_timeout(left.min(SLICE));
                (finished, outcome)
            });
            finished = back;
            match outcome {
                Err(RecvTimeoutError::Timeout) if !left.is_zero() => check_signals(py)?,
                Err(RecvTimeoutError::Timeout) => {
                    tracing::debug!(
                        "consumer teardown: the stream still waits on the ring; finishing in the background"
                    );
                    break;
                }
                Ok(()) | Err(RecvTimeoutError::Disconnected) => break,
            }
        }
        Ok(())
    }

    /// `detach` (saying so to the producer) or `close`, waiting at most `wait` for a GPU-side strategy's teardown.
    /// Keeps `e` for `end` when it is the end of the stream.
    fn note_end(&self, py: Python<'_>, e: &PyErr) {
        if e.is_instance_of::<EndOfStream>(py) {
            *lock(&self.end_of_stream) = Some(e.value(py).clone().into_any().unbind());
        }
    }

    fn leave(&self, py: Python<'_>, detach: bool, wait: Option<Duration>) -> PyResult<()> {
        match self.take_end(py)? {
            Some(end) => self.tear_down(Some(py), end, detach, wait),
            None => Ok(()),
        }
    }

    fn next(slf: &Bound<'_, Self>, timeout: Duration, raw: Option<u64>) -> PyResult<Frame> {
        let this = slf.get();
        let py = slf.py();
        let gpu = this.gpu.as_ref();
        let sliced = waits_in_slices(this.sync);
        // A frame published already is taken at once, with the GIL held; a wait (a timeout of this attempt, which a
        // strategy whose waits may be sliced leaves without a trace) goes the usual way, in slices without the GIL.
        let at_once = if sliced {
            this.now(|end| {
                let s = gpu.map(|g| g.stream(raw));
                each_backend!(end, c => c.next_frame(s.as_deref(), Duration::ZERO))
            })
        } else {
            None
        };
        let frame = match at_once {
            Some(Ok(frame)) => frame,
            Some(Err(e)) if !e.is_timeout() => return Err(to_py(e)),
            _ => this.with_end(py, timeout, sliced, |end, t| {
                let s = gpu.map(|g| g.stream(raw));
                each_backend!(end, c => c.next_frame(s.as_deref(), t))
            })?,
        };
        // A signal that came while the frame was being taken (in the slice that found it): never hand the frame
        // out then, or Ctrl-C would leave it taken and never released. It goes back unread (its sequence number is
        // skipped) and the handler's exception is raised.
        if let Err(interrupt) = check_signals(py) {
            let mut frame = Some(frame);
            let gave_back = this.with_end(py, Duration::ZERO, false, |end, _| {
                let s = gpu.map(|g| g.stream(raw));
                let frame = frame.take().ok_or_else(|| FrameError::Config("release ran twice".into()))?;
                each_backend!(end, c => c.release(frame, s.as_deref()))
            });
            if let Err(error) = gave_back {
                tracing::debug!(%error, "giving back a frame taken during an interrupt");
            }
            return Err(interrupt);
        }
        Ok(Frame {
            seq: frame.seq().0,
            index: frame.slot().0,
            ptr: frame.ptr().0,
            nbytes: frame.bytes(),
            stream: gpu.map(|_| raw.unwrap_or(LEGACY_DEFAULT_STREAM)),
            stamp: frame.stamp().map(|stamp| (stamp.device_ptr.raw(), stamp.expected)),
            hold: lock(&this.mapping).clone(),
            token: FrameToken::new(frame),
            consumer: slf.clone().unbind(),
        })
    }

    /// Gives `token`'s frame back on stream `raw`.
    pub(crate) fn release_token(&self, py: Python<'_>, token: &Token, seq: u64, raw: Option<u64>) -> PyResult<()> {
        let gpu = self.gpu.as_ref();
        // A release does not wait: with the GIL held unless another thread holds the end.
        self.on_held(py, |held| {
            let end = held.get("consumer")?;
            // Before the frame is taken: an error here leaves it to release again.
            if let Some(gpu) = gpu {
                let release_stream = raw.unwrap_or(LEGACY_DEFAULT_STREAM);
                let mut readers = lock(&token.readers);
                for &reader in readers.iter() {
                    self.order.after(&gpu.ctx, reader, release_stream)?;
                }
                readers.clear();
            }
            let Some(frame) = lock(&token.frame).take() else {
                return Err(ReleasedError::new_err(format!("frame {seq} was released already")));
            };
            let s = gpu.map(|g| g.stream(raw));
            each_backend!(end, c => c.release(frame, s.as_deref())).map_err(to_py)
        })
    }

    /// Releases the frame iteration handed out last, if the caller did not.
    fn release_iterated(&self, py: Python<'_>) -> PyResult<()> {
        let Some((token, raw)) = lock(&self.iterated).take() else { return Ok(()) };
        let held = lock(&token.frame).is_some();
        if held { self.release_token(py, &token, 0, raw) } else { Ok(()) }
    }
}

#[pymethods]
impl Consumer {
    #[new]
    #[pyo3(signature = (socket, backend="vmm", name="consumer", device=0, wait_for_producer=0.0, timeout=5.0))]
    fn new(
        py: Python<'_>,
        socket: PathBuf,
        backend: &str,
        name: &str,
        device: i32,
        wait_for_producer: f64,
        timeout: f64,
    ) -> PyResult<Self> {
        let backend = parse_backend(backend)?;
        let timeout = seconds(timeout)?;
        let give_up = Instant::now() + seconds(wait_for_producer)?;
        let gpu = Gpu::for_backend(py, backend, device)?;
        // Attaching waits for a producer to appear in slices, so that Ctrl-C works while it waits.
        let end = loop {
            let options = AttachOptions {
                name: name.to_owned(),
                timeout,
                wait_for_producer: give_up.saturating_duration_since(Instant::now()).min(SLICE),
                ..AttachOptions::default()
            };
            let attached = py.detach(|| -> Result<End, FrameError> {
                Ok(match (backend, &gpu) {
                    (BackendKind::Host, _) => {
                        PerBackend::Host(CoreConsumer::<Host>::attach(&HostContext, &socket, &options)?)
                    }
                    (BackendKind::Legacy, Some(g)) => {
                        PerBackend::Legacy(CoreConsumer::<Legacy>::attach(&g.ctx, &socket, &options)?)
                    }
                    (BackendKind::Vmm, Some(g)) => {
                        PerBackend::Vmm(CoreConsumer::<Vmm>::attach(&g.ctx, &socket, &options)?)
                    }
                    (other, _) => return Err(FrameError::Config(format!("backend {other} is not in this build"))),
                })
            });
            match attached {
                Err(FrameError::Wire(WireError::NoProducer { .. })) if Instant::now() < give_up => check_signals(py)?,
                other => break other.map_err(to_py)?,
            }
        };
        let (slot, sync, slots, host) = each_backend!(&end, c => {
            let offer = c.offer();
            (c.slot_layout().clone(), offer.sync, offer.slot_count, None::<HostRegion>)
        });
        let words =
            each_backend!(&end, c => (0..slots).map(|s| c.published_word(SlotIndex(s))).collect::<Option<Vec<_>>>());
        let control = words.as_ref().and_then(|w| w.first()).map(|(control, _)| control.clone());
        let (Some(words), Some(control)) = (words, control) else {
            return Err(GpuIpcError::new_err("the ring's control block has no published word for each slot"));
        };
        let stamp_words = (control, words.into_iter().map(|(_, offset)| offset).collect());
        let host = match &end {
            PerBackend::Host(c) => Some(c.region().clone()),
            _ => host,
        };
        let mapping = match (&end, &gpu) {
            (PerBackend::Legacy(c), Some(g)) => {
                Some(Arc::new(MappingHold::new(c.shared_region(), Some(g.ctx.clone()))))
            }
            (PerBackend::Vmm(c), Some(g)) => Some(Arc::new(MappingHold::new(c.shared_region(), Some(g.ctx.clone())))),
            _ => None,
        };
        Ok(Self {
            layout: Layout::of_slot(&slot)?,
            end: Mutex::new(Held::new(end)),
            closed: AtomicBool::new(false),
            pid: std::process::id(),
            gpu,
            host,
            mapping: Mutex::new(mapping),
            backend,
            sync,
            nbytes: slot.bytes(),
            slots,
            socket,
            timeout,
            iterated: Mutex::new(None),
            end_of_stream: Mutex::new(None),
            stamp_words,
            arrays: SlotArrays::new(slots),
            order: StreamOrder::default(),
        })
    }

    /// The next frame. CPU strategies return when it is published; GPU-side ones queue the wait on ``stream``.
    ///
    /// Raises ``EndOfStream`` after the last frame of a closed ring, ``ProducerGone`` when the producer died,
    /// ``Evicted``, ``Timeout``. Ctrl-C during the wait raises ``KeyboardInterrupt`` (within about 50 ms; gpu-poll:
    /// when the wait returns); a frame found as it came is given back unread, never returned.
    #[pyo3(signature = (timeout=1.0, stream=None))]
    fn next_frame(slf: &Bound<'_, Self>, timeout: f64, stream: Option<&Bound<'_, PyAny>>) -> PyResult<Frame> {
        let raw = stream_handle(stream)?;
        Self::next(slf, seconds(timeout)?, raw).inspect_err(|e| slf.get().note_end(slf.py(), e))
    }

    /// Gives ``frame`` back once the work on ``stream`` (default: the stream ``next_frame`` used) read it.
    ///
    /// The release also waits for the work queued so far on every other stream that took the frame through
    /// ``__dlpack__`` (``torch.from_dlpack(frame)`` under another current stream): those streams must still exist.
    /// Work on a stream that took the frame through ``__cuda_array_interface__`` is not tracked: pass that stream.
    /// Twice raises ``ReleasedError``; another consumer's frame raises ``ForeignToken``.
    #[pyo3(signature = (frame, stream=None))]
    fn release(slf: &Bound<'_, Self>, frame: &Bound<'_, Frame>, stream: Option<&Bound<'_, PyAny>>) -> PyResult<()> {
        let frame = frame.get();
        if !frame.consumer.bind(slf.py()).is(slf) {
            return Err(ForeignToken::new_err(format!("frame {} was received by another consumer", frame.seq)));
        }
        let raw = stream_handle(stream)?.or(frame.stream);
        slf.get().release_token(slf.py(), &frame.token, frame.seq, raw).inspect_err(|e| slf.get().note_end(slf.py(), e))
    }

    fn __iter__(slf: Bound<'_, Self>) -> Bound<'_, Self> {
        slf
    }

    /// The next frame (waiting up to ``timeout``), releasing the one iteration handed out before it if the
    /// caller did not; stops at the end of the stream.
    fn __next__(slf: &Bound<'_, Self>) -> PyResult<Option<Frame>> {
        let py = slf.py();
        let this = slf.get();
        let end_of_stream = |e: &PyErr| {
            this.note_end(py, e);
            e.is_instance_of::<EndOfStream>(py)
        };
        match this.release_iterated(py) {
            Err(e) if end_of_stream(&e) => return Ok(None),
            other => other?,
        }
        match Self::next(slf, this.timeout, None) {
            Ok(frame) => {
                *lock(&this.iterated) = Some((frame.token.clone(), frame.stream));
                Ok(Some(frame))
            }
            Err(e) if end_of_stream(&e) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// The ``EndOfStream`` that ended this consumer's stream, once it did: what stopped its iteration (a ``for``
    /// loop over it ends without one), or what ``next_frame`` or ``release`` raised. Read ``.published`` (the
    /// frames the producer published: keep what was computed from frames with ``seq`` below it) and ``.past_end``
    /// there. ``None`` until the end was seen.
    ///
    /// Example::
    ///
    ///     for frame in consumer:
    ///         ...
    ///     assert consumer.end is not None and consumer.end.published == frames_seen
    #[getter]
    fn end(&self, py: Python<'_>) -> Option<Py<PyAny>> {
        lock(&self.end_of_stream).as_ref().map(|e| e.clone_ref(py))
    }

    /// Leaves the ring cleanly and tells the producer. Frames held become invalid. Idempotent. With a GPU-side
    /// strategy it waits at most 0.2 s (none after Ctrl-C) for the stream to pass the waits queued on the ring;
    /// a stream a quiet producer still holds is left to a background thread to finish the teardown.
    fn detach(&self, py: Python<'_>) -> PyResult<()> {
        self.leave(py, true, Some(TEARDOWN_WAIT))
    }

    /// As ``detach`` without the message. Idempotent.
    fn close(&self, py: Python<'_>) -> PyResult<()> {
        self.leave(py, false, Some(TEARDOWN_WAIT))
    }

    #[getter]
    pub(crate) fn closed(&self) -> bool {
        self.closed.load(Ordering::Acquire)
    }

    fn __enter__(slf: Bound<'_, Self>) -> Bound<'_, Self> {
        slf
    }

    #[pyo3(signature = (*args))]
    fn __exit__(&self, py: Python<'_>, args: &Bound<'_, PyTuple>) -> PyResult<bool> {
        // Left on Ctrl-C or `sys.exit()`: the process is on its way out, so the GPU is not waited for.
        let leaving = args.get_item(0).ok().and_then(|kind| kind.cast_into::<PyType>().ok()).is_some_and(|kind| {
            kind.is_subclass_of::<PyKeyboardInterrupt>().unwrap_or(false)
                || kind.is_subclass_of::<PySystemExit>().unwrap_or(false)
        });
        self.leave(py, true, (!leaving).then_some(TEARDOWN_WAIT))?;
        Ok(false)
    }

    #[getter]
    fn next_sequence(&self, py: Python<'_>) -> PyResult<u64> {
        self.with_end(py, Duration::ZERO, false, |end, _| Ok(each_backend!(end, c => c.next_sequence())))
    }

    fn __repr__(&self) -> String {
        format!(
            "Consumer(socket={:?}, backend={:?}, sync={:?}, shape={:?}{})",
            self.socket.display().to_string(),
            self.backend.name(),
            self.sync.name(),
            self.layout.shape,
            if self.closed() { ", closed" } else { "" }
        )
    }
}

impl Drop for Consumer {
    fn drop(&mut self) {
        if self.pid != std::process::id() {
            // A forked child's copy: CUDA is not usable here, and the context and event are the parent's to release.
            std::mem::forget(self.gpu.take());
            std::mem::forget(std::mem::take(&mut self.order));
        }
        // Our hold goes first, so that the core's consumer (dropped next) is the last owner of the ring's memory
        // unless a tensor still holds it, and its own teardown frees it.
        lock(&self.mapping).take();
        // Never waits for the GPU here: a consumer dropped by the garbage collector or at the interpreter's exit.
        if let Ok(Some(end)) = lock(&self.end).take("consumer") {
            let _ = self.tear_down(None, end, false, None);
        }
    }
}

crate::ring_end_getters!(Consumer);

/// How long `close()` and `detach()` wait for a GPU-side strategy's teardown before they leave it to finish in
/// the background: long enough for a stream that is merely busy, short enough that a stream stuck on a quiet
/// producer's frame does not hold up the caller (nor the process's exit).
const TEARDOWN_WAIT: Duration = Duration::from_millis(200);

/// Runs `finish` (a core consumer's teardown) on a thread of its own; what tells when it is over, or `None` when it
/// ran here (no thread could be made).
fn spawn_teardown(finish: impl FnOnce() + Send + 'static) -> Option<Receiver<()>> {
    let (done, finished) = channel();
    let handed = Arc::new(Mutex::new(Some(finish)));
    let theirs = handed.clone();
    let spawned = std::thread::Builder::new().name("gpu-ipc-teardown".into()).spawn(move || {
        if let Some(finish) = lock(&theirs).take() {
            finish();
        }
        let _ = done.send(());
    });
    match spawned {
        Ok(_) => Some(finished),
        Err(_) => {
            if let Some(finish) = lock(&handed).take() {
                finish();
            }
            None
        }
    }
}
