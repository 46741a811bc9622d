//! `gpu_ipc.SharedPool` and `SharedBuffer`: the owner's side of named buffers shared between processes (the core's
//! `pool`), including memory another allocator made (a PyTorch tensor), shared in place. The importers' side is
//! `pool_import`.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use gpu_ipc::BackendKind;
use gpu_ipc::core::backend::BackendError as CoreBackendError;
use gpu_ipc::core::wire::{DType, TensorDesc, WireError as CoreWireError};
use gpu_ipc::driver::{DevicePtr, pointer_is_legacy_ipc_capable};
use gpu_ipc::host::{Host, HostContext};
use gpu_ipc::legacy::Legacy;
use gpu_ipc::pool::{BufferHandle, PoolConfig, PoolError, ReclaimWatch, SharedPool as CorePool};
use gpu_ipc::toolkit::door::DoorError;
use gpu_ipc::vmm::Vmm;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyTuple};

use crate::each_backend;
use crate::errors::{ArgumentError, ArgumentTypeError, BackendError, ReleasedError, WireError, pool_to_py, to_py};
use crate::mapping::MappingHold;
use crate::ring::{Gpu, PerBackend, Shared, lock, parse_backend};
use crate::stream::{borrow, stream_handle};
use crate::view::pool_view;
use crate::view::{ArrayMemory, Layout, View};

type Owner = PerBackend<CorePool<Legacy>, CorePool<Vmm>, CorePool<Host>>;
type Handle = PerBackend<BufferHandle<Legacy>, BufferHandle<Vmm>, BufferHandle<Host>>;

/// The owner of a pool of named buffers, served at ``socket``: other processes find each buffer by name
/// (``gpu_ipc.open`` or ``PoolImporter``) and read it in place, with no copy.
///
/// ``share(tensor, name)`` shares memory another allocator made, in place: a PyTorch CUDA tensor (its caching
/// allocator's ``cuMemAlloc`` memory with ``backend="legacy"``; with ``PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True``
/// its ``cuMemCreate`` memory with ``backend="vmm"``), a CuPy array, anything with ``__cuda_array_interface__``, or on
/// the host backend a NumPy view of memory the host backend allocated. ``alloc(name, shape, dtype)`` allocates a
/// buffer in the pool's own memory (``capacity`` bytes; 0, the default, makes a pool that only shares). Usually made
/// for you by ``gpu_ipc.share``.
///
/// Example::
///
///     pool = gpu_ipc.SharedPool("/tmp/weights.sock", backend="legacy")
///     weights = torch.randn(4096, 4096, device="cuda")
///     shared = pool.share(weights, "weights/layer0")   # importers find it by name from now on
///     ...
///     shared.free()                                     # no longer found; the tensor is kept while importers view it
///
/// A shared object is let go (given back to its allocator) only once its buffer is freed, no importer views it and
/// the GPU work queued on it when it was freed has finished: checked at every ``share``, ``alloc``, ``free`` and
/// ``reclaim``. Closing the pool frees what it shares; objects importers still view then are kept for the life of
/// the process.
#[pyclass(frozen, module = "gpu_ipc._gpu_ipc")]
pub struct SharedPool {
    pool: Shared<Owner>,
    gpu: Option<Gpu>,
    backend: BackendKind,
    socket: PathBuf,
    /// The objects shared in place, each held until the core says its buffer went back.
    kept: Mutex<Vec<Kept>>,
}

/// An object shared in place, and the watch that says when the pool may let go of it.
struct Kept {
    name: String,
    watch: ReclaimWatch,
    object: Py<PyAny>,
}

/// What `share` learned about an object: where its bytes are and what tensor they hold.
struct Described {
    ptr: u64,
    bytes: u64,
    desc: TensorDesc,
    on_gpu: bool,
}

impl SharedPool {
    fn owner(&self) -> PyResult<Arc<Owner>> {
        self.pool.get("pool")
    }

