"""The bridge's protocol over an in-process fake transport (no NIXL): two host rings, the sending end reading one, the
receiving end producing the other, each in a thread. The paths (landing buffers with a window, the ring's slots one at
a time), the choice between them from the probes' reports, the refusal before the first frame, back-pressure, and the
failures."""

from __future__ import annotations

import ctypes
import json
import os
import struct
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from conftest import host_pair, pattern, publish_pattern

import gpu_ipc
from gpu_ipc.bridge_protocol import (
    BEAT,
    GRANT,
    WRITTEN,
    BridgeError,
    Choice,
    Grant,
    Offer,
    PathReport,
    PeerGone,
    ProtocolError,
    Region,
    SendingEnd,
    TransportRefused,
    decode,
    decode_choice,
    decode_grant,
    decode_offer,
    encode,
    encode_choice,
    encode_grant,
    encode_offer,
)
from gpu_ipc.bridge_messages import grant_message, written_message
from gpu_ipc.bridge_receive import ReceivingEnd
from gpu_ipc.bridge_staging import HostLanding

GPU_PATH = PathReport(("cuda_ipc/cuda",), "zero-copy", True, "a fake table", 150.0)
TCP_PATH = PathReport(("tcp/lo",), "zero-copy", False, "a fake table", 0.4)


class FakeLink:
    """Two mailboxes and the memory one end exposed; `write` copies with memmove and checks the target."""

    def __init__(self) -> None:
        self.boxes: dict[str, deque[bytes]] = {"send": deque(), "receive": deque()}
        self.exposed: set[int] = set()
        self.granted: set[int] = set()  # addresses granted and not yet written
        self.cut = False
        self.writes = 0
        self.probes: list[int] = []  # remote addresses probed
        self.in_flight = 0
        self.most_in_flight = 0


class FakeTransport:
    """The sending or receiving side of a `FakeLink`. `paths`: what a probe of a landing buffer or of a ring slot
    reports (by whether the address probed was granted as a landing buffer); `delay`: polls of `done` before a
    WRITE completes (so several can be in flight)."""

    def __init__(self, link: FakeLink, side: str, paths: dict[str, PathReport] | None = None, delay: int = 0,
                 changes: list[PathReport] | None = None) -> None:
        self.link, self.side = link, side
        self.peer = "receive" if side == "send" else "send"
        self.learned: list[bytes] = []
        self.paths = paths or {"landing": GPU_PATH, "direct": GPU_PATH}
        self.delay = delay
        self.changes = changes or []
        self.landing: set[int] = set()
        self.lanes: list[int] = []

    def send(self, message: bytes) -> None:
        if self.link.cut:
            raise PeerGone("the fake link is cut")
        kind, body = decode(message)
        if kind == GRANT:
            self.link.granted.add(decode_grant(body).ptr)
        self.link.boxes[self.peer].append(message)

    def receive(self) -> list[bytes]:
        box = self.link.boxes[self.side]
        out = list(box)
        box.clear()
        return out

    def expose(self, ptr: int, nbytes: int, device: int) -> bytes:
        if ptr in self.link.exposed:
            return b""
        self.link.exposed.add(ptr)
        return b"reach:%d" % ptr

    def learn(self, info: bytes) -> None:
        if info:
            self.learned.append(info)

    def write(self, ptr: int, nbytes: int, device: int, remote_ptr: int, remote_device: int,
              notification: bytes, lane: int = 0) -> Any:
        assert remote_ptr in self.link.exposed, "a write to memory never exposed"
        assert remote_ptr in self.link.granted, "a write to a place not granted (or written already)"
        self.link.granted.discard(remote_ptr)
        ctypes.memmove(remote_ptr, ptr, nbytes)
        self.link.writes += 1
        self.lanes.append(lane)
        self.link.in_flight += 1
        self.link.most_in_flight = max(self.link.most_in_flight, self.link.in_flight)
        return [notification, self.delay]

    def done(self, handle: Any) -> bool:
        if handle[1] > 0:
            handle[1] -= 1
            return False
        if handle[0] is not None:
            self.link.in_flight -= 1
            self.send(handle[0])  # the notification, after the data
            handle[0] = None
        return True

    def probe(self, ptr: int, nbytes: int, device: int, remote_ptr: int, remote_device: int,
              notification: bytes, keep_alive: Callable[[], None]) -> PathReport:
        assert remote_ptr in self.link.exposed, "a probe of memory never exposed"
        ctypes.memmove(remote_ptr, ptr, nbytes)
        self.link.probes.append(remote_ptr)
        keep_alive()
        self.send(notification)
        return self.paths["landing" if remote_ptr in self.landing else "direct"]

    def recheck(self, nbytes: int) -> PathReport | None:
        return self.changes.pop(0) if self.changes else None


