"""The bridge's protocol between its two ends, over any :class:`Transport` (NIXL in ``gpu_ipc.bridge_nixl``, an
in-process fake in the tests).

The receiving end owns a local ring as its producer; the sending end reads another ring as an ordinary consumer.
Per frame: the receiving end acquires a free slot of its ring and *grants* it (a notification with the sequence
number, slot index, address and size, plus what the transport needs to reach newly registered memory); the sending
end waits for a frame of its ring, WRITEs it into the granted slot with a *written* notification attached to the
transfer (delivered after the data), and releases its frame once the transfer is complete; the receiving end
publishes the slot when the notification arrives. So a slot is written only while the receiving end holds it (no
consumer reads it), a frame is released upstream only after it landed, and a slow consumer of the receiving ring
slows the sending end (it gets no grant) and, through its held frame, the upstream producer.

Liveness: each end sends a heartbeat when it has sent nothing for ``beat_interval`` and gives up on a peer it has not
heard from for ``peer_timeout`` (or at once when the transport reports the peer unreachable). End of stream: the
sending end passes it with the count of frames written; a failure upstream (its producer died) is passed as a
failure, never as an end.
"""

from __future__ import annotations

import json
import struct
import time
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Protocol

from gpu_ipc._gpu_ipc import EndOfStream, GpuIpcError, Timeout

MAGIC = b"gib1"  # every notification of the bridge starts with this (and names the protocol's version)
HELLO, GRANT, WRITTEN, BEAT, END, FAIL = b"H", b"G", b"W", b"B", b"E", b"X"
_GRANT = struct.Struct("<QIQQI")  # seq, slot, addr, nbytes, device
_WRITTEN = struct.Struct("<QQ")  # seq in the receiving ring, seq in the sending ring
_END = struct.Struct("<Q")  # frames written
POLL_S = 50e-6  # how long an end sleeps between polls of a transfer or of notifications


class BridgeError(GpuIpcError):
    """A bridge end cannot go on; the message says why and what to do."""


class PeerGone(BridgeError):
    """The other end of the bridge died, went silent, or reported a failure of its own (``reason``)."""

    def __init__(self, message: str, reason: str = "") -> None:
        super().__init__(message)
        self.reason = reason


class ProtocolError(BridgeError):
    """The other end sent something this end does not expect (another program on the port, another version)."""


class TransportError(BridgeError):
    """The transport (NIXL / UCX) failed: a transfer in error, a registration refused."""


class Transport(Protocol):
    """What the ends need from a transport: notifications both ways, memory the peer may write, one-sided WRITEs."""

    def send(self, message: bytes) -> None:
        """Sends a notification to the peer; raises :class:`PeerGone` when the peer is unreachable."""

    def receive(self) -> list[bytes]:
        """The notifications from the peer that arrived since the last call, in order (does not wait)."""

    def expose(self, ptr: int, nbytes: int, device: int) -> bytes:
        """Receiving end: makes ``[ptr, ptr + nbytes)`` writable by the peer (once per region) and returns what the
        peer must learn to reach it (empty when nothing new)."""

    def learn(self, info: bytes) -> None:
        """Sending end: takes in what the peer's :meth:`expose` returned."""

    def write(self, ptr: int, nbytes: int, device: int, remote_ptr: int, remote_device: int,
              notification: bytes) -> Any:
        """Sending end: starts a WRITE of local ``[ptr, ptr + nbytes)`` to the peer's ``remote_ptr``; the peer
        receives ``notification`` after the data. Returns a handle for :meth:`done`."""

    def done(self, handle: Any) -> bool:
        """Whether the WRITE is complete; raises :class:`TransportError` when it failed."""


@dataclass(frozen=True)
class Grant:
    """A slot of the receiving ring that the sending end may write once: frame ``seq`` of that ring."""

    seq: int
    slot: int
    ptr: int
    nbytes: int
    device: int
    reach: bytes = b""  # what the transport needs to reach this memory, the first time it is granted


def encode(kind: bytes, body: bytes = b"") -> bytes:
    """A notification of the bridge: the magic, one byte of kind, the body."""
    return MAGIC + kind + body


