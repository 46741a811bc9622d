"""The bridge measured (scripts/bridge-gpu.sh runs this on the GPU machine):

    python scripts/bridge_gpu.py run OUT_DIR [--host]      every row, then OUT_DIR/bridge.md and bridge.json
    python scripts/bridge_gpu.py produce SOCK BACKEND FRAMES CONSUMERS    (one end, for `run`)
    python scripts/bridge_gpu.py consume SOCK BACKEND NAME [--device N]

Rows, 4K RGB frames (64x32 with --host, the host backend and NumPy: a dry run of the harness without a GPU):
  ring      a torch producer -> ring A -> two torch consumers (the plain one-machine ring)
  bridge    a torch producer -> ring A -> `gpu_ipc.bridge send` -> NIXL -> `gpu_ipc.bridge receive` -> ring B -> two
            torch consumers, with UCX's default transports and with UCX_TLS=tcp,cuda_copy (a node boundary without
            RDMA), for each backend in BACKENDS; on a machine with two GPUs, the same again with ring B (the
            receiving end and its consumers) on the second GPU (BRIDGE_CROSS_ONLY=1: only those rows, no kills)
Every consumer checks every word of every frame on the GPU (scripts/python_gpu_ends.py's checks) and notes when it
was done with each (time.monotonic: one clock for the processes of a machine); the producer notes each publish.
Latency: A's publish to the later of the two consumers' done, p50 / p99 past a warm-up; FPS: frames over the consumers' span.
Then kill trials (KILLS each way): Rust producer -> send -> receive -> Rust consumer; once frames flow, SIGKILL the
sending (receiving) end and time until the other end exits with its error (goal: under 1 s; nothing may hang).
"""

from __future__ import annotations

import json
import os
import select
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))
if "--host" in sys.argv:
    os.environ["PY_GPU_HOST_DRY_RUN"] = "1"

KILLS = int(os.environ.get("BRIDGE_KILLS", "10"))
# BRIDGE_CROSS_ONLY=1: only the rows with ring B on the second GPU (a machine with two), no kill trials.
CROSS_ONLY = os.environ.get("BRIDGE_CROSS_ONLY") == "1"
BACKENDS = os.environ.get("BRIDGE_BACKENDS", "legacy,vmm").split(",")
SLOTS = 4
WARMUP = 3 * SLOTS  # frames left out of the latency percentiles


def produce(sock: str, backend: str, frames: int, consumers: int) -> dict[str, Any]:
    import gpu_ipc
    from python_gpu_ends import HEIGHT, WIDTH, WORDS, base_words, key, signed

    sync = "cpu-spin" if backend == "host" else "ipc-event"  # the bridge reads rings with a CPU strategy
    if backend == "host":
        import numpy as np

        base: Any = base_words(WORDS)

        def fill(slot: Any) -> None:
            np.bitwise_xor(base, np.uint32(key(slot.seq)), out=np.from_dlpack(slot).reshape(-1).view(np.uint32))
        stream: Any = None
    else:
        import torch

        base = torch.from_numpy(base_words(WORDS).view("int32")).to("cuda:0")
        stream = torch.cuda.Stream()

        def fill(slot: Any) -> None:
            with torch.cuda.stream(stream):
                torch.bitwise_xor(base, signed(key(slot.seq)), out=torch.from_dlpack(slot).view(-1).view(torch.int32))

    published: list[float] = []
    with gpu_ipc.Producer(sock, width=WIDTH, height=HEIGHT, slots=SLOTS, sync=sync, backend=backend) as producer:
        producer.wait_for_consumers(consumers, timeout=60)
        for _ in range(frames):
            slot = producer.acquire(timeout=30, stream=stream)
            fill(slot)
            producer.publish(slot, stream=stream)
            published.append(time.monotonic())
        producer.drain(timeout=60, stream=stream)
    return {"role": "producer", "frames": frames, "published": published}


