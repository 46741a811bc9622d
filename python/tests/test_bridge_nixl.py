"""The bridge over NIXL between processes, on the host backend (DRAM through UCX: no GPU needed): ring A in this
process -> `python -m gpu_ipc.bridge send` -> `python -m gpu_ipc.bridge receive` -> ring B -> a consumer here.

Where NIXL cannot be loaded the tests that need it are reported by pytest as skipped (a skipif marker with the
reason; scripts/python-test.sh installs the pinned wheel when it can fetch it); with GPU_IPC_TEST_NIXL=1 they fail
instead, so a run that asked for NIXL never passes without it. The tests of UCX's tables need no NIXL."""

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
from gpu_ipc.bridge_nixl import (
    _PREFIX,
    GPU_PATH_GBPS,
    NixlMissing,
    NixlTransport,
    ProtocolTables,
    load_nixl,
    parse_tables,
    path_verdict,
    transport_findings,
    transports_of,
)
from gpu_ipc.bridge_protocol import DEFAULT_WINDOW

try:
    load_nixl()
    NIXL_REASON = ""
except NixlMissing as e:
    NIXL_REASON = str(e)

NIXL_ASKED = os.environ.get("GPU_IPC_TEST_NIXL") == "1"


# Tests that run NIXL are marked: skipped with the reason where it cannot be loaded (pytest -rs lists it), never
# passed; with GPU_IPC_TEST_NIXL=1 they run anyway and the `nixl` fixture fails them.
needs_nixl = pytest.mark.skipif(
    bool(NIXL_REASON) and not NIXL_ASKED,
    reason=f"{NIXL_REASON} (scripts/python-test.sh installs the pinned wheel when it can fetch it; "
           "GPU_IPC_TEST_NIXL=1 makes this a failure)")


@pytest.fixture
def nixl() -> None:
    """NIXL loads, or (GPU_IPC_TEST_NIXL=1: asked for) the test fails saying why."""
    if NIXL_REASON:
        pytest.fail(f"GPU_IPC_TEST_NIXL=1 asks for the NIXL tests and NIXL cannot be loaded: {NIXL_REASON}")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


WINDOW = DEFAULT_WINDOW  # the receiving end's landing buffers (its default)


