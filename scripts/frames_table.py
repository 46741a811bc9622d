#!/usr/bin/env python3
"""Renders the frame-throughput results of the GPU suite as a Markdown table.

Usage: scripts/frames_table.py RESULTS_DIR [--mps-status passed|failed|skipped] [--mps-reason TEXT]
(reads frames-no-mps.jsonl and frames-mps.jsonl). A skipped MPS pass shows as "skipped" in its columns, never as
missing numbers that could pass for a failure or a success.
Each line of those files is one test run written by examples/tests/gpu_frames.rs; only "throughput" runs are
tabulated. Frames per second is the producer's (10,000 frames, from the first acquire until every consumer released
the last frame); CPU time is microseconds per frame of the producer and of the first consumer.
"""
import argparse
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
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("results", type=Path)
    parser.add_argument("--mps-status", default="passed", choices=["passed", "failed", "skipped"])
    parser.add_argument("--mps-reason", default="")
    args = parser.parse_args()
    results = args.results
    no_mps, mps = load(results / "frames-no-mps.jsonl"), load(results / "frames-mps.jsonl")
    keys = sorted(set(no_mps) | set(mps), key=lambda k: (k[0], ["cpu-spin", "cpu-sleep", "ipc-event", "gpu-stream-ops"].index(k[1])))
    print("| backend | sync | FPS (no MPS) | GB/s | CPU us/frame prod/cons | FPS (MPS) | GB/s | CPU us/frame prod/cons |")
    print("|---|---|---:|---:|---:|---:|---:|---:|")
    for key in keys:
        cells = [key[0], key[1]]
        for table in (no_mps, mps):
            run = table.get(key)
            if table is mps and args.mps_status == "skipped":
                cells += ["skipped", "-", "-"]
                continue
            if run is None:
                cells += ["-", "-", "-"]
                continue
            p, c = run["producer"], run["consumers"][0]
            cells += [f"{p['fps']:.0f}", f"{p['gb_per_s']:.1f}", f"{p['cpu_us_per_frame']:.0f} / {c['cpu_us_per_frame']:.0f}"]
        print("| " + " | ".join(cells) + " |")
    if not keys:
        print("(no throughput results)")
    if args.mps_status != "passed":
        reason = f": {args.mps_reason}" if args.mps_reason else ""
        print(f"\nMPS pass {args.mps_status.upper()}{reason}.")


if __name__ == "__main__":
    main()