def consume(sock: str, backend: str, name: str, device: int = 0) -> dict[str, Any]:
    import gpu_ipc
    from python_gpu_ends import CHECKS

    if device != 0:
        import torch

        torch.cuda.set_device(device)  # the check's stream and tensors on the ring's GPU
    check = CHECKS["numpy" if backend == "host" else "torch"](0)
    done: list[float] = []
    published = -1
    with check.context, gpu_ipc.Consumer(sock, backend=backend, name=name, wait_for_producer=60,
                                         timeout=60, device=device) as consumer:
        while True:
            try:
                frame = consumer.next_frame(timeout=30, stream=check.stream)
            except gpu_ipc.EndOfStream as end:
                published = end.published
                break
            check.frame(frame)
            if check.stream is not None:
                check.stream.synchronize()  # done with this frame: its check ran
            done.append(time.monotonic())
            consumer.release(frame, stream=check.stream)
        mismatched = check.total(published)
    return {"role": "consumer", "name": name, "frames": len(done), "published": published,
            "mismatched_words": mismatched, "done": done}


def spawn(args: list[str], log: Any, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    log.write(f"$ {' '.join(args)}\n")
    log.flush()
    return subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, **(env or {})})


def finish(p: subprocess.Popen[str], log: Any, timeout: float) -> tuple[int, dict[str, Any]]:
    from python_gpu import last_json

    try:
        out, err = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        p.kill()
        out, err = p.communicate()
        err += f"\n(killed: still running after {timeout} s)"
    log.write(f"--- exit {p.returncode}\n{out[-4000:]}{err[-4000:]}\n")
    return p.returncode, last_json(out) or {}


def gpu_count() -> int:
    """GPUs this machine shows (0 when torch cannot tell)."""
    try:
        import torch

        return int(torch.cuda.device_count())
    except (ImportError, RuntimeError):
        return 0


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


def row(kind: str, backend: str, frames: int, ucx_env: dict[str, str], log: Any, device_b: int = 0) -> dict[str, Any]:
    """One measured row: the plain ring or the bridge, two checking consumers; ring B (the receiving end and its
    consumers) on GPU `device_b`, ring A on GPU 0."""
    me = [sys.executable, str(Path(__file__))]
    host = ["--host"] if backend == "host" else []
    tmp = tempfile.mkdtemp(prefix="gi-br-", dir="/tmp")
    a, b = f"{tmp}/a.sock", f"{tmp}/b.sock"
    port = 5600 + (os.getpid() + int(time.monotonic() * 1000)) % 300
    label = (f"{kind} {backend}" + (f" UCX_TLS={ucx_env['UCX_TLS']}" if ucx_env else "")
             + (f", ring B on GPU {device_b}" if device_b else ""))
    log.write(f"\n=== {label}\n")
    procs: dict[str, subprocess.Popen[str]] = {}
    r: dict[str, Any] = {"row": label, "kind": kind, "backend": backend, "ucx_tls": ucx_env.get("UCX_TLS", "default"),
                         "device_b": device_b}
    try:
        if kind == "ring":
            procs["producer"] = spawn([*me, "produce", a, backend, str(frames), "2", *host], log)
            read_sock = a
        else:
            procs["producer"] = spawn([*me, "produce", a, backend, str(frames), "1", *host], log)
            procs["receive"] = spawn([sys.executable, "-m", "gpu_ipc.bridge", "receive", "--socket", b, "--port",
                                      str(port), "--backend", backend, "--consumers", "2", "--device",
                                      str(device_b)], log, ucx_env)
            procs["send"] = spawn([sys.executable, "-m", "gpu_ipc.bridge", "send", "--socket", a, "--connect",
                                   "127.0.0.1", "--port", str(port), "--backend", backend], log, ucx_env)
            read_sock = b
        for n in ("c1", "c2"):
            on = ["--device", str(device_b)] if kind == "bridge" and device_b else []
            procs[n] = spawn([*me, "consume", read_sock, backend, n, *on, *host], log)
        results = {n: finish(p, log, 60) for n, p in procs.items()}
    finally:
        for p in procs.values():
            if p.poll() is None:
                p.kill()
    rcs = {n: rc for n, (rc, _) in results.items()}
    prod, c1, c2 = results["producer"][1], results["c1"][1], results["c2"][1]
    r["exit_codes"] = rcs
    ok = all(rc == 0 for rc in rcs.values()) and c1.get("frames") == frames and c2.get("frames") == frames
    counts = [c.get("mismatched_words") for c in (c1, c2)]
    r["mismatched_words"] = sum(c for c in counts if c is not None) if None not in counts else None
    if ok:
        pub = prod["published"]
        done = [max(x, y) for x, y in zip(c1["done"], c2["done"])]
        # Past the warm-up: the first frames wait for the whole chain to attach (ring B's consumers).
        lat = [(d - p) * 1e3 for d, p in zip(done, pub)][WARMUP:]
        span = max(done[-1] - min(c1["done"][0], c2["done"][0]), 1e-9)
        r.update(frames=frames, fps=(frames - 1) / span, p50_ms=statistics.median(lat),
                 p99_ms=percentile(lat, 0.99))
    if "send" in results:
        sent = results["send"][1]
        r["ucx_writes"] = sent.get("ucx_writes")
        r["transport"] = ", ".join(sorted({t for v in (sent.get("ucx_writes") or {}).values() for t in v})) or None
        r["transport_warning"] = sent.get("transport_warning")
        r["staged"] = sent.get("staged")  # frames copied through the sending end's own buffer (bridge_staging)
        r["staged_because"] = sent.get("staged_because")
    r["ok"] = bool(ok and r["mismatched_words"] == 0)
    return r


