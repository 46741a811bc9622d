#!/usr/bin/env python3
"""The Python package's own cost per frame and the stamp check after a producer SIGKILL, on a GPU: one table.

    python scripts/python_gpu_speed.py run OUT_DIR [--host]

Run with the staged wheel's venv (scripts/python-gpu.sh makes one; torch must be importable) from the staged tree
($GPU_IPC_EXAMPLES_DIR, default stage/bin, holds `consumer_overhead`). Writes OUT_DIR/python-speed.md (device, date,
commit), python-speed.json and python-speed.log. About 2-3 minutes on an H200.

1. Overhead (scripts/python_overhead.py): CPU per call of next_frame, torch.from_dlpack(frame), the stamp check and
   release, producer kept ahead; 3840x2160 rgb8; backends legacy and vmm x cpu-spin, ipc-event, gpu-stream-ops; and
   the host backend with NumPy beside the Rust reference (`consumer_overhead`): package overhead = Python minus Rust.
2. Stamp check after a producer SIGKILL (gpu-stream-ops, both backends): a torch producer child fills frame `seq`
   with `seq % 251 + 1`, publishes `--kill-after` frames, synchronizes and SIGKILLs itself; this torch consumer asks
   for frames without a host sync, judges each with the documented idiom
   `(torch.from_dlpack(frame.stamp) & STAMP_MASK) == frame.stamp_expected` and counts on the device: frames judged
   valid whose content is wrong (must be 0), frames judged valid past the kill (must be 0), frames judged invalid,
   frames it was handed past the kill. `--host`: the same on the host backend (cpu-spin, NumPy), a dry run.
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


def kill_check(backend: str, kill_after: int) -> dict[str, Any]:
    """The consumer of the kill check: see the module docs."""
    import gpu_ipc

    host = backend == "host"
    sync = "cpu-spin" if host else "gpu-stream-ops"
    tmp = tempfile.mkdtemp(prefix="gi-kill-", dir="/tmp")
    socket = os.path.join(tmp, "f.sock")
    child = subprocess.Popen([sys.executable, __file__, "kill-producer", socket, "--backend", backend, "--sync", sync,
                              "--kill-after", str(kill_after)])
    row: dict[str, Any] = {"check": "kill", "backend": backend, "sync": sync, "kill_after": kill_after}
    mask = gpu_ipc.STAMP_MASK
    handed = 0
    past_kill = 0
    ended = ""
    started = time.monotonic()
    if host:
        import numpy as np

        counts = np.zeros(4, dtype=np.int64)
    else:
        import torch

        counts = torch.zeros(4, dtype=torch.int64, device="cuda")
    try:
        with gpu_ipc.Consumer(socket, backend=backend, wait_for_producer=60, timeout=10.0) as consumer:
            while True:
                try:
                    frame = consumer.next_frame(timeout=10.0)
                except gpu_ipc.GpuIpcError as e:
                    ended = type(e).__name__
                    break
                handed += 1
                past_kill += frame.seq >= kill_after
                value = frame.seq % 251 + 1
                if host:
                    valid = (np.from_dlpack(frame.stamp) & mask) == frame.stamp_expected
                    right = bool((np.from_dlpack(frame) == value).all())
                    counts += np.array([valid and not right, valid and frame.seq >= kill_after, not valid, valid])
                else:
                    valid = (torch.from_dlpack(frame.stamp) & mask) == frame.stamp_expected
                    right = (torch.from_dlpack(frame) == value).all()
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


def overhead(backend: str, sync: str, frames: int, width: int, height: int, rust: str | None) -> dict[str, Any]:
    cmd = [sys.executable, str(HERE / "python_overhead.py"), "--backend", backend, "--sync", sync, "--frames",
           str(frames), "--width", str(width), "--height", str(height), "--slots", "8", "--json"]
    if rust:
        cmd += ["--rust", rust]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=180)
    if out.returncode != 0:
        return {"check": "overhead", "backend": backend, "sync": sync, "ok": False, "error": out.stderr[-2000:]}
    row = dict(json.loads(out.stdout.strip().splitlines()[-1]))
    row.update({"check": "overhead", "ok": True})
    return row


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


def table(rows: list[dict[str, Any]], device: str) -> str:
    when = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    out = [f"# The Python package's own cost per frame, and the stamp check after a producer SIGKILL",
           "", f"Device: {device}. Date: {when}. Commit: {commit()}.", "",
           "## CPU per call (median over rounds of 8 frames, producer kept ahead; us)", "",
           "| backend | sync | size | array | next_frame | view | stamp check | release | next+view+release | "
           "Rust next+release | overhead (Py - Rust) | ok |",
           "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if r["check"] != "overhead":
            continue
        if not r["ok"]:
            out.append(f"| {r['backend']} | {r['sync']} | | | | | | | | | | FAILED: {r['error'][-200:]!r} |")
            continue
        rust = (f"{r['rust_next_frame_cpu_us'] + r['rust_release_cpu_us']:.2f}"
                if "rust_next_frame_cpu_us" in r else "")
        over = f"{r['overhead_next_release_cpu_us']:.2f}" if "overhead_next_release_cpu_us" in r else ""
        out.append(f"| {r['backend']} | {r['sync']} | {r['width']}x{r['height']} | {r['array']} | "
                   f"{r['next_frame_cpu_us']:.2f} | {r['view_cpu_us']:.2f} | {r['stamp_check_cpu_us']:.2f} | "
                   f"{r['release_cpu_us']:.2f} | {r['per_frame_cpu_us']:.2f} | {rust} | {over} | yes |")
    out += ["", "## Producer SIGKILL, torch consumer with the stamp check", "",
            "| backend | sync | frames written | handed out | past the kill | judged valid | judged invalid | "
            "valid but wrong | valid past the kill | ended with | ok |",
            "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if r["check"] != "kill":
            continue
        if "error" in r:
            out.append(f"| {r['backend']} | {r['sync']} | | | | | | | | FAILED: {r['error'][-200:]!r} | no |")
            continue
        out.append(f"| {r['backend']} | {r['sync']} | {r['kill_after']} | {r['frames_handed_out']} | "
                   f"{r['frames_past_kill']} | {r['judged_valid']} | {r['judged_invalid']} | {r['valid_but_wrong']} | "
                   f"{r['valid_past_kill']} | {r['ended_with']} | {'yes' if r['ok'] else 'NO'} |")
    return "\n".join(out) + "\n"


def run(out_dir: Path, host: bool, frames: int) -> int:
    out_dir.mkdir(parents=True, exist_ok=True)
    bin_dir = Path(os.environ.get("GPU_IPC_EXAMPLES_DIR", ROOT / "stage" / "bin"))
    rust = bin_dir / "consumer_overhead"
    rust_bin = str(rust) if rust.exists() else None
    rows: list[dict[str, Any]] = []
    rows.append(overhead("host", "cpu-spin", frames, 640, 360, rust_bin))
    if not host:
        for backend in ("legacy", "vmm"):
            for sync in ("cpu-spin", "ipc-event", "gpu-stream-ops"):
                rows.append(overhead(backend, sync, frames, 3840, 2160, None))
                print(json.dumps(rows[-1]), flush=True)
    for backend in (["host"] if host else ["legacy", "vmm"]):
        try:
            rows.append(kill_check(backend, KILL_AFTER))
        except Exception as e:  # noqa: BLE001 - a failed row, with its reason
            rows.append({"check": "kill", "backend": backend, "sync": "gpu-stream-ops", "ok": False,
                         "error": repr(e)})
        print(json.dumps(rows[-1]), flush=True)
    (out_dir / "python-speed.json").write_text(json.dumps(rows, indent=1))
    text = table(rows, describe_device(host))
    (out_dir / "python-speed.md").write_text(text)
    print(text)
    if rust_bin is None:
        print(f"python_gpu_speed: no {rust}: the Rust reference column is empty", file=sys.stderr)
    return 0 if all(r["ok"] for r in rows) and rust_bin is not None else 1


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run")
    r.add_argument("out_dir", type=Path)
    r.add_argument("--host", action="store_true", help="the host backend only, with NumPy (a dry run without a GPU)")
    r.add_argument("--frames", type=int, default=8000)
    k = sub.add_parser("kill-producer")
    k.add_argument("socket")
    k.add_argument("--backend", required=True)
    k.add_argument("--sync", required=True)
    k.add_argument("--kill-after", type=int, required=True)
    args = ap.parse_args()
    if args.cmd == "kill-producer":
        kill_producer(args.socket, args.backend, args.sync, args.kill_after)
        return 1
    return run(args.out_dir, args.host, args.frames)


if __name__ == "__main__":
    sys.exit(main())
