"""gpu_ipc.testing.Pattern on the host backend: the Rust examples' pattern, written and checked from Python."""

from __future__ import annotations

import json
import subprocess

import numpy as np
import pytest
from conftest import HEIGHT, WIDTH, example, host_pair, pattern, publish_pattern

import gpu_ipc
from gpu_ipc.testing import Pattern

FRAMES = 100


def test_word_is_the_rust_pattern() -> None:
    for seq in (0, 1, 7, 2**32 + 5):
        expected = pattern(seq, 64 * 4)
        assert [Pattern.word(seq, i) for i in range(64)] == [int(w) for w in expected.view(np.uint32)]
    assert Pattern.word(0, 0) == 0xA5A50000


def test_fill_feeds_a_rust_consumer(sock: str) -> None:
    consumer = subprocess.Popen(
        [example("consumer"), "--backend", "host", "--socket", sock, "--frames", "0", "--json"],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        fill = Pattern()
        with gpu_ipc.Producer(sock, width=WIDTH, height=HEIGHT, slots=4, backend="host") as producer:
            producer.wait_for_consumers(1, timeout=20)
            for _ in range(FRAMES):
                slot = producer.acquire(timeout=5)
                fill.fill(slot)
                producer.publish(slot)
            producer.drain(timeout=10)
        out, _ = consumer.communicate(timeout=20)
    finally:
        consumer.kill()
    assert consumer.returncode == 0, out
    summary = json.loads(out.strip().splitlines()[-1])
    assert summary["frames"] == FRAMES
    assert summary["mismatched_words"] == 0


def test_verify_reads_a_rust_producer(sock: str) -> None:
    producer = subprocess.Popen(
        [example("producer"), "--backend", "host", "--width", str(WIDTH), "--height", str(HEIGHT),
         "--socket", sock, "--frames", str(FRAMES), "--consumers", "1", "--json"],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        check = Pattern()
        frames = 0
        with gpu_ipc.Consumer(sock, backend="host", wait_for_producer=20, timeout=20) as consumer:
            for frame in consumer:
                check.verify(frame)
                frames += 1
        producer.communicate(timeout=20)
    finally:
        producer.kill()
    assert frames == FRAMES
    assert check.mismatches() == 0


def test_a_wrong_frame_is_counted_word_for_word(sock: str) -> None:
    producer, consumer = host_pair(sock)
    with producer, consumer:
        publish_pattern(producer)
        check = Pattern()
        with consumer.next_frame(timeout=5) as frame:
            check.verify(frame)
            assert check.mismatches() == 0
            check.verify(frame, frame.seq + 1)  # every word of another sequence differs
            assert check.mismatches() == frame.nbytes // 4
            check.reset()
            assert check.mismatches() == 0
            raw = np.from_dlpack(frame).reshape(-1)
            np.invert(raw[:8], out=raw[:8])  # every bit of 2 words flipped
            check.verify(frame)
            assert check.mismatches() == 2


def test_misuse_raises(sock: str) -> None:
    producer, consumer = host_pair(sock)
    with producer, consumer:
        check = Pattern()
        slot = producer.acquire(timeout=5)
        check.fill(slot, 3)
        assert np.array_equal(np.from_dlpack(slot).reshape(-1), pattern(3, slot.nbytes))
        producer.publish(slot)
        with pytest.raises(gpu_ipc.ReleasedError):
            check.fill(slot)  # published: the consumers' now
        frame = consumer.next_frame(timeout=5)
        frame.release()
        with pytest.raises(gpu_ipc.ReleasedError):
            check.verify(frame)
        with pytest.raises(TypeError, match="Frame, Slot"):
            check.verify(np.zeros(4, dtype=np.uint32))  # type: ignore[arg-type]


def test_per_frame_counters_leave_out_later_frames(sock: str) -> None:
    producer, consumer = host_pair(sock, slots=4)
    with producer, consumer:
        for _ in range(3):
            publish_pattern(producer)
        check = Pattern(frames=3)
        for _ in range(3):
            with consumer.next_frame(timeout=5) as frame:
                check.verify(frame, 99 if frame.seq == 2 else None)  # frame 2 checked against the wrong frame
        words = WIDTH * HEIGHT * 3 // 4
        assert check.mismatches() == words
        assert check.mismatches(below=2) == 0
        with pytest.raises(ValueError, match="frames 0 to 2"):
            publish_pattern(producer)
            check.verify(consumer.next_frame(timeout=5))
    with pytest.raises(ValueError, match="per-frame counters"):
        Pattern(frames=0)