def landing_maker(send_transport: FakeTransport, fail: str = "") -> Callable[[int, int], HostLanding]:
    def make(nbytes: int, count: int) -> HostLanding:
        if fail:
            raise BridgeError(fail)
        landing = HostLanding(nbytes, count)
        send_transport.landing.update(landing.ptrs)
        return landing
    return make


def run_bridge(sock_a: str, sock_b: str, frames: int, read_delay: float = 0.0, path: str = "auto",
               window: int = 2, expect: str = "any", paths: dict[str, PathReport] | None = None, delay: int = 0,
               landing_fails: str = "", changes: list[PathReport] | None = None,
               report_every: float = 10.0, slots_b: int = 2) -> dict[str, Any]:
    """Ring A (3 slots) -> sending end -> fake link -> receiving end -> ring B (2 slots) -> a checking consumer."""
    producer_a, source = host_pair(sock_a, slots=3, name="bridge-send")
    producer_b, consumer_b = host_pair(sock_b, slots=slots_b, name="reader")
    link = FakeLink()
    send_transport = FakeTransport(link, "send", paths, delay, changes)
    logged: list[str] = []
    send_end = SendingEnd(send_transport, source, 0, path=path, expect=expect, report_every=report_every,
                          log=logged.append)
    recv_end = ReceivingEnd(FakeTransport(link, "receive"), window=window,
                            make_landing=landing_maker(send_transport, landing_fails))
    released = [0]
    ahead: list[int] = []  # upstream frames published minus downstream frames released, at each publish
    results: dict[str, Any] = {}

    def produce() -> None:
        for _ in range(frames):
            try:
                seq = publish_pattern(producer_a, timeout=10)
            except gpu_ipc.GpuIpcError:
                break
            ahead.append(seq + 1 - released[0])
        producer_a.close()

    def sending() -> None:
        send_end.hello()
        try:
            results["send"] = send_end.run()
        except BridgeError as e:
            results["send_error"] = e
        finally:
            source.close()  # detached: ring A's producer goes on without it

    def receiving() -> None:
        results["layout"] = recv_end.wait_hello(5)
        try:
            results["receive"] = recv_end.run(producer_b, 0)
            producer_b.close()
        except BridgeError as e:
            results["receive_error"] = e
            results["published_when_failed"] = producer_b.next_sequence
            producer_b.close()

    threads = [threading.Thread(target=f) for f in (produce, sending, receiving)]
    for t in threads:
        t.start()
    bad = read = 0
    try:
        while True:
            try:
                frame = consumer_b.next_frame(timeout=10)
            except gpu_ipc.EndOfStream as end:
                results["published"] = end.published
                break
            got = np.from_dlpack(frame).reshape(-1)
            bad += int(np.count_nonzero(got != pattern(frame.seq, frame.nbytes)))
            time.sleep(read_delay)
            consumer_b.release(frame)
            read += 1
            released[0] = read
    finally:
        for t in threads:
            t.join(20)
        source.close()
        consumer_b.close()
    results.update(bad=bad, read=read, ahead=ahead, link=link, send_end=send_end, recv_end=recv_end,
                   logged=logged, send_transport=send_transport)
    return results


