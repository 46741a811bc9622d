"""The bridge over NIXL between processes, on the host backend (DRAM through UCX: no GPU needed): ring A in this
process -> `python -m gpu_ipc.bridge send` -> `python -m gpu_ipc.bridge receive` -> ring B -> a consumer here.

Where NIXL cannot be loaded the tests that need it are reported by pytest as skipped, with the reason
(scripts/python-test.sh installs the pinned wheel when it can fetch it); with GPU_IPC_TEST_NIXL=1 they fail
instead, so a run that asked for NIXL never passes without it."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from conftest import HEIGHT, WIDTH, pattern, publish_pattern

import gpu_ipc
from gpu_ipc.bridge_nixl import _PREFIX, NixlMissing, ProtocolTables, load_nixl, transport_findings

try:
    load_nixl()
    NIXL_REASON = ""
except NixlMissing as e:
    NIXL_REASON = str(e)

NIXL_ASKED = os.environ.get("GPU_IPC_TEST_NIXL") == "1"


@pytest.fixture
def nixl() -> None:
    """NIXL loads, or the test is skipped saying why (failed with GPU_IPC_TEST_NIXL=1)."""
    if not NIXL_REASON:
        return
    if NIXL_ASKED:
        pytest.fail(f"GPU_IPC_TEST_NIXL=1 asks for the NIXL tests and NIXL cannot be loaded: {NIXL_REASON}")
    pytest.skip(f"{NIXL_REASON} (scripts/python-test.sh installs the pinned wheel when it can fetch it; "
                "GPU_IPC_TEST_NIXL=1 makes this a failure)")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Bridge:
    """Ring A (a host producer in this process, 3 slots), both ends of the bridge as processes, ring B's socket."""

    def __init__(self, tmp: str) -> None:
        self.sock_a, self.sock_b, self.port = f"{tmp}/a.sock", f"{tmp}/b.sock", free_port()
        self.producer = gpu_ipc.Producer(self.sock_a, width=WIDTH, height=HEIGHT, slots=3, backend="host")
        common = ["--backend", "host", "--port", str(self.port), "--peer-timeout", "0.5"]
        self.receiver = subprocess.Popen(
            [sys.executable, "-m", "gpu_ipc.bridge", "receive", "--socket", self.sock_b, "--slots", "2", *common],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.sender = subprocess.Popen(
            [sys.executable, "-m", "gpu_ipc.bridge", "send", "--socket", self.sock_a, "--connect", "127.0.0.1",
             *common], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.consumer: gpu_ipc.Consumer | None = None
        try:
            self.producer.wait_for_consumers(1, timeout=30)
            self.consumer = gpu_ipc.Consumer(self.sock_b, backend="host", name="reader", wait_for_producer=30,
                                             timeout=30)
        except BaseException:
            self.close()
            raise

    @property
    def reader(self) -> gpu_ipc.Consumer:
        assert self.consumer is not None
        return self.consumer

    def result(self, proc: subprocess.Popen[str], timeout: float = 20) -> tuple[int, dict[str, Any], str]:
        out, err = proc.communicate(timeout=timeout)
        lines = [line for line in out.splitlines() if line.startswith("{")]
        return proc.returncode, json.loads(lines[-1]) if lines else {}, err

    def close(self) -> None:
        for p, side in ((self.sender, "send"), (self.receiver, "receive")):
            if p.poll() is None:
                p.kill()
            if p.stdout is not None and not p.stdout.closed:
                out, err = p.communicate(timeout=10)
                # What each end said, for a failing test's report.
                print(f"--- {side} (exit {p.returncode})\n{out}{err}", file=sys.stderr)
        if self.consumer is not None:
            self.consumer.close()
        self.producer.close()


@pytest.fixture
def bridge(nixl: None, tmp_path: Any) -> Iterator[Bridge]:
    b = Bridge(str(tmp_path))
    yield b
    b.close()


def feed(b: Bridge, frames: int, ahead: list[int], released: list[int], stop: threading.Event) -> None:
    for _ in range(frames):
        if stop.is_set():
            return
        try:
            seq = publish_pattern(b.producer, timeout=10)
        except gpu_ipc.GpuIpcError:
            return
        ahead.append(seq + 1 - released[0])
    b.producer.close()


def read_all(b: Bridge, delay: float, released: list[int]) -> tuple[int, int, int]:
    """Reads ring B to its end: (frames read, mismatched bytes, frames published)."""
    bad = read = 0
    while True:
        try:
            frame = b.reader.next_frame(timeout=20)
        except gpu_ipc.EndOfStream as end:
            return read, bad, end.published
        got = np.from_dlpack(frame).reshape(-1)
        bad += int(np.count_nonzero(got != pattern(frame.seq, frame.nbytes)))
        time.sleep(delay)
        b.reader.release(frame)
        read += 1
        released[0] = read


@pytest.mark.parametrize("delay", [0.0, 0.01], ids=["fast-reader", "slow-reader"])
def test_frames_cross_intact_with_back_pressure(bridge: Bridge, delay: float) -> None:
    frames, released, stop = 60, [0], threading.Event()
    ahead: list[int] = []
    t = threading.Thread(target=feed, args=(bridge, frames, ahead, released, stop))
    t.start()
    read, bad, published = read_all(bridge, delay, released)
    t.join(20)
    assert (read, bad, published) == (frames, 0, frames)
    rc_s, sent, err_s = bridge.result(bridge.sender)
    rc_r, got, err_r = bridge.result(bridge.receiver)
    assert rc_s == 0, err_s
    assert rc_r == 0, err_r
    assert sent["frames"] == frames and sent["outcome"] == "end of stream"
    assert got["frames"] == frames and got["outcome"] == "end of stream"
    assert sent["ucx_writes"], "UCX's protocol tables were not read"
    # Ring A's 3 slots, ring B's 2 and the frame the sending end holds, at most (a slow reader fills them).
    assert max(ahead) <= 3 + 2 + 1, ahead
    if delay:
        assert max(ahead) >= 4, ahead


@pytest.mark.parametrize("victim", ["sender", "receiver"])
def test_a_killed_end_is_an_error_on_the_other_within_a_second(bridge: Bridge, victim: str) -> None:
    stop, released = threading.Event(), [0]
    t = threading.Thread(target=feed, args=(bridge, 100_000, [], released, stop))
    t.start()
    try:
        for _ in range(20):  # mid-stream
            with bridge.reader.next_frame(timeout=20):
                pass
        killed, other = ((bridge.sender, bridge.receiver) if victim == "sender"
                         else (bridge.receiver, bridge.sender))
        killed.send_signal(signal.SIGKILL)
        started = time.monotonic()
        rc, summary, err = bridge.result(other, timeout=10)
        took = time.monotonic() - started
        assert rc == 1, err
        assert summary["outcome"] == "error"
        assert took < 1.0, f"the other end took {took:.2f} s: {err}"
        if victim == "sender":
            # The receiving end left ring B as a death, not a clean end.
            with pytest.raises(gpu_ipc.ProducerGone):
                while True:
                    with bridge.reader.next_frame(timeout=5):
                        pass
            assert "PeerGone" in err
    finally:
        stop.set()
        t.join(20)


TABLE = """\
[1795646055.341109] [vm:27533:1]   +--------+-------------+-----------------------------------+
[1795646055.341109] [vm:27533:1]   | send intra-node cfg#1                                    |
[1795646055.341109] [vm:27533:1]   | remote memory write by ucp_put* from cuda memory to cuda |
[1795646055.341109] [vm:27533:1]   +--------+-------------+-----------------------------------+
[1795646055.341109] [vm:27533:1]   | Range  | Description |              Config               |
[1795646055.341109] [vm:27533:1]   +--------+-------------+-----------------------------------+
[1795646055.341109] [vm:27533:1]   | 0..inf | zero-copy   | tcp/lo                            |
[1795646055.341109] [vm:27533:1]   +--------+-------------+-----------------------------------+
[1795646055.345532] [vm:27533:1]   | send self cfg#0                                          |
[1795646055.345532] [vm:27533:1]   | remote memory write by ucp_put* from cuda memory to cuda |
[1795646055.345532] [vm:27533:1]   | Range  | Description |              Config               |
[1795646055.345532] [vm:27533:1]   | 0..inf | zero-copy   | cuda_copy/cuda                    |
"""


def test_ucx_tables_name_the_transport_and_tcp_for_gpu_frames_is_a_warning() -> None:
    tables = ProtocolTables()
    tables.lines = [_PREFIX.sub("", line) for line in TABLE.splitlines()]
    writes = tables.write_transports()
    assert writes == {"intra-node: remote memory write by ucp_put* from cuda memory to cuda": ["tcp/lo"]}
    account, warning = transport_findings(writes, "VRAM")
    assert "tcp/lo" in account
    assert warning is not None and "not CUDA IPC or RDMA" in warning
    assert transport_findings({"inter-node: x": ["rc_mlx5/mlx5_0:1"]}, "VRAM")[1] is None
    assert transport_findings(writes, "DRAM")[1] is None
