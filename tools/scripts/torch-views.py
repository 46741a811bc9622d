"""What torch itself costs to make a weight set's 18,771 tensor views, without gpu-ipc: one strided view of
[18771, 8, 8] bf16 split with ``unbind`` (as ``tensors(torch)`` cuts each run), on the CPU and on CUDA, warm (best and
median of 7, each result dropped before the next) and the first call of the process; beside it ``unbind`` under
``no_grad`` and ``inference_mode``, ``split``, a Python loop of ``as_strided``, ``list()`` and indexing: the floor a
reader's cut is set against (docs/weights.md, "Where a cold read goes"). Without CUDA, the CPU rows only.

    python tools/scripts/torch-views.py
"""

from __future__ import annotations

import gc
import json
import time
from collections.abc import Callable
from typing import Any

import torch

N = 18_771


def best(make: Callable[[], Any], repeat: int = 7) -> tuple[float, float]:
    """Best and median milliseconds of ``repeat`` calls, each result dropped before the next."""
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        made = make()
        times.append(time.perf_counter() - t)
        del made
    times.sort()
    return round(times[0] * 1e3, 2), round(times[repeat // 2] * 1e3, 2)


def rows(device: str) -> dict[str, Any]:
    flat = torch.zeros(N * 64 + 4096, dtype=torch.bfloat16, device=device)
    big = flat.as_strided([N, 8, 8], [64, 8, 1], 0)

    def unbind() -> Any:
        return flat.as_strided([N, 8, 8], [64, 8, 1], 0).unbind(0)

    def no_grad() -> Any:
        with torch.no_grad():
            return unbind()

    def inference() -> Any:
        with torch.inference_mode():
            return unbind()

    t = time.perf_counter()
    first = unbind()
    out: dict[str, Any] = {"unbind, first call": round((time.perf_counter() - t) * 1e3, 2)}
    del first
    out["unbind"] = best(unbind)
    out["unbind, no_grad"] = best(no_grad)
    out["unbind, inference_mode"] = best(inference)
    out["split"] = best(lambda: flat[: N * 64].view(N, 64).split(1))
    out["as_strided per tensor"] = best(lambda: [flat.as_strided([8, 8], [8, 1], 64 * i) for i in range(N)])
    out["list()"] = best(lambda: list(big))
    out["indexing per tensor"] = best(lambda: [big[i] for i in range(N)])
    return out


def main() -> int:
    gc.disable()
    devices = ["cpu"]
    if torch.cuda.is_available():
        torch.zeros(1, device="cuda")
        torch.cuda.synchronize()
        devices.append("cuda")
    result = {device: rows(device) for device in devices}
    for device, got in result.items():
        for what, ms in got.items():
            print(f"{device:4} {what:24} {ms} ms")
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
