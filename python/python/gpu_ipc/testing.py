"""Helpers to test a pipeline built on gpu_ipc against the Rust example programs, word for word.

:class:`Pattern` writes and checks the pattern every frame of the Rust ``producer`` and ``consumer`` carries, with
the same embedded kernels they launch (on the caller's stream, no CPU synchronisation per frame), or on the CPU with
the host backend. A Python producer filling slots with ``Pattern.fill`` feeds a Rust ``consumer``; a Python
consumer checking frames with ``Pattern.verify`` reads a Rust ``producer``; and a Python end checked this way does
the same GPU work per frame as the Rust one, so their speeds compare.

Example, a consumer that checks every frame of a Rust producer's ring::

    import gpu_ipc
    from gpu_ipc.testing import Pattern

    check = Pattern()
    with gpu_ipc.Consumer("/tmp/frames.sock", backend="vmm", wait_for_producer=10) as consumer:
        for frame in consumer:
            check.verify(frame)
    assert check.mismatches() == 0
"""

from gpu_ipc._gpu_ipc import Pattern

__all__ = ["Pattern"]