def decode(message: bytes) -> tuple[bytes, bytes]:
    """``(kind, body)`` of a notification; :class:`ProtocolError` for anything else."""
    if len(message) < len(MAGIC) + 1 or not message.startswith(MAGIC):
        raise ProtocolError(f"unexpected notification {message[:16]!r}: is the peer a gpu_ipc bridge of this version?")
    return message[len(MAGIC):len(MAGIC) + 1], message[len(MAGIC) + 1:]


def encode_grant(g: Grant) -> bytes:
    return encode(GRANT, _GRANT.pack(g.seq, g.slot, g.ptr, g.nbytes, g.device) + g.reach)


def decode_grant(body: bytes) -> Grant:
    if len(body) < _GRANT.size:
        raise ProtocolError(f"a grant of {len(body)} bytes (expected at least {_GRANT.size})")
    seq, slot, ptr, nbytes, device = _GRANT.unpack_from(body)
    return Grant(seq, slot, ptr, nbytes, device, bytes(body[_GRANT.size:]))


def decode_hello(body: bytes) -> dict[str, Any]:
    """The sending end's layout (``shape``, ``dtype``, ``nbytes``, ``slots``) from its hello; :class:`ProtocolError`
    for a body that is not that JSON object, whatever it holds (a ring is made from it)."""
    try:
        layout = json.loads(body)
    except (ValueError, RecursionError) as e:  # bad UTF-8 or JSON (both ValueErrors), or nesting too deep
        raise ProtocolError(f"a hello that is not JSON: {e}") from None
    if not isinstance(layout, dict):
        raise ProtocolError(f"a hello that is not a JSON object: {bytes(body[:120])!r}")
    ok = (isinstance(layout.get("shape"), list)
          and all(type(d) is int and d >= 0 for d in layout["shape"])
          and isinstance(layout.get("dtype"), str)
          and type(layout.get("nbytes")) is int and layout["nbytes"] >= 0
          and type(layout.get("slots")) is int and layout["slots"] >= 1)
    if not ok:
        raise ProtocolError(f"a hello without a frame layout (shape, dtype, nbytes, slots): {bytes(body[:120])!r}")
    return layout


def _unpack(s: struct.Struct, body: bytes, what: str) -> tuple[int, ...]:
    if len(body) != s.size:
        raise ProtocolError(f"a {what} notification of {len(body)} bytes (expected {s.size})")
    return tuple(s.unpack(body))


@dataclass
class Liveness:
    """Heartbeats out, silence in: when to send a beat, when the peer counts as gone."""

    transport: Transport
    peer: str  # "the sending end" / "the receiving end", for messages
    beat_interval: float
    peer_timeout: float
    clock: Callable[[], float] = time.monotonic
    heard: float = field(default=0.0)
    sent: float = field(default=0.0)

    def __post_init__(self) -> None:
        self.heard = self.sent = self.clock()

    def send(self, message: bytes) -> None:
        self.transport.send(message)
        self.sent = self.clock()

    def receive(self) -> list[tuple[bytes, bytes]]:
        """The peer's notifications, decoded; fails on a peer that reported a failure or went silent."""
        now = self.clock()
        messages = [decode(m) for m in self.transport.receive()]
        if messages:
            self.heard = now
        for kind, body in messages:
            if kind == FAIL:
                reason = body.decode("utf-8", "replace")
                raise PeerGone(f"{self.peer} failed: {reason}", reason)
        if now - self.heard > self.peer_timeout:
            raise PeerGone(
                f"{self.peer} has been silent for {now - self.heard:.2f} s (heartbeats every {self.beat_interval} s): "
                f"it died or the network between the ends is down")
        if now - self.sent >= self.beat_interval:
            self.send(encode(BEAT))
        return [(k, b) for k, b in messages if k != BEAT]

    @contextmanager
    def failures(self, stats: Stats, side: str) -> Iterator[None]:
        """Tells the peer why this end (``side``) fails, unless the peer's own failure or death is why."""
        try:
            yield
        except PeerGone:
            stats.outcome = "peer gone"
            raise
        except BaseException as e:
            stats.outcome = "failed"
            self.fail(f"{side} failed: {type(e).__name__}: {e}")
            raise

    def fail(self, reason: str) -> None:
        """Tells the peer (best effort) that this end fails."""
        try:
            self.transport.send(encode(FAIL, reason.encode()))
        except BridgeError:
            pass


