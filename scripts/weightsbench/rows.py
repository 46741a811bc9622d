"""The benchmark's parts, each writing its rows as it finishes: cold open and generation switch against
torch.multiprocessing and a bucket, mixed generations, the owner killed."""

from __future__ import annotations

import argparse
import json
import os
import pickle
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from multiprocessing.connection import Connection, Listener
from typing import Any

from weightsbench.children import GIB, LINE_TIMEOUT, MIB, SCRIPT, Reader, done_with, read_line, say
from weightsbench.shapes import checksums, nbytes_of, random_state_dict, shapes_of


class Run:
    """One run: its options, rows (also appended to OUT/weights.jsonl as they come), failed checks, a temporary
    folder for sockets."""

    def __init__(self, out: str, args: argparse.Namespace) -> None:
        self.out = out
        self.args = args
        self.rows: list[dict[str, Any]] = []
        self.failures: list[str] = []
        self.jsonl = open(os.path.join(out, "weights.jsonl"), "a")
        self.tmp = tempfile.mkdtemp(prefix="gpu-ipc-weights-bench-")
        self.started = time.monotonic()

    def seconds(self) -> float:
        """Seconds since the run started."""
        return time.monotonic() - self.started

    def row(self, **row: Any) -> None:
        self.rows.append(row)
        self.jsonl.write(json.dumps(row) + "\n")
        self.jsonl.flush()
        say("  " + json.dumps(row))

    def fail(self, what: str) -> None:
        self.failures.append(what)
        say(f"  FAIL {what}")

    def env(self, backend: str) -> dict[str, str]:
        env = dict(os.environ)
        env["WEIGHTS_BENCH_BACKEND"] = backend  # the child processes' backend (open() takes it explicitly)
        return env


def accept_within(listener: Listener, seconds: float) -> Connection:
    """The reader's connection, or TimeoutError after `seconds` (a reader that died never connects)."""
    sock = listener._listener._socket  # noqa: SLF001 - multiprocessing's Listener has no accept timeout
    ready, _, _ = select.select([sock], [], [], seconds)
    if not ready:
        raise TimeoutError(f"no reader connected to {listener.address} within {seconds} s")
    return listener.accept()


def free_bytes() -> int:
    """The GPU's free memory, once torch gave back what it caches and what it kept for CUDA IPC consumers that have
    gone (torch.multiprocessing keeps a shared tensor's block until `ipc_collect()` sees the consumer let go)."""
    import gc

    import torch

    gc.collect()
    torch.cuda.synchronize()
    torch.cuda.ipc_collect()
    torch.cuda.empty_cache()
    return int(torch.cuda.mem_get_info()[0])


def part_cold_and_switch(run: Run, backend: str, set_name: str) -> None:
    """One state_dict shape on one backend: gpu-ipc's cold open (every tensor cut from one import, and one import
    per tensor for comparison) and generation switch, torch's copies of the same bytes, torch.multiprocessing's
    per-tensor handles and a bucket; then the GPU's free memory must be back where it started."""
    shapes = shapes_of(set_name, run.args.quick)
    say(f"== {set_name} ({len(shapes)} tensors), backend {backend}")
    free_start = free_bytes()
    sd = random_state_dict(shapes, seed=1)
    sums = checksums(sd)
    try:
        new_sums = gpu_ipc_rows(run, backend, set_name, sd, sums)
        torch_mp_row(run, backend, set_name, sd, new_sums)
        bucket_row(run, backend, set_name, sd, new_sums)
    finally:
        del sd
        free_end = free_bytes()
        back = free_end >= free_start - 512 * MIB
        run.row(part="memory", set=set_name, backend=backend, free_start_gib=round(free_start / GIB, 2),
                free_end_gib=round(free_end / GIB, 2), back=back)
        if not back:
            run.fail(f"{set_name} {backend}: the GPU's free memory is {free_end / GIB:.1f} GiB after the part, "
                     f"{free_start / GIB:.1f} GiB before: memory not given back")


