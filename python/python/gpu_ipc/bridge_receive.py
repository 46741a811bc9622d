"""The bridge's receiving end (the protocol: ``gpu_ipc.bridge_protocol``): it owns a local ring as its producer,
offers the sending end where frames may be written (the ring's slot, its own landing buffers), grants each place in
turn and publishes every frame written, in order."""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from typing import Any, Protocol

from gpu_ipc._gpu_ipc import Timeout
from gpu_ipc.bridge_messages import (
    _END,
    _WRITTEN,
    CHOICE,
    END,
    HELLO,
    MAX_WINDOW,
    WRITTEN,
    BridgeError,
    Choice,
    Grant,
    Offer,
    PathReport,
    PeerGone,
    ProtocolError,
    Region,
    _unpack,
    decode_choice,
    decode_hello,
    encode,
    encode_offer,
    grant_message,
)
from gpu_ipc.bridge_paths import Transport
from gpu_ipc.bridge_protocol import (
    ACQUIRE_SLICE_S,
    DEFAULT_WINDOW,
    POLL_S,
    Liveness,
    Pace,
    Stats,
    _median,
)

__all__ = ["CPU_WAITS", "Landing", "ReceivingEnd"]

# The strategies whose waits are on the CPU (gpu_ipc.sync_strategies(): "waits": "cpu"), where a ring's producer may
# hold several slots at once (Producer.acquire_after): the direct path then grants that many.
CPU_WAITS = ("cpu-spin", "cpu-sleep", "ipc-event")


class Landing(Protocol):
    """The receiving end's landing buffers (``gpu_ipc.bridge_staging``: device or host memory)."""

    ptrs: list[int]

    @property
    def stream_handle(self) -> int | None:
        """What the ring's publish waits for (the copies' stream); None: the copies are done when made."""

    def enter(self) -> None:
        """Readies the calling thread for :meth:`copy_out` and :meth:`done` (the thread that streams calls it)."""

    def copy_out(self, index: int, dst: int) -> None:
        """Copies buffer ``index`` into ``dst`` (queued on ``stream_handle``, or done)."""

    def done(self, index: int) -> bool:
        """Whether buffer ``index`` may be written again."""

    def copy_times_us(self) -> list[float]:
        """How long the copies took (each, or a sample of them)."""

    def close(self) -> None:
        """Frees the buffers (after their copies)."""


