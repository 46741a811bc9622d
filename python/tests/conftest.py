"""Fixtures of the host-backend suite: short socket paths, the Rust example programs, the frame check pattern."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

import gpu_ipc

ROOT = Path(__file__).resolve().parents[2]
WIDTH, HEIGHT = 64, 32  # rgb8: rows of 192 bytes, no padding; 6144 bytes, 1536 words


def pattern(seq: int, nbytes: int) -> np.ndarray:
    """The bytes of frame `seq` as `kernels/src/pattern.rs` defines them (what the Rust examples fill and check)."""
    index = np.arange(nbytes // 4, dtype=np.uint32)
    x = (index * np.uint32(0x9E3779B1)) ^ np.uint32((seq * 0x85EBCA6B) & 0xFFFFFFFF) ^ np.uint32(0xA5A5A5A5)
    words = x ^ (x >> np.uint32(16))
    return words.astype("<u4").view(np.uint8)


@pytest.fixture(autouse=True)
def ctrl_c_raises() -> Iterator[None]:
    """SIGINT raises KeyboardInterrupt in every test, even when the suite was started with SIGINT ignored (a shell's
    background job: Python then leaves it ignored), so the Ctrl-C tests test the package, not how pytest was run."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, before)


@pytest.fixture
def sock() -> Iterator[str]:
    """A socket path short enough for sun_path (108 bytes), in a directory removed afterwards."""
    d = tempfile.mkdtemp(prefix="gi-", dir="/tmp")
    yield os.path.join(d, "f.sock")
    shutil.rmtree(d, ignore_errors=True)


def example(name: str) -> str:
    """The path of a Rust example program (`producer`, `consumer`), built by scripts/python-test.sh."""
    bin_dir = Path(os.environ.get("GPU_IPC_EXAMPLES_DIR", ROOT / "target" / "debug"))
    path = bin_dir / name
    if not path.exists():
        subprocess.run(["cargo", "build", "-q", "-p", "gpu-ipc-examples", "--bin", name], cwd=ROOT, check=True)
        path = ROOT / "target" / "debug" / name
    return str(path)


def host_pair(
    sock: str, slots: int = 2, sync: str = "cpu-spin", name: str = "py"
) -> tuple[gpu_ipc.Producer, gpu_ipc.Consumer]:
    """A host-backend producer and one consumer attached to it, both in this process."""
    producer = gpu_ipc.Producer(sock, width=WIDTH, height=HEIGHT, slots=slots, sync=sync, backend="host")
    box: dict[str, gpu_ipc.Consumer] = {}
    t = threading.Thread(target=lambda: box.setdefault("c", gpu_ipc.Consumer(sock, backend="host", name=name)))
    t.start()
    producer.wait_for_consumers(1, timeout=10)
    t.join(10)
    return producer, box["c"]


def publish_pattern(producer: gpu_ipc.Producer, timeout: float = 5.0) -> int:
    """Acquires the next slot, writes its pattern through NumPy (in place), publishes it; returns its sequence."""
    slot = producer.acquire(timeout=timeout)
    np.from_dlpack(slot).reshape(-1)[:] = pattern(slot.seq, slot.nbytes)
    producer.publish(slot)
    return slot.seq
