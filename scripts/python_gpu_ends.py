"""The two ends of a row of scripts/python_gpu.py: a Python producer or consumer of gpu_ipc, one per process.

    python scripts/python_gpu_ends.py produce SOCK BACKEND SYNC FRAMES torch|numpy
    python scripts/python_gpu_ends.py consume SOCK BACKEND FRAMES torch|torch-array|torch-ops|cupy|jax|numpy|numpy-array
    python scripts/python_gpu_ends.py sem-owner SOCK BACKEND ROUNDS      (torch; SOCK and SOCK.pong)
    python scripts/python_gpu_ends.py sem-peer SOCK BACKEND ROUNDS
    python scripts/python_gpu_ends.py share-owner SOCK EXPECTED_BACKEND WORDS   (torch; SOCK.done: a semaphore)
    python scripts/python_gpu_ends.py open-reader SOCK EXPECTED_BACKEND WORDS

Every frame carries the pattern of the Rust example programs (`kernels/src/pattern.rs`), so a Python end and a Rust
`producer` or `consumer` check each other word for word: word i of frame s is `mix(i * 0x9E3779B1 ^ s * 0x85EBCA6B ^
0xA5A5A5A5)` (32-bit arithmetic), where `mix(x) = x ^ (x >> 16)`. `mix` is linear over XOR, so the frame is
`base ^ key(s)` with `base[i] = mix(i * 0x9E3779B1)` computed once and `key(s)` one 32-bit number: a producer writes
a frame with one XOR kernel, a consumer checks it with one pass on the GPU (torch: the Rust consumer's own kernel
through `gpu_ipc.testing.Pattern` on the torch stream, or `torch-ops`: XOR, compare, count; CuPy: the same kernel
compiled by CuPy; JAX: one jitted function), and the mismatched words of each frame stay on the GPU
until the end (no CPU synchronisation per frame). Frames queued past the end of the stream are not counted.

Each process prints one JSON line: FPS (a consumer also from its attach, as the Rust consumer counts), CPU time per
frame (`time.process_time` around the loop), mismatched words, and the zero-copy checks of its first frame.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import time
from typing import Any

WIDTH, HEIGHT = (64, 32) if os.environ.get("PY_GPU_HOST_DRY_RUN") else (3840, 2160)
SLOTS = 4
INDEX_MUL, SEQ_MUL, SALT, MASK = 0x9E3779B1, 0x85EBCA6B, 0xA5A5A5A5, 0xFFFFFFFF
WORDS = WIDTH * HEIGHT * 3 // 4  # rgb8 rows of 3 * WIDTH bytes: a multiple of 4 for every size used here

# The Rust consumer's check (`gpu_ipc::kernels::pattern`, as in examples/src/bin/cudarc_frames.rs), for CuPy.
CHECK_KERNEL = r"""
extern "C" __global__ void check_frame(const unsigned int* words, unsigned long long n, unsigned long long seq,
                                       unsigned long long* mismatches) {
    unsigned long long bad = 0;
    for (unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x; i < n;
         i += (unsigned long long)gridDim.x * blockDim.x) {
        unsigned int x = ((unsigned int)i * 0x9E3779B1u) ^ ((unsigned int)seq * 0x85EBCA6Bu) ^ 0xA5A5A5A5u;
        bad += words[i] != (x ^ (x >> 16));
    }
    for (int offset = 16; offset > 0; offset >>= 1) bad += __shfl_down_sync(0xffffffffu, bad, offset);
    if ((threadIdx.x & 31) == 0 && bad != 0) atomicAdd(mismatches + seq, bad);
}
"""


def key(seq: int) -> int:
    """The 32-bit number frame `seq`'s words are XORed with."""
    x = ((seq * SEQ_MUL) & MASK) ^ SALT
    return x ^ (x >> 16)


def signed(word: int) -> int:
    """A 32-bit word as int32 (torch has no full uint32 arithmetic)."""
    return word - (1 << 32) if word >= 1 << 31 else word


