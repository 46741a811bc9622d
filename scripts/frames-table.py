#!/usr/bin/env python3
"""Renders the frame-throughput results of the GPU suite as a Markdown table.

Usage: scripts/frames-table.py RESULTS_DIR   (reads frames-no-mps.jsonl and frames-mps.jsonl)
Each line of those files is one test run written by examples/tests/gpu_frames.rs; only "throughput" runs are
tabulated. Frames per second is the producer's (10,000 frames, from the first acquire until every consumer released
the last frame); CPU time is microseconds per frame of the producer and of the first consumer.
"""
import json
import sys
from pathlib import Path


def load(path):
    rows = {}
    if not path.exists():
        return rows
    for line in path.read_text().splitlines():
        run = json.loads(line)
        if run.get("test") == "throughput":
            rows[(run["backend"], run["sync"])] = run
    return rows


def main():
    results = Path(sys.argv[1])
    no_mps, mps = load(results / "frames-no-mps.jsonl"), load(results / "frames-mps.jsonl")
    keys = sorted(set(no_mps) | set(mps), key=lambda k: (k[0], ["cpu-spin", "cpu-sleep", "ipc-event", "gpu-stream-ops"].index(k[1])))
    print("| backend | sync | FPS (no MPS) | GB/s | CPU us/frame prod/cons | FPS (MPS) | GB/s | CPU us/frame prod/cons |")
    print("|---|---|---:|---:|---:|---:|---:|---:|")
    for key in keys:
        cells = [key[0], key[1]]
        for table in (no_mps, mps):
            run = table.get(key)
            if run is None:
                cells += ["-", "-", "-"]
                continue
            p, c = run["producer"], run["consumers"][0]
            cells += [f"{p['fps']:.0f}", f"{p['gb_per_s']:.1f}", f"{p['cpu_us_per_frame']:.0f} / {c['cpu_us_per_frame']:.0f}"]
        print("| " + " | ".join(cells) + " |")
    if not keys:
        print("(no throughput results)")


if __name__ == "__main__":
    main()
