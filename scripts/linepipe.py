"""Lines between two processes of a GPU check script, each wait bounded.

`read_line(stream, timeout)` returns the next line another process wrote to `stream` (a pipe: a child's stdout, or
this process's stdin), or raises `TimeoutError` after `timeout` seconds and `EOFError` at its end. It reads the file
descriptor itself and keeps what it read past the line: `select()` on a buffered text stream waits for bytes the
stream may already hold (several lines sent at once are read into its buffer by the first `readline`, and the next
`select` then waits for ever). Use it for every read of a given stream; never mix it with the stream's own
`readline`/`read`.
"""

from __future__ import annotations

import os
import select
import time
from typing import IO, Any

_pending: dict[int, bytearray] = {}


def read_line(stream: IO[Any], timeout: float) -> str:
    """The next line from `stream` (stripped), or `TimeoutError` after `timeout` seconds, or `EOFError` at its end."""
    fd = stream.fileno()
    held = _pending.setdefault(fd, bytearray())
    deadline = time.monotonic() + timeout
    while b"\n" not in held:
        left = deadline - time.monotonic()
        ready, _, _ = select.select([fd], [], [], max(left, 0.0))
        if not ready:
            raise TimeoutError(f"no line within {timeout} s")
        chunk = os.read(fd, 1 << 16)
        if not chunk:
            if held:
                line = bytes(held)
                held.clear()
                return line.decode(errors="replace").strip()
            raise EOFError("the other process ended")
        held += chunk
    end = held.index(b"\n")
    line = bytes(held[:end])
    del held[: end + 1]
    return line.decode(errors="replace").strip()


def say(text: str) -> None:
    """Print one line at once (the other process waits for it)."""
    print(text, flush=True)


def forget(stream: IO[Any]) -> None:
    """Drops what was read past the last line of `stream` (call it when done with a pipe: its fd number may be
    reused by the next one)."""
    _pending.pop(stream.fileno(), None)