class Bridge:
    """Ring A (a host producer in this process, 3 slots), both ends of the bridge as processes, ring B's socket;
    ``send_args``: more arguments of the sending end (``--path direct``)."""

    def __init__(self, tmp: str, send_args: tuple[str, ...] = (), slots_b: int = 2) -> None:
        self.sock_a, self.sock_b, self.port = f"{tmp}/a.sock", f"{tmp}/b.sock", free_port()
        self.send_args = send_args
        self.producer = gpu_ipc.Producer(self.sock_a, width=WIDTH, height=HEIGHT, slots=3, backend="host")
        common = ["--backend", "host", "--port", str(self.port), "--peer-timeout", "0.5"]
        self.receiver = subprocess.Popen(
            [sys.executable, "-m", "gpu_ipc.bridge", "receive", "--socket", self.sock_b, "--slots", str(slots_b),
             *common],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.sender = subprocess.Popen(
            [sys.executable, "-m", "gpu_ipc.bridge", "send", "--socket", self.sock_a, "--connect", "127.0.0.1",
             *common, *send_args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
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
def bridge(nixl: None, tmp_path: Any, request: pytest.FixtureRequest) -> Iterator[Bridge]:
    b = Bridge(str(tmp_path), getattr(request, "param", ()))
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


@needs_nixl
@pytest.mark.parametrize("bridge", [(), ("--path", "direct"), ("--expect", "gpu-direct"), ("--nixl-progress-thread",)],
                         ids=["auto", "direct", "expect-gpu-direct", "progress-thread"], indirect=True)
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
    # Each end's CPU time per frame while frames flowed: the process's (NIXL's threads too) and its own thread's.
    for summary in (sent, got):
        assert 0 < summary["thread_cpu_us_per_frame"] <= summary["cpu_us_per_frame"], summary
        if "direct" not in bridge.send_args or summary is sent:  # the receiving end's direct loop is not timed
            assert summary["busy_us_per_frame"] > 0, summary
    assert sent["nixl_progress_thread"] == ("--nixl-progress-thread" in bridge.send_args)
    assert got["nixl_progress_thread"] is False
    direct = "direct" in bridge.send_args
    window = 1 if direct else WINDOW
    assert sent["path"] == got["path"] == ("direct" if direct else "landing")
    assert sent["window"] == got["window"] == window
    assert got["landing_copies"] == (0 if direct else frames)
    # The path from UCX's own table for the probe's WRITEs of the first frame (host memory: no GPU verdict, and
    # --expect gpu-direct has nothing to refuse).
    report = sent["path_report"]
    assert report["how"] == "UCX's protocol table for the probe's WRITEs", report
    assert report["transports"] and report["gpu_direct"] is None and report["gbps"] > 0
    assert sent["probes"] and sent["probes"][-1]["path"] == sent["path"]
    assert sent["ucx_writes"], "UCX's protocol tables were not read"
    # Ring A's 3 slots, the window (landing buffers written and not yet copied into ring B, or ring B's slot held
    # on the direct path) and ring B's 2, at most; a slow reader fills them.
    assert max(ahead) <= 3 + window + 2, ahead
    if delay:
        assert max(ahead) >= 3 + window + 2 - 1, ahead


@needs_nixl
def test_the_direct_path_writes_several_slots_at_once(nixl: None, tmp_path: Any) -> None:
    """Ring B of 4 slots: its producer holds 3 at once, granted together; every frame crosses intact."""
    b = Bridge(str(tmp_path), ("--path", "direct"), slots_b=4)
    try:
        frames, released, stop = 60, [0], threading.Event()
        t = threading.Thread(target=feed, args=(b, frames, [], released, stop))
        t.start()
        read, bad, published = read_all(b, 0.0, released)
        t.join(20)
        assert (read, bad, published) == (frames, 0, frames)
        rc_s, sent, err_s = b.result(b.sender)
        rc_r, got, err_r = b.result(b.receiver)
        assert rc_s == 0, err_s
        assert rc_r == 0, err_r
        assert sent["path"] == got["path"] == "direct"
        assert sent["window"] == got["window"] == min(DEFAULT_WINDOW, 4 - 1)
        assert got["landing_copies"] == 0
    finally:
        b.close()


@needs_nixl
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


def ucx_lines(text: str, thread: str = "gpu0:4242:0") -> list[str]:
    """UCX's log lines as UCX_PROTO_INFO prints them: each prefixed with the time and `host:pid:thread`."""
    return [f"[1795646055.341109] [{thread}]   {line}" for line in text.strip("\n").splitlines()]


def table(scope: str, title: str, rows: list[tuple[str, str, str]]) -> str:
    width = 60
    border = "+" + "-" * width + "+"
    out = [border, f"| {scope:<{width - 2}} |", f"| {title:<{width - 2}} |", border,
           "| Range  | Description |              Config               |", border]
    out += [f"| {r:>10} | {d:<18} | {c:<24} |" for r, d, c in rows]
    return "\n".join([*out, border])


LEGACY_GPU = table("gpu-ipc-bridge.send intra-node cfg#1",
                   "remote memory write by ucp_put*(multi) from cuda/GPU0 to cuda/dev[3]",
                   [("0..inf", "zero-copy", "cuda_ipc/cuda")])
HOST_TO_CUDA = table("gpu-ipc-bridge.send intra-node cfg#1",
                     "remote memory write by ucp_put* from host memory to cuda/dev[2]",
                     [("0..inf", "zero-copy", "tcp/lo")])
TCP_GPU = table("gpu-ipc-bridge.send intra-node cfg#2",
                "remote memory write by ucp_put*(multi) from cuda/GPU0 to cuda",
                [("0..8184", "short", "tcp/lo"), ("8185..64K", "copy-in", "tcp/lo"),
                 ("65537..inf", "multi-frag copy-in", "52% on tcp/lo and 48% on tcp/eth0")])
SELF_GPU = table("gpu-ipc-bridge.send self cfg#0", "remote memory write by ucp_put* from cuda/GPU0 to cuda",
                 [("0..inf", "zero-copy", "cuda_copy/cuda")])
RDMA_BOUNCE = table("gpu-ipc-bridge.send inter-node cfg#3",
                    "remote memory write by ucp_put*(multi) from cuda/GPU0 to cuda",
                    [("0..inf", "multi-frag copy-in", "rc_mlx5/mlx5_0:1")])
RDMA_GPU = table("gpu-ipc-bridge.send inter-node cfg#3",
                 "remote memory write by ucp_put*(multi) from cuda/GPU0 to cuda",
                 [("0..inf", "zero-copy", "rc_mlx5/mlx5_0:1, rc_mlx5/mlx5_1:1")])
FRAME = 3840 * 2160 * 3


def tables_of(*texts: str) -> list[Any]:
    lines = [line for text in texts for line in ucx_lines(text)]
    parsed = []
    for line in lines:
        m = _PREFIX.match(line)
        assert m is not None
        parsed.append((m.group(1), line[m.end():]))
    return parse_tables(parsed)


def test_ucx_tables_are_read_with_their_scope_title_and_size_ranges() -> None:
    legacy, tcp, own = tables_of(LEGACY_GPU, TCP_GPU, SELF_GPU)
    assert legacy.reach == "intra-node" and legacy.is_remote_write() and legacy.source() == "cuda"
    assert legacy.row_for(FRAME) == ("zero-copy", "cuda_ipc/cuda")
    assert tcp.row_for(100) == ("short", "tcp/lo")
    assert tcp.row_for(65536) == ("copy-in", "tcp/lo")  # 64K: UCX's units
    assert tcp.row_for(FRAME) == ("multi-frag copy-in", "52% on tcp/lo and 48% on tcp/eth0")
    assert transports_of(tcp.row_for(FRAME)[1]) == ("tcp/lo", "tcp/eth0")
    assert not own.is_remote_write()  # within this process: not the frames' path


def test_tables_printed_by_two_threads_at_once_are_told_apart() -> None:
    a, b = ucx_lines(LEGACY_GPU, "h:1:0"), ucx_lines(TCP_GPU, "h:1:1")
    interleaved = [line for pair in zip(a, b) for line in pair] + a[len(b):] + b[len(a):]
    parsed = []
    for line in interleaved:
        m = _PREFIX.match(line)
        assert m is not None
        parsed.append((m.group(1), line[m.end():]))
    legacy, tcp = sorted(parse_tables(parsed), key=lambda t: t.scope)
    assert legacy.rows == [(0, None, "zero-copy", "cuda_ipc/cuda")]
    assert len(tcp.rows) == 3


def test_the_probes_own_table_decides_not_a_cuda_ipc_entry_elsewhere() -> None:
    # A cuda_ipc row printed earlier (another configuration) does not hide the TCP path the probe's WRITEs took.
    before, during = tables_of(LEGACY_GPU), tables_of(HOST_TO_CUDA, TCP_GPU)
    report = path_verdict(during, before, FRAME, "VRAM", 0.4)
    assert report.gpu_direct is False
    assert report.transports == ("tcp/lo", "tcp/eth0") and report.description == "multi-frag copy-in"
    assert report.how == "UCX's protocol table for the probe's WRITEs"
    ok = path_verdict(tables_of(LEGACY_GPU), tables_of(TCP_GPU), FRAME, "VRAM", 180.0)
    assert ok.gpu_direct is True and ok.transports == ("cuda_ipc/cuda",) and ok.detail == ""


def test_a_configuration_chosen_before_the_probe_is_found_in_the_earlier_tables() -> None:
    report = path_verdict([], tables_of(TCP_GPU, LEGACY_GPU), FRAME, "VRAM", 150.0)
    assert report.gpu_direct is True and "printed before the probe" in report.how


def test_rdma_through_host_bounce_buffers_is_not_a_gpu_path() -> None:
    assert path_verdict(tables_of(RDMA_BOUNCE), [], FRAME, "VRAM", 3.0).gpu_direct is False
    rdma = path_verdict(tables_of(RDMA_GPU), [], FRAME, "VRAM", 22.0)
    assert rdma.gpu_direct is True and rdma.transports == ("rc_mlx5/mlx5_0:1", "rc_mlx5/mlx5_1:1")


def test_without_tables_the_probes_rate_decides() -> None:
    slow = path_verdict([], [], FRAME, "VRAM", 0.4)
    assert slow.gpu_direct is False and "rate alone" in slow.how
    assert path_verdict([], [], FRAME, "VRAM", GPU_PATH_GBPS + 1).gpu_direct is True
    assert path_verdict([], [], FRAME, "DRAM", 0.4).gpu_direct is None  # host memory: not a GPU question
    # A table that says cuda_ipc wins, but a slow probe is noted.
    noted = path_verdict(tables_of(LEGACY_GPU), [], FRAME, "VRAM", 1.0)
    assert noted.gpu_direct is True and "1.00 GB/s only" in noted.detail


def test_the_tables_are_read_off_stdout_up_to_a_mark(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("UCX_PROTO_INFO", raising=False)
    tables = ProtocolTables()
    assert tables.start()
    try:
        assert tables.mark() == 0
        for line in ucx_lines(LEGACY_GPU):
            os.write(1, line.encode() + b"\n")
        count = tables.mark()
        assert count == len(LEGACY_GPU.splitlines())
        (legacy,) = tables.tables(0, count)
        assert legacy.row_for(FRAME) == ("zero-copy", "cuda_ipc/cuda")
        assert tables.write_transports() == {
            "intra-node: remote memory write by ucp_put*(multi) from cuda/GPU0 to cuda/dev[3]": ["cuda_ipc/cuda"]}
    finally:
        tables.stop()
        os.environ.pop("UCX_PROTO_INFO", None)


def test_the_runs_account_warns_when_no_table_of_gpu_memory_names_a_gpu_path() -> None:
    tables = ProtocolTables()
    tables.lines = [(m.group(1), line[m.end():]) for line in ucx_lines(HOST_TO_CUDA + "\n" + TCP_GPU)
                    if (m := _PREFIX.match(line))]
    writes = tables.write_transports()
    account, warning = transport_findings(writes, "VRAM")
    assert "tcp/lo" in account
    assert warning is not None and "not CUDA IPC or RDMA" in warning
    assert transport_findings({"inter-node: x": ["rc_mlx5/mlx5_0:1"]}, "VRAM")[1] is None
    assert transport_findings(writes, "DRAM")[1] is None


def test_a_path_ucx_chooses_anew_during_the_run_is_reported_once() -> None:
    transport = NixlTransport.__new__(NixlTransport)  # no agent: recheck reads the tables only
    transport.tables = ProtocolTables()
    transport.memory = "VRAM"
    transport._probed, transport._reported = 0, 0

    def printed(text: str) -> None:
        assert transport.tables is not None
        transport.tables.lines += [(m.group(1), line[m.end():]) for line in ucx_lines(text)
                                   if (m := _PREFIX.match(line))]

    printed(HOST_TO_CUDA)  # host memory: not the frames'
    assert transport.recheck(FRAME) is None
    printed(TCP_GPU)
    report = transport.recheck(FRAME)
    assert report is not None and report.gpu_direct is False and report.transports == ("tcp/lo", "tcp/eth0")
    assert "during the run" in report.how
    assert transport.recheck(FRAME) is None  # reported once
