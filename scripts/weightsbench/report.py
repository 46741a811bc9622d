"""The benchmark's report: OUT_DIR/weights.md from the rows, with the goals beside the figures (met or not)."""

from __future__ import annotations

import os
import subprocess
import time
from typing import TYPE_CHECKING, Any

from weightsbench.children import GIB, say

if TYPE_CHECKING:
    from weightsbench.rows import Run


def device_facts() -> dict[str, Any]:
    import torch

    props = torch.cuda.get_device_properties(0)
    commit = os.environ.get("GPU_IPC_COMMIT", "")  # the commit of the wheel under test, where the caller knows it
    for path in ("stage/COMMIT",) if not commit else ():
        if os.path.exists(path):
            commit = open(path).read().strip()
    if not commit:
        try:
            commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                                    check=False).stdout.strip()
        except OSError:
            commit = "unknown"
    return {"device": props.name, "memory_gib": round(props.total_memory / GIB, 1), "torch": torch.__version__,
            "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "commit": commit[:12]}


def _s(row: dict[str, Any] | None, key: str = "seconds") -> float:
    return float(row[key]) if row and key in row else float("nan")


def _range(row: dict[str, Any] | None) -> str:
    """` [min-max]` of a row's samples (fresh readers, `--cold-repeats`), empty for one sample."""
    samples = (row or {}).get("samples") or []
    return f" [{min(samples):.4f}-{max(samples):.4f}]" if len(samples) > 1 else ""


def _ratio(theirs: dict[str, Any] | None, ours: dict[str, Any] | None, digits: int) -> str:
    """theirs / ours of the medians, then the range every pairing of samples gives (worst: their fastest against
    our slowest)."""
    text = f"{_s(theirs) / _s(ours):.{digits}f}x"
    t, o = (theirs or {}).get("samples") or [], (ours or {}).get("samples") or []
    if len(t) > 1 or len(o) > 1:
        t, o = t or [_s(theirs)], o or [_s(ours)]
        text += f" ({min(t) / max(o):.{digits}f}-{max(t) / min(o):.{digits}f})"
    return text


def cold_table(rows: list[dict[str, Any]]) -> list[str]:
    lines = [
        "## A reader gets every tensor (cold: a fresh process, CUDA set up before the clock)",
        "",
        "gpu-ipc: `open()` then `tensors(torch)` (every tensor cut from one DLPack import of the arena); "
        "per-tensor: `open()` then `torch.from_dlpack` of each tensor's own view (the way before `tensors(torch)`). "
        "gpu-ipc, torch-mp and bucket: the median of `--cold-repeats` fresh readers [their range]; the ratios are "
        "of the medians (the range every pairing of samples gives, from their fastest against our slowest).",
        "",
        "| set | backend | tensors | GB | gpu-ipc s (open + cut) | per-tensor s | torch-mp s | bucket s | "
        "torch-mp / gpu-ipc | bucket / gpu-ipc | wrong |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    cold = [r for r in rows if r["part"] == "cold"]
    for key in sorted({(r["set"], r["backend"]) for r in cold}):
        by = {r["method"]: r for r in cold if (r["set"], r["backend"]) == key}
        g, p, m, b = by.get("gpu-ipc"), by.get("gpu-ipc-per-tensor"), by.get("torch-mp"), by.get("bucket")
        if not g:
            continue
        wrong = sum(r.get("wrong", 0) for r in by.values())
        lines.append(
            f"| {key[0]} | {key[1]} | {g['tensors']} | {g['bytes'] / 1e9:.1f} | "
            f"{_s(g):.4f} ({_s(g, 'open_seconds'):.4f} + {_s(g, 'tensors_seconds'):.4f}){_range(g)} | {_s(p):.4f} | "
            f"{_s(m):.4f}{_range(m)} | {_s(b):.4f}{_range(b)} | {_ratio(m, g, 1)} | {_ratio(b, g, 2)} | {wrong} |")
    lines += ["", "Goals: the ~19,000-tensor dict at least 20x faster than per-tensor handles "
              "(torch-mp / gpu-ipc >= 20) and no slower than the bucket (bucket / gpu-ipc >= 1).", ""]
    return lines


def switch_table(rows: list[dict[str, Any]]) -> list[str]:
    lines = ["## Moving to the next generation", "",
             "`update(state_dict)` of every tensor (the gather kernel, a launch per batch of up to 2,048 tensors, "
             "every tensor read and checked at each update) and `update(bound)` of sources `bind()` read once (a "
             "trainer's parameters, written in place between updates: nothing read per tensor, one launch of a table "
             "kept on the device per arena), against the goal's reference, one device-to-device memcpy of the same "
             "total bytes, and torch's own copy per tensor; each the best of 3 after the arenas' first use (first: "
             "the first update, into a new arena; bind: reading the sources once); bound: the best of the last 6 of "
             "12 bound updates, once each source had met each arena (bound, first use of an arena: the best of the "
             "others, which prepare the table). Queued: another update of the same bytes timed in two parts, the CPU reading every "
             "tensor and queueing its copies (when it is near the whole update, the CPU, not the copy, sets the "
             "pace), of a whole update of that run.", "",
             "| set | backend | update s | bound s | one memcpy s | update / memcpy | bound / memcpy | bind s | "
             "bound, first use s | first s | torch per-tensor copy s | queued s (of s) | reader refresh + cut s | wrong |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in (r for r in rows if r["part"] == "switch"):
        lines.append(
            f"| {r['set']} | {r['backend']} | {r['update_seconds']:.4f} | {_s(r, 'bound_update_seconds'):.4f} | "
            f"{r['torch_one_memcpy_seconds']:.4f} | {r['ratio_to_one_memcpy']:.2f} | "
            f"{_s(r, 'ratio_bound_to_one_memcpy'):.2f} | {_s(r, 'bind_seconds'):.4f} | "
            f"{_s(r, 'bound_first_use_seconds'):.4f} | {_s(r, 'first_update_seconds'):.4f} | {r['torch_copy_per_tensor_seconds']:.4f} | "
            f"{_s(r, 'update_queue_seconds'):.4f} ({_s(r, 'split_update_seconds'):.4f}) | "
            f"{r['reader_refresh_seconds']:.4f} | {r['wrong']} |")
    lines += ["", "A bound update in its parts (one more, timed by hand): staging the arena (CPU), launching the "
              "gather (CPU), the device finishing the copies, commit.", "",
              "| set | backend | stage s | launch s | copy s | commit s | tables prepared (bound updates) |",
              "|---|---|---:|---:|---:|---:|---:|"]
    for r in (r for r in rows if r["part"] == "switch"):
        lines.append(f"| {r['set']} | {r['backend']} | {_s(r, 'bound_stage_seconds'):.4f} | "
                     f"{_s(r, 'bound_queue_seconds'):.4f} | {_s(r, 'bound_copy_seconds'):.4f} | "
                     f"{_s(r, 'bound_commit_seconds'):.4f} | {r.get('bound_preparations', '-')} "
                     f"({r.get('bound_updates', '-')}) |")
    lines += ["", "The owner that makes its tensors in the arena, no copy: `stage(torch)` (the next arena's tensors, "
              "writable), the owner's own writes into them (`normal_` of every tensor, standing for a trainer's last "
              "step writing its outputs there), `commit()`; the switch is stage + commit. The same writes into "
              "private tensors say what the arena adds to them. Each the best of 3; the reader refreshed and checked "
              "every tensor after each.", "",
              "| set | backend | switch s (stage + commit) | stage s | commit s | switch / memcpy | owner's writes "
              "in the arena s | the same writes, private s | reader refresh + cut s | wrong |",
              "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in (r for r in rows if r["part"] == "switch-in-place"):
        lines.append(f"| {r['set']} | {r['backend']} | {r['switch_seconds']:.4f} | {r['stage_seconds']:.4f} | "
                     f"{r['commit_seconds']:.4f} | {r['ratio_to_one_memcpy']:.2f} | "
                     f"{r['owner_writes_in_arena_seconds']:.4f} | {r['owner_writes_private_seconds']:.4f} | "
                     f"{r['reader_refresh_seconds']:.4f} | {r['wrong']} |")
    lines += ["", "Goal: a generation switch within 1.1x of a device-to-device copy of the changed bytes "
              "(update / memcpy or bound / memcpy <= 1.1), or no copy where the owner allocates in the arena "
              "(the in-place table).", "", "## GPU memory given back after each part", "",
              "| set | backend | free before, GiB | free after, GiB | back |", "|---|---|---:|---:|---|"]
    for r in (r for r in rows if r["part"] == "memory"):
        lines.append(f"| {r['set']} | {r['backend']} | {r['free_start_gib']} | {r['free_end_gib']} | {r['back']} |")
    return lines + [""]


def report(run: Run, facts: dict[str, Any]) -> None:
    lines = [
        "# Model weights between processes (scripts/weights_bench.py)",
        "",
        f"{facts['device']} ({facts['memory_gib']} GiB), torch {facts['torch']}, {facts['date']}, commit "
        f"`{facts['commit']}`; command: `python scripts/weights_bench.py run OUT {' '.join(run.args.passthrough)}`"
        f" ({run.seconds():.0f} s).",
        "",
        *cold_table(run.rows),
        *switch_table(run.rows),
        "## Mixed generations", "", "| backend | switches | reader refreshes | generations seen | mixed |",
        "|---|---:|---:|---:|---:|",
    ]
    for r in (r for r in run.rows if r["part"] == "mixed"):
        lines.append(f"| {r['backend']} | {r['switches']} | {r['refreshes']} | {r['generations_seen']} | "
                     f"{r['mixed']} |")
    lines += ["", "## The owner SIGKILLed while a reader holds a generation", "",
              "| backend | reader in | trials | failed | told, median s | told, max s |",
              "|---|---|---:|---:|---:|---:|"]
    for r in (r for r in run.rows if r["part"] == "kills"):
        if "not_run" in r:
            lines.append(f"| {r['backend']} | {r['where']} | not run: {r['not_run']} | | | |")
        else:
            lines.append(f"| {r['backend']} | {r['where']} | {r['trials']} | {r['failed']} | "
                         f"{r['told_median_seconds']} | {r['told_max_seconds']} |")
    lines += ["", "A trial passes when the reader is told within 1 s, its tensors still read 7 everywhere, and the "
              "GPU's free memory it sees is back to its level before the owner started (within 16 MiB) once it "
              "closes.", "", f"Checks failed: {len(run.failures)}" + "".join(f"\n- {f}" for f in run.failures), ""]
    with open(os.path.join(run.out, "weights.md"), "w") as f:
        f.write("\n".join(lines))
    say("\n".join(lines))