    /// Gives back what no importer pins any more (the core's `reclaim`) and lets go of the objects whose buffers
    /// went back; returns how many buffers went back. Nothing once closed.
    fn sweep(&self, py: Python<'_>) -> usize {
        let Ok(owner) = self.owner() else { return 0 };
        let reclaimed = py.detach(|| each_backend!(&*owner, p => p.reclaim()));
        let released: Vec<Kept> = {
            let mut kept = lock(&self.kept);
            let (gone, still) = std::mem::take(&mut *kept).into_iter().partition(|k| k.watch.is_reclaimed());
            *kept = still;
            gone
        };
        drop(released); // with the GIL held: the objects' allocators get them back now
        reclaimed
    }

    /// The object shared as the buffer of `generation`, while the pool holds it.
    fn kept_object(&self, py: Python<'_>, generation: u64) -> Option<Py<PyAny>> {
        self.sweep(py);
        lock(&self.kept).iter().find(|k| k.watch.generation() == generation).map(|k| k.object.clone_ref(py))
    }

    /// Keeps the objects still held for the life of the process: once the pool is closed nothing says when
    /// importers stop reading them.
    fn keep_for_good(&self) {
        let kept = std::mem::take(&mut *lock(&self.kept));
        if !kept.is_empty() {
            tracing::warn!(
                objects = kept.len(),
                "the pool closed while it held shared objects (live, or viewed by importers): kept for the process's life"
            );
        }
        for k in kept {
            std::mem::forget(k.object);
        }
    }
}

#[pymethods]
impl SharedPool {
    #[new]
    #[pyo3(signature = (socket, backend="vmm", device=0, capacity=0))]
    fn new(py: Python<'_>, socket: PathBuf, backend: &str, device: i32, capacity: u64) -> PyResult<Self> {
        let backend = parse_backend(backend)?;
        let gpu = Gpu::for_backend(py, backend, device)?;
        let config = if capacity == 0 { PoolConfig::sharing_only() } else { PoolConfig::new(capacity) };
        let pool = py
            .detach(|| -> Result<Owner, PoolError> {
                Ok(match (backend, &gpu) {
                    (BackendKind::Host, _) => PerBackend::Host(CorePool::create(&HostContext, &socket, config)?),
                    (BackendKind::Legacy, Some(g)) => PerBackend::Legacy(CorePool::create(&g.ctx, &socket, config)?),
                    (_, Some(g)) => PerBackend::Vmm(CorePool::create(&g.ctx, &socket, config)?),
                    (other, None) => return Err(PoolError::Unsupported(format!("backend {other} needs a GPU"))),
                })
            })
            .map_err(|e| match path_in_use(&e) {
                Some(path) => WireError::new_err(what_listens(path)),
                None => pool_to_py(e),
            })?;
        lock(&OPEN_POOLS).push(std::path::absolute(&socket).unwrap_or_else(|_| socket.clone()));
        Ok(Self { pool: Shared::new(pool), gpu, backend, socket, kept: Mutex::new(Vec::new()) })
    }

    /// Shares ``obj``'s memory in place under ``name`` (no copy) and returns the owner's handle on it. The pool
    /// keeps a reference to ``obj`` until the buffer is freed and no importer views it, so its allocator does not
    /// hand the memory to another tensor meanwhile; write it only when the importers expect it.
    fn share(slf: &Bound<'_, Self>, obj: &Bound<'_, PyAny>, name: &str) -> PyResult<SharedBuffer> {
        let this = slf.get();
        let owner = this.owner()?;
        this.sweep(slf.py());
        let described = describe(obj)?;
        if described.on_gpu != this.backend.is_gpu() {
            return Err(ArgumentError::new_err(format!(
                "this {} pool shares {} memory; the object's is {}",
                this.backend.name(),
                if this.backend.is_gpu() { "GPU" } else { "host" },
                if described.on_gpu { "on a GPU" } else { "host memory" }
            )));
        }
        let Described { ptr, bytes, desc, .. } = described;
        let layout = Layout::of_tensor(&desc)?;
        let handle = slf
            .py()
            .detach(|| -> Result<Handle, PoolError> {
                let at = DevicePtr(ptr);
                Ok(match &*owner {
                    PerBackend::Legacy(p) => PerBackend::Legacy(p.share_existing(name, at, bytes, Some(desc))?),
                    PerBackend::Vmm(p) => PerBackend::Vmm(p.share_existing(name, at, bytes, Some(desc))?),
                    PerBackend::Host(p) => PerBackend::Host(p.share_existing(name, at, bytes, Some(desc))?),
                })
            })
            .map_err(|e| match e {
                PoolError::Backend(CoreBackendError::Unsupported { .. }) if !this.backend.is_gpu() => {
                    BackendError::new_err(HOST_SHARES_ITS_OWN)
                }
                e => pool_to_py(e),
            })?;
        let watch = each_backend!(&handle, h => h.reclaim_watch());
        lock(&this.kept).push(Kept { name: name.to_owned(), watch, object: obj.clone().unbind() });
        Ok(SharedBuffer::new(slf, handle, layout, true))
    }

