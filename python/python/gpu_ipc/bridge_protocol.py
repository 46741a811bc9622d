"""The bridge's protocol between its two ends, over any :class:`Transport` (NIXL in ``gpu_ipc.bridge_nixl``, an
in-process fake in the tests).

The receiving end owns a local ring as its producer; the sending end reads another ring as an ordinary consumer.

**Before the first frame.** The sending end says hello (its frame layout, and which path it wants). The receiving end
makes its ring, admits its consumers and *offers* where frames may be written: the ring's first slot (the *direct*
path) and ``window`` landing buffers of its own (the *landing* path: ordinary allocations UCX can reach over a GPU
path where it cannot reach the ring's memory, each frame then copied into the ring's slot by the receiving end). The
sending end waits for its ring's first frame and *probes* each path in turn with it: a few WRITEs of that frame,
timed, and the transport's own account of how they went (UCX's protocol table for them). It takes the first path
whose writes went over a GPU path (CUDA IPC or RDMA), or, if none did, the first path with a warning; with
``expect="gpu-direct"`` it refuses instead (:class:`TransportRefused`), before any frame reaches the receiving ring.
It tells the receiving end its *choice*.

**Per frame.** The receiving end *grants* a place to write (a notification with the sequence number, the slot or
buffer, its address and size, and what the transport needs to reach newly registered memory): on the direct path,
the ring's next slots, each as its producer acquires it, up to the offer's ``direct_window`` held at once (a
producer whose waits are on the CPU holds several: ``acquire_after``; 1 otherwise); on the landing path, each free
landing buffer, up to ``window`` grants in flight. The sending end WRITEs a frame of its ring into each grant, with a
*written* notification attached to the transfer (delivered after the data), and releases its frame once the transfer
is complete. The receiving end publishes the slot (direct) or acquires the ring's next slot, copies the landing
buffer into it and publishes it (landing) when the notification arrives, in order; a landing buffer is granted again
once its copy is done. So a slot is written only while the receiving end holds it (no consumer reads it), a frame
is released upstream only after it landed, and a slow consumer of the receiving ring slows the sending end (it gets
no grant) and, through the frames it holds, the upstream producer: at most the upstream ring's slots, the window and
the receiving ring's slots ahead of the slowest consumer.

Liveness: each end sends a heartbeat when it has sent nothing for ``beat_interval`` and gives up on a peer it has not
heard from for ``peer_timeout`` (or at once when the transport reports the peer unreachable). End of stream: the
sending end passes it with the count of frames written; a failure upstream (its producer died) is passed as a
failure, never as an end.
"""

from __future__ import annotations

import json
import os
import statistics
import time
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from gpu_ipc._gpu_ipc import EndOfStream, Timeout
from gpu_ipc.bridge_messages import (
    _END,
    BEAT,
    CHOICE,
    END,
    FAIL,
    GRANT,
    HELLO,
    MAGIC,
    MAX_WINDOW,
    OFFER,
    PROBE,
    WRITTEN,
    BridgeError,
    Choice,
    Grant,
    Offer,
    PathReport,
    PeerGone,
    ProtocolError,
    Region,
    TransportError,
    TransportRefused,
    _unpack,
    decode,
    decode_choice,
    decode_grant,
    decode_hello,
    decode_offer,
    encode,
    encode_choice,
    encode_grant,
    encode_offer,
    written_message,
)
from gpu_ipc.bridge_paths import EXPECTS, PATHS, PROBE_WRITES, Transport, probe_paths