def test_frames_arrive_intact_through_landing_buffers_and_the_end_passes(tmp_path: Any) -> None:
    r = run_bridge(str(tmp_path / "a.sock"), str(tmp_path / "b.sock"), frames=40)
    assert (r["read"], r["published"], r["bad"]) == (40, 40, 0)
    assert r["send"]["frames"] == 40 and r["send"]["outcome"] == "end of stream"
    assert r["receive"]["frames"] == 40 and r["receive"]["outcome"] == "end of stream"
    assert r["send"]["path"] == r["receive"]["path"] == "landing"
    assert r["send"]["window"] == r["receive"]["window"] == 2
    assert r["receive"]["landing_copies"] == 40  # one copy per frame, each timed
    assert r["layout"] == {"shape": [32, 64, 3], "dtype": "uint8", "nbytes": 6144, "slots": 3, "path": "auto"}
    assert r["link"].writes == 40
    # Offered: ring B's first slot and the two landing buffers, each registered once; probed: the landing path only
    # (it was a GPU path).
    assert len(r["link"].exposed) == 3
    assert len(r["link"].probes) == 1 and r["link"].probes[0] in r["send_transport"].landing
    assert r["send"]["probes"] == [{"path": "landing", **GPU_PATH.as_dict()}]
    assert r["receive"]["sender_report"] == GPU_PATH.as_dict()
    # Each end's CPU time per frame while frames flowed: its own thread's, within this process's (all threads).
    for side in ("send", "receive"):
        own, process = r[side]["thread_cpu_us_per_frame"], r[side]["cpu_us_per_frame"]
        assert 0 < own <= process, (side, own, process)
        # The loop's turns that moved a frame on: some time, and no more than the stream lasted (100 ms of slack for
        # the turns before the first frame counted).
        busy, frames, fps = r[side]["busy_us_per_frame"], r[side]["frames"], r[side]["fps"]
        assert 0 < busy * frames <= frames / fps * 1e6 + 100_000, (side, busy, frames, fps)


def test_the_direct_path_writes_the_rings_slots_one_at_a_time(tmp_path: Any) -> None:
    r = run_bridge(str(tmp_path / "a.sock"), str(tmp_path / "b.sock"), frames=30, path="direct", delay=3)
    assert (r["read"], r["published"], r["bad"]) == (30, 30, 0)
    assert r["send"]["path"] == "direct" and r["send"]["window"] == 1
    assert r["link"].most_in_flight == 1
    assert r["receive"]["landing_copies"] == 0
    assert len(r["link"].exposed) == 2  # ring B's two slots; no landing buffers were made
    assert set(r["send_transport"].lanes) == {0}


def test_the_landing_path_keeps_a_window_of_writes_in_flight(tmp_path: Any) -> None:
    # Each WRITE completes after 20 polls: the sending end must start the next ones meanwhile.
    r = run_bridge(str(tmp_path / "a.sock"), str(tmp_path / "b.sock"), frames=30, window=3, delay=20)
    assert (r["read"], r["published"], r["bad"]) == (30, 30, 0)
    assert r["link"].most_in_flight == 3
    assert set(r["send_transport"].lanes) == {0, 1, 2}  # each WRITE in flight on a lane of its own


def test_the_direct_path_keeps_several_of_the_rings_slots_in_flight(tmp_path: Any) -> None:
    # Ring B of 4 slots: its producer holds 3 at once (acquire_after), each granted as it is acquired, published in
    # order; each WRITE completes after 20 polls, so the sending end starts the next ones meanwhile.
    r = run_bridge(str(tmp_path / "a.sock"), str(tmp_path / "b.sock"), frames=30, path="direct", window=3, delay=20,
                   slots_b=4)
    assert (r["read"], r["published"], r["bad"]) == (30, 30, 0)
    assert r["send"]["path"] == "direct" and r["send"]["window"] == r["receive"]["window"] == 3
    assert r["link"].most_in_flight == 3
    assert r["receive"]["landing_copies"] == 0
    assert len(r["link"].exposed) == 4  # ring B's four slots, each registered once; no landing buffers were made


@pytest.mark.parametrize("path, window", [("direct", 1), ("landing", 2), ("landing", 3)])
def test_a_slow_consumer_holds_the_producer_back(tmp_path: Any, path: str, window: int) -> None:
    r = run_bridge(str(tmp_path / "a.sock"), str(tmp_path / "b.sock"), frames=30, read_delay=0.01, path=path,
                   window=window)
    assert r["bad"] == 0 and r["read"] == 30
    # Never more in flight than ring A's 3 slots, the window (landing buffers written, not yet copied into ring B;
    # on the direct path, ring B's slot held by its producer) and ring B's 2 slots.
    bound = 3 + window + 2
    assert max(r["ahead"]) <= bound, r["ahead"]
    assert max(r["ahead"]) >= bound - 1, r["ahead"]  # the chain did fill up: the bound above was tested


def test_auto_takes_the_first_path_the_probe_found_on_a_gpu_path(tmp_path: Any) -> None:
    r = run_bridge(str(tmp_path / "a.sock"), str(tmp_path / "b.sock"), frames=10,
                   paths={"landing": TCP_PATH, "direct": GPU_PATH})
    assert r["bad"] == 0 and r["read"] == 10
    assert [p["path"] for p in r["send"]["probes"]] == ["landing", "direct"]
    assert r["send"]["path"] == "direct" and r["send"]["transport_warning"] is None
    assert r["send"]["path_report"] == GPU_PATH.as_dict()


