#!/usr/bin/env python3
"""The Python package's own CPU cost per frame: `next_frame`, the DLPack view, the stamp check and `release`.

    python_overhead.py [--backend host|vmm|legacy] [--sync S] [--width W --height H] [--frames N] [--slots K]
                       [--rust BIN] [--json]

How it measures: in rounds of K frames (K = the ring's slots). Before each round the producer has filled every slot,
so no call waits for a frame: on the host backend the producer is in this process and fills the ring between rounds
(not timed); on a GPU it is a child process (`--produce`, publishing as fast as the ring lets it) and the consumer
sleeps 3 ms between rounds (not timed) so that it has. Each round times, as batches of K calls, `next_frame`, the
view (`numpy.from_dlpack(frame)` on the host, `torch.from_dlpack(frame)` on a GPU), the stamp check
(`(from_dlpack(frame.stamp) & STAMP_MASK) == frame.stamp_expected`) and `release`, in this thread's CPU time
(`time.thread_time_ns`) and wall time. The figure per call is the median over rounds (a round that did wait, say
the producer had not refilled it on a GPU, is an outlier the median leaves out); the mean is printed too.

`--rust BIN` runs the Rust reference (`consumer_overhead` of the examples: the same rounds from Rust, host backend)
and prints "package overhead = Python minus Rust" for next_frame + release.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
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


def measure(args: argparse.Namespace) -> dict[str, Any]:
    host = args.backend == "host"
    if host:
        import numpy as xp_mod

        from_dlpack = xp_mod.from_dlpack
    else:
        import torch

        from_dlpack = torch.from_dlpack
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
    phases = ("next_frame", "view", "stamp_check", "release")
    cpu: dict[str, list[float]] = {p: [] for p in phases}
    wall: dict[str, list[float]] = {p: [] for p in phases}
    rounds = max(1, args.frames // k)
    clock, now = time.thread_time_ns, time.perf_counter_ns
    next_frame, release = consumer.next_frame, consumer.release
    checks = []
    try:
        for r in range(rounds + 1):  # round 0 warms up, not counted
            if producer is not None:
                for _ in range(k):
                    producer.publish(producer.acquire(timeout=5.0))
            else:
                time.sleep(0.003)
            c0, w0 = clock(), now()
            frames = [next_frame(timeout=5.0) for _ in range(k)]
            c1, w1 = clock(), now()
            views = [from_dlpack(f) for f in frames]
            c2, w2 = clock(), now()
            checks = [(from_dlpack(f.stamp) & mask) == f.stamp_expected for f in frames]
            c3, w3 = clock(), now()
            for f in frames:
                release(f)
            c4, w4 = clock(), now()
            del views
            if r == 0:
                continue
            for p, (ca, cb, wa, wb) in zip(phases, ((c0, c1, w0, w1), (c1, c2, w1, w2), (c2, c3, w2, w3),
                                                    (c3, c4, w3, w4))):
                cpu[p].append((cb - ca) / k / 1000)
                wall[p].append((wb - wa) / k / 1000)
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
                           "width": args.width, "height": args.height,
                           "array": "numpy" if host else "torch"}
    for p in phases:
        row[f"{p}_cpu_us"] = statistics.median(cpu[p])
        row[f"{p}_cpu_mean_us"] = statistics.fmean(cpu[p])
        row[f"{p}_wall_us"] = statistics.median(wall[p])
    row["per_frame_cpu_us"] = row["next_frame_cpu_us"] + row["view_cpu_us"] + row["release_cpu_us"]
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
              f"{row['array']}), CPU per call, median (mean):")
        for p in ("next_frame", "view", "stamp_check", "release"):
            print(f"  {p:12s} {row[p + '_cpu_us']:7.2f} us ({row[p + '_cpu_mean_us']:.2f})")
        print(f"  next_frame + view + release: {row['per_frame_cpu_us']:.2f} us")
        if args.rust:
            print(f"  Rust next_frame {row['rust_next_frame_cpu_us']:.2f} us, release {row['rust_release_cpu_us']:.2f}"
                  f" us; package overhead (next_frame + release, Python minus Rust): "
                  f"{row['overhead_next_release_cpu_us']:.2f} us")
    return 0


if __name__ == "__main__":
    sys.exit(main())
