"""Where a weight set's generation switch loses to one memcpy: the gather copy's variants on the benchmark's
mixture-of-experts state_dict (about 18,800 bf16 tensors, ~20 GB), each timed against torch's one flat copy of the
same bytes, in one process on one GPU.

    python tools/scripts/gather-variants.py OUT.json [--repeat 5] [--quick] [--only-bulk]

Sources are separate torch tensors (the trainer's parameters, as the caching allocator places them); the destination
is one flat buffer laid out as an arena (every tensor at a 256-byte boundary). Rows, each the best of --repeat
(wall time from a synchronized device to a synchronized device, the table already on the device):
  kernel <piece>/<threads>/<unroll>[/persistent]  the gather kernel (kernels/cuda/weights_gather.cu's loop, varied:
                      piece bytes, threads per block, 16-byte loads in flight per thread, a grid of one block per
                      piece or a persistent grid striding over pieces), compiled here with CuPy's NVRTC
  bulk (TMA) tSxC     Hopper's bulk copies (cp.async.bulk, sm_90+): one thread per block moves its piece through S
                      shared-memory stages of C bytes, global -> shared -> global
  hybrid              the tensors of at least 4, 16 or 64 MiB copied by torch's copy_ on a second stream while the
                      gather copies the rest (the copy engine beside the SMs)
  batch               cuMemcpyBatchAsync (the driver's batched copy, CUDA 12.8+), one call for every tensor, on a
                      stream of its own (it refuses the legacy default stream)
  flat                torch's copy_ of one flat buffer into another (the goal's reference)
  flat-kernel         the current kernel over the flat buffers cut in pieces (the kernel against the copy engine on
                      the same memory)
  per-tensor          torch's copy_ per tensor
Every row's destination is checked against its sources (a sum of 16-bit words per tensor) once; --only-bulk runs
the bulk, hybrid and reference rows only. Measured on an H200 on 2026-11-29 (docs/weights.md): every variant
11.3-11.8 ms for 22.4 GB against 10.5-10.6 ms for the flat copy.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import sys
import time
from typing import Any

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "scripts"))

import numpy as np  # noqa: E402
import torch  # noqa: E402

from weightsbench.shapes import moe_shapes  # noqa: E402

KERNEL = r"""
typedef unsigned long long u64;
template <int UNROLL>
__device__ __forceinline__ void piece(u64 dst, u64 src, u64 bytes) {
    uint4* __restrict__ d = (uint4*)dst;
    const uint4* __restrict__ s = (const uint4*)src;
    const u64 units = bytes / 16, stride = blockDim.x;
    u64 i = threadIdx.x;
    for (; i + (UNROLL - 1) * stride < units; i += UNROLL * stride) {
        uint4 v[UNROLL];
#pragma unroll
        for (int k = 0; k < UNROLL; k++) v[k] = __ldcs(s + i + k * stride);
#pragma unroll
        for (int k = 0; k < UNROLL; k++) __stcs(d + i + k * stride, v[k]);
    }
    for (; i < units; i += stride) __stcs(d + i, __ldcs(s + i));
}
template <int UNROLL, bool PERSISTENT>
__device__ void gather(const u64* __restrict__ table, unsigned int pieces) {
    for (u64 p = blockIdx.x; p < pieces; p += gridDim.x) {
        piece<UNROLL>(table[3 * p], table[3 * p + 1], table[3 * p + 2]);
        if (!PERSISTENT) return;
    }
}
extern "C" __global__ void g4(const u64* t, unsigned int n) { gather<4, false>(t, n); }
extern "C" __global__ void g8(const u64* t, unsigned int n) { gather<8, false>(t, n); }
extern "C" __global__ void p4(const u64* t, unsigned int n) { gather<4, true>(t, n); }
extern "C" __global__ void p8(const u64* t, unsigned int n) { gather<8, true>(t, n); }

