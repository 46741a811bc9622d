"""Buffers the bridge allocates itself, so that UCX can reach frames over a GPU path:

- :class:`DeviceLanding` (the receiving end): the sending end WRITEs frames into these ordinary ``cuMemAlloc``
  buffers, and the receiving end copies each one, device to device, into its ring's slot before publishing it.
  UCX's ``cuda_ipc`` transport can export ``cuMemAlloc`` memory (a legacy IPC handle) but not memory that
  ``cuMemCreate`` made for POSIX file descriptors only, which is what the vmm backend's ring is: without landing
  buffers, UCX sends vmm frames over TCP. They are also the bridge's window: one buffer per frame in flight.
- :class:`DeviceStaging` (the sending end): frames copied from ring A's slots into buffers of its own before NIXL
  WRITEs them out, for when UCX refuses to register the imported memory of ring A (``--staging``).
- :class:`HostLanding`: landing buffers in host memory, for the host backend (CI, no GPU).

The device buffers need ``cuda-bindings`` (``pip install cuda-bindings``); calls go through the device's primary
context, the one gpu_ipc uses.
"""

from __future__ import annotations

import ctypes
import importlib
import time
from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from gpu_ipc.bridge_protocol import TIMES_KEPT, BridgeError

CU_STREAM_NON_BLOCKING = 1
CU_EVENT_DEFAULT = 0
TIME_EVERY = 8  # one landing copy in this many is timed (one more event on the stream)
TIME_KEPT = max(1, TIMES_KEPT // TIME_EVERY)


def _driver() -> Any:
    """cuda-python's driver module: cuda-bindings 12.x / 13.x, or the older ``cuda.cuda``."""
    errors = []
    for name in ("cuda.bindings.driver", "cuda.cuda"):
        try:
            return importlib.import_module(name)
        except ImportError as e:
            errors.append(f"{name}: {e}")
    raise BridgeError("the bridge's own GPU buffers (landing and staging) need cuda-bindings "
                      f"(`pip install cuda-bindings`): {'; '.join(errors)}")


class _DeviceBuffers:
    """``count`` buffers of ``nbytes`` on ``device`` in the primary context, and a stream of their own."""

    what = "buffer"

    def __init__(self, nbytes: int, count: int, device: int) -> None:
        if count < 1:
            raise BridgeError(f"{count} {self.what}s: at least one is needed")
        self.drv = _driver()
        self.nbytes = nbytes
        self.ptrs: list[int] = []
        self.stream: Any = None
        self._retained = False
        self._call("cuInit", 0)
        self.dev = self._call("cuDeviceGet", device)
        self.ctx = self._call("cuDevicePrimaryCtxRetain", self.dev)
        self._retained = True
        try:
            with self._current():
                self.stream = self._call("cuStreamCreate", CU_STREAM_NON_BLOCKING)
                for _ in range(count):
                    self.ptrs.append(int(self._call("cuMemAlloc", nbytes)))
        except BaseException:
            self.close()
            raise

    def _call(self, name: str, *args: Any) -> Any:
        result = getattr(self.drv, name)(*args)
        err = result[0]
        if err != self.drv.CUresult.CUDA_SUCCESS:
            raise BridgeError(f"{name} failed with {err!r} ({self.what}s of {self.nbytes} bytes)")
        return result[1] if len(result) > 1 else None

    @contextmanager
    def _current(self) -> Iterator[None]:
        """The primary context current on this thread for the block."""
        self._call("cuCtxPushCurrent", self.ctx)
        try:
            yield
        finally:
            self._call("cuCtxPopCurrent")

    def _release(self) -> None:
        """Frees what subclasses hold besides the buffers (inside the pushed context)."""

    def close(self) -> None:
        """Waits for the stream's work, frees the buffers and gives the context back; idempotent."""
        if not self._retained:
            return
        with self._current():
            if self.stream is not None:
                self._call("cuStreamSynchronize", self.stream)
            self._release()
            for ptr in self.ptrs:
                self._call("cuMemFree", ptr)
            if self.stream is not None:
                self._call("cuStreamDestroy", self.stream)
        self.ptrs = []
        self.stream = None
        self._call("cuDevicePrimaryCtxRelease", self.dev)
        self._retained = False


class DeviceStaging(_DeviceBuffers):
    """The sending end's staging buffers: one per frame in flight (``lanes``), each written by one device-to-device
    copy that is waited for before NIXL reads it. Copies take ``copy_s`` seconds in all (measured on the CPU)."""

    what = "staging buffer"

    def __init__(self, nbytes: int, device: int, lanes: int = 1) -> None:
        super().__init__(nbytes, lanes, device)
        self.copies = 0
        self.copy_s = 0.0

    @property
    def ptr(self) -> int:
        """The first buffer's address."""
        return self.ptrs[0]

    def copy_in(self, src: int, nbytes: int, lane: int = 0) -> int:
        """Copies ``nbytes`` from device address ``src`` into buffer ``lane``, waits for it, returns its address."""
        if nbytes > self.nbytes:
            raise BridgeError(f"a frame of {nbytes} bytes for a staging buffer of {self.nbytes}")
        dst = self.ptrs[lane]
        started = time.perf_counter()
        with self._current():
            self._call("cuMemcpyDtoDAsync", dst, src, nbytes, self.stream)
            self._call("cuStreamSynchronize", self.stream)
        self.copy_s += time.perf_counter() - started
        self.copies += 1
        return dst


class DeviceLanding(_DeviceBuffers):
    """The receiving end's landing buffers (``count``: the window). :meth:`copy_out` queues a buffer's copy into a
    slot of the ring on this object's stream (``stream_handle``: publish the slot on it, so that the ring's
    consumers see the frame only after the copy); :meth:`done` says when the buffer may be written again. One copy
    in :data:`TIME_EVERY` is timed on the GPU (a pair of events); :meth:`copy_times_us` has those times.

    The per-frame calls (:meth:`copy_out`, :meth:`done`) run once or more per frame, so they push no context: call
    :meth:`enter` first, on the thread that makes them (it makes the primary context current there, as gpu_ipc's
    own calls leave it)."""

    what = "landing buffer"

    def __init__(self, nbytes: int, count: int, device: int) -> None:
        self.begun: list[Any] = []
        self.ended: list[Any] = []
        self.pending = [False] * count
        self.timed = [False] * count  # whether the buffer's pending copy is one of the timed ones
        self.copies = 0
        self.times_us: deque[float] = deque(maxlen=TIME_KEPT)
        super().__init__(nbytes, count, device)
        try:
            with self._current():
                for _ in range(count):
                    self.begun.append(self._call("cuEventCreate", CU_EVENT_DEFAULT))
                    self.ended.append(self._call("cuEventCreate", CU_EVENT_DEFAULT))
        except BaseException:
            self.close()
            raise
        drv = self.drv
        # Looked up once: the driver's calls a frame makes.
        self._record, self._copy, self._query = drv.cuEventRecord, drv.cuMemcpyDtoDAsync, drv.cuEventQuery
        self._ok, self._not_ready = drv.CUresult.CUDA_SUCCESS, drv.CUresult.CUDA_ERROR_NOT_READY

    @property
    def stream_handle(self) -> int:
        """The raw ``CUstream`` of the copies (what ``Producer.publish(slot, stream=...)`` takes)."""
        return int(self.stream)

    def enter(self) -> None:
        """Makes the device's primary context current on the calling thread, for :meth:`copy_out` and :meth:`done`."""
        self._call("cuCtxSetCurrent", self.ctx)

    def _check(self, result: Any, what: str) -> None:
        if result[0] != self._ok:
            raise BridgeError(f"{what} failed with {result[0]!r} (landing buffers of {self.nbytes} bytes; the "
                              "thread's current context is the device's primary one? see DeviceLanding.enter)")

    def copy_out(self, index: int, dst: int) -> None:
        """Queues the copy of buffer ``index`` into device address ``dst`` (a slot of the ring)."""
        timed = self.copies % TIME_EVERY == 0
        self.copies += 1
        if timed:
            self._check(self._record(self.begun[index], self.stream), "cuEventRecord")
        self._check(self._copy(dst, self.ptrs[index], self.nbytes, self.stream), "cuMemcpyDtoDAsync")
        self._check(self._record(self.ended[index], self.stream), "cuEventRecord")
        self.pending[index] = True
        self.timed[index] = timed

    def done(self, index: int) -> bool:
        """Whether buffer ``index``'s last copy is complete (its time noted then, for a timed one)."""
        if not self.pending[index]:
            return True
        err = self._query(self.ended[index])[0]
        if err == self._not_ready:
            return False
        if err != self._ok:
            raise BridgeError(f"cuEventQuery failed with {err!r} (the copy out of landing buffer {index})")
        if self.timed[index]:
            # The copy's time, best effort (the name has had a _v2 spelling): a run never fails for a figure.
            elapsed = getattr(self.drv, "cuEventElapsedTime", None) or getattr(self.drv, "cuEventElapsedTime_v2")
            result = elapsed(self.begun[index], self.ended[index])
            if result[0] == self._ok:
                self.times_us.append(float(result[1]) * 1e3)
        self.pending[index] = False
        return True

    def copy_times_us(self) -> list[float]:
        """The GPU time of the timed copies done so far (one in :data:`TIME_EVERY`, the latest kept), in
        microseconds."""
        return list(self.times_us)

    def _release(self) -> None:
        for event in [*self.begun, *self.ended]:
            self._call("cuEventDestroy", event)
        self.begun, self.ended = [], []


class HostLanding:
    """Landing buffers in host memory (the host backend): the copy into the ring's slot is a ``memmove``."""

    def __init__(self, nbytes: int, count: int) -> None:
        if count < 1:
            raise BridgeError(f"{count} landing buffers: at least one is needed")
        self.nbytes = nbytes
        self._buffers = [ctypes.create_string_buffer(max(nbytes, 1)) for _ in range(count)]
        self.ptrs = [ctypes.addressof(b) for b in self._buffers]
        self.times_us: deque[float] = deque(maxlen=TIMES_KEPT)

    @property
    def stream_handle(self) -> None:
        """No stream: each copy is done when :meth:`copy_out` returns."""
        return None

    def enter(self) -> None:
        """Nothing to ready: host copies."""

    def copy_out(self, index: int, dst: int) -> None:
        started = time.perf_counter()
        ctypes.memmove(dst, self.ptrs[index], self.nbytes)
        self.times_us.append((time.perf_counter() - started) * 1e6)

    def done(self, index: int) -> bool:
        return True

    def copy_times_us(self) -> list[float]:
        return list(self.times_us)

    def close(self) -> None:
        self._buffers = []
        self.ptrs = []
