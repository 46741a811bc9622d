#!/usr/bin/env python3
"""The Python package's own cost per frame, a torch consumer against the Rust consumer, and the stamp check after a
producer SIGKILL, on a GPU: one table.

    python scripts/python_gpu_speed.py run OUT_DIR [--host] [--frames N] [--compare-frames N] [--compare-rounds N]

Run with the staged wheel's venv (scripts/python-gpu-speed.sh makes one; torch must be importable) from the staged
tree ($GPU_IPC_EXAMPLES_DIR, default stage/bin, holds `consumer_overhead`, `producer`, `consumer`). Writes
OUT_DIR/python-speed.md (device, date, commit), python-speed.json, and the logs python-speed.log (scripts/
python-gpu-speed.sh) and python-speed-pairs.log (each comparison process's output). About 3-4 minutes on an H200.

1. Overhead (scripts/python_overhead.py, in this process: torch is imported once): CPU per call of next_frame, the
   frame's tensor both ways (`torch.from_dlpack(frame)` and `frame.array("torch")`), the stamp check both ways and
   release, phase by phase and as one loop, producer kept ahead; 3840x2160 rgb8; backends legacy and vmm x
   cpu-spin, ipc-event, gpu-stream-ops; vmm gpu-stream-ops again with torch's current stream another than the
   frames' (`--side-stream`: an event per view and per release); and the host backend with NumPy beside the Rust
   reference (`consumer_overhead`): package overhead = Python minus Rust. The goal: next_frame + frame.array +
   release <= 10 us of CPU (judged on the larger of the loop and the sum of the phases).
2. A torch consumer doing the same GPU work as the Rust consumer (`Pattern.verify`, the Rust consumer's own check
   kernel, on its torch stream; the tensor taken with `frame.array("torch")`, and with `torch.from_dlpack` for vmm
   gpu-stream-ops), against the Rust consumer, both fed by the Rust producer, 4 slots, interleaved rounds:
   scripts/python_gpu.py's rows and FPS ratio (goal >= 0.9x), for legacy and vmm x gpu-stream-ops, ipc-event,
   cpu-spin. Every frame is checked on the device (0 mismatched words).
3. Stamp check after a producer SIGKILL (gpu-stream-ops): a torch producer child fills frame `seq` with
   `seq % 251 + 1`, publishes `--kill-after` frames, synchronizes and SIGKILLs itself; this torch consumer asks for
   frames without a host sync, judges each with the documented idiom and counts on the device: frames judged valid
   whose content is wrong (must be 0), frames judged valid past the kill (must be 0), frames judged invalid, frames
   handed out past the kill. Two ways: `from_dlpack` (`torch.from_dlpack(frame)` and
   `(torch.from_dlpack(frame.stamp) & STAMP_MASK) == frame.stamp_expected` on the frames' stream; vmm) and `array`
   (`frame.array("torch")` and `frame.stamp.array("torch")` under a torch side stream while the frames are waited
   for on the default stream, so each frame's tensor is ordered by an event: both backends).
`--host`: all three on the host backend (cpu-spin, NumPy, 640x360 / 64x32 frames): a dry run without a GPU.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
KILL_AFTER = 300
GOAL_US = 10.0  # the package's own CPU per frame: next_frame + the frame's tensor + release
GOAL_RATIO = 0.9  # a torch consumer's FPS against the Rust consumer's, the same GPU work per frame
BACKENDS = ("legacy", "vmm")
SYNCS = ("gpu-stream-ops", "ipc-event", "cpu-spin")


def kill_producer(socket: str, backend: str, sync: str, kill_after: int) -> None:
    """The child of the kill check: writes and publishes `kill_after` frames, then dies by SIGKILL."""
    import gpu_ipc

    host = backend == "host"
    if host:
        import numpy as np
    else:
        import torch
    producer = gpu_ipc.Producer(socket, width=3840, height=2160, format="rgb8", slots=4, sync=sync, backend=backend)
    producer.wait_for_consumers(1, timeout=60)
    for seq in range(kill_after):
        slot = producer.acquire(timeout=10.0)
        value = seq % 251 + 1
        if host:
            np.from_dlpack(slot)[...] = value
        else:
            torch.from_dlpack(slot).fill_(value)
        producer.publish(slot)
    if not host:
        torch.cuda.synchronize()
    time.sleep(0.05)
    os.kill(os.getpid(), signal.SIGKILL)


def kill_check(backend: str, kill_after: int, path: str) -> dict[str, Any]:
    """The consumer of the kill check: see the module docs. `path`: "from_dlpack" or "array"."""
    import contextlib

    import gpu_ipc

    host = backend == "host"
    sync = "cpu-spin" if host else "gpu-stream-ops"
    tmp = tempfile.mkdtemp(prefix="gi-kill-", dir="/tmp")
    socket = os.path.join(tmp, "f.sock")
    child = subprocess.Popen([sys.executable, __file__, "kill-producer", socket, "--backend", backend, "--sync", sync,
                              "--kill-after", str(kill_after)])
    row: dict[str, Any] = {"check": "kill", "backend": backend, "sync": sync, "path": path, "kill_after": kill_after}
    mask = gpu_ipc.STAMP_MASK
    handed = 0
    past_kill = 0
    ended = ""
    started = time.monotonic()
    side: Any = contextlib.nullcontext()
    if host:
        import numpy as np

        counts: Any = np.zeros(4, dtype=np.int64)
        library, from_dlpack = "numpy", np.from_dlpack
    else:
        import torch

        counts = torch.zeros(4, dtype=torch.int64, device="cuda")
        library, from_dlpack = "torch", torch.from_dlpack
        if path == "array":
            # torch works on another stream than the frames' waits (the default stream): each frame's tensor and
            # stamp must be ordered after its wait by frame.array itself.
            side = torch.cuda.stream(torch.cuda.Stream())
    try:
        with side, gpu_ipc.Consumer(socket, backend=backend, wait_for_producer=60, timeout=10.0) as consumer:
            while True:
                try:
                    frame = consumer.next_frame(timeout=10.0)
                except gpu_ipc.GpuIpcError as e:
                    ended = type(e).__name__
                    break
                handed += 1
                past_kill += frame.seq >= kill_after
                value = frame.seq % 251 + 1
                if path == "array":
                    image = frame.array(library)
                    right = image == value  # read before the stamp: its own ordering must hold on its own
                    valid = (frame.stamp.array(library) & mask) == frame.stamp_expected
                else:
                    image = from_dlpack(frame)
                    right = image == value
                    valid = (from_dlpack(frame.stamp) & mask) == frame.stamp_expected
                if host:
                    right = bool(right.all())
                    counts += np.array([valid and not right, valid and frame.seq >= kill_after, not valid, valid])
                else:
                    right = right.all()
                    late = valid if frame.seq >= kill_after else torch.zeros_like(valid)
                    counts += torch.stack([valid & ~right, late, ~valid, valid]).to(torch.int64)
                try:
                    consumer.release(frame)
                except gpu_ipc.GpuIpcError as e:
                    ended = type(e).__name__
                    break
        if not host:
            torch.cuda.synchronize()
    finally:
        try:
            child.wait(timeout=30)
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()
    wrong, valid_late, invalid, valid = (int(x) for x in counts.tolist())
    row.update({
        "frames_handed_out": handed, "frames_past_kill": past_kill, "judged_valid": valid, "judged_invalid": invalid,
        "valid_but_wrong": wrong, "valid_past_kill": valid_late, "ended_with": ended,
        "producer_exit": child.returncode, "seconds": round(time.monotonic() - started, 2),
    })
    row["ok"] = (wrong == 0 and valid_late == 0 and child.returncode == -signal.SIGKILL
                 and ended in ("ProducerGone", "EndOfStream") and valid >= 1)
    return row


def overhead_rows(host: bool, frames: int, rust: str | None) -> list[dict[str, Any]]:
    """Section 1: the rows of scripts/python_overhead.py, measured in this process (torch imported once)."""
    sys.path.insert(0, str(HERE))
    import python_overhead

    specs = [("host", "cpu-spin", 640, 360, False)]
    if not host:
        specs += [(b, s, 3840, 2160, False) for b in BACKENDS for s in SYNCS]
        specs.append(("vmm", "gpu-stream-ops", 3840, 2160, True))
    rows = []
    for backend, sync, width, height, side in specs:
        args = argparse.Namespace(backend=backend, sync=sync, width=width, height=height, frames=frames, slots=8,
                                  idle="spin", side_stream=side, rust=None, json=True, produce=None)
        try:
            row = python_overhead.measure(args)
            if backend == "host" and rust:
                ref = python_overhead.rust_reference(rust, args, sync)
                row["rust_next_frame_cpu_us"] = ref["next_frame_cpu_us"]
                row["rust_release_cpu_us"] = ref["release_cpu_us"]
                row["overhead_next_release_cpu_us"] = (row["next_frame_cpu_us"] + row["release_cpu_us"]
                                                       - ref["next_frame_cpu_us"] - ref["release_cpu_us"])
            row.update({"check": "overhead", "ok": bool(row["cached_is_the_frame"])})
        except Exception as e:  # noqa: BLE001 - a failed row, with its reason
            row = {"check": "overhead", "backend": backend, "sync": sync, "side_stream": side, "ok": False,
                   "error": repr(e)}
        print(json.dumps(row), flush=True)
        rows.append(row)
    return rows


def comparison_rows(host: bool, frames: int, rounds: int, out_dir: Path) -> list[dict[str, Any]]:
    """Section 2: scripts/python_gpu.py's Rust producer -> Rust / Python consumer rows, interleaved rounds, one
    group per backend and strategy; returns the rows (check "compare") and each group's ratios (check "ratio")."""
    if host:
        os.environ["PY_GPU_HOST_DRY_RUN"] = "1"  # python_gpu_ends.py: 64x32 frames
    sys.path.insert(0, str(HERE))
    import python_gpu

    groups = [("host", "cpu-spin")] if host else [(b, s) for s in SYNCS for b in BACKENDS]
    rows: list[dict[str, Any]] = []
    with open(out_dir / "python-speed-pairs.log", "a") as log:
        for backend, sync in groups:
            # The cached tensor first: python_gpu.comparison judges the goal on the first Python kind.
            kinds = ["numpy-array", "numpy"] if host else ["torch-array"]
            if (backend, sync) == ("vmm", "gpu-stream-ops"):
                kinds.append("torch")
            group = []
            for r in range(1, rounds + 1):  # interleaved, so that a drift of the machine hits them alike
                for kind in ["rust", *kinds]:
                    spec = {"producer": "rust", "consumer": kind, "backend": backend, "sync": sync,
                            "frames_asked": frames, "compare_round": r}
                    row = python_gpu.run_row(spec, host, log)
                    if kind != "rust":  # a tensor of the first frame read after the consumer closed
                        row["ok"] = bool(row["ok"]) and row.get("tensor_after_close_reads") is True
                    row["check"] = "compare"
                    print(json.dumps(row), flush=True)
                    group.append(row)
            rows += group
            ratios = python_gpu.comparison(group)
            if not ratios:
                rows.append({"check": "ratio", "backend": backend, "sync": sync, "ok": False,
                             "error": "a comparison row failed (python-speed-pairs.log)"})
            for c in ratios:
                c.update({"check": "ratio", "ok": True})
                print(json.dumps(c), flush=True)
                rows.append(c)
    return rows


