"""gpu_ipc: share GPU frames between processes through the CUDA driver API, read in place as tensors.

A :class:`Producer` publishes frames into a ring of slots in one shared GPU allocation; :class:`Consumer` objects in
other processes attach once and read each :class:`Frame` in place, as a PyTorch / CuPy / JAX / NumPy array with no
copy (DLPack, and ``__cuda_array_interface__`` on a GPU), then release it so the producer may rewrite its slot.

Producer::

    import torch, gpu_ipc
    with gpu_ipc.Producer("/tmp/frames.sock", width=3840, height=2160, sync="ipc-event", backend="vmm") as producer:
        producer.wait_for_consumers(1, timeout=30)
        for i in range(1000):
            slot = producer.acquire()
            torch.from_dlpack(slot).fill_(i % 256)   # writes the slot in place, on the default stream
            producer.publish(slot)
        producer.drain(timeout=10)

Consumer, in another process::

    import torch, gpu_ipc
    with gpu_ipc.Consumer("/tmp/frames.sock", backend="vmm", wait_for_producer=10) as consumer:
        for frame in consumer:                      # ends cleanly at the end of the stream
            image = frame.array("torch")            # (height, width, 3) uint8 on the GPU, no copy
            print(frame.seq, image.float().mean())  # the frame is released when the next one is asked for

``frame.array("torch")`` is what ``torch.from_dlpack(frame)`` gives, for less CPU: the slot's tensor, made once.

Named buffers, without a ring: :func:`share` a tensor in one process (a PyTorch tensor its caching allocator made,
in place), :func:`open` it by name in another::

    shared = gpu_ipc.share(weights, "weights/layer0", socket="/tmp/weights.sock")   # process A
    view = gpu_ipc.open("/tmp/weights.sock", "weights/layer0")                     # process B
    w = torch.from_dlpack(view)                                                      # A's memory itself

Without a GPU, ``backend="host"`` runs the same API on shared host memory (CPU strategies ``cpu-spin`` and
``cpu-sleep``), and ``numpy.from_dlpack(frame)`` reads it in place (``pip install "./python[numpy]"``).

``open`` is not in ``__all__``: ``from gpu_ipc import *`` leaves the built-in ``open`` alone; call it
``gpu_ipc.open``. ``gpu_ipc.testing`` (the Rust example programs' frame pattern) and ``gpu_ipc.weights`` (a whole
state_dict shared by name, versioned: ``gpu_ipc.weights.publish``, ``gpu_ipc.weights.open``) are imported with the
package.

Errors: every error is a :class:`GpuIpcError`; an argument the package refuses raises :class:`ArgumentError` (a
``ValueError`` too) or :class:`ArgumentTypeError` (a ``TypeError`` too). A consumer's iteration stops at the end of
the stream and keeps the :class:`EndOfStream` in ``consumer.end`` (``.published``).

Processes: a child needs its own objects, and with a GPU it must be a fresh process, not a ``fork()`` of one that
used CUDA: start it with ``multiprocessing.get_context("spawn")`` (or ``"forkserver"``), or ``subprocess``. In a
forked child CUDA does not work (``CUDA_ERROR_NOT_INITIALIZED``); the package says so with a ``GpuIpcError`` when
this process's CUDA was set up by the parent.
"""

import os as _os
import threading as _threading
from typing import Any as _Any

from gpu_ipc._gpu_ipc import (
    LEGACY_DEFAULT_STREAM,
    STAMP_MASK,
    AdmissionError,
    ArgumentError,
    ArgumentTypeError,
    BackendError,
    BufferView,
    ClosedError,
    ConfigError,
    Consumer,
    DriverError,
    EndOfStream,
    Evicted,
    ForeignToken,
    Frame,
    GpuIpcError,
    GpuWaitGaveUp,
    NameTaken,
    NoDriver,
    NoOwner,
    NoProducer,
    NotFound,
    OwnerGone,
    PeerGone,
    PoolFull,
    PoolImporter,
    PosterDied,
    Producer,
    ProducerGone,
    Refused,
    ReleasedError,
    RingError,
    Semaphore,
    SemaphoreClosed,
    SemaphoreWait,
    SharedBuffer,
    SharedPool,
    Slot,
    StaleBuffer,
    Stamp,
    StrategyUnavailable,
    Timeout,
    WireError,
    __version__,
    default_sync,
    sharing_backend,
    sync_strategies,
)

