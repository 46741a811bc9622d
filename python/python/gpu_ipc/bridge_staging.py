"""A staging buffer for the sending end: device memory this process allocated itself, which frames are copied into
(device to device) before NIXL writes them out.

The sending end reads ring A's slots in place, memory it imported from A's producer (CUDA IPC or VMM). UCX may be
unable to register such memory for a transfer: CUDA cannot export an IPC handle of memory that was itself imported.
Then, and with ``--staging always``, each frame takes one extra device-to-device copy, a small cost next to the
transfer. It needs ``cuda-bindings`` (``pip install cuda-bindings``); the host backend never stages.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from gpu_ipc.bridge_protocol import BridgeError


def _driver() -> Any:
    try:
        return importlib.import_module("cuda.bindings.driver")
    except ImportError as e:
        raise BridgeError("staging frames through this process's own GPU memory needs cuda-bindings "
                          f"(`pip install cuda-bindings`): {e}") from e


class DeviceStaging:
    """One buffer of ``nbytes`` on ``device`` (``cuMemAlloc`` in the primary context, the one gpu_ipc uses) and a
    stream of its own for the copies."""

    def __init__(self, nbytes: int, device: int) -> None:
        self.drv = _driver()
        self.nbytes = nbytes
        self._call("cuInit", 0)
        self.dev = self._call("cuDeviceGet", device)
        self.ctx = self._call("cuDevicePrimaryCtxRetain", self.dev)
        self.ptr = 0
        self.stream: Any = None
        with self._current():
            self.ptr = int(self._call("cuMemAlloc", nbytes))
            self.stream = self._call("cuStreamCreate", 1)  # CU_STREAM_NON_BLOCKING

    def _call(self, name: str, *args: Any) -> Any:
        result = getattr(self.drv, name)(*args)
        err = result[0]
        if err != self.drv.CUresult.CUDA_SUCCESS:
            raise BridgeError(f"{name} failed with {err!r} (staging buffer of {self.nbytes} bytes)")
        return result[1] if len(result) > 1 else None

    @contextmanager
    def _current(self) -> Iterator[None]:
        """The primary context current on this thread for the block."""
        self._call("cuCtxPushCurrent", self.ctx)
        try:
            yield
        finally:
            self._call("cuCtxPopCurrent")

    def copy_in(self, src: int, nbytes: int) -> int:
        """Copies ``nbytes`` from device address ``src`` into the buffer, waits for it, returns the buffer's address."""
        if nbytes > self.nbytes:
            raise BridgeError(f"a frame of {nbytes} bytes for a staging buffer of {self.nbytes}")
        with self._current():
            self._call("cuMemcpyDtoDAsync", self.ptr, src, nbytes, self.stream)
            self._call("cuStreamSynchronize", self.stream)
        return self.ptr

    def close(self) -> None:
        """Frees the buffer (after its stream's work) and gives the context back; idempotent."""
        if not self.ptr:
            return
        with self._current():
            self._call("cuStreamSynchronize", self.stream)
            self._call("cuStreamDestroy", self.stream)
            self._call("cuMemFree", self.ptr)
        self.ptr = 0
        self._call("cuDevicePrimaryCtxRelease", self.dev)
