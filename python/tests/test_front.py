"""What users writing from the docs alone tripped on (issue 33, the Python part), on the host backend."""

from __future__ import annotations

import json
import pickle
import pydoc
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest
from conftest import example, host_pair, publish_pattern

import gpu_ipc
import gpu_ipc._gpu_ipc as native
from gpu_ipc.testing import Pattern

PYPROJECT = Path(__file__).resolve().parents[1] / "pyproject.toml"


def test_testing_is_an_attribute_after_import_gpu_ipc() -> None:
    # A fresh interpreter: this one imported gpu_ipc.testing above.
    code = "import gpu_ipc; print(gpu_ipc.testing.Pattern.word(0, 0))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert int(out) == 0xA5A50000


def test_open_is_not_in_all_and_still_there() -> None:
    assert "open" not in gpu_ipc.__all__
    assert "open" not in gpu_ipc.weights.__all__ and callable(gpu_ipc.weights.open)
    namespace: dict[str, object] = {}
    exec("from gpu_ipc import *", namespace)
    assert "open" not in namespace and "share" in namespace
    assert callable(gpu_ipc.open)


# 33x7 rgb8: rows of 99 bytes padded to a pitch of 100; the tensor spans 699 bytes, the frame is 700 (175 words).
ODD_WIDTH, ODD_HEIGHT = 33, 7


def test_pattern_checks_a_rust_producers_padded_frames(sock: str) -> None:
    frames = 20
    producer = subprocess.Popen(
        [example("producer"), "--backend", "host", "--width", str(ODD_WIDTH), "--height", str(ODD_HEIGHT),
         "--socket", sock, "--frames", str(frames), "--json"],
        stdout=subprocess.PIPE,
        text=True,
    )
    check, wrong = Pattern(), Pattern()
    seen = 0
    try:
        with gpu_ipc.Consumer(sock, backend="host", wait_for_producer=20) as consumer:
            assert consumer.shape == (ODD_HEIGHT, ODD_WIDTH, 3) and consumer.nbytes == 700
            for frame in consumer:
                check.verify(frame)
                wrong.verify(frame, seq=frame.seq + 1)
                seen += 1
        out, _ = producer.communicate(timeout=20)
    finally:
        producer.kill()
    assert producer.returncode == 0, out
    assert seen == frames
    assert check.mismatches() == 0
    assert wrong.mismatches() == 175 * frames  # every word counts, the padded rows' last one included
    assert json.loads(out.strip().splitlines()[-1])["frames"] == frames


def test_pattern_fills_padded_frames_for_a_rust_consumer(sock: str) -> None:
    frames = 20
    consumer = subprocess.Popen(
        [example("consumer"), "--backend", "host", "--socket", sock, "--frames", "0", "--json"],
        stdout=subprocess.PIPE,
        text=True,
    )
    fill = Pattern()
    try:
        with gpu_ipc.Producer(sock, width=ODD_WIDTH, height=ODD_HEIGHT, slots=4, backend="host") as producer:
            producer.wait_for_consumers(1, timeout=20)
            for _ in range(frames):
                slot = producer.acquire(timeout=5)
                fill.fill(slot)
                producer.publish(slot)
            producer.drain(timeout=10)
        out, _ = consumer.communicate(timeout=20)
    finally:
        consumer.kill()
    assert consumer.returncode == 0, out
    summary = json.loads(out.strip().splitlines()[-1])
    assert summary["frames"] == frames
    assert summary["mismatched_words"] == 0


def test_pattern_fills_every_word_of_a_padded_slot(sock: str) -> None:
    producer = gpu_ipc.Producer(sock, width=ODD_WIDTH, height=ODD_HEIGHT, slots=2, backend="host")
    try:
        slot = producer.acquire(timeout=5)
        Pattern().fill(slot)
        raw = np.from_dlpack(slot, copy=True)
        assert raw.shape == (ODD_HEIGHT, ODD_WIDTH, 3)
        # Through the strided view: the pixel bytes are the pattern's bytes at the pitch's offsets.
        expected = np.array([Pattern.word(slot.seq, i) for i in range(175)], dtype="<u4").view(np.uint8)
        rows = expected.reshape(ODD_HEIGHT, 100)[:, :99].reshape(ODD_HEIGHT, ODD_WIDTH, 3)
        assert np.array_equal(raw, rows)
    finally:
        producer.close()