__all__ = [
    "LEGACY_DEFAULT_STREAM",
    "STAMP_MASK",
    "AdmissionError",
    "ArgumentError",
    "ArgumentTypeError",
    "BackendError",
    "BufferView",
    "ClosedError",
    "ConfigError",
    "Consumer",
    "DriverError",
    "EndOfStream",
    "Evicted",
    "ForeignToken",
    "Frame",
    "GpuIpcError",
    "GpuWaitGaveUp",
    "NameTaken",
    "NoDriver",
    "NoOwner",
    "NoProducer",
    "NotFound",
    "OwnerGone",
    "PeerGone",
    "PoolFull",
    "PoolImporter",
    "PosterDied",
    "Producer",
    "ProducerGone",
    "Refused",
    "ReleasedError",
    "RingError",
    "Semaphore",
    "SemaphoreClosed",
    "SemaphoreWait",
    "SharedBuffer",
    "SharedPool",
    "Slot",
    "StaleBuffer",
    "Stamp",
    "StrategyUnavailable",
    "Timeout",
    "WireError",
    "__version__",
    "default_sync",
    "share",
    "sharing_backend",
    "sync_strategies",
]

# This process's pools (one per socket path, made by the first `share` there) and attachments (one per socket path,
# made by the first `open` there), so that sharing or opening many buffers costs one attach.
_pools: dict[str, SharedPool] = {}
_importers: dict[str, PoolImporter] = {}
_lock = _threading.Lock()


def _key(socket: "str | _os.PathLike[str]") -> str:
    return _os.path.abspath(_os.fspath(socket))


def share(
    obj: _Any,
    name: str,
    socket: "str | _os.PathLike[str]",
    backend: "str | None" = None,
    device: "int | None" = None,
) -> SharedBuffer:
    """Shares ``obj``'s memory in place (no copy) under ``name`` in this process's pool at ``socket``, which the first
    ``share`` there creates; another process reads it with ``gpu_ipc.open(socket, name)``.

    ``obj``: anything with ``__cuda_array_interface__`` (a PyTorch CUDA tensor, a CuPy array). The host backend
    shares only memory its own pool allocated, so there make the pool with room and copy into one of its buffers::

        pool = gpu_ipc.SharedPool(socket, backend="host", capacity=1 << 20)
        numpy.from_dlpack(pool.alloc(name, array.shape, str(array.dtype)))[...] = array

    Where this process made a ``SharedPool`` at ``socket`` itself, share into that one (``pool.share(obj, name)``).

    ``backend``: the pool's when it is created; by default the one that can share ``obj`` (``sharing_backend``):
    ``"legacy"`` for PyTorch's default caching allocator, ``"vmm"`` with
    ``PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True``. ``device``: the GPU (by default ``obj``'s). The pool keeps
    ``obj`` alive until the returned buffer is freed (``free()``, or the end of a ``with`` block) and no importer
    views it (``SharedPool.reclaim`` lets go sooner). A first ``share`` at ``socket`` that fails closes the pool it
    made there.
    """
    if device is None:
        device = obj.__dlpack_device__()[1] if hasattr(obj, "__dlpack_device__") else 0
    key = _key(socket)
    with _lock:
        pool = _pools.get(key)
        if pool is None or pool.closed:
            chosen = backend if backend is not None else sharing_backend(obj, device)
            pool = SharedPool(socket, backend=chosen, device=device)
            _pools[key] = pool
            made = True
        else:
            made = False
    try:
        return pool.share(obj, name)
    except BaseException:
        if made:
            # A pool that shares nothing would keep listening at `socket` and stand in the way of the one the
            # message says to make there.
            with _lock:
                if _pools.get(key) is pool:
                    del _pools[key]
            pool.close()
        raise


def open(
    socket: "str | _os.PathLike[str]",
    name: str,
    backend: "str | None" = None,
    device: int = 0,
    timeout: float = 5.0,
    wait_for_owner: float = 0.0,
) -> BufferView:
    """The buffer another process shared under ``name`` at ``socket``, as a view that DLPack and
    ``__cuda_array_interface__`` consumers read in place (``torch.from_dlpack(view)``), pinned while it or a tensor
    made from it lives. This process attaches to the pool once (the first ``open`` there; again after its owner
    went away). Raises ``NotFound``, ``NoOwner`` (``wait_for_owner`` seconds to wait for the owner to appear),
    ``OwnerGone``.
    """
    key = _key(socket)
    with _lock:
        importer = _importers.get(key)
        if importer is None or importer.closed or importer.owner_gone:
            importer = PoolImporter(socket, backend=backend, device=device, timeout=timeout,
                                    wait_for_owner=wait_for_owner)
            _importers[key] = importer
    return importer.lookup(name)


from gpu_ipc import testing as testing  # noqa: E402  (`gpu_ipc.testing.Pattern` after `import gpu_ipc`)
from gpu_ipc import weights as weights  # noqa: E402  (`gpu_ipc.weights.publish` after `import gpu_ipc`)
