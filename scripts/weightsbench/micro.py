"""CPU cost per tensor of the two steps the weights benchmark's goals hinge on, without a GPU (host backend, NumPy):
a reader cutting every tensor of a 19,000-tensor mixture-of-experts dict from one import (``Reader.tensors``),
and an update reading its sources' addresses (what ``Publisher.update`` does per tensor before the copies).

    python scripts/weightsbench/micro.py [--repeat 7] [--json OUT.json]

The dict has the benchmark's MoE names and tensor count (``shapes.moe_shapes``) with every extent divided by 64
(distinct shapes stay distinct), in float16 (NumPy has no bfloat16). The source step is measured on stand-ins for
torch tensors whose ``dtype``, ``shape``, ``get_device()``, ``is_contiguous()`` and ``data_ptr()`` are C-level
(torch's own getters cost more: the lead's GPU run measures those, in the update's figures); it compares the
Python passes the package used before (``map`` over the batch per check) with the native read it uses now (when
the installed package has it). Prints one JSON object; the best of ``--repeat`` runs of each step.
"""

from __future__ import annotations

import argparse
import functools
import itertools
import json
import os
import sys
import tempfile
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402

import gpu_ipc.weights  # noqa: E402
from weightsbench.shapes import moe_shapes  # noqa: E402


def scaled_moe() -> dict[str, np.ndarray]:
    return {name: np.zeros(tuple(max(1, d // 64) for d in shape), dtype=np.float16) for name, shape in moe_shapes()}


def best(repeat: int, fn: Any) -> float:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


class Dtype:
    """A stand-in for a torch dtype (compared by identity)."""


class Tensor:
    """A stand-in for a torch tensor whose getters are C-level (``itertools.repeat(x).__next__`` returns x)."""

    __slots__ = ("dtype", "shape", "get_device", "is_contiguous", "data_ptr")

    def __init__(self, dtype: Dtype, shape: tuple[int, ...], ptr: int) -> None:
        self.dtype = dtype
        self.shape = shape
        self.get_device = itertools.repeat(0).__next__
        self.is_contiguous = itertools.repeat(True).__next__
        self.data_ptr = itertools.repeat(ptr).__next__


def python_passes(tensors: list[Any], dtypes: list[Any], shapes: list[Any]) -> list[int] | None:
    """The pointer read of the package before (``_torch_pointers``, per batch of up to 2,048 tensors), with the
    stand-ins' methods called through the instances (torch's are called through ``torch.Tensor``'s descriptors)."""
    out: list[int] = []
    for first in range(0, len(tensors), 2048):
        batch, d, s = tensors[first : first + 2048], dtypes[first : first + 2048], shapes[first : first + 2048]
        if not all(issubclass(kind, Tensor) for kind in set(map(type, batch))):
            return None
        if [t.dtype for t in batch] != d or [t.shape for t in batch] != s:
            return None
        if {t.get_device() for t in batch} != {0} or not all(t.is_contiguous() for t in batch):
            return None
        out.extend(t.data_ptr() for t in batch)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--json")
    args = parser.parse_args()
    sd = scaled_moe()
    n = len(sd)
    result: dict[str, Any] = {"tensors": n, "package": os.path.dirname(gpu_ipc.__file__)}
    with tempfile.TemporaryDirectory(prefix="gpu-ipc-weights-micro-") as tmp:
        sock = os.path.join(tmp, "w.sock")
        with gpu_ipc.weights.publish(sd, "moe", socket=sock) as pub:
            result["update_host_s"] = best(args.repeat, functools.partial(pub.update, sd))
            result["open_s"] = best(args.repeat, lambda: gpu_ipc.weights.open(sock, "moe").close())
            with gpu_ipc.weights.open(sock, "moe") as reader:
                cut = reader.tensors(np)
                assert len(cut) == n and all(cut[k].shape == v.shape for k, v in sd.items())
                del cut
                result["cut_s"] = best(args.repeat, functools.partial(reader.tensors, np))
                result["cut_us_per_tensor"] = result["cut_s"] / n * 1e6
                arena = getattr(reader._reader, "arena")  # noqa: B009 - the native call alone
                result["arena_call_s"] = best(args.repeat, arena)
                result["runs"] = len(arena()[1][1]) if len(arena()[1]) == 3 else None
    dtypes = {name: Dtype() for name in ("float16",)}
    names = list(sd)
    tensors = {k: Tensor(dtypes["float16"], v.shape, 4096 * (i + 1)) for i, (k, v) in enumerate(sd.items())}
    expected_dtypes = [dtypes["float16"]] * n
    expected_shapes = [v.shape for v in sd.values()]
    listed = [tensors[k] for k in names]
    assert python_passes(listed, expected_dtypes, expected_shapes) == [4096 * (i + 1) for i in range(n)]
    result["sources_python_s"] = best(
        args.repeat, lambda: python_passes([tensors[k] for k in names], expected_dtypes, expected_shapes)
    )
    result["sources_python_us_per_tensor"] = result["sources_python_s"] / n * 1e6
    native = getattr(gpu_ipc._gpu_ipc, "_weights_read_sources", None)
    if native is not None:
        got = native(tensors, names, 0, Tensor, expected_dtypes, expected_shapes, 0)
        assert got == ([4096 * (i + 1) for i in range(n)], n), got[1]
        result["sources_native_s"] = best(
            args.repeat, lambda: native(tensors, names, 0, Tensor, expected_dtypes, expected_shapes, 0)
        )
        result["sources_native_us_per_tensor"] = result["sources_native_s"] / n * 1e6
    print(json.dumps(result))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