def test_no_gpu_path_is_a_warning_and_the_first_path(tmp_path: Any) -> None:
    r = run_bridge(str(tmp_path / "a.sock"), str(tmp_path / "b.sock"), frames=10,
                   paths={"landing": TCP_PATH, "direct": TCP_PATH})
    assert r["bad"] == 0 and r["read"] == 10
    assert r["send"]["path"] == "landing"
    assert "tcp/lo, not CUDA IPC or RDMA" in r["send"]["transport_warning"]
    assert any(line.startswith("WARNING") for line in r["logged"])


def test_expect_gpu_direct_refuses_a_tcp_path_before_the_first_frame(tmp_path: Any) -> None:
    started = time.monotonic()
    r = run_bridge(str(tmp_path / "a.sock"), str(tmp_path / "b.sock"), frames=50,
                   paths={"landing": TCP_PATH, "direct": TCP_PATH}, expect="gpu-direct")
    assert time.monotonic() - started < 5
    assert isinstance(r["send_error"], TransportRefused)
    assert "tcp/lo" in str(r["send_error"]) and "before the first frame" in str(r["send_error"])
    # The receiving end hears why and fails; ring B never published a frame, its consumer read none.
    assert isinstance(r["receive_error"], PeerGone) and "TransportRefused" in r["receive_error"].reason
    assert r["published_when_failed"] == 0 and r["read"] == 0
    assert r["link"].writes == 0  # only the probes wrote


def test_expect_gpu_direct_refuses_a_path_the_transport_changes_to_tcp(tmp_path: Any) -> None:
    # The transport reports a new path at the first report (every 0 s: at once) of the run.
    r = run_bridge(str(tmp_path / "a.sock"), str(tmp_path / "b.sock"), frames=50, expect="gpu-direct",
                   changes=[TCP_PATH], report_every=0.0)
    assert isinstance(r["send_error"], TransportRefused)
    assert "now go over tcp/lo" in str(r["send_error"])
    assert isinstance(r["receive_error"], PeerGone)


def test_the_run_reports_its_rate_and_path(tmp_path: Any) -> None:
    r = run_bridge(str(tmp_path / "a.sock"), str(tmp_path / "b.sock"), frames=30, read_delay=0.005,
                   report_every=0.05)
    assert r["read"] == 30
    reports = r["send"]["reports"]
    assert reports and all(rep["path"] == "landing" and rep["fps"] >= 0 for rep in reports)
    assert any(rep["fps"] > 0 and rep["write_ms_p50"] is not None for rep in reports)
    assert any(rep["cpu_us_per_frame"] is not None and rep["cpu_us_per_frame"] > 0 for rep in reports)
    assert all(rep["cpu_us_per_frame"] is None for rep in reports if rep["fps"] == 0)  # no frame: no figure
    assert any("FPS" in line and "cuda_ipc/cuda" in line for line in r["logged"])
    assert any("CPU" in line and "us/frame" in line for line in r["logged"])


def test_without_landing_buffers_auto_takes_the_direct_path_and_says_why(tmp_path: Any) -> None:
    r = run_bridge(str(tmp_path / "a.sock"), str(tmp_path / "b.sock"), frames=10,
                   landing_fails="cuda-bindings is missing")
    assert r["bad"] == 0 and r["read"] == 10
    assert r["send"]["path"] == "direct"
    assert any("no landing buffers: cuda-bindings is missing" in line for line in r["logged"])


def test_landing_asked_for_without_landing_buffers_is_an_error_that_says_why(tmp_path: Any) -> None:
    r = run_bridge(str(tmp_path / "a.sock"), str(tmp_path / "b.sock"), frames=10, path="landing",
                   landing_fails="cuda-bindings is missing")
    assert "offers no path for --path landing" in str(r["send_error"])
    assert "cuda-bindings is missing" in str(r["send_error"])


class SilentSource:
    """A ring that never has a frame."""

    shape, dtype, nbytes, slots = (4,), "uint8", 4, 2

    def next_frame(self, timeout: float = 1.0) -> Any:
        time.sleep(timeout)
        raise gpu_ipc.Timeout("no frame")

    def release(self, frame: Any) -> None:
        raise AssertionError("nothing to release")


