"""Model weights between processes: a whole ``state_dict`` shared by name, versioned, updated in place.

The owner (a trainer, a loader) publishes a ``state_dict``; every tensor is copied into **one arena** per
generation (device-to-device on a GPU), exported once, with a plain-data manifest in front of the tensors (names,
dtypes, shapes, strides, offsets, device UUID, generation, optional checksums: never pickle). Readers (inference
engines) open the set by socket and name and get every tensor in place, whatever their number, with one import::

    # trainer
    import torch, gpu_ipc.weights
    pub = gpu_ipc.weights.publish(model.state_dict(), "llama", socket="/tmp/w.sock")   # generation 1
    ...
    pub.update(model.state_dict())                                                     # generation 2

    # inference, another process
    import torch, gpu_ipc.weights
    r = gpu_ipc.weights.open("/tmp/w.sock", "llama")
    r.load_into(model)                     # copies generation 1 into the model's own tensors (pointers unchanged)
    ...
    if r.latest() > r.generation:
        r.refresh()                        # moves to the newest; never a mix of two generations
        r.load_into(model)

or, to read the arena's tensors directly (N processes on one GPU, one copy of the model)::

    weights = r.tensors(torch)        # every tensor cut from one DLPack import of the arena

(``r.tensors()`` without a framework gives one DLPack-capable view per tensor, for any consumer.)

A generation's memory is reused only when no reader holds it (a reader holds what it last opened or refreshed to,
and what tensors made from it still reference); ``keep`` bounds the arenas kept without readers. The owner's death
is seen by readers at once (``latest()``, ``wait_for`` raise ``OwnerGone``); what they hold stays readable until
they let go. ``backend="host"`` runs the same API on shared host memory (NumPy arrays) without a GPU.

The tensors' names, dtypes and shapes are fixed when the set is published: ``update`` takes a ``state_dict`` of the
same layout. Non-contiguous tensors are published contiguous. One device per set for now.
"""

from __future__ import annotations

import importlib
import math
import operator
import os
import sys
from collections.abc import Iterable, Mapping
from typing import Any

from gpu_ipc._gpu_ipc import ArgumentError, ArgumentTypeError, WeightsOwner, WeightsReader, WeightsTensor

__all__ = ["Publisher", "Reader", "WeightsTensor", "open", "publish"]

# Tensors per native copy call: the GPU copies one batch while the next one's pointers are read. The first batches
# are smaller, so that the GPU starts early.
_BATCH = 2048


def _batches(count: int) -> list[tuple[int, int]]:
    """``(first, end)`` of each batch of ``count`` tensors: 256, 512, 1024, then 2048 at a time."""
    out, first, size = [], 0, 256
    while first < count:
        out.append((first, min(count, first + size)))
        first, size = first + size, min(_BATCH, size * 2)
    return out


def _torch_pointers(torch: Any, tensors: list[Any], dtypes: list[Any], shapes: list[Any], device: int) -> Any:
    """The ``data_ptr()`` of every tensor of ``tensors`` when all are torch tensors of ``dtypes`` and ``shapes`` (in
    order) on CUDA device ``device``, contiguous: each check one C-level pass over the batch. ``None`` when any
    is not (the caller then looks at them one by one)."""
    if not all(issubclass(kind, torch.Tensor) for kind in set(map(type, tensors))):
        return None
    if list(map(_DTYPE, tensors)) != dtypes or list(map(_SHAPE, tensors)) != shapes:
        return None
    if set(map(torch.Tensor.get_device, tensors)) != {device} or not all(map(torch.Tensor.is_contiguous, tensors)):
        return None
    return list(map(torch.Tensor.data_ptr, tensors))


_DTYPE = operator.attrgetter("dtype")
_SHAPE = operator.attrgetter("shape")

# NumPy's names of the element types the manifest knows, from the typestr of __cuda_array_interface__ and
# __array_interface__.
_TYPESTR = {
    "u1": "uint8",
    "i1": "int8",
    "u2": "uint16",
    "i2": "int16",
    "u4": "uint32",
    "i4": "int32",
    "u8": "uint64",
    "i8": "int64",
    "f2": "float16",
    "f4": "float32",
    "f8": "float64",
    "b1": "bool",
    "c8": "complex64",
    "c16": "complex128",
}


