"""gpu_ipc.weights on a GPU with PyTorch: a state_dict published by one process, read by another, for both backends.

Run on the GPU machine with the wheel installed (scripts/python-gpu.sh's venv, or any python3 that imports torch and
gpu_ipc):
    python scripts/python_gpu_weights.py [--backend legacy|vmm|both] [--mib N] [--json OUT.json]
For each backend (default both), an owner process A (this one) and a reader process B (this script, role `reader`):
  1. A publishes a state_dict of 24 tensors (bf16, fp16, fp32 matrices and vectors, an int64 scalar; about N MiB,
     default 64) whose every element is a pattern of (generation, tensor index, element index), with checksums.
  2. B opens it (cold: attach, one import, manifest checked) and compares every byte of every tensor, read in place
     (torch.from_dlpack of r.tensors()), with the pattern it computes itself: `wrong` counts the differing bytes;
     r.verify() checks the manifest's checksums.
     B also cuts every tensor from one import of the arena (r.tensors(torch)): the same addresses, shapes, strides,
     dtypes and bytes as the per-tensor views; and with CuPy installed, r.tensors("cupy") the same addresses.
  3. A updates to generation 2 while B holds 1, from sources of every kind update() takes: contiguous CUDA tensors
     (the gather kernel), non-contiguous ones (copied contiguous first), CPU tensors (written from the host). B's
     tensors of generation 1 must be unchanged; then B waits for 2, refreshes (timed), checks every byte again.
  4. B loads generation 2 into its own zero tensors with load_into (the gather kernel, timed): every byte right,
     and every data_ptr unchanged.
  5. A publishes generation 3 by writing the staged arena in place (stage(torch) / commit(); the sources of
     floating-point tensors require grad, as a trainer's parameters do); B switches and checks.
  6. A refuses an update (and a bind) with a tensor of the wrong shape, then dtype (ArgumentError naming it, nothing
     published), a bind of a tensor that is not contiguous; then publishes generation 5 from sources bound once
     (bind(), update(bound) making 4, the tensors rewritten in place, update(bound) again) and 6 by update(); B
     checks every byte of 5 and 6, in the arena and loaded into its own tensors through targets bound once
     (Reader.bind(), load_into(bound): every byte right, every data_ptr unchanged; a bind of a wrong shape refused).
  7. A closes; B's wait_for raises OwnerGone within a second, and its held tensors still read right.
Prints one `PASS` or `FAIL` line per backend (with the timings) and a last `weights: PASS|FAIL` line; exit status 0
only if all pass. With --json, writes the rows there.
"""

from __future__ import annotations

import argparse
import json
import os
import select
import subprocess
import sys
import tempfile
import time
from typing import IO, Any

LINE_TIMEOUT = 120.0
TENSORS = 24
# Generations A publishes after checking that wrong tensors are refused: 5 from sources bound once (bind(), then
# update(bound) twice, the tensors rewritten in place between: the first makes generation 4, which B skips), 6 by
# update() of a state_dict.
FORCED = {5: "bound", 6: "update"}


def read_line(stream: IO[str], timeout: float = LINE_TIMEOUT) -> str:
    ready, _, _ = select.select([stream], [], [], timeout)
    if not ready:
        raise TimeoutError(f"no line within {timeout} s")
    line = stream.readline()
    if not line:
        raise EOFError("the other process ended")
    return line.strip()


def say(text: str) -> None:
    print(text, flush=True)


