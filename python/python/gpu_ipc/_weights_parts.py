"""A weight set on several devices (a state_dict spread over GPUs), under ``gpu_ipc.weights``: one part per device,
each an ordinary one-device set (its arenas on its device), all served through one socket and published together.

``publish`` and ``create`` make a ``PartsPublisher`` when the tensors lie on several CUDA devices; ``open`` makes a
``PartsReader`` when the set it opens has parts. Both are a ``Publisher`` / ``Reader``: each part is handled by
the one-device code (a ``Publisher`` / ``Reader`` per part, on that part's native handle), and what is the set's
(publishing, the generation, ``refresh``, the owner's end) goes through part 0's handle, whose native set is the
whole one. Tests split a set into parts with ``publish(..., _parts={name: part})``: on the host backend, which has
no devices, its parts' manifests name made-up device UUIDs; on a GPU, every part lies on the tensors' one device.
"""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Mapping
from typing import Any

from gpu_ipc._gpu_ipc import ArgumentError, GenerationWait, WeightsOwner, WeightsReader
from gpu_ipc._weights_tensors import _in_order, _state_dict, _stream_of
from gpu_ipc._weights_sets import BoundSources, BoundTargets, Publisher, Reader

Layout = list[tuple[str, str, tuple[int, ...]]]


def serve_parts(layout: Layout, part_of: Mapping[str, int], devices: list[int], name: str,
                socket: str | os.PathLike[str], backend: str, keep: int, checksums: bool,
                max_arenas: int | None, max_readers: int | None = None) -> PartsPublisher:
    """The owner of a set of ``layout`` in parts (``part_of``: each tensor's part; ``devices``: each part's CUDA
    device, or on the host backend just as many entries as parts), nothing published."""
    owners = WeightsOwner.parts(socket, name, [(k, d, list(s), part_of[k]) for k, d, s in layout], devices,
                                backend=backend, keep=keep, checksums=checksums, max_arenas=max_arenas,
                                max_readers=max_readers)
    return PartsPublisher(owners, layout, part_of)


def part_of_each(layout: Layout, where: Mapping[str, int], backend: str,
                 parts: Mapping[str, int] | None) -> tuple[Mapping[str, int], list[int]]:
    """Each tensor's part and each part's CUDA device: one part per device of ``where`` (each tensor's device), in
    ordinal order; or, for tests, ``parts`` as given: a host set split in parts, or a set on one GPU split in parts
    that all lie on that GPU (what a machine of one GPU can run of the parts' protocol)."""
    if parts is not None:
        if set(parts) != {k for k, _d, _s in layout}:
            raise ArgumentError("_parts (tests only) splits a set: give a part for every tensor")
        count = max(parts.values()) + 1
        if backend == "host":
            return parts, list(range(count))
        ordinals = sorted(set(where.values()))
        if len(ordinals) != 1 or len(where) != len(layout):
            raise ArgumentError("_parts (tests only) splits a set on one GPU: every tensor on the same device")
        return parts, ordinals * count
    ordinals = sorted(set(where.values()))
    nowhere = [k for k, _d, _s in layout if k not in where]
    if nowhere:
        raise ArgumentError(f"the state_dict spans devices {ordinals} and tensor {nowhere[0]!r} is on none of them: "
                            "move it to one")
    return {k: ordinals.index(where[k]) for k, _d, _s in layout}, ordinals


def _part_streams(name: str, devices: list[int | None], stream: Any) -> list[Any]:
    """Each part's stream for a copy on a set of parts: ``None`` (each device's current stream), a mapping of CUDA
    ordinal to stream (every part's device given), or a sequence of one stream per part, in part order."""
    if stream is None:
        return [None] * len(devices)
    if isinstance(stream, Mapping):
        missing = sorted({d for d in devices if d not in stream}, key=str)
        if missing:
            raise ArgumentError(f"weight set {name!r} lies on devices {sorted(set(devices), key=str)}: the streams "
                                f"given name no stream for device {missing[0]}")
        return [stream[d] for d in devices]
    if isinstance(stream, (list, tuple)):
        if len(stream) != len(devices):
            raise ArgumentError(f"weight set {name!r} lies in {len(devices)} parts: give one stream per part "
                                f"(got {len(stream)})")
        return list(stream)
    raise ArgumentError(f"weight set {name!r} lies on {len(devices)} devices: one stream cannot serve them; pass "
                        "stream=None (each device's current stream), {device: stream}, or one stream per part")


