"""The GPU machine's harness (scripts/python-gpu.sh's Python steps), dry-run on the host backend: its rows, its
report, and the README quick-start runner, so that what the GPU machine runs is tested before it gets there."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from conftest import ROOT, example

SCRIPTS = ROOT / "scripts"

HOST_README = """# A README whose quick start runs on the host backend

## Quick start

```python
import numpy as np, gpu_ipc

with gpu_ipc.Producer("SOCK", width=64, height=32, slots=4, sync="cpu-spin", backend="host") as producer:
    producer.wait_for_consumers(1, timeout=30)
    for i in range(120):
        slot = producer.acquire(timeout=1.0)
        np.from_dlpack(slot)[:] = i % 256
        producer.publish(slot)
    producer.drain(timeout=10)
```

```python
import numpy as np, gpu_ipc

with gpu_ipc.Consumer("SOCK", backend="host", wait_for_producer=10) as consumer:
    for frame in consumer:
        print(frame.seq, np.from_dlpack(frame).astype(float).mean())
```

## Elsewhere

```python
raise SystemExit("not part of the quick start")
```
"""


def run_script(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=300,
                          env={**os.environ, **(env or {})})


def test_harness_rows_on_the_host_backend(tmp_path: Path) -> None:
    examples = str(Path(example("producer")).parent)
    example("consumer")
    env = {"GPU_IPC_EXAMPLES_DIR": examples, "PY_GPU_FRAMES": "60", "PY_GPU_COMPARE_FRAMES": "100",
           "PY_GPU_COMPARE_ROUNDS": "1"}
    ran = run_script(str(SCRIPTS / "python_gpu.py"), "run", str(tmp_path), "--host", env=env)
    assert ran.returncode == 0, ran.stderr
    rows = [json.loads(line) for line in (tmp_path / "python-package.rows.jsonl").read_text().splitlines()]
    pairs = {(r["producer"], r["consumer"]) for r in rows}
    assert {("numpy", "numpy"), ("rust", "rust"), ("rust", "numpy"), ("numpy", "rust")} <= pairs
    for r in rows:
        if r["consumer"] == "jax" and r["ok"] is None:
            continue  # JAX is not installed in the test venv
        assert r["ok"], r
        assert r["mismatched_words"] == 0 and r["frames"] == r["frames_asked"]
    python_rows = [r for r in rows if r["consumer"] == "numpy"]
    assert all(r["numpy_from_dlpack_is_the_frame"] and r["tensor_after_close_reads"] for r in python_rows)
    assert all(r["cpu_us_per_frame"] > 0 and r["producer_cpu_us_per_frame"] > 0 for r in python_rows)

    reported = run_script(str(SCRIPTS / "python_gpu.py"), "report", str(tmp_path), env=env)
    assert reported.returncode == 0, reported.stdout + reported.stderr
    summary = json.loads((tmp_path / "python-package.json").read_text())
    assert summary["comparison"][0]["consumer"] == "numpy" and summary["comparison"][0]["ratio"] > 0
    table = (tmp_path / "python-package.md").read_text()
    assert "| rust | numpy | host | cpu-spin |" in table and "against the Rust consumer" in table


def test_readme_runner_runs_the_quick_start_blocks(tmp_path: Path) -> None:
    readme = tmp_path / "README.md"
    readme.write_text(HOST_README.replace("SOCK", str(tmp_path / "f.sock")))
    ran = run_script(str(SCRIPTS / "python_readme.py"), str(readme), str(tmp_path / "out"))
    assert ran.returncode == 0, ran.stdout + ran.stderr
    result = json.loads((tmp_path / "out" / "readme-example.json").read_text())
    assert result["ok"] and result["frames_printed"] == 120 == result["frames_expected"] and result["wrong"] == []
    assert (tmp_path / "out" / "readme" / "consumer.py").read_text().startswith("import numpy as np, gpu_ipc")


def test_readme_runner_finds_a_wrong_frame(tmp_path: Path) -> None:
    readme = tmp_path / "README.md"
    # A consumer that prints a frame it did not get: the check must say so.
    text = HOST_README.replace("SOCK", str(tmp_path / "f.sock")).replace(
        "        print(frame.seq, np.from_dlpack(frame).astype(float).mean())",
        "        print(frame.seq, np.from_dlpack(frame).astype(float).mean())\n    print(120, 7.0)",
    )
    readme.write_text(text)
    ran = run_script(str(SCRIPTS / "python_readme.py"), str(readme), str(tmp_path / "out"))
    assert ran.returncode == 1
    result = json.loads((tmp_path / "out" / "readme-example.json").read_text())
    assert not result["ok"] and result["wrong"] == ["120 7.0"]


def test_the_package_readme_has_a_runnable_quick_start() -> None:
    sys.path.insert(0, str(SCRIPTS))
    try:
        from python_readme import quick_start_blocks  # type: ignore[import-not-found]
    finally:
        sys.path.remove(str(SCRIPTS))
    blocks = quick_start_blocks((ROOT / "python" / "README.md").read_text())
    for code in blocks.values():
        compile(code, "README.md", "exec")  # valid Python as written
    assert "range(1000)" in blocks["producer"] and "for frame in consumer" in blocks["consumer"]