    /// Allocates a buffer of ``shape`` and ``dtype`` (contiguous) in the pool's own memory, named ``name``; fill it
    /// through its views (``torch.from_dlpack(buffer)``).
    #[pyo3(signature = (name, shape, dtype="uint8"))]
    fn alloc(slf: &Bound<'_, Self>, name: &str, shape: Vec<u64>, dtype: &str) -> PyResult<SharedBuffer> {
        let owner = slf.get().owner()?;
        slf.get().sweep(slf.py());
        let dtype: DType =
            dtype.parse().map_err(|e: gpu_ipc::core::wire::UnknownName| ArgumentError::new_err(e.to_string()))?;
        let desc = TensorDesc::contiguous(dtype, shape).map_err(|e| ArgumentError::new_err(e.to_string()))?;
        let layout = Layout::of_tensor(&desc)?;
        let bytes = desc.span_bytes();
        let handle = slf
            .py()
            .detach(|| -> Result<Handle, PoolError> {
                Ok(match &*owner {
                    PerBackend::Legacy(p) => PerBackend::Legacy(p.alloc(name, bytes, 256, Some(desc))?),
                    PerBackend::Vmm(p) => PerBackend::Vmm(p.alloc(name, bytes, 256, Some(desc))?),
                    PerBackend::Host(p) => PerBackend::Host(p.alloc(name, bytes, 256, Some(desc))?),
                })
            })
            .map_err(pool_to_py)?;
        Ok(SharedBuffer::new(slf, handle, layout, false))
    }

    /// Gives back the bytes of freed buffers no importer views any more (and lets go of their shared objects);
    /// returns how many. ``share``, ``alloc`` and ``free`` do this too.
    fn reclaim(&self, py: Python<'_>) -> PyResult<usize> {
        self.owner()?;
        Ok(self.sweep(py))
    }

    /// Closes the pool: importers find nothing new (``OwnerGone``); views they hold stay valid. Shared objects are
    /// let go as ``free`` lets them go, but those importers still view are kept for the life of the process.
    /// Idempotent.
    fn close(&self, py: Python<'_>) {
        if let Ok(owner) = self.owner() {
            let live: Vec<String> =
                lock(&self.kept).iter().filter(|k| !k.watch.is_freed()).map(|k| k.name.clone()).collect();
            py.detach(|| {
                for name in &live {
                    // Freed by name: a buffer freed meanwhile on another thread says NotFound, which is fine.
                    let _ = each_backend!(&*owner, p => p.free_name(name));
                }
            });
        }
        self.sweep(py);
        if !self.pool.is_closed() && !self.pool.made_elsewhere() {
            let here = std::path::absolute(&self.socket).unwrap_or_else(|_| self.socket.clone());
            lock(&OPEN_POOLS).retain(|open| *open != here);
        }
        self.pool.close(py);
        self.keep_for_good();
    }

    #[getter]
    fn closed(&self) -> bool {
        self.pool.is_closed()
    }

    fn __enter__(slf: Bound<'_, Self>) -> Bound<'_, Self> {
        slf
    }

    #[pyo3(signature = (*_args))]
    fn __exit__(&self, py: Python<'_>, _args: &Bound<'_, PyTuple>) -> bool {
        self.close(py);
        false
    }

    #[getter]
    fn backend(&self) -> &'static str {
        self.backend.name()
    }

    #[getter]
    fn socket(&self) -> PathBuf {
        self.socket.clone()
    }

