"""The Python package on a GPU: Python and Rust ends of one ring in two processes, 4K RGB frames, one table.

Run by scripts/python-gpu.sh (which installs the staged wheel into a venv that sees the machine's torch, CuPy, JAX):
    python scripts/python_gpu.py run OUT_DIR [--set main|mps] [--host]   rows, added to OUT_DIR/python-package.rows.jsonl
    python scripts/python_gpu.py skip OUT_DIR --set mps --reason TEXT     the set's rows, recorded as not run
    python scripts/python_gpu.py report OUT_DIR                           OUT_DIR/python-package.{json,md}; 0: all ok
Rows (`main`): a torch producer and a torch consumer for backend legacy, vmm x sync cpu-spin, cpu-sleep, ipc-event,
gpu-stream-ops; a Rust producer -> torch consumer and a Rust producer -> Rust consumer in interleaved rounds (vmm,
gpu-stream-ops: the torch consumer's FPS against the Rust consumer's, the same producer and check); a torch producer ->
Rust consumer; torch producer -> CuPy and -> JAX consumers; last, Ctrl-C and SIGTERM against torch consumers whose
gpu-stream-ops waits a quiet producer never satisfies (scripts/python_gpu_sigint.py; not with --host). `mps`: gpu-poll, both backends (run under a private MPS
daemon). `--host`: the same harness on the host backend with NumPy (and JAX where installed), 64x32 frames: a dry run
without a GPU. The ends are scripts/python_gpu_ends.py and the Rust examples `producer` and `consumer`
($GPU_IPC_EXAMPLES_DIR, default stage/bin); every frame carries their pattern and is checked on the device.
PY_GPU_FRAMES frames per row (default 600), PY_GPU_COMPARE_FRAMES for the comparison rows (default 3000),
PY_GPU_COMPARE_ROUNDS rounds (default 3).
"""

from __future__ import annotations

import datetime
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
ENDS = HERE / "python_gpu_ends.py"
SLOTS = 4
PROCESS_TIMEOUT = 120  # seconds, each process of a row
BUDGET = {"main": 330, "mps": 90}  # no new row after this many seconds of a set
SIGINT_BUDGET = 150  # seconds, the signal cases (scripts/python_gpu_sigint.py) at the end of the main set
ROWS_FILE = "python-package.rows.jsonl"
COMPARE = ("vmm", "gpu-stream-ops")
SHARED_WORDS = 4 << 20  # int32: a 16 MiB tensor


def row_specs(which: str, host: bool) -> list[dict[str, Any]]:
    """The rows of one set: producer and consumer kinds, backend, sync, frames, and what the row is for."""
    frames = int(os.environ.get("PY_GPU_FRAMES", "600"))
    compare_frames = int(os.environ.get("PY_GPU_COMPARE_FRAMES", "3000"))
    rounds = int(os.environ.get("PY_GPU_COMPARE_ROUNDS", "3"))
    py, backends = ("numpy", ["host"]) if host else ("torch", ["legacy", "vmm"])
    backend, sync = ("host", "cpu-spin") if host else COMPARE

    def spec(producer: str, consumer: str, b: str, s: str, n: int = frames, **extra: Any) -> dict[str, Any]:
        return {"producer": producer, "consumer": consumer, "backend": b, "sync": s, "frames_asked": n, **extra}

    if which == "mps":
        return [spec(py, py, b, "gpu-poll") for b in backends]
    syncs = ["cpu-spin", "cpu-sleep"] if host else ["cpu-spin", "cpu-sleep", "ipc-event", "gpu-stream-ops"]
    rows = [spec(py, py, b, s) for b in backends for s in syncs]
    # torch with the Rust consumer's own check kernel (the same GPU work per frame: the comparison the goal is
    # about) and with a check written in torch operations (three passes: what a torch user's own work costs).
    compared = [py] if host else [py, "torch-ops"]
    for r in range(1, rounds + 1):  # interleaved, so that a drift of the machine hits them alike
        rows.append(spec("rust", "rust", backend, sync, compare_frames, compare_round=r))
        rows += [spec("rust", kind, backend, sync, compare_frames, compare_round=r) for kind in compared]
    rows.append(spec(py, "rust", backend, sync))
    extra = ["jax"] if host else ["cupy", "jax"]
    rows += [spec(py, kind, backend, sync) for kind in extra]
    if not host:  # CPU posts -> stream waits -> stream posts -> CPU waits, between two processes
        rows.append(spec("semaphore", "semaphore", "vmm", "-", 2000))
        # A tensor PyTorch allocated itself, read by another process in place: its default caching allocator
        # (cuMemAlloc: legacy) and expandable segments (cuMemCreate: vmm; 16 MiB, inside one of its 20 MiB chunks).
        rows.append(spec("share", "open", "legacy", "-", 1, words=SHARED_WORDS, alloc_conf=""))
        rows.append(spec("share", "open", "vmm", "-", 1, words=SHARED_WORDS,
                         alloc_conf="expandable_segments:True"))
    return rows


