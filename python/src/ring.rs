//! What `Producer` and `Consumer` share: the core's generic ends held as an enum of the concrete backends (a
//! Python object cannot be generic), the state behind a `Mutex`, the fork guard, and the sliced waits that keep
//! Ctrl-C working.
//!
//! Threads: the core's `Producer<B>` and `Consumer<B>` are `Send` (checked below at compile time) but take `&mut
//! self`; each Python object holds its end in a `Mutex`, so it may be used from any thread, one call at a time.
//! Every call that may block runs with the GIL released (`Python::detach`) and takes the lock inside, so a thread
//! waiting for the lock never holds the GIL.

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use gpu_ipc::BackendKind;
use gpu_ipc::core::frames::FrameError;
use gpu_ipc::core::wire::{SyncSide, SyncStrategy};
use gpu_ipc::driver::{Borrowed, Context, Device, Stream};
use pyo3::prelude::*;
use pyo3::types::PyDict;

use crate::errors::{ArgumentError, ClosedError, GpuIpcError, to_py};
use crate::stream::{LEGACY_DEFAULT_STREAM, borrow};

/// The longest a call runs with the GIL released before it looks for a signal (Ctrl-C).
pub const SLICE: Duration = Duration::from_millis(50);

/// One value per backend: the core's producer or consumer of that backend.
pub enum PerBackend<L, V, H> {
    /// `legacy`.
    Legacy(L),
    /// `vmm`.
    Vmm(V),
    /// `host`.
    Host(H),
}

/// Runs `$body` with `$x` bound to the backend's value, whatever the backend (each arm is compiled for its type).
#[macro_export]
macro_rules! each_backend {
    ($value:expr, $x:ident => $body:expr) => {
        match $value {
            $crate::ring::PerBackend::Legacy($x) => $body,
            $crate::ring::PerBackend::Vmm($x) => $body,
            $crate::ring::PerBackend::Host($x) => $body,
        }
    };
}

/// A ring end held by a Python object: `None` once closed. Dropped in a child after `fork()`, it is forgotten, not
/// torn down: the ring, its records and its threads are the parent's.
pub struct Held<T> {
    end: Option<T>,
    pid: u32,
}

impl<T> Held<T> {
    /// Holds `end`, made by this process.
    pub fn new(end: T) -> Self {
        Self { end: Some(end), pid: std::process::id() }
    }

    /// The end, or the error that says why there is none.
    pub fn get(&mut self, what: &str) -> PyResult<&mut T> {
        check_pid(self.pid, what)?;
        self.end.as_mut().ok_or_else(|| ClosedError::new_err(format!("this {what} is closed")))
    }

    /// Takes the end out (closing), if this process made it.
    pub fn take(&mut self, what: &str) -> PyResult<Option<T>> {
        check_pid(self.pid, what)?;
        Ok(self.end.take())
    }
}

impl<T> Drop for Held<T> {
    fn drop(&mut self) {
        if self.pid != std::process::id() {
            // A forked child's copy: the parent owns the ring; leave its memory, records and socket alone.
            std::mem::forget(self.end.take());
        }
    }
}

/// This process's id, as [`this_process`] returns it (0: not read yet).
static THIS_PROCESS: AtomicU32 = AtomicU32::new(0);

/// This process's id, as `std::process::id()` returns it but without a system call per look (`getpid` is one, and
/// the fork guard of every call on a ring end looked twice per frame): read once, and again in a child after
/// `fork()` by [`after_fork_in_child`], which the module registers with `os.register_at_fork` when it loads.
/// CPython runs that hook in every forked child that goes on running Python, the only children in which this
/// package's objects can be used.
pub fn this_process() -> u32 {
    match THIS_PROCESS.load(Ordering::Acquire) {
        0 => {
            let pid = std::process::id();
            THIS_PROCESS.store(pid, Ordering::Release);
            pid
        }
        pid => pid,
    }
}

/// Run by Python in a child after `fork()` (`os.register_at_fork(after_in_child=...)`): the child's id from now
/// on, so that the parent's objects refuse there.
#[pyfunction]
pub fn after_fork_in_child() {
    THIS_PROCESS.store(std::process::id(), Ordering::Release);
}

fn check_pid(pid: u32, what: &str) -> PyResult<()> {
    let now = this_process();
    if pid == now {
        Ok(())
    } else {
        Err(GpuIpcError::new_err(format!(
            "this {what} was made by process {pid}; this is process {now}, a child after fork(): make a new {what} here"
        )))
    }
}

