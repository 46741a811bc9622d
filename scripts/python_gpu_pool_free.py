"""A freed shared tensor is not reused under its readers: PyTorch's caching allocator, two processes, on a GPU.

Run on the GPU machine with the wheel installed (scripts/python-gpu.sh's venv, or any python3 that imports torch and
gpu_ipc):
    python scripts/python_gpu_pool_free.py [--backend legacy|vmm|both] [--mib N]
For each backend (default both; vmm runs the owner with PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True), an owner
process A and a reader process B:
  1. A makes a torch tensor (the caching allocator's memory), shares it by name (gpu_ipc.SharedPool.share) and drops
     its own reference: the pool holds the only one.
  2. B opens it (gpu_ipc.open) and makes a tensor of the view (torch.from_dlpack): B pins it.
  3. A frees it (SharedBuffer.free()). B's new lookup of the name is refused at once (NotFound).
  4. A allocates tensors of the same size and writes into them: the caching allocator would hand the freed block to
     the first of them if the pool had let the tensor go. None lies on the shared block, and B's bytes are unchanged.
  5. B lets go (drops its tensor and view, stays alive). A polls SharedPool.reclaim(): the tensor is given back to
     the allocator within seconds (torch.cuda.memory_allocated drops by its size; SharedBuffer.source is None).
Prints one `PASS` or `FAIL` line per backend and a last `pool-free: PASS|FAIL` line; exit status 0 only if all pass.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from typing import Any

from linepipe import read_line, say

LINE_TIMEOUT = 60.0  # seconds a process waits for the other's next line
RECLAIM_WITHIN = 10.0  # seconds A polls for the reclaim after B let go
VALUE = 1234
OTHER = 9999


def reader(sock: str) -> int:
    """Process B: view the shared tensor, answer the owner's requests on stdin, report on stdout."""
    import torch

    import gpu_ipc

    view = gpu_ipc.open(sock, "t", wait_for_owner=10.0)
    tensor: Any = torch.from_dlpack(view)
    torch.cuda.synchronize()
    say(f"VIEWING {int(tensor.numel())} {int((tensor == VALUE).sum())}")
    while True:
        request = read_line(sys.stdin, LINE_TIMEOUT)
        if request == "LOOKUP":
            try:
                gpu_ipc.open(sock, "t")
                say("LOOKUP found")
            except gpu_ipc.NotFound:
                say("LOOKUP refused")
        elif request == "CHECK":
            same = int((tensor == VALUE).sum())
            torch.cuda.synchronize()
            say(f"CHECK {same}")
        elif request == "RELEASE":
            del tensor
            view.release()
            del view
            torch.cuda.synchronize()
            say("RELEASED")
        elif request == "BYE":
            return 0
        else:
            say(f"UNKNOWN {request}")
            return 1


