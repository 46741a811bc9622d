// The weights' gather copy (gpu_ipc_driver::GatherCopy, loaded by ipc-toolkit/src/weights/copy.rs): many device-to-
// device copies in one launch, so a generation switch of a 19,000-tensor state_dict costs a few launches instead of
// 19,000 cuMemcpyAsync calls, at the bandwidth of one memcpy.
//
// Files named weights_*.cu are not part of the gpu-ipc-kernels program: scripts/gen_kernels.py compiles them as their
// own program into ipc-toolkit/weights-kernels/, which ipc-toolkit embeds.
//
// The table holds one piece per block: three 64-bit words, the destination address, the source address and the
// byte count (at most GATHER_PIECE_BYTES, 256 KiB: the host splits larger copies). Each block copies its piece in
// the widest unit that divides both addresses and the count (16 bytes for tensors the caching allocators and the
// arena lay out), four loads in flight per thread, with streaming cache hints (__ldcs, __stcs: every byte is
// touched once). Pieces never overlap (distinct tensors), so their order does not matter.

typedef unsigned long long gpu_ipc_gather_u64;

template <typename T>
static __device__ __forceinline__ void gpu_ipc_gather_units(gpu_ipc_gather_u64 dst, gpu_ipc_gather_u64 src,
                                                            gpu_ipc_gather_u64 units)
{
    T* __restrict__ d = (T*)dst;
    const T* __restrict__ s = (const T*)src;
    const gpu_ipc_gather_u64 stride = blockDim.x;
    gpu_ipc_gather_u64 i = threadIdx.x;
    for (; i + 3 * stride < units; i += 4 * stride) {
        T a = __ldcs(s + i);
        T b = __ldcs(s + i + stride);
        T c = __ldcs(s + i + 2 * stride);
        T e = __ldcs(s + i + 3 * stride);
        __stcs(d + i, a);
        __stcs(d + i + stride, b);
        __stcs(d + i + 2 * stride, c);
        __stcs(d + i + 3 * stride, e);
    }
    for (; i < units; i += stride) {
        __stcs(d + i, __ldcs(s + i));
    }
}

extern "C" __global__ void gpu_ipc_gather_copy(const gpu_ipc_gather_u64* __restrict__ table, unsigned int pieces)
{
    if (blockIdx.x >= pieces) {
        return;
    }
    const gpu_ipc_gather_u64 dst = table[3 * (gpu_ipc_gather_u64)blockIdx.x];
    const gpu_ipc_gather_u64 src = table[3 * (gpu_ipc_gather_u64)blockIdx.x + 1];
    const gpu_ipc_gather_u64 bytes = table[3 * (gpu_ipc_gather_u64)blockIdx.x + 2];
    const gpu_ipc_gather_u64 mix = dst | src | bytes;
    if ((mix & 15) == 0) {
        gpu_ipc_gather_units<uint4>(dst, src, bytes / 16);
    } else if ((mix & 7) == 0) {
        gpu_ipc_gather_units<unsigned long long>(dst, src, bytes / 8);
    } else if ((mix & 3) == 0) {
        gpu_ipc_gather_units<unsigned int>(dst, src, bytes / 4);
    } else if ((mix & 1) == 0) {
        gpu_ipc_gather_units<unsigned short>(dst, src, bytes / 2);
    } else {
        gpu_ipc_gather_units<unsigned char>(dst, src, bytes);
    }
}