@dataclass
class Stats:
    """What an end did: frames, bytes, seconds from the first frame to the last."""

    frames: int = 0
    bytes: int = 0
    first: float | None = None
    last: float = 0.0
    outcome: str = "running"

    def count(self, nbytes: int) -> None:
        now = time.perf_counter()
        if self.first is None:
            self.first = now
        self.last = now
        self.frames += 1
        self.bytes += nbytes

    def summary(self) -> dict[str, Any]:
        wall = (self.last - self.first) if self.first is not None else 0.0
        return {"frames": self.frames, "bytes": self.bytes, "outcome": self.outcome,
                "fps": (self.frames - 1) / wall if wall > 0 else 0.0}


class SendingEnd:
    """Reads frames of a local ring (``source``: a ``gpu_ipc.Consumer`` with a CPU sync strategy) and writes each
    into a slot the receiving end granted. :meth:`run` returns at the end of the source's stream, after telling the
    receiving end; raises :class:`PeerGone`, :class:`TransportError`, or the source's ``ProducerGone`` (after telling
    the receiving end)."""

    def __init__(self, transport: Transport, source: Any, device: int, beat_interval: float = 0.1,
                 peer_timeout: float = 0.6, slice_s: float = 0.02) -> None:
        self.transport = transport
        self.source = source
        self.device = device
        self.live = Liveness(transport, "the receiving end", beat_interval, peer_timeout)
        self.slice_s = slice_s
        self.grants: deque[Grant] = deque()
        self.stats = Stats()

    def hello(self) -> None:
        """Tells the receiving end what each frame is, so that it makes its ring alike."""
        s = self.source
        layout = {"shape": list(s.shape), "dtype": s.dtype, "nbytes": s.nbytes, "slots": s.slots}
        self.live.send(encode(HELLO, json.dumps(layout).encode()))

    def _pump(self) -> None:
        for kind, body in self.live.receive():
            if kind != GRANT:
                raise ProtocolError(f"the receiving end sent {kind!r} where grants were expected")
            grant = decode_grant(body)
            self.transport.learn(grant.reach)
            self.grants.append(grant)

    def run(self) -> dict[str, Any]:
        frame: Any = None
        with self.live.failures(self.stats, "the sending end"):
            while True:
                self._pump()
                if frame is None:
                    try:
                        frame = self.source.next_frame(timeout=self.slice_s)
                    except Timeout:
                        continue
                    except EndOfStream:
                        self._finish()
                        return self.stats.summary()
                if not self.grants:
                    time.sleep(POLL_S)
                    continue
                grant = self.grants.popleft()
                if grant.nbytes != frame.nbytes:
                    raise ProtocolError(f"granted a slot of {grant.nbytes} bytes for a frame of {frame.nbytes}")
                self._write(frame, grant)
                self.source.release(frame)
                frame = None
                self.stats.count(grant.nbytes)

    def _finish(self) -> None:
        """Passes the end of the stream and waits for the receiving end to have published every frame written
        (its acknowledgement; until then this end's agent must live, since the last written notification may still
        be on its way)."""
        self.live.send(encode(END, _END.pack(self.stats.frames)))
        while True:
            for kind, body in self.live.receive():
                if kind == END:
                    (published,) = _unpack(_END, body, "end")
                    if published != self.stats.frames:
                        raise ProtocolError(f"the receiving end published {published} of {self.stats.frames} frames")
                    self.stats.outcome = "end of stream"
                    return
                if kind != GRANT:  # a grant sent before our end crossed it: never used
                    raise ProtocolError(f"the receiving end sent {kind!r} after the end of the stream")
            time.sleep(POLL_S)

    def _write(self, frame: Any, grant: Grant) -> None:
        note = encode(WRITTEN, _WRITTEN.pack(grant.seq, frame.seq))
        handle = self.transport.write(frame.ptr, frame.nbytes, self.device, grant.ptr, grant.device, note)
        spins = 0
        while not self.transport.done(handle):
            spins += 1
            if spins % 64 == 0:  # keep the heartbeats and the peer's failures coming during a long transfer
                self._pump()
            time.sleep(POLL_S)