def median_sample(samples: list[dict[str, Any]]) -> dict[str, Any]:
    """The sample whose `seconds` is the median (the lower middle of an even count): its parts stay consistent."""
    ordered = sorted(samples, key=lambda a: a["seconds"])
    return ordered[(len(ordered) - 1) // 2]


def cold_repeats(run: Run) -> int:
    return max(1, int(getattr(run.args, "cold_repeats", 1)))


def cold_gpu_ipc(run: Run, backend: str, sock: str, set_name: str, per_tensor: bool) -> tuple[Reader, dict[str, Any]]:
    """A fresh reader process opens the set; returns it (still holding) and its answer."""
    reader = Reader(run.env(backend))
    try:
        return reader, reader.ask(op="open-gpu-ipc", socket=sock, name=set_name, per_tensor=per_tensor)
    except BaseException:
        reader.close()
        raise


def gpu_ipc_rows(run: Run, backend: str, set_name: str, sd: dict[str, Any], sums: dict[str, int]) -> dict[str, int]:
    """gpu-ipc: publish, a cold reader (cut from one import), another (one import per tensor), two generation
    switches against torch's copies of the same bytes. Leaves `sd` holding generation 2's bytes, whose checksums
    it returns."""
    import torch

    import gpu_ipc

    total = nbytes_of(sd)
    sock = os.path.join(run.tmp, f"{set_name}-{backend}.sock")
    t0 = time.perf_counter()
    pub = gpu_ipc.weights.publish(sd, set_name, socket=sock, backend=backend, keep=2)
    torch.cuda.synchronize()
    publish_s = time.perf_counter() - t0
    try:
        reader, per_tensor = cold_gpu_ipc(run, backend, sock, set_name, per_tensor=True)
        check = reader.ask(op="check", sums=sums)
        reader.close()
        run.row(part="cold", set=set_name, backend=backend, method="gpu-ipc-per-tensor", tensors=len(sd),
                bytes=total, seconds=per_tensor["seconds"], open_seconds=per_tensor["open_seconds"],
                tensors_seconds=per_tensor["tensors_seconds"], wrong=check["wrong"] + check["missing"])
        # `--cold-repeats` fresh readers, one sample each (the machine's noise moves one sample by a third): the row
        # gives the median sample and every sample's total; the last reader is kept for the switch below.
        samples = []
        for _ in range(cold_repeats(run) - 1):
            extra, answer = cold_gpu_ipc(run, backend, sock, set_name, per_tensor=False)
            extra.close()
            samples.append(answer)
        reader, got = cold_gpu_ipc(run, backend, sock, set_name, per_tensor=False)
        samples.append(got)
        mid = median_sample(samples)
        try:
            check = reader.ask(op="check", sums=sums)
            run.row(part="cold", set=set_name, backend=backend, method="gpu-ipc", tensors=len(sd), bytes=total,
                    seconds=mid["seconds"], open_seconds=mid["open_seconds"], tensors_seconds=mid["tensors_seconds"],
                    samples=[a["seconds"] for a in samples], publish_seconds=publish_s,
                    wrong=check["wrong"] + check["missing"])
            if check["wrong"] or check["missing"]:
                run.fail(f"gpu-ipc {set_name} {backend}: {check['wrong']} wrong, {check['missing']} missing tensors")
            # The switch: update() every tensor with new bytes (generation 2, while the reader holds 1: the owner
            # may need a second arena), the reader moves to 2, then update() again (generation 3: into the arena
            # nobody holds any more); the old bytes come back as generation 3, so `sums` checks it. Then generation
            # 4 (the new bytes again), the same update timed in its two parts: the CPU queueing every copy (what
            # update() does before commit), then commit (which waits for the GPU). Then three updates of each kind,
            # interleaved so that both meet the arenas in the same state (at 7d9bd75 the three update() rows ran
            # first and took 31.6 ms at best against 21.9 for the split one; why was not measured), each read back
            # by the reader: update() of the state_dict, and update() of the sources bind() read once (a trainer's
            # parameters, written in place between updates); each kind's best of 3, as torch's references below.
            new = random_state_dict([(k, tuple(v.shape)) for k, v in sd.items()], seed=2)
            new_sums = checksums(new)
            t0 = time.perf_counter()
            bound_sd = pub.bind(sd)
            bind_s = time.perf_counter() - t0
            bound = {id(sd): bound_sd, id(new): pub.bind(new)}
            plan = [(new, new_sums, False, "update"), (sd, sums, False, "update"), (new, new_sums, True, "update")]
            for source, want in ((sd, sums), (new, new_sums), (sd, sums)):  # the kinds interleaved: the same arenas
                plan += [(source, want, False, "update"), (source, want, False, "bound")]
            # Then 12 bound updates, the two sources in turn: a bound update prepares its gather's table on its first
            # use of an arena and keeps it, so the last 6 (each source has met each arena by then) are the steady
            # state of a trainer publishing every step ("bound-warm"; the best of them is the row's figure).
            for k in range(12):
                source, want = (sd, sums) if k % 2 == 0 else (new, new_sums)
                plan.append((source, want, False, "bound" if k < 6 else "bound-warm"))
            updates: list[tuple[str, float]] = []
            switched, queued = {}, float("nan")
            for source, want, split, mode in plan:
                torch.cuda.synchronize()
                t0 = time.perf_counter()
                if split:
                    kept = pub._copy(source, None)  # noqa: SLF001 - update() without its commit, to time the parts
                    queued = time.perf_counter() - t0
                    gen = pub.commit()
                    del kept
                else:
                    gen = pub.update(bound[id(source)] if mode.startswith("bound") else source)
                torch.cuda.synchronize()
                updates.append((mode, time.perf_counter() - t0))
                switched = reader.ask(op="refresh-gpu-ipc")
                check = reader.ask(op="check", sums=want)
                if check["wrong"] or check["missing"] or switched["generation"] != gen:
                    run.fail(f"gpu-ipc switch {set_name} {backend} ({mode}): generation {switched['generation']}"
                             f" (want {gen}), {check['wrong']} wrong, {check['missing']} missing")
            # One more bound update timed in its parts, to say where its time goes: staging the arena and queueing
            # the gather (the CPU, until copy_in returns), the copy itself (until the device is idle), and commit.
            prepared = {k: b.native.preparations for k, b in bound.items()}
            parts = bound_parts(torch, pub, bound[id(sd)])
            parts["bound_preparations"] = sum(prepared.values())
            parts["bound_updates"] = sum(1 for _s, _w, _x, mode in plan if mode.startswith("bound"))
            switched = reader.ask(op="refresh-gpu-ipc")
            check = reader.ask(op="check", sums=sums)
            if check["wrong"] or check["missing"]:
                run.fail(f"gpu-ipc switch {set_name} {backend} (bound, in parts): {check['wrong']} wrong")
            del bound, bound_sd
            in_place = in_place_parts(run, torch, pub, reader, sd, f"{set_name} {backend}")
            reader.ask(op="release")
        finally:
            reader.close()
    finally:
        pub.close()
    # torch's own copies of the same bytes, with the arenas gone: one copy_ per tensor (into the old source, no longer
    # needed: `sd` then holds generation 2's bytes), and the issue's reference, one memcpy of the same total; each
    # the best of 3.
    per_tensor_s = min(timed_copies(sd, new) for _ in range(3))
    del new
    flat_src = torch.empty(total, dtype=torch.uint8, device="cuda")
    flat_dst = torch.empty(total, dtype=torch.uint8, device="cuda")
    one_copy_s = min(timed_flat_copy(flat_dst, flat_src) for _ in range(3))
    del flat_src, flat_dst
    torch.cuda.empty_cache()
    best = {m: min(t for mode, t in updates[3:] if mode == m) for m in ("update", "bound", "bound-warm")}
    steady = best["update"]
    run.row(part="switch", set=set_name, backend=backend, method="gpu-ipc", tensors=len(sd), bytes=total,
            update_seconds=steady, first_update_seconds=updates[0][1], second_update_seconds=updates[1][1],
            bound_update_seconds=best["bound-warm"], bound_first_use_seconds=best["bound"], bind_seconds=bind_s,
            **parts, ratio_bound_to_one_memcpy=best["bound-warm"] / one_copy_s,
            reader_refresh_seconds=switched["seconds"], update_queue_seconds=queued,
            split_update_seconds=updates[2][1],
            torch_copy_per_tensor_seconds=per_tensor_s, torch_one_memcpy_seconds=one_copy_s,
            ratio_to_per_tensor=steady / per_tensor_s, ratio_to_one_memcpy=steady / one_copy_s,
            wrong=check["wrong"] + check["missing"])
    run.row(part="switch-in-place", set=set_name, backend=backend, tensors=len(sd), bytes=total, **in_place,
            torch_one_memcpy_seconds=one_copy_s, ratio_to_one_memcpy=in_place["switch_seconds"] / one_copy_s)
    return new_sums


def in_place_parts(run: Run, torch: Any, pub: Any, reader: Reader, sd: dict[str, Any], what: str) -> dict[str, Any]:
    """The owner that makes its tensors in the arena (the issue's "no copy where the owner allocates in the arena"):
    ``stage(torch)`` (the next arena's tensors, writable), the owner's own writes into them (``normal_`` of every
    tensor, standing for the trainer's last step writing its outputs there), ``commit()``; the reader refreshes and
    checks every tensor. The same writes into private tensors (``sd``, whose bytes are not needed any more) say what
    writing in the arena adds. The switch is stage + commit: no copy. Each the best of 3."""
    g = torch.Generator(device="cuda")
    trials: list[dict[str, float]] = []
    wrong = 0
    for trial in range(3):
        g.manual_seed(10 + trial)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        staged = pub.stage(torch)
        t1 = time.perf_counter()
        for t in staged.values():
            t.normal_(generator=g)
        torch.cuda.synchronize()
        t2 = time.perf_counter()
        gen = pub.commit()
        t3 = time.perf_counter()
        want = checksums(staged)
        del staged, t
        switched = reader.ask(op="refresh-gpu-ipc")
        check = reader.ask(op="check", sums=want)
        wrong += check["wrong"] + check["missing"]
        if check["wrong"] or check["missing"] or switched["generation"] != gen:
            run.fail(f"gpu-ipc switch {what} (in place): generation {switched['generation']} (want {gen}), "
                     f"{check['wrong']} wrong, {check['missing']} missing")
        g.manual_seed(10 + trial)
        torch.cuda.synchronize()
        t4 = time.perf_counter()
        for t in sd.values():
            t.normal_(generator=g)
        torch.cuda.synchronize()
        t5 = time.perf_counter()
        trials.append({"stage": t1 - t0, "writes": t2 - t1, "commit": t3 - t2, "switch": (t1 - t0) + (t3 - t2),
                       "private": t5 - t4, "refresh": switched["seconds"]})
    best = {k: min(t[k] for t in trials) for k in trials[0]}
    return {"stage_seconds": best["stage"], "commit_seconds": best["commit"], "switch_seconds": best["switch"],
            "owner_writes_in_arena_seconds": best["writes"], "owner_writes_private_seconds": best["private"],
            "reader_refresh_seconds": best["refresh"], "wrong": wrong}


def bound_parts(torch: Any, pub: Any, bound: Any) -> dict[str, float]:
    """A bound update (``update(bound)``) done by hand in its parts, each timed: staging the next arena (a write of
    the smallest tensor from the host, which stages first; the gather then writes it too), ``copy_in_bound`` (the
    gather's launch, its table prepared on the first use of that arena: CPU), the device finishing the copies,
    ``commit`` (publishes)."""
    device = pub._owner.device  # noqa: SLF001 - the parts of update(bound), to time them
    stream = torch.cuda.current_stream(device).cuda_stream
    small = min(range(len(bound.tensors)), key=lambda i: bound.tensors[i].numel() * bound.tensors[i].element_size())
    t = bound.tensors[small]
    zeros = bytes(t.numel() * t.element_size())
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    pub._owner.write(pub._names[small], zeros)  # noqa: SLF001
    t1 = time.perf_counter()
    pub._owner.copy_in_bound(bound.native, stream)  # noqa: SLF001
    t2 = time.perf_counter()
    torch.cuda.synchronize()
    t3 = time.perf_counter()
    pub._owner.commit()  # noqa: SLF001
    t4 = time.perf_counter()
    return {"bound_stage_seconds": t1 - t0, "bound_queue_seconds": t2 - t1, "bound_copy_seconds": t3 - t2,
            "bound_commit_seconds": t4 - t3}


def torch_mp_row(run: Run, backend: str, set_name: str, sd: dict[str, Any], sums: dict[str, int]) -> None:
    """torch.multiprocessing: one CUDA IPC handle per tensor (what vLLM's IPC transfer and the RL frameworks send);
    `--cold-repeats` fresh readers, the last one's tensors checked."""
    samples = [torch_mp_sample(run, backend, set_name, sd, sums if last else None)
               for last in [False] * (cold_repeats(run) - 1) + [True]]
    mid = median_sample(samples)
    run.row(part="cold", set=set_name, backend=backend, method="torch-mp", tensors=len(sd), bytes=nbytes_of(sd),
            seconds=mid["seconds"], owner_seconds=mid["owner_seconds"], handle_bytes=mid["handle_bytes"],
            samples=[a["seconds"] for a in samples], wrong=samples[-1]["wrong"])
    if samples[-1]["wrong"]:
        run.fail(f"torch-mp {set_name} {backend}: {samples[-1]['wrong']} wrong tensors")


def torch_mp_sample(run: Run, backend: str, set_name: str, sd: dict[str, Any],
                    sums: dict[str, int] | None) -> dict[str, Any]:
    """One fresh reader of `sd` through per-tensor handles: its seconds, the owner's, the handles' bytes, and its
    wrong tensors when `sums` is given (0 otherwise)."""
    from torch.multiprocessing.reductions import reduce_tensor

    reader = Reader(run.env(backend))
    try:
        address = os.path.join(run.tmp, f"{set_name}-{backend}-mp.sock")
        with Listener(address, family="AF_UNIX", authkey=b"weights-bench") as listener:
            reader.send(op="open-torch-mp", address=address)
            with accept_within(listener, LINE_TIMEOUT) as conn:
                t0 = time.perf_counter()
                handles = pickle.dumps({k: reduce_tensor(v) for k, v in sd.items()})
                owner_s = time.perf_counter() - t0
                conn.send_bytes(handles)
                got = reader.answer()
                conn.recv_bytes()
        check = reader.ask(op="check", sums=sums) if sums is not None else {"wrong": 0, "missing": 0}
        reader.ask(op="release")
        return {"seconds": got["seconds"], "owner_seconds": owner_s, "handle_bytes": got["handle_bytes"],
                "wrong": check["wrong"] + check["missing"]}
    finally:
        reader.close()


def bucket_row(run: Run, backend: str, set_name: str, sd: dict[str, Any], sums: dict[str, int]) -> None:
    """The bucket: every tensor copied into one flat buffer, one handle, plain metadata; `--cold-repeats` fresh
    readers, the last one's tensors checked."""
    samples = [bucket_sample(run, backend, set_name, sd, sums if last else None)
               for last in [False] * (cold_repeats(run) - 1) + [True]]
    mid = median_sample(samples)
    run.row(part="cold", set=set_name, backend=backend, method="bucket", tensors=len(sd), bytes=nbytes_of(sd),
            seconds=mid["seconds"], flatten_seconds=mid["flatten_seconds"], samples=[a["seconds"] for a in samples],
            wrong=samples[-1]["wrong"])
    if samples[-1]["wrong"]:
        run.fail(f"bucket {set_name} {backend}: {samples[-1]['wrong']} wrong tensors")


def bucket_sample(run: Run, backend: str, set_name: str, sd: dict[str, Any],
                  sums: dict[str, int] | None) -> dict[str, Any]:
    """One fresh reader of `sd` through a bucket: its seconds, the owner's flattening, and its wrong tensors when
    `sums` is given (0 otherwise)."""
    import torch
    from torch.multiprocessing.reductions import reduce_tensor

    reader = Reader(run.env(backend))
    try:
        t0 = time.perf_counter()
        entries, offset = [], 0
        for name, t in sd.items():
            nbytes = t.numel() * t.element_size()
            entries.append((name, str(t.dtype).removeprefix("torch."), tuple(t.shape), offset, nbytes))
            offset += (nbytes + 255) // 256 * 256
        bucket = torch.empty(offset, dtype=torch.uint8, device="cuda")
        for (name, _, _, off, nbytes), t in zip(entries, sd.values()):
            bucket[off : off + nbytes].copy_(t.contiguous().view(-1).view(torch.uint8))
        torch.cuda.synchronize()
        flatten_s = time.perf_counter() - t0
        address = os.path.join(run.tmp, f"{set_name}-{backend}-bucket.sock")
        with Listener(address, family="AF_UNIX", authkey=b"weights-bench") as listener:
            reader.send(op="open-bucket", address=address)
            with accept_within(listener, LINE_TIMEOUT) as conn:
                conn.send_bytes(pickle.dumps((reduce_tensor(bucket), entries)))
                got = reader.answer()
                conn.recv_bytes()
        del bucket
        check = reader.ask(op="check", sums=sums) if sums is not None else {"wrong": 0, "missing": 0}
        reader.ask(op="release")
        return {"seconds": got["seconds"], "flatten_seconds": flatten_s, "wrong": check["wrong"] + check["missing"]}
    finally:
        reader.close()
        # The bucket's block, kept by torch for the reader until it let go, is free for the next sample's bucket.
        torch.cuda.ipc_collect()


def timed_copies(dst: dict[str, Any], src: dict[str, Any]) -> float:
    import torch

    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for k, v in src.items():
        dst[k].copy_(v)
    torch.cuda.synchronize()
    return time.perf_counter() - t0


def timed_flat_copy(dst: Any, src: Any) -> float:
    import torch

    torch.cuda.synchronize()
    t0 = time.perf_counter()
    dst.copy_(src)
    torch.cuda.synchronize()
    return time.perf_counter() - t0


def part_mixed(run: Run, backend: str) -> None:
    import torch

    import gpu_ipc

    switches = run.args.switches
    say(f"== mixed: {switches} switches, backend {backend}")
    shapes = [(f"t{i}", (64 * 1024,)) for i in range(64)]  # 64 int32 tensors of 256 KiB
    src = {n: torch.full(s, 1, dtype=torch.int32, device="cuda") for n, s in shapes}
    sock = os.path.join(run.tmp, f"mixed-{backend}.sock")
    pub = gpu_ipc.weights.publish(src, "mixed", socket=sock, backend=backend, keep=2)
    last = 1 + switches
    child = subprocess.Popen([sys.executable, SCRIPT, "_mixed_reader", sock, str(last)],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=run.env(backend))
    assert child.stdin is not None and child.stdout is not None
    try:
        read_line(child.stdout)
        child.stdin.write("go\n")
        child.stdin.flush()
        t0 = time.perf_counter()
        for g in range(2, last + 1):
            for t in src.values():
                t.fill_(g)
            if g % 2:
                pub.update(src)
            else:  # half the generations written in place into the staged arena (cut from one import), committed
                staged = pub.stage(torch)
                for name, t in staged.items():
                    t.copy_(src[name])
                del staged, t
                pub.commit()
        torch.cuda.synchronize()
        publish_s = time.perf_counter() - t0
        result = json.loads(read_line(child.stdout))
        child.wait(timeout=60)
        run.row(part="mixed", backend=backend, switches=switches, seconds=publish_s, **result)
        if result["mixed"]:
            run.fail(f"mixed {backend}: {result['mixed']} mixed-generation reads")
    except (TimeoutError, EOFError, ValueError) as e:
        run.fail(f"mixed {backend}: {e}")
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
        done_with(child.stdout)
        pub.close()


def part_kills(run: Run, backend: str, container: bool) -> None:
    trials = run.args.kills
    where = "container" if container else "host"
    say(f"== kills: {trials} trials, backend {backend}, reader in {where}")
    prefix: list[str] | None = None
    if container:
        unshare = shutil.which("unshare")
        if os.geteuid() != 0 or unshare is None:
            run.row(part="kills", backend=backend, where=where, not_run="needs root and unshare")
            return
        inside = 'mount -t tmpfs -o mode=1777,size=64m gpu-ipc-shm /dev/shm && exec "$0" "$@"'
        prefix = [unshare, "--pid", "--fork", "--mount-proc", "--ipc", "--net", "--mount", "--propagation=private",
                  "/bin/sh", "-c", inside]
    told, bad = [], 0
    for trial in range(trials):
        sock = os.path.join(run.tmp, f"kill-{backend}-{where}-{trial}.sock")
        rcmd = [sys.executable, SCRIPT, "_kill_reader", sock]
        reader = subprocess.Popen((prefix or []) + rcmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                  env=run.env(backend))
        owner = subprocess.Popen([sys.executable, SCRIPT, "_owner", sock, "--gib", "1"],
                                 stdout=subprocess.PIPE, text=True, env=run.env(backend))
        assert reader.stdin is not None and reader.stdout is not None and owner.stdout is not None
        try:
            read_line(reader.stdout)
            if read_line(owner.stdout) != "PUBLISHED":
                raise EOFError("the owner did not publish")
            reader.stdin.write("go\n")
            reader.stdin.flush()
            if read_line(reader.stdout) != "HOLDING":
                raise EOFError("the reader did not open")
            owner.send_signal(signal.SIGKILL)
            killed_at = time.time()
            owner.wait()
            reader.stdin.write(f"{killed_at}\n")
            reader.stdin.flush()
            result = json.loads(read_line(reader.stdout, 60))
            reader.wait(timeout=60)
        except (TimeoutError, EOFError, ValueError, subprocess.TimeoutExpired) as e:
            result = {"error": str(e)}
        finally:
            for p in (owner, reader):
                if p.poll() is None:
                    p.kill()
                    p.wait()
                if p.stdout is not None:
                    done_with(p.stdout)
        back = result.get("free_after", 0) >= result.get("free_before", 1) - 16 * MIB
        ok = result.get("told_seconds") is not None and result["told_seconds"] <= 1.0 and result.get("intact") and back
        if result.get("told_seconds") is not None:
            told.append(result["told_seconds"])
        if not ok:
            bad += 1
        say(f"  trial {trial}: {'ok' if ok else 'FAIL'} {json.dumps(result)}")
    run.row(part="kills", backend=backend, where=where, trials=trials, failed=bad,
            told_max_seconds=max(told) if told else None, told_median_seconds=sorted(told)[len(told) // 2] if told
            else None)
    if bad:
        run.fail(f"kills {backend} {where}: {bad} of {trials} trials failed")
