"""Tensors PyTorch allocated with expandable segments, shared by name and read byte for byte by another process.

Run on the GPU machine with the wheel installed (scripts/python-gpu.sh's venv, or any python3 that imports torch,
cuda-bindings and gpu_ipc):
    python scripts/python_gpu_expandable.py [--max-mib N] [--json FILE]
An owner process A, started with PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True (PyTorch then maps many
cuMemCreate allocations side by side, about 20 MiB each for large tensors, 2 MiB for small ones), and a reader B:
  1. A makes uint8 tensors of 4 KiB to 1 GiB (by default), filled with a pattern on the GPU, plus tensors placed to
     straddle the boundaries between PyTorch's allocations (small-pool and large-pool ones, found by allocating
     tensors one after another until one straddles). For each it counts the allocations the tensor lies over
     (cuMemGetAddressRange, walked from its first byte to its last) and shares it with gpu_ipc.share (vmm).
  2. B opens each by name (gpu_ipc.open) and compares every byte with the pattern on the GPU: the number of wrong
     bytes, and how long open + check took.
  3. A frees every buffer, drops its tensors, empties PyTorch's cache and writes new tensors of the same sizes;
     B checks every byte again (the pool keeps what B views alive).
Prints a table (size, allocations, straddles, wrong bytes in both checks, open time) and `expandable: PASS|FAIL`.
PASS needs 0 wrong bytes everywhere, every row opened, the 1 GiB row (or the largest, above 20 MiB) over several
allocations, and at least one tensor of 20 MiB or less straddling a boundary. Exit status 0 only on PASS.

Progress: each process prints every step as it starts (`[A 12.3 s] ...`, `[B 4.5 s] ...`) and every row as it is
checked. Every wait is bounded: each step arms a watchdog (faulthandler) that, past the step's bound, prints the
step, every thread's Python stack and exits; A waits for each of B's lines at most --line-timeout seconds; the
whole run is bounded by --timeout (the owner is then killed, and the last step it printed says where it was).
Expected: about 1 minute on an H200.
"""

from __future__ import annotations

import argparse
import faulthandler
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from typing import IO, Any

from linepipe import read_line, say

LINE_TIMEOUT = 120.0  # seconds A waits for B's next line (a 1 GiB open and check included); --line-timeout
STEP_TIMEOUT = 120.0  # seconds one step of A or B may take before its watchdog reports it and exits
CHUNK = 64 << 20  # bytes generated or compared at a time
KIB, MIB = 1 << 10, 1 << 20
STARTED = time.monotonic()
ROLE = "main"


def wait_line(stream: IO[Any], timeout: float, waiting_for: str) -> str:
    """The next line from `stream` (linepipe's bounded read), its errors naming what was awaited."""
    try:
        return read_line(stream, timeout)
    except TimeoutError as e:
        raise TimeoutError(f"no line from {waiting_for} within {timeout:.0f} s") from e
    except EOFError as e:
        raise EOFError(f"{waiting_for} ended") from e


def progress(text: str) -> None:
    """A progress line on stderr (B's stdout is its answers to A), with the process and the seconds since it began."""
    print(f"[{ROLE} {time.monotonic() - STARTED:6.1f} s] {text}", file=sys.stderr, flush=True)


def step(text: str, bound: float = STEP_TIMEOUT) -> None:
    """Starts a step: says so and arms the watchdog, which past `bound` seconds prints this step and every
    thread's stack, then exits (a blocking call in C included)."""
    progress(f"{text} (at most {bound:.0f} s)")
    faulthandler.cancel_dump_traceback_later()
    faulthandler.dump_traceback_later(bound, exit=True)


def pattern(torch: Any, start: int, count: int, seed: int) -> Any:
    """Bytes `start .. start + count` of the pattern of tensor `seed`, made on the GPU (uint8)."""
    i = torch.arange(start, start + count, dtype=torch.int64, device="cuda")
    return ((i * 2654435761 + seed * 40503) >> 7).remainder(251).to(torch.uint8)


def fill(torch: Any, tensor: Any, seed: int) -> None:
    for start in range(0, tensor.numel(), CHUNK):
        count = min(CHUNK, tensor.numel() - start)
        tensor[start:start + count].copy_(pattern(torch, start, count, seed))


