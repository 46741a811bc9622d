"""Runs the README's Python quick start as written: its producer and its consumer, two processes.

    python scripts/python_readme.py README OUT_DIR

Takes the ```python blocks of README's "## Quick start" section (the one that makes a `gpu_ipc.Producer`, the one
that makes a `gpu_ipc.Consumer`), writes them unchanged to OUT_DIR/readme/{producer,consumer}.py, starts the
producer, then the consumer once the producer's socket exists, and checks what the consumer printed: one line
`SEQ MEAN` per frame, SEQ = 0, 1, ... up to the producer's `range(N)`, MEAN = SEQ % 256 (the producer fills frame i
with i % 256). Writes OUT_DIR/readme-example.json and OUT_DIR/readme-example.log; exit status 0 when both processes
exit 0 and every line is right, 1 otherwise.
"""

from __future__ import annotations

import json
import re
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from python_gpu import run_pair

TIMEOUT = 180  # seconds, each process


def quick_start_blocks(readme: str) -> dict[str, str]:
    """The producer's and the consumer's code blocks of the "## Quick start" section."""
    section = readme.split("\n## Quick start", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```python\n(.*?)```", section, flags=re.S)
    found = {}
    for block in blocks:
        if "gpu_ipc.Producer(" in block:
            found["producer"] = block
        elif "gpu_ipc.Consumer(" in block:
            found["consumer"] = block
    if set(found) != {"producer", "consumer"}:
        raise ValueError(f"the quick start has {len(blocks)} python blocks; expected a producer's and a consumer's")
    return found


def check_output(text: str, frames: int) -> tuple[int, list[str]]:
    """Lines printed as `SEQ MEAN`, and those that are wrong (a sequence out of order, a mean not SEQ % 256)."""
    printed, wrong = 0, []
    for line in text.splitlines():
        parts = line.split()
        if len(parts) != 2 or not parts[0].isdigit():
            continue
        seq, mean = int(parts[0]), float(parts[1])
        if seq != printed or seq >= frames or abs(mean - seq % 256) > 1e-3:
            wrong.append(line)
        printed += 1
    return printed, wrong


def main() -> int:
    if len(sys.argv) != 3:
        print(__doc__, file=sys.stderr)
        return 2
    readme_path, out = Path(sys.argv[1]), Path(sys.argv[2])
    code = quick_start_blocks(readme_path.read_text())
    scripts = out / "readme"
    scripts.mkdir(parents=True, exist_ok=True)
    for name, block in code.items():
        (scripts / f"{name}.py").write_text(block)
    frames = int(re.findall(r"range\((\d+)\)", code["producer"])[0])
    sock = re.findall(r'"(/[^"]+\.sock)"', code["producer"])[0]
    result: dict[str, Any] = {"readme": str(readme_path), "frames_expected": frames, "socket": sock}
    start = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="gi-readme-") as cwd:
        commands = {name: [sys.executable, str(scripts / f"{name}.py")] for name in ("producer", "consumer")}
        exits, outs = run_pair(commands, sock, cwd, TIMEOUT)
    result.update({f"{name}_exit": exits[name] for name in exits})
    result["seconds"] = time.monotonic() - start
    printed, wrong = check_output(outs["consumer"], frames)
    result.update({"frames_printed": printed, "wrong": wrong[:10]})
    errors = [line for o in outs.values() for line in o.splitlines() if "Error" in line or "killed" in line]
    result["error"] = errors[-1][:200] if errors else ""
    result["ok"] = (result["producer_exit"] == 0 and result["consumer_exit"] == 0 and printed == frames
                    and not wrong)
    with open(out / "readme-example.log", "w") as log:
        for name in ("producer", "consumer"):
            log.write(f"== {name} (exit {result[f'{name}_exit']})\n{outs[name]}\n")
    (out / "readme-example.json").write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result), flush=True)
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