/// A shared object's handle held by a Python object (a semaphore, a pool, a pool importer), whose calls take `&self`:
/// each call clones the `Arc` and runs without the lock, so calls from several threads run at once and `close` waits
/// for none of them (the last call's clone drops it). In a child after `fork()` it refuses, and is forgotten when
/// dropped: the object, its records and threads are the parent's.
pub struct Shared<T> {
    inner: Mutex<Option<Arc<T>>>,
    pid: u32,
}

impl<T: Send + Sync> Shared<T> {
    /// Holds `value`, made by this process.
    pub fn new(value: T) -> Self {
        Self { inner: Mutex::new(Some(Arc::new(value))), pid: std::process::id() }
    }

    /// Holds `value`, made by this process, shared with other holders (each closes its own hold; the value goes
    /// with the last).
    pub fn sharing(value: Arc<T>) -> Self {
        Self { inner: Mutex::new(Some(value)), pid: std::process::id() }
    }

    /// The value for one call, or the error that says why there is none (`what` names the object).
    pub fn get(&self, what: &str) -> PyResult<Arc<T>> {
        check_pid(self.pid, what)?;
        lock(&self.inner).clone().ok_or_else(|| ClosedError::new_err(format!("this {what} is closed")))
    }

    /// Closes it (dropping it with the GIL released). Idempotent.
    pub fn close(&self, py: Python<'_>) {
        let taken = lock(&self.inner).take();
        if self.pid == std::process::id() {
            py.detach(move || drop(taken));
        } else {
            std::mem::forget(taken);
        }
    }

    /// Whether it was closed.
    pub fn is_closed(&self) -> bool {
        lock(&self.inner).is_none()
    }

    /// Whether another process made it (this is a child after `fork()`).
    pub fn made_elsewhere(&self) -> bool {
        self.pid != std::process::id()
    }
}

impl<T> Drop for Shared<T> {
    fn drop(&mut self) {
        if self.pid != std::process::id() {
            std::mem::forget(lock(&self.inner).take());
        }
    }
}

/// `close()`, `closed`, and the context manager (closing at the end of the block) of a `#[pyclass]` that holds a
/// `Shared` in `$field`, in a `#[pymethods]` block of their own; `$doc` documents `close`.
#[macro_export]
macro_rules! closable {
    ($class:ty, $field:ident, $doc:literal) => {
        #[pyo3::pymethods]
        impl $class {
            #[doc = $doc]
            fn close(&self, py: pyo3::Python<'_>) {
                self.$field.close(py);
            }

            #[getter]
            fn closed(&self) -> bool {
                self.$field.is_closed()
            }

            fn __enter__(slf: pyo3::Bound<'_, Self>) -> pyo3::Bound<'_, Self> {
                slf
            }

            #[pyo3(signature = (*_args))]
            fn __exit__(&self, py: pyo3::Python<'_>, _args: &pyo3::Bound<'_, pyo3::types::PyTuple>) -> bool {
                self.$field.close(py);
                false
            }
        }
    };
}

/// Locks `m`, taking the value of a poisoned lock (a panic in the core is a bug, not a reason to stop).
pub fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// A `timeout=` in seconds as a [`Duration`].
pub fn seconds(timeout: f64) -> PyResult<Duration> {
    Duration::try_from_secs_f64(timeout)
        .map_err(|_| ArgumentError::new_err(format!("timeout must be a non-negative number of seconds, not {timeout}")))
}

/// Whether a strategy's calls wait on the CPU (and may therefore be cut into slices and resumed); GPU-side
/// strategies return as soon as their waits are queued.
pub fn waits_on_cpu(sync: SyncStrategy) -> bool {
    !sync.is_gpu_side()
}

/// Whether a wait for a frame (`Consumer.next_frame`) or for a slot (`Producer.acquire`) may be cut into slices
/// (called again after a `Timeout` as if nothing happened): the strategy's descriptor says (`waits_in_slices`; the
/// core slices the producer's itself, `ProducerSide::wait_in_slices`).
pub fn waits_in_slices(sync: SyncStrategy) -> bool {
    sync.traits().waits_in_slices
}

/// Set once a signal handler raised (Ctrl-C's `KeyboardInterrupt`) between the slices of one of the package's
/// waits: from then on this process's teardown of a GPU-side consumer does not wait for its stream (see
/// `Consumer`'s teardown). For the whole process, as Ctrl-C is.
static INTERRUPTED: AtomicBool = AtomicBool::new(false);

/// Runs the signal handlers (`Python::check_signals`), noting an interrupt when one raises.
pub fn check_signals(py: Python<'_>) -> PyResult<()> {
    py.check_signals().inspect_err(|_| INTERRUPTED.store(true, Ordering::Release))
}

/// Whether a signal handler raised in one of the package's waits in this process ([`check_signals`]).
pub fn interrupted() -> bool {
    INTERRUPTED.load(Ordering::Acquire)
}

/// An error of a bounded wait that may be cut into slices: whether it is the wait running out, and the Python
/// exception it becomes.
pub trait SlicedError: Sized + Send {
    /// Whether the wait ran out (the next slice may go on).
    fn is_timeout(&self) -> bool;
    /// The error after `waited` in all, when the last slice ran out.
    fn timed_out(self, waited: Duration) -> Self;
    /// The Python exception.
    fn into_py(self) -> PyErr;
}

impl SlicedError for FrameError {
    fn is_timeout(&self) -> bool {
        matches!(self, FrameError::Timeout { .. })
    }

    fn timed_out(self, waited: Duration) -> Self {
        match self {
            FrameError::Timeout { what, .. } => FrameError::Timeout { what, waited },
            other => other,
        }
    }

    fn into_py(self) -> PyErr {
        to_py(self)
    }
}

/// Runs `op(slice_timeout)` with the GIL released, in slices of at most [`SLICE`], until it returns anything but a
/// timeout or `timeout` passed; between slices, takes the GIL back and runs the signal handlers ([`check_signals`]:
/// Ctrl-C raises `KeyboardInterrupt` here within about 50 ms). `sliced` false runs `op(timeout)` once (a call whose
/// timeout may come after it queued GPU work, or whose deadline is also a GPU-side budget, must not be repeated).
pub fn wait_in_slices<T: Send, E: SlicedError>(
    py: Python<'_>,
    timeout: Duration,
    sliced: bool,
    mut op: impl FnMut(Duration) -> Result<T, E> + Send,
) -> PyResult<T> {
    if !sliced {
        return py.detach(|| op(timeout)).map_err(E::into_py);
    }
    let start = Instant::now();
    let deadline = start + timeout;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match py.detach(|| op(left.min(SLICE))) {
            Err(e) if e.is_timeout() && Instant::now() < deadline => check_signals(py)?,
            Err(e) if e.is_timeout() => return Err(e.timed_out(start.elapsed()).into_py()),
            other => return other.map_err(E::into_py),
        }
    }
}

