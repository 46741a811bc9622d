"""Python and Rust ends of one ring, on the host backend: each side checks the other's frames word for word."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest
from conftest import HEIGHT, WIDTH, example, pattern, publish_pattern

import gpu_ipc

FRAMES = 200


def test_python_producer_to_rust_consumer(sock: str) -> None:
    consumer = subprocess.Popen(
        [example("consumer"), "--backend", "host", "--socket", sock, "--frames", "0", "--json"],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        with gpu_ipc.Producer(sock, width=WIDTH, height=HEIGHT, slots=4, backend="host") as producer:
            assert producer.sync == "cpu-spin"  # the host backend's default
            producer.wait_for_consumers(1, timeout=20)
            for _ in range(FRAMES):
                publish_pattern(producer)
            producer.drain(timeout=10)
        out, _ = consumer.communicate(timeout=20)
    finally:
        consumer.kill()
    assert consumer.returncode == 0, out
    summary = json.loads(out.strip().splitlines()[-1])
    assert summary["frames"] == FRAMES
    assert summary["mismatched_words"] == 0
    assert summary["end_of_stream_after"] == FRAMES


def read_until_end(consumer: gpu_ipc.Consumer, seen: list[int], bad: list[int]) -> None:
    for frame in consumer:
        if not np.array_equal(np.from_dlpack(frame).reshape(-1), pattern(frame.seq, frame.nbytes)):
            bad.append(frame.seq)
        seen.append(frame.seq)


@pytest.mark.parametrize("sync", ["cpu-spin", "cpu-sleep"])
def test_rust_producer_to_python_consumers(sock: str, sync: str) -> None:
    producer = subprocess.Popen(
        [example("producer"), "--backend", "host", "--sync", sync, "--width", str(WIDTH), "--height", str(HEIGHT),
         "--socket", sock, "--frames", str(FRAMES), "--consumers", "2", "--json"],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        consumers = [
            gpu_ipc.Consumer(sock, backend="host", name=f"py{i}", wait_for_producer=20) for i in range(2)
        ]
        assert consumers[0].shape == (HEIGHT, WIDTH, 3) and consumers[0].dtype == "uint8"
        assert consumers[0].sync == sync
        results: list[tuple[list[int], list[int]]] = [([], []) for _ in consumers]
        threads = [
            threading.Thread(target=read_until_end, args=(c, *r)) for c, r in zip(consumers, results, strict=True)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        out, _ = producer.communicate(timeout=20)
    finally:
        producer.kill()
    assert producer.returncode == 0, out
    for seen, bad in results:
        assert seen == list(range(FRAMES))
        assert bad == []
    for c in consumers:
        c.close()


def test_sigkilled_python_consumer_does_not_stop_the_producer(sock: str) -> None:
    frames = 3000
    producer = subprocess.Popen(
        [example("producer"), "--backend", "host", "--sync", "cpu-sleep", "--width", str(WIDTH), "--height",
         str(HEIGHT), "--socket", sock, "--frames", str(frames), "--consumers", "2", "--json"],
        stdout=subprocess.PIPE,
        text=True,
    )
    child_script = str(Path(__file__).with_name("consumer_child.py"))
    victim = subprocess.Popen([sys.executable, child_script, sock], stdout=subprocess.PIPE, text=True)
    try:
        assert victim.stdout is not None
        assert victim.stdout.readline().strip() == "attached"
        survivor = gpu_ipc.Consumer(sock, backend="host", name="survivor", wait_for_producer=20)
        seen: list[int] = []
        bad: list[int] = []
        reader = threading.Thread(target=read_until_end, args=(survivor, seen, bad))
        reader.start()
        # Kill the victim mid-stream, once it has read some frames.
        for _ in range(10):
            victim.stdout.readline()
        victim.send_signal(signal.SIGKILL)
        victim.wait(5)
        reader.join(60)
        out, _ = producer.communicate(timeout=30)
    finally:
        victim.kill()
        producer.kill()
    assert producer.returncode == 0, out
    summary = json.loads(out.strip().splitlines()[-1])
    assert summary["frames"] == frames
    assert summary["consumers_lost"] == 1
    assert seen == list(range(frames)) and bad == []
    survivor.close()


def test_a_killed_rust_producer_is_producer_gone_not_the_end(sock: str) -> None:
    producer = subprocess.Popen(
        [example("producer"), "--backend", "host", "--sync", "cpu-sleep", "--width", str(WIDTH), "--height",
         str(HEIGHT), "--socket", sock, "--frames", "0", "--until-stdin-closes", "--consumers", "1"],
        stdin=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
    )
    try:
        consumer = gpu_ipc.Consumer(sock, backend="host", wait_for_producer=20)
        seen = 0
        with pytest.raises(gpu_ipc.ProducerGone) as info:
            for frame in consumer:
                seen += 1
                if seen == 20:
                    producer.send_signal(signal.SIGKILL)
        assert seen >= 20
        assert info.value.pid == producer.pid
        assert not isinstance(info.value, gpu_ipc.EndOfStream)
    finally:
        producer.kill()
        producer.wait(5)
    consumer.close()