def wrong_bytes(torch: Any, tensor: Any, seed: int) -> int:
    wrong = 0
    for start in range(0, tensor.numel(), CHUNK):
        count = min(CHUNK, tensor.numel() - start)
        wrong += int((tensor[start:start + count] != pattern(torch, start, count, seed)).sum())
    return wrong


def driver() -> Any:
    """cuda-python's driver module (cuda-bindings 12.x or 13.x, or the older cuda.cuda)."""
    try:
        from cuda.bindings import driver as cu  # type: ignore[import-not-found]
    except ImportError:
        from cuda import cuda as cu  # type: ignore[import-not-found,no-redef]
    return cu


def allocations_over(cu: Any, ptr: int, nbytes: int) -> int:
    """How many allocations (cuMemGetAddressRange ranges) the `nbytes` at `ptr` lie over."""
    count, at, end = 0, ptr, ptr + nbytes
    while at < end:
        err, base, size = cu.cuMemGetAddressRange(at)
        if int(err) != 0:
            raise RuntimeError(f"cuMemGetAddressRange({at:#x}) failed: {err}")
        count += 1
        at = int(base) + int(size)
    return count


def reader(sock: str) -> int:
    """Process B: open each name A announces, check its bytes, answer on stdout; check again when asked."""
    step("B: importing torch and gpu_ipc, setting CUDA up")
    import torch

    import gpu_ipc

    torch.zeros(1, device="cuda")
    torch.cuda.synchronize()
    faulthandler.cancel_dump_traceback_later()
    say("READY")
    progress("B: ready; waiting for A's requests")
    rows: list[tuple[str, int, Any, Any]] = []
    while True:
        line = wait_line(sys.stdin, 3600, "A")  # A bounds its own steps; EOF when A ends
        if line.startswith("OPEN "):
            _, name, seed = line.split()
            step(f"B: opening and checking {name}")
            started = time.perf_counter()
            try:
                view = gpu_ipc.open(sock, name, wait_for_owner=10.0)
                tensor = torch.from_dlpack(view)
                wrong = wrong_bytes(torch, tensor, int(seed))
                torch.cuda.synchronize()
            except Exception as e:  # noqa: BLE001 - reported to the owner, who fails the row
                say(f"ERROR {name} {type(e).__name__}: {e}".replace("\n", " "))
                continue
            faulthandler.cancel_dump_traceback_later()
            ms = (time.perf_counter() - started) * 1e3
            rows.append((name, int(seed), view, tensor))
            say(f"CHECKED {name} {tensor.numel()} {wrong} {ms:.2f}")
        elif line == "RECHECK":
            step(f"B: checking the {len(rows)} views again")
            for name, seed, _, tensor in rows:
                wrong = wrong_bytes(torch, tensor, seed)
                torch.cuda.synchronize()
                say(f"RECHECKED {name} {tensor.numel()} {wrong}")
            faulthandler.cancel_dump_traceback_later()
            say("DONE")
        elif line == "BYE":
            return 0
        else:
            say(f"UNKNOWN {line}")
            return 1