POLL_S = 50e-6  # how long an end sleeps between polls of a transfer or of notifications
# While frames flow, an end that made no progress yields the CPU (os.sched_yield) instead of sleeping, for up to
# SPIN_S after its last progress: a sleep of POLL_S lasts 100 us or more (the kernel's timer slack), about a frame's
# time at thousands of frames per second, and each frame's round trip (grant, WRITE, written, publish) crosses both
# ends' loops. After SPIN_S without progress the end sleeps between polls again.
SPIN_S = 1e-3
# Landing buffers, so grants in flight, of a receiving end. Measured on one H200 (2026-11-29, 4K frames): 8 against 3
# within 3% with and without MPS once rows ran 4,000 frames (1,500-frame rows under MPS had said 1.08x against 0.86x:
# a tenth of a second is too short a span), so 3: each buffer is a frame of the receiving GPU's memory.
DEFAULT_WINDOW = 3
ACQUIRE_SLICE_S = 1e-3  # the landing path's wait for the ring's next slot, between looks at notifications
REPORT_EVERY_S = 10.0  # how often the sending end reports its transport and rate during a run
TIMES_KEPT = 8192  # the latest WRITE (and landing copy) times kept, for the medians: a long run stays bounded

# The messages (gpu_ipc.bridge_messages) and the path probe (gpu_ipc.bridge_paths) are modules of their own; their
# names are handed on from here, where the bridge's code and its tests have always found them. The receiving end is
# gpu_ipc.bridge_receive.
__all__ = [
    "ACQUIRE_SLICE_S", "BEAT", "CHOICE", "DEFAULT_WINDOW", "END", "EXPECTS", "FAIL", "GRANT", "HELLO", "MAGIC",
    "MAX_WINDOW", "OFFER", "PATHS", "POLL_S", "PROBE", "PROBE_WRITES", "REPORT_EVERY_S", "SPIN_S", "TIMES_KEPT",
    "WRITTEN",
    "BridgeError", "Choice", "Grant", "Liveness", "Offer", "Pace", "PathReport", "PeerGone", "ProtocolError",
    "Region", "SendingEnd", "Stats", "Transport", "TransportError", "TransportRefused", "decode",
    "decode_choice", "decode_grant", "decode_hello", "decode_offer", "encode", "encode_choice", "encode_grant",
    "encode_offer", "probe_paths",
]


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
        # Called on every turn of an end's loop, mostly to find nothing: that case does no more than it must.
        now = self.clock()
        raw = self.transport.receive()
        out: list[tuple[bytes, bytes]] = []
        if raw:
            self.heard = now
            messages = [decode(m) for m in raw]
            for kind, body in messages:
                if kind == FAIL:
                    reason = body.decode("utf-8", "replace")
                    raise PeerGone(f"{self.peer} failed: {reason}", reason)
            out = [(k, b) for k, b in messages if k != BEAT and k != PROBE]
        if now - self.heard > self.peer_timeout:
            raise PeerGone(
                f"{self.peer} has been silent for {now - self.heard:.2f} s (heartbeats every {self.beat_interval} s): "
                f"it died or the network between the ends is down")
        if now - self.sent >= self.beat_interval:
            self.send(_BEAT_MESSAGE)
        return out

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


_BEAT_MESSAGE = encode(BEAT)


def cpu_clocks() -> tuple[float, float]:
    """This process's CPU seconds (every thread: NIXL's and UCX's too) and the calling thread's."""
    return time.process_time(), time.thread_time()


