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
    params = pub.bind(model)   # or: where each tensor lives, read once (an optimizer writes them in place) ...
    pub.update(params)         # ... then every update copies with nothing read per tensor

    # inference, another process
    import torch, gpu_ipc.weights
    r = gpu_ipc.weights.open("/tmp/w.sock", "llama")
    r.load_into(model)                     # copies generation 1 into the model's own tensors (pointers unchanged)
    ...
    if r.latest() > r.generation:
        r.refresh()                        # moves to the newest; never a mix of two generations
        r.load_into(model)                 # (or r.load_into(r.bind(model)), the model's tensors read once)

or, to read the arena's tensors directly (N processes on one GPU, one copy of the model)::

    weights = r.tensors(torch)        # every tensor cut from one DLPack import of the arena

(``r.tensors()`` without a framework gives one DLPack-capable view per tensor, for any consumer.)

A generation's memory is reused only when no reader holds it (a reader holds what it last opened or refreshed to,
and what tensors made from it still reference); ``keep`` bounds the arenas kept without readers. The owner's death
is seen by readers at once (``latest()``, ``wait_for`` raise ``OwnerGone``); what they hold stays readable until
they let go. ``backend="host"`` runs the same API on shared host memory (NumPy arrays) without a GPU.

The layout (names, dtypes, shapes) is fixed when the set is published; non-contiguous tensors are published
contiguous. ``create(layout, ...)`` serves a set from its layout alone (a ``meta`` module will do) for an owner that
writes generation 1 in the arena itself (``stage``, ``commit``): the model is then in GPU memory once. A state_dict
spread over several GPUs is one set in **parts**, one per device, behind the one socket (part 0 published last);
``open`` reads either kind, holds one generation of every part, never a mix, each tensor on its device
(``Reader.placement()``); ``wait_on`` and ``watch`` on a part's device (what has run on two GPUs: docs/weights.md).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from gpu_ipc._gpu_ipc import (
    ArgumentError,
    ArgumentTypeError,
    GenerationWait,
    WeightsOwner,
    WeightsReader,
    WeightsTensor,
)
from gpu_ipc._weights_tensors import (
    _describe,
    _dtype_name,
    _is_torch,
    _state_dict,
    _shape_of,
)
from gpu_ipc._weights_parts import PartsReader, part_of_each, serve_parts
from gpu_ipc._weights_sets import BoundSources, BoundTargets, Publisher, Reader

# ``open`` is left out, as from ``gpu_ipc.__all__``: ``from gpu_ipc.weights import *`` keeps the built-in ``open``;
# call it ``gpu_ipc.weights.open``.
__all__ = ["BoundSources", "BoundTargets", "GenerationWait", "Publisher", "Reader", "WeightsTensor", "create",
           "publish"]


def publish(
    state_dict: Mapping[str, Any] | Any,
    name: str,
    socket: str | os.PathLike[str],
    backend: str | None = None,
    keep: int = 2,
    checksums: bool = False,
    device: int | None = None,
    max_arenas: int | None = None,
    max_readers: int | None = None,
    _parts: Mapping[str, int] | None = None,
) -> Publisher:
    """Publishes ``state_dict`` (a ``Mapping[str, tensor]`` of PyTorch / CuPy / JAX / NumPy tensors, or a module) as
    generation 1 of the weight set ``name``, served at ``socket``.

    ``backend``: ``"vmm"`` (default for CUDA tensors), ``"legacy"``, or ``"host"`` (default for host arrays; no GPU).
    ``keep``: arenas kept without readers (the newest and older ones; at least 1). ``checksums``: a checksum of every
    tensor in each manifest (computed from the arena: a read-back on the GPU), which ``Reader.verify()`` checks.
    ``device``: the GPU (default: the tensors'). ``max_arenas``: arenas at most, held by readers or not.
    ``max_readers``: readers attached at once, at most (default 64); one more is refused (``Refused``).

    A state_dict whose tensors lie on several GPUs (a model loaded with a device map) is published as a set of
    parts, one per device (in ordinal order), each tensor staying on its device; readers get every tensor on its
    device, never a mix of generations (``device`` must be left ``None``). ``_parts``, for tests only: splits a set
    into parts (``name -> part``): a host set (the host backend has no devices), or a set on one GPU, every part on
    that GPU.
    """
    sd = _state_dict(state_dict)
    if not sd:
        raise ArgumentError("the state_dict is empty")
    described = {k: _describe(k, v) for k, v in sd.items()}
    where = {k: t.device for k, t in described.items() if t.device is not None}
    layout = [(k, t.dtype, t.shape) for k, t in described.items()]
    publisher = _serve(layout, where, name, socket, backend or ("vmm" if where else "host"), keep, checksums,
                       device, max_arenas, _parts, max_readers)
    try:
        publisher.update(sd)
    except BaseException:
        publisher.close()
        raise
    return publisher


