"""Rings of tensors (any shape and element type) on the host backend: Python and Rust ends."""

from __future__ import annotations

import json
import subprocess
import threading

import numpy as np
import pytest
from conftest import example, pattern

import gpu_ipc

SHAPE = (4, 8, 16)


def test_python_tensor_ring(sock: str) -> None:
    producer = gpu_ipc.Producer(sock, shape=SHAPE, dtype="float32", slots=2, backend="host")
    assert producer.shape == SHAPE and producer.dtype == "float32" and producer.nbytes == 4 * 8 * 16 * 4
    box: dict[str, gpu_ipc.Consumer] = {}
    t = threading.Thread(target=lambda: box.setdefault("c", gpu_ipc.Consumer(sock, backend="host")))
    t.start()
    producer.wait_for_consumers(1, timeout=10)
    t.join(10)
    consumer = box["c"]
    assert consumer.shape == SHAPE and consumer.dtype == "float32"
    slot = producer.acquire()
    written = np.from_dlpack(slot)
    assert written.shape == SHAPE and written.dtype == np.float32 and written.ctypes.data == slot.ptr
    written[:] = np.arange(np.prod(SHAPE), dtype=np.float32).reshape(SHAPE)
    producer.publish(slot)
    with consumer.next_frame() as frame:
        assert frame.shape == SHAPE and frame.dtype == "float32"
        read = np.from_dlpack(frame)
        assert read.ctypes.data == frame.ptr and read.dtype == np.float32
        assert np.array_equal(read, np.arange(np.prod(SHAPE), dtype=np.float32).reshape(SHAPE))
    producer.close()
    consumer.close()


def test_slot_arguments_are_checked(sock: str) -> None:
    with pytest.raises(ValueError, match="one or the other"):
        gpu_ipc.Producer(sock, shape=SHAPE, width=64, backend="host")
    with pytest.raises(ValueError, match="give shape= too"):
        gpu_ipc.Producer(sock, dtype="float32", backend="host")
    with pytest.raises(ValueError, match="element type"):
        gpu_ipc.Producer(sock, shape=SHAPE, dtype="float128", backend="host")


def test_rust_tensor_producer_to_python_consumer(sock: str) -> None:
    frames = 50
    producer = subprocess.Popen(
        [example("producer"), "--backend", "host", "--sync", "cpu-spin", "--tensor", "f16:8x32", "--socket", sock,
         "--frames", str(frames), "--consumers", "1", "--json"],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        consumer = gpu_ipc.Consumer(sock, backend="host", wait_for_producer=20)
        assert consumer.shape == (8, 32) and consumer.dtype == "float16"
        seen: list[int] = []
        bad: list[int] = []
        for frame in consumer:
            # The pattern covers every word of the slot: compare its bytes.
            data = np.from_dlpack(frame).reshape(-1).view(np.uint8)
            if not np.array_equal(data, pattern(frame.seq, frame.nbytes)[: data.size]):
                bad.append(frame.seq)
            seen.append(frame.seq)
        out, _ = producer.communicate(timeout=20)
    finally:
        producer.kill()
    assert producer.returncode == 0, out
    assert seen == list(range(frames)) and bad == []
    consumer.close()


def test_python_tensor_producer_to_rust_consumer(sock: str) -> None:
    frames = 50
    consumer = subprocess.Popen(
        [example("consumer"), "--backend", "host", "--socket", sock, "--frames", "0", "--json"],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        with gpu_ipc.Producer(sock, shape=(16, 16), dtype="int32", slots=4, backend="host") as producer:
            producer.wait_for_consumers(1, timeout=20)
            for _ in range(frames):
                slot = producer.acquire(timeout=5)
                np.from_dlpack(slot).reshape(-1).view(np.uint8)[:] = pattern(slot.seq, slot.nbytes)
                producer.publish(slot)
            producer.drain(timeout=10)
        out, _ = consumer.communicate(timeout=20)
    finally:
        consumer.kill()
    assert consumer.returncode == 0, out
    summary = json.loads(out.strip().splitlines()[-1])
    assert summary["frames"] == frames and summary["mismatched_words"] == 0