/// The CUDA side of a GPU backend's end: the device's primary context and its ordinal.
#[derive(Clone)]
pub struct Gpu {
    /// The device's primary context (retained).
    pub ctx: Context,
    /// The device ordinal.
    pub ordinal: i32,
}

/// The process that first opened a device through this package (0: none yet). A child forked from it inherits the
/// value, and CUDA does not work there: the driver answers `CUDA_ERROR_NOT_INITIALIZED` to every call.
static CUDA_OPENED_BY: AtomicU32 = AtomicU32::new(0);

impl Gpu {
    /// Opens device `ordinal`. Call [`Gpu::not_in_forked_child`] first (with the GIL), so that a forked child hears
    /// why CUDA fails there.
    pub fn open(ordinal: i32) -> Result<Self, FrameError> {
        // The caller's current context (torch's) stays current: opening device 1 must not move its device off 0.
        let ctx = Context::keeping_current(Device::get(ordinal)?)?;
        let _ = CUDA_OPENED_BY.compare_exchange(0, std::process::id(), Ordering::AcqRel, Ordering::Acquire);
        Ok(Self { ctx, ordinal })
    }

    /// Refuses, in words, to use CUDA in a child forked from a process that used it through this package.
    pub fn not_in_forked_child() -> PyResult<()> {
        let parent = CUDA_OPENED_BY.load(Ordering::Acquire);
        if parent == 0 || parent == std::process::id() {
            return Ok(());
        }
        Err(GpuIpcError::new_err(format!(
            "this process was forked from process {parent} after that one used CUDA, and CUDA does not work in a \
             forked child (CUDA_ERROR_NOT_INITIALIZED): start the child as a new process instead, \
             multiprocessing.get_context(\"spawn\") (or \"forkserver\"), or subprocess"
        )))
    }

    /// The device's context for a GPU backend (opened with the GIL released); `None` for the host backend.
    pub fn for_backend(py: Python<'_>, backend: BackendKind, ordinal: i32) -> PyResult<Option<Self>> {
        if !backend.is_gpu() {
            return Ok(None);
        }
        Self::not_in_forked_child()?;
        py.detach(|| Self::open(ordinal)).map(Some).map_err(to_py)
    }

    /// The stream a call runs on: the caller's, else the legacy default stream.
    pub fn stream(&self, raw: Option<u64>) -> Borrowed<'_, Stream> {
        borrow(&self.ctx, raw.unwrap_or(LEGACY_DEFAULT_STREAM))
    }
}

/// Parses `backend=`.
pub fn parse_backend(name: &str) -> PyResult<BackendKind> {
    name.parse::<BackendKind>().map_err(|e| ArgumentError::new_err(e.to_string()))
}

