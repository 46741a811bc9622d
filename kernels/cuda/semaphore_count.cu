// gpu-ipc cross-process semaphore: the kernels that change its count (ipc-core/src/semaphore/count.rs).
//
// The count `posted` lives in a small allocation of device memory that the owner exports beside the shared host
// block (docs/semaphore.md, "How it works"), so that every change of it is a GPU atomic on device memory: atomic
// with every other process's, on this GPU or a peer over NVLink, where a GPU atomic on host memory would not be
// atomic with the CPU's (CU_DEVICE_ATTRIBUTE_HOST_NATIVE_ATOMIC_SUPPORTED is 0 on a PCIe GPU in an x86 machine).
// Stream waits wait on that word (cuStreamWaitValue64). Each kernel then copies the count into the host block's
// `posted` word, the mirror CPU waiters read, until the mirror holds what the count holds: a copy that another
// kernel overwrote with an older value is written again, so the last write is always the latest count.
//
// Files named semaphore_*.cu are not part of the gpu-ipc-kernels program: scripts/gen_kernels.py compiles them as
// their own program into ipc-core/semaphore-kernels/, which ipc-core embeds. Every kernel runs one thread.

#include "gpu_ipc_semaphore.cuh"

// The poison (`ipc_core::semaphore::POISON`): bit 62.
#define GPU_IPC_SEMAPHORE_POISON 0x4000000000000000ull

static __device__ __forceinline__ void gpu_ipc_semaphore_store(unsigned long long* word, unsigned long long value)
{
    asm volatile("st.release.sys.global.u64 [%0], %1;" ::"l"(word), "l"(value) : "memory");
}

// Writes `seen` (a value the count had) into the mirror, then again whatever the count holds now, until the two
// agree. Ends once no other change of the count is in flight.
static __device__ void gpu_ipc_semaphore_mirror(unsigned long long* count, unsigned long long* mirror,
                                                unsigned long long seen)
{
    for (;;) {
        gpu_ipc_semaphore_store(mirror, seen);
        unsigned long long now = gpu_ipc_semaphore_load(count);
        if (now == seen) {
            return;
        }
        seen = now;
    }
}

// Adds `n` posts (release: what the stream did before is visible to whoever sees the post), then mirrors. `n` = 0
// only mirrors the count again (after a poster died between its add and its mirror).
extern "C" __global__ void gpu_ipc_semaphore_post(unsigned long long* count, unsigned long long* mirror,
                                                  unsigned long long n)
{
    if (threadIdx.x != 0 || blockIdx.x != 0) {
        return;
    }
    unsigned long long old;
    asm volatile("atom.release.sys.global.add.u64 %0, [%1], %2;" : "=l"(old) : "l"(count), "l"(n) : "memory");
    gpu_ipc_semaphore_mirror(count, mirror, old + n);
}

// ORs the poison into the count (every stream wait, queued or future, passes), then mirrors.
extern "C" __global__ void gpu_ipc_semaphore_poison(unsigned long long* count, unsigned long long* mirror)
{
    if (threadIdx.x != 0 || blockIdx.x != 0) {
        return;
    }
    unsigned long long old;
    asm volatile("atom.release.sys.global.or.b64 %0, [%1], %2;"
                 : "=l"(old)
                 : "l"(count), "l"(GPU_IPC_SEMAPHORE_POISON)
                 : "memory");
    gpu_ipc_semaphore_mirror(count, mirror, old | GPU_IPC_SEMAPHORE_POISON);
}

// The owner's reset of a poisoned count: the count becomes max(count, taken) without the poison, by
// compare-and-swap (a stream post queued before the break may still land). Before each attempt it writes the
// fence words of the host block, `fence[0]` = the count, `fence[1]` = max(taken, count): the tickets in between
// were released by the poison. Then mirrors.
extern "C" __global__ void gpu_ipc_semaphore_reset(unsigned long long* count, unsigned long long* mirror,
                                                   unsigned long long taken, unsigned long long* fence)
{
    if (threadIdx.x != 0 || blockIdx.x != 0) {
        return;
    }
    unsigned long long old = gpu_ipc_semaphore_load(count);
    unsigned long long next;
    for (;;) {
        unsigned long long real = old & GPU_IPC_SEMAPHORE_COUNT_MASK;
        next = real > taken ? real : taken;
        gpu_ipc_semaphore_store(fence, real);
        gpu_ipc_semaphore_store(fence + 1, next);
        unsigned long long seen;
        asm volatile("atom.acq_rel.sys.global.cas.b64 %0, [%1], %2, %3;"
                     : "=l"(seen)
                     : "l"(count), "l"(old), "l"(next)
                     : "memory");
        if (seen == old) {
            break;
        }
        old = seen;
    }
    gpu_ipc_semaphore_mirror(count, mirror, next);
}
