"""Where a reader's cold read of a weight set goes, in parts: ``open()`` (attach, the first generation, its load: the
library's own debug timings), then the pieces of ``tensors(framework)``: the native ``arena()`` (the names, runs and
order handed to Python), the one DLPack import of the arena, and the cut into tensors. Each reader is a fresh
process (the framework and CUDA set up before the clock, as ``scripts/weights_bench.py`` does); the owner publishes
the benchmark's mixture-of-experts shape (18,771 tensors) once.

    python tools/scripts/weights-cold.py [--backend vmm|legacy|host] [--readers 5] [--json OUT]

On a GPU (vmm, legacy) the tensors are torch's, random bf16, 22.4 GB; on the host backend (no GPU: a Python with
the gpu_ipc wheel, numpy and torch, e.g. ``target/py-test/venv/bin/python`` after ``scripts/python-test.sh``) the
same names and shapes at 8 elements each, as CPU torch tensors.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "scripts"))

from weightsbench.shapes import moe_shapes  # noqa: E402

READER = r"""
import json, sys, time
import torch
import gpu_ipc.weights
from gpu_ipc._weights_tensors import _cut
sock, name, backend = sys.argv[1:4]
if backend != "host":
    torch.zeros(1, device="cuda"); torch.cuda.synchronize()
sync = torch.cuda.synchronize if backend != "host" else (lambda: None)
t0 = time.perf_counter()
r = gpu_ipc.weights.open(sock, name, backend=backend, timeout=60.0)
t1 = time.perf_counter()
arena, cut = r._reader.arena()
t2 = time.perf_counter()
flat = torch.from_dlpack(arena)
t3 = time.perf_counter()
held = _cut(arena, cut, torch, lambda: dict(r._reader.tensors()))
sync()
t4 = time.perf_counter()
again = r.tensors(torch)
t5 = time.perf_counter()
print(json.dumps({"open": t1 - t0, "arena": t2 - t1, "dlpack": t3 - t2, "cut": t4 - t3, "cold": t4 - t0,
                  "tensors_again": t5 - t4, "tensors": len(held), "runs": len(cut[1])}), flush=True)
del held, again, flat, arena
r.close()
"""

DEBUG = re.compile(r"(attach_us|first_generation_us|load_us|import_us|lookup_us|manifest_us|copy_us|decode_us)=(\d+)")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--backend", default="vmm", choices=["vmm", "legacy", "host"])
    p.add_argument("--readers", type=int, default=5)
    p.add_argument("--json", help="write the rows here")
    args = p.parse_args()
    import torch

    import gpu_ipc.weights

    shapes = moe_shapes()
    if args.backend == "host":
        sd = {n: torch.zeros(8, dtype=torch.bfloat16) for n, _ in shapes}
    else:
        g = torch.Generator(device="cuda").manual_seed(1)
        sd = {n: torch.randn(s, dtype=torch.bfloat16, device="cuda", generator=g) for n, s in shapes}
        torch.cuda.synchronize()
    folder = tempfile.mkdtemp(prefix="gpu-ipc-cold-")
    sock = os.path.join(folder, "w.sock")
    rows = []
    env = {**os.environ, "GPU_IPC_LOG": "debug"}
    with gpu_ipc.weights.publish(sd, "moe", socket=sock, backend=args.backend):
        for k in range(args.readers):
            out = subprocess.run([sys.executable, "-c", READER, sock, "moe", args.backend], capture_output=True,
                                 text=True, timeout=300, env=env)
            if out.returncode != 0:
                print(out.stderr[-3000:], file=sys.stderr)
                return 1
            row = json.loads(out.stdout.strip().splitlines()[-1])
            for key, value in DEBUG.findall(re.sub(r"\x1b\[[0-9;]*m", "", out.stderr)):
                row.setdefault(key, []).append(int(value))
            rows.append(row)
            ms = {k: round(1e3 * v, 2) for k, v in row.items() if isinstance(v, float)}
            debug = {k: v for k, v in row.items() if isinstance(v, list)}
            print(f"reader {k}: {ms} {debug}", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"backend": args.backend, "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                       "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
