"""How long a reader's switch to the next generation takes on the host backend: ``Reader.refresh()`` (finding the
arena, its manifest read, checked or taken from the generation held, when the bytes are the same but for the
generation) and ``tensors(numpy)`` (the cut), for a set of N float32 tensors, after the owner's ``stage(numpy)`` /
``commit()``. No GPU needed.

    python tools/scripts/weights-refresh.py [--tensors 18771] [--generations 6]

Run it with a Python that has numpy and the gpu_ipc wheel (``target/py-test/venv/bin/python`` after
``scripts/python-test.sh`` has the dev build; a release wheel, ``scripts/build-wheel.sh``, is what the docs cite).
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time

import numpy as np

import gpu_ipc.weights


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tensors", type=int, default=18_771, help="tensors in the set (the MoE benchmark's count)")
    p.add_argument("--generations", type=int, default=6, help="switches timed")
    args = p.parse_args()
    folder = tempfile.mkdtemp(prefix="gpu-ipc-refresh-")
    sock = os.path.join(folder, "w.sock")
    sd = {f"model.layers.{i // 384}.mlp.experts.{i % 384}.w": np.full((64,), i % 100, dtype=np.float32)
          for i in range(args.tensors)}
    with gpu_ipc.weights.publish(sd, "w", socket=sock, backend="host") as pub:
        with gpu_ipc.weights.open(sock, "w") as reader:
            for k in range(args.generations):
                staged = pub.stage(np)
                for a in staged.values():
                    a[...] = k
                del staged
                generation = pub.commit()
                t0 = time.perf_counter()
                got = reader.refresh()
                t1 = time.perf_counter()
                cut = reader.tensors(np)
                t2 = time.perf_counter()
                if got != generation or int(cut[next(iter(cut))][0]) != k:
                    print(f"generation {got} (want {generation}) read wrong")
                    return 1
                del cut
                print(f"generation {generation}: refresh {1e3 * (t1 - t0):.2f} ms, tensors(numpy) "
                      f"{1e3 * (t2 - t1):.2f} ms ({args.tensors} tensors)")
    os.rmdir(folder) if not os.listdir(folder) else None
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
