"""GPU_IPC_LOG: the library's log on stderr when asked for (a filter as RUST_LOG takes it), nothing otherwise."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ATTACH = """
import sys, gpu_ipc
sock = sys.argv[1]
with gpu_ipc.SharedPool(sock, backend="host", capacity=1 << 20) as pool:
    pool.alloc("a", [16])
    with gpu_ipc.PoolImporter(sock, backend="host") as importer:
        assert importer.names() == ["a"]
print("done")
"""


def run(tmp_path: Path, log: str | None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("GPU_IPC_LOG", "RUST_LOG")}
    if log is not None:
        env["GPU_IPC_LOG"] = log
    return subprocess.run(
        [sys.executable, "-c", ATTACH, str(tmp_path / "pool.sock")],
        capture_output=True, text=True, timeout=60, env=env, check=False,
    )


def test_debug_log_names_the_attach_and_the_block_import(tmp_path: Path) -> None:
    done = run(tmp_path, "debug")
    assert done.returncode == 0, done.stderr
    assert "attached to a pool" in done.stderr
    assert "DEBUG" in done.stderr


def test_a_filter_by_crate_keeps_only_that_crate(tmp_path: Path) -> None:
    done = run(tmp_path, "ipc_core=debug")
    assert done.returncode == 0, done.stderr
    assert "ClientHello" in done.stderr  # ipc_core's wire log
    assert "attached to a pool" not in done.stderr  # ipc_toolkit's


def test_no_log_unless_asked(tmp_path: Path) -> None:
    done = run(tmp_path, None)
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""


def test_a_malformed_filter_is_said_once_and_ignored(tmp_path: Path) -> None:
    done = run(tmp_path, "ipc_core=[")
    assert done.returncode == 0, done.stderr
    assert done.stderr.count("GPU_IPC_LOG") == 1
    assert "ignored" in done.stderr
