#!/usr/bin/env python3
"""The Python package's own CPU cost per frame: `next_frame`, the frame's array, the stamp check and `release`.

    python_overhead.py [--backend host|vmm|legacy] [--sync S] [--width W --height H] [--frames N] [--slots K]
                       [--idle spin|sleep] [--side-stream] [--rust BIN] [--json]

Two ways to get a frame's array, measured side by side in the same rounds:
- `from_dlpack`: `numpy.from_dlpack(frame)` on the host, `torch.from_dlpack(frame)` on a GPU (a new tensor every time);
- `cached`: `frame.array("numpy")` / `frame.array("torch")` (the slot's array, made once, a new alias per frame).

How it measures: in rounds of K frames (K = the ring's slots). Before each batch the producer has filled every slot,
so no call waits for a frame: on the host backend the producer is in this process and fills the ring between
batches (not timed); on a GPU it is a child process (`--produce`, publishing as fast as the ring lets it) and the
consumer waits 3 ms for it (not timed), spinning on the clock (`--idle spin`, the default: the core stays awake,
as in a consumer that has work between frames) or asleep (`--idle sleep`: every batch starts on a core that was
idle, caches cold). Each round times, in this thread's CPU time (`time.thread_time_ns`, its own cost per reading
measured first and taken off) and wall time:
- phase by phase, K calls each: `next_frame`; the view both ways; the stamp check both ways
  (`(from_dlpack(frame.stamp) & STAMP_MASK) == frame.stamp_expected`, and with `frame.stamp.array(...)`);
  `release`;
- together, as a consumer's loop runs them, K frames each way: `next_frame`, the view, `release` (the array of
  the frame before is dropped there, as in a loop).
The figure per call is the median over rounds (a round that did wait is an outlier the median leaves out); the
mean is printed too. `--side-stream` (GPU): torch's current stream is another stream than the one the frames are
waited for on, so each view orders it after the frame's stream (an event) and each release after it: the dearer
case, when a program does not pass its stream to `next_frame`.

`--rust BIN` runs the Rust reference (`consumer_overhead` of the examples: the same rounds from Rust, host backend)
and prints "package overhead = Python minus Rust" for next_frame + release.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from typing import Any

import gpu_ipc


def produce(socket: str, backend: str, sync: str, width: int, height: int, slots: int) -> None:
    """The GPU rows' producer: publishes frames (unwritten: the consumer's cost does not depend on them) until the
    consumer goes away."""
    with gpu_ipc.Producer(socket, width=width, height=height, format="rgb8", slots=slots, sync=sync,
                          backend=backend) as producer:
        producer.wait_for_consumers(1, timeout=60)
        try:
            while producer.consumers() > 0:
                slot = producer.acquire(timeout=5.0)
                producer.publish(slot)
        except gpu_ipc.GpuIpcError:
            pass


PHASES = ("next_frame", "view", "view_cached", "stamp_check", "stamp_check_cached", "release", "loop_dlpack",
          "loop_cached")


def clock_cost(clock: Callable[[], int]) -> float:
    """The median cost of one reading of `clock`, in ns: what a timed batch's two readings add to it."""
    samples = []
    for _ in range(2001):
        a = clock()
        b = clock()
        samples.append(b - a)
    return float(statistics.median(samples))