class _Tensor:
    """What the native layer needs of one tensor: its dtype name, shape, where its bytes are, and the object that
    owns them (held for the call)."""

    __slots__ = ("dtype", "shape", "ptr", "nbytes", "device", "obj", "host_bytes")

    def __init__(self, obj: Any, dtype: str, shape: tuple[int, ...], ptr: int, nbytes: int, device: int | None):
        self.obj = obj
        self.dtype = dtype
        self.shape = shape
        self.ptr = ptr
        self.nbytes = nbytes
        self.device = device  # CUDA ordinal; None: host memory
        self.host_bytes: bytes | None = None


def _is_torch(t: Any) -> bool:
    return type(t).__module__.startswith("torch") and hasattr(t, "data_ptr")


def _describe(name: str, t: Any) -> _Tensor:
    """A contiguous description of tensor ``t`` (a contiguous copy is made of a non-contiguous one)."""
    if _is_torch(t):
        t = t.detach()
        if not t.is_contiguous():
            t = t.contiguous()
        dtype = str(t.dtype).removeprefix("torch.")
        device = t.device.index if t.device.type == "cuda" else None
        if t.device.type == "cuda" and device is None:
            import torch

            device = torch.cuda.current_device()
        if t.device.type not in ("cuda", "cpu"):
            raise ArgumentError(f"tensor {name!r} is on {t.device}: publish takes CUDA or CPU tensors")
        return _Tensor(t, dtype, tuple(t.shape), t.data_ptr(), t.numel() * t.element_size(), device)
    if hasattr(t, "__cuda_array_interface__"):
        cai = t.__cuda_array_interface__
        dtype = _dtype_of(name, cai["typestr"])
        shape = tuple(int(d) for d in cai["shape"])
        if cai.get("strides") is not None and not _contiguous(shape, cai["strides"], cai["typestr"]):
            raise ArgumentError(f"tensor {name!r} is not contiguous: pass a contiguous copy")
        device = t.__dlpack_device__()[1] if hasattr(t, "__dlpack_device__") else 0
        nbytes = _count(shape) * int(cai["typestr"][2:])
        return _Tensor(t, dtype, shape, int(cai["data"][0]), nbytes, device)
    try:
        import numpy
    except ImportError as e:  # pragma: no cover - numpy is how host memory is read
        raise ArgumentTypeError(f"tensor {name!r}: a {type(t).__name__} is not a tensor this module reads") from e
    try:
        a = numpy.asarray(t)
        if not a.flags.c_contiguous:
            a = a.copy(order="C")  # (numpy.ascontiguousarray would make a scalar 1-d)
    except Exception as e:
        raise ArgumentTypeError(
            f"tensor {name!r}: a {type(t).__name__} is neither a PyTorch tensor nor an array with "
            "__cuda_array_interface__ or __array_interface__"
        ) from e
    dtype = a.dtype.name
    described = _Tensor(a, dtype, tuple(a.shape), int(a.ctypes.data), int(a.nbytes), None)
    return described


def _dtype_of(name: str, typestr: str) -> str:
    kind = typestr[1:]
    if typestr[0] == ">" or kind not in _TYPESTR:
        raise ArgumentError(f"tensor {name!r}: element type {typestr!r} cannot be published")
    return _TYPESTR[kind]


def _count(shape: Iterable[int]) -> int:
    n = 1
    for d in shape:
        n *= int(d)
    return n


def _contiguous(shape: tuple[int, ...], strides: Iterable[int], typestr: str) -> bool:
    expected, size = [], int(typestr[2:])
    for d in reversed(shape):
        expected.append(size)
        size *= d
    return list(strides) == list(reversed(expected))


def _host_bytes(t: _Tensor) -> bytes:
    """The tensor's bytes, from host memory (the host backend's copies, and CPU tensors on a GPU set)."""
    obj = t.obj
    if _is_torch(obj):
        obj = obj.cpu()
        import torch

        return obj.contiguous().view(torch.uint8).numpy().tobytes() if obj.numel() else b""
    import numpy

    return numpy.ascontiguousarray(obj).view(numpy.uint8).tobytes()


