"""The cut of a generation's tensors by runs (``Reader.tensors(numpy)``, ``Publisher.stage(numpy)``: one strided
view per run of tensors alike, split in C) gives exactly the tensors the per-tensor path gives: the same names in
the same order, element types, shapes, strides, addresses and bytes, for layouts an owner makes and odd ones it
does not (strided tensors, 0-d tensors, offsets off the 256-byte grid, mixed element types, runs of one); and the
native read of an update's sources takes exactly the tensors that pass every check."""

from __future__ import annotations

import types
from typing import Any

import numpy as np
import pytest

import gpu_ipc
import gpu_ipc.weights
from gpu_ipc import _gpu_ipc
from gpu_ipc._weights_tensors import _cut


def moe_like() -> dict[str, np.ndarray]:
    """Names interleaved across shapes and element types, as a mixture of experts' state_dict is: every tensor
    holds its own index, so any mix-up shows."""
    rng = np.random.default_rng(7)
    sd: dict[str, np.ndarray] = {"embed": rng.standard_normal((33, 8)).astype(np.float32)}
    for layer in range(3):
        p = f"layers.{layer}."
        sd[p + "norm"] = rng.standard_normal((8,)).astype(np.float16)
        sd[p + "router"] = rng.standard_normal((5, 8)).astype(np.float32)
        for e in range(7):
            sd[f"{p}experts.{e}.gate"] = rng.standard_normal((3, 8)).astype(np.float16)
            sd[f"{p}experts.{e}.up"] = rng.standard_normal((3, 8)).astype(np.float16)
            sd[f"{p}experts.{e}.down"] = rng.standard_normal((8, 3)).astype(np.float16)
        sd[p + "step"] = np.array(layer, dtype=np.int64)  # 0-d
        sd[p + "mask"] = rng.integers(0, 2, (3,)).astype(np.bool_)
        sd[p + "codes"] = rng.integers(-100, 100, (7,)).astype(np.int8)  # 7 bytes: padded to 256 like the rest
    sd["lm_head"] = rng.standard_normal((33, 8)).astype(np.float32)  # the embedding's shape again, far from it
    return sd


def describe(a: np.ndarray) -> tuple[Any, ...]:
    """What must be equal between the two paths: element type, shape, strides, address, bytes."""
    return (a.dtype, a.shape, a.strides, a.__array_interface__["data"][0], a.tobytes())


def test_the_run_cut_gives_the_per_tensor_tensors(sock: str) -> None:
    sd = moe_like()
    with gpu_ipc.weights.publish(sd, "moe", socket=sock):
        with gpu_ipc.weights.open(sock, "moe") as r:
            cut = r.tensors(np)
            views = r.tensors()
            per_tensor = {name: np.from_dlpack(view) for name, view in views.items()}
            assert list(cut) == list(per_tensor) == list(sd), "the publisher's order"
            for name, a in cut.items():
                assert describe(a) == describe(per_tensor[name]), name
                assert np.array_equal(a, sd[name]), name
            _arena, (names, runs, order) = r._reader.arena()
            assert names == list(sd) and sorted(order) == list(range(len(sd)))
            # The owner groups the tensors by element type and shape: one run per kind, however interleaved the
            # names (embed and lm_head, the experts' gate and up across layers, every layer's 0-d step).
            kinds = {(str(a.dtype), a.shape) for a in sd.values()}
            assert len(runs) == len(kinds)
            by_shape = {(dtype, tuple(shape)): count for dtype, count, shape, _st, _o, _s in runs}
            assert by_shape[("float16", (3, 8))] == 42 and by_shape[("float32", (33, 8))] == 2
            assert by_shape[("int64", ())] == 3
            # Every offset the manifest names is where its run puts the tensor.
            laid = [offset + k * step for _d, count, _sh, _st, offset, step in runs for k in range(count)]
            manifest_offsets = [offset for _n, _d, _sh, _st, offset, _c in r.manifest()]
            assert [laid[p] for p in order] == manifest_offsets
            assert all(o % 256 == 0 for o in manifest_offsets)


