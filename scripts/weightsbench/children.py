"""The benchmark's child processes (started as `weights_bench.py _reader`, `_mixed_reader`, `_owner`,
`_kill_reader`): each sets CUDA up, says so on stdout, then does what its orchestrator asks on stdin, one JSON line
per answer. Every wait on the other side is bounded (LINE_TIMEOUT)."""

from __future__ import annotations

import argparse
import json
import os
import pickle
import subprocess
import sys
import time
from multiprocessing.connection import Client
from typing import IO, Any

from linepipe import forget
from linepipe import read_line as read_pipe_line
from weightsbench.shapes import checksums

LINE_TIMEOUT = 600.0
MIB = 1 << 20
GIB = 1 << 30
# The script the children are started from.
SCRIPT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "weights_bench.py")


def BACKEND() -> str | None:  # noqa: N802 - read like a constant
    """The backend a child process uses: the one its orchestrator chose for the part."""
    return os.environ.get("WEIGHTS_BENCH_BACKEND")


def say(text: str) -> None:
    print(text, flush=True)


def read_line(stream: IO[Any], timeout: float = LINE_TIMEOUT) -> str:
    """The next line another process wrote to `stream`, bounded (linepipe: never select() on a buffered stream)."""
    return read_pipe_line(stream, timeout)


def done_with(stream: IO[Any]) -> None:
    """Forgets what was read past the last line of a child's pipe, and closes it."""
    forget(stream)
    stream.close()


def reader_main(args: argparse.Namespace) -> int:
    """A reader process: set CUDA up, say READY, then do what the owner asks on stdin, one JSON line per answer."""
    import torch

    import gpu_ipc

    torch.zeros(1, device="cuda")
    torch.cuda.synchronize()
    free0, _ = torch.cuda.mem_get_info()
    say(json.dumps({"ready": True, "free": free0}))
    held: dict[str, Any] = {}
    reader = None
    keep: list[Any] = []
    while True:
        request = json.loads(read_line(sys.stdin))
        op = request["op"]
        if op == "bye":
            return 0
        t0 = time.perf_counter()
        if op == "open-gpu-ipc":
            reader = gpu_ipc.weights.open(request["socket"], request["name"], backend=BACKEND(), timeout=60.0)
            opened = time.perf_counter()
            # Every tensor cut from one DLPack import of the arena (request["per_tensor"]: one import each, the
            # way before tensors(torch), for comparison).
            if request.get("per_tensor"):
                held = {k: torch.from_dlpack(v) for k, v in reader.tensors().items()}
            else:
                held = reader.tensors(torch)
            torch.cuda.synchronize()
            done = time.perf_counter()
            answer = {"seconds": done - t0, "open_seconds": opened - t0, "tensors_seconds": done - opened,
                      "tensors": len(held), "generation": reader.generation}
        elif op == "refresh-gpu-ipc":
            assert reader is not None
            held = {}
            gen = reader.refresh()
            held = reader.tensors(torch)
            torch.cuda.synchronize()
            answer = {"seconds": time.perf_counter() - t0, "generation": gen, "tensors": len(held)}
        elif op == "open-torch-mp":
            with Client(request["address"], authkey=b"weights-bench") as conn:
                handles = conn.recv_bytes()
                t0 = time.perf_counter()  # from the handles' arrival: what a reader of torch.multiprocessing pays
                table = pickle.loads(handles)
                held = {k: fn(*fargs) for k, (fn, fargs) in table.items()}
                torch.cuda.synchronize()
                answer = {"seconds": time.perf_counter() - t0, "tensors": len(held), "handle_bytes": len(handles)}
                conn.send_bytes(b"done")
        elif op == "open-bucket":
            with Client(request["address"], authkey=b"weights-bench") as conn:
                message = conn.recv_bytes()
                t0 = time.perf_counter()
                (fn, fargs), entries = pickle.loads(message)
                bucket = fn(*fargs)
                keep = [bucket]
                held = {}
                for name, dtype, shape, offset, nbytes in entries:
                    held[name] = bucket[offset : offset + nbytes].view(getattr(torch, dtype)).view(shape)
                torch.cuda.synchronize()
                answer = {"seconds": time.perf_counter() - t0, "tensors": len(held)}
                conn.send_bytes(b"done")
        elif op == "check":
            sums = checksums(held)
            want = request["sums"]
            wrong = sum(1 for k, v in want.items() if sums.get(k) != v)
            missing = sum(1 for k in want if k not in sums)
            answer = {"wrong": wrong, "missing": missing, "checked": len(want)}
        elif op == "release":
            held = {}
            keep = []
            if reader is not None:
                reader.close()
                reader = None
            torch.cuda.synchronize()
            torch.cuda.ipc_collect()
            answer = {"released": True, "free": torch.cuda.mem_get_info()[0]}
        else:
            answer = {"error": f"unknown op {op}"}
        say(json.dumps(answer))