def kill_trial(victim: str, backend: str, log: Any) -> dict[str, Any]:
    """Rust producer -> send -> receive -> Rust consumer; SIGKILL `victim` once frames flow; time the other's exit."""
    bins = Path(os.environ.get("GPU_IPC_EXAMPLES_DIR", ROOT / "stage" / "bin"))
    tmp = tempfile.mkdtemp(prefix="gi-bk-", dir="/tmp")
    a, b = f"{tmp}/a.sock", f"{tmp}/b.sock"
    port = 5900 + (os.getpid() + int(time.monotonic() * 1000)) % 300
    size = ["--width", "64", "--height", "32"] if backend == "host" else []
    sync = "cpu-spin" if backend == "host" else "ipc-event"
    procs = {
        "producer": spawn([str(bins / "producer"), "--socket", a, "--backend", backend, "--sync", sync, "--slots",
                           str(SLOTS), "--frames", "1000000", "--consumers", "1", *size], log),
        "receive": spawn([sys.executable, "-m", "gpu_ipc.bridge", "receive", "--socket", b, "--port", str(port),
                          "--backend", backend], log),
        "send": spawn([sys.executable, "-m", "gpu_ipc.bridge", "send", "--socket", a, "--connect", "127.0.0.1",
                       "--port", str(port), "--backend", backend], log),
        "consumer": subprocess.Popen([str(bins / "consumer"), "--socket", b, "--backend", backend, "--frames", "0",
                                      "--progress-every", "20", "--json"], stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True),
    }
    t: dict[str, Any] = {"victim": victim}
    try:
        consumer = procs["consumer"]
        assert consumer.stderr is not None
        deadline = time.monotonic() + 60
        flowing = False
        while time.monotonic() < deadline and consumer.poll() is None:
            ready, _, _ = select.select([consumer.stderr], [], [], 0.5)
            if ready and "frame" in consumer.stderr.readline():
                flowing = True
                break
        if not flowing:
            t.update(ok=False, detail="frames never reached ring B's consumer")
            return t
        time.sleep(0.2)  # mid-stream
        other = "receive" if victim == "send" else "send"
        procs[victim].send_signal(signal.SIGKILL)
        killed = time.monotonic()
        try:
            procs[other].wait(timeout=10)
            took = time.monotonic() - killed
        except subprocess.TimeoutExpired:
            took = float("inf")
        rc, summary = finish(procs[other], log, 5)
        t.update(seconds=took, exit_code=rc, error=summary.get("error", ""))
        t["ok"] = rc not in (0, None) and took < 1.0 and summary.get("outcome") == "error"
        return t
    finally:
        for name, p in procs.items():
            if p.poll() is None:
                p.kill()
            if p.stdout is None or p.stdout.closed:
                continue  # its output is logged already
            try:
                out, err = p.communicate(timeout=10)
                log.write(f"--- {name} exit {p.returncode}\n{out[-2000:]}{err[-2000:]}\n")
            except subprocess.TimeoutExpired:
                t["ok"] = False
                t["detail"] = f"{name} did not end after SIGKILL"