// The Hopper bulk copy (TMA, cp.async.bulk): one thread of a block moves its piece in CHUNK-byte chunks through
// STAGES shared-memory buffers, global -> shared -> global, the copy engine of the SM doing the loads and stores.
__device__ __forceinline__ unsigned smem_of(const void* p) { return (unsigned)__cvta_generic_to_shared(p); }
template <int STAGES, int CHUNK>
__device__ void bulk(const u64* __restrict__ table, unsigned int pieces) {
    extern __shared__ __align__(128) unsigned char stage[];
    __shared__ __align__(8) unsigned long long bars[STAGES];
    if (threadIdx.x != 0 || blockIdx.x >= pieces) return;
    const u64 dst = table[3 * (u64)blockIdx.x], src = table[3 * (u64)blockIdx.x + 1], bytes = table[3 * (u64)blockIdx.x + 2];
    if (((dst | src | bytes) & 15) != 0) {
        for (u64 i = 0; i < bytes; i++) ((unsigned char*)dst)[i] = ((const unsigned char*)src)[i];
        return;
    }
    for (int s = 0; s < STAGES; s++) asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" :: "r"(smem_of(&bars[s])) : "memory");
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    const unsigned chunks = (unsigned)((bytes + CHUNK - 1) / CHUNK);
    auto load = [&](unsigned c) {
        const unsigned s = c % STAGES;
        const unsigned size = (unsigned)min((u64)CHUNK, bytes - (u64)c * CHUNK);
        const unsigned bar = smem_of(&bars[s]);
        asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" :: "r"(bar), "r"(size) : "memory");
        asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
                     :: "r"(smem_of(stage + s * CHUNK)), "l"(src + (u64)c * CHUNK), "r"(size), "r"(bar) : "memory");
    };
    for (unsigned c = 0; c < chunks && c < STAGES; c++) load(c);
    for (unsigned c = 0; c < chunks; c++) {
        const unsigned s = c % STAGES, parity = (c / STAGES) & 1;
        const unsigned bar = smem_of(&bars[s]);
        unsigned ok = 0;
        do {
            asm volatile("{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2; selp.u32 %0, 1, 0, p; }"
                         : "=r"(ok) : "r"(bar), "r"(parity) : "memory");
        } while (!ok);
        const unsigned size = (unsigned)min((u64)CHUNK, bytes - (u64)c * CHUNK);
        asm volatile("cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], %2;"
                     :: "l"(dst + (u64)c * CHUNK), "r"(smem_of(stage + s * CHUNK)), "r"(size) : "memory");
        asm volatile("cp.async.bulk.commit_group;" ::: "memory");
        if (c + STAGES < chunks) {
            asm volatile("cp.async.bulk.wait_group.read 0;" ::: "memory");
            load(c + STAGES);
        }
    }
    asm volatile("cp.async.bulk.wait_group 0;" ::: "memory");
}
extern "C" __global__ void t4x16(const u64* t, unsigned int n) { bulk<4, 16384>(t, n); }
extern "C" __global__ void t2x16(const u64* t, unsigned int n) { bulk<2, 16384>(t, n); }
extern "C" __global__ void t8x8(const u64* t, unsigned int n) { bulk<8, 8192>(t, n); }
extern "C" __global__ void t4x32(const u64* t, unsigned int n) { bulk<4, 32768>(t, n); }
"""


def table_of(dsts: np.ndarray, srcs: np.ndarray, sizes: np.ndarray, piece: int) -> np.ndarray:
    counts = (sizes + piece - 1) // piece
    idx = np.repeat(np.arange(len(sizes)), counts)
    first = np.repeat(np.cumsum(counts) - counts, counts)
    at = (np.arange(int(counts.sum())) - first) * piece
    n = np.minimum(sizes[idx] - at, piece)
    return np.stack([dsts[idx] + at, srcs[idx] + at, n], axis=1).astype(np.int64).reshape(-1)


def timed(fn: Any, repeat: int) -> float:
    best = float("inf")
    for _ in range(repeat):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        best = min(best, time.perf_counter() - t0)
    return best


class MemcpyAttributes(ctypes.Structure):
    _fields_ = [("srcAccessOrder", ctypes.c_int), ("srcType", ctypes.c_int), ("srcId", ctypes.c_int),
                ("dstType", ctypes.c_int), ("dstId", ctypes.c_int), ("flags", ctypes.c_uint)]


keep: list[Any] = []


def batch_fn(dsts: np.ndarray, srcs: np.ndarray, sizes: np.ndarray) -> Any:
    lib = ctypes.CDLL("libcuda.so.1")
    fn = getattr(lib, "cuMemcpyBatchAsync_v2", None)
    n = len(sizes)
    d = (ctypes.c_uint64 * n)(*dsts.tolist())
    s = (ctypes.c_uint64 * n)(*srcs.tolist())
    z = (ctypes.c_size_t * n)(*sizes.tolist())
    attrs = MemcpyAttributes(1, 1, torch.cuda.current_device(), 1, torch.cuda.current_device(), 0)  # STREAM, device
    idx = (ctypes.c_size_t * 1)(0)
    # The batched copy refuses the legacy NULL stream (CUDA_ERROR_INVALID_VALUE, as measured 2026-11-29): a
    # stream of its own, which the timing's device-wide synchronize waits for too.
    own = torch.cuda.Stream()
    stream = ctypes.c_void_p(own.cuda_stream)
    keep.append(own)
    if fn is not None:
        fn.restype = ctypes.c_int

        def call() -> None:
            rc = fn(d, s, z, ctypes.c_size_t(n), ctypes.byref(attrs), idx, ctypes.c_size_t(1), stream)
            if rc != 0:
                raise RuntimeError(f"cuMemcpyBatchAsync_v2: CUresult {rc}")
        return call
    fn = lib.cuMemcpyBatchAsync
    fail = ctypes.c_size_t(0)

    def call_v1() -> None:
        rc = fn(d, s, z, ctypes.c_size_t(n), ctypes.byref(attrs), idx, ctypes.c_size_t(1), ctypes.byref(fail), stream)
        if rc != 0:
            raise RuntimeError(f"cuMemcpyBatchAsync: CUresult {rc} at {fail.value}")
    return call_v1


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("out")
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--quick", action="store_true")
    p.add_argument("--only-bulk", action="store_true", help="the bulk (TMA) rows and the references only")
    a = p.parse_args()
    import cupy

    shapes = moe_shapes(expert_mlp=16 if a.quick else 256)
    torch.manual_seed(0)
    srcs_t = [torch.randint(-2**15, 2**15, s, dtype=torch.int16, device="cuda").view(torch.bfloat16) for _, s in shapes]
    sizes = np.array([t.numel() * 2 for t in srcs_t], dtype=np.int64)
    offsets = np.zeros_like(sizes)
    offsets[1:] = np.cumsum((sizes + 255) // 256 * 256)[:-1]
    total = int(offsets[-1] + sizes[-1])
    arena = torch.empty(total, dtype=torch.uint8, device="cuda")
    dsts = offsets + np.int64(arena.data_ptr())
    srcs = np.array([t.data_ptr() for t in srcs_t], dtype=np.int64)
    want = [t.view(torch.int16).to(torch.int64).sum().item() for t in srcs_t]
    rows: list[dict[str, Any]] = []
    sms = torch.cuda.get_device_properties(0).multi_processor_count

    def check(name: str) -> int:
        wrong = 0
        for i, t in enumerate(srcs_t):
            got = arena[int(offsets[i]):int(offsets[i] + sizes[i])].view(torch.int16).to(torch.int64).sum().item()
            wrong += got != want[i]
        arena.zero_()
        return wrong

    mod = cupy.RawModule(code=KERNEL, options=("-std=c++17",))
    variants_skip = a.only_bulk
    variants = [(256 << 10, 256, 4, False), (256 << 10, 256, 8, False), (256 << 10, 512, 4, False),
                (1 << 20, 256, 4, False), (1 << 20, 512, 8, False), (64 << 10, 256, 4, False),
                (256 << 10, 512, 4, True), (256 << 10, 256, 8, True), (1 << 20, 1024, 4, True)]
    for piece, threads, unroll, persistent in ([] if variants_skip else variants):
        table = torch.from_numpy(table_of(dsts, srcs, sizes, piece)).cuda()
        pieces = table.numel() // 3
        kern = mod.get_function(("p" if persistent else "g") + str(unroll))
        blocks = min(pieces, sms * (2048 // threads)) if persistent else pieces
        tab = cupy.asarray(table)
        stream = cupy.cuda.ExternalStream(torch.cuda.current_stream().cuda_stream)  # noqa: the deprecated spelling works in every CuPy

        def launch() -> None:
            with stream:
                kern((blocks,), (threads,), (tab, np.uint32(pieces)))
        launch()
        wrong = check("kernel")
        s = timed(launch, a.repeat)
        name = f"kernel {piece >> 10}KiB/{threads}/{unroll}" + ("/persistent" if persistent else "")
        rows.append({"row": name, "seconds": s, "pieces": pieces, "blocks": blocks, "wrong": wrong,
                     "gb_per_s": total / s / 1e9})
        print(json.dumps(rows[-1]), flush=True)
    for name, smem, piece in (("t4x16", 4 * 16384, 256 << 10), ("t2x16", 2 * 16384, 256 << 10),
                              ("t8x8", 8 * 8192, 256 << 10), ("t4x32", 4 * 32768, 1 << 20)):
        try:
            table = torch.from_numpy(table_of(dsts, srcs, sizes, piece)).cuda()
            pieces = table.numel() // 3
            kern = mod.get_function(name)
            kern.max_dynamic_shared_size_bytes = smem
            tab = cupy.asarray(table)
            stream = cupy.cuda.ExternalStream(torch.cuda.current_stream().cuda_stream)  # noqa: the old spelling works

            def bulk_launch() -> None:
                with stream:
                    kern((pieces,), (32,), (tab, np.uint32(pieces)), shared_mem=smem)
            bulk_launch()
            wrong = check(name)
            s_ = timed(bulk_launch, a.repeat)
            rows.append({"row": f"bulk (TMA) {name}, pieces {piece >> 10} KiB", "seconds": s_, "pieces": pieces,
                         "wrong": wrong, "gb_per_s": total / s_ / 1e9})
        except Exception as e:  # noqa: BLE001 - reported as the row's outcome
            rows.append({"row": f"bulk (TMA) {name}", "error": str(e)[:400]})
        print(json.dumps(rows[-1]), flush=True)
    # Hybrid: tensors of at least `big` bytes copied by torch's copy_ (cudaMemcpyAsync) on a second stream while the
    # gather (512 threads, 256 KiB pieces) copies the rest on the first: the copy engine beside the SMs.
    g4 = mod.get_function("g4")
    side = torch.cuda.Stream()
    for big in (4 << 20, 16 << 20, 64 << 20):
        small_idx = np.nonzero(sizes < big)[0]
        big_idx = np.nonzero(sizes >= big)[0]
        table = torch.from_numpy(table_of(dsts[small_idx], srcs[small_idx], sizes[small_idx], 256 << 10)).cuda()
        pieces = table.numel() // 3
        tab = cupy.asarray(table)
        main_stream = torch.cuda.current_stream()
        stream = cupy.cuda.ExternalStream(main_stream.cuda_stream)  # noqa: the old spelling works
        views = [(arena[int(offsets[i]):int(offsets[i] + sizes[i])], srcs_t[i].view(-1).view(torch.uint8))
                 for i in big_idx]

        def hybrid() -> None:
            side.wait_stream(main_stream)
            with torch.cuda.stream(side):
                for d, src in views:
                    d.copy_(src)
            with stream:
                g4((pieces,), (512,), (tab, np.uint32(pieces)))
            main_stream.wait_stream(side)
        hybrid()
        torch.cuda.synchronize()
        wrong = check("hybrid")
        s_ = timed(hybrid, a.repeat)
        rows.append({"row": f"hybrid: copy_ of tensors >= {big >> 20} MiB ({len(big_idx)}, "
                            f"{int(sizes[big_idx].sum()) / 1e9:.2f} GB) beside the gather", "seconds": s_,
                     "wrong": wrong, "gb_per_s": total / s_ / 1e9})
        print(json.dumps(rows[-1]), flush=True)
    try:
        call = batch_fn(dsts, srcs, sizes)
        call()
        wrong = check("batch")
        s = timed(call, a.repeat)
        rows.append({"row": "batch cuMemcpyBatchAsync", "seconds": s, "wrong": wrong, "gb_per_s": total / s / 1e9})
    except Exception as e:  # noqa: BLE001 - reported as the row's outcome
        rows.append({"row": "batch cuMemcpyBatchAsync", "error": str(e)})
    print(json.dumps(rows[-1]), flush=True)
    per_tensor = timed(lambda: [arena[int(o):int(o + z)].view(torch.bfloat16).copy_(t.view(-1))
                                for o, z, t in zip(offsets, sizes, srcs_t)], a.repeat)
    rows.append({"row": "per-tensor copy_", "seconds": per_tensor, "gb_per_s": total / per_tensor / 1e9})
    flat_src = torch.empty(total, dtype=torch.uint8, device="cuda")
    s = timed(lambda: arena.copy_(flat_src), a.repeat)
    rows.append({"row": "flat copy_ (the goal's reference)", "seconds": s, "gb_per_s": total / s / 1e9})
    piece = 256 << 10
    one = np.array([total], dtype=np.int64)
    table = torch.from_numpy(table_of(np.array([arena.data_ptr()], dtype=np.int64),
                                      np.array([flat_src.data_ptr()], dtype=np.int64), one, piece)).cuda()
    tab, pieces = cupy.asarray(table), table.numel() // 3
    kern = mod.get_function("g4")
    stream = cupy.cuda.ExternalStream(torch.cuda.current_stream().cuda_stream)  # noqa: the deprecated spelling works in every CuPy

    def flat_kernel() -> None:
        with stream:
            kern((pieces,), (256,), (tab, np.uint32(pieces)))
    s = timed(flat_kernel, a.repeat)
    rows.append({"row": "flat-kernel 256KiB/256/4", "seconds": s, "gb_per_s": total / s / 1e9})
    for r in rows[-3:]:
        print(json.dumps(r), flush=True)
    facts = {"device": torch.cuda.get_device_name(0), "tensors": len(shapes), "bytes": total, "sms": sms,
             "torch": torch.__version__, "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
    with open(a.out, "w") as f:
        json.dump({"facts": facts, "rows": rows}, f, indent=1)
    return 0 if all(r.get("wrong", 0) == 0 for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