@dataclass
class Stats:
    """What an end did: frames, bytes, seconds from the first frame to the last, and the CPU time its streaming
    took (:meth:`streaming` to :meth:`streamed`: the process's, and the end's own thread's)."""

    frames: int = 0
    bytes: int = 0
    first: float | None = None
    last: float = 0.0
    outcome: str = "running"
    cpu_from: tuple[float, float] | None = None
    cpu_to: tuple[float, float] | None = None
    busy_s: float = 0.0  # the wall time of the streaming loop's turns that moved a frame on (its other turns wait)

    def streaming(self) -> None:
        """Frames begin to flow (the path chosen): the CPU time per frame counts from here."""
        self.cpu_from = cpu_clocks()

    def streamed(self) -> None:
        """Frames stopped flowing (the end of the stream, or a failure)."""
        if self.cpu_from is not None and self.cpu_to is None:
            self.cpu_to = cpu_clocks()

    def count(self, nbytes: int) -> None:
        now = time.perf_counter()
        if self.first is None:
            self.first = now
        self.last = now
        self.frames += 1
        self.bytes += nbytes

    def summary(self) -> dict[str, Any]:
        """Frames, bytes, outcome, FPS; ``cpu_us_per_frame``: the process's CPU time while frames flowed (its
        polls and NIXL's threads included) over the frames, ``thread_cpu_us_per_frame``: the end's own thread's
        (None before a frame); ``busy_us_per_frame``: the wall time of the streaming loop's turns that moved a
        frame on, over the frames (an end spins while frames flow, so its CPU time is its wall time: this says how
        much of it was work; near the wall time per frame, the end sets the pace; None before a timed turn)."""
        wall = (self.last - self.first) if self.first is not None else 0.0
        cpu: list[float | None] = [None, None]
        if self.cpu_from is not None and self.frames:
            to = self.cpu_to or cpu_clocks()
            cpu = [(to[i] - self.cpu_from[i]) / self.frames * 1e6 for i in (0, 1)]
        return {"frames": self.frames, "bytes": self.bytes, "outcome": self.outcome,
                "fps": (self.frames - 1) / wall if wall > 0 else 0.0,
                "cpu_us_per_frame": cpu[0], "thread_cpu_us_per_frame": cpu[1],
                "busy_us_per_frame": self.busy_s / self.frames * 1e6 if self.frames and self.busy_s else None}


class Pace:
    """How an end's streaming loop ends a turn: a turn that moved a frame on counts its wall time as busy
    (``Stats.busy_s``) and starts the calm; a turn without progress yields the CPU for up to :data:`SPIN_S` of calm,
    then sleeps :data:`POLL_S`. ``turn(began, progressed)``, ``began`` the turn's ``time.perf_counter()``."""

    __slots__ = ("calm", "stats")

    def __init__(self, stats: Stats) -> None:
        self.stats = stats
        self.calm = time.perf_counter()  # the last progress

    def turn(self, began: float, progressed: bool) -> None:
        if progressed:
            self.calm = now = time.perf_counter()
            self.stats.busy_s += now - began
        elif time.perf_counter() - self.calm < SPIN_S:
            os.sched_yield()
        else:
            time.sleep(POLL_S)


def _median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


class _InFlight(NamedTuple):
    frame: Any
    grant: Grant
    handle: Any
    started: float