def examples_dir() -> Path:
    return Path(os.environ.get("GPU_IPC_EXAMPLES_DIR", ROOT / "stage" / "bin"))


def command(role: str, kind: str, sock: str, r: dict[str, Any], host: bool) -> list[str]:
    if kind == "rust":
        common = ["--socket", sock, "--backend", r["backend"], "--json"]
        if role == "producer":
            from python_gpu_ends import HEIGHT, WIDTH

            return [str(examples_dir() / "producer"), *common, "--sync", r["sync"], "--slots", str(SLOTS),
                    "--frames", str(r["frames_asked"]), "--consumers", "1", "--width", str(WIDTH),
                    "--height", str(HEIGHT)]
        return [str(examples_dir() / "consumer"), *common, "--frames", "0", "--name", "rust"]
    if kind == "semaphore":
        mode = "sem-owner" if role == "producer" else "sem-peer"
        return [sys.executable, str(ENDS), mode, sock, r["backend"], str(r["frames_asked"])]
    if kind in ("share", "open"):
        mode = "share-owner" if kind == "share" else "open-reader"
        env = ["env", f"PYTORCH_CUDA_ALLOC_CONF={r['alloc_conf']}"] if r["alloc_conf"] else []
        return [*env, sys.executable, str(ENDS), mode, sock, r["backend"], str(r["words"])]
    if role == "producer":
        return [sys.executable, str(ENDS), "produce", sock, r["backend"], r["sync"], str(r["frames_asked"]), kind]
    return [sys.executable, str(ENDS), "consume", sock, r["backend"], str(r["frames_asked"]), kind]


def last_json(text: str) -> dict[str, Any] | None:
    for line in reversed(text.splitlines()):
        if line.startswith("{"):
            try:
                parsed: dict[str, Any] = json.loads(line)
                return parsed
            except json.JSONDecodeError:
                continue
    return None


def run_pair(
    commands: dict[str, list[str]], sock: str, cwd: str, timeout: float
) -> tuple[dict[str, int], dict[str, str]]:
    """Runs `commands["producer"]`, then `commands["consumer"]` once the producer listens at `sock` (so that the
    consumer's time from its attach counts no producer start-up); each is killed after `timeout` seconds. Returns
    their exit statuses and outputs (stdout and stderr together)."""
    files = {name: open(os.path.join(cwd, name + ".out"), "w+") for name in ("producer", "consumer")}
    procs = {"producer": subprocess.Popen(commands["producer"], cwd=cwd, stdout=files["producer"],
                                          stderr=subprocess.STDOUT, text=True)}
    deadline = time.monotonic() + 60
    while not os.path.exists(sock) and procs["producer"].poll() is None and time.monotonic() < deadline:
        time.sleep(0.01)
    procs["consumer"] = subprocess.Popen(commands["consumer"], cwd=cwd, stdout=files["consumer"],
                                         stderr=subprocess.STDOUT, text=True)
    exits, outs = {}, {}
    for name in ("consumer", "producer"):
        try:
            procs[name].wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            procs[name].kill()
            procs[name].wait()
            files[name].write(f"\n{name}: killed after {timeout} s\n")
        files[name].flush()
        files[name].seek(0)
        outs[name] = files[name].read()
        files[name].close()
        exits[name] = procs[name].returncode
    return exits, outs


