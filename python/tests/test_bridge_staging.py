"""The bridge's own GPU buffers over a fake CUDA driver (cuda-bindings' call shapes on host memory): the sending
end's staging buffers and the receiving end's landing buffers, what they allocate, copy, time and free, and their
errors; and the host landing buffers."""

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
    CUDA_ERROR_NOT_READY = 600


PRIMARY = 0xC7  # the fake's primary context


class FakeDriver:
    """cuda.bindings.driver's functions used by the staging buffer: `(err, value)` tuples, host memory for device."""

    CUresult = CUresult

    def __init__(self, fail: str = "") -> None:
        self.fail = fail
        self.calls: list[str] = []
        self.buffers: dict[int, Any] = {}
        self.depth = 0
        self.events: dict[int, str] = {}  # event -> "created" / "recorded" / "done"
        self.streams: set[int] = set()
        self.ready = True  # whether recorded events are complete when queried
        self.current: Any = None  # the context cuCtxSetCurrent made current

    @property
    def in_context(self) -> bool:
        """Whether the device's primary context is current: pushed, or set for the thread."""
        return self.depth == 1 or self.current == PRIMARY

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
        assert self.in_context, "a copy outside the primary context"
        ctypes.memmove(dst, src, n)
        return (CUresult.CUDA_SUCCESS,)

    def _cuDevicePrimaryCtxRetain(self, dev: Any) -> tuple[Any, ...]:
        return CUresult.CUDA_SUCCESS, PRIMARY

    def _cuCtxSetCurrent(self, ctx: Any) -> tuple[Any, ...]:
        self.current = ctx
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

    def _cuStreamCreate(self, flags: int) -> tuple[Any, ...]:
        handle = 0x5000 + len(self.calls)
        self.streams.add(handle)
        return CUresult.CUDA_SUCCESS, handle

    def _cuStreamDestroy(self, stream: int) -> tuple[Any, ...]:
        self.streams.remove(stream)
        return (CUresult.CUDA_SUCCESS,)

    def _cuEventCreate(self, flags: int) -> tuple[Any, ...]:
        handle = 0x9000 + len(self.calls)
        self.events[handle] = "created"
        return CUresult.CUDA_SUCCESS, handle

    def _cuEventRecord(self, event: int, stream: int) -> tuple[Any, ...]:
        assert self.in_context and stream in self.streams
        self.events[event] = "recorded"
        return (CUresult.CUDA_SUCCESS,)

    def _cuEventQuery(self, event: int) -> tuple[Any, ...]:
        assert self.events[event] == "recorded"
        return (CUresult.CUDA_SUCCESS if self.ready else CUresult.CUDA_ERROR_NOT_READY,)

    def _cuEventElapsedTime(self, begun: int, ended: int) -> tuple[Any, ...]:
        return CUresult.CUDA_SUCCESS, 0.25  # ms

    def _cuEventDestroy(self, event: int) -> tuple[Any, ...]:
        del self.events[event]
        return (CUresult.CUDA_SUCCESS,)


def test_frames_are_copied_into_a_buffer_of_our_own_then_freed(monkeypatch: pytest.MonkeyPatch) -> None:
    drv = FakeDriver()
    monkeypatch.setattr(bridge_staging, "_driver", lambda: drv)
    staging = bridge_staging.DeviceStaging(64, device=0, lanes=2)
    assert len(staging.ptrs) == 2 and all(p in drv.buffers for p in staging.ptrs)
    frame = np.arange(64, dtype=np.uint8)
    ptr = staging.copy_in(frame.ctypes.data, 64)
    assert ptr == staging.ptr and ptr in drv.buffers
    assert ctypes.string_at(ptr, 64) == frame.tobytes()
    assert drv.calls.count("cuStreamSynchronize") == 1  # the copy is waited for before NIXL reads the buffer
    second = staging.copy_in(frame.ctypes.data, 64, lane=1)  # the next WRITE in flight: its own buffer
    assert second == staging.ptrs[1] != ptr
    assert staging.copies == 2 and staging.copy_s > 0
    staging.close()
    staging.close()  # idempotent
    assert drv.buffers == {} and drv.depth == 0 and drv.streams == set()
    assert drv.calls[-1] == "cuDevicePrimaryCtxRelease"
    with pytest.raises(BridgeError, match="a frame of 65 bytes"):
        staging.copy_in(frame.ctypes.data, 65)