def base_words(n: int) -> Any:
    """`base[i] = mix(i * 0x9E3779B1)` as a NumPy uint32 array (frame s is `base ^ key(s)`)."""
    import numpy as np

    a = np.arange(n, dtype=np.uint32) * np.uint32(INDEX_MUL)  # wraps modulo 2^32
    return a ^ (a >> np.uint32(16))


def produce(sock: str, backend: str, sync: str, frames: int, kind: str) -> dict[str, Any]:
    import gpu_ipc

    if kind == "torch":
        import torch

        dev = torch.device("cuda:0")
        base: Any = torch.from_numpy(base_words(WORDS).view("int32")).to(dev)
        stream: Any = torch.cuda.Stream(dev)
        context: Any = torch.cuda.stream(stream)

        def fill(slot: Any) -> None:  # one kernel, in place, on `stream`
            torch.bitwise_xor(base, signed(key(slot.seq)), out=torch.from_dlpack(slot).view(-1).view(torch.int32))
    else:
        import numpy as np

        base = base_words(WORDS)
        stream, context = None, contextlib.nullcontext()

        def fill(slot: Any) -> None:
            np.bitwise_xor(base, np.uint32(key(slot.seq)), out=np.from_dlpack(slot).reshape(-1).view(np.uint32))

    with context, gpu_ipc.Producer(sock, width=WIDTH, height=HEIGHT, slots=SLOTS, sync=sync,
                                   backend=backend) as producer:
        producer.wait_for_consumers(1, timeout=60)
        t0, cpu0 = time.perf_counter(), time.process_time()
        for _ in range(frames):
            slot = producer.acquire(timeout=10, stream=stream)
            fill(slot)
            producer.publish(slot, stream=stream)
        producer.drain(timeout=30, stream=stream)
        wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
        lost = producer.consumers_lost()
    return {"role": "producer", "kind": kind, "frames": frames, "fps": frames / wall,
            "cpu_us_per_frame": cpu * 1e6 / frames, "consumers_lost": lost}


class Check:
    """How one library reads a frame in place and counts its mismatched words on the device."""

    stream: Any = None
    context: Any = contextlib.nullcontext()

    def __init__(self, frames: int) -> None:
        self.counts: list[tuple[int, Any]] = []

    def frame(self, frame: Any) -> None:
        """Queues the count of frame's mismatched words."""
        raise NotImplementedError

    def zero_copy(self, frame: Any) -> dict[str, bool]:
        raise NotImplementedError

    def keep(self, frame: Any) -> Any:
        """A tensor of `frame` kept past the consumer's close (None: not checked with this library)."""
        return None

    def total(self, published: int) -> int:
        """Mismatched words of the frames below `published` (waits for the device)."""
        return sum(int(c) for seq, c in self.counts if seq < published)

    def after_close(self, kept: Any) -> dict[str, Any]:
        """Reads `kept` (a tensor of the first frame) after the consumer closed: no fault, the mapping is kept."""
        return {}


class TorchCheck(Check):
    """A torch consumer checking each frame with the Rust consumer's own kernel (`gpu_ipc.testing.Pattern.verify`)
    on its torch stream: the same GPU work per frame as the Rust consumer, so the two compare; the frame is taken
    with `torch.from_dlpack` as a torch program would (no copy)."""

    def __init__(self, frames: int) -> None:
        import torch

        from gpu_ipc.testing import Pattern

        super().__init__(frames)
        self.torch = torch
        # One counter per frame, room for the frames a GPU-side wait queues past the end of the stream.
        self.pattern = Pattern(frames=frames + 4096)
        self.stream = torch.cuda.Stream()  # on the current device (torch.cuda.set_device)
        self.context = torch.cuda.stream(self.stream)

    def keep(self, frame: Any) -> Any:
        return self.torch.from_dlpack(frame)

    def frame(self, frame: Any) -> None:
        self.torch.from_dlpack(frame)  # the tensor a torch program works on, no copy
        self.pattern.verify(frame, stream=self.stream)

    def zero_copy(self, frame: Any) -> dict[str, bool]:
        return {"torch_from_dlpack_is_the_frame": self.torch.from_dlpack(frame).data_ptr() == frame.ptr}

    def total(self, published: int) -> int:
        return int(self.pattern.mismatches(below=published))  # frames queued past the end were never written

    def after_close(self, kept: Any) -> dict[str, Any]:
        return TorchOpsCheck.after_close(self, kept)  # type: ignore[arg-type]


