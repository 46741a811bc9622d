"""scripts/python_gpu_speed.py (what scripts/python-gpu-speed.sh runs on the GPU machine), dry-run on the host
backend: its three sections (the package's cost per call both ways, a Python consumer against the Rust consumer,
the stamp check after a producer SIGKILL both ways) run, check what they should, and make their table."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from conftest import ROOT, example

SCRIPTS = ROOT / "scripts"


def test_speed_harness_on_the_host_backend(tmp_path: Path) -> None:
    examples = str(Path(example("producer")).parent)
    example("consumer")
    example("consumer_overhead")
    ran = subprocess.run(
        [sys.executable, str(SCRIPTS / "python_gpu_speed.py"), "run", str(tmp_path), "--host", "--frames", "400",
         "--compare-frames", "200", "--compare-rounds", "1"],
        capture_output=True, text=True, timeout=300, env={**os.environ, "GPU_IPC_EXAMPLES_DIR": examples})
    assert ran.returncode == 0, ran.stdout[-3000:] + ran.stderr[-3000:]
    rows = json.loads((tmp_path / "python-speed.json").read_text())
    assert all(r["ok"] for r in rows), [r for r in rows if not r["ok"]]

    [overhead] = [r for r in rows if r["check"] == "overhead"]
    assert overhead["array"] == "numpy" and overhead["cached_is_the_frame"] is True
    for phase in ("next_frame", "view", "view_cached", "release", "loop_dlpack", "loop_cached", "stamp_check_cached"):
        assert overhead[f"{phase}_cpu_us"] > 0, phase
    assert overhead["rust_next_frame_cpu_us"] > 0 and overhead["rust_release_cpu_us"] > 0

    compared = [r for r in rows if r["check"] == "compare"]
    assert {r["consumer"] for r in compared} == {"rust", "numpy-array", "numpy"}
    for r in compared:
        assert r["mismatched_words"] == 0 and r["frames"] == r["frames_asked"] == 200, r
    assert all(r["numpy_array_is_the_frame"] for r in compared if r["consumer"] == "numpy-array")
    ratios = [r for r in rows if r["check"] == "ratio"]
    assert [r["consumer"] for r in ratios] == ["numpy-array", "numpy"]  # the goal is judged on the cached array
    assert ratios[0]["goal"] == 0.9 and ratios[0]["ratio"] > 0 and ratios[1]["goal"] is None

    kills = [r for r in rows if r["check"] == "kill"]
    assert {r["path"] for r in kills} == {"array", "from_dlpack"}
    for r in kills:
        assert r["valid_but_wrong"] == 0 and r["valid_past_kill"] == 0 and r["judged_valid"] == r["kill_after"], r

    table = (tmp_path / "python-speed.md").read_text()
    assert "| host | cpu-spin | 640x360 | numpy |" in table
    assert "| host | cpu-spin | numpy-array | 200 |" in table and "| host | cpu-spin | array | 300 |" in table