def owner(max_mib: int, json_path: str | None, line_timeout: float) -> int:
    """Process A: make, share and have B check the tensors; print the table and the verdict."""
    step("A: importing torch, gpu_ipc and cuda-python, setting CUDA up")
    import torch

    import gpu_ipc

    conf = os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "")
    if "expandable_segments:True" not in conf:
        say(f"FAIL: PYTORCH_CUDA_ALLOC_CONF is {conf!r}, not expandable_segments:True")
        return 1
    cu = driver()
    torch.cuda.init()
    torch.zeros(1, device="cuda")
    sock = os.path.join(tempfile.mkdtemp(prefix="gpu-ipc-expandable-"), "pool.sock")
    sizes = [4 * KIB, 64 * KIB, 1 * MIB, 16 * MIB, 64 * MIB, 256 * MIB, 1024 * MIB]
    sizes = [s for s in sizes if s <= max_mib * MIB] or [4 * KIB]
    kept: list[Any] = []  # fillers and shared tensors, alive until the end
    rows: list[dict[str, Any]] = []

    def add(kind: str, tensor: Any) -> None:
        seed = len(rows) + 1
        fill(torch, tensor, seed)
        torch.cuda.synchronize()
        n = allocations_over(cu, tensor.data_ptr(), tensor.numel())
        rows.append({"name": f"t{seed}", "kind": kind, "bytes": tensor.numel(), "seed": seed, "allocations": n,
                     "tensor": tensor})

    step(f"A: making {len(sizes)} tensors of {sizes[0]} to {sizes[-1]} bytes, filled with their patterns")
    for size in sizes:
        add("size", torch.empty(size, dtype=torch.uint8, device="cuda"))
    # Tensors that straddle a boundary between PyTorch's allocations: one of the small pool (blocks up to 1 MiB, in
    # 2 MiB allocations) and one of the large pool (20 MiB allocations), found by allocating one after another.
    step("A: looking for tensors that straddle PyTorch's allocations (64 tries each)")
    for kind, size in (("straddle-small", 768 * KIB), ("straddle-large", 12 * MIB)):
        for _ in range(64):
            t = torch.empty(size, dtype=torch.uint8, device="cuda")
            if allocations_over(cu, t.data_ptr(), size) > 1:
                add(kind, t)
                break
            kept.append(t)
    failures: list[str] = []
    step(f"A: sharing {len(rows)} tensors at {sock} (vmm)")
    for row in rows:
        progress(f"A: share {row['name']}: {row['bytes']} bytes over {row['allocations']} allocation(s)")
        try:
            row["shared"] = gpu_ipc.share(row["tensor"], row["name"], sock, backend="vmm")
        except Exception as e:  # noqa: BLE001 - the row fails, with the reason
            failures.append(f"{row['name']} ({row['bytes']} bytes over {row['allocations']} allocations) not shared: "
                            f"{type(e).__name__}: {e}")

    faulthandler.cancel_dump_traceback_later()  # from here on A waits on B with bounded reads
    progress("A: starting B (the reader process)")
    b = subprocess.Popen([sys.executable, "-u", __file__, "reader", sock], stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, text=True)
    assert b.stdin is not None and b.stdout is not None
    progress(f"A: B is pid {b.pid}")

    def tell(line: str) -> None:
        assert b.stdin is not None
        b.stdin.write(line + "\n")
        b.stdin.flush()

    try:
        ready = wait_line(b.stdout, line_timeout, "B starting (importing torch, setting CUDA up)")
        if ready != "READY":
            raise EOFError(f"B said {ready!r} instead of READY")
        for row in [r for r in rows if "shared" in r]:
            progress(f"A: asking B to open and check {row['name']}")
            tell(f"OPEN {row['name']} {row['seed']}")
            answer = wait_line(b.stdout, line_timeout, f"B opening and checking {row['name']}").split()
            if answer[:1] != ["CHECKED"] or answer[1] != row["name"]:
                failures.append(f"{row['name']}: {' '.join(answer)}")
                progress(f"A: {row['name']}: {' '.join(answer)}")
                continue
            row["seen_bytes"], row["wrong"], row["open_check_ms"] = int(answer[2]), int(answer[3]), float(answer[4])
            progress(f"A: {row['name']}: B saw {answer[2]} bytes, {answer[3]} wrong, in {answer[4]} ms")
        # A lets go of everything; what B views must stay as it was.
        step("A: freeing every buffer and tensor, writing new tensors over the memory")
        for row in rows:
            if "shared" in row:
                row.pop("shared").free()
            row.pop("tensor", None)
        kept.clear()
        torch.cuda.empty_cache()
        fresh = [torch.full((row["bytes"],), 0xA5, dtype=torch.uint8, device="cuda") for row in rows]
        torch.cuda.synchronize()
        faulthandler.cancel_dump_traceback_later()
        progress("A: asking B to check every view again")
        tell("RECHECK")
        while True:
            answer = wait_line(b.stdout, line_timeout, "B checking its views again").split()
            if answer == ["DONE"]:
                break
            name = answer[1]
            for row in rows:
                if row["name"] == name:
                    row["wrong_after_free"] = int(answer[3])
        del fresh
        tell("BYE")
        if b.wait(timeout=line_timeout) != 0:
            failures.append("B did not exit cleanly")
    except (TimeoutError, EOFError, subprocess.TimeoutExpired) as e:
        failures.append(f"stopped waiting: {e}")
        progress(f"A: stopped waiting: {e}")
    finally:
        if b.poll() is None:
            b.kill()
            b.wait()

    say(f"{'name':<6} {'kind':<15} {'bytes':>12} {'allocations':>11} {'wrong':>7} {'wrong after free':>16} "
        f"{'open+check ms':>13}")
    for row in rows:
        say(f"{row['name']:<6} {row['kind']:<15} {row['bytes']:>12} {row['allocations']:>11} "
            f"{row.get('wrong', '-')!s:>7} {row.get('wrong_after_free', '-')!s:>16} "
            f"{row.get('open_check_ms', float('nan')):>13.2f}")
        if row.get("seen_bytes") != row["bytes"]:
            failures.append(f"{row['name']}: B saw {row.get('seen_bytes')} bytes of {row['bytes']}")
        if row.get("wrong") != 0 or row.get("wrong_after_free") != 0:
            failures.append(f"{row['name']}: wrong bytes {row.get('wrong')}, after free {row.get('wrong_after_free')}")
    largest = max((r for r in rows if r["kind"] == "size"), key=lambda r: r["bytes"])
    if largest["bytes"] > 20 * MIB and largest["allocations"] < 2:
        failures.append(f"the {largest['bytes']}-byte tensor lies in one allocation: expandable segments are off?")
    for kind in ("straddle-small", "straddle-large"):
        if not any(r["kind"] == kind for r in rows):
            say(f"  info no {kind} tensor found within 64 tries")
    if not any(r["allocations"] > 1 and r["bytes"] <= 20 * MIB for r in rows):
        failures.append("no tensor of 20 MiB or less straddles a boundary between allocations")
    for failure in failures:
        say(f"  FAIL {failure}")
    verdict = "PASS" if not failures else "FAIL"
    if json_path:
        with open(json_path, "w", encoding="utf-8") as f:
            plain = [{k: v for k, v in row.items() if k not in ("tensor", "shared")} for row in rows]
            json.dump({"verdict": verdict, "rows": plain, "failures": failures,
                       "device": torch.cuda.get_device_name(), "torch": torch.__version__}, f, indent=1)
    say(f"expandable: {verdict}" + ("" if not failures else f" ({len(failures)} failure(s))"))
    return 0 if not failures else 1


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("role", nargs="?", default="main", choices=["main", "owner", "reader"])
    parser.add_argument("arg", nargs="?", help="the socket (reader)")
    parser.add_argument("--max-mib", type=int, default=1024, help="the largest tensor, in MiB (default 1024)")
    parser.add_argument("--json", help="also write the rows to this file")
    parser.add_argument("--line-timeout", type=float, default=LINE_TIMEOUT,
                        help=f"seconds A waits for each answer of B (default {LINE_TIMEOUT:.0f})")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds the whole run may take (default 600)")
    args = parser.parse_args()
    global ROLE  # noqa: PLW0603 - set once, for the progress lines
    if args.role == "reader":
        ROLE = "B"
        return reader(args.arg)
    if args.role == "owner":
        ROLE = "A"
        return owner(args.max_mib, args.json, args.line_timeout)
    env = dict(os.environ)
    env["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"
    command = [sys.executable, "-u", __file__, "owner", "--max-mib", str(args.max_mib),
               "--line-timeout", str(args.line_timeout)]
    if args.json:
        command += ["--json", args.json]
    progress(f"starting A (the owner) with PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True, at most "
             f"{args.timeout:.0f} s")
    a = subprocess.Popen(command, env=env, start_new_session=True)  # its own group: B goes with it on a timeout
    try:
        rc = a.wait(timeout=args.timeout)
        progress(f"A exited with status {rc}" + ("" if rc in (0, 1) else " (its watchdog or a crash: see above)"))
        return rc
    except subprocess.TimeoutExpired:
        os.killpg(a.pid, signal.SIGKILL)
        a.wait()
        say(f"expandable: FAIL (the run passed --timeout {args.timeout:.0f} s and was killed; A's last step line "
            "above says where it was)")
        return 1


if __name__ == "__main__":
    sys.exit(main())