    fn __repr__(&self) -> String {
        format!(
            "SharedPool(socket={:?}, backend={:?}{})",
            self.socket.display().to_string(),
            self.backend.name(),
            if self.closed() { ", closed" } else { "" }
        )
    }
}

impl Drop for SharedPool {
    fn drop(&mut self) {
        if self.pool.made_elsewhere() {
            std::mem::forget(self.gpu.take());
            std::mem::forget(std::mem::take(&mut *lock(&self.kept)));
            return;
        }
        // The core pool closes once this drops: free what it shares in place first; what importers still view must
        // outlive it.
        Python::attach(|py| self.close(py));
    }
}

/// Why the host backend refused to share an array's own memory, and what to do instead.
const HOST_SHARES_ITS_OWN: &str = "the host backend shares only memory a host pool allocated, not an array's own \
    memory: make the pool with room, pool = gpu_ipc.SharedPool(socket, backend=\"host\", capacity=n_bytes), then \
    buffer = pool.alloc(name, shape, dtype) and copy the array in, numpy.from_dlpack(buffer)[...] = array (importers \
    see it under that name)";

/// The socket paths of this process's open pools: what listens at a path another pool is asked to listen at.
static OPEN_POOLS: Mutex<Vec<PathBuf>> = Mutex::new(Vec::new());

/// The path of a pool's creation that failed because something listens there already.
fn path_in_use(e: &PoolError) -> Option<&Path> {
    match e {
        PoolError::Wire(CoreWireError::PathInUse { path })
        | PoolError::Door(DoorError::Wire(CoreWireError::PathInUse { path })) => Some(path),
        _ => None,
    }
}

/// What listens at `path`, where a pool could not, and what to do.
fn what_listens(path: &Path) -> String {
    let here = std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf());
    if lock(&OPEN_POOLS).contains(&here) {
        format!(
            "this process has a SharedPool at {} already: share into that pool (pool.share(obj, name)), or pass \
             another socket path",
            path.display()
        )
    } else {
        format!(
            "a ring, pool or semaphore listens at {} already (not a SharedPool of this process): if it is a pool, \
             share into it in the process that made it; else stop it, or pass another socket path",
            path.display()
        )
    }
}

/// Where an object's bytes are and what they hold, from ``__cuda_array_interface__`` (GPU) or ``__array_interface__``
/// (host memory): the data pointer, the shape, the type string and the strides (in bytes; none: contiguous).
fn describe(obj: &Bound<'_, PyAny>) -> PyResult<Described> {
    let (interface, on_gpu) = if let Ok(cai) = obj.getattr("__cuda_array_interface__") {
        (cai, true)
    } else if let Ok(ai) = obj.getattr("__array_interface__") {
        (ai, false)
    } else {
        return Err(ArgumentTypeError::new_err(format!(
            "cannot share a {}: share takes an object with __cuda_array_interface__ (a PyTorch CUDA tensor, a CuPy \
             array) or __array_interface__ (a NumPy array, on the host backend)",
            obj.get_type().name()?
        )));
    };
    let interface = interface.cast::<PyDict>()?;
    let get = |key: &str| {
        interface.get_item(key)?.ok_or_else(|| ArgumentError::new_err(format!("the array interface has no {key:?}")))
    };
    let (ptr, _read_only): (u64, bool) = get("data")?.extract()?;
    let shape: Vec<u64> = get("shape")?.extract()?;
    let typestr: String = get("typestr")?.extract()?;
    let dtype = dtype_of(&typestr)?;
    let size = dtype.size_bytes();
    let strides: Option<Vec<u64>> = match interface.get_item("strides")? {
        Some(s) if !s.is_none() => {
            let bytes: Vec<i64> = s.extract()?;
            let elements = bytes
                .iter()
                .map(|&b| u64::try_from(b).ok().filter(|b| b % size == 0).map(|b| b / size))
                .collect::<Option<Vec<u64>>>()
                .ok_or_else(|| ArgumentError::new_err("only non-negative strides of whole elements can be shared"))?;
            Some(elements)
        }
        _ => None,
    };
    let desc = TensorDesc::new(dtype, shape, strides).map_err(|e| ArgumentError::new_err(e.to_string()))?;
    Ok(Described { ptr, bytes: desc.span_bytes(), desc, on_gpu })
}

