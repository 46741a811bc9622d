"""The classes of ``gpu_ipc.weights`` (a set on one device, and what a set of parts builds on): ``Publisher`` (the
owner's side), ``Reader`` (a reader's), ``BoundSources`` / ``BoundTargets`` (tensors bound once). ``gpu_ipc.weights``
makes them (``publish``, ``create``, ``open``) and is where they are documented and imported from."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from gpu_ipc._gpu_ipc import (
    ArgumentError,
    GenerationWait,
    WeightsOwner,
    WeightsReader,
    _weights_read_sources,
)
from gpu_ipc._weights_tensors import (
    _BATCH,
    _batches,
    _cut,
    _describe,
    _describe_target,
    _framework_name,
    _fill_host,
    _host_bytes,
    _in_order,
    _state_dict,
    _stream_of,
    _Tensor,
    _torch_module,
)

# stage(framework) keeps the tensors it cut for the last _CUTS_KEPT arenas (an owner stages into two or three in
# turn), for the frameworks whose tensors are cut in one go.
_CUTS_KEPT = 4
_CUT_KEPT_FOR = ("torch", "numpy", "cupy")


class Publisher:
    """The owner of a weight set: ``publish`` makes one. Context manager; ``close()`` stops serving (readers keep
    what they hold)."""

    def __init__(self, owner: WeightsOwner, layout: list[tuple[str, str, tuple[int, ...]]]):
        self._owner = owner
        self._names = [name for name, _, _ in layout]
        self._layout = {name: (dtype, tuple(shape)) for name, dtype, shape in layout}
        self._torch_expected: tuple[Any, list[Any], list[tuple[int, ...]]] | None = None
        # stage(framework)'s tensors per arena: (address, bytes, framework) -> name -> tensor. A set's layout is
        # fixed, so an arena at the same address holds the same tensors at the same places whatever generation it
        # stages: cutting 19,000 tensors again costs about 40 ms (measured on the H200), a dict lookup nothing.
        self._staged_cuts: dict[tuple[int, int, str], dict[str, Any]] = {}

    @property
    def generation(self) -> int:
        """The newest published generation."""
        return self._owner.generation

    @property
    def parts(self) -> int:
        """The devices (parts) the set lies on: 1, or one per CUDA device of a state_dict spread over several."""
        return 1

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
        the device): a contiguous copy made here must not go back to its allocator under a queued copy.

        On a GPU, torch tensors of the set's dtypes, shapes and device, contiguous, are checked and their
        addresses read in native code, batch by batch, each batch launched as soon as it is read (the GPU copies
        one while the next is read); anything else (another framework's tensors, host memory, a non-contiguous
        tensor, a wrong one: the error names it) is taken one by one, 2,048 tensors at a time."""
        names = self._names
        differ = f"weight set {self.name!r}: the state_dict's names differ from the published layout"
        device = self._owner.device
        if device is None:
            tensors = _in_order(state_dict, names, differ)
            for name, obj in zip(names, tensors):
                self._owner.write(name, _host_bytes(self._checked(name, _describe(name, obj), device)))
            return tensors
        if len(state_dict) != len(names):
            _in_order(state_dict, names, differ)  # raises, naming what is missing and what is unknown
        sd = state_dict if isinstance(state_dict, dict) else dict(state_dict)
        stream = _stream_of(stream, device)
        expected = self._expected(_torch_module())
        kept: list[Any] = []
        at, count = 0, len(names)
        while at < count:
            if expected is not None:
                at = self._owner.copy_in_from(sd, names, at, *expected, stream)
                if at == count:
                    break
            end = min(count, at + _BATCH)
            if any(n not in sd for n in names[at:end]):
                _in_order(state_dict, names, differ)
            self._owner.copy_in(self._pointers(sd, at, end, device, kept), at, stream)
            at = end
        return kept

    def _expected(self, torch: Any) -> tuple[Any, list[Any], list[tuple[int, ...]]] | None:
        """``(torch.Tensor, dtypes, shapes)``: what each tensor of an update must be, as the native copy compares it
        (the dtype objects by identity), made once; ``None`` without torch."""
        if torch is None:
            return None
        if self._torch_expected is None:
            dtypes = [getattr(torch, dtype, None) for dtype, _shape in self._layout.values()]
            shapes = [shape for _dtype, shape in self._layout.values()]
            self._torch_expected = (torch.Tensor, dtypes, shapes)
        return self._torch_expected

    def _pointers(self, sd: Mapping[str, Any], first: int, end: int, device: int, kept: list[Any]) -> list[int]:
        """The device addresses of tensors ``first..end`` of the layout, taken one by one through ``_describe`` and
        checked against the layout (host memory written here, address 0)."""
        ptrs = []
        for name in self._names[first:end]:
            described = self._checked(name, _describe(name, sd[name]), device)
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

    def update(self, state_dict: Mapping[str, Any] | BoundSources | Any, stream: Any = None) -> int:
        """Copies ``state_dict`` (same names, dtypes and shapes as published) into an arena no reader holds (or a new
        one), device-to-device on ``stream`` (default: PyTorch's current stream), and publishes it; returns the new
        generation. Readers keep the generation they hold until they refresh.

        ``state_dict`` may be what ``bind()`` returned: then nothing is read per tensor (the copy's table was made
        when bound, and its table kept on the device for each arena), which is what keeps a switch of thousands of
        small tensors near the speed of one memcpy: one kernel launch however many tensors."""
        if isinstance(state_dict, BoundSources):
            if state_dict.owner is not self:
                raise ArgumentError(f"these sources were bound by another publisher than {self!r}")
            self._owner.copy_in_bound(state_dict.native, _stream_of(stream, self._owner.device))
            return self._owner.commit()  # waits for the copies: the bound tensors may change after it returns
        sources = self._copy(_state_dict(state_dict), stream)
        generation = self._owner.commit()
        del sources  # the device finished the copies (commit waited)
        return generation

    def bind(self, state_dict: Mapping[str, Any] | Any) -> BoundSources:
        """Reads once where every tensor of ``state_dict`` (or a module's ``state_dict()``) lives, and returns the
        sources for ``update(bound)``, which then copies from those addresses without reading any tensor again: the
        way to publish a trainer's parameters after every step, since an optimizer writes them in place. The
        tensors must be torch tensors of the set's names, dtypes and shapes, on its device, contiguous (anything
        else is refused, naming the tensor). The bound object keeps them alive, so their memory cannot go back to
        the allocator under a copy; a tensor *replaced* in the module afterwards (``param.data = ...``, a new
        ``nn.Parameter``) is not seen: bind again after such a change."""
        torch = _torch_module()
        device = self._owner.device
        if device is None or torch is None:
            raise ArgumentError("bind() is for torch tensors on a GPU; update() takes host arrays as they are")
        sd = _state_dict(state_dict)
        differ = f"weight set {self.name!r}: the state_dict's names differ from the published layout"
        tensors = _in_order(sd, self._names, differ)
        kind, dtypes, shapes = self._expected(torch)  # type: ignore[misc]
        addresses, stop = _weights_read_sources(dict(zip(self._names, tensors)), self._names, 0, kind, dtypes,
                                                shapes, device)
        if stop < len(self._names):
            name = self._names[stop]
            if not isinstance(tensors[stop], kind):
                raise ArgumentError(f"tensor {name!r} is a {type(tensors[stop]).__name__}: bind() takes torch tensors")
            described = self._checked(name, _describe(name, tensors[stop]), device)  # raises for dtype, shape, device
            if described.device is None:
                raise ArgumentError(f"tensor {name!r} is in host memory: bind() takes tensors on cuda:{device}")
            raise ArgumentError(f"tensor {name!r} is not contiguous: bind() copies from a tensor's own bytes")
        return BoundSources(self, tensors, addresses, self._owner.bind_sources(addresses))

    def stage(self, framework: Any = None) -> dict[str, Any]:
        """The next generation's tensors, writable in place; ``commit()`` publishes them. Write every tensor: the
        arena holds an older generation's bytes (or zeros). Without ``framework``, one DLPack-capable view per
        tensor (``torch.from_dlpack(t).copy_(...)``); with one (``torch``, ``numpy``, ``cupy``, or its name), that
        framework's tensors, cut from one import of the arena. They keep the owner alive: drop them before
        ``close()``. Torch, NumPy and CuPy tensors are cut once per arena and kept: an arena staged again gives the
        same tensor objects (in a new dict), so a switch in place costs no per-tensor work after each arena's first
        use; leave their metadata as it is (no ``resize_``, no ``requires_grad_``)."""
        if framework is None:
            return dict(self._owner.stage())
        kind = _framework_name(framework)
        if kind not in _CUT_KEPT_FOR:
            arena, cut = self._owner.stage_arena()
            return _cut(arena, cut, framework, lambda: dict(self._owner.stage()), writable=True)
        key = (*self._owner.stage_extent(), kind)
        made = self._staged_cuts.get(key)
        if made is None:
            arena, cut = self._owner.stage_arena()
            made = _cut(arena, cut, framework, lambda: dict(self._owner.stage()), writable=True)
            while len(self._staged_cuts) >= _CUTS_KEPT:
                del self._staged_cuts[next(iter(self._staged_cuts))]  # the oldest
            self._staged_cuts[key] = made
        return dict(made)

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
        self._staged_cuts.clear()  # they keep the owner alive
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


