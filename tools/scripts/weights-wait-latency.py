"""How soon a reader's wait for the next generation lets go once another process publishes it: with a GPU, a stream
wait (``Reader.wait_on``: the time from the owner's ``update()`` returning to the reader's stream having passed
the wait, as ``stream.query()`` sees it); on the host backend (``--backend host``), the reader's status word
(``Reader.watch``: to the word saying the generation). Both processes read ``time.monotonic()``, one clock per
machine; the reader can see the generation before the owner's ``update()`` returns (its note is stored inside), so
the minimum may be negative. Also the end: the owner SIGKILLed while a wait is pending, to the wait let go as gone.

    python tools/scripts/weights-wait-latency.py [--backend vmm|legacy|host] [--trials 50] [--json OUT]

Run it with a Python that has the gpu_ipc wheel (and torch for a GPU backend).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

OWNER = """
import sys, time, numpy as np, gpu_ipc.weights
backend = sys.argv[2]
if backend == "host":
    sd = {"w": np.zeros(1024, dtype=np.float32)}
else:
    import torch
    sd = {"w": torch.zeros(1024, device="cuda")}
pub = gpu_ipc.weights.publish(sd, "m", socket=sys.argv[1], backend=backend)
print("READY", pub.generation, flush=True)
for line in sys.stdin:
    if line.strip() == "publish":
        generation = pub.update(sd)
        print("PUBLISHED", generation, repr(time.monotonic()), flush=True)
"""


def expect(proc: subprocess.Popen[str], tag: str) -> list[str]:
    assert proc.stdout is not None
    while True:
        line = proc.stdout.readline()
        if not line:
            raise RuntimeError(f"the owner ended before saying {tag}: {proc.stderr.read() if proc.stderr else ''}")
        words = line.split()
        if words and words[0] == tag:
            return words[1:]


def passed(wait: Any, stream: Any, reader: Any) -> bool:
    if stream is not None:
        return bool(stream.query())
    return reader.wait_status(wait)[0] != "waiting"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--backend", default="vmm", choices=["vmm", "legacy", "host"])
    p.add_argument("--trials", type=int, default=50)
    p.add_argument("--json", default=None, help="write the figures here too")
    args = p.parse_args()
    import gpu_ipc.weights

    torch: Any = None
    if args.backend != "host":
        import torch as torch_module

        torch = torch_module
    sock = os.path.join(tempfile.mkdtemp(prefix="gpu-ipc-wait-"), "w.sock")
    owner = subprocess.Popen([sys.executable, "-c", OWNER, sock, args.backend], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    released_us: list[float] = []
    gone_ms: float | None = None
    try:
        expect(owner, "READY")
        reader = gpu_ipc.weights.open(sock, "m", backend=args.backend)
        stream = torch.cuda.Stream() if torch is not None else None
        assert owner.stdin is not None
        for _ in range(args.trials):
            wanted = reader.latest() + 1
            wait = reader.wait_on(wanted, stream=stream) if stream is not None else reader.watch(wanted)
            if passed(wait, stream, reader):
                raise RuntimeError(f"the wait for generation {wanted} let go before it was published")
            owner.stdin.write("publish\n")
            owner.stdin.flush()
            while not passed(wait, stream, reader):
                pass
            seen = time.monotonic()
            generation, published_at = expect(owner, "PUBLISHED")
            if int(generation) != wanted or reader.wait_status(wait) != ("published", wanted):
                raise RuntimeError(f"published {generation}, the wait says {reader.wait_status(wait)}")
            released_us.append((seen - float(published_at)) * 1e6)
            reader.refresh()
        # The end: a wait pending when the owner is SIGKILLed.
        wait = reader.wait_on(reader.latest() + 1, stream=stream) if stream is not None else reader.watch(
            reader.latest() + 1)
        owner.send_signal(signal.SIGKILL)
        killed = time.monotonic()
        while not passed(wait, stream, reader):
            if time.monotonic() - killed > 5:
                raise RuntimeError("the wait was not let go within 5 s of the owner's SIGKILL")
        gone_ms = (time.monotonic() - killed) * 1e3
        status = reader.wait_status(wait)[0]
        if status != "gone":
            raise RuntimeError(f"after the SIGKILL the wait says {status!r}, not 'gone'")
        reader.close()
    finally:
        if owner.poll() is None:
            owner.kill()
        owner.wait()
    ordered = sorted(released_us)
    figures = {"backend": args.backend, "how": "stream wait" if torch is not None else "status word",
               "trials": len(ordered), "min_us": ordered[0], "p50_us": statistics.median(ordered),
               "p99_us": ordered[min(len(ordered) - 1, round(0.99 * (len(ordered) - 1)))], "max_us": ordered[-1],
               "gone_after_sigkill_ms": gone_ms}
    print(f"{args.backend} ({figures['how']}): let go {figures['p50_us']:.0f} us after the owner's update() "
          f"returned (p50; min {figures['min_us']:.0f}, p99 {figures['p99_us']:.0f}, max {figures['max_us']:.0f} us; "
          f"{len(ordered)} trials); the owner SIGKILLed with a wait pending: let go as gone after {gone_ms:.3f} ms")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(figures, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