def test_a_silent_receiving_end_is_an_error_within_the_peer_timeout() -> None:
    end = SendingEnd(FakeTransport(FakeLink(), "send"), SilentSource(), 0, peer_timeout=0.3)
    started = time.monotonic()
    with pytest.raises(PeerGone, match="silent"):
        end.run()
    assert 0.3 <= time.monotonic() - started < 1.0


def test_a_cut_link_is_an_error_at_the_next_heartbeat() -> None:
    link = FakeLink()
    end = SendingEnd(FakeTransport(link, "send"), SilentSource(), 0, beat_interval=0.05, peer_timeout=5.0)
    link.cut = True
    started = time.monotonic()
    with pytest.raises(PeerGone, match="cut"):
        end.run()
    assert time.monotonic() - started < 0.5


class DyingSource(SilentSource):
    def next_frame(self, timeout: float = 1.0) -> Any:
        raise gpu_ipc.ProducerGone("the producer (pid 1) is gone")


def test_an_upstream_death_reaches_the_receiving_end_as_a_failure() -> None:
    link = FakeLink()
    link.boxes["send"].append(encode_offer(Offer(0, None, ())))  # the receiving end offered; then frames
    with pytest.raises(gpu_ipc.ProducerGone):
        SendingEnd(FakeTransport(link, "send"), DyingSource(), 0).run()
    recv = ReceivingEnd(FakeTransport(link, "receive"))
    with pytest.raises(PeerGone, match="sending end failed: ProducerGone") as info:
        recv.live.receive()
    assert "pid 1" in info.value.reason


def test_messages_round_trip_and_garbage_is_refused() -> None:
    g = Grant(seq=7, slot=1, ptr=0xDEAD000, nbytes=4096, device=3, reach=b"md")
    assert decode_grant(decode(encode_grant(g))[1]) == g
    offer = Offer(2, g, (Region(0x1000, 4096, 3, b"\x00r1"), Region(0x9000, 4096, 3, b"")), "")
    assert decode_offer(decode(encode_offer(offer))[1]) == offer
    choice = Choice("landing", GPU_PATH)
    assert decode_choice(decode(encode_choice(choice))[1]) == choice
    assert decode(encode(BEAT)) == (BEAT, b"")
    # The per-frame messages made without a Grant are the same bytes.
    assert grant_message(7, 1, 0xDEAD000, 4096, 3, b"md") == encode_grant(g)
    assert written_message(9, 4) == encode(WRITTEN, struct.pack("<QQ", 9, 4))
    with pytest.raises(ProtocolError, match="gpu_ipc bridge"):
        decode(b"hello")
    with pytest.raises(ProtocolError, match="gpu_ipc bridge"):
        decode(b"gib1G" + b"\x00" * 40)  # the previous version's grant
    with pytest.raises(ProtocolError, match="grant of 3 bytes"):
        decode_grant(b"abc")
    with pytest.raises(ProtocolError, match="2 landing buffers for a window of 3"):
        decode_offer(encode_offer(Offer(3, None, offer.landing))[len(b"gib2O"):])
    with pytest.raises(ProtocolError, match="not base64"):
        decode_offer(b'{"window": 0, "landing": [], "direct": {"seq": 0, "slot": 0, "ptr": 1, "nbytes": 1, '
                     b'"device": 0, "reach": "%%"}}')
    for direct_window in (0, 65, -1, "3", 2.5, None):
        with pytest.raises(ProtocolError, match="a direct window"):
            decode_offer(json.dumps({"window": 0, "landing": [], "direct_window": direct_window}).encode())
    # A receiving end that says nothing of it grants one slot at a time.
    assert decode_offer(b'{"window": 0, "landing": []}').direct_window == 1
    assert decode_offer(encode_offer(Offer(0, None, (), "", 3))[len(b"gib2O"):]).direct_window == 3
    with pytest.raises(ProtocolError, match="a choice without"):
        decode_choice(b'{"path": "tcp"}')


def test_a_stuck_consumer_is_reported_after_the_stall_timeout(tmp_path: Any) -> None:
    producer, consumer = host_pair(os.path.join(tmp_path, "b.sock"), slots=2)
    link = FakeLink()
    recv = ReceivingEnd(FakeTransport(link, "receive"), stall_timeout=0.3, peer_timeout=5.0, window=0)
    for _ in range(2):  # fill the ring: the consumer reads nothing
        publish_pattern(producer)
    started = time.monotonic()
    with pytest.raises(BridgeError, match="held slot 0"):
        recv.run(producer, 0)
    assert 0.3 <= time.monotonic() - started < 1.5
    consumer.close()
    producer.close()
