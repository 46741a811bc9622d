"""A Python consumer in its own process (for the SIGKILL test): prints `attached`, then `frame SEQ` per frame."""

import sys

import numpy as np

import gpu_ipc

sock = sys.argv[1]
with gpu_ipc.Consumer(sock, backend="host", name="victim", wait_for_producer=10) as consumer:
    print("attached", flush=True)
    for frame in consumer:
        np.from_dlpack(frame).sum()
        print("frame", frame.seq, flush=True)