class Reader:
    """The owner's side of a reader process."""

    def __init__(self, env: dict[str, str], container: list[str] | None = None) -> None:
        command = [sys.executable, SCRIPT, "_reader"]
        if container:
            command = container + command
        self.proc = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
        ready = self._line()
        self.free0 = ready["free"]

    def _line(self) -> dict[str, Any]:
        assert self.proc.stdout is not None
        while True:
            line = read_line(self.proc.stdout)
            if line.startswith("{"):
                return json.loads(line)
            say(f"    reader: {line}")

    def ask(self, **request: Any) -> dict[str, Any]:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(request) + "\n")
        self.proc.stdin.flush()
        return self._line()

    def send(self, **request: Any) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(request) + "\n")
        self.proc.stdin.flush()

    def answer(self) -> dict[str, Any]:
        return self._line()

    def close(self) -> None:
        try:
            if self.proc.poll() is None:
                self.send(op="bye")
                self.proc.wait(timeout=60)
        except (OSError, subprocess.TimeoutExpired):
            self.proc.kill()
            self.proc.wait()
        finally:
            if self.proc.stdout is not None:
                done_with(self.proc.stdout)


def mixed_reader_main(args: argparse.Namespace) -> int:
    """Refreshes as fast as it can until the owner's last generation, checking each held generation's values."""
    import torch

    import gpu_ipc

    torch.zeros(1, device="cuda")
    say(json.dumps({"ready": True, "free": torch.cuda.mem_get_info()[0]}))
    read_line(sys.stdin)
    r = gpu_ipc.weights.open(args.socket, "mixed", backend=BACKEND(), timeout=60.0)
    refreshes = mixed = 0
    seen: set[int] = set()
    last = int(args.last)
    while True:
        gen = r.refresh()
        ts = list(r.tensors(torch).values())
        lo = torch.stack([t.min() for t in ts]).min().item()
        hi = torch.stack([t.max() for t in ts]).max().item()
        del ts
        refreshes += 1
        seen.add(gen)
        if lo != gen or hi != gen:
            mixed += 1
        if gen >= last:
            break
    r.close()
    say(json.dumps({"refreshes": refreshes, "generations_seen": len(seen), "mixed": mixed}))
    return 0


def owner_main(args: argparse.Namespace) -> int:
    """An owner that publishes `--gib` GiB of int32 value 7 and then waits to be killed."""
    import torch

    import gpu_ipc

    n = int(float(args.gib) * GIB) // 4 // 16
    sd = {f"w{i}": torch.full((n,), 7, dtype=torch.int32, device="cuda") for i in range(16)}
    pub = gpu_ipc.weights.publish(sd, "kill", socket=args.socket, backend=BACKEND(), keep=2)
    say("PUBLISHED")
    time.sleep(3600)
    pub.close()
    return 0


def kill_reader_main(args: argparse.Namespace) -> int:
    """Opens the weights, says HOLDING, and after the owner's death says how long it took to be told."""
    import torch

    import gpu_ipc

    torch.zeros(1, device="cuda")
    torch.cuda.synchronize()
    free_before = torch.cuda.mem_get_info()[0]
    say(f"READY {free_before}")
    read_line(sys.stdin)  # the owner has published
    r = gpu_ipc.weights.open(args.socket, "kill", backend=BACKEND(), timeout=30.0)
    ts = list(r.tensors(torch).values())
    say("HOLDING")
    killed_at = float(read_line(sys.stdin))  # time.time() of the kill, from the orchestrator
    told = None
    deadline = time.time() + 10
    while time.time() < deadline:
        try:
            r.latest()
        except gpu_ipc.OwnerGone:
            told = time.time() - killed_at
            break
        time.sleep(0.005)
    intact = all(int(t.min().item()) == 7 and int(t.max().item()) == 7 for t in ts)
    del ts
    r.close()
    torch.cuda.synchronize()
    free_after = 0
    for _ in range(100):  # the driver frees the owner's memory and ours as the mappings go
        free_after = torch.cuda.mem_get_info()[0]
        if free_after >= free_before - 16 * MIB:
            break
        time.sleep(0.02)
    say(json.dumps({"told_seconds": told, "intact": intact, "free_before": free_before, "free_after": free_after}))
    return 0
