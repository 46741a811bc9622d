"""Ctrl-C and SIGTERM against a Python consumer whose producer has gone quiet, one table.

    python scripts/python_gpu_sigint.py run OUT_DIR [--host]   every case; OUT_DIR/python-sigint.{json,md}; 0: all ok
    python scripts/python_gpu_sigint.py producer SOCK BACKEND SYNC FRAMES      (a case's producer)
    python scripts/python_gpu_sigint.py consumer SOCK BACKEND CASE             (a case's consumer)

A case: a producer process publishes FRAMES frames, then stays alive and quiet (until its stdin closes); a consumer
process reads them, then is caught in CASE, and the harness sends it a signal (or lets it return):
- `next-frame`: blocked in `next_frame` (CPU strategies: waiting for a frame; gpu-stream-ops: the CPU ran the whole
  run-ahead depth of frames ahead of the stream, which waits for a frame that never comes);
- `iterate`: the same inside `for frame in consumer`;
- `held` (GPU-side strategies: a frame whose wait is queued on the stream, never satisfied): in `time.sleep`;
- `return`: the script ends normally while holding that frame (no signal).
Signals: SIGINT (must raise `KeyboardInterrupt` in the consumer, and the process must exit within 1 s of the
signal) and SIGTERM (Python's default: the process ends within 1 s). On a GPU (default): torch, backends legacy and
vmm, gpu-stream-ops, each GPU-side wait followed by a torch operation on the frame on the same stream (no sync).
`--host`: the host backend with NumPy and cpu-spin (the dry run, also run by python/tests/test_signals.py).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from collections.abc import Iterator
from typing import Any

import gpu_ipc

WIDTH, HEIGHT, SLOTS = 64, 32, 4
PUBLISHED = 3  # frames the producer publishes before it goes quiet
EXIT_LIMIT = 1.0  # seconds from the signal (or the consumer's last line) to its exit
CASES = ("next-frame", "iterate", "held", "return")
GIVE_UP = 15.0  # seconds a consumer is given to exit before it is killed (and the case fails)


def say(*words: object) -> None:
    print(*words, flush=True)


def producer(sock: str, backend: str, sync: str, frames: int) -> None:
    """Publishes `frames` frames, then stays alive and quiet until stdin closes."""
    with gpu_ipc.Producer(sock, width=WIDTH, height=HEIGHT, slots=SLOTS, sync=sync, backend=backend) as p:
        p.wait_for_consumers(1, timeout=30)
        if backend == "host":
            import numpy as np

            for i in range(frames):
                slot = p.acquire(timeout=5)
                np.from_dlpack(slot)[:] = i % 256
                p.publish(slot)
        else:
            import torch  # type: ignore[import-not-found, unused-ignore]

            stream = torch.cuda.Stream()
            for i in range(frames):
                slot = p.acquire(timeout=5, stream=stream)
                with torch.cuda.stream(stream):
                    torch.from_dlpack(slot).fill_(i % 256)
                p.publish(slot, stream=stream)
            stream.synchronize()
        say("quiet")
        sys.stdin.read()  # alive and quiet until the harness closes stdin


def consumer(sock: str, backend: str, case: str) -> None:
    """Reads the published frames, then is caught in `case` (see the module's docs); prints `blocked` just before."""
    gpu = backend != "host"
    if gpu:
        import torch  # type: ignore[import-not-found, unused-ignore]

        stream: Any = torch.cuda.Stream()

        def use(frame: gpu_ipc.Frame) -> None:  # queued on the frame's stream, never waited for
            with torch.cuda.stream(stream):
                torch.from_dlpack(frame).float().sum()
    else:
        import numpy as np

        stream = None

        def use(frame: gpu_ipc.Frame) -> None:
            np.from_dlpack(frame).sum()

    start = time.monotonic()
    with gpu_ipc.Consumer(sock, backend=backend, wait_for_producer=30, timeout=60) as c:
        gpu_side = any(s["name"] == c.sync and s["waits"] == "gpu" for s in gpu_ipc.sync_strategies())
        for _ in range(PUBLISHED):
            with c.next_frame(timeout=10, stream=stream) as frame:
                use(frame)
        if gpu:
            stream.synchronize()  # the published frames were read: from here on the stream only waits
        say("read", PUBLISHED)
        try:
            if case in ("held", "return") and gpu_side:
                held = c.next_frame(timeout=10, stream=stream)  # queued; the producer never publishes it
                use(held)
                say("blocked")
                if case == "held":
                    time.sleep(60)
            elif case in ("held", "return"):
                say("blocked")  # a CPU strategy hands out no frame before it is published: nothing to hold
                if case == "held":
                    time.sleep(60)
            elif case == "next-frame":
                say("blocked")
                while True:  # GPU-side: queues waits until the run-ahead bound makes the CPU wait
                    frame = c.next_frame(timeout=60, stream=stream)
                    use(frame)
                    c.release(frame)
            else:
                say("blocked")
                for frame in c:
                    use(frame)
        except KeyboardInterrupt:
            say("KeyboardInterrupt", f"{time.monotonic() - start:.3f}")
            raise
        say("returning")


def run_case(tmp: str, backend: str, sync: str, case: str, sig: signal.Signals | None) -> dict[str, Any]:
    """One producer and one consumer; the consumer's outcome against the limits."""
    sock = os.path.join(tempfile.mkdtemp(prefix="gs-", dir=tmp), "f.sock")
    me = [sys.executable, __file__]
    with open(os.path.join(os.path.dirname(sock), "producer.err"), "w") as prod_err:
        prod = subprocess.Popen([*me, "producer", sock, backend, sync, str(PUBLISHED)], stdin=subprocess.PIPE,
                                stdout=subprocess.DEVNULL, stderr=prod_err, text=True)
    err_path = os.path.join(os.path.dirname(sock), "consumer.err")
    with open(err_path, "w") as err_file:
        cons = subprocess.Popen([*me, "consumer", sock, backend, case], stdout=subprocess.PIPE, stderr=err_file,
                                text=True)
    row: dict[str, Any] = {"backend": backend, "sync": sync, "case": case,
                           "signal": sig.name if sig is not None else "none"}
    lines: list[str] = []
    try:
        assert cons.stdout is not None
        while not lines or not lines[-1].startswith("blocked"):
            line = cons.stdout.readline()
            if not line:
                break
            lines.append(line.strip())
        if sig is not None:
            time.sleep(0.5)  # well inside the blocking call
            sent = time.monotonic()
            cons.send_signal(sig)
        else:
            sent = time.monotonic()
        try:
            cons.wait(timeout=GIVE_UP)
            row["exit_s"] = round(time.monotonic() - sent, 3)
        except subprocess.TimeoutExpired:
            cons.kill()
            cons.wait()
            row["exit_s"] = None  # shown as "> GIVE_UP"
        lines += cons.stdout.read().splitlines()
        row["returncode"] = cons.returncode
        row["raised"] = any(line.startswith("KeyboardInterrupt") for line in lines)
        err = Path(err_path).read_text(errors="replace")
        row["tail"] = (err.strip().splitlines() or [""])[-1][:200]
    finally:
        if prod.stdin is not None:
            prod.stdin.close()
        try:
            prod.wait(timeout=30)
        except subprocess.TimeoutExpired:
            prod.kill()
            prod.wait()
        shutil.rmtree(os.path.dirname(sock), ignore_errors=True)
    exited = row["exit_s"] is not None and row["exit_s"] <= EXIT_LIMIT
    if sig == signal.SIGINT:
        row["ok"] = exited and row["raised"] and row["returncode"] == -signal.SIGINT
    elif sig == signal.SIGTERM:
        row["ok"] = exited and row["returncode"] == -signal.SIGTERM
    else:
        row["ok"] = exited and row["returncode"] == 0 and "returning" in lines
    return row


def setups(host: bool) -> list[tuple[str, str]]:
    return [("host", "cpu-spin")] if host else [("legacy", "gpu-stream-ops"), ("vmm", "gpu-stream-ops")]


def cases(host: bool, budget: float | None = None) -> Iterator[dict[str, Any]]:
    """Every case's row, in order; once `budget` seconds have passed, the rest as failed and not run."""
    start = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="gpu-ipc-sigint-", dir="/tmp") as tmp:
        for backend, sync in setups(host):
            for case in CASES:
                for sig in [None] if case == "return" else [signal.SIGINT, signal.SIGTERM]:
                    if budget is not None and time.monotonic() - start > budget:
                        yield {"backend": backend, "sync": sync, "case": case,
                               "signal": sig.name if sig else "none", "exit_s": None, "returncode": None,
                               "raised": False, "tail": f"not run: past the {budget} s budget", "ok": False}
                        continue
                    yield run_case(tmp, backend, sync, case, sig)