def run_row(r: dict[str, Any], host: bool, log: Any) -> dict[str, Any]:
    row = dict(r)
    label = f"{r['producer']} -> {r['consumer']}, {r['backend']} {r['sync']}"
    for kind in (r["producer"], r["consumer"]):
        if kind == "rust" and not (examples_dir() / "producer").exists():
            return {**row, "ok": False, "error": f"no Rust examples in {examples_dir()} (scripts/stage-gpu.sh)"}
    with tempfile.TemporaryDirectory(prefix="gi-py-") as d:
        sock = os.path.join(d, "f.sock")
        commands = {role: command(role, r[role], sock, r, host) for role in ("producer", "consumer")}
        exits, outs = run_pair(commands, sock, d, PROCESS_TIMEOUT)
    for name in ("producer", "consumer"):
        row[f"{name}_exit"] = exits[name]
        log.write(f"== {label}: {name} (exit {exits[name]}): {' '.join(commands[name])}\n{outs[name]}\n")
    c, p = last_json(outs["consumer"]), last_json(outs["producer"])
    if c:
        row.update({k: v for k, v in c.items() if k not in ("role", "kind", "name", "backend", "sync")})
    if p:
        row["producer_fps"] = p["fps"]
        row["producer_cpu_us_per_frame"] = p["cpu_us_per_frame"]
        kept = ("stream_waits_released_by_posts", "kernels_after_posts", "share_ms", "backend_chosen",
                "reader_write_seen")
        row.update({k: v for k, v in p.items() if k in kept})
    errors = [line for o in outs.values() for line in o.splitlines()
              if not line.startswith("{") and ("Error" in line or "error" in line or "killed" in line)]
    for name in ("consumer", "producer"):  # else the last words of a process that failed
        said = [line for line in outs[name].splitlines() if line.strip() and not line.startswith("{")]
        if not errors and row.get(f"{name}_exit") != 0 and said:
            errors = [f"{name}: {said[-1]}"]
    row["error"] = errors[-1][:200] if errors else ""
    zero_copy = [v for k, v in row.items() if k.endswith("_is_the_frame")]
    checks = [row.get("consumer_exit") == 0, row.get("producer_exit") == 0, row.get("frames") == r["frames_asked"],
              row.get("mismatched_words") == 0]
    if r["consumer"] == "open":
        checks += [row.get("backend_chosen") == r["backend"], row.get("reader_write_seen") is True,
                   row.get("torch_from_dlpack_is_the_frame") is True]
    elif r["consumer"] == "semaphore":
        checks += [row.get("stream_waits_released_by_posts") is True,
                   row.get("kernels_after_posts") == r["frames_asked"]]
    elif r["consumer"] != "rust":
        checks += [bool(zero_copy) and all(zero_copy)]
        if r["consumer"] in ("torch", "torch-ops", "cupy", "numpy"):
            checks += [row.get("tensor_after_close_reads") is True]
    row["ok"] = all(checks)
    return row


def run(out: Path, which: str, host: bool) -> int:
    if host:
        os.environ["PY_GPU_HOST_DRY_RUN"] = "1"  # the ends use small frames too
    sys.path.insert(0, str(HERE))
    out.mkdir(parents=True, exist_ok=True)
    start = time.monotonic()
    with open(out / "python-package.log", "a") as log, open(out / ROWS_FILE, "a") as rows_file:
        for r in row_specs(which, host):
            if r["consumer"] == "jax" and host and not has_module("jax"):
                row = {**r, "ok": None, "error": "not run: jax is not installed here"}
            elif time.monotonic() - start > BUDGET[which]:
                row = {**r, "ok": False, "error": f"not run: the {which} set passed its {BUDGET[which]} s budget"}
            else:
                row = run_row(r, host, log)
            row["set"] = which
            print(json.dumps(row), flush=True)
            rows_file.write(json.dumps(row) + "\n")
            rows_file.flush()
        if which == "main" and not host:
            # Ctrl-C and SIGTERM against a torch consumer whose gpu-stream-ops waits a quiet producer never
            # satisfies (scripts/python_gpu_sigint.py): one row per case, within a budget of its own.
            import python_gpu_sigint as sigint

            for case in sigint.cases(host, budget=SIGINT_BUDGET):
                row = {"producer": "torch", "consumer": f"torch, {case['case']}, {case['signal']}",
                       "backend": case["backend"], "sync": case["sync"], "frames": sigint.PUBLISHED,
                       "ok": case["ok"], "error": f"signals: {sigint.note(case)}", "set": which}
                print(json.dumps(row), flush=True)
                rows_file.write(json.dumps(row) + "\n")
                rows_file.flush()
    return 0