def markdown(rows: list[dict[str, Any]], kills: list[dict[str, Any]], env: dict[str, str]) -> str:
    from python_gpu_ends import HEIGHT, WIDTH

    lines = [f"# The bridge over NIXL: {env.get('device')}, driver {env.get('driver')}, {env.get('date')}, commit "
             f"{env.get('commit')}", "",
             "Both ends on this machine (loopback): a node boundary is imitated with UCX_TLS=tcp,cuda_copy, not "
             f"crossed. {WIDTH}x{HEIGHT} RGB frames, two consumers checking every word; latency from ring A's publish to the later "
             f"consumer's done, past the first {WARMUP} frames. UCX transport: what UCX's protocol tables name for "
             "the sending end's remote writes (bridge.json has the tables' rows).", "",
             "| row | ok | frames | FPS | p50 ms | p99 ms | mismatched words | UCX transport of the writes |",
             "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        fmt = (lambda k: f"{r[k]:.2f}" if isinstance(r.get(k), float) else "-")
        transport = r.get("transport") or "-"
        if r.get("staged"):
            transport += " (staged through the sending end's own buffer)"
        if r.get("transport_warning"):
            transport += f" (WARNING: {r['transport_warning']})"
        lines.append(f"| {r['row']} | {'yes' if r['ok'] else 'NO ' + json.dumps(r.get('exit_codes'))} | "
                     f"{r.get('frames', '-')} | {fmt('fps')} | {fmt('p50_ms')} | {fmt('p99_ms')} | "
                     f"{r.get('mismatched_words')} | {transport} |")
    lines += ["", "| SIGKILLed end | trials | other end errored within 1 s | slowest (s) | failures |", "|---|---|---|---|---|"]
    for victim in ("send", "receive"):
        ts = [k for k in kills if k["victim"] == victim]
        if not ts:
            continue
        slow = max((k.get("seconds", float("inf")) for k in ts), default=float("nan"))
        bad = [k.get("detail") or k.get("error") or f"exit {k.get('exit_code')}" for k in ts if not k["ok"]]
        lines.append(f"| {victim} | {len(ts)} | {sum(k['ok'] for k in ts)} | {slow:.3f} | {'; '.join(bad) or '-'} |")
    return "\n".join(lines) + "\n"


def run(out: Path, host: bool) -> int:
    from python_gpu import environment

    out.mkdir(parents=True, exist_ok=True)
    backends = ["host"] if host else BACKENDS
    frames, tcp_frames = (200, 60) if host else (600, 60)
    rows: list[dict[str, Any]] = []
    kills: list[dict[str, Any]] = []
    with open(out / "bridge.log", "w") as log:
        for backend in backends:
            if not CROSS_ONLY:
                rows.append(row("ring", backend, frames, {}, log))
                rows.append(row("bridge", backend, frames, {}, log))
                rows.append(row("bridge", backend, tcp_frames, {"UCX_TLS": "tcp,cuda_copy"}, log))
            if not host and gpu_count() > 1:  # ring B on the second GPU
                rows.append(row("bridge", backend, frames, {}, log, device_b=1))
                rows.append(row("bridge", backend, tcp_frames, {"UCX_TLS": "tcp,cuda_copy"}, log, device_b=1))
            mine = [r for r in rows if r["backend"] == backend]
            print(f"bridge-gpu: {backend}: " + "; ".join(f"{r['row']}: {'ok' if r['ok'] else 'FAILED'}"
                                                       for r in mine), file=sys.stderr, flush=True)
        for victim in ("send", "receive"):
            for _ in range(0 if CROSS_ONLY else KILLS):
                kills.append(kill_trial(victim, backends[0], log))
        print(f"bridge-gpu: kill trials: {sum(k['ok'] for k in kills)}/{len(kills)} ok", file=sys.stderr, flush=True)
    env = environment()
    (out / "bridge.json").write_text(json.dumps({"env": env, "rows": rows, "kills": kills}, indent=1))
    (out / "bridge.md").write_text(markdown(rows, kills, env))
    print(markdown(rows, kills, env))
    # The rows on the first backend (legacy) and every kill trial must pass; other backends are reported.
    must = [r for r in rows if r["backend"] == backends[0]]
    return 0 if all(r["ok"] for r in must) and all(k["ok"] for k in kills) else 1


def main() -> int:
    args = [a for a in sys.argv[1:] if a != "--host"]
    if not args:
        print(__doc__, file=sys.stderr)
        return 2
    if args[0] == "run":
        return run(Path(args[1]), "--host" in sys.argv)
    if args[0] == "produce":
        result = produce(args[1], args[2], int(args[3]), int(args[4]))
    elif args[0] == "consume":
        device = int(args[args.index("--device") + 1]) if "--device" in args else 0
        result = consume(args[1], args[2], args[3], device)
    else:
        print(__doc__, file=sys.stderr)
        return 2
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
