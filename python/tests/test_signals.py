"""Signals against a consumer whose producer has gone quiet (issue 30, item 5): Ctrl-C raises KeyboardInterrupt and
the process exits within a second, SIGTERM ends it within a second, a frame taken as Ctrl-C comes is given back.

The cases in their own processes are scripts/python_gpu_sigint.py's: run here on the host backend, and on a GPU
(torch, gpu-stream-ops, legacy and vmm) by the last test, or on the GPU machine by
`python scripts/python_gpu_sigint.py run OUT_DIR` (python/README.md, "Signals and exits")."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from conftest import ROOT, host_pair, publish_pattern

SCRIPT = ROOT / "scripts" / "python_gpu_sigint.py"


def test_a_frame_taken_as_ctrl_c_comes_is_given_back(sock: str) -> None:
    """Ctrl-C that comes while `next_frame` finds its frame: KeyboardInterrupt, and the frame goes back unread
    (before: it was handed out as the interrupt was raised, lost, and its one slot never freed for the producer)."""
    producer, consumer = host_pair(sock, slots=1)
    main = threading.main_thread().ident
    assert main is not None
    started = time.monotonic()

    def interrupt_then_publish() -> None:
        # Half way through a 50 ms slice of the consumer's wait: the signal and the frame reach the same slice.
        time.sleep(max(0.0, started + 0.325 - time.monotonic()))
        signal.pthread_kill(main, signal.SIGINT)
        publish_pattern(producer)

    helper = threading.Thread(target=interrupt_then_publish)
    helper.start()
    with pytest.raises(KeyboardInterrupt):
        consumer.next_frame(timeout=30)
    helper.join(10)
    assert time.monotonic() - started < 2
    assert consumer.next_sequence == 1, "the frame was taken (and given back), not left for the next call"
    # The one slot is free again: the producer writes the next frame into it, and the consumer reads that one.
    assert publish_pattern(producer, timeout=2) == 1
    with consumer.next_frame(timeout=5) as frame:
        assert frame.seq == 1
    producer.close()
    consumer.close()


def run_cases(tmp_path: Path, *args: str) -> list[dict[str, object]]:
    ran = subprocess.run([sys.executable, str(SCRIPT), "run", str(tmp_path), *args], capture_output=True,
                         text=True, timeout=600)
    rows: list[dict[str, object]] = json.loads((tmp_path / "python-sigint.json").read_text())
    assert ran.returncode == 0, [r for r in rows if not r["ok"]]
    return rows


def test_signals_stop_a_consumer_of_a_quiet_producer_within_a_second(tmp_path: Path) -> None:
    rows = run_cases(tmp_path, "--host")
    assert {(r["case"], r["signal"]) for r in rows} == {
        (case, sig) for case in ("next-frame", "iterate", "held") for sig in ("SIGINT", "SIGTERM")
    } | {("return", "none")}
    for r in rows:
        exit_s = r["exit_s"]
        assert isinstance(exit_s, float) and exit_s <= 1.0, r
        assert r["raised"] == (r["signal"] == "SIGINT"), r
    assert "| host | cpu-spin | next-frame | SIGINT | yes |" in (tmp_path / "python-sigint.md").read_text()


def cuda_available() -> bool:
    try:
        import torch  # type: ignore[import-not-found, unused-ignore]
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


@pytest.mark.skipif(not cuda_available(), reason="needs a GPU and torch: on the GPU machine run "
                    "`python scripts/python_gpu_sigint.py run OUT_DIR` (python/README.md, \"Signals and exits\")")
def test_gpu_side_waits_on_a_quiet_producer_do_not_hold_up_ctrl_c(tmp_path: Path) -> None:
    """torch consumers with gpu-stream-ops waits queued for a frame that never comes, legacy and vmm."""
    rows = run_cases(tmp_path)
    assert {r["backend"] for r in rows} == {"legacy", "vmm"}
    assert all(r["ok"] for r in rows)