class ReceivingEnd:
    """Owns a local ring as its producer (``sink`` of :meth:`run`: a ``gpu_ipc.Producer`` with a CPU sync strategy,
    made like the sending end's ring from :meth:`wait_hello`'s layout) and publishes each frame the sending end
    wrote, in order.

    ``window``: landing buffers to offer (0: none, the direct path only); ``make_landing(nbytes, count)`` makes them
    (a :class:`BridgeError` from it leaves the direct path only, and says why). :meth:`run` returns after the
    sending end's end of stream (every frame written published); raises :class:`PeerGone` (the caller decides what
    its own consumers see) or :class:`BridgeError` when its consumers hold a slot longer than ``stall_timeout``.
    The landing buffers are freed when :meth:`run` returns, not when it raises (the peer may still be writing:
    the process should end)."""

    def __init__(self, transport: Transport, beat_interval: float = 0.1, peer_timeout: float = 0.6,
                 stall_timeout: float = 30.0, slice_s: float = 0.02, window: int = DEFAULT_WINDOW,
                 make_landing: Callable[[int, int], Landing] | None = None) -> None:
        if not 0 <= window <= MAX_WINDOW:
            raise BridgeError(f"a window of {window}: 0 (no landing buffers) to {MAX_WINDOW}")
        self.transport = transport
        self.live = Liveness(transport, "the sending end", beat_interval, peer_timeout)
        self.stall_timeout = stall_timeout
        self.slice_s = slice_s
        self.window = window
        self.direct_window = 1  # the ring's slots granted at once on the direct path (set by the offer)
        self.make_landing = make_landing
        self.landing: Landing | None = None
        self.layout: dict[str, Any] = {}
        self.sink: Any = None
        self.stats = Stats()
        self.choice: Choice | None = None
        self.on_publish: Callable[[int], None] | None = None
        self._written_total: int | None = None
        self._ended = 0.0

    def wait_hello(self, timeout: float) -> dict[str, Any]:
        """The sending end's description of its frames (``shape``, ``dtype``, ``nbytes``, ``slots``, ``path``)."""
        deadline = time.monotonic() + timeout
        self.live.heard = time.monotonic() + timeout  # not silent before it said hello
        while time.monotonic() < deadline:
            for kind, body in self.live.receive():
                if kind != HELLO:
                    raise ProtocolError(f"the sending end sent {kind!r} before its hello")
                self.layout = decode_hello(body)
                self.live.heard = time.monotonic()
                return self.layout
            time.sleep(POLL_S)
        raise PeerGone(f"no hello from the sending end within {timeout} s: start it, pointed at this end")

    def summary(self) -> dict[str, Any]:
        out = self.stats.summary()
        times = self.landing.copy_times_us() if self.landing is not None else []
        out.update(path=self.choice.path if self.choice else None,
                   window=(self.window if self.choice and self.choice.path == "landing" else self.direct_window),
                   sender_report=self.choice.report.as_dict() if self.choice else None,
                   landing_copy_us_p50=_median(times), landing_copies=len(times))
        return out

    def run(self, sink: Any, device: int) -> dict[str, Any]:
        self.sink = sink
        with self.live.failures(self.stats, "the receiving end"):
            held = self._offer(sink, device)
            self.choice = self._wait_choice()
            self.stats.streaming()
            try:
                if self.choice.path == "landing":
                    self._landing(sink, device, held)
                else:
                    self._direct(sink, device, held)
            finally:
                self.stats.streamed()
        if self.landing is not None:
            self.landing.close()
        return self.summary()

    def _acquire(self, sink: Any, since: float, timeout: float, after: Any = None) -> Any:
        """The ring's next slot (or, ``after`` a slot held, the one after it: ``acquire_after``), or None after
        ``timeout``; :class:`BridgeError` once its consumers held it for more than ``stall_timeout`` since
        ``since``."""
        try:
            return sink.acquire(timeout=timeout) if after is None else sink.acquire_after(after, timeout=timeout)
        except Timeout:
            if time.monotonic() - since > self.stall_timeout:
                seq = sink.next_sequence if after is None else after.seq + 1
                raise BridgeError(
                    f"this ring's consumers held slot {seq % sink.slots} for more than "
                    f"{self.stall_timeout} s: a consumer is stuck (or raise --stall-timeout)") from None
            return None

    def _offer(self, sink: Any, device: int) -> Any:
        """Offers the ring's first slot (held: returned) and the landing buffers, as the hello asked."""
        path = self.layout.get("path", "auto")
        nbytes = int(sink.nbytes)
        held = None
        direct = None
        if path in ("auto", "direct"):
            since = time.monotonic()
            while held is None:
                self._expect_nothing()
                held = self._acquire(sink, since, self.slice_s)
            direct = Grant(held.seq, held.slot, held.ptr, nbytes, device,
                           self.transport.expose(held.ptr, nbytes, device))
        regions: list[Region] = []
        error = ""
        if path in ("auto", "landing"):
            if self.window < 1:
                error = "the receiving end runs with --window 0"
            elif self.make_landing is None:
                error = "the receiving end cannot make landing buffers"
            else:
                try:
                    self.landing = self.make_landing(nbytes, self.window)
                except BridgeError as e:
                    error = str(e)
                else:
                    for p in self.landing.ptrs:
                        regions.append(Region(p, nbytes, device, self.transport.expose(p, nbytes, device)))
                        self._expect_nothing()  # heartbeats between registrations
        if direct is not None:
            # The ring's slots granted at once on the direct path: as many as the window, leaving the ring's
            # consumers a slot, where the ring lets its producer hold several (strategies that wait on the CPU).
            if callable(getattr(sink, "acquire_after", None)) and getattr(sink, "sync", None) in CPU_WAITS:
                self.direct_window = max(1, min(max(self.window, 1), int(sink.slots) - 1))
        self.live.send(encode_offer(Offer(self.window if regions else 0, direct, tuple(regions), error,
                                          self.direct_window)))
        return held

    def _expect_nothing(self) -> None:
        for kind, _body in self.live.receive():
            raise ProtocolError(f"the sending end sent {kind!r} before the receiving end offered its paths")

    def _wait_choice(self) -> Choice:
        """The sending end's choice (it waits for its ring's first frame first: unbounded, heartbeats go on)."""
        while True:
            for kind, body in self.live.receive():
                if kind == CHOICE:
                    choice = decode_choice(body)
                    if choice.path == "landing" and self.landing is None:
                        raise ProtocolError("the sending end chose the landing path, which was not offered")
                    return choice
                if kind == END:
                    (total,) = _unpack(_END, body, "end")
                    if total:
                        raise ProtocolError(f"the sending end wrote {total} frames before choosing a path")
                    self._written_total, self._ended = 0, time.monotonic()  # its stream ended before a frame
                    return Choice("direct", PathReport((), "", None, "no frame came", 0.0))
                raise ProtocolError(f"the sending end sent {kind!r} where its choice of path was expected")
            time.sleep(POLL_S)

    def _messages(self, on_written: Callable[[int], None]) -> None:
        """The sending end's notifications while frames flow: written frames (``on_written(seq)``) and the end."""
        for kind, body in self.live.receive():
            if kind == WRITTEN:
                seq, _upstream = _unpack(_WRITTEN, body, "written")
                on_written(seq)
            elif kind == END:
                (self._written_total,) = _unpack(_END, body, "end")
                self._ended = time.monotonic()
            else:
                raise ProtocolError(f"the sending end sent {kind!r} where frames were expected")

    def _ended_cleanly(self) -> bool:
        """After the sending end's end: True once every frame it wrote is published (and acknowledged)."""
        if self._written_total is None:
            return False
        if self.stats.frames >= self._written_total:
            self.live.send(encode(END, _END.pack(self.stats.frames)))  # the sending end may go now
            self.stats.outcome = "end of stream"
            return True
        if time.monotonic() - self._ended > self.live.peer_timeout:
            raise ProtocolError(f"the sending end wrote {self._written_total} frames but only "
                                f"{self.stats.frames} written notifications came")
        return False

    def _published(self, seq: int, nbytes: int) -> None:
        self.stats.count(nbytes)
        if self.on_publish is not None:
            self.on_publish(seq)

    def _direct(self, sink: Any, device: int, held: Any) -> None:
        """The direct path: the ring's slots granted as they are acquired, up to ``direct_window`` at once (the
        ring's producer holds them: ``acquire_after``); each published, in order, once its written notification
        came."""
        nbytes, window = int(sink.nbytes), self.direct_window
        granted: deque[Any] = deque()  # slots held and granted, in order
        waiting: Any = held  # a slot held, not granted yet
        written: set[int] = set()
        since = time.monotonic()
        clock, end_turn = time.perf_counter, Pace(self.stats).turn

        def on_written(seq: int) -> None:
            if not any(slot.seq == seq for slot in granted):
                raise ProtocolError(f"frame {seq} written, but the slots granted are {[s.seq for s in granted]}")
            written.add(seq)

        while True:
            began = clock()
            self._messages(on_written)
            progressed = False
            while granted and granted[0].seq in written:
                slot = granted.popleft()
                written.discard(slot.seq)
                sink.publish(slot)
                self._published(slot.seq, nbytes)
                since, progressed = time.monotonic(), True
            if self._ended_cleanly():
                return
            if self._written_total is not None:
                end_turn(began, progressed)  # the last written notifications are on their way
                continue
            if waiting is None and len(granted) < window:
                waiting = self._acquire(sink, since, ACQUIRE_SLICE_S, granted[-1] if granted else None)
            if waiting is not None:
                reach = self.transport.expose(waiting.ptr, nbytes, device)
                self.live.send(grant_message(waiting.seq, waiting.slot, waiting.ptr, nbytes, device, reach))
                granted.append(waiting)
                waiting, progressed = None, True
            end_turn(began, progressed)

    def _landing(self, sink: Any, device: int, held: Any) -> None:
        """The landing path: every free landing buffer granted; each written one copied into the ring's next slot
        and published, in order; a buffer granted again once its copy is done."""
        landing = self.landing
        assert landing is not None
        nbytes = int(sink.nbytes)
        free: deque[int] = deque(range(len(landing.ptrs)))
        outstanding: dict[int, int] = {}  # seq -> landing buffer granted for it
        written: dict[int, int] = {}  # seq -> landing buffer written, waiting for the ring's slot
        copying: deque[int] = deque()  # landing buffers being copied out, oldest first
        next_grant = next_publish = int(held.seq) if held is not None else int(sink.next_sequence)
        since = time.monotonic()
        # The loop runs once or more per frame: what it calls is looked up once, here.
        landing.enter()
        ptrs, stream, copy_out, copy_done = landing.ptrs, landing.stream_handle, landing.copy_out, landing.done
        publish, send, messages, published = sink.publish, self.live.send, self._messages, self._published
        monotonic, clock, end_turn = time.monotonic, time.perf_counter, Pace(self.stats).turn

        def on_written(seq: int) -> None:
            nonlocal since
            if seq not in outstanding:
                raise ProtocolError(f"frame {seq} written, but it was not granted (granted: {sorted(outstanding)})")
            if not written:
                since = monotonic()  # a frame waits for the ring's slot from now
            written[seq] = outstanding.pop(seq)

        while True:
            began = clock()
            messages(on_written)
            progressed = False
            while next_publish in written:
                if held is None:
                    held = self._acquire(sink, since, ACQUIRE_SLICE_S)
                    if held is None:
                        break
                if held.seq != next_publish:
                    raise BridgeError(f"the ring's next slot is for frame {held.seq}, the bridge's next is "
                                      f"{next_publish}")
                index = written.pop(next_publish)
                copy_out(index, held.ptr)
                publish(held, stream=stream)
                held = None
                copying.append(index)
                published(next_publish, nbytes)
                next_publish += 1
                since = monotonic()
                progressed = True
            while copying and copy_done(copying[0]):
                free.append(copying.popleft())
            if self._written_total is not None and self._ended_cleanly():
                return
            while free and self._written_total is None:
                index = free.popleft()
                send(grant_message(next_grant, index, ptrs[index], nbytes, device))
                outstanding[next_grant] = index
                next_grant += 1
                progressed = True
            if written and monotonic() - since > self.stall_timeout:
                raise BridgeError(f"this ring's consumers held slot {next_publish % sink.slots} for more than "
                                  f"{self.stall_timeout} s: a consumer is stuck (or raise --stall-timeout)")
            end_turn(began, progressed)