def _split(names: list[str], tensors: list[Any], parts: list[list[str]]) -> list[dict[str, Any]]:
    by_name = dict(zip(names, tensors))
    return [{n: by_name[n] for n in part} for part in parts]


class PartsPublisher(Publisher):
    """The owner of a weight set on several devices (``publish`` makes one for a state_dict spread over GPUs): each
    part's tensors are copied on its device (on that device's current stream), every part published at once."""

    def __init__(self, owners: list[WeightsOwner], layout: Layout, part_of: Mapping[str, int]):
        super().__init__(owners[0], layout)
        self._parts = [Publisher(o, [e for e in layout if part_of[e[0]] == k]) for k, o in enumerate(owners)]

    @property
    def parts(self) -> int:
        return len(self._parts)

    def _differ(self) -> str:
        return f"weight set {self.name!r}: the state_dict's names differ from the published layout"

    def update(self, state_dict: Mapping[str, Any] | BoundSources | Any, stream: Any = None) -> int:
        """As ``Publisher.update``; each part's tensors are copied on its device: ``stream=None``, on that device's
        current stream; else ``{cuda_ordinal: stream}`` or one stream per part (one stream cannot serve several
        devices)."""
        streams = _part_streams(self.name, [part._owner.device for part in self._parts], stream)
        if isinstance(state_dict, BoundSources):
            if state_dict.owner is not self:
                raise ArgumentError(f"these sources were bound by another publisher than {self!r}")
            for part, bound, on in zip(self._parts, state_dict.native, streams):
                part._owner.copy_in_bound(bound.native, _stream_of(on, part._owner.device))
            return self._owner.commit()
        tensors = _in_order(_state_dict(state_dict), self._names, self._differ())
        sources = [part._copy(sd, on) for part, sd, on in zip(self._parts, self._split(tensors), streams)]
        generation = self._owner.commit()  # every part's, part 0 last, after every device's copies
        del sources
        return generation

    def _split(self, tensors: list[Any]) -> list[dict[str, Any]]:
        return _split(self._names, tensors, [part._names for part in self._parts])

    def bind(self, state_dict: Mapping[str, Any] | Any) -> BoundSources:
        tensors = _in_order(_state_dict(state_dict), self._names, self._differ())
        bounds = [part.bind(sd) for part, sd in zip(self._parts, self._split(tensors))]
        address = {n: a for part, b in zip(self._parts, bounds) for n, a in zip(part._names, b.addresses)}
        return BoundSources(self, tensors, [address[n] for n in self._names], bounds)

    def stage(self, framework: Any = None) -> dict[str, Any]:
        """As ``Publisher.stage``: one dict, in the publisher's order, each tensor on its device."""
        merged: dict[str, Any] = {}
        for part in self._parts:
            merged.update(part.stage(framework))
        return {n: merged[n] for n in self._names}

    def arenas(self) -> int:
        """Arenas in use, on every part."""
        return sum(part.arenas() for part in self._parts)

    def close(self) -> None:
        for part in self._parts:
            part.close()
        super().close()