class TorchArrayCheck(TorchCheck):
    """TorchCheck taking each frame's tensor with `frame.array("torch")` (the slot's tensor, made once) instead of
    `torch.from_dlpack(frame)`: the same GPU work per frame (scripts/python_gpu_speed.py compares the two)."""

    def keep(self, frame: Any) -> Any:
        return frame.array("torch")

    def frame(self, frame: Any) -> None:
        frame.array("torch")  # the tensor a torch program works on, no copy
        self.pattern.verify(frame, stream=self.stream)

    def zero_copy(self, frame: Any) -> dict[str, bool]:
        return {"torch_array_is_the_frame": frame.array("torch").data_ptr() == frame.ptr}


class TorchOpsCheck(Check):
    """A check written with torch's own operations: XOR, compare, count (three passes over the frame, twice the
    memory traffic of one fused kernel, and a 24 MB tensor written per frame)."""

    def __init__(self, frames: int) -> None:
        import torch

        super().__init__(frames)
        self.torch = torch
        dev = torch.device("cuda:0")
        self.base = torch.from_numpy(base_words(WORDS).view("int32")).to(dev)
        self.xored = torch.empty_like(self.base)
        self.bad = torch.empty(WORDS, dtype=torch.bool, device=dev)
        self.stream = torch.cuda.Stream(dev)
        self.context = torch.cuda.stream(self.stream)
        with self.context:  # load the kernels before the clock starts
            torch.bitwise_xor(self.base, self.base, out=self.xored)
            torch.ne(self.xored, 0, out=self.bad)
            torch.count_nonzero(self.bad)
        self.stream.synchronize()

    def keep(self, frame: Any) -> Any:
        return self.torch.from_dlpack(frame)

    def frame(self, frame: Any) -> None:
        t = self.torch
        words = t.from_dlpack(frame).view(-1).view(t.int32)
        t.bitwise_xor(words, self.base, out=self.xored)
        t.ne(self.xored, signed(key(frame.seq)), out=self.bad)
        self.counts.append((frame.seq, t.count_nonzero(self.bad)))

    def zero_copy(self, frame: Any) -> dict[str, bool]:
        return {"torch_from_dlpack_is_the_frame": self.torch.from_dlpack(frame).data_ptr() == frame.ptr}

    def total(self, published: int) -> int:
        self.stream.synchronize()
        kept = [c for seq, c in self.counts if seq < published]
        return int(self.torch.stack(kept).sum().item()) if kept else 0

    def after_close(self, kept: Any) -> dict[str, Any]:
        t = self.torch
        with t.cuda.stream(self.stream):
            int(kept.view(-1)[: 1 << 20].sum().item())  # any value: the slot is the producer's
        t.cuda.synchronize()  # an unmapped read would have faulted here (illegal address)
        return {"tensor_after_close_reads": True}