def layout(mib: int) -> list[tuple[str, str, tuple[int, ...]]]:
    """24 tensors: per layer a bf16 matrix, an fp16 matrix, an fp32 vector; an int64 scalar last."""
    per_layer = max(1, mib * (1 << 20) // 7 // 2 // 2)  # bytes of each 2-byte matrix
    side = max(16, int(per_layer**0.5) // 16 * 16)
    out: list[tuple[str, str, tuple[int, ...]]] = []
    for layer in range(7):
        out.append((f"layers.{layer}.attn.weight", "bfloat16", (side, side)))
        out.append((f"layers.{layer}.mlp.weight", "float16", (side, side // 2)))
        out.append((f"layers.{layer}.norm.weight", "float32", (side,)))
    out.append(("embed.weight", "bfloat16", (side // 2, side)))
    out.append(("lm_head.bias", "float32", (1000,)))
    out.append(("step", "int64", ()))
    assert len(out) == TENSORS
    return out


def expected(torch: Any, generation: int, index: int, dtype: str, shape: tuple[int, ...], device: str) -> Any:
    """The pattern: small integers (exact in bf16 and fp16) from (generation, tensor index, element index)."""
    n = 1
    for d in shape:
        n *= d
    values = (torch.arange(n, device=device, dtype=torch.int64) * 7 + generation * 131 + index * 17) % 251
    return values.to(getattr(torch, dtype)).reshape(shape)


def state_dict(torch: Any, generation: int, mib: int) -> dict[str, Any]:
    return {
        name: expected(torch, generation, i, dtype, shape, "cuda") for i, (name, dtype, shape) in enumerate(layout(mib))
    }


def mixed_sources(torch: Any, sd: dict[str, Any]) -> dict[str, Any]:
    """The same values from every kind of source update() takes: every third matrix non-contiguous (a transposed
    buffer's transpose), every fifth tensor on the CPU, the others as they are (contiguous, on the GPU)."""
    out = {}
    for i, (name, t) in enumerate(sd.items()):
        if i % 3 == 0 and t.dim() == 2:
            strided = torch.empty((t.shape[1], t.shape[0]), dtype=t.dtype, device=t.device).t()
            strided.copy_(t)
            assert not strided.is_contiguous()
            out[name] = strided
        elif i % 5 == 0:
            out[name] = t.cpu()
        else:
            out[name] = t
    return out


def wrong_bytes(torch: Any, tensors: dict[str, Any], generation: int, mib: int) -> int:
    """Bytes of `tensors` (name -> torch tensor) that differ from generation `generation`'s pattern."""
    wrong = 0
    for i, (name, dtype, shape) in enumerate(layout(mib)):
        got = tensors[name]
        want = expected(torch, generation, i, dtype, shape, "cuda")
        if tuple(got.shape) != shape or str(got.dtype) != f"torch.{dtype}":
            wrong += want.numel() * want.element_size()
            continue
        a = got.reshape(-1).view(torch.uint8)
        b = want.reshape(-1).view(torch.uint8)
        wrong += int((a != b).sum().item())
    return wrong


def reader(sock: str, mib: int) -> int:
    """Process B: reads, checks and times; one line per step on stdout, waits for A's word on stdin."""
    import torch

    import gpu_ipc
    import gpu_ipc.weights

    torch.cuda.init()
    started = time.perf_counter()
    r = gpu_ipc.weights.open(sock, "model", timeout=30)
    tensors = {k: torch.from_dlpack(v) for k, v in r.tensors().items()}
    torch.cuda.synchronize()
    cold_ms = (time.perf_counter() - started) * 1e3
    say(f"OPENED generation={r.generation} wrong={wrong_bytes(torch, tensors, 1, mib)} verified={r.verify()} "
        f"cold_ms={cold_ms:.2f}")
    started = time.perf_counter()
    cut = r.tensors(torch)
    cut_ms = (time.perf_counter() - started) * 1e3
    same = all(
        cut[k].data_ptr() == t.data_ptr() and cut[k].shape == t.shape and cut[k].dtype == t.dtype
        and cut[k].stride() == t.stride()
        for k, t in tensors.items()
    )
    try:
        import cupy  # type: ignore[import-not-found]

        arrays = r.tensors(cupy)
        cupy_same = str(int(all(arrays[k].data.ptr == t.data_ptr() for k, t in tensors.items())))
    except ImportError:
        cupy_same = "absent"
    say(f"CUT wrong={wrong_bytes(torch, cut, 1, mib)} same={int(same)} cupy_same={cupy_same} cut_ms={cut_ms:.3f}")
    del cut
    read_line(sys.stdin)  # A published 2
    held_wrong = wrong_bytes(torch, tensors, 1, mib)
    r.wait_for(2, timeout=30)
    started = time.perf_counter()
    r.refresh()
    new = r.tensors(torch)
    torch.cuda.synchronize()
    refresh_ms = (time.perf_counter() - started) * 1e3
    say(f"REFRESHED generation={r.generation} held_wrong={held_wrong} wrong={wrong_bytes(torch, new, 2, mib)} "
        f"refresh_ms={refresh_ms:.2f}")
    del tensors
    target = {name: torch.zeros(shape, dtype=getattr(torch, dtype), device="cuda") for name, dtype, shape in layout(mib)}
    pointers = {k: v.data_ptr() for k, v in target.items()}
    torch.cuda.synchronize()
    started = time.perf_counter()
    copied = r.load_into(target)
    torch.cuda.synchronize()
    load_ms = (time.perf_counter() - started) * 1e3
    same = int(all(target[k].data_ptr() == p for k, p in pointers.items()))
    nbytes = sum(v.numel() * v.element_size() for v in target.values())
    say(f"LOADED copied={copied} wrong={wrong_bytes(torch, target, 2, mib)} ptrs_same={same} load_ms={load_ms:.3f} "
        f"gbps={nbytes / (load_ms / 1e3) / 1e9 if load_ms > 0 else 0:.1f}")
    read_line(sys.stdin)  # A published 3 in place
    r.wait_for(3, timeout=30)
    r.refresh()
    third = r.tensors(torch)
    say(f"STAGED generation={r.generation} wrong={wrong_bytes(torch, third, 3, mib)} verified={r.verify()}")
    bound = r.bind(target)  # the same tensors, read once: each generation below is loaded into them through it
    wrong_shape = dict(target)
    wrong_shape["layers.3.attn.weight"] = wrong_shape["layers.3.attn.weight"][:-1]
    try:
        r.bind(wrong_shape)
        bind_refused = 0
    except gpu_ipc.ArgumentError as e:
        bind_refused = int("layers.3.attn.weight" in str(e))
    for generation in FORCED:  # A published it one way or the other
        read_line(sys.stdin)
        r.wait_for(generation, timeout=30)
        r.refresh()
        third = r.tensors(torch)
        copied = r.load_into(bound)
        torch.cuda.synchronize()
        same = int(all(target[k].data_ptr() == p for k, p in pointers.items()))
        say(f"FORCED generation={r.generation} wrong={wrong_bytes(torch, third, generation, mib)} verified={r.verify()}"
            f" bound_copied={copied} bound_wrong={wrong_bytes(torch, target, generation, mib)} bound_ptrs_same={same}"
            f" bind_refused={bind_refused}")
    read_line(sys.stdin)  # A closes now
    t0 = time.monotonic()
    gone = "no"
    try:
        r.wait_for(max(FORCED) + 1, timeout=5)
    except gpu_ipc.OwnerGone:
        gone = f"{(time.monotonic() - t0) * 1e3:.1f}ms"
    say(f"GONE seen={gone} held_wrong={wrong_bytes(torch, third, max(FORCED), mib)}")
    r.close()
    return 0


def refused(call: Any, arg: Any, says: str, what: str) -> str | None:
    """``call(arg)`` must raise ArgumentError whose message contains ``says``; else what went otherwise."""
    import gpu_ipc

    try:
        call(arg)
    except gpu_ipc.ArgumentError as e:
        return None if says in str(e) else f"{what}: the error does not say {says!r}: {e}"
    return f"{what}: taken"


def refusals(torch: Any, pub: Any, mib: int) -> list[str]:
    """update() and bind() from a state_dict with one tensor of the wrong shape, then of the wrong dtype: each must
    raise ArgumentError naming the tensor, and update() publish nothing; bind() of a tensor that is not contiguous
    must say so. Returns what went otherwise."""
    problems = []
    before = pub.generation
    name = "layers.3.attn.weight"
    for what in ("shape", "dtype"):
        sd = state_dict(torch, 9, mib)
        sd[name] = sd[name][:-1] if what == "shape" else sd[name].float()
        problems.append(refused(pub.update, sd, name, f"update() of a tensor of the wrong {what}"))
        if pub.generation != before:
            problems.append(f"a refused update (wrong {what}) published generation {pub.generation}")
        problems.append(refused(pub.bind, sd, name, f"bind() of a tensor of the wrong {what}"))
    sd = state_dict(torch, 9, mib)
    sd[name] = sd[name].t().contiguous().t()  # the right shape and dtype, not contiguous
    problems.append(refused(pub.bind, sd, "contiguous", "bind() of a tensor that is not contiguous"))
    return [p for p in problems if p]


def field(line: str, key: str) -> str:
    for kv in line.split():
        if kv.startswith(key + "="):
            return kv.split("=", 1)[1]
    raise KeyError(f"{key} not in {line!r}")


def run_backend(backend: str, mib: int) -> dict[str, Any]:
    import torch

    import gpu_ipc.weights

    row: dict[str, Any] = {"backend": backend, "mib": mib, "tensors": TENSORS}
    sock = os.path.join(tempfile.mkdtemp(prefix="gw-"), "w.sock")
    started = time.perf_counter()
    pub = gpu_ipc.weights.publish(state_dict(torch, 1, mib), "model", socket=sock, backend=backend, checksums=True)
    row["publish_ms"] = round((time.perf_counter() - started) * 1e3, 2)
    child = subprocess.Popen(
        [sys.executable, __file__, "reader", sock, str(mib)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    assert child.stdin is not None and child.stdout is not None
    problems: list[str] = []
    try:
        opened = read_line(child.stdout)
        row["cold_open_ms"] = float(field(opened, "cold_ms"))
        if field(opened, "wrong") != "0" or field(opened, "verified") != str(TENSORS):
            problems.append(f"generation 1: {opened}")
        cut = read_line(child.stdout)
        row["cut_ms"], row["cupy_same"] = float(field(cut, "cut_ms")), field(cut, "cupy_same")
        if (field(cut, "wrong"), field(cut, "same")) != ("0", "1") or field(cut, "cupy_same") == "0":
            problems.append(f"tensors(torch) / tensors('cupy'): {cut}")
        sources = mixed_sources(torch, state_dict(torch, 2, mib))
        torch.cuda.synchronize()
        started = time.perf_counter()
        pub.update(sources)
        row["update_ms"] = round((time.perf_counter() - started) * 1e3, 2)
        if pub.readers() != [(child.pid, 1)]:
            problems.append(f"readers() while B holds 1: {pub.readers()}")
        child.stdin.write("published 2\n")
        child.stdin.flush()
        refreshed = read_line(child.stdout)
        row["refresh_ms"] = float(field(refreshed, "refresh_ms"))
        if (field(refreshed, "held_wrong"), field(refreshed, "wrong")) != ("0", "0"):
            problems.append(f"generation 2: {refreshed}")
        loaded = read_line(child.stdout)
        row["load_into_ms"], row["load_into_gbps"] = float(field(loaded, "load_ms")), float(field(loaded, "gbps"))
        if (field(loaded, "wrong"), field(loaded, "ptrs_same"), field(loaded, "copied")) != ("0", "1", str(TENSORS)):
            problems.append(f"load_into: {loaded}")
        staged = pub.stage(torch)
        for i, (name, dtype, shape) in enumerate(layout(mib)):
            source = expected(torch, 3, i, dtype, shape, "cuda")
            if source.is_floating_point():  # as a trainer's parameters: the staged views take an in-place copy
                source = source.clone().requires_grad_()
            staged[name].copy_(source)
        pub.commit()
        del staged  # (stage views keep the owner alive: close() below must end it)
        child.stdin.write("published 3\n")
        child.stdin.flush()
        third = read_line(child.stdout)
        if (field(third, "wrong"), field(third, "verified")) != ("0", str(TENSORS)):
            problems.append(f"generation 3 (stage/commit): {third}")
        for generation, mode in FORCED.items():
            refused = refusals(torch, pub, mib)
            if refused:
                problems.append(f"before generation {generation}: {refused}")
            if mode == "bound":
                # The trainer's case: parameters written in place between updates. Bound while they hold another
                # generation's values, published once so (a generation the reader skips), then rewritten in place
                # to this generation's and published again: update(bound) reads them as they are then.
                params = state_dict(torch, 8, mib)
                bound = pub.bind(params)
                pub.update(bound)
                for t, new in zip(params.values(), state_dict(torch, generation, mib).values()):
                    t.copy_(new)
                if len(bound) != TENSORS or pub.update(bound) != generation:
                    problems.append(f"bind: {len(bound)} tensors bound, generation {pub.generation} published")
            else:
                pub.update(state_dict(torch, generation, mib))
            child.stdin.write(f"published {generation}\n")
            child.stdin.flush()
            forced = read_line(child.stdout)
            if (field(forced, "generation"), field(forced, "wrong"), field(forced, "verified")) != (
                str(generation), "0", str(TENSORS)
            ):
                problems.append(f"generation {generation} ({mode}): {forced}")
            via = tuple(field(forced, k) for k in ("bound_copied", "bound_wrong", "bound_ptrs_same", "bind_refused"))
            if via != (str(TENSORS), "0", "1", "1"):
                problems.append(f"generation {generation}, B's load_into(bound): {forced}")
        child.stdin.write("closing\n")
        child.stdin.flush()
        pub.close()
        gone = read_line(child.stdout)
        row["owner_gone_seen"] = field(gone, "seen")
        if field(gone, "seen") == "no" or field(gone, "held_wrong") != "0":
            problems.append(f"owner gone: {gone}")
        if child.wait(timeout=60) != 0:
            problems.append(f"the reader exited with {child.returncode}")
    except Exception as e:  # noqa: BLE001 - reported as the row's failure
        problems.append(f"{type(e).__name__}: {e}")
    finally:
        child.kill()
        pub.close()
    row["ok"] = not problems
    row["problems"] = problems
    return row


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "reader":
        return reader(sys.argv[2], int(sys.argv[3]))
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--backend", choices=["legacy", "vmm", "both"], default="both")
    parser.add_argument("--mib", type=int, default=64)
    parser.add_argument("--json", help="write the rows here")
    args = parser.parse_args()
    backends = ["legacy", "vmm"] if args.backend == "both" else [args.backend]
    rows = [run_backend(b, args.mib) for b in backends]
    for row in rows:
        timings = " ".join(f"{k}={row[k]}" for k in row if k.endswith(("_ms", "_gbps", "_seen")))
        say(f"{'PASS' if row['ok'] else 'FAIL'} {row['backend']}: {timings} {'; '.join(row['problems'])}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=2)
    ok = all(row["ok"] for row in rows)
    say(f"weights: {'PASS' if ok else 'FAIL'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