def measure(args: argparse.Namespace) -> dict[str, Any]:
    host = args.backend == "host"
    library = "numpy" if host else "torch"
    if host:
        import numpy as xp_mod

        from_dlpack = xp_mod.from_dlpack
        data_ptr: Callable[[Any], int] = lambda a: int(a.ctypes.data)  # noqa: E731
        side: Any = contextlib.nullcontext()
    else:
        import torch

        from_dlpack = torch.from_dlpack
        data_ptr = lambda t: int(t.data_ptr())  # noqa: E731
        side = torch.cuda.stream(torch.cuda.Stream()) if args.side_stream else contextlib.nullcontext()
    sync = args.sync or gpu_ipc.default_sync(args.backend)
    tmp = tempfile.mkdtemp(prefix="gi-oh-", dir="/tmp")
    socket = os.path.join(tmp, "f.sock")
    child = None
    producer = None
    if host:
        producer = gpu_ipc.Producer(socket, width=args.width, height=args.height, format="rgb8", slots=args.slots,
                                    sync=sync, backend="host")
        box: dict[str, gpu_ipc.Consumer] = {}
        t = threading.Thread(target=lambda: box.setdefault("c", gpu_ipc.Consumer(socket, backend="host")))
        t.start()
        producer.wait_for_consumers(1, timeout=10)
        t.join(10)
        consumer = box["c"]
    else:
        child = subprocess.Popen([sys.executable, __file__, "--produce", socket, "--backend", args.backend,
                                  "--sync", sync, "--width", str(args.width), "--height", str(args.height),
                                  "--slots", str(args.slots)])
        consumer = gpu_ipc.Consumer(socket, backend=args.backend, wait_for_producer=60)
    k = consumer.slots
    mask = gpu_ipc.STAMP_MASK
    cpu: dict[str, list[float]] = {p: [] for p in PHASES}
    wall: dict[str, list[float]] = {p: [] for p in PHASES}
    rounds = max(1, args.frames // k)
    clock, now = time.thread_time_ns, time.perf_counter_ns
    clock_ns, now_ns = clock_cost(clock), clock_cost(now)
    next_frame, release = consumer.next_frame, consumer.release
    checks: list[Any] = []
    zero_copy = True

    def refill() -> None:
        if producer is not None:
            for _ in range(k):
                producer.publish(producer.acquire(timeout=5.0))
        elif args.idle == "sleep":
            time.sleep(0.003)
        else:
            until = time.perf_counter() + 0.003
            while time.perf_counter() < until:
                pass

    def note(phase: str, c: tuple[int, int], w: tuple[int, int]) -> None:
        cpu[phase].append(max(0.0, c[1] - c[0] - clock_ns) / k / 1000)
        wall[phase].append(max(0.0, w[1] - w[0] - now_ns) / k / 1000)

    try:
        with side:
            for r in range(rounds + 1):  # round 0 warms up (and makes the cached arrays), not counted
                refill()
                c0, w0 = clock(), now()
                frames = [next_frame(timeout=5.0) for _ in range(k)]
                c1, w1 = clock(), now()
                views = [from_dlpack(f) for f in frames]
                c2, w2 = clock(), now()
                cached = [f.array(library) for f in frames]
                c3, w3 = clock(), now()
                checks = [(from_dlpack(f.stamp) & mask) == f.stamp_expected for f in frames]
                c4, w4 = clock(), now()
                checks += [(f.stamp.array(library) & mask) == f.stamp_expected for f in frames]
                c5, w5 = clock(), now()
                for f in frames:
                    release(f)
                c6, w6 = clock(), now()
                if r == 0:  # both ways the array is the frame itself, no copy
                    zero_copy = zero_copy and all(data_ptr(a) == data_ptr(v) for a, v in zip(cached, views))
                del views, cached
                refill()
                c7, w7 = clock(), now()
                for _ in range(k):
                    f = next_frame(timeout=5.0)
                    v = from_dlpack(f)
                    release(f)
                c8, w8 = clock(), now()
                del v, f
                refill()
                c9, w9 = clock(), now()
                for _ in range(k):
                    f = next_frame(timeout=5.0)
                    v = f.array(library)
                    release(f)
                c10, w10 = clock(), now()
                del v, f
                if r == 0:
                    # Untimed: the arrays handed out again (made in the phases above) are each frame itself.
                    refill()
                    for _ in range(k):
                        f = next_frame(timeout=5.0)
                        zero_copy = zero_copy and data_ptr(f.array(library)) == f.ptr
                        release(f)
                    continue
                for phase, (a, b) in zip(PHASES, ((0, 1), (1, 2), (2, 3), (3, 4), (4, 5), (5, 6), (7, 8),
                                                   (9, 10))):
                    cs = (c0, c1, c2, c3, c4, c5, c6, c7, c8, c9, c10)
                    ws = (w0, w1, w2, w3, w4, w5, w6, w7, w8, w9, w10)
                    note(phase, (cs[a], cs[b]), (ws[a], ws[b]))
        if host:
            assert all(bool(c) for c in checks), "a published frame's stamp check said invalid"
        else:
            assert all(bool(c.item()) for c in checks), "a published frame's stamp check said invalid"
    finally:
        consumer.close()
        if producer is not None:
            producer.close()
        if child is not None:
            try:
                child.wait(timeout=20)
            except subprocess.TimeoutExpired:
                child.kill()
                child.wait()
    row: dict[str, Any] = {"backend": args.backend, "sync": sync, "frames": rounds * k, "slots": k,
                           "width": args.width, "height": args.height, "array": library,
                           "idle": "-" if host else args.idle, "side_stream": bool(args.side_stream and not host),
                           "clock_cost_us": clock_ns / 1000, "cached_is_the_frame": zero_copy}
    for p in PHASES:
        row[f"{p}_cpu_us"] = statistics.median(cpu[p])
        row[f"{p}_cpu_mean_us"] = statistics.fmean(cpu[p])
        row[f"{p}_wall_us"] = statistics.median(wall[p])
    row["per_frame_cpu_us"] = row["next_frame_cpu_us"] + row["view_cpu_us"] + row["release_cpu_us"]
    row["per_frame_cached_cpu_us"] = row["next_frame_cpu_us"] + row["view_cached_cpu_us"] + row["release_cpu_us"]
    return row


def rust_reference(binary: str, args: argparse.Namespace, sync: str) -> dict[str, Any]:
    out = subprocess.run([binary, "--frames", str(args.frames), "--slots", str(args.slots), "--width",
                          str(args.width), "--height", str(args.height), "--sync", sync, "--json"],
                         check=True, capture_output=True, text=True)
    return dict(json.loads(out.stdout))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--backend", default="host")
    ap.add_argument("--sync", default=None)
    ap.add_argument("--width", type=int, default=640)
    ap.add_argument("--height", type=int, default=360)
    ap.add_argument("--frames", type=int, default=20000)
    ap.add_argument("--slots", type=int, default=8)
    ap.add_argument("--idle", choices=("spin", "sleep"), default="spin",
                    help="GPU: how the consumer waits 3 ms for the producer between batches (not timed)")
    ap.add_argument("--side-stream", action="store_true",
                    help="GPU: torch's current stream is not the frames' wait stream (events per view and release)")
    ap.add_argument("--rust", default=None, help="the consumer_overhead binary (host backend reference)")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--produce", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.produce:
        produce(args.produce, args.backend, args.sync, args.width, args.height, args.slots)
        return 0
    row = measure(args)
    if args.rust:
        rust = rust_reference(args.rust, args, "cpu-spin" if args.backend != "host" else row["sync"])
        row["rust_next_frame_cpu_us"] = rust["next_frame_cpu_us"]
        row["rust_release_cpu_us"] = rust["release_cpu_us"]
        row["overhead_next_release_cpu_us"] = (row["next_frame_cpu_us"] + row["release_cpu_us"]
                                               - rust["next_frame_cpu_us"] - rust["release_cpu_us"])
    if args.json:
        print(json.dumps(row))
    else:
        print(f"{row['backend']} {row['sync']} {row['width']}x{row['height']} ({row['frames']} frames, "
              f"{row['array']}{', side stream' if row['side_stream'] else ''}), CPU per call, median (mean); "
              f"clock reading {row['clock_cost_us']:.2f} us, taken off:")
        for p in PHASES:
            print(f"  {p:18s} {row[p + '_cpu_us']:7.2f} us ({row[p + '_cpu_mean_us']:.2f})")
        print(f"  next_frame + view + release: from_dlpack {row['per_frame_cpu_us']:.2f} us, cached "
              f"{row['per_frame_cached_cpu_us']:.2f} us; as one loop: {row['loop_dlpack_cpu_us']:.2f} us, "
              f"{row['loop_cached_cpu_us']:.2f} us")
        if args.rust:
            print(f"  Rust next_frame {row['rust_next_frame_cpu_us']:.2f} us, release {row['rust_release_cpu_us']:.2f}"
                  f" us; package overhead (next_frame + release, Python minus Rust): "
                  f"{row['overhead_next_release_cpu_us']:.2f} us")
    return 0


if __name__ == "__main__":
    sys.exit(main())