class _Bound:
    """Tensors as a ``bind()`` read them: their addresses (layout order), the tensors themselves, kept alive, and
    the native copies bound to them (the gather's table prepared once per arena and kept on the device, so that
    each switch is one launch); ``owner``: the publisher or reader that bound them, the only one that takes them."""

    __slots__ = ("owner", "tensors", "addresses", "native")

    def __init__(self, owner: Publisher | Reader, tensors: list[Any], addresses: list[int], native: Any):
        self.owner = owner
        self.tensors = tensors
        self.addresses = addresses
        self.native = native

    def __len__(self) -> int:
        return len(self.tensors)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({len(self.tensors)} tensors of {self.owner.name!r})"


class BoundSources(_Bound):
    """A state_dict's tensors as ``Publisher.bind()`` read them. ``Publisher.update(bound)`` copies from them as
    they are at that moment."""

    __slots__ = ()


class BoundTargets(_Bound):
    """A module's (or dict's) tensors as ``Reader.bind()`` read them. ``Reader.load_into(bound)`` copies the held
    generation into them, whichever generation that is (a set's layout is fixed)."""

    __slots__ = ()


class Reader:
    """A reader of a weight set: ``open`` makes one. Context manager; ``close()`` lets go (tensors made from it stay
    valid)."""

    def __init__(self, reader: WeightsReader):
        self._reader = reader
        self._torch_expected: tuple[list[str], list[Any], list[tuple[int, ...]]] | None = None

    def _expected(self, torch: Any) -> tuple[list[str], list[Any], list[tuple[int, ...]]]:
        """The set's names, torch dtype objects and shapes (manifest order), made once: a set's layout is fixed
        for its owner's life, and a reader reads from one owner."""
        if self._torch_expected is None:
            manifest = self.manifest()
            self._torch_expected = (
                [m[0] for m in manifest],
                [getattr(torch, m[1], None) for m in manifest],
                [tuple(m[2]) for m in manifest],
            )
        return self._torch_expected

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

    @property
    def parts(self) -> int:
        """The devices (parts) the set lies on: 1, or one per CUDA device the publisher's state_dict was spread over."""
        return 1

    def placement(self) -> dict[str, tuple[int, int | None]]:
        """Where each tensor lies, in the publisher's order: ``name -> (part, CUDA device ordinal)`` (the ordinal is
        ``None`` on the host backend; a set on one device has part 0 only). ``manifest()``'s offsets are in the
        arena of the tensor's part."""
        device = self._reader.device
        return {m[0]: (0, device) for m in self.manifest()}

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
        arena, cut = self._reader.arena()
        return _cut(arena, cut, framework, lambda: dict(self._reader.tensors()))

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

    def wait_on(self, generation: int, stream: Any = None) -> GenerationWait:
        """Makes ``stream`` (default: PyTorch's current stream on the set's device) wait on the GPU until
        ``generation`` or a newer one is published, or the owner is gone (it closed the set or died), or this reader
        closes: a stream wait cannot time out, so the end releases it. Returns at once, with the wait: the kernels
        queued after it read its status word (``torch.from_dlpack(wait)``, a 0-d ``int64`` CUDA tensor, no copy,
        no host sync): the generation is published iff ``(word & ~GenerationWait.GONE_BIT) >= wait.generation``.
        Does not move the reader: call ``refresh()`` and ``load_into(...)`` when the CPU sees the generation
        (``wait_status``). Raises ``GpuIpcError`` on the host backend (use ``wait_for`` or ``watch``),
        ``ArgumentError`` for generation 0, ``OwnerGone``. See docs/weights.md, "Waiting on a stream"."""
        return self._reader.wait_on(generation, _stream_of(stream, self._reader.device))

    def watch(self, generation: int) -> GenerationWait:
        """The status word of ``wait_on`` without a stream wait: it follows the published generation until
        ``generation`` or newer is published or the owner is gone, for kernels that read it themselves (a CUDA
        graph that must not block) or the CPU (``wait_status``). Works on the host backend too."""
        return self._reader.watch(generation)

    def wait_status(self, wait: GenerationWait) -> tuple[str, int]:
        """How ``wait`` stands: ``("published", newest)``, ``("gone", newest)`` (the owner's end or this reader's
        close released it before the generation came) or ``("waiting", 0)``."""
        return self._reader.wait_status(wait)

    def verify(self) -> int:
        """Checks the held generation against its manifest's checksums; returns the tensors checked (0 without)."""
        return self._reader.verify()

    def bind(self, module_or_dict: Any) -> BoundTargets:
        """Reads once where every tensor of a module's ``state_dict()`` (or a ``Mapping[str, tensor]``) lives, and
        returns the targets for ``load_into(bound)``, which then copies the held generation into those addresses
        without reading any tensor again: for an engine that loads every new generation into the same parameters.
        The tensors must be torch tensors of every one of the set's names, dtypes and shapes, on its device,
        contiguous (anything else is refused, naming the tensor). The bound object keeps them alive; a tensor
        *replaced* in the module afterwards is not seen: bind again after such a change."""
        torch = _torch_module()
        device = self._reader.device
        if device is None or torch is None:
            raise ArgumentError("bind() is for torch tensors on a GPU; load_into() takes host arrays as they are")
        target = _state_dict(module_or_dict)
        names, dtypes, shapes = self._expected(torch)
        differ = f"weight set {self.name!r}: the target's names differ from the set's"
        tensors = _in_order(target, names, differ)
        addresses, stop = _weights_read_sources(dict(zip(names, tensors)), names, 0, torch.Tensor, dtypes, shapes,
                                                device)
        if stop < len(names):
            name, obj = names[stop], tensors[stop]
            if not isinstance(obj, torch.Tensor):
                raise ArgumentError(f"tensor {name!r} is a {type(obj).__name__}: bind() takes torch tensors")
            t = _describe_target(name, obj)  # raises for a tensor that is not contiguous
            dtype, shape = str(dtypes[stop]).removeprefix("torch."), shapes[stop]
            if (t.dtype, t.shape) != (dtype, shape):
                raise ArgumentError(
                    f"tensor {name!r} is {t.dtype} {list(t.shape)} here, {dtype} {list(shape)} in the set"
                )
            if t.device is None:
                raise ArgumentError(f"tensor {name!r} is in host memory: bind() takes tensors on cuda:{device}")
            raise ArgumentError(f"tensor {name!r} is on cuda:{t.device}, the set on cuda:{device}")
        return BoundTargets(self, tensors, addresses, self._reader.bind_targets(addresses))

    def load_into(self, module_or_dict: Any, stream: Any = None, strict: bool = True) -> int:
        """Copies the held generation into existing tensors in place (their pointers unchanged, so CUDA graphs that
        captured them stay valid): a module's ``state_dict()`` or a ``Mapping[str, tensor]``. On a GPU the copies
        are queued on ``stream`` (default: PyTorch's current stream) as a few launches of a gather kernel (one per
        batch of up to 2,048 tensors); the held generation stays mapped until they are done. Shapes and dtypes are
        checked first; ``strict``: the names must match both ways (else the target's names not in the set are
        refused, the set's others skipped). Returns the tensors copied. ``module_or_dict`` may be what ``bind()``
        returned: then nothing is read per tensor."""
        if isinstance(module_or_dict, BoundTargets):
            if module_or_dict.owner is not self:
                raise ArgumentError(f"these targets were bound by another reader than {self!r}")
            self._reader.copy_out_bound(module_or_dict.native, _stream_of(stream, self._reader.device))
            return len(module_or_dict)
        target = _state_dict(module_or_dict)
        device = self._reader.device
        torch = _torch_module()
        if device is not None and torch is not None and isinstance(target, dict):
            # Every tensor checked and its address read in native code (torch tensors of the set's dtypes and
            # shapes, on its device, contiguous), then copied; else (or at the first that is not) one by one below,
            # where the error names what is wrong. Nothing is copied unless every tensor passed.
            names, dtypes, shapes = self._expected(torch)
            if len(target) == len(names):
                stream = _stream_of(stream, device)
                at = self._reader.copy_out_to(target, names, 0, torch.Tensor, dtypes, shapes, stream)
                if at == len(names):
                    return at
        manifest = self.manifest()
        entries = {name: (dtype, tuple(shape)) for name, dtype, shape, _s, _o, _c in manifest}
        unknown = [name for name in target if name not in entries]
        missing = [name for name in entries if name not in target] if strict else []
        if unknown or missing:
            raise ArgumentError(
                f"weight set {self.name!r} generation {self.generation}: names differ "
                f"(not in the set: {sorted(unknown)[:5]}, not in the target: {sorted(missing)[:5]})"
            )
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
