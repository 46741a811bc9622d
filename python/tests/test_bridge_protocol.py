"""The bridge's grant / write / publish protocol over an in-process fake transport (no NIXL): two host rings, the
sending end reading one, the receiving end producing the other, each in a thread."""

from __future__ import annotations

import ctypes
import os
import threading
import time
from collections import deque
from typing import Any

import numpy as np
import pytest
from conftest import host_pair, pattern, publish_pattern

import gpu_ipc
from gpu_ipc.bridge_protocol import (
    BEAT,
    BridgeError,
    GRANT,
    Grant,
    PeerGone,
    ProtocolError,
    ReceivingEnd,
    SendingEnd,
    decode,
    decode_grant,
    encode,
    encode_grant,
)


class FakeLink:
    """Two mailboxes and the memory one end exposed; `write` copies with memmove and checks the target."""

    def __init__(self) -> None:
        self.boxes: dict[str, deque[bytes]] = {"send": deque(), "receive": deque()}
        self.exposed: set[int] = set()
        self.granted: set[int] = set()  # addresses granted and not yet written
        self.cut = False
        self.writes = 0


class FakeTransport:
    def __init__(self, link: FakeLink, side: str) -> None:
        self.link, self.side = link, side
        self.peer = "receive" if side == "send" else "send"
        self.learned: list[bytes] = []

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
              notification: bytes) -> Any:
        assert remote_ptr in self.link.exposed, "a write to memory never exposed"
        assert remote_ptr in self.link.granted, "a write to a slot not granted (or written already)"
        self.link.granted.discard(remote_ptr)
        ctypes.memmove(remote_ptr, ptr, nbytes)
        self.link.writes += 1
        return notification

    def done(self, handle: Any) -> bool:
        self.send(handle)  # the notification, after the data
        return True


def run_bridge(sock_a: str, sock_b: str, frames: int, read_delay: float = 0.0) -> dict[str, Any]:
    """Ring A (3 slots) -> sending end -> fake link -> receiving end -> ring B (2 slots) -> a checking consumer."""
    producer_a, source = host_pair(sock_a, slots=3, name="bridge-send")
    producer_b, consumer_b = host_pair(sock_b, slots=2, name="reader")
    link = FakeLink()
    send_end = SendingEnd(FakeTransport(link, "send"), source, 0)
    recv_end = ReceivingEnd(FakeTransport(link, "receive"))
    released = [0]
    ahead: list[int] = []  # upstream frames published minus downstream frames released, at each publish
    results: dict[str, Any] = {}

    def produce() -> None:
        for _ in range(frames):
            seq = publish_pattern(producer_a, timeout=10)
            ahead.append(seq + 1 - released[0])
        producer_a.close()

    def sending() -> None:
        send_end.hello()
        results["send"] = send_end.run()

    def receiving() -> None:
        results["layout"] = recv_end.wait_hello(5)
        results["receive"] = recv_end.run(producer_b, 0)
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
    results.update(bad=bad, read=read, ahead=ahead, link=link, send_end=send_end)
    return results


def test_frames_arrive_intact_and_the_end_passes(tmp_path: Any) -> None:
    r = run_bridge(str(tmp_path / "a.sock"), str(tmp_path / "b.sock"), frames=40)
    assert r["read"] == 40
    assert r["published"] == 40
    assert r["bad"] == 0
    assert r["send"]["frames"] == 40 and r["send"]["outcome"] == "end of stream"
    assert r["receive"]["frames"] == 40 and r["receive"]["outcome"] == "end of stream"
    assert r["layout"] == {"shape": [32, 64, 3], "dtype": "uint8", "nbytes": 6144, "slots": 3}
    assert r["link"].writes == 40
    assert len(r["link"].exposed) == 2  # ring B's two slots, each registered once
    assert len(r["send_end"].transport.learned) == 2


def test_a_slow_consumer_holds_the_producer_back(tmp_path: Any) -> None:
    r = run_bridge(str(tmp_path / "a.sock"), str(tmp_path / "b.sock"), frames=30, read_delay=0.01)
    assert r["bad"] == 0 and r["read"] == 30
    # Ring A's 3 slots, ring B's 2 and the frame the sending end holds: never more in flight than that.
    assert max(r["ahead"]) <= 3 + 2 + 1, r["ahead"]
    assert max(r["ahead"]) >= 3  # the chain did fill up: the bound above was tested


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
    with pytest.raises(gpu_ipc.ProducerGone):
        SendingEnd(FakeTransport(link, "send"), DyingSource(), 0).run()
    recv = ReceivingEnd(FakeTransport(link, "receive"))
    with pytest.raises(PeerGone, match="sending end failed: ProducerGone") as info:
        recv.live.receive()
    assert "pid 1" in info.value.reason


def test_messages_round_trip_and_garbage_is_refused() -> None:
    g = Grant(seq=7, slot=1, ptr=0xDEAD000, nbytes=4096, device=3, reach=b"md")
    assert decode_grant(decode(encode_grant(g))[1]) == g
    assert decode(encode(BEAT)) == (BEAT, b"")
    with pytest.raises(ProtocolError, match="gpu_ipc bridge"):
        decode(b"hello")
    with pytest.raises(ProtocolError, match="grant of 3 bytes"):
        decode_grant(b"abc")


def test_a_stuck_consumer_is_reported_after_the_stall_timeout(tmp_path: Any) -> None:
    producer, consumer = host_pair(os.path.join(tmp_path, "b.sock"), slots=2)
    link = FakeLink()
    recv = ReceivingEnd(FakeTransport(link, "receive"), stall_timeout=0.3, peer_timeout=5.0)
    for _ in range(2):  # fill the ring: the consumer reads nothing
        publish_pattern(producer)
    started = time.monotonic()
    with pytest.raises(BridgeError, match="held slot 0"):
        recv.run(producer, 0)
    assert 0.3 <= time.monotonic() - started < 1.5
    consumer.close()
    producer.close()