def test_share_of_a_numpy_array_on_the_host_backend_says_what_to_do(sock: str) -> None:
    array = np.arange(16, dtype=np.float32)
    with pytest.raises(gpu_ipc.BackendError) as info:
        gpu_ipc.share(array, "a", socket=sock)
    message = str(info.value)
    assert "HostFake" not in message and "::" not in message
    assert "capacity=" in message and "pool.alloc(" in message and "numpy.from_dlpack(buffer)" in message
    # What it says works, at the same socket (the failed share left nothing listening there).
    with gpu_ipc.SharedPool(sock, backend="host", capacity=1 << 20) as pool:
        buffer = pool.alloc("a", array.shape, str(array.dtype))
        np.from_dlpack(buffer)[...] = array
        view = gpu_ipc.open(sock, "a", backend="host")
        assert np.array_equal(np.from_dlpack(view), array)
        del view


def test_share_beside_a_pool_of_this_process_names_the_pool(sock: str) -> None:
    with gpu_ipc.SharedPool(sock, backend="host", capacity=1 << 20):
        with pytest.raises(gpu_ipc.WireError) as info:
            gpu_ipc.share(np.zeros(4, dtype=np.uint8), "b", socket=sock)
        message = str(info.value)
        assert "producer" not in message
        assert "SharedPool" in message and "pool.share(obj, name)" in message and "another socket" in message
        with pytest.raises(gpu_ipc.WireError, match="this process has a SharedPool"):
            gpu_ipc.SharedPool(sock, backend="host")
    # Closed: the path is free again.
    gpu_ipc.SharedPool(sock, backend="host").close()


def test_argument_errors_are_gpu_ipc_errors_and_builtin_ones(sock: str) -> None:
    assert issubclass(gpu_ipc.ArgumentError, gpu_ipc.GpuIpcError) and issubclass(gpu_ipc.ArgumentError, ValueError)
    assert issubclass(gpu_ipc.ArgumentTypeError, gpu_ipc.GpuIpcError)
    assert issubclass(gpu_ipc.ArgumentTypeError, TypeError)
    with pytest.raises(gpu_ipc.GpuIpcError, match="backend"):
        gpu_ipc.Producer(sock, width=8, height=8, backend="nope")
    with pytest.raises(ValueError, match="pixel format"):
        gpu_ipc.Producer(sock, width=8, height=8, format="rgb9", backend="host")
    with pytest.raises(gpu_ipc.ArgumentError):
        gpu_ipc.Consumer(sock, backend="host", timeout=-1)
    with pytest.raises(gpu_ipc.ArgumentTypeError, match="__cuda_array_interface__"):
        gpu_ipc.share(object(), "c", socket=sock, backend="host")
    with pytest.raises(gpu_ipc.GpuIpcError, match="Frame, Slot"):
        Pattern().verify(object())  # type: ignore[arg-type]


def test_iteration_keeps_the_end_of_the_stream(sock: str) -> None:
    producer, consumer = host_pair(sock, slots=4)
    assert consumer.end is None
    for _ in range(3):
        publish_pattern(producer)
    closer = threading.Thread(target=producer.close)  # may wait for the consumer to read what was published
    closer.start()
    seen = [frame.seq for frame in consumer]
    closer.join(10)
    assert seen == [0, 1, 2]
    end = consumer.end
    assert isinstance(end, gpu_ipc.EndOfStream)
    assert end.published == 3 and end.past_end is None
    consumer.close()


def test_help_shows_each_exceptions_own_text() -> None:
    assert gpu_ipc.Timeout.__doc__ is not None and "ran out" in gpu_ipc.Timeout.__doc__
    page = pydoc.render_doc(gpu_ipc.Timeout)
    assert "with_traceback" not in page and "add_note" not in page
    assert len(pydoc.render_doc(gpu_ipc).splitlines()) < 1500
    # Still ordinary exceptions: attributes, pickling, the module they are reported in.
    e = gpu_ipc.Timeout("timed out")
    e.waited = 1.5
    assert str(e) == "timed out" and hasattr(e, "with_traceback")
    assert type(pickle.loads(pickle.dumps(e))) is gpu_ipc.Timeout
    assert gpu_ipc.Timeout.__module__ == "gpu_ipc" and gpu_ipc.Timeout is native.Timeout


def test_numpy_is_an_optional_extra() -> None:
    text = PYPROJECT.read_text()
    if sys.version_info >= (3, 11):
        import tomllib

        extras = tomllib.loads(text)["project"]["optional-dependencies"]
        assert any(dep.startswith("numpy") for dep in extras["numpy"])
    else:
        assert "[project.optional-dependencies]" in text