def create(
    layout: Mapping[str, Any] | Any,
    name: str,
    socket: str | os.PathLike[str],
    backend: str | None = None,
    keep: int = 2,
    checksums: bool = False,
    device: int | None = None,
    max_arenas: int | None = None,
    max_readers: int | None = None,
    _parts: Mapping[str, int] | None = None,
) -> Publisher:
    """Serves the weight set ``name`` at ``socket`` with nothing published yet (``generation`` 0; readers' ``open``
    waits for the first): make the first generation in the arena itself, ``staged = pub.stage(torch)``, write every
    tensor (a checkpoint read straight into ``staged[name]``), ``pub.commit()``. No copy of the whole model is made
    and none needs to exist beside the arena, so loading a model this way peaks at one copy of it in GPU memory
    (``publish`` needs the tensors first, then copies them).

    ``layout``: what each tensor is, never its values: a ``Mapping[str, tensor]`` or a module (PyTorch tensors on any
    device, ``meta`` included: ``with torch.device("meta"): model = Model()`` allocates nothing; CuPy, NumPy arrays),
    or an iterable of ``(name, dtype, shape)`` (``dtype``: a name such as ``"bfloat16"``, a ``torch.dtype`` or a
    NumPy dtype). ``backend``: ``"vmm"`` (default, unless the layout's tensors are host arrays: ``"host"``),
    ``"legacy"`` or ``"host"``; ``device``: the GPU (default: the layout's CUDA tensors', else 0). A layout of CUDA
    tensors on several devices serves a set of parts, one per device, as :func:`publish` does. The rest as for
    :func:`publish`.
    """
    entries: list[tuple[str, str, tuple[int, ...]]] = []
    where: dict[str, int] = {}
    on_host = 0
    items = _state_dict(layout).items() if isinstance(layout, Mapping) or hasattr(layout, "state_dict") else None
    if items is not None:
        for k, v in items:
            entry, place = _layout_entry(k, v)
            entries.append(entry)
            if isinstance(place, int):
                where[k] = place
            on_host += place == "host"
    else:
        try:
            given = list(layout)
        except TypeError as e:
            raise ArgumentTypeError(f"layout: a Mapping[str, tensor], a module or (name, dtype, shape) tuples, got "
                                    f"{type(layout).__name__}") from e
        for item in given:
            if not isinstance(item, (tuple, list)) or len(item) != 3:
                raise ArgumentTypeError(f"layout entry {item!r}: a (name, dtype, shape) tuple")
            k, dtype, shape = item
            entries.append((str(k), _dtype_name(str(k), dtype), _shape_of(str(k), shape)))
    if not entries:
        raise ArgumentError("the layout is empty")
    if backend is None:
        backend = "host" if on_host == len(entries) else "vmm"
    return _serve(entries, where, name, socket, backend, keep, checksums, device, max_arenas, _parts, max_readers)


def _serve(layout: list[tuple[str, str, tuple[int, ...]]], where: dict[str, int], name: str,
           socket: str | os.PathLike[str], backend: str, keep: int, checksums: bool, device: int | None,
           max_arenas: int | None, parts: Mapping[str, int] | None = None,
           max_readers: int | None = None) -> Publisher:
    """The owner of a set of ``layout`` at ``socket``, nothing published; ``where``: the CUDA device each tensor was
    found on (if any); tensors on several devices make a set of parts, one per device (``parts``: a host set split
    in parts, for tests)."""
    devices = set(where.values())
    if parts is not None or (len(devices) > 1 and device is None):
        parts, ordinals = part_of_each(layout, where, backend, parts)
        return serve_parts(layout, parts, ordinals, name, socket, backend, keep, checksums, max_arenas,
                           max_readers)
    if len(devices) > 1:
        raise ArgumentError(f"the state_dict spans devices {sorted(devices)} and device={device} was given: leave "
                            "device=None to publish a set of parts, one per device")
    if device is None:
        device = next(iter(devices)) if devices else 0
    owner = WeightsOwner(
        socket,
        name,
        [(k, d, list(s)) for k, d, s in layout],
        backend=backend,
        device=device,
        keep=keep,
        checksums=checksums,
        max_arenas=max_arenas,
        max_readers=max_readers,
    )
    return Publisher(owner, layout)


def _layout_entry(name: str, t: Any) -> tuple[tuple[str, str, tuple[int, ...]], int | str | None]:
    """``(name, dtype, shape)`` of a tensor of a layout, and where it is: a CUDA ordinal, ``"host"`` (a host array),
    or None (a ``meta`` or CPU torch tensor: says nothing of the backend)."""
    if _is_torch(t) and t.device.type == "meta":
        return (name, str(t.dtype).removeprefix("torch."), tuple(int(d) for d in t.shape)), None
    described = _describe(name, t)
    if described.device is not None:
        return (name, described.dtype, described.shape), described.device
    return (name, described.dtype, described.shape), None if _is_torch(t) else "host"


def open(
    socket: str | os.PathLike[str],
    name: str,
    backend: str | None = None,
    timeout: float = 10.0,
    device: int | None = None,
) -> Reader:
    """Opens the weight set ``name`` served at ``socket`` and takes its newest generation. ``timeout`` (seconds) bounds
    the whole open: asking the owner's backend, attaching (asked again every 20 ms while the set already serves
    ``max_readers`` readers) and waiting for the first generation. ``backend``: the owner's (default: asked of it).
    ``device``: the CUDA ordinal to map it on; ``None`` (the default): the set's own device, found in this process
    by the UUID its owner names (so ``CUDA_VISIBLE_DEVICES`` may number it otherwise here); another device than the
    set's is refused with ``BackendError``. A set on several devices (parts) is opened whole, each part on the
    device its manifest names: ``Reader.parts``, ``placement()``. Raises ``NoOwner``, ``NotFound`` (no such set),
    ``Timeout``, ``Refused`` (still full at the timeout), ``WireError`` (a manifest that fails its checks),
    ``BackendError`` (the set's device is not visible here)."""
    native = WeightsReader(socket, name, backend=backend, device=device, timeout=timeout)
    if native.part_count == 1:
        return Reader(native)
    return PartsReader([native] + [native.part_of(k) for k in range(1, native.part_count)])


# Their home is ``gpu_ipc._weights_sets`` (shared with the sets of parts); they are this module's public classes.
for _cls in (Publisher, Reader, BoundSources, BoundTargets):
    _cls.__module__ = __name__
del _cls