def _in_order(state_dict: Mapping[str, Any], names: list[str], differ: str) -> list[Any]:
    """``state_dict``'s tensors in the order of ``names``; raises naming what is missing and what is unknown."""
    if len(state_dict) == len(names):
        try:
            return [state_dict[n] for n in names]
        except KeyError:
            pass
    missing = sorted(set(names) - set(state_dict))
    extra = sorted(set(state_dict) - set(names))
    raise ArgumentError(
        f"{differ} (missing {missing[:5]}{'...' if len(missing) > 5 else ''}, "
        f"unknown {extra[:5]}{'...' if len(extra) > 5 else ''})"
    )


def _state_dict(obj: Any) -> Mapping[str, Any]:
    if hasattr(obj, "state_dict") and callable(obj.state_dict):
        return obj.state_dict()  # type: ignore[no-any-return]
    if isinstance(obj, Mapping):
        return obj
    raise ArgumentTypeError(f"expected a Mapping[str, tensor] or a module with state_dict(), got {type(obj).__name__}")


def _stream_of(stream: Any, device: int | None) -> Any:
    """The stream to copy on: the caller's, else PyTorch's current stream on ``device`` when torch is loaded (so a
    copy is ordered with the caller's work), else the legacy default stream (``None``)."""
    if stream is not None or device is None:
        return stream
    import sys

    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_available():
        return torch.cuda.current_stream(device).cuda_stream
    return None


def _framework_name(framework: Any) -> str:
    name = framework if isinstance(framework, str) else getattr(framework, "__name__", None)
    if not isinstance(name, str) or not name:
        raise ArgumentTypeError(f"framework: a module (torch, numpy, cupy, jax.numpy) or its name, not {framework!r}")
    return name


def _cut(arena: WeightsTensor, columns: Any, framework: Any, one_by_one: Any) -> dict[str, Any]:
    """Every tensor of ``columns`` (names, dtypes, shapes, strides, offsets, contiguous: one list each) as a tensor of
    ``framework``, cut from one DLPack import of ``arena`` (the whole arena as ``uint8``): one typed view per element
    type, then a view per tensor. A tensor whose type the framework lacks, and every tensor for a framework other
    than torch, NumPy and CuPy, is made by ``framework.from_dlpack`` of its own view, which ``one_by_one()`` gives
    (name -> view)."""
    names, dtypes, shapes, strides, offsets, contiguous = columns
    name = _framework_name(framework)
    module = framework if not isinstance(framework, str) else importlib.import_module(framework)
    made: list[Any] = [None] * len(names)
    if name in ("torch", "numpy", "cupy"):
        flat = module.from_dlpack(arena)
        groups: dict[str, list[int]] = {}
        for i, dtype in enumerate(dtypes):
            groups.setdefault(dtype, []).append(i)
        cut = _cut_torch if name == "torch" else _cut_array
        for dtype, indices in groups.items():
            cut(module, flat, dtype, indices, shapes, strides, offsets, contiguous, made, name == "cupy")
    missing = [i for i, t in enumerate(made) if t is None]
    if missing:
        views = one_by_one()
        for i in missing:
            view = views[names[i]]
            if view.generation != arena.generation:
                raise ArgumentError(f"the generation moved while its tensors were made (tensor {names[i]!r})")
            made[i] = module.from_dlpack(view)
    return dict(zip(names, made))