def test_landing_buffers_are_copied_into_the_slot_on_their_stream_and_timed(monkeypatch: pytest.MonkeyPatch) -> None:
    drv = FakeDriver()
    monkeypatch.setattr(bridge_staging, "_driver", lambda: drv)
    landing = bridge_staging.DeviceLanding(64, count=3, device=1)
    assert len(landing.ptrs) == 3 and landing.stream_handle in drv.streams
    assert landing.done(0)  # never copied: free
    frame = np.arange(64, dtype=np.uint8)
    ctypes.memmove(landing.ptrs[2], frame.ctypes.data, 64)  # what the sending end WRITEs
    slot = np.zeros(64, dtype=np.uint8)
    drv.ready = False
    landing.enter()  # the streaming thread: the primary context current, no push per copy
    pushes = drv.calls.count("cuCtxPushCurrent")
    landing.copy_out(2, slot.ctypes.data)
    assert slot.tobytes() == frame.tobytes()
    # Queued, not waited for on the CPU: the ring's publish goes on the same stream after it.
    assert "cuStreamSynchronize" not in drv.calls
    assert not landing.done(2)  # the copy still runs: not to be granted again yet
    drv.ready = True
    assert landing.done(2) and landing.copy_times_us() == [250.0]
    assert drv.calls.count("cuCtxPushCurrent") == pushes  # a frame's calls push no context
    # One copy in TIME_EVERY is timed: the first was; the next TIME_EVERY - 1 are not, the one after is.
    for _ in range(bridge_staging.TIME_EVERY):
        landing.copy_out(0, slot.ctypes.data)
        assert landing.done(0)
    assert landing.copy_times_us() == [250.0, 250.0]
    assert drv.calls.count("cuEventRecord") == 2 * 2 + (bridge_staging.TIME_EVERY - 1)
    landing.close()
    assert drv.buffers == {} and drv.events == {} and drv.streams == set() and drv.depth == 0


def test_host_landing_buffers_copy_at_once() -> None:
    landing = bridge_staging.HostLanding(16, count=2)
    frame = bytes(range(16))
    ctypes.memmove(landing.ptrs[1], frame, 16)
    slot = ctypes.create_string_buffer(16)
    landing.copy_out(1, ctypes.addressof(slot))
    assert slot.raw == frame and landing.done(1) and landing.stream_handle is None
    assert len(landing.copy_times_us()) == 1
    with pytest.raises(BridgeError, match="at least one"):
        bridge_staging.HostLanding(16, count=0)


def test_a_failing_driver_call_is_named_and_undoes_what_was_made(monkeypatch: pytest.MonkeyPatch) -> None:
    drv = FakeDriver(fail="cuMemAlloc")
    monkeypatch.setattr(bridge_staging, "_driver", lambda: drv)
    with pytest.raises(BridgeError, match="cuMemAlloc failed .*OUT_OF_MEMORY"):
        bridge_staging.DeviceStaging(64, device=0)
    assert drv.streams == set() and drv.depth == 0 and drv.calls[-1] == "cuDevicePrimaryCtxRelease"
    drv = FakeDriver(fail="cuEventCreate")
    monkeypatch.setattr(bridge_staging, "_driver", lambda: drv)
    with pytest.raises(BridgeError, match="cuEventCreate failed .*landing buffers of 64 bytes"):
        bridge_staging.DeviceLanding(64, count=2, device=0)
    assert drv.buffers == {} and drv.streams == set() and drv.depth == 0
