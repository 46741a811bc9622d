"""The Python package on a GPU: a torch producer and a torch (or CuPy) consumer in two processes, 4K RGB frames.

Run by scripts/python-gpu.sh (which installs the staged wheel into a venv that sees the machine's torch, CuPy):
    python scripts/python_gpu.py run OUT_DIR            every row; writes OUT_DIR/python-package.{json,md,log}
    python scripts/python_gpu.py produce SOCK BACKEND SYNC FRAMES
    python scripts/python_gpu.py consume SOCK BACKEND torch|cupy FRAMES
Each frame is checked on the GPU: the producer writes frame s as `(base + s) % 256`, where `base[i] = i % 251` (one
kernel, in place through torch.from_dlpack(slot)); the consumer compares each byte with the same expression and
counts mismatched bytes per frame on the GPU (no CPU sync per frame), summed over the frames the producer published.
The consumer reports FPS (first frame to end of stream) and CPU time per frame; its first frame also checks that the
tensors are the frame itself: torch.from_dlpack(frame).data_ptr() == frame.ptr (CuPy: from_dlpack and
__cuda_array_interface__).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

WIDTH, HEIGHT = 3840, 2160
SLOTS = 4
ROWS = [(b, s, "torch") for b in ("legacy", "vmm") for s in ("cpu-spin", "ipc-event", "gpu-stream-ops")] + [
    ("vmm", "gpu-stream-ops", "cupy"),
]
# `run OUT_DIR --host`: the same script on the host backend with NumPy, small frames (a dry run of the harness on a
# machine without a GPU).
HOST_ROWS = [("host", "cpu-spin", "numpy"), ("host", "cpu-sleep", "numpy")]
if os.environ.get("PY_GPU_HOST_DRY_RUN"):
    WIDTH, HEIGHT = 64, 32
PROCESS_TIMEOUT = 120  # seconds, each process of a row
BUDGET = 420  # no new row after this many seconds


def produce(sock: str, backend: str, sync: str, frames: int) -> dict[str, Any]:
    import gpu_ipc

    if backend == "host":
        return produce_host(sock, sync, frames)
    import torch

    dev = torch.device("cuda:0")
    base = (torch.arange(HEIGHT * WIDTH * 3, device=dev, dtype=torch.int32) % 251).to(torch.uint8)
    base = base.view(HEIGHT, WIDTH, 3)
    stream = torch.cuda.Stream(dev)
    with torch.cuda.stream(stream), gpu_ipc.Producer(
        sock, width=WIDTH, height=HEIGHT, slots=SLOTS, sync=sync, backend=backend
    ) as producer:
        producer.wait_for_consumers(1, timeout=60)
        t0, cpu0 = time.perf_counter(), time.process_time()
        for i in range(frames):
            slot = producer.acquire(timeout=10, stream=stream)
            torch.add(base, i % 256, out=torch.from_dlpack(slot))  # the slot in place, on `stream`
            producer.publish(slot, stream=stream)
        producer.drain(timeout=30, stream=stream)
        wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
        lost = producer.consumers_lost()
    return {"role": "producer", "frames": frames, "fps": frames / wall, "cpu_us_per_frame": cpu * 1e6 / frames,
            "consumers_lost": lost}


def produce_host(sock: str, sync: str, frames: int) -> dict[str, Any]:
    import numpy as np

    import gpu_ipc

    base = (np.arange(HEIGHT * WIDTH * 3) % 251).astype(np.uint8).reshape(HEIGHT, WIDTH, 3)
    with gpu_ipc.Producer(sock, width=WIDTH, height=HEIGHT, slots=SLOTS, sync=sync, backend="host") as producer:
        producer.wait_for_consumers(1, timeout=60)
        t0, cpu0 = time.perf_counter(), time.process_time()
        for i in range(frames):
            slot = producer.acquire(timeout=10)
            np.add(base, np.uint8(i % 256), out=np.from_dlpack(slot))
            producer.publish(slot)
        producer.drain(timeout=30)
        wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
        lost = producer.consumers_lost()
    return {"role": "producer", "frames": frames, "fps": frames / wall, "cpu_us_per_frame": cpu * 1e6 / frames,
            "consumers_lost": lost}


def consume(sock: str, backend: str, kind: str, frames: int) -> dict[str, Any]:
    import gpu_ipc

    if kind == "numpy":
        import contextlib

        import numpy as np

        base = (np.arange(HEIGHT * WIDTH * 3) % 251).astype(np.uint8).reshape(HEIGHT, WIDTH, 3)
        expected = np.empty_like(base)
        counts = np.zeros(frames + 64, dtype=np.int64)
        stream: Any = None
        context: Any = contextlib.nullcontext()
        from_dlpack = np.from_dlpack

        def check(x: Any, seq: int) -> None:
            np.add(base, np.uint8(seq % 256), out=expected)
            counts[seq] = np.count_nonzero(x != expected)

        def zero_copy(frame: Any) -> dict[str, bool]:
            return {"numpy_from_dlpack_is_the_frame": np.from_dlpack(frame).ctypes.data == frame.ptr}

        def total(published: int) -> int:
            return int(counts[:published].sum())
    elif kind == "torch":
        import torch

        dev = torch.device("cuda:0")
        base = (torch.arange(HEIGHT * WIDTH * 3, device=dev, dtype=torch.int32) % 251).to(torch.uint8)
        base = base.view(HEIGHT, WIDTH, 3)
        expected = torch.empty_like(base)
        counts = torch.zeros(frames + 64, dtype=torch.int64, device=dev)
        stream = torch.cuda.Stream(dev)
        context = torch.cuda.stream(stream)
        from_dlpack = torch.from_dlpack

        def check(x: Any, seq: int) -> None:
            torch.add(base, seq % 256, out=expected)
            counts[seq] = torch.count_nonzero(x != expected)

        def zero_copy(frame: Any) -> dict[str, bool]:
            return {"torch_from_dlpack_is_the_frame": torch.from_dlpack(frame).data_ptr() == frame.ptr}

        def total(published: int) -> int:
            stream.synchronize()
            return int(counts[:published].sum().item())
    else:
        import cupy as cp

        base = (cp.arange(HEIGHT * WIDTH * 3, dtype=cp.int32) % 251).astype(cp.uint8).reshape(HEIGHT, WIDTH, 3)
        expected = cp.empty_like(base)
        counts = cp.zeros(frames + 64, dtype=cp.int64)
        stream = cp.cuda.Stream(non_blocking=True)
        context = stream
        from_dlpack = cp.from_dlpack

        def check(x: Any, seq: int) -> None:
            cp.add(base, cp.uint8(seq % 256), out=expected)
            counts[seq] = cp.count_nonzero(x != expected)

        def zero_copy(frame: Any) -> dict[str, bool]:
            return {
                "cupy_from_dlpack_is_the_frame": cp.from_dlpack(frame).data.ptr == frame.ptr,
                "cupy_cuda_array_interface_is_the_frame": cp.asarray(frame).data.ptr == frame.ptr,
            }

        def total(published: int) -> int:
            stream.synchronize()
            return int(counts[:published].sum())

    read, published, checks = 0, -1, {}
    t0 = cpu0 = 0.0
    with context, gpu_ipc.Consumer(sock, backend=backend, name=kind, wait_for_producer=60, timeout=30) as consumer:
        while True:
            try:
                frame = consumer.next_frame(timeout=10, stream=stream)
            except gpu_ipc.EndOfStream as end:
                published = end.published
                break
            if read == 0:
                t0, cpu0 = time.perf_counter(), time.process_time()
                checks = zero_copy(frame)
            check(from_dlpack(frame), frame.seq)
            try:
                consumer.release(frame, stream=stream)
            except gpu_ipc.EndOfStream as end:  # a frame queued past the end: never written, not counted
                published = end.published
                break
            read += 1
        mismatched = total(published)
        wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    read = min(read, published)
    return {"role": "consumer", "kind": kind, "frames": read, "published": published, "mismatched_bytes": mismatched,
            "fps": read / wall if wall else 0.0, "cpu_us_per_frame": cpu * 1e6 / max(read, 1), **checks}


def last_json(text: str) -> dict[str, Any] | None:
    lines = [line for line in text.splitlines() if line.startswith("{")]
    return json.loads(lines[-1]) if lines else None


def run_row(backend: str, sync: str, kind: str, frames: int, log: Any) -> dict[str, Any]:
    row: dict[str, Any] = {"backend": backend, "sync": sync, "consumer": kind, "frames_asked": frames}
    with tempfile.TemporaryDirectory(prefix="gi-py-") as d:
        sock = os.path.join(d, "f.sock")
        me = [sys.executable, os.path.abspath(__file__)]
        producer = subprocess.Popen(me + ["produce", sock, backend, sync, str(frames)], stdout=subprocess.PIPE,
                                    stderr=subprocess.STDOUT, text=True)
        consumer = subprocess.Popen(me + ["consume", sock, backend, kind, str(frames)], stdout=subprocess.PIPE,
                                    stderr=subprocess.STDOUT, text=True)
        outs = {}
        for name, proc in (("consumer", consumer), ("producer", producer)):
            try:
                outs[name], _ = proc.communicate(timeout=PROCESS_TIMEOUT)
            except subprocess.TimeoutExpired:
                proc.kill()
                outs[name] = (proc.communicate()[0] or "") + f"\n{name}: killed after {PROCESS_TIMEOUT} s"
            row[f"{name}_exit"] = proc.returncode
            log.write(f"== {backend} {sync} {kind}: {name} (exit {proc.returncode})\n{outs[name]}\n")
    c, p = last_json(outs["consumer"]), last_json(outs["producer"])
    if c:
        row.update({k: v for k, v in c.items() if k != "role"})
    if p:
        row["producer_fps"] = p["fps"]
        row["producer_cpu_us_per_frame"] = p["cpu_us_per_frame"]
    errors = [line for o in outs.values() for line in o.splitlines() if "Error" in line or "error" in line]
    row["error"] = errors[-1][:200] if errors else ""
    zero_copy = [v for k, v in row.items() if k.endswith("_is_the_frame")]
    row["ok"] = (row.get("consumer_exit") == 0 and row.get("producer_exit") == 0 and row.get("frames") == frames
                 and row.get("mismatched_bytes") == 0 and bool(zero_copy) and all(zero_copy))
    return row


def markdown(rows: list[dict[str, Any]], device: str) -> str:
    out = [f"# gpu_ipc (Python) on {device}: torch producer -> consumer, {WIDTH}x{HEIGHT} RGB, {SLOTS} slots", "",
           "| backend | sync | consumer | frames | mismatched bytes | consumer FPS | consumer CPU us/frame "
           "| producer FPS | producer CPU us/frame | zero copy | ok | error |",
           "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        zc = ", ".join(f"{k.removesuffix('_is_the_frame')}={v}" for k, v in r.items() if k.endswith("_is_the_frame"))

        def num(key: str, fmt: str = "{:.1f}") -> str:
            return fmt.format(r[key]) if isinstance(r.get(key), (int, float)) else "-"

        out.append(f"| {r['backend']} | {r['sync']} | {r['consumer']} | {r.get('frames', '-')} "
                   f"| {r.get('mismatched_bytes', '-')} | {num('fps')} | {num('cpu_us_per_frame')} "
                   f"| {num('producer_fps')} | {num('producer_cpu_us_per_frame')} | {zc or '-'} "
                   f"| {'yes' if r['ok'] else 'NO'} | {r['error'].replace('|', '/')} |")
    return "\n".join(out) + "\n"


def run(out_dir: str, host: bool) -> int:
    if not host:
        import torch
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    if host:
        device = "the host backend (dry run, no GPU)"
    elif not torch.cuda.is_available():
        print("python-gpu: torch sees no GPU", file=sys.stderr)
        return 2
    else:
        device = torch.cuda.get_device_name(0)
    frames = int(os.environ.get("PY_GPU_FRAMES", "600"))
    rows: list[dict[str, Any]] = []
    start = time.monotonic()
    with open(out / "python-package.log", "w") as log:
        for backend, sync, kind in HOST_ROWS if host else ROWS:
            if time.monotonic() - start > BUDGET:
                rows.append({"backend": backend, "sync": sync, "consumer": kind, "ok": False,
                             "error": f"not run: the script passed its {BUDGET} s budget"})
                continue
            row = run_row(backend, sync, kind, frames, log)
            print(json.dumps(row), flush=True)
            rows.append(row)
    (out / "python-package.json").write_text(json.dumps({"device": device, "rows": rows}, indent=2) + "\n")
    table = markdown(rows, device)
    (out / "python-package.md").write_text(table)
    print(table)
    return 0 if all(r["ok"] for r in rows) else 1


def main() -> int:
    mode = sys.argv[1]
    if mode == "run":
        host = sys.argv[3:] == ["--host"]
        if host:
            os.environ["PY_GPU_HOST_DRY_RUN"] = "1"  # the row processes use small frames too
            global WIDTH, HEIGHT
            WIDTH, HEIGHT = 64, 32
        return run(sys.argv[2], host)
    if mode == "produce":
        print(json.dumps(produce(sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5]))), flush=True)
        return 0
    if mode == "consume":
        print(json.dumps(consume(sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5]))), flush=True)
        return 0
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