def test_the_staged_cut_writes_where_the_per_tensor_views_read(sock: str) -> None:
    sd = moe_like()
    with gpu_ipc.weights.publish(sd, "moe", socket=sock) as pub:
        staged = pub.stage(np)
        assert list(staged) == list(sd)
        for k, (name, a) in enumerate(staged.items()):
            assert a.flags.writeable and a.shape == sd[name].shape and a.dtype == sd[name].dtype, name
            a[...] = (k % 2) if a.dtype == np.bool_ else k % 100
        del staged, a
        pub.commit()
        with gpu_ipc.weights.open(sock, "moe") as r:
            for k, (name, view) in enumerate(r.tensors().items()):
                a = np.from_dlpack(view)
                assert np.all(a == ((k % 2) if a.dtype == np.bool_ else k % 100)), name


ODD_ENTRIES: list[tuple[str, list[int], list[int] | None, int]] = [
    ("float32", [4, 3], [1, 4], 256),  # transposed (non-contiguous)
    ("float32", [4, 3], [1, 4], 320),  # the same, 64 bytes on: a run with a step that is not the span
    ("float32", [4, 3], None, 1024),  # contiguous, same shape: another run
    ("int64", [], None, 1096),  # 0-d, off the 256-byte grid
    ("int64", [], None, 1104),
    ("int64", [], None, 1112),
    ("float16", [5], None, 1122),  # 2-byte aligned only
    ("float16", [5], None, 1132),
    ("uint8", [3], None, 1141),  # odd offset: fine for 1-byte elements
    ("float32", [2, 2], [2, 1], 1536),  # explicit strides equal to the contiguous ones
    ("float32", [2], [2], 1600),  # every other element
    ("float32", [4, 3], [1, 4], 384),  # breaks the first run's step: a run of one
    ("bool", [2, 1], None, 1700),
]


def arena_bytes() -> np.ndarray:
    return (np.arange(2048, dtype=np.int64) * 2654435761 % 251).astype(np.uint8)


def per_tensor(arena: np.ndarray, dtype: str, shape: list[int], strides: list[int] | None, offset: int) -> np.ndarray:
    size = np.dtype(dtype).itemsize
    byte_strides = None if strides is None else [s * size for s in strides]
    return np.ndarray(tuple(shape), np.dtype(dtype), buffer=arena, offset=offset, strides=byte_strides)


@pytest.mark.parametrize("writable", [False, True])
def test_odd_layouts_cut_by_runs_equal_the_per_tensor_views(writable: bool) -> None:
    runs, order = _gpu_ipc._weights_runs(ODD_ENTRIES)
    assert sorted(order) == list(range(len(ODD_ENTRIES)))
    assert sum(count for _d, count, _sh, _st, _o, _s in runs) == len(ODD_ENTRIES)
    assert 1 in {count for _d, count, _sh, _st, _o, _s in runs} and max(r[1] for r in runs) == 3
    arena = arena_bytes()
    names = [f"t{i}" for i in range(len(ODD_ENTRIES))]
    cut = _cut(arena, (names, runs, order), np, lambda: {}, writable=writable)
    assert list(cut) == names
    for name, (dtype, shape, strides, offset) in zip(names, ODD_ENTRIES):
        assert describe(cut[name]) == describe(per_tensor(arena, dtype, shape, strides, offset)), name


def test_a_run_of_a_type_the_framework_lacks_falls_back_to_one_import_per_tensor() -> None:
    entries = [("bfloat16", [2], None, 256), ("float32", [2], None, 512), ("bfloat16", [2], None, 768)]
    runs, order = _gpu_ipc._weights_runs(entries)
    arena = arena_bytes()
    names = ["a", "b", "c"]
    asked: list[str] = []

    class View:
        def __init__(self, name: str) -> None:
            self.name, self.generation = name, 0

    def from_dlpack(x: Any) -> Any:
        if isinstance(x, View):
            asked.append(x.name)
            return x.name
        return np.from_dlpack(x)

    # NumPy as far as the cut is concerned, with its own from_dlpack (NumPy has no bfloat16).
    framework = types.SimpleNamespace(__name__="numpy", from_dlpack=from_dlpack, dtype=np.dtype, ndarray=np.ndarray)

    class Arena:
        generation = 0

        def __dlpack__(self, **kwargs: Any) -> Any:
            return arena.__dlpack__(**kwargs)

        def __dlpack_device__(self) -> Any:
            return arena.__dlpack_device__()

    got = _cut(Arena(), (names, runs, order), framework, lambda: {n: View(n) for n in names})
    assert list(got) == names and got["a"] == "a" and got["c"] == "c" and asked == ["a", "c"]
    assert describe(got["b"]) == describe(per_tensor(arena, "float32", [2], None, 512))


