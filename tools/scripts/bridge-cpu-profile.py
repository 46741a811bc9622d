#!/usr/bin/env python3
"""Each end of the NIXL bridge's CPU time per frame on the host backend (no GPU), and where it goes.

    python tools/scripts/bridge-cpu-profile.py [--frames 3000] [--transport auto|nixl|fake] [--path auto|landing|direct]
                                               [--window 3] [--sync cpu-sleep] [--no-profile] [--top 20] [--json OUT]

Run it with the Python that has the gpu_ipc wheel (and NIXL): ``target/py-test/venv/bin/python``, which
``scripts/python-test.sh`` makes. Ring A (host memory, 3 slots) is fed by this process as fast as the bridge takes
frames, ring B (2 slots, or --slots-b) read by it as fast as they come; nothing fills or checks the frames' bytes.

- ``nixl`` (the default when NIXL loads): each end its own process, as ``python -m gpu_ipc.bridge`` runs them
  (``gpu_ipc.bridge.send`` / ``receive``, UCX over DRAM between processes). Its figures are the whole process's CPU
  time, NIXL's progress and listener threads included, and the end's own thread apart.
- ``fake``: both ends in threads of this process over an in-process transport (memmove, notifications in deques):
  the protocol's Python alone. Figures per end are its thread's CPU time.

The per-frame loop is the end's streaming phase (``SendingEnd._stream``; ``ReceivingEnd._landing`` / ``_direct``),
from the first grant to the end of the stream, set-up and the path probe excluded. Run twice: once plain, for the
figures, then under cProfile for the top functions by own time (cProfile's own cost inflates that run's figures,
which are printed too, marked). The ends poll: CPU time per frame includes their polls (and spins, with a spinning
sync strategy) while they wait, so a bridge fed slower than it can go shows more per frame.
"""

from __future__ import annotations

import argparse
import cProfile
import ctypes
import io
import json
import os
import pstats
import resource
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import gpu_ipc
from gpu_ipc import bridge_protocol as bp
from gpu_ipc import bridge_receive as br
from gpu_ipc.bridge_staging import HostLanding

LOOPS = {"send": (bp.SendingEnd, ("_stream",)), "receive": (br.ReceivingEnd, ("_landing", "_direct"))}


def _threads() -> dict[str, float]:
    """Each thread of this process (``name/tid``) and its CPU seconds so far, from /proc (Linux)."""
    out: dict[str, float] = {}
    tick = os.sysconf("SC_CLK_TCK")
    try:
        for tid in os.listdir("/proc/self/task"):
            with open(f"/proc/self/task/{tid}/stat") as f:
                stat = f.read()
            name, fields = stat[stat.index("(") + 1:stat.rindex(")")], stat[stat.rindex(")") + 2:].split()
            out[f"{name}/{tid}"] = (int(fields[11]) + int(fields[12])) / tick  # utime, stime
    except OSError:
        pass
    return out


def _cpu() -> dict[str, float]:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return {"process_s": time.process_time(), "thread_s": time.thread_time(), "user_s": r.ru_utime,
            "sys_s": r.ru_stime, "voluntary_switches": float(r.ru_nvcsw), "involuntary_switches": float(r.ru_nivcsw),
            "wall_s": time.perf_counter()}