def skip(out: Path, which: str, reason: str) -> int:
    out.mkdir(parents=True, exist_ok=True)
    with open(out / ROWS_FILE, "a") as rows_file:
        for r in row_specs(which, host=False):
            rows_file.write(json.dumps({**r, "set": which, "ok": None, "error": f"not run: {reason}"}) + "\n")
    return 0


def has_module(name: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(name) is not None


def environment() -> dict[str, str]:
    """Device, driver, date and commit of this run."""
    env = {"date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")}
    try:
        smi = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=30, check=True).stdout.splitlines()[0]
        env["device"], env["driver"] = (part.strip() for part in smi.split(",", 1))
    except (OSError, subprocess.SubprocessError, IndexError, ValueError):
        env["device"], env["driver"] = "no GPU (host backend dry run)", "-"
    staged = ROOT / "stage" / "COMMIT"
    if staged.exists():
        env["commit"] = staged.read_text().strip()[:12]
    else:
        git = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short=12", "HEAD"], capture_output=True,
                             text=True)
        env["commit"] = git.stdout.strip() or "unknown"
    return env


def comparison(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each Python consumer's FPS against the Rust consumer's, both from their attach, median over the rounds; the
    goal (0.9) is judged on the first kind, which does the Rust consumer's GPU work per frame."""
    rust = [r["fps"] for r in rows if r.get("compare_round") and r["consumer"] == "rust" and r.get("ok")]
    kinds = list(dict.fromkeys(r["consumer"] for r in rows if r.get("compare_round") and r["consumer"] != "rust"))
    out = []
    for i, kind in enumerate(kinds):
        mine = [r for r in rows if r.get("compare_round") and r["consumer"] == kind]
        python = [r["fps_from_attach"] for r in mine if r.get("ok")]
        if not rust or not python or len(python) < len(mine):
            return []  # a comparison row failed: nothing to compare
        ratio = statistics.median(python) / statistics.median(rust)
        out.append({"consumer": kind, "backend": mine[0]["backend"], "sync": mine[0]["sync"],
                    "frames": mine[0]["frames_asked"], "rust_fps": rust, "python_fps": python,
                    "rust_median": statistics.median(rust), "python_median": statistics.median(python),
                    "python_cpu_us_per_frame": statistics.median(r["cpu_us_per_frame"] for r in mine),
                    "ratio": ratio, "goal": 0.9 if i == 0 else None,
                    "meets_goal": ratio >= 0.9 if i == 0 else None})
    return out


def markdown(rows: list[dict[str, Any]], env: dict[str, str], cmp: list[dict[str, Any]],
             readme: dict[str, Any] | None) -> str:
    from python_gpu_ends import HEIGHT, WIDTH

    out = [f"# gpu_ipc (Python) on {env['device']}", "",
           f"Driver {env['driver']}, {env['date']}, commit `{env['commit']}`. {WIDTH}x{HEIGHT} RGB frames, {SLOTS} "
           "slots; each frame checked on the device against the Rust examples' pattern (mismatched 32-bit words); "
           "FPS of the consumer from its first frame (Rust consumers: from their attach); CPU time per frame from "
           "`time.process_time` (Python) or the process CPU clock (Rust) around the loop.", "",
           "| producer | consumer | backend | sync | frames | mismatched words | consumer FPS | consumer CPU us/frame "
           "| producer FPS | producer CPU us/frame | zero copy | tensor after close | ok | note |",
           "|---|---|---|---|---:|---:|---:|---:|---:|---:|---|---|---|---|"]
    for r in rows:
        zc = ", ".join(f"{k.removesuffix('_is_the_frame')}" for k, v in r.items() if k.endswith("_is_the_frame") and v)
        bad = [k.removesuffix("_is_the_frame") for k, v in r.items() if k.endswith("_is_the_frame") and not v]

        def num(key: str, fmt: str = "{:,.1f}") -> str:
            return fmt.format(r[key]) if isinstance(r.get(key), (int, float)) else "-"

        note = r.get("error", "").replace("|", "/")
        if r.get("compare_round"):
            note = f"comparison round {r['compare_round']}" + (f"; {note}" if note else "")
        if r["consumer"] == "semaphore":
            note = ("frames are round trips: CPU post, stream wait, kernel, stream post, CPU wait"
                    + (f"; {note}" if note else ""))
        if r["consumer"] == "open":
            conf = r.get("alloc_conf") or "default caching allocator"
            note = (f"a {r['words'] * 4 >> 20} MiB torch tensor ({conf}) shared in place, backend chosen "
                    f"{r.get('backend_chosen', '-')}, share {r.get('share_ms', 0):.1f} ms, open "
                    f"{r.get('open_ms', 0):.1f} ms, the reader's write seen by the owner: "
                    f"{r.get('reader_write_seen', '-')}" + (f"; {note}" if note else ""))
        ok = {True: "yes", False: "NO", None: "skipped"}[r.get("ok")]
        after = {True: "reads", None: "-"}.get(r.get("tensor_after_close_reads"), "NO")
        out.append(f"| {r['producer']} | {r['consumer']} | {r['backend']} | {r['sync']} | {r.get('frames', '-')} "
                   f"| {r.get('mismatched_words', '-')} | {num('fps')} | {num('cpu_us_per_frame')} "
                   f"| {num('producer_fps')} | {num('producer_cpu_us_per_frame')} "
                   f"| {(zc or '-') + (' (copied: ' + ', '.join(bad) + ')' if bad else '')} | {after} | {ok} "
                   f"| {note} |")
    out.append("")
    what = {"torch": "with the Rust consumer's check kernel (gpu_ipc.testing.Pattern) on its torch stream: the same "
                     "GPU work per frame",
            "torch-ops": "with a check in torch operations (XOR, compare, count: three passes over each frame)"}
    for c in cmp:
        goal = (f"goal >= {c['goal']}: {'met' if c['meets_goal'] else 'NOT met'}" if c["goal"] is not None
                else "not judged: more GPU work per frame than the Rust consumer's")
        out += [f"**{c['consumer']} consumer against the Rust consumer**, {what.get(c['consumer'], '')} (Rust "
                f"producer, {c['backend']} {c['sync']}, {c['frames']} frames, both timed from their attach, median "
                f"of {len(c['rust_fps'])} interleaved rounds): {c['python_median']:,.0f} FPS against "
                f"{c['rust_median']:,.0f}: **{c['ratio']:.3f}x** ({goal}); its CPU time "
                f"{c['python_cpu_us_per_frame']:.1f} us per frame.", ""]
    if not cmp:
        out += ["**Python consumer against the Rust consumer**: not measured (a comparison row failed).", ""]
    if readme:
        verdict = "ran as written" if readme.get("ok") else "did NOT run as written"
        out += [f"**The README's Python quick start** ({readme.get('readme', '-')}, producer and consumer as two "
                f"processes, in a fresh venv with the wheel installed by `pip install --no-index`): {verdict}: "
                f"producer exit {readme.get('producer_exit')}, consumer exit {readme.get('consumer_exit')}, "
                f"{readme.get('frames_printed')} frames printed of {readme.get('frames_expected')}, "
                f"{len(readme.get('wrong', []))} with a wrong mean, {readme.get('seconds', 0):.1f} s. "
                f"{readme.get('error', '')}".rstrip(), ""]
    return "\n".join(out)


def report(out: Path) -> int:
    sys.path.insert(0, str(HERE))
    rows_path = out / ROWS_FILE
    lines = rows_path.read_text().splitlines() if rows_path.exists() else []
    rows = [json.loads(line) for line in lines if line.strip()]
    if any(r["backend"] == "host" for r in rows):
        os.environ["PY_GPU_HOST_DRY_RUN"] = "1"
    readme_path = out / "readme-example.json"
    readme = json.loads(readme_path.read_text()) if readme_path.exists() else None
    env = environment()
    cmp = comparison(rows)
    (out / "python-package.json").write_text(json.dumps({**env, "rows": rows, "comparison": cmp,
                                                         "readme_example": readme}, indent=2) + "\n")
    table = markdown(rows, env, cmp, readme)
    (out / "python-package.md").write_text(table)
    print(table)
    failed = [r for r in rows if r.get("ok") is False]
    return 0 if rows and not failed and cmp and (readme is None or readme.get("ok")) else 1


def main() -> int:
    args = sys.argv[1:]
    if len(args) < 2 or args[0] not in ("run", "skip", "report"):
        print(__doc__, file=sys.stderr)
        return 2
    mode, out = args[0], Path(args[1])
    which = args[args.index("--set") + 1] if "--set" in args else "main"
    if mode == "run":
        return run(out, which, "--host" in args)
    if mode == "skip":
        return skip(out, which, args[args.index("--reason") + 1] if "--reason" in args else "skipped")
    return report(out)


if __name__ == "__main__":
    sys.exit(main())