class CupyCheck(Check):
    def __init__(self, frames: int) -> None:
        import cupy as cp

        super().__init__(frames)
        self.cp = cp
        self.kernel = cp.RawKernel(CHECK_KERNEL, "check_frame")
        self.mismatches = cp.zeros(frames + 64, dtype=cp.uint64)
        self.stream = cp.cuda.Stream(non_blocking=True)
        self.context = self.stream
        self.grid = (min((WORDS + 255) // 256, 1024),)
        with self.stream:  # compile (NVRTC) before the clock starts
            self.kernel((1,), (32,), (cp.zeros(1, dtype=cp.uint32), cp.uint64(0), cp.uint64(0), self.mismatches))
        self.stream.synchronize()
        self.mismatches.fill(0)

    def frame(self, frame: Any) -> None:
        cp = self.cp
        words = cp.from_dlpack(frame).reshape(-1).view(cp.uint32)
        self.kernel(self.grid, (256,), (words, cp.uint64(WORDS), cp.uint64(frame.seq), self.mismatches))

    def zero_copy(self, frame: Any) -> dict[str, bool]:
        return {
            "cupy_from_dlpack_is_the_frame": self.cp.from_dlpack(frame).data.ptr == frame.ptr,
            "cupy_cuda_array_interface_is_the_frame": self.cp.asarray(frame).data.ptr == frame.ptr,
        }

    def total(self, published: int) -> int:
        self.stream.synchronize()
        return int(self.mismatches[:published].sum())

    def keep(self, frame: Any) -> Any:
        return self.cp.from_dlpack(frame)

    def after_close(self, kept: Any) -> dict[str, Any]:
        with self.stream:
            int(kept.reshape(-1)[: 1 << 20].sum())
        self.cp.cuda.Device().synchronize()  # an unmapped read would have faulted here (illegal address)
        return {"tensor_after_close_reads": True}


class JaxCheck(Check):
    def __init__(self, frames: int) -> None:
        os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")  # the producer's process needs memory too
        import jax
        import jax.dlpack
        import jax.numpy as jnp
        import numpy as np

        super().__init__(frames)
        self.jax, self.np = jax, np
        self.base = jnp.asarray(base_words(WORDS))

        @jax.jit
        def mismatched(x: Any, base: Any, k: Any) -> Any:
            words = jax.lax.bitcast_convert_type(x.reshape(-1, 4), jnp.uint32)
            return jnp.count_nonzero((words ^ base) != k)

        self.mismatched = mismatched
        # Compile before the clock starts.
        mismatched(jnp.zeros((HEIGHT, WIDTH, 3), jnp.uint8), self.base, np.uint32(0)).block_until_ready()

    def frame(self, frame: Any) -> None:
        x = self.jax.dlpack.from_dlpack(frame)  # JAX names its stream: the frame's release waits for it too
        bad = self.mismatched(x, self.base, self.np.uint32(key(frame.seq)))
        # JAX queues its work on its own streams: wait until it read the frame before releasing it.
        bad.block_until_ready()
        self.counts.append((frame.seq, bad))

    def zero_copy(self, frame: Any) -> dict[str, bool]:
        return {"jax_from_dlpack_is_the_frame": self.jax.dlpack.from_dlpack(frame).unsafe_buffer_pointer() == frame.ptr}


class NumpyCheck(Check):
    def __init__(self, frames: int) -> None:
        import numpy as np

        super().__init__(frames)
        self.np = np
        self.base = base_words(WORDS)

    def frame(self, frame: Any) -> None:
        np = self.np
        words = np.from_dlpack(frame).reshape(-1).view(np.uint32)
        self.counts.append((frame.seq, np.count_nonzero((words ^ self.base) != np.uint32(key(frame.seq)))))

    def zero_copy(self, frame: Any) -> dict[str, bool]:
        return {"numpy_from_dlpack_is_the_frame": self.np.from_dlpack(frame).ctypes.data == frame.ptr}

    def keep(self, frame: Any) -> Any:
        return self.np.from_dlpack(frame)

    def after_close(self, kept: Any) -> dict[str, Any]:
        int(kept.sum())
        return {"tensor_after_close_reads": True}


class NumpyArrayCheck(NumpyCheck):
    """NumpyCheck reading each frame through `frame.array("numpy")` (the slot's array, made once)."""

    def frame(self, frame: Any) -> None:
        np = self.np
        words = frame.array("numpy").reshape(-1).view(np.uint32)
        self.counts.append((frame.seq, np.count_nonzero((words ^ self.base) != np.uint32(key(frame.seq)))))

    def zero_copy(self, frame: Any) -> dict[str, bool]:
        return {"numpy_array_is_the_frame": frame.array("numpy").ctypes.data == frame.ptr}

    def keep(self, frame: Any) -> Any:
        return frame.array("numpy")


CHECKS = {"torch": TorchCheck, "torch-array": TorchArrayCheck, "torch-ops": TorchOpsCheck, "cupy": CupyCheck,
          "jax": JaxCheck, "numpy": NumpyCheck, "numpy-array": NumpyArrayCheck}


def consume(sock: str, backend: str, frames: int, kind: str) -> dict[str, Any]:
    import gpu_ipc

    check = CHECKS[kind](frames)
    read, published, zero_copy = 0, -1, {}
    kept: Any = None
    frame: Any = None
    t0 = cpu0 = 0.0
    attach = time.perf_counter()
    with check.context, gpu_ipc.Consumer(sock, backend=backend, name=kind, wait_for_producer=60,
                                         timeout=30) as consumer:
        while True:
            try:
                frame = consumer.next_frame(timeout=10, stream=check.stream)
            except gpu_ipc.EndOfStream as end:
                published = end.published
                break
            if read == 0:
                t0, cpu0 = time.perf_counter(), time.process_time()
                zero_copy = check.zero_copy(frame)
                kept = check.keep(frame)  # read again after the consumer closed
            check.frame(frame)
            try:
                consumer.release(frame, stream=check.stream)
            except gpu_ipc.EndOfStream as end:  # a frame queued past the end: never written, not counted
                published = end.published
                break
            read += 1
        mismatched = check.total(published)
        end_time, cpu = time.perf_counter(), time.process_time() - cpu0
    after = check.after_close(kept) if kept is not None else {}
    del kept, frame
    read = min(read, published)
    return {"role": "consumer", "kind": kind, "frames": read, "published": published,
            "mismatched_words": mismatched, "fps": read / (end_time - t0) if read else 0.0,
            "fps_from_attach": read / (end_time - attach) if read else 0.0,
            "cpu_us_per_frame": cpu * 1e6 / max(read, 1), **zero_copy, **after}


def wait_idle(stream: Any, limit: float) -> None:
    """Waits (bounded, on the CPU) until `stream` has done its work."""
    deadline = time.monotonic() + limit
    while not stream.query():
        if time.monotonic() > deadline:
            raise TimeoutError(f"the stream's work did not finish within {limit} s")
        time.sleep(0.0002)


def semaphore_owner(sock: str, backend: str, rounds: int) -> dict[str, Any]:
    """Round trips with a peer process through two semaphores: the peer posts `ping` from the CPU, a torch stream
    waits for it (`wait_on`), runs a kernel, and posts `pong` from the stream, which the peer waits for on the CPU."""
    import torch

    import gpu_ipc

    dev = torch.device("cuda:0")
    ran = torch.zeros(rounds, dtype=torch.int64, device=dev)
    stream = torch.cuda.Stream(dev)
    with gpu_ipc.Semaphore.create(sock + ".pong", backend=backend) as pong, \
            gpu_ipc.Semaphore.create(sock, backend=backend) as ping:
        waits = []
        t0, cpu0 = time.perf_counter(), time.process_time()
        for i in range(rounds):
            waits.append(ping.wait_on(stream))
            with torch.cuda.stream(stream):
                ran[i].fill_(1)  # runs only once the peer's post came
            pong.post(1, stream=stream)
            if i % 8 == 7:  # at most 8 stream waits outstanding
                wait_idle(stream, 30)
        wait_idle(stream, 30)
        wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
        released = [ping.wait_status(w) for w in waits]
        deadline = time.monotonic() + 30
        while pong.value > 0 and time.monotonic() < deadline:  # the peer takes its last posts before we close
            time.sleep(0.001)
    return {"role": "producer", "kind": "semaphore", "frames": rounds, "fps": rounds / wall,
            "cpu_us_per_frame": cpu * 1e6 / rounds, "stream_waits_released_by_posts": all(released),
            "kernels_after_posts": int(ran.sum().item())}


def semaphore_peer(sock: str, backend: str, rounds: int) -> dict[str, Any]:
    import gpu_ipc

    with gpu_ipc.Semaphore(sock, backend=backend, name="ping", wait_for_owner=60) as ping, \
            gpu_ipc.Semaphore(sock + ".pong", backend=backend, name="pong", posts=False, wait_for_owner=60) as pong:
        t0, cpu0 = time.perf_counter(), time.process_time()
        for _ in range(rounds):
            ping.post()
            pong.wait(timeout=30)
        wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    return {"role": "consumer", "kind": "semaphore", "frames": rounds, "published": rounds, "mismatched_words": 0,
            "fps": rounds / wall, "cpu_us_per_frame": cpu * 1e6 / rounds, "round_trip_us": wall * 1e6 / rounds}


def share_owner(sock: str, expected: str, words: int) -> dict[str, Any]:
    """Shares a tensor PyTorch allocated itself (`gpu_ipc.share`, the backend chosen from its pointer), waits for the
    reader's semaphore post, and checks that the reader's write landed in the tensor: one memory, no copy."""
    import torch

    import gpu_ipc

    tensor = torch.arange(words, dtype=torch.int32, device="cuda:0")
    torch.cuda.synchronize()
    with gpu_ipc.Semaphore.create(sock + ".done", backend=expected) as done:
        t0 = time.perf_counter()
        shared = gpu_ipc.share(tensor, "tensor", socket=sock)
        share_ms = (time.perf_counter() - t0) * 1e3
        backend = gpu_ipc.sharing_backend(tensor)
        done.wait(timeout=60)  # the reader checked it, wrote word 0, and posted
        seen = int(tensor[0].item())
        shared.free()
    return {"role": "producer", "kind": "share", "frames": 1, "fps": 0.0, "cpu_us_per_frame": 0.0,
            "share_ms": share_ms, "backend_chosen": backend, "reader_write_seen": seen == -1,
            "alloc_conf": os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "")}


def open_reader(sock: str, expected: str, words: int) -> dict[str, Any]:
    """Opens the owner's tensor by name, reads it in place through torch.from_dlpack (checked on the GPU with one
    reduction), writes word 0, and posts the owner's semaphore."""
    import torch

    import gpu_ipc

    torch.zeros(1, device="cuda:0")  # CUDA up before the clock starts
    t0, cpu0 = time.perf_counter(), time.process_time()
    view = gpu_ipc.open(sock, "tensor", wait_for_owner=60)
    open_ms = (time.perf_counter() - t0) * 1e3
    x = torch.from_dlpack(view)
    expected_words = torch.arange(words, dtype=torch.int32, device=x.device)
    mismatched = int(torch.count_nonzero(x != expected_words).item())
    x[0] = -1
    torch.cuda.synchronize()
    cpu = time.process_time() - cpu0
    with gpu_ipc.Semaphore(sock + ".done", backend=expected, name="reader") as done:
        done.post()
    return {"role": "consumer", "kind": "open", "frames": 1, "published": 1, "mismatched_words": mismatched,
            "fps": 0.0, "cpu_us_per_frame": cpu * 1e6, "open_ms": open_ms, "shape": list(x.shape),
            "dtype": str(x.dtype), "torch_from_dlpack_is_the_frame": x.data_ptr() == view.ptr,
            "pool_backend": expected}


def main() -> int:
    mode, sock, backend = sys.argv[1], sys.argv[2], sys.argv[3]
    if mode == "produce":
        result = produce(sock, backend, sys.argv[4], int(sys.argv[5]), sys.argv[6])
    elif mode == "consume":
        result = consume(sock, backend, int(sys.argv[4]), sys.argv[5])
    elif mode == "sem-owner":
        result = semaphore_owner(sock, backend, int(sys.argv[4]))
    elif mode == "sem-peer":
        result = semaphore_peer(sock, backend, int(sys.argv[4]))
    elif mode == "share-owner":
        result = share_owner(sock, backend, int(sys.argv[4]))
    elif mode == "open-reader":
        result = open_reader(sock, backend, int(sys.argv[4]))
    else:
        print(__doc__, file=sys.stderr)
        return 2
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