class LoopMeter:
    """Wraps an end's per-frame loop: its process and thread CPU time and wall time across the call, and (``profile``)
    a cProfile of it (the thread that runs it)."""

    def __init__(self, profile: bool, timer: str = "cpu") -> None:
        self.profile = profile
        self.timer = timer
        self.spent: dict[str, float] = {}
        self.stats: pstats.Stats | None = None
        self.note = ""
        self.threads: dict[str, float] = {}

    def wrap(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        def measured(*args: Any, **kwargs: Any) -> Any:
            prof = None
            if self.profile:  # cpu: the thread's CPU time (a sleep costs nothing); wall: time.perf_counter
                prof = cProfile.Profile(time.thread_time) if self.timer == "cpu" else cProfile.Profile()
            before, threads = _cpu(), _threads()
            if prof is not None:
                try:
                    prof.enable()
                except ValueError as e:  # Python 3.12+: one profiler at a time in a process
                    self.note, prof = f"not profiled: {e}", None
            try:
                return fn(*args, **kwargs)
            finally:
                if prof is not None:
                    prof.disable()
                    self.stats = pstats.Stats(prof)
                after = _cpu()
                self.spent = {k: after[k] - before[k] for k in after}
                self.threads = {k: v - threads.get(k, 0.0) for k, v in _threads().items()}
        return measured

    def patch(self, side: str) -> None:
        """Wraps ``side``'s loop methods on the class (this process only)."""
        cls, names = LOOPS[side]
        for name in names:
            setattr(cls, name, self.wrap(getattr(cls, name)))

    def result(self, frames: int, top: int) -> dict[str, Any]:
        n = max(frames, 1)
        out: dict[str, Any] = {"frames": frames, **{k: v for k, v in self.spent.items()}}
        for key in ("process_s", "thread_s", "user_s", "sys_s", "wall_s"):
            out[key.replace("_s", "_us_per_frame")] = self.spent.get(key, 0.0) / n * 1e6
        for key in ("voluntary_switches", "involuntary_switches"):
            out[f"{key}_per_frame"] = self.spent.get(key, 0.0) / n
        out["threads_us_per_frame"] = {k: v / n * 1e6 for k, v in sorted(self.threads.items(), key=lambda kv: -kv[1])
                                       if v > 0}
        if self.stats is not None:
            text = io.StringIO()
            self.stats.stream = text  # type: ignore[attr-defined]
            self.stats.sort_stats("tottime").print_stats(top)
            out["profile"] = text.getvalue()
        elif self.note:
            out["profile"] = self.note
        return out


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _feed(producer: Any, frames: int) -> None:
    try:
        for _ in range(frames):
            producer.publish(producer.acquire(timeout=30))
    finally:
        producer.close()


def _read(consumer: Any) -> int:
    read = 0
    while True:
        try:
            frame = consumer.next_frame(timeout=30)
        except gpu_ipc.EndOfStream:
            return read
        consumer.release(frame)
        read += 1


# --- nixl: each end its own process --------------------------------------------------------------------------------

def _child(args: argparse.Namespace) -> None:
    """One end (``--role``), its loop measured; writes its summary and measurement to ``--out``."""
    from gpu_ipc import bridge
    from gpu_ipc.bridge_nixl import ProtocolTables

    meter = LoopMeter(args.profile_child, args.timer)
    meter.patch(args.role)
    extra: dict[str, Any] = {"progress_thread": True} if args.nixl_progress_thread else {}  # left out: older bridges
    if args.role == "send":
        tables = ProtocolTables()
        tables.start()
        try:
            summary = bridge.send(args.sock_a, "127.0.0.1", args.port, args.name, "host", path=args.path,
                                  tables=tables, report_every=args.report_every, **extra)
        finally:
            tables.stop()
    else:
        summary = bridge.receive(args.sock_b, args.port, args.name, "host", slots=args.slots_b, sync=args.sync,
                                 consumers=1,
                                 window=args.window, **extra)
    result = {"summary": summary, "loop": meter.result(int(summary["frames"]), args.top)}
    with open(args.out, "w") as f:
        json.dump(result, f)


def run_nixl(args: argparse.Namespace, profile: bool) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="gi-cpu-", dir="/tmp") as tmp:
        sock_a, sock_b, port = f"{tmp}/a.sock", f"{tmp}/b.sock", _free_port()
        name = f"cpu-profile-{os.getpid()}"
        producer = gpu_ipc.Producer(sock_a, width=args.width, height=args.height, slots=3, sync=args.sync,
                                    backend="host")
        base = [sys.executable, os.path.abspath(__file__), "--sock-a", sock_a, "--sock-b", sock_b, "--port",
                str(port), "--name", name, "--path", args.path, "--window", str(args.window), "--sync", args.sync,
                "--top", str(args.top), "--report-every", str(args.report_every), "--timer", args.timer]
        if profile:
            base.append("--profile-child")
        if args.nixl_progress_thread:
            base.append("--nixl-progress-thread")
        procs = {}
        for role in ("receive", "send"):
            procs[role] = subprocess.Popen([*base, "--role", role, "--out", f"{tmp}/{role}.json"],
                                           stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        consumer = None
        try:
            producer.wait_for_consumers(1, timeout=30)
            consumer = gpu_ipc.Consumer(sock_b, backend="host", name="reader", wait_for_producer=30, timeout=30)
            feeder = threading.Thread(target=_feed, args=(producer, args.frames))
            feeder.start()
            read = _read(consumer)
            feeder.join(30)
            out: dict[str, Any] = {"read": read}
            for role, p in procs.items():
                _, err = p.communicate(timeout=60)
                if p.returncode != 0:
                    raise SystemExit(f"the {role} end failed (exit {p.returncode}):\n{err}")
                with open(f"{tmp}/{role}.json") as f:
                    out[role] = json.load(f)
            return out
        finally:
            for p in procs.values():
                if p.poll() is None:
                    p.kill()
                    p.wait()
            if consumer is not None:
                consumer.close()
            producer.close()


# --- fake: both ends in threads of this process ---------------------------------------------------------------------

class FakeTransport:
    """One side of an in-process link: notifications through deques, WRITEs by memmove, done at once (the written
    notification sent on the first look, as NIXL delivers it after the data)."""

    def __init__(self, boxes: dict[str, deque[bytes]], side: str) -> None:
        self.boxes, self.side = boxes, side
        self.peer = "receive" if side == "send" else "send"

    def send(self, message: bytes) -> None:
        self.boxes[self.peer].append(message)

    def receive(self) -> list[bytes]:
        box = self.boxes[self.side]
        out = []
        while box:
            out.append(box.popleft())
        return out

    def expose(self, ptr: int, nbytes: int, device: int) -> bytes:
        return b""

    def learn(self, info: bytes) -> None:
        pass

    def write(self, ptr: int, nbytes: int, device: int, remote_ptr: int, remote_device: int,
              notification: bytes, lane: int = 0) -> Any:
        ctypes.memmove(remote_ptr, ptr, nbytes)
        return [notification]

    def done(self, handle: Any) -> bool:
        if handle[0] is not None:
            self.send(handle[0])
            handle[0] = None
        return True

    def probe(self, ptr: int, nbytes: int, device: int, remote_ptr: int, remote_device: int,
              notification: bytes, keep_alive: Callable[[], None]) -> bp.PathReport:
        ctypes.memmove(remote_ptr, ptr, nbytes)
        self.send(notification)
        return bp.PathReport(("fake/memmove",), "zero-copy", None, "the fake transport", 0.0)

    def recheck(self, nbytes: int) -> bp.PathReport | None:
        return None


@contextmanager
def _host_pair(sock: str, args: argparse.Namespace, slots: int, name: str) -> Iterator[tuple[Any, Any]]:
    producer = gpu_ipc.Producer(sock, width=args.width, height=args.height, slots=slots, sync=args.sync,
                                backend="host")
    box: dict[str, Any] = {}
    t = threading.Thread(target=lambda: box.setdefault("c", gpu_ipc.Consumer(sock, backend="host", name=name)))
    t.start()
    producer.wait_for_consumers(1, timeout=10)
    t.join(10)
    try:
        yield producer, box["c"]
    finally:
        box["c"].close()
        producer.close()


def run_fake(args: argparse.Namespace, profile: bool) -> dict[str, Any]:
    meters = {side: LoopMeter(profile, args.timer) for side in LOOPS}
    originals = {side: {n: getattr(cls, n) for n in names} for side, (cls, names) in LOOPS.items()}
    for side, meter in meters.items():
        meter.patch(side)
    boxes: dict[str, deque[bytes]] = {"send": deque(), "receive": deque()}
    results: dict[str, Any] = {}
    try:
        with tempfile.TemporaryDirectory(prefix="gi-cpu-", dir="/tmp") as tmp, \
                _host_pair(f"{tmp}/a.sock", args, 3, "bridge-send") as (producer_a, source), \
                _host_pair(f"{tmp}/b.sock", args, args.slots_b, "reader") as (producer_b, reader):
            send_end = bp.SendingEnd(FakeTransport(boxes, "send"), source, 0, path=args.path,
                                     report_every=args.report_every)
            recv_end = br.ReceivingEnd(FakeTransport(boxes, "receive"), window=args.window,
                                       make_landing=lambda nbytes, count: HostLanding(nbytes, count))

            def sending() -> None:
                send_end.hello()
                results["send"] = send_end.run()

            def receiving() -> None:
                recv_end.wait_hello(5)
                results["receive"] = recv_end.run(producer_b, 0)
                producer_b.close()

            threads = [threading.Thread(target=f) for f in (sending, receiving)]
            threads.append(threading.Thread(target=_feed, args=(producer_a, args.frames)))
            for t in threads:
                t.start()
            read = _read(reader)
            for t in threads:
                t.join(60)
    finally:
        for side, (cls, _names) in LOOPS.items():
            for n, fn in originals[side].items():
                setattr(cls, n, fn)
    out: dict[str, Any] = {"read": read}
    for side, meter in meters.items():
        summary = results[side]
        out[side] = {"summary": summary, "loop": meter.result(int(summary["frames"]), args.top)}
    return out


# --- the report ----------------------------------------------------------------------------------------------------

def _line(side: str, r: dict[str, Any], transport: str) -> str:
    loop, s = r["loop"], r["summary"]
    own = (f"process {loop['process_us_per_frame']:.1f} us/frame (user {loop['user_us_per_frame']:.1f}, "
           f"sys {loop['sys_us_per_frame']:.1f}), " if transport == "nixl" else "")
    reported = s.get("cpu_us_per_frame")
    extra = f"; the summary's cpu_us_per_frame {reported:.1f}" if isinstance(reported, (int, float)) else ""
    busy = s.get("busy_us_per_frame")
    extra += f", busy_us_per_frame {busy:.1f}" if isinstance(busy, (int, float)) else ""
    threads = ""
    if transport == "nixl":
        threads = "\n         threads (us/frame): " + ", ".join(
            f"{k} {v:.0f}" for k, v in loop.get("threads_us_per_frame", {}).items())
    over = ", ".join((s.get("path_report") or {}).get("transports") or [])
    return (f"{side:>7}: {loop['frames']} frames, {own}its thread {loop['thread_us_per_frame']:.1f} us/frame, "
            f"wall {loop['wall_us_per_frame']:.1f} us/frame, switches/frame {loop['voluntary_switches_per_frame']:.2f}"
            f" voluntary {loop['involuntary_switches_per_frame']:.2f} involuntary; path {s.get('path')}"
            f"{' over ' + over if over else ''}{extra}{threads}")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--frames", type=int, default=3000)
    p.add_argument("--transport", choices=["auto", "nixl", "fake"], default="auto")
    p.add_argument("--path", choices=list(bp.PATHS), default="auto")
    p.add_argument("--window", type=int, default=bp.DEFAULT_WINDOW)
    p.add_argument("--slots-b", type=int, default=2, help="ring B's slots (the direct path holds up to slots - 1)")
    p.add_argument("--sync", choices=["cpu-sleep", "cpu-spin"], default="cpu-sleep",
                   help="both rings' strategy (cpu-spin spins in every wait: its CPU counts as the end's)")
    p.add_argument("--width", type=int, default=64)
    p.add_argument("--height", type=int, default=32)
    p.add_argument("--report-every", type=float, default=bp.REPORT_EVERY_S)
    p.add_argument("--nixl-progress-thread", action="store_true", help="the ends run NIXL's progress thread (nixl)")
    p.add_argument("--top", type=int, default=20, help="functions of the profile shown, by own time")
    p.add_argument("--timer", choices=["cpu", "wall"], default="cpu",
                   help="the profile's clock: the end's thread CPU time (default), or wall time (waits show)")
    p.add_argument("--repeat", type=int, default=3, help="plain runs (the figures: their median)")
    p.add_argument("--no-profile", action="store_true", help="the plain runs only")
    p.add_argument("--json", default=None, help="write every figure (and the profiles) to this file")
    # One end of the nixl transport, started by this script.
    p.add_argument("--role", choices=list(LOOPS), help=argparse.SUPPRESS)
    for hidden in ("--sock-a", "--sock-b", "--name", "--out"):
        p.add_argument(hidden, help=argparse.SUPPRESS)
    p.add_argument("--port", type=int, help=argparse.SUPPRESS)
    p.add_argument("--profile-child", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.role:
        _child(args)
        return 0
    transport = args.transport
    if transport == "auto":
        from gpu_ipc.bridge_nixl import NixlMissing, load_nixl
        try:
            load_nixl()
            transport = "nixl"
        except NixlMissing as e:
            print(f"NIXL does not load ({e}): the fake transport", file=sys.stderr)
            transport = "fake"
    run = run_nixl if transport == "nixl" else run_fake
    progress = ", NIXL's progress thread on" if args.nixl_progress_thread and transport == "nixl" else ""
    print(f"bridge CPU profile: {transport} transport{progress}, {args.frames} frames of {args.width}x{args.height} "
          f"rgb8, path {args.path}, window {args.window}, sync {args.sync}, {os.cpu_count()} CPUs")
    runs: dict[str, Any] = {f"plain {i + 1}": run(args, False) for i in range(args.repeat)}
    if not args.no_profile:
        runs["profiled"] = run(args, True)
    for label, r in runs.items():
        mark = " (under cProfile: inflated)" if label == "profiled" else ""
        print(f"\n== {label} run{mark}: {r['read']} frames read from ring B")
        for side in ("send", "receive"):
            print(_line(side, r[side], transport))
    plain = [r for label, r in runs.items() if label.startswith("plain")]
    medians: dict[str, dict[str, float]] = {}
    print(f"\n== median of the {len(plain)} plain runs, us per frame")
    for side in ("send", "receive"):
        keys = ["process_us_per_frame"] if transport == "nixl" else []
        keys += ["thread_us_per_frame", "wall_us_per_frame"]
        medians[side] = {k: statistics.median(r[side]["loop"][k] for r in plain) for k in keys}
        print(f"{side:>7}: " + ", ".join(f"{k.replace('_us_per_frame', '')} {v:.1f}" for k, v in medians[side].items()))
    if "profiled" in runs:
        for side in ("send", "receive"):
            print(f"\n== {side} end's per-frame loop, top {args.top} by own time (cProfile, {args.timer} time)")
            print(runs["profiled"][side]["loop"].get("profile", "(none)"))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"transport": transport, "args": vars(args), "medians": medians, "runs": runs}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