def describe_device(host: bool) -> str:
    if host:
        return "host backend (no GPU)"
    try:
        import torch

        return f"{torch.cuda.get_device_name(0)}, torch {torch.__version__}"
    except Exception as e:  # noqa: BLE001 - the table says what went wrong
        return f"unknown ({e})"


def commit() -> str:
    """The commit that was built: stage/COMMIT when a staged build runs (the copy's git HEAD may be another), else git's."""
    staged = ROOT / "stage" / "COMMIT"
    if staged.exists():
        return staged.read_text().strip()[:12]
    try:
        cmd = ["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"]
        return subprocess.run(cmd, capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def per_frame_cached(r: dict[str, Any]) -> float:
    """next_frame + frame.array + release: the larger of the sum of the phases and the loop."""
    return max(float(r["per_frame_cached_cpu_us"]), float(r["loop_cached_cpu_us"]))


def table(rows: list[dict[str, Any]], device: str) -> str:
    when = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    out = ["# The Python package's own cost per frame, a torch consumer against the Rust consumer, and the stamp "
           "check after a producer SIGKILL",
           "", f"Device: {device}. Date: {when}. Commit: {commit()}.", "",
           "## CPU per call (us; median over rounds of 8 frames, producer kept ahead, the clock's own cost taken off)",
           "",
           "`dlpack`: `from_dlpack(frame)` (torch on a GPU, NumPy on the host); `cached`: `frame.array(...)`, the "
           "slot's array made once. Loop: next_frame, the view and release as a consumer's loop runs them. Goal: "
           f"next_frame + frame.array + release <= {GOAL_US:g} us (the larger of the loop and the sum).", "",
           "| backend | sync | size | array | next_frame | view dlpack | view cached | release | "
           "next+view+release dlpack | cached | loop dlpack | loop cached | stamp check dlpack | cached | "
           "Rust next+release | overhead (Py - Rust) | goal | ok |",
           "|---|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---|"]
    for r in rows:
        if r["check"] != "overhead":
            continue
        sync = r["sync"] + (", side stream" if r.get("side_stream") else "")
        if "error" in r:
            out.append(f"| {r['backend']} | {sync} |" + " |" * 15 + f" FAILED: {r['error'][-200:]!r} |")
            continue
        rust = (f"{r['rust_next_frame_cpu_us'] + r['rust_release_cpu_us']:.2f}"
                if "rust_next_frame_cpu_us" in r else "")
        over = f"{r['overhead_next_release_cpu_us']:.2f}" if "overhead_next_release_cpu_us" in r else ""
        goal = "met" if per_frame_cached(r) <= GOAL_US else "NOT met"
        out.append(f"| {r['backend']} | {sync} | {r['width']}x{r['height']} | {r['array']} | "
                   f"{r['next_frame_cpu_us']:.2f} | {r['view_cpu_us']:.2f} | {r['view_cached_cpu_us']:.2f} | "
                   f"{r['release_cpu_us']:.2f} | {r['per_frame_cpu_us']:.2f} | {r['per_frame_cached_cpu_us']:.2f} | "
                   f"{r['loop_dlpack_cpu_us']:.2f} | {r['loop_cached_cpu_us']:.2f} | {r['stamp_check_cpu_us']:.2f} | "
                   f"{r['stamp_check_cached_cpu_us']:.2f} | {rust} | {over} | {goal} | "
                   f"{'yes' if r['ok'] else 'NO (cached array is not the frame)'} |")
    out += ["", "## A Python consumer against the Rust consumer, the same GPU work per frame", "",
            "Rust producer -> consumer, 4 slots, each frame checked on the device with the Rust consumer's own kernel "
            "(`gpu_ipc.testing.Pattern.verify` on the consumer's stream; the Python consumer also takes each frame's "
            "tensor: `torch-array` with `frame.array(\"torch\")`, `torch` with `torch.from_dlpack(frame)`), FPS from "
            f"the attach, median of interleaved rounds. Goal: >= {GOAL_RATIO:g}x (judged on the first Python kind).",
            "", "| backend | sync | consumer | frames | Rust FPS | Python FPS | ratio | Python CPU us/frame | goal |",
            "|---|---|---|---:|---:|---:|---:|---:|---|"]
    for c in rows:
        if c["check"] != "ratio":
            continue
        if not c["ok"]:
            out.append(f"| {c['backend']} | {c['sync']} | | | | | | | FAILED: {c['error']} |")
            continue
        goal = ("-" if c["goal"] is None else ("met" if c["meets_goal"] else "NOT met"))
        out.append(f"| {c['backend']} | {c['sync']} | {c['consumer']} | {c['frames']} | {c['rust_median']:,.0f} | "
                   f"{c['python_median']:,.0f} | {c['ratio']:.3f} | {c['python_cpu_us_per_frame']:.1f} | {goal} |")
    bad = [r for r in rows if r["check"] == "compare" and not r["ok"]]
    for r in bad:
        out.append(f"\nFAILED row: {r['consumer']} {r['backend']} {r['sync']} round {r.get('compare_round')}: "
                   f"mismatched words {r.get('mismatched_words', '-')}, frames {r.get('frames', '-')}, "
                   f"{r.get('error', '')}")
    out += ["", "## Producer SIGKILL, a consumer with the stamp check", "",
            "| backend | sync | path | frames written | handed out | past the kill | judged valid | judged invalid | "
            "valid but wrong | valid past the kill | ended with | ok |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if r["check"] != "kill":
            continue
        if "error" in r:
            out.append(f"| {r['backend']} | {r['sync']} | {r['path']} | | | | | | | | "
                       f"FAILED: {r['error'][-200:]!r} | no |")
            continue
        out.append(f"| {r['backend']} | {r['sync']} | {r['path']} | {r['kill_after']} | {r['frames_handed_out']} | "
                   f"{r['frames_past_kill']} | {r['judged_valid']} | {r['judged_invalid']} | {r['valid_but_wrong']} | "
                   f"{r['valid_past_kill']} | {r['ended_with']} | {'yes' if r['ok'] else 'NO'} |")
    return "\n".join(out) + "\n"


def run(out_dir: Path, host: bool, frames: int, compare_frames: int, compare_rounds: int) -> int:
    out_dir.mkdir(parents=True, exist_ok=True)
    bin_dir = Path(os.environ.get("GPU_IPC_EXAMPLES_DIR", ROOT / "stage" / "bin"))
    rust = bin_dir / "consumer_overhead"
    rust_bin = str(rust) if rust.exists() else None
    started = time.monotonic()
    rows = overhead_rows(host, frames, rust_bin)
    rows += comparison_rows(host, compare_frames, compare_rounds, out_dir)
    kills = [("host", "array"), ("host", "from_dlpack")] if host else [
        ("legacy", "array"), ("vmm", "array"), ("vmm", "from_dlpack")]
    for backend, path in kills:
        try:
            rows.append(kill_check(backend, KILL_AFTER, path))
        except Exception as e:  # noqa: BLE001 - a failed row, with its reason
            rows.append({"check": "kill", "backend": backend, "sync": "gpu-stream-ops", "path": path, "ok": False,
                         "error": repr(e)})
        print(json.dumps(rows[-1]), flush=True)
    (out_dir / "python-speed.json").write_text(json.dumps(rows, indent=1))
    text = table(rows, describe_device(host))
    (out_dir / "python-speed.md").write_text(text)
    print(text)
    print(f"python_gpu_speed: {time.monotonic() - started:.0f} s", file=sys.stderr)
    if rust_bin is None:
        print(f"python_gpu_speed: no {rust}: the Rust reference column is empty", file=sys.stderr)
    return 0 if all(r["ok"] for r in rows) and rust_bin is not None else 1


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run")
    r.add_argument("out_dir", type=Path)
    r.add_argument("--host", action="store_true", help="the host backend only, with NumPy (a dry run without a GPU)")
    r.add_argument("--frames", type=int, default=3200, help="frames per overhead row")
    r.add_argument("--compare-frames", type=int, default=2000, help="frames per comparison row")
    r.add_argument("--compare-rounds", type=int, default=2, help="interleaved rounds per comparison group")
    k = sub.add_parser("kill-producer")
    k.add_argument("socket")
    k.add_argument("--backend", required=True)
    k.add_argument("--sync", required=True)
    k.add_argument("--kill-after", type=int, required=True)
    args = ap.parse_args()
    if args.cmd == "kill-producer":
        kill_producer(args.socket, args.backend, args.sync, args.kill_after)
        return 1
    return run(args.out_dir, args.host, args.frames, args.compare_frames, args.compare_rounds)


if __name__ == "__main__":
    sys.exit(main())