def note(row: dict[str, Any]) -> str:
    """What a row shows, in words."""
    exit_s = f"{row['exit_s']} s" if row["exit_s"] is not None else f"> {GIVE_UP} s (killed)"
    what = "after the signal" if row["signal"] != "none" else "after its last line"
    raised = ", KeyboardInterrupt raised" if row["raised"] else ""
    return f"exit {exit_s} {what}{raised}, status {row['returncode']}" + (
        f"; {row['tail']}" if not row["ok"] and row["tail"] else "")


def run(out_dir: Path, host: bool) -> int:
    out_dir.mkdir(parents=True, exist_ok=True)
    rows = []
    for row in cases(host):
        print(json.dumps(row), file=sys.stderr, flush=True)
        rows.append(row)
    (out_dir / "python-sigint.json").write_text(json.dumps(rows, indent=1) + "\n")
    table = ["| backend | sync | case | signal | KeyboardInterrupt | exit after (s) | status | ok |",
             "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        table.append(f"| {r['backend']} | {r['sync']} | {r['case']} | {r['signal']} | "
                     f"{'yes' if r['raised'] else 'no'} | {r['exit_s'] if r['exit_s'] is not None else '> ' + str(GIVE_UP)} | "
                     f"{r['returncode']} | {'ok' if r['ok'] else 'FAIL'} |")
    (out_dir / "python-sigint.md").write_text(
        f"# Signals against a Python consumer of a quiet producer\n\nlimit: exit within {EXIT_LIMIT} s\n\n"
        + "\n".join(table) + "\n")
    print("\n".join(table))
    return 0 if all(r["ok"] for r in rows) else 1


def main(argv: list[str]) -> int:
    if len(argv) >= 2 and argv[0] == "run":
        return run(Path(argv[1]), "--host" in argv[2:])
    if len(argv) == 5 and argv[0] == "producer":
        producer(argv[1], argv[2], argv[3], int(argv[4]))
        return 0
    if len(argv) == 4 and argv[0] == "consumer" and argv[3] in CASES:
        consumer(argv[1], argv[2], argv[3])
        return 0
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
