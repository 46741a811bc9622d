"""What the weights' tests share (not a test module): a child Python process and its tagged lines, the count of CUDA
devices torch sees, and the stream wait checked against an owner in another process, for a set on one device and for
a set of parts."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from typing import Any

import gpu_ipc
import gpu_ipc.weights

# The owner: generation 1 of two tensors on cuda:0 (``argv[3]``, if given: the test-only ``_parts`` split, as JSON);
# "publish" on stdin publishes the next generation, "close" closes the set.
TORCH_OWNER = """
import json, sys, torch, gpu_ipc.weights
def weights(g):
    return {"w": torch.full((1024,), g, device="cuda:0"), "b": torch.full((8,), g, device="cuda:0")}
parts = json.loads(sys.argv[3]) if len(sys.argv) > 3 else None
pub = gpu_ipc.weights.publish(weights(1.0), "m", socket=sys.argv[1], backend=sys.argv[2], _parts=parts)
print("PUBLISHED", pub.generation, flush=True)
for line in sys.stdin:
    if line.strip() == "close":
        pub.close()
        print("CLOSED", flush=True)
    else:
        print("PUBLISHED", pub.update(weights(float(pub.generation + 1))), flush=True)
"""


def spawn(code: str, *args: str) -> subprocess.Popen[str]:
    """A child Python running ``code`` with ``args``, its stdin and stdout piped (text)."""
    return subprocess.Popen(
        [sys.executable, "-c", code, *args], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )


def expect(proc: subprocess.Popen[str], tag: str) -> list[str]:
    """The words after ``tag`` on the child's next line that starts with it (the child must not end first)."""
    assert proc.stdout is not None
    while True:
        line = proc.stdout.readline()
        assert line, f"the child ended before {tag}"
        if line.startswith(tag):
            return line.split()[1:]


def cuda_devices() -> int:
    """The CUDA devices torch sees (0 without torch or a GPU)."""
    try:
        import torch  # type: ignore[import-not-found, unused-ignore]
    except ImportError:
        return 0
    return int(torch.cuda.device_count()) if torch.cuda.is_available() else 0


def idle_within(stream: Any, seconds: float) -> bool:
    """Whether a torch stream has finished its work within ``seconds``."""
    deadline = time.monotonic() + seconds
    while not stream.query():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.0005)
    return True


def check_stream_waits(sock: str, backend: str, parts: dict[str, int] | None = None) -> None:
    """A torch stream of this process waits for generation 2 of the set another process owns (released by its
    publication), then for generation 3 (released as gone by the owner's close); the word read after each wait says
    which. The owner is another process: an owner's commit waits for its whole device, so in the reader's process it
    would wait for the very stream that waits for its publication."""
    import torch  # type: ignore[import-not-found, unused-ignore]

    args = [sock, backend] + ([json.dumps(parts)] if parts is not None else [])
    owner = spawn(TORCH_OWNER, *args)

    def tell(line: str) -> None:
        assert owner.stdin is not None
        owner.stdin.write(line + "\n")
        owner.stdin.flush()

    try:
        assert expect(owner, "PUBLISHED") == ["1"]
        r = gpu_ipc.weights.open(sock, "m")
        assert r.parts == (1 if parts is None else max(parts.values()) + 1)
        s = torch.cuda.Stream()
        wait = r.wait_on(2, stream=s)
        with torch.cuda.stream(s):
            seen = torch.from_dlpack(wait).clone()  # queued after the wait: the word as it released the stream
        assert not idle_within(s, 0.2), "the stream did not wait for generation 2"
        assert r.wait_status(wait) == ("waiting", 0)
        tell("publish")
        assert expect(owner, "PUBLISHED") == ["2"]
        assert idle_within(s, 1.0), "the publication did not release the stream"
        assert int(seen) == 2 and r.wait_status(wait) == ("published", 2)
        assert r.refresh() == 2
        target = {"w": torch.zeros(1024, device="cuda:0"), "b": torch.zeros(8, device="cuda:0")}
        r.load_into(target, stream={0: s} if parts is not None else s)
        s.synchronize()
        assert bool((target["w"] == 2.0).all()) and bool((target["b"] == 2.0).all())
        gone = r.wait_on(3, stream=s)
        with torch.cuda.stream(s):
            seen = torch.from_dlpack(gone).clone()
        assert not idle_within(s, 0.1)
        tell("close")
        expect(owner, "CLOSED")
        assert idle_within(s, 1.0), "the owner's end did not release the stream within a second"
        assert int(seen) == gpu_ipc.weights.GenerationWait.GONE_BIT | 2 and r.wait_status(gone) == ("gone", 2)
        r.close()
    finally:
        owner.kill()