class ReceivingEnd:
    """Owns a local ring as its producer (``sink`` of :meth:`run`: a ``gpu_ipc.Producer`` with a CPU sync strategy,
    made like the sending end's ring from :meth:`wait_hello`'s layout) and publishes each slot once the sending end
    wrote it.
    :meth:`run` returns after the sending end's end of stream (every frame written published); raises
    :class:`PeerGone` (the caller decides what its own consumers see) or :class:`BridgeError` when its consumers
    hold a slot longer than ``stall_timeout``."""

    def __init__(self, transport: Transport, beat_interval: float = 0.1, peer_timeout: float = 0.6,
                 stall_timeout: float = 30.0, slice_s: float = 0.02) -> None:
        self.transport = transport
        self.live = Liveness(transport, "the sending end", beat_interval, peer_timeout)
        self.stall_timeout = stall_timeout
        self.slice_s = slice_s
        self.sink: Any = None
        self.stats = Stats()
        self.on_publish: Callable[[int], None] | None = None

    def wait_hello(self, timeout: float) -> dict[str, Any]:
        """The sending end's description of its frames (``shape``, ``dtype``, ``nbytes``, ``slots``)."""
        deadline = time.monotonic() + timeout
        self.live.heard = time.monotonic() + timeout  # not silent before it said hello
        while time.monotonic() < deadline:
            for kind, body in self.live.receive():
                if kind != HELLO:
                    raise ProtocolError(f"the sending end sent {kind!r} before its hello")
                layout = decode_hello(body)
                self.live.heard = time.monotonic()
                return layout
            time.sleep(POLL_S)
        raise PeerGone(f"no hello from the sending end within {timeout} s: start it, pointed at this end")

    def run(self, sink: Any, device: int) -> dict[str, Any]:
        self.sink = sink
        granted: Any = None
        since = time.monotonic()
        written_total: int | None = None
        ended = 0.0
        with self.live.failures(self.stats, "the receiving end"):
            while True:
                for kind, body in self.live.receive():
                    if kind == WRITTEN:
                        seq, _upstream = _unpack(_WRITTEN, body, "written")
                        if granted is None or seq != granted.seq:
                            raise ProtocolError(f"frame {seq} written, but the slot granted is "
                                                f"{None if granted is None else granted.seq}")
                        sink.publish(granted)
                        self.stats.count(granted.nbytes)
                        if self.on_publish is not None:
                            self.on_publish(seq)
                        granted, since = None, time.monotonic()
                    elif kind == END:
                        (written_total,) = _unpack(_END, body, "end")
                        ended = time.monotonic()
                    else:
                        raise ProtocolError(f"the sending end sent {kind!r} where frames were expected")
                if written_total is not None:
                    if self.stats.frames >= written_total:
                        self.live.send(encode(END, _END.pack(self.stats.frames)))  # the sending end may go now
                        self.stats.outcome = "end of stream"
                        return self.stats.summary()
                    if time.monotonic() - ended > self.live.peer_timeout:
                        raise ProtocolError(f"the sending end wrote {written_total} frames but only "
                                            f"{self.stats.frames} written notifications came")
                    time.sleep(POLL_S)  # the last written notification is on its way
                    continue
                if granted is None:
                    try:
                        granted = sink.acquire(timeout=self.slice_s)
                    except Timeout:
                        if time.monotonic() - since > self.stall_timeout:
                            raise BridgeError(
                                f"this ring's consumers held slot {sink.next_sequence % sink.slots} for more than "
                                f"{self.stall_timeout} s: a consumer is stuck (or raise --stall-timeout)") from None
                        continue
                    reach = self.transport.expose(granted.ptr, granted.nbytes, device)
                    self.live.send(encode_grant(
                        Grant(granted.seq, granted.slot, granted.ptr, granted.nbytes, device, reach)))
                else:
                    time.sleep(POLL_S)