/// Every sync strategy in wire-code order, as the core's descriptor (`SyncStrategy::traits`) describes it: ``name``,
/// ``waits`` and ``publishes`` (``"cpu"`` or ``"gpu"``: who waits for a frame or a slot, who marks a frame
/// published), ``needs_cuda``, ``needs_mps``, ``isolated_container`` (a consumer in its own IPC namespace can run
/// it), ``default`` (the one default strategy where a GPU backend runs).
#[pyfunction]
pub fn sync_strategies(py: Python<'_>) -> PyResult<Vec<Bound<'_, PyDict>>> {
    let side = |s: SyncSide| match s {
        SyncSide::Cpu => "cpu",
        SyncSide::Gpu => "gpu",
    };
    SyncStrategy::ALL
        .into_iter()
        .map(|s| {
            let t = s.traits();
            let d = PyDict::new(py);
            d.set_item("name", t.name)?;
            d.set_item("waits", side(t.waits))?;
            d.set_item("publishes", side(t.publishes))?;
            d.set_item("needs_cuda", t.needs_cuda)?;
            d.set_item("needs_mps", t.needs_mps)?;
            d.set_item("isolated_container", t.isolated_container)?;
            d.set_item("default", s == SyncStrategy::DEFAULT)?;
            Ok(d)
        })
        .collect()
}

/// The strategy a ring made with ``backend`` uses when none is named: ``"gpu-stream-ops"`` where a GPU backend
/// runs (the GPU waits, no MPS needed), ``"cpu-spin"`` with ``"host"``.
#[pyfunction]
pub fn default_sync(backend: &str) -> PyResult<&'static str> {
    Ok(SyncStrategy::default_for(parse_backend(backend)?).name())
}

/// Parses `sync=`.
pub fn parse_sync(name: &str) -> PyResult<SyncStrategy> {
    name.parse::<SyncStrategy>().map_err(|e| ArgumentError::new_err(e.to_string()))
}

/// The core's ends are `Send`: a Python object holding one in a `Mutex` may be used from any thread.
const _: () = {
    const fn send<T: Send>() {}
    send::<gpu_ipc::core::frames::Producer<gpu_ipc::legacy::Legacy>>();
    send::<gpu_ipc::core::frames::Producer<gpu_ipc::vmm::Vmm>>();
    send::<gpu_ipc::core::frames::Producer<gpu_ipc::host::Host>>();
    send::<gpu_ipc::core::frames::Consumer<gpu_ipc::legacy::Legacy>>();
    send::<gpu_ipc::core::frames::Consumer<gpu_ipc::vmm::Vmm>>();
    send::<gpu_ipc::core::frames::Consumer<gpu_ipc::host::Host>>();
};

/// The read-only description a `Producer` and a `Consumer` share (backend, sync, socket, slots, device, shape, dtype,
/// nbytes), in a `#[pymethods]` block of their own (PyO3's `multiple-pymethods`): one definition for both ends. The
/// class needs the fields `backend`, `sync`, `socket`, `slots`, `gpu`, `layout` and `nbytes`.
#[macro_export]
macro_rules! ring_end_getters {
    ($class:ty) => {
        #[pyo3::pymethods]
        impl $class {
            /// The backend's name: ``"legacy"``, ``"vmm"`` or ``"host"``.
            #[getter]
            fn backend(&self) -> &'static str {
                self.backend.name()
            }

            /// The ring's sync strategy.
            #[getter]
            fn sync(&self) -> &'static str {
                self.sync.name()
            }

            /// The rendezvous socket's path.
            #[getter]
            fn socket(&self) -> std::path::PathBuf {
                self.socket.clone()
            }

            /// The number of slots in the ring.
            #[getter]
            fn slots(&self) -> u32 {
                self.slots
            }

            /// The CUDA device ordinal; ``None`` with the host backend.
            #[getter]
            fn device(&self) -> Option<i32> {
                self.gpu.as_ref().map(|g| g.ordinal)
            }

            /// What each slot is as an array: ``(height, width, channels)`` of a pixel frame, the tensor's shape in a
            /// ring of tensors, ``(nbytes,)`` in a ring of bare bytes.
            #[getter]
            fn shape<'py>(&self, py: pyo3::Python<'py>) -> pyo3::PyResult<pyo3::Bound<'py, pyo3::types::PyTuple>> {
                pyo3::types::PyTuple::new(py, &self.layout.shape)
            }

            /// The element type's NumPy name (``"uint8"`` for the 8-bit formats).
            #[getter]
            fn dtype(&self) -> &'static str {
                self.layout.dtype_name
            }

            /// Bytes in one slot.
            #[getter]
            fn nbytes(&self) -> u64 {
                self.nbytes
            }
        }
    };
}
