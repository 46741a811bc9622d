"""Where a reader's cut of the benchmark's 18,771-tensor set goes, run by run, against torch alone: in a fresh reader
process, the cut of ``tensors(torch)`` done by hand in its steps (each run's strided view and ``unbind``, the runs'
tensors put in the names' order, the dict, a device synchronize, then dropping them), 3 times; then torch's own
``as_strided(...).unbind(0)`` of runs of the same counts and shapes over a plain CUDA tensor, twice. Two readers.
The owner publishes the shapes uninitialised (``torch.empty``): nothing here reads a value.

    python tools/scripts/weights-cut-runs.py OUT.json        (a GPU, torch, the gpu_ipc wheel)

OUT.json: one JSON object per reader and line: ``runs`` (dtype, count, shape, strides, step), ``repK`` (milliseconds:
``runs_ms`` in all and ``per_run`` as [view + unbind, list extend], ``reorder``, ``dict``, ``sync``, ``free``) and
``plainK`` (milliseconds per run, torch alone).
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "scripts"))

from weightsbench.shapes import moe_shapes  # noqa: E402

READER = r'''
import sys, time, gc, json
import torch, gpu_ipc.weights
from gpu_ipc._weights_tensors import _run_torch
torch.zeros(1, device="cuda"); torch.cuda.synchronize()
r = gpu_ipc.weights.open(sys.argv[1], "moe", timeout=60.0)
arena, cut = r._reader.arena()
names, runs, order = cut
out = {"runs": [(x[0], x[1], list(x[2]), list(x[3]), x[5]) for x in runs]}
ms = lambda s: round(s * 1e3, 2)
for rep in range(3):
    gc.disable()
    t0 = time.perf_counter()
    flat = torch.from_dlpack(arena)
    typed, laid, per = {}, [], []
    for run in runs:
        a = time.perf_counter()
        made = _run_torch(torch, flat, typed, run, False, True)
        b = time.perf_counter()
        laid.extend(made)
        per.append([ms(b - a), ms(time.perf_counter() - b)])
    t1 = time.perf_counter()
    ordered = list(map(laid.__getitem__, order))
    t2 = time.perf_counter()
    d = dict(zip(names, ordered))
    t3 = time.perf_counter()
    torch.cuda.synchronize()
    t4 = time.perf_counter()
    del d, ordered, laid, made
    t5 = time.perf_counter()
    gc.enable()
    out[f"rep{rep}"] = {"runs_ms": ms(t1 - t0), "per_run": per, "reorder": ms(t2 - t1), "dict": ms(t3 - t2),
                        "sync": ms(t4 - t3), "free": ms(t5 - t4)}
plain = torch.empty(1 << 30, dtype=torch.bfloat16, device="cuda")
gc.disable()
for rep in range(2):
    per = []
    for _dtype, count, shape, strides, _offset, _step in runs:
        a = time.perf_counter()
        made = plain.as_strided([count, *shape], [0, *strides], 0).unbind(0) if count > 1 else ()
        per.append(ms(time.perf_counter() - a))
        del made
    out[f"plain{rep}"] = per
gc.enable()
print(json.dumps(out))
r.close()
'''


def main() -> int:
    if len(sys.argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    import torch

    import gpu_ipc.weights

    sd = {n: torch.empty(s, dtype=torch.bfloat16, device="cuda") for n, s in moe_shapes()}
    sock = os.path.join(tempfile.mkdtemp(prefix="gpu-ipc-cut-"), "w.sock")
    lines = []
    with gpu_ipc.weights.publish(sd, "moe", socket=sock):
        for _ in range(2):
            out = subprocess.run([sys.executable, "-c", READER, sock], capture_output=True, text=True, timeout=200)
            if out.returncode != 0:
                print(out.stderr[-3000:], file=sys.stderr)
                return 1
            lines.append(out.stdout.strip().splitlines()[-1])
            print(lines[-1], flush=True)
    with open(sys.argv[1], "w") as f:
        f.write("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
