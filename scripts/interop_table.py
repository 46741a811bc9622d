#!/usr/bin/env python3
"""The table scripts/interop-gpu.sh prints: consumer FPS per row (median of the rounds), the cudarc path against
gpu-ipc's own launcher, and the end-of-stream checks. Exit status 1 when a check fails."""
import json
import statistics
import sys

runs = [json.loads(line) for line in open(sys.argv[1]) if line.strip()]
failed = []


def consumer(run, key, default=None):
    return (run.get("consumer") or {}).get(key, default)


print("## Your kernel on your cudarc stream against gpu-ipc's own launcher\n")
print("Consumer FPS, median of the rounds (1920x1080 RGB, 4 slots), and mismatched words over every run.\n")
print("| backend | sync | cudarc launch, cudarc stream | gpu-ipc launch, gpu-ipc stream | ratio | mismatched words |")
print("|---|---|---:|---:|---:|---:|")
rows = {}
for run in runs:
    if run["test"] != "throughput":
        continue
    key = (run["backend"], run["sync"])
    row = rows.setdefault(key, {"cudarc": [], "gpu-ipc": [], "bad": 0, "errors": []})
    if run["consumer_exit"] != 0 or run["producer_exit"] != 0 or run.get("consumer") is None:
        row["errors"].append(f'{run["launch"]}: exit {run["consumer_exit"]}/{run["producer_exit"]}')
        continue
    row[run["launch"]].append(consumer(run, "fps", 0.0))
    row["bad"] += consumer(run, "mismatched_words", 0)
for (backend, sync), row in sorted(rows.items()):
    c = statistics.median(row["cudarc"]) if row["cudarc"] else None
    g = statistics.median(row["gpu-ipc"]) if row["gpu-ipc"] else None
    ratio = f"{c / g:.3f}x" if c and g else "n/a"
    fmt = lambda v, runs: f"{v:,.0f} ({', '.join(f'{x:,.0f}' for x in runs)})" if v else "failed"
    print(f"| {backend} | {sync} | {fmt(c, row['cudarc'])} | {fmt(g, row['gpu-ipc'])} | {ratio} | {row['bad']} |")
    if row["errors"] or row["bad"]:
        failed.append(f"{backend}/{sync}: {row['errors']} bad={row['bad']}")

print("\n## Reading until the producer goes\n")
print("| backend | sync | after | consumer exit | frames read | end of stream after | producer gone |")
print("|---|---|---|---:|---:|---:|---|")
for run in runs:
    if run["test"] not in ("end-of-stream", "producer-killed"):
        continue
    c = run.get("consumer") or {}
    after = "clean exit" if run["test"] == "end-of-stream" else "SIGKILL"
    print(f'| {run["backend"]} | {run["sync"]} | {after} | {run["consumer_exit"]} | {c.get("frames")} | '
          f'{c.get("end_of_stream_after")} | {c.get("producer_gone") or ""} |')
    if run["test"] == "end-of-stream":
        ok = run["consumer_exit"] == 0 and c.get("frames") == 2000 and c.get("end_of_stream_after") == 2000 \
            and c.get("mismatched_words") == 0
    else:
        ok = run["consumer_exit"] == 4 and bool(c.get("producer_gone"))
    if not ok:
        failed.append(f'{run["test"]} {run["backend"]}/{run["sync"]}: {c}')

if failed:
    print("\nFAILED:\n" + "\n".join(f"- {f}" for f in failed))
    sys.exit(1)
print("\nAll checks passed.")