/// The element type of an array interface's `typestr` (`<f4`, `|u1`, `<i8`, `|b1`, ...).
fn dtype_of(typestr: &str) -> PyResult<DType> {
    let unknown = || ArgumentError::new_err(format!("cannot share elements of type {typestr:?}"));
    let (order, rest) = typestr.split_at_checked(1).ok_or_else(unknown)?;
    if order == ">" {
        return Err(ArgumentError::new_err("big-endian arrays cannot be shared"));
    }
    Ok(match rest {
        "u1" => DType::U8,
        "i1" => DType::I8,
        "u2" => DType::U16,
        "i2" => DType::I16,
        "u4" => DType::U32,
        "i4" => DType::I32,
        "u8" => DType::U64,
        "i8" => DType::I64,
        "f2" => DType::F16,
        "f4" => DType::F32,
        "f8" => DType::F64,
        "b1" => DType::Bool,
        "c8" => DType::C64,
        "c16" => DType::C128,
        _ => return Err(unknown()),
    })
}

/// The owner's handle on a buffer of its pool: ``free()`` it (or leave the ``with`` block) to stop sharing it.
///
/// A buffer made by ``SharedPool.alloc`` is read and written through its views (``torch.from_dlpack(buffer)``,
/// ``__cuda_array_interface__``); one made by ``share`` is the object that was shared (``.source``). After ``free``
/// importers no longer find it by name, and its bytes are reused only once no importer views it, no tensor made from
/// it here lives and the GPU work queued on it has finished (a shared object is let go then).
#[pyclass(frozen, module = "gpu_ipc._gpu_ipc")]
pub struct SharedBuffer {
    handle: Mutex<Option<Arc<Handle>>>,
    pool: Py<SharedPool>,
    name: String,
    generation: u64,
    ptr: u64,
    layout: Layout,
    /// Memory another allocator made, shared in place (the pool holds the object: `SharedPool::kept`).
    in_place: bool,
}

impl SharedBuffer {
    fn new(pool: &Bound<'_, SharedPool>, handle: Handle, layout: Layout, in_place: bool) -> Self {
        let (name, generation, ptr) = each_backend!(&handle, h => (h.name().to_owned(), h.generation(), h.ptr().0));
        Self {
            handle: Mutex::new(Some(Arc::new(handle))),
            pool: pool.clone().unbind(),
            name,
            generation,
            ptr,
            layout,
            in_place,
        }
    }
}

impl ArrayMemory for SharedBuffer {
    fn layout(&self) -> &Layout {
        &self.layout
    }

    fn view(&self) -> PyResult<View> {
        let handle = lock(&self.handle)
            .clone()
            .ok_or_else(|| ReleasedError::new_err(format!("buffer `{}` was freed", self.name)))?;
        if self.in_place {
            return Err(ArgumentTypeError::new_err(format!(
                "buffer `{}` is memory another allocator made: use the object you shared (.source)",
                self.name
            )));
        }
        let gpu = self.pool.get().gpu.clone();
        let ordinal = gpu.as_ref().map(|g| g.ordinal);
        Ok(pool_view(self.ptr, &self.layout, ordinal, MappingHold::new(handle, gpu.map(|g| g.ctx))))
    }
}

crate::array_protocols!(SharedBuffer);

#[pymethods]
impl SharedBuffer {
    #[getter]
    fn name(&self) -> &str {
        &self.name
    }

    /// Tells this buffer from an earlier or later one of the same name.
    #[getter]
    fn generation(&self) -> u64 {
        self.generation
    }

    #[getter]
    fn nbytes(&self) -> u64 {
        self.layout.span_bytes
    }

    /// The object shared with ``SharedPool.share``, while the pool holds it: until it is freed and no importer views
    /// it (``None`` for an allocated buffer, or once let go).
    #[getter]
    fn source(&self, py: Python<'_>) -> Option<Py<PyAny>> {
        if !self.in_place {
            return None;
        }
        self.pool.get().kept_object(py, self.generation)
    }