def test_runs_of_a_bad_entry_say_which() -> None:
    with pytest.raises(gpu_ipc.ArgumentError, match="entry 1: offset 258 is not a whole number"):
        _gpu_ipc._weights_runs([("float32", [1], None, 256), ("float32", [1], None, 258)])
    with pytest.raises(gpu_ipc.ArgumentError, match="entry 0"):
        _gpu_ipc._weights_runs([("float32", [0], None, 256)])
    with pytest.raises(gpu_ipc.ArgumentError, match="entry 0"):
        _gpu_ipc._weights_runs([("float128", [1], None, 256)])


def test_an_empty_tensor_is_refused_when_published(sock: str) -> None:
    with pytest.raises(gpu_ipc.ArgumentError, match="empty.*extent 0"):
        gpu_ipc.weights.publish({"w": np.zeros(2, np.float32), "empty": np.zeros((0, 4), np.float32)}, "m", socket=sock)


class Dtype:
    """A stand-in for a torch dtype: compared by identity."""


class FakeTensor:
    """A stand-in for a torch tensor with the getters the native read calls."""

    def __init__(self, dtype: Any, shape: tuple[int, ...], ptr: int, device: int = 0, contiguous: bool = True):
        self.dtype, self.shape, self._ptr, self._device, self._contiguous = dtype, shape, ptr, device, contiguous

    def get_device(self) -> int:
        return self._device

    def is_contiguous(self) -> bool:
        return self._contiguous

    def data_ptr(self) -> int:
        return self._ptr


class NotATensor(FakeTensor):
    pass


def test_the_native_source_read_stops_at_the_first_tensor_that_fails_a_check() -> None:
    f16, f32 = Dtype(), Dtype()
    n = 300  # more than the first batch of 64: the read goes on across batches
    names = [f"w{i}" for i in range(n)]
    dtypes: list[Any] = [f16 if i % 3 else f32 for i in range(n)]
    shapes = [(2, i % 5 + 1) for i in range(n)]
    good = {name: FakeTensor(dtypes[i], shapes[i], 4096 * (i + 1)) for i, name in enumerate(names)}
    ptrs, stop = _gpu_ipc._weights_read_sources(good, names, 0, FakeTensor, dtypes, shapes, 0)
    assert (ptrs, stop) == ([4096 * (i + 1) for i in range(n)], n)
    ptrs, stop = _gpu_ipc._weights_read_sources(good, names, 250, FakeTensor, dtypes, shapes, 0)
    assert (ptrs, stop) == ([4096 * (i + 1) for i in range(250, n)], n)
    bad_ones: list[tuple[str, Any]] = [
        ("a wrong dtype", FakeTensor(Dtype(), shapes[200], 1)),
        ("a wrong shape", FakeTensor(dtypes[200], (2, 9), 1)),
        ("another device", FakeTensor(dtypes[200], shapes[200], 1, device=1)),
        ("on the host", FakeTensor(dtypes[200], shapes[200], 1, device=-1)),
        ("not contiguous", FakeTensor(dtypes[200], shapes[200], 1, contiguous=False)),
        ("a null pointer", FakeTensor(dtypes[200], shapes[200], 0)),
        ("not a tensor", object()),
    ]
    for what, bad in bad_ones:
        tensors = dict(good, w200=bad)
        ptrs, stop = _gpu_ipc._weights_read_sources(tensors, names, 0, FakeTensor, dtypes, shapes, 0)
        assert stop == 200 and ptrs == [4096 * (i + 1) for i in range(200)], what
    missing = {k: v for k, v in good.items() if k != "w7"}
    assert _gpu_ipc._weights_read_sources(missing, names, 0, FakeTensor, dtypes, shapes, 0)[1] == 7
    assert _gpu_ipc._weights_read_sources(good, names, 0, NotATensor, dtypes, shapes, 0) == ([], 0), "another type"
    with pytest.raises(gpu_ipc.ArgumentError, match="one of each per tensor"):
        _gpu_ipc._weights_read_sources(good, names, 0, FakeTensor, dtypes[:-1], shapes, 0)