class SendingEnd:
    """Reads frames of a local ring (``source``: a ``gpu_ipc.Consumer`` with a CPU sync strategy) and writes each
    into a place the receiving end granted, up to the offered window at a time.

    ``path``: ``"auto"`` (the landing path if its probe went over a GPU path, else the direct path if its did, else
    the first offered, with a warning), ``"landing"`` or ``"direct"``. ``expect``: ``"gpu-direct"`` refuses GPU
    frames a path that is not a GPU path (:class:`TransportRefused`, before the first frame; during the run when
    the transport changes its path). ``report_every``: seconds between the run's reports (``log``).
    :meth:`run` returns at the end of the source's stream, after telling the receiving end; raises
    :class:`PeerGone`, :class:`TransportError`, :class:`TransportRefused`, or the source's ``ProducerGone``
    (after telling the receiving end)."""

    def __init__(self, transport: Transport, source: Any, device: int, beat_interval: float = 0.1,
                 peer_timeout: float = 0.6, slice_s: float = 0.02, path: str = "auto", expect: str = "any",
                 report_every: float = REPORT_EVERY_S, log: Callable[[str], None] | None = None) -> None:
        if path not in PATHS:
            raise BridgeError(f"path {path!r}: one of {', '.join(PATHS)}")
        if expect not in EXPECTS:
            raise BridgeError(f"expect {expect!r}: one of {', '.join(EXPECTS)}")
        self.transport = transport
        self.source = source
        self.device = device
        self.live = Liveness(transport, "the receiving end", beat_interval, peer_timeout)
        self.slice_s = slice_s
        self.path = path
        self.expect = expect
        self.report_every = report_every
        self.log = log or (lambda _text: None)
        self.grants: deque[Grant] = deque()
        self.stats = Stats()
        self.chosen: Choice | None = None
        self.window = 1
        self.probes: list[dict[str, Any]] = []
        self.reports: list[dict[str, Any]] = []
        self.warning: str | None = None
        self.write_s: deque[float] = deque(maxlen=TIMES_KEPT)  # the latest WRITEs, from start to completion seen

    def hello(self) -> None:
        """Tells the receiving end what each frame is, so that it makes its ring alike, and which path it wants."""
        s = self.source
        layout = {"shape": list(s.shape), "dtype": s.dtype, "nbytes": s.nbytes, "slots": s.slots, "path": self.path}
        self.live.send(encode(HELLO, json.dumps(layout).encode()))

    def summary(self) -> dict[str, Any]:
        """The run so far: frames, FPS, outcome, the path, its probes and reports."""
        out = self.stats.summary()
        report = self.chosen.report if self.chosen is not None else None
        out.update(path=self.chosen.path if self.chosen is not None else None, window=self.window,
                   path_report=report.as_dict() if report is not None else None,
                   transport=report.account() if report is not None else None, transport_warning=self.warning,
                   probes=self.probes, reports=self.reports,
                   write_ms_p50=(_median(list(self.write_s)) or 0.0) * 1e3)
        return out

    def _quiet(self) -> None:
        """Liveness while nothing but heartbeats is expected."""
        for kind, _body in self.live.receive():
            raise ProtocolError(f"the receiving end sent {kind!r} before the sending end chose a path")

    def _pump(self) -> None:
        for kind, body in self.live.receive():
            if kind != GRANT:
                raise ProtocolError(f"the receiving end sent {kind!r} where grants were expected")
            grant = decode_grant(body)
            self.transport.learn(grant.reach)
            self.grants.append(grant)

    def _wait_offer(self) -> Offer:
        while True:
            for kind, body in self.live.receive():
                if kind != OFFER:
                    raise ProtocolError(f"the receiving end sent {kind!r} where its offer was expected")
                return decode_offer(body)
            time.sleep(POLL_S)

    def _first_frame(self) -> Any:
        """The source's first frame, or None at the end of its stream."""
        while True:
            self._quiet()
            try:
                return self.source.next_frame(timeout=self.slice_s)
            except Timeout:
                continue
            except EndOfStream:
                return None

    def run(self) -> dict[str, Any]:
        with self.live.failures(self.stats, "the sending end"):
            offer = self._wait_offer()
            first = self._first_frame()
            if first is None:
                self._finish()
                return self.summary()
            self._choose(offer, first)
            self.stats.streaming()
            try:
                self._stream(first)
            finally:
                self.stats.streamed()
            return self.summary()

    def _choose(self, offer: Offer, frame: Any) -> None:
        """Probes the offered paths with ``frame`` (still held, not yet counted), takes one, tells the receiving end;
        :class:`TransportRefused` when ``expect`` is ``gpu-direct`` and no path is a GPU path."""
        name, report, warning = probe_paths(self.transport, offer, frame, self.device, self.path, self._quiet,
                                            self.log, self.probes)
        if warning is not None:
            self.warning = warning
            if self.expect == "gpu-direct":
                raise TransportRefused(f"--expect gpu-direct: {self.warning}; refused before the first frame")
            self.log(f"WARNING: {self.warning}")
        self.chosen = Choice(name, report)
        self.window = offer.window if name == "landing" else offer.direct_window
        self.live.send(encode_choice(self.chosen))
        self.log(f"path {name} (window {self.window}): {report.account()}")

    def _stream(self, pending: Any) -> None:
        """Writes ``pending`` and every later frame of the source, up to ``window`` WRITEs in flight."""
        # The loop runs once or more per frame: what it calls is looked up once, here.
        transport, source, stats, grants, write_s = self.transport, self.source, self.stats, self.grants, self.write_s
        done, write, next_frame, release = transport.done, transport.write, source.next_frame, source.release
        pump, clock, monotonic, device, window = self._pump, time.perf_counter, time.monotonic, self.device, self.window
        in_flight: deque[_InFlight] = deque()
        sent = 0
        # At most min(window, the source's slots) WRITEs in flight, each holding a frame: consecutive lanes modulo
        # that are distinct among them.
        lanes = max(1, min(window, int(source.slots)))
        next_report = monotonic() + self.report_every
        last = (monotonic(), 0, time.process_time())
        end_turn = Pace(stats).turn
        while True:
            began = clock()
            pump()
            progressed = False
            while in_flight and done(in_flight[0].handle):
                w = in_flight.popleft()
                write_s.append(clock() - w.started)
                release(w.frame)
                stats.count(w.grant.nbytes)
                progressed = True
            room = bool(grants) and len(in_flight) < window
            if room and pending is None:
                try:
                    pending = next_frame(timeout=POLL_S if in_flight else self.slice_s)
                except Timeout:
                    pass
                except EndOfStream:
                    self._drain(in_flight)
                    self._finish()
                    return
            if room and pending is not None:
                grant = grants.popleft()
                nbytes = pending.nbytes
                if grant.nbytes != nbytes:
                    raise ProtocolError(f"granted {grant.nbytes} bytes for a frame of {nbytes}")
                handle = write(pending.ptr, nbytes, device, grant.ptr, grant.device,
                               written_message(grant.seq, pending.seq), sent % lanes)
                in_flight.append(_InFlight(pending, grant, handle, clock()))
                sent += 1
                pending = None
                progressed = True
            now = monotonic()
            if now >= next_report:
                last = self._report(now, last, pending.nbytes if pending is not None else source.nbytes)
                next_report = now + self.report_every
            end_turn(began, progressed)

    def _drain(self, in_flight: deque[_InFlight]) -> None:
        """Waits for the WRITEs in flight (the stream ended) and releases their frames."""
        while in_flight:
            self._pump()
            if self.transport.done(in_flight[0].handle):
                w = in_flight.popleft()
                self.write_s.append(time.perf_counter() - w.started)
                self.source.release(w.frame)
                self.stats.count(w.grant.nbytes)
            else:
                time.sleep(POLL_S)

    def _report(self, now: float, last: tuple[float, int, float], nbytes: int) -> tuple[float, int, float]:
        """The run's report: frames, the rate since the last one, the WRITEs' time, this process's CPU time per
        frame since the last one, the path, any change of it."""
        since, frames_then, cpu_then = last
        cpu = time.process_time()
        recent = list(self.write_s)[-max(1, min(self.stats.frames - frames_then, TIMES_KEPT)):]
        write_s = _median(recent)
        frames = self.stats.frames - frames_then
        entry: dict[str, Any] = {
            "at_frame": self.stats.frames, "fps": frames / max(now - since, 1e-9),
            "write_ms_p50": write_s * 1e3 if write_s else None,
            "write_gbps": nbytes / write_s / 1e9 if write_s else None,
            "cpu_us_per_frame": (cpu - cpu_then) / frames * 1e6 if frames else None,
            "path": self.chosen.path if self.chosen else None}
        changed = self.transport.recheck(nbytes)
        if changed is not None:
            entry["changed"] = changed.as_dict()
            self.log(f"UCX chose a path anew: {changed.account()}")
            if changed.gpu_direct is False:
                self.warning = f"GPU frames now go over {', '.join(changed.transports)}, not CUDA IPC or RDMA"
                if self.expect == "gpu-direct":
                    raise TransportRefused(f"--expect gpu-direct: {self.warning} (after {self.stats.frames} frames)")
                self.log(f"WARNING: {self.warning}")
        self.reports.append(entry)
        rate = f", WRITEs p50 {entry['write_ms_p50']:.3f} ms ({entry['write_gbps']:.1f} GB/s)" if write_s else ""
        if frames:
            rate += f", CPU {entry['cpu_us_per_frame']:.1f} us/frame"
        account = self.chosen.report.account() if self.chosen else "-"
        self.log(f"{self.stats.frames} frames, {entry['fps']:.1f} FPS{rate}; path "
                 f"{entry['path']} (window {self.window}) over {account}")
        return now, self.stats.frames, cpu

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
