"""The weights' tensors as the Python layer handles them (``gpu_ipc.weights``' helpers): what the native layer needs
of a tensor of any framework (``_describe``, ``_describe_target``), the state_dict's order and checks, the stream
to copy on, and every tensor of a generation cut from one DLPack import of its arena (``_cut``).
"""

from __future__ import annotations

import contextlib
import gc
import importlib
import sys
from collections.abc import Iterable, Iterator, Mapping
from itertools import repeat
from typing import Any

from gpu_ipc._gpu_ipc import ArgumentError, ArgumentTypeError

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


@contextlib.contextmanager
def _collector_paused() -> Iterator[None]:
    """Python's cyclic garbage collector held off while a generation's thousands of tensor objects are made at once
    (none of them is part of a cycle): every 700 new objects start a collection, and now and then one goes over every
    object of the process. Measured on torch 2.15 (CPU, this project's 2-core development machine), 12 cuts of an
    18,771-tensor dict: 9.0 ms median and 99-104 ms at worst with it running, 7.1 / 7.6 ms held off. Left as it
    was when disabled already; process-wide, as ``gc.disable`` is."""
    if not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def _cut(arena: Any, cut: Any, framework: Any, one_by_one: Any, writable: bool = False) -> dict[str, Any]:
    """As ``_cut_all``, with the garbage collector held off meanwhile (``_collector_paused``)."""
    with _collector_paused():
        return _cut_all(arena, cut, framework, one_by_one, writable)


def _cut_all(arena: Any, cut: Any, framework: Any, one_by_one: Any, writable: bool = False) -> dict[str, Any]:
    """Every tensor of a generation as a tensor of ``framework``, cut from one DLPack import of ``arena`` (the whole
    arena as ``uint8``, a ``WeightsTensor``): one typed view per element type, then one strided view per run
    (``cut``: the names, the runs and each name's place among the runs' tensors, as ``arena()`` gives them), split
    into its tensors in C (torch's ``unbind``, ``list()`` of a NumPy or CuPy array): no Python call per tensor.
    ``writable`` (the owner's ``stage``): every torch tensor is detached from the arena's view (``detach``, from C,
    through ``map``), so each is a leaf of its own: torch refuses an in-place copy from a tensor that requires grad
    (a trainer's parameter) into a view of a shared base (measured on the H200: "a leaf Variable that requires grad
    is being used in an in-place operation"), and into any of the views ``unbind`` made. A run whose
    element type the framework lacks, and every tensor for a framework other than torch, NumPy and CuPy, is made by
    ``framework.from_dlpack`` of its own view, which ``one_by_one()`` gives (name -> view). The dict keeps the
    names' order."""
    names, runs, order = cut
    name = _framework_name(framework)
    module = framework if not isinstance(framework, str) else importlib.import_module(framework)
    made: list[Any] = [None] * len(names)
    complete = False
    if name in ("torch", "numpy", "cupy"):
        flat = module.from_dlpack(arena)
        run_cut = _run_torch if name == "torch" else _run_array
        typed: dict[str, Any] = {}
        laid: list[Any] = []
        complete = True
        for run in runs:
            tensors = run_cut(module, flat, typed, run, writable, name == "cupy")
            if tensors is None:
                complete = False
                laid.extend(repeat(None, run[1]))
            else:
                laid.extend(tensors)
        made = list(map(laid.__getitem__, order))
    if not complete:
        missing = [i for i, t in enumerate(made) if t is None]
        views = one_by_one()
        for i in missing:
            view = views[names[i]]
            if view.generation != arena.generation:
                raise ArgumentError(f"the generation moved while its tensors were made (tensor {names[i]!r})")
            made[i] = module.from_dlpack(view)
    return dict(zip(names, made))


def _run_torch(torch: Any, flat: Any, typed: dict[str, Any], run: Any, writable: bool, _on_device: bool) -> Any:
    """The tensors of ``run`` (``(dtype, count, shape, strides, offset, step)``; offsets and step in bytes, strides in
    elements) from ``flat``, the arena as ``uint8``, through its typed view (made once per element type, kept in
    ``typed``); ``None`` when torch lacks the type."""
    dtype, count, shape, strides, offset, step = run
    view = typed.get(dtype)
    if view is None:
        dt = getattr(torch, dtype, None)
        if not isinstance(dt, torch.dtype):
            return None
        size = dt.itemsize
        view = typed[dtype] = flat[: flat.numel() // size * size].view(dt)
    size = view.element_size()
    first = offset // size  # offsets are whole elements: the manifest's decoder checks
    if count == 1:
        one = view.as_strided(shape, strides, first)
        return (one.detach(),) if writable else (one,)
    step //= size
    tensors = view.as_strided([count, *shape], [step, *strides], first).unbind(0)
    return list(map(torch.Tensor.detach, tensors)) if writable else tensors


def _run_array(np: Any, flat: Any, _typed: dict[str, Any], run: Any, _writable: bool, on_device: bool) -> Any:
    """As ``_run_torch`` for NumPy (an ``ndarray`` over the arena's buffer) and CuPy (an ``ndarray`` at the arena's
    address plus the offset): one array of the whole run, listed."""
    dtype, count, shape, strides, offset, step = run
    try:
        dt = np.dtype(dtype)
    except TypeError:
        return None
    size = dt.itemsize
    byte_strides = [step, *(s * size for s in strides)]
    if on_device:
        batched = np.ndarray((count, *shape), dt, memptr=flat.data + offset, strides=byte_strides)
    else:
        batched = np.ndarray((count, *shape), dt, buffer=flat, offset=offset, strides=byte_strides)
    if not shape:  # listing a 1-d NumPy array makes scalars (copies): index 0-d views instead
        return [batched[k, ...] for k in range(count)]
    return list(batched)


def _torch_module() -> Any:
    """PyTorch, when the caller has imported it (this module never imports it first)."""
    return sys.modules.get("torch")


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


def _dtype_name(name: str, dtype: Any) -> str:
    """A layout entry's dtype as the set names it: a name (``"bfloat16"``), a ``torch.dtype``, a NumPy dtype."""
    if isinstance(dtype, str):
        return dtype
    text = str(dtype)
    if text.startswith("torch."):
        return text.removeprefix("torch.")
    try:
        import numpy

        return str(numpy.dtype(dtype).name)
    except (ImportError, TypeError) as e:
        raise ArgumentTypeError(f"tensor {name!r}: dtype {dtype!r} is not a name, a torch.dtype or a NumPy dtype") from e


def _shape_of(name: str, shape: Any) -> tuple[int, ...]:
    try:
        dims = tuple(int(d) for d in shape)
    except TypeError as e:
        raise ArgumentTypeError(f"tensor {name!r}: shape {shape!r} is not a sequence of integers") from e
    if any(d < 0 for d in dims):
        raise ArgumentError(f"tensor {name!r}: shape {dims} has a negative size")
    return dims
