// Kernels of `gpu-ipc probe overhead` and `gpu-ipc probe crash`: bandwidth, latency, and long-running accesses to
// memory that may be local or imported from another process. Each kernel does the same work on any pointer; the
// probes compare the memory kinds, never the kernels.

static __device__ __forceinline__ unsigned long long mem_globaltimer()
{
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

static __device__ __forceinline__ unsigned long long mem_clock()
{
    unsigned long long c;
    asm volatile("mov.u64 %0, %%clock64;" : "=l"(c)::"memory");
    return c;
}

// Reads n_vec 16-byte vectors (grid-stride) and folds them; writes the fold only when it equals `never`, which the
// host picks so that it cannot happen, so the loads cannot be optimised away and nothing else is written.
extern "C" __global__ void gpu_ipc_mem_read(const uint4* src, unsigned long long n_vec, unsigned int never,
                                            unsigned int* sink)
{
    unsigned int acc = 0;
    const unsigned long long stride = (unsigned long long)gridDim.x * blockDim.x;
    for (unsigned long long v = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x; v < n_vec; v += stride) {
        const uint4 w = src[v];
        acc ^= w.x ^ w.y ^ w.z ^ w.w;
    }
    if (acc == never) {
        sink[0] = acc;
    }
}

// Writes n_vec 16-byte vectors (grid-stride) with `value`.
extern "C" __global__ void gpu_ipc_mem_write(uint4* dst, unsigned long long n_vec, unsigned int value)
{
    const unsigned long long stride = (unsigned long long)gridDim.x * blockDim.x;
    const uint4 w = make_uint4(value, value ^ 1u, value ^ 2u, value ^ 3u);
    for (unsigned long long v = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x; v < n_vec; v += stride) {
        dst[v] = w;
    }
}

// Dependent pointer chase, one thread: chain[j] holds the index (in u64 words) of the next element. First
// `warm_steps` loads untimed (to bring the working set into the caches it fits in), then `steps` timed loads:
// cycles[k] = clock64 cycles of load k (the loaded value is stored to shared memory before the clock is read, so
// the clock cannot be read before the load completes). cycles[steps] = total cycles of the timed loads and
// cycles[steps + 1] = their total %globaltimer nanoseconds, which the host uses to convert cycles to ns.
extern "C" __global__ void gpu_ipc_mem_chase(const unsigned long long* chain, unsigned long long start,
                                             unsigned long long warm_steps, unsigned long long steps,
                                             unsigned long long* cycles, unsigned long long* sink)
{
    __shared__ unsigned long long seen[1];
    if (threadIdx.x != 0 || blockIdx.x != 0) {
        return;
    }
    unsigned long long j = start;
    for (unsigned long long k = 0; k < warm_steps; ++k) {
        j = chain[j];
    }
    const unsigned long long c_start = mem_clock();
    const unsigned long long t_start = mem_globaltimer();
    for (unsigned long long k = 0; k < steps; ++k) {
        const unsigned long long c0 = mem_clock();
        j = chain[j];
        seen[0] = j;
        const unsigned long long c1 = mem_clock();
        cycles[k] = c1 - c0;
    }
    const unsigned long long c_end = mem_clock();
    const unsigned long long t_end = mem_globaltimer();
    cycles[steps] = c_end - c_start;
    cycles[steps + 1] = t_end - t_start;
    sink[0] = seen[0];
}

// Store latency, one thread: `steps` stores, each to a new 128-byte line, each followed by __threadfence()
// (fence.sc.gpu), which waits until the store is visible device-wide. cycles[k] = cycles of store k plus its
// fence; cycles[steps] and cycles[steps + 1] as in gpu_ipc_mem_chase.
extern "C" __global__ void gpu_ipc_mem_store_latency(unsigned long long* dst, unsigned long long lines,
                                                     unsigned long long steps, unsigned long long* cycles)
{
    if (threadIdx.x != 0 || blockIdx.x != 0) {
        return;
    }
    const unsigned long long c_start = mem_clock();
    const unsigned long long t_start = mem_globaltimer();
    for (unsigned long long k = 0; k < steps; ++k) {
        const unsigned long long c0 = mem_clock();
        dst[(k % lines) * 16ull] = k;
        __threadfence();
        const unsigned long long c1 = mem_clock();
        cycles[k] = c1 - c0;
    }
    const unsigned long long c_end = mem_clock();
    const unsigned long long t_end = mem_globaltimer();
    cycles[steps] = c_end - c_start;
    cycles[steps + 1] = t_end - t_start;
}

// For the crash probe: keeps reading and rewriting every word of buf with value(seq, i) for duration_ns (bounded by
// %globaltimer), counting words that did not hold it when read. Grid-stride; stats[0] += passes (block 0 thread 0),
// stats[1] += mismatched words.
extern "C" __global__ void gpu_ipc_mem_hammer(unsigned int* buf, unsigned long long n_words, unsigned long long seq,
                                              unsigned long long duration_ns, unsigned long long* stats)
{
    const unsigned long long stride = (unsigned long long)gridDim.x * blockDim.x;
    const unsigned long long first = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;
    const unsigned long long start = mem_globaltimer();
    unsigned long long passes = 0, bad = 0;
    while (mem_globaltimer() - start < duration_ns) {
        for (unsigned long long i = first; i < n_words; i += stride) {
            const unsigned int want = (unsigned int)i * 0x9E3779B1u ^ (unsigned int)seq * 0x85EBCA6Bu ^ 0xA5A5A5A5u;
            const unsigned int expect = want ^ (want >> 16);
            volatile unsigned int* p = buf + i;
            bad += (unsigned long long)(*p != expect);
            *p = expect;
        }
        passes += 1;
    }
    if (bad != 0) {
        atomicAdd(stats + 1, bad);
    }
    if (first == 0) {
        atomicAdd(stats, passes);
    }
}

// For the crash probe: one thread polls *flag (ld.acquire.sys) until it is >= target or timeout_ns passes.
// out[0] = 1 released, 2 timed out; out[1] = the value last read; out[2] = nanoseconds waited.
extern "C" __global__ void gpu_ipc_mem_wait_flag(const unsigned long long* flag, unsigned long long target,
                                                 unsigned long long timeout_ns, unsigned long long* out)
{
    if (threadIdx.x != 0 || blockIdx.x != 0) {
        return;
    }
    const unsigned long long start = mem_globaltimer();
    unsigned long long v;
    unsigned long long state = 2;
    for (;;) {
        asm volatile("ld.acquire.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(flag) : "memory");
        if (v >= target) {
            state = 1;
            break;
        }
        if (mem_globaltimer() - start > timeout_ns) {
            break;
        }
    }
    out[0] = state;
    out[1] = v;
    out[2] = mem_globaltimer() - start;
}