def owner(backend: str, mib: int) -> int:
    """Process A: share, free, allocate again, check; prints PASS or FAIL and returns 0 or 1."""
    import torch

    import gpu_ipc

    failures: list[str] = []

    def check(ok: bool, what: str) -> None:
        say(f"  {'ok  ' if ok else 'FAIL'} {what}")
        if not ok:
            failures.append(what)

    n = mib * (1 << 20) // 4
    nbytes = n * 4
    sock = os.path.join(tempfile.mkdtemp(prefix="gpu-ipc-pool-free-"), "pool.sock")
    pool = gpu_ipc.SharedPool(sock, backend=backend)
    x = torch.full((n,), VALUE, dtype=torch.int32, device="cuda")
    torch.cuda.synchronize()
    shared_ptr = x.data_ptr()
    shared = pool.share(x, "t")
    del x  # the pool holds the only reference now
    b = subprocess.Popen([sys.executable, __file__, "reader", sock], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                         text=True)
    assert b.stdin is not None and b.stdout is not None

    def ask(request: str) -> str:
        assert b.stdin is not None and b.stdout is not None
        b.stdin.write(request + "\n")
        b.stdin.flush()
        return read_line(b.stdout, LINE_TIMEOUT)

    try:
        viewing = read_line(b.stdout, LINE_TIMEOUT).split()
        check(viewing == ["VIEWING", str(n), str(n)], f"B views the tensor and reads {VALUE} everywhere: {viewing}")
        shared.free()
        check(ask("LOOKUP") == "LOOKUP refused", "B's new lookup after free is refused at once (NotFound)")
        check(shared.source is not None, "the pool still holds the tensor while B views it")
        fresh = [torch.empty((n,), dtype=torch.int32, device="cuda") for _ in range(4)]
        for t in fresh:
            t.fill_(OTHER)
        torch.cuda.synchronize()
        on_shared = [t.data_ptr() for t in fresh if t.data_ptr() <= shared_ptr < t.data_ptr() + nbytes]
        check(not on_shared, f"no new tensor of the same size lies on the freed block (at {shared_ptr:#x})")
        check(pool.reclaim() == 0, "reclaim gives nothing back while B views it")
        answer = ask("CHECK")
        check(answer == f"CHECK {n}", f"B's bytes are unchanged after A's new tensors were written: {answer}")
        allocated_held = torch.cuda.memory_allocated()
        check(ask("RELEASE") == "RELEASED", "B lets go of its view")
        reclaimed, deadline = 0, time.monotonic() + RECLAIM_WITHIN
        while reclaimed == 0 and time.monotonic() < deadline:
            reclaimed = pool.reclaim()
            if reclaimed == 0:
                time.sleep(0.01)
        check(reclaimed == 1, f"the buffer goes back within {RECLAIM_WITHIN} s of B letting go")
        check(shared.source is None, "the pool let go of the tensor")
        released = allocated_held - torch.cuda.memory_allocated()
        check(released >= nbytes, f"torch's allocated bytes dropped by the tensor's {nbytes} (by {released})")
        again = torch.empty((n,), dtype=torch.int32, device="cuda")
        say(f"  info a new tensor of the same size {'reuses' if again.data_ptr() == shared_ptr else 'does not reuse'}"
            " the released block")
        del fresh, again
        b.stdin.write("BYE\n")
        b.stdin.flush()
        check(b.wait(timeout=LINE_TIMEOUT) == 0, "B exits cleanly")
    except (TimeoutError, EOFError, subprocess.TimeoutExpired) as e:
        failures.append(f"B: {e}")
        say(f"  FAIL B: {e}")
    finally:
        if b.poll() is None:
            b.kill()
            b.wait()
        pool.close()
    verdict = "PASS" if not failures else "FAIL"
    say(f"{verdict} pool-free {backend}" + ("" if not failures else f": {len(failures)} check(s) failed"))
    return 0 if not failures else 1


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("role", nargs="?", default="main", choices=["main", "owner", "reader"])
    parser.add_argument("arg", nargs="?", help="the socket (reader) or the backend (owner)")
    parser.add_argument("--backend", default="both", choices=["legacy", "vmm", "both"])
    parser.add_argument("--mib", type=int, default=16, help="the tensor's size in MiB (default 16)")
    args = parser.parse_args()
    if args.role == "reader":
        return reader(args.arg)
    if args.role == "owner":
        return owner(args.arg, args.mib)
    backends = ["legacy", "vmm"] if args.backend == "both" else [args.backend]
    results = {}
    for backend in backends:
        env = dict(os.environ)
        if backend == "vmm":
            env["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"
        else:
            env.pop("PYTORCH_CUDA_ALLOC_CONF", None)
        say(f"pool-free {backend}:")
        try:
            rc = subprocess.run([sys.executable, __file__, "owner", backend, "--mib", str(args.mib)], env=env,
                                timeout=300).returncode
        except subprocess.TimeoutExpired:
            say(f"FAIL pool-free {backend}: timed out")
            rc = 1
        results[backend] = rc
    ok = all(rc == 0 for rc in results.values())
    summary = ", ".join(f"{b} {'ok' if rc == 0 else 'failed'}" for b, rc in results.items())
    say(f"pool-free: {'PASS' if ok else 'FAIL'} ({summary})")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
