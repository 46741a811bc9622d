"""The sending end's staging buffer over a fake CUDA driver (cuda-bindings' call shapes on host memory): what it
allocates, copies and frees, and its errors."""

from __future__ import annotations

import ctypes
from enum import Enum
from typing import Any

import numpy as np
import pytest

from gpu_ipc import bridge_staging
from gpu_ipc.bridge_protocol import BridgeError


class CUresult(Enum):
    CUDA_SUCCESS = 0
    CUDA_ERROR_OUT_OF_MEMORY = 2


class FakeDriver:
    """cuda.bindings.driver's functions used by the staging buffer: `(err, value)` tuples, host memory for device."""

    CUresult = CUresult

    def __init__(self, fail: str = "") -> None:
        self.fail = fail
        self.calls: list[str] = []
        self.buffers: dict[int, Any] = {}
        self.depth = 0

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)

        def call(*args: Any) -> tuple[Any, ...]:
            self.calls.append(name)
            if name == self.fail:
                return (CUresult.CUDA_ERROR_OUT_OF_MEMORY,)
            return getattr(self, "_" + name, lambda *a: (CUresult.CUDA_SUCCESS, None))(*args)
        return call

    def _cuMemAlloc(self, n: int) -> tuple[Any, ...]:
        buf = ctypes.create_string_buffer(n)
        self.buffers[ctypes.addressof(buf)] = buf
        return CUresult.CUDA_SUCCESS, ctypes.addressof(buf)

    def _cuMemcpyDtoDAsync(self, dst: int, src: int, n: int, stream: Any) -> tuple[Any, ...]:
        assert self.depth == 1, "a copy outside the pushed context"
        ctypes.memmove(dst, src, n)
        return (CUresult.CUDA_SUCCESS,)

    def _cuCtxPushCurrent(self, ctx: Any) -> tuple[Any, ...]:
        self.depth += 1
        return (CUresult.CUDA_SUCCESS,)

    def _cuCtxPopCurrent(self) -> tuple[Any, ...]:
        self.depth -= 1
        return CUresult.CUDA_SUCCESS, None

    def _cuMemFree(self, ptr: int) -> tuple[Any, ...]:
        del self.buffers[ptr]
        return (CUresult.CUDA_SUCCESS,)


def test_frames_are_copied_into_a_buffer_of_our_own_then_freed(monkeypatch: pytest.MonkeyPatch) -> None:
    drv = FakeDriver()
    monkeypatch.setattr(bridge_staging, "_driver", lambda: drv)
    staging = bridge_staging.DeviceStaging(64, device=0)
    frame = np.arange(64, dtype=np.uint8)
    ptr = staging.copy_in(frame.ctypes.data, 64)
    assert ptr == staging.ptr and ptr in drv.buffers
    assert ctypes.string_at(ptr, 64) == frame.tobytes()
    assert drv.calls.count("cuStreamSynchronize") == 1  # the copy is waited for before NIXL reads the buffer
    staging.close()
    staging.close()  # idempotent
    assert drv.buffers == {} and drv.depth == 0
    assert drv.calls[-1] == "cuDevicePrimaryCtxRelease"
    with pytest.raises(BridgeError, match="a frame of 65 bytes"):
        staging.copy_in(frame.ctypes.data, 65)


def test_a_failing_driver_call_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(bridge_staging, "_driver", lambda: FakeDriver(fail="cuMemAlloc"))
    with pytest.raises(BridgeError, match="cuMemAlloc failed .*OUT_OF_MEMORY"):
        bridge_staging.DeviceStaging(64, device=0)