    #[getter]
    fn freed(&self) -> bool {
        lock(&self.handle).is_none()
    }

    /// Stops sharing: importers no longer find it by name, at once. Its bytes are reused (a shared object is let go)
    /// only once no importer views it, no tensor made from it in this process lives, and the GPU work queued on it
    /// has finished: with ``stream=None`` this waits for the device's queued work (every stream); with a stream (an
    /// int handle, or an object with ``__cuda_stream__``, ``.cuda_stream`` or ``.ptr``) it does not wait, and the
    /// bytes wait for the work queued on that stream so far. Twice raises ``ReleasedError``.
    #[pyo3(signature = (stream=None))]
    fn free(&self, py: Python<'_>, stream: Option<&Bound<'_, PyAny>>) -> PyResult<()> {
        let stream = stream_handle(stream)?;
        let pool = self.pool.get();
        let owner = pool.owner()?;
        let handle = lock(&self.handle)
            .take()
            .ok_or_else(|| ReleasedError::new_err(format!("buffer `{}` was freed already", self.name)))?;
        let name = self.name.clone();
        let ctx = pool.gpu.as_ref().map(|g| g.ctx.clone());
        let freed = py.detach(move || match Arc::try_unwrap(handle) {
            Ok(handle) => match (&*owner, handle, stream.zip(ctx)) {
                (PerBackend::Legacy(p), PerBackend::Legacy(h), Some((raw, ctx))) => p.free_after(h, &borrow(&ctx, raw)),
                (PerBackend::Vmm(p), PerBackend::Vmm(h), Some((raw, ctx))) => p.free_after(h, &borrow(&ctx, raw)),
                (PerBackend::Legacy(p), PerBackend::Legacy(h), None) => p.free(h),
                (PerBackend::Vmm(p), PerBackend::Vmm(h), None) => p.free(h),
                (PerBackend::Host(p), PerBackend::Host(h), _) => p.free(h),
                _ => Err(PoolError::Unsupported("a handle of another pool".into())),
            },
            // Tensors made from it are still alive in this process: free it by name; they hold its bytes (through
            // their clones of the handle) until the last of them goes, after the device's queued work.
            Err(_) => each_backend!(&*owner, p => p.free_name(&name)),
        });
        pool.sweep(py);
        freed.map_err(pool_to_py)
    }

    fn __enter__(slf: Bound<'_, Self>) -> Bound<'_, Self> {
        slf
    }

    /// Frees the buffer unless it was freed already.
    #[pyo3(signature = (*_args))]
    fn __exit__(&self, py: Python<'_>, _args: &Bound<'_, PyTuple>) -> PyResult<bool> {
        if !self.freed() {
            self.free(py, None)?;
        }
        Ok(false)
    }

    fn __repr__(&self) -> String {
        format!(
            "SharedBuffer(name={:?}, generation={}, shape={:?}, dtype={:?}{})",
            self.name,
            self.generation,
            self.layout.shape,
            self.layout.dtype_name,
            if self.freed() { ", freed" } else { "" }
        )
    }
}

/// The backend that shares ``obj``'s memory in place: ``"host"`` for host memory (``__array_interface__``);
/// ``"legacy"`` for GPU memory from ``cuMemAlloc`` (PyTorch's default caching allocator, CuPy's); ``"vmm"``
/// otherwise (``cuMemCreate``: PyTorch's ``expandable_segments:True``). ``device``: the GPU it is on.
#[pyfunction]
#[pyo3(signature = (obj, device=0))]
pub fn sharing_backend(py: Python<'_>, obj: &Bound<'_, PyAny>, device: i32) -> PyResult<&'static str> {
    let described = describe(obj)?;
    if !described.on_gpu {
        return Ok("host");
    }
    Gpu::not_in_forked_child()?;
    let gpu = py.detach(|| Gpu::open(device)).map_err(to_py)?;
    let ptr = DevicePtr(described.ptr);
    let legacy = py
        .detach(|| gpu.ctx.enter().and_then(|_entered| pointer_is_legacy_ipc_capable(ptr)))
        .map_err(crate::errors::driver_to_py)?;
    Ok(if legacy { "legacy" } else { "vmm" })
}