def _cut_torch(torch: Any, flat: Any, dtype: str, indices: list[int], shapes: list[Any], strides: list[Any],
               offsets: list[int], _contiguous: list[bool], made: list[Any], _on_device: bool) -> None:
    """The tensors ``indices`` of element type ``dtype``: one typed view of the arena, then ``as_strided`` per tensor
    (called from C through ``map``); left ``None`` when torch lacks the type or an offset is not a whole element."""
    dt = getattr(torch, dtype, None)
    if not isinstance(dt, torch.dtype):
        return
    size = dt.itemsize
    ok = [i for i in indices if offsets[i] % size == 0]
    typed = flat[: flat.numel() // size * size].view(dt)
    views = map(typed.as_strided, [shapes[i] for i in ok], [strides[i] for i in ok], [offsets[i] // size for i in ok])
    for i, view in zip(ok, views):
        made[i] = view


def _cut_array(np: Any, flat: Any, dtype: str, indices: list[int], shapes: list[Any], strides: list[Any],
               offsets: list[int], contiguous: list[bool], made: list[Any], on_device: bool) -> None:
    """As ``_cut_torch`` for NumPy (a contiguous tensor: a slice of the typed view, reshaped; else an ``ndarray`` over
    the arena with byte strides) and CuPy (an ``ndarray`` at the arena's pointer plus the offset)."""
    try:
        dt = np.dtype(dtype)
    except TypeError:
        return
    size = dt.itemsize
    typed = flat[: flat.size // size * size].view(dt)
    for i in indices:
        offset, shape = offsets[i], shapes[i]
        if offset % size:
            continue
        if on_device:
            made[i] = np.ndarray(shape, dt, memptr=flat.data + offset, strides=[s * size for s in strides[i]])
        elif contiguous[i]:
            start = offset // size
            made[i] = typed[start : start + math.prod(shape)].reshape(shape)
        else:
            made[i] = np.ndarray(shape, dt, buffer=flat, offset=offset, strides=[s * size for s in strides[i]])


def _torch_module() -> Any:
    """PyTorch, when the caller has imported it (this module never imports it first)."""
    return sys.modules.get("torch")


class Publisher:
    """The owner of a weight set: ``publish`` makes one. Context manager; ``close()`` stops serving (readers keep
    what they hold)."""

    def __init__(self, owner: WeightsOwner, layout: list[tuple[str, str, tuple[int, ...]]]):
        self._owner = owner
        self._names = [name for name, _, _ in layout]
        self._layout = {name: (dtype, tuple(shape)) for name, dtype, shape in layout}
        self._torch_layout: list[tuple[Any, tuple[int, ...]]] | None = None

    @property
    def generation(self) -> int:
        """The newest published generation."""
        return self._owner.generation

    @property
    def name(self) -> str:
        return self._owner.name

    @property
    def socket(self) -> str:
        return os.fspath(self._owner.socket)

    @property
    def backend(self) -> str:
        return self._owner.backend

    def _copy(self, state_dict: Mapping[str, Any], stream: Any) -> list[Any]:
        """Queues the copies into the staged arena; returns the sources, to hold until ``commit`` (which waits for
        the device): a contiguous copy made here must not go back to its allocator under a queued copy."""
        tensors = _in_order(state_dict, self._names, f"weight set {self.name!r}: the state_dict's names differ from "
                            "the published layout")
        device = self._owner.device
        if device is None:
            for name, obj in zip(self._names, tensors):
                self._owner.write(name, _host_bytes(self._checked(name, _describe(name, obj), device)))
            return tensors
        stream = _stream_of(stream, device)
        kept: list[Any] = []
        for first, end in _batches(len(tensors)):
            ptrs = self._pointers(tensors, first, end, device, kept)
            self._owner.copy_in(ptrs, first, stream)
        return kept

    def _pointers(self, tensors: list[Any], first: int, end: int, device: int, kept: list[Any]) -> list[int]:
        """The device addresses of ``tensors[first:end]``, checked against the layout: torch tensors of the set's
        dtypes, shapes and device, contiguous, in a few C-level passes; anything else one by one through
        ``_describe`` (host memory written here, address 0)."""
        torch = _torch_module()
        batch = tensors[first:end]
        if torch is not None:
            if self._torch_layout is None:
                self._torch_layout = [(getattr(torch, d, None), s) for d, s in self._layout.values()]
            dtypes = [d for d, _ in self._torch_layout[first:end]]
            shapes = [s for _, s in self._torch_layout[first:end]]
            ptrs = _torch_pointers(torch, batch, dtypes, shapes, device)
            if ptrs is not None:
                return ptrs  # type: ignore[no-any-return]
        ptrs = []
        for i, t in enumerate(batch, start=first):
            name = self._names[i]
            described = self._checked(name, _describe(name, t), device)
            kept.append(described)
            if described.device is None:
                self._owner.write(name, _host_bytes(described))
                ptrs.append(0)
            else:
                ptrs.append(described.ptr)
        return ptrs

    def _checked(self, name: str, t: _Tensor, device: int | None) -> _Tensor:
        dtype, shape = self._layout[name]
        if (t.dtype, t.shape) != (dtype, shape):
            raise ArgumentError(
                f"tensor {name!r} is {t.dtype} {list(t.shape)}, the set has it as {dtype} {list(shape)}"
            )
        if device is not None and t.device is not None and t.device != device:
            raise ArgumentError(f"tensor {name!r} is on cuda:{t.device}, the set on cuda:{device}")
        return t

    def update(self, state_dict: Mapping[str, Any] | Any, stream: Any = None) -> int:
        """Copies ``state_dict`` (same names, dtypes and shapes as published) into an arena no reader holds (or a new
        one), device-to-device on ``stream`` (default: PyTorch's current stream), and publishes it; returns the new
        generation. Readers keep the generation they hold until they refresh."""
        sources = self._copy(_state_dict(state_dict), stream)
        generation = self._owner.commit()
        del sources  # the device finished the copies (commit waited)
        return generation

    def stage(self, framework: Any = None) -> dict[str, Any]:
        """The next generation's tensors, writable in place; ``commit()`` publishes them. Write every tensor: the
        arena holds an older generation's bytes (or zeros). Without ``framework``, one DLPack-capable view per
        tensor (``torch.from_dlpack(t).copy_(...)``); with one (``torch``, ``numpy``, ``cupy``, or its name), that
        framework's tensors, cut from one import of the arena. They keep the owner alive: drop them before
        ``close()``."""
        if framework is None:
            return dict(self._owner.stage())
        arena, columns = self._owner.stage_arena()
        return _cut(arena, columns, framework, lambda: dict(self._owner.stage()))

    def commit(self) -> int:
        """Publishes the staged generation (after the device's queued work finished) and returns it."""
        return self._owner.commit()

    def readers(self) -> list[tuple[int | None, int]]:
        """``(pid, generation)`` for every generation each attached reader holds (pid ``None`` for a reader in a
        PID namespace this process cannot see)."""
        return [(pid, g) for pid, generations in self._owner.readers() for g in generations]

    def arenas(self) -> int:
        """Arenas in use: published, staged, and retired ones readers still hold."""
        return self._owner.arenas()

    def close(self) -> None:
        self._owner.close()

    @property
    def closed(self) -> bool:
        return self._owner.closed

    def __enter__(self) -> Publisher:
        return self

    def __exit__(self, *_args: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Publisher(name={self.name!r}, socket={self.socket!r}, generation={self.generation})"


def publish(
    state_dict: Mapping[str, Any] | Any,
    name: str,
    socket: str | os.PathLike[str],
    backend: str | None = None,
    keep: int = 2,
    checksums: bool = False,
    device: int | None = None,
    max_arenas: int | None = None,
) -> Publisher:
    """Publishes ``state_dict`` (a ``Mapping[str, tensor]`` of PyTorch / CuPy / JAX / NumPy tensors, or a module) as
    generation 1 of the weight set ``name``, served at ``socket``.

    ``backend``: ``"vmm"`` (default for CUDA tensors), ``"legacy"``, or ``"host"`` (default for host arrays; no GPU).
    ``keep``: arenas kept without readers (the newest and older ones; at least 1). ``checksums``: a checksum of every
    tensor in each manifest (computed from the arena: a read-back on the GPU), which ``Reader.verify()`` checks.
    ``device``: the GPU (default: the tensors'). ``max_arenas``: arenas at most, held by readers or not.
    """
    sd = _state_dict(state_dict)
    if not sd:
        raise ArgumentError("the state_dict is empty")
    described = {k: _describe(k, v) for k, v in sd.items()}
    devices = {t.device for t in described.values() if t.device is not None}
    if len(devices) > 1:
        raise ArgumentError(
            f"the state_dict spans devices {sorted(devices)}: publish one set per device for now "
            "(e.g. one per tensor-parallel rank)"
        )
    if device is None:
        device = next(iter(devices)) if devices else 0
    if backend is None:
        backend = "vmm" if devices else "host"
    layout = [(k, t.dtype, t.shape) for k, t in described.items()]
    owner = WeightsOwner(
        socket,
        name,
        [(k, d, list(s)) for k, d, s in layout],
        backend=backend,
        device=device,
        keep=keep,
        checksums=checksums,
        max_arenas=max_arenas,
    )
    publisher = Publisher(owner, layout)
    try:
        publisher.update(sd)
    except BaseException:
        owner.close()
        raise
    return publisher


class Reader:
    """A reader of a weight set: ``open`` makes one. Context manager; ``close()`` lets go (tensors made from it stay
    valid)."""

    def __init__(self, reader: WeightsReader):
        self._reader = reader

    @property
    def generation(self) -> int:
        """The generation this reader holds now."""
        return self._reader.generation

    @property
    def name(self) -> str:
        return self._reader.name

    @property
    def backend(self) -> str:
        return self._reader.backend

    @property
    def owner_gone(self) -> bool:
        return self._reader.owner_gone

    def tensors(self, framework: Any = None) -> dict[str, Any]:
        """The held generation's tensors, in place. Without ``framework``: one DLPack-capable view per tensor
        (``torch.from_dlpack``, ``cupy.from_dlpack``, ``jax.dlpack``, ``numpy.from_dlpack`` on the host backend).
        With one (``torch``, ``numpy``, ``cupy``, ``jax.numpy``, or its name): that framework's tensors; for torch,
        NumPy and CuPy cut from **one** DLPack import of the arena (a view per element type, then a strided view
        per tensor), much faster than one import per tensor when there are thousands. Each keeps its generation
        alive while it (or a tensor made from it) lives. Read-only by convention: the owner's, and every
        reader's."""
        if framework is None:
            return dict(self._reader.tensors())
        arena, columns = self._reader.arena()
        return _cut(arena, columns, framework, lambda: dict(self._reader.tensors()))

    def manifest(self) -> list[tuple[str, str, list[int], list[int], int, int | None]]:
        """``(name, dtype, shape, strides, offset, checksum)`` of every tensor of the held generation."""
        return self._reader.manifest()

    def latest(self) -> int:
        """The newest published generation (a word in shared memory, no round trip). Raises ``OwnerGone``."""
        return self._reader.latest()

    def refresh(self) -> int:
        """Moves to the newest generation and returns it (old tensors stay valid until dropped)."""
        return self._reader.refresh()

    def wait_for(self, generation: int, timeout: float | None = None) -> int:
        """Blocks until ``generation`` or newer is published (Ctrl-C-able); returns the newest. Does not move: call
        ``refresh()``. Raises ``Timeout``, ``OwnerGone``."""
        return self._reader.wait_for(generation, timeout)

    def verify(self) -> int:
        """Checks the held generation against its manifest's checksums; returns the tensors checked (0 without)."""
        return self._reader.verify()

    def load_into(self, module_or_dict: Any, stream: Any = None, strict: bool = True) -> int:
        """Copies the held generation into existing tensors in place (their pointers unchanged, so CUDA graphs that
        captured them stay valid): a module's ``state_dict()`` or a ``Mapping[str, tensor]``. On a GPU the copies
        are queued on ``stream`` (default: PyTorch's current stream) as a few launches of a gather kernel (one per
        batch of up to 2,048 tensors); the held generation stays mapped until they are done. Shapes and dtypes are
        checked first; ``strict``: the names must match both ways (else the target's names not in the set are
        refused, the set's others skipped). Returns the tensors copied."""
        target = _state_dict(module_or_dict)
        manifest = self.manifest()
        entries = {name: (dtype, tuple(shape)) for name, dtype, shape, _s, _o, _c in manifest}
        unknown = [name for name in target if name not in entries]
        missing = [name for name in entries if name not in target] if strict else []
        if unknown or missing:
            raise ArgumentError(
                f"weight set {self.name!r} generation {self.generation}: names differ "
                f"(not in the set: {sorted(unknown)[:5]}, not in the target: {sorted(missing)[:5]})"
            )
        device = self._reader.device
        torch = _torch_module()
        ptrs: list[int] | None = None
        if device is not None and torch is not None and len(target) == len(manifest):
            # Every tensor at once, in a few C-level passes (torch tensors of the set's dtypes and shapes, on its
            # device, contiguous); else one by one below.
            ptrs = _torch_pointers(
                torch,
                [target[m[0]] for m in manifest],
                [getattr(torch, m[1], None) for m in manifest],
                [tuple(m[2]) for m in manifest],
                device,
            )
        if ptrs is not None:
            stream = _stream_of(stream, device)
            for first, end in _batches(len(ptrs)):
                self._reader.copy_out(ptrs[first:end], first, stream)
            return len(target)
        ptrs = []
        kept, host = [], []
        for name, dtype, shape, _s, _o, _c in manifest:
            obj = target.get(name)
            if obj is None:
                ptrs.append(0)
                continue
            t = _describe_target(name, obj)
            if (t.dtype, t.shape) != (dtype, tuple(shape)):
                raise ArgumentError(
                    f"tensor {name!r} is {t.dtype} {list(t.shape)} here, {dtype} {list(shape)} in the set"
                )
            if device is not None and t.device is not None:
                if t.device != device:
                    raise ArgumentError(f"tensor {name!r} is on cuda:{t.device}, the set on cuda:{device}")
                ptrs.append(t.ptr)
                kept.append(t)
            else:
                host.append((name, t))
                ptrs.append(0)
        for name, t in host:  # every tensor checked first: nothing is written into a target that is refused
            _fill_host(t, self._reader.read(name))
        if device is not None and any(ptrs):
            stream = _stream_of(stream, device)
            for first, end in _batches(len(ptrs)):
                self._reader.copy_out(ptrs[first:end], first, stream)
        return len(target)

    def close(self) -> None:
        self._reader.close()

    @property
    def closed(self) -> bool:
        return self._reader.closed

    def __enter__(self) -> Reader:
        return self

    def __exit__(self, *_args: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Reader(name={self.name!r}, generation={self.generation})"


def _describe_target(name: str, obj: Any) -> _Tensor:
    """A tensor to copy into, in place: it must be contiguous (its own memory is written)."""
    if _is_torch(obj):
        if not obj.is_contiguous():
            raise ArgumentError(f"tensor {name!r} is not contiguous: load_into writes tensors in place")
        return _describe(name, obj)
    if hasattr(obj, "__cuda_array_interface__"):
        return _describe(name, obj)
    import numpy

    if not isinstance(obj, numpy.ndarray) or not obj.flags.c_contiguous or not obj.flags.writeable:
        raise ArgumentError(f"tensor {name!r}: load_into writes writable contiguous arrays in place")
    return _Tensor(obj, obj.dtype.name, tuple(obj.shape), int(obj.ctypes.data), int(obj.nbytes), None)


def _fill_host(t: _Tensor, data: bytes) -> None:
    obj = t.obj
    if _is_torch(obj):
        import torch

        if obj.numel():
            src = torch.frombuffer(bytearray(data), dtype=torch.uint8)
            with torch.no_grad():
                obj.view(-1).view(torch.uint8).copy_(src.to(obj.device))
        return
    import numpy

    obj.reshape(-1).view(numpy.uint8)[...] = numpy.frombuffer(data, dtype=numpy.uint8)


def open(
    socket: str | os.PathLike[str],
    name: str,
    backend: str | None = None,
    timeout: float = 10.0,
    device: int = 0,
) -> Reader:
    """Opens the weight set ``name`` served at ``socket`` and takes its newest generation (waiting up to ``timeout``
    seconds for the first). ``backend``: the owner's (default: asked of it). ``device``: the GPU to map it on
    (the set's device; another is refused with ``BackendError``). Raises ``NoOwner``, ``NotFound`` (no such set),
    ``Timeout``, ``WireError`` (a manifest that fails its checks)."""
    return Reader(WeightsReader(socket, name, backend=backend, device=device, timeout=timeout))