class PartsReader(Reader):
    """A reader of a weight set on several devices (``open`` makes one for a set with parts): it holds one
    generation of every part, never a mix; each tensor is on its part's device. ``refresh`` and the reads of
    several parts are serialized here, so a dict of tensors is always one generation's."""

    def __init__(self, natives: list[WeightsReader]):
        super().__init__(natives[0])
        self._parts = [Reader(n) for n in natives]
        self._lock = threading.Lock()
        names = [[m[0] for m in part.manifest()] for part in self._parts]
        self._part_names = names
        self._names = [names[p][i] for p, i in natives[0].order()]  # the publisher's order (a set's is fixed)
        self._part_of = {n: k for k, part in enumerate(names) for n in part}

    @property
    def parts(self) -> int:
        return len(self._parts)

    def placement(self) -> dict[str, tuple[int, int | None]]:
        return {n: (k, self._parts[k]._reader.device) for n in self._names for k in (self._part_of[n],)}

    def wait_on(self, generation: int, stream: Any = None) -> GenerationWait:
        """As ``Reader.wait_on``, for the set's generation, on a stream of a device that holds a part: ``stream``'s
        device when it says one (a torch stream's ``device_index``, a CuPy stream's ``device_id``), else the
        current device (torch's, else CuPy's) if it holds a part, else part 0's; ``stream=None``: that device's
        current torch stream (as ``Reader.wait_on``). The wait's status word is on that device. Raises
        ``ArgumentError`` for a stream of a device that holds no part."""
        device = _stream_device(stream)
        if device is None:
            current = _current_device()
            device = current if current is not None and current in self._devices() else None
        return self._parts[self._part_on(device)].wait_on(generation, stream)

    def watch(self, generation: int, device: int | None = None) -> GenerationWait:
        """As ``Reader.watch``: the status word on CUDA device ``device`` (``None``: part 0's; on the host backend,
        host memory), following the set's generation. Raises ``ArgumentError`` for a device that holds no part."""
        return self._parts[self._part_on(device)].watch(generation)

    def _devices(self) -> list[int | None]:
        return [part._reader.device for part in self._parts]

    def _part_on(self, device: int | None) -> int:
        """The first part on CUDA device ``device`` (``None``: part 0)."""
        devices = self._devices()
        if device is None:
            return 0
        if device not in devices:
            where = f"devices {devices}" if devices[0] is not None else "no CUDA device (the host backend): pass None"
            raise ArgumentError(f"weight set {self.name!r}: device {device} holds no part; its parts lie on {where}")
        return devices.index(device)

    def refresh(self) -> int:
        with self._lock:
            return self._reader.refresh()

    def tensors(self, framework: Any = None) -> dict[str, Any]:
        """As ``Reader.tensors``: every part's tensors of the generation held, in the publisher's order."""
        merged: dict[str, Any] = {}
        with self._lock:
            for part in self._parts:
                merged.update(part.tensors(framework))
        return {n: merged[n] for n in self._names}

    def manifest(self) -> list[tuple[str, str, list[int], list[int], int, int | None]]:
        """As ``Reader.manifest``, in the publisher's order; offsets are in the tensor's part's arena (``placement``
        says which part and device)."""
        with self._lock:
            entries = {m[0]: m for part in self._parts for m in part.manifest()}
        return [entries[n] for n in self._names]

    def verify(self) -> int:
        with self._lock:
            return sum(part.verify() for part in self._parts)

    def bind(self, module_or_dict: Any) -> BoundTargets:
        differ = f"weight set {self.name!r}: the target's names differ from the set's"
        tensors = _in_order(_state_dict(module_or_dict), self._names, differ)
        bounds = [part.bind(sd) for part, sd in zip(self._parts, _split(self._names, tensors, self._part_names))]
        address = {n: a for names, b in zip(self._part_names, bounds) for n, a in zip(names, b.addresses)}
        return BoundTargets(self, tensors, [address[n] for n in self._names], bounds)

    def load_into(self, module_or_dict: Any, stream: Any = None, strict: bool = True) -> int:
        """As ``Reader.load_into``; each part's tensors are copied on its device: ``stream=None``, on that device's
        current stream; else ``{cuda_ordinal: stream}`` or one stream per part."""
        streams = _part_streams(self.name, [part._reader.device for part in self._parts], stream)
        if isinstance(module_or_dict, BoundTargets):
            if module_or_dict.owner is not self:
                raise ArgumentError(f"these targets were bound by another reader than {self!r}")
            with self._lock:
                for part, bound, on in zip(self._parts, module_or_dict.native, streams):
                    part.load_into(bound, stream=on)
            return len(module_or_dict)
        target = _state_dict(module_or_dict)
        unknown = [n for n in target if n not in self._part_of]
        missing = [n for n in self._names if n not in target] if strict else []
        if unknown or missing:
            raise ArgumentError(
                f"weight set {self.name!r} generation {self.generation}: names differ "
                f"(not in the set: {sorted(unknown)[:5]}, not in the target: {sorted(missing)[:5]})"
            )
        with self._lock:
            return sum(part.load_into({n: target[n] for n in names if n in target}, stream=on, strict=False)
                       for part, names, on in zip(self._parts, self._part_names, streams))

    def close(self) -> None:
        for part in self._parts:
            part.close()
        super().close()

    def __repr__(self) -> str:
        return f"Reader(name={self.name!r}, parts={self.parts}, generation={self.generation})"


def _stream_device(stream: Any) -> int | None:
    """The CUDA device a stream object says it is of (torch's ``device_index``, CuPy's ``device_id``); ``None`` for
    ``None``, a raw handle or another object."""
    for attribute in ("device_index", "device_id"):
        value = getattr(stream, attribute, None)
        if isinstance(value, int):
            return value
    return None


def _current_device() -> int | None:
    """The current CUDA device of torch, else of CuPy, when one is loaded; ``None`` otherwise."""
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_available():
        return int(torch.cuda.current_device())
    cupy = sys.modules.get("cupy")
    if cupy is not None:
        return int(cupy.cuda.runtime.getDevice())
    return None
