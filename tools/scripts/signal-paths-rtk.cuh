// signal-paths, `rtk`: the round trip of two persistent kernels, one per process, with the per-frame steps of
// gpu-ipc's device API (kernels/cuda/gpu_ipc_ring.cuh) added one at a time. Included by signal-paths.cu after its
// shared helpers (gtimer, ld_acquire_sys, st_release_sys, Pair, start_pair, barrier); the letters of STEPS are
// listed at the head of signal-paths.cu.

// ---- rtk: persistent kernels in both processes ----------------------------------------------------------------
#define RTK_FENCE 1u
#define RTK_STORES 2u
#define RTK_RECORDS 4u
#define RTK_JOIN 8u
#define RTK_WRITE 16u
#define RTK_ABORT 32u
#define RTK_ONE_FENCE 64u
#define RTK_MIRROR 128u
#define RTK_HOST_PROGRESS 256u
#define RTK_HOST_CHECK 512u
#define RTK_VIEW 1024u
#define RTK_WIDE 2048u
#define RTK_GPU_SCOPE 4096u

struct RtkArgs {
    uint64_t *mine, *theirs;                   // the counter this side stores, the one it waits on
    uint64_t *next_seq, *state, *join, *abort, *progress;
    // Host-memory words (the registered page) for m, p, c, v: the host copies of mine and theirs, this side's
    // progress, and the record words a producer's view reads.
    uint64_t *host_mine, *host_theirs, *host_progress, *host_next_seq, *host_state, *host_join, *host_abort;
    unsigned *buf;                             // 256 words of device memory
    uint64_t n;
    unsigned steps;
    unsigned long long *result;                // [0] ns from the first round trip's end to the last's, [1] failures
};

__device__ __forceinline__ void st_relaxed_sys(uint64_t *p, uint64_t v) {
    asm volatile("st.relaxed.sys.global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}
__device__ __forceinline__ uint64_t ld_relaxed_sys(const uint64_t *p) {
    uint64_t v;
    asm volatile("ld.relaxed.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
    return v;
}

// Waits until *p >= v; with RTK_ABORT reads the abort word after the first poll that falls short (as gpu-ipc).
__device__ __forceinline__ uint64_t rtk_load(const RtkArgs &a, const uint64_t *p) {
    if (!(a.steps & RTK_GPU_SCOPE)) return ld_acquire_sys(p);
    uint64_t v;
    asm volatile("ld.acquire.gpu.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
    return v;
}
__device__ __forceinline__ void rtk_store(const RtkArgs &a, uint64_t *p, uint64_t v) {
    if (a.steps & RTK_GPU_SCOPE)
        asm volatile("st.release.gpu.global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
    else
        st_release_sys(p, v);
}

__device__ bool rtk_wait(const RtkArgs &a, const uint64_t *p, uint64_t v) {
    uint64_t start = gtimer();
    unsigned polls = 0;
    while (rtk_load(a, p) < v) {
        if (gtimer() - start > SPIN_LIMIT_NS) return false;
        if ((a.steps & RTK_ABORT) && polls % 1024 == 0 && ld_acquire_sys(a.abort) != 0) return false;
        if ((a.steps & RTK_HOST_CHECK) && polls % 64 == 63) {
            // gpu-ipc's look at the host copy and the abort word (two loads in flight) every 64 polls.
            uint64_t h = ld_relaxed_sys(a.host_theirs), x = ld_relaxed_sys(a.host_abort);
            if (x != 0 || h == 0xffffffffffffffffull) return false;
        }
        polls++;
    }
    return true;
}

// One block of 256 threads. The producer publishes v = 1..n into `mine` once the consumer's `theirs` reached
// v - 1; the consumer waits for v and answers with v.
__global__ void k_rtk(RtkArgs a, bool producer) {
    __shared__ int ok;
    const bool write = (a.steps & RTK_WRITE) != 0;
    if (threadIdx.x != 0 && !write) return;
    uint64_t t0 = 0;
    unsigned long long sink = 0;
    for (uint64_t v = 1; v <= a.n; v++) {
        if (threadIdx.x == 0) {
            bool good = true;
            if (producer && (a.steps & RTK_VIEW) && v % 16 == 1) {
                // gpu-ipc's view of the records, once per 16 frames: next_sequence ahead, a fence.sc.sys, the
                // record's state and join sequence and the abort word side by side.
                st_relaxed_sys(a.host_next_seq, v + 16);
                asm volatile("fence.sc.sys;" ::: "memory");
                uint64_t st = ld_relaxed_sys(a.host_state), jn = ld_relaxed_sys(a.host_join);
                uint64_t x = ld_relaxed_sys(a.host_abort);
                asm volatile("fence.acq_rel.sys;" ::: "memory");
                good = st == 2 && jn == 0 && x == 0;
            }
            if (producer && v > 1) {
                bool done = false;
                if (a.steps & RTK_RECORDS) {
                    uint64_t seen = ld_relaxed_sys(a.theirs);
                    uint64_t state = ld_relaxed_sys(a.state);
                    asm volatile("fence.acq_rel.sys;" ::: "memory");
                    done = seen >= v - 1 || state != 2;
                }
                if (!done) {
                    if (a.steps & RTK_JOIN) good = good && ld_acquire_sys(a.join) < v;
                    good = good && rtk_wait(a, a.theirs, v - 1);
                }
                if (v == 2) t0 = gtimer();
            } else if (!producer) {
                good = rtk_wait(a, a.theirs, v);
            }
            ok = good;
        }
        if (write) {
            __syncthreads();
            if (!ok) break;
            if (producer)
                a.buf[threadIdx.x] = (unsigned)v;
            else
                sink += a.buf[threadIdx.x];
            __syncthreads();
        } else if (!ok) {
            break;
        }
        if (threadIdx.x == 0) {
            if (producer && (a.steps & RTK_ONE_FENCE)) {
                if (a.steps & RTK_STORES) st_relaxed_sys(a.next_seq, v);
                asm volatile("fence.sc.sys;" ::: "memory");
                st_relaxed_sys(a.mine, v);
            } else {
                rtk_store(a, a.mine, v);
                // gpu-ipc's host copy: a second release (its fence waits only for the first store).
                if (a.steps & RTK_MIRROR) st_release_sys(a.host_mine, v);
                if (producer && (a.steps & RTK_STORES)) st_relaxed_sys(a.next_seq, v);
                if (producer && (a.steps & RTK_FENCE)) asm volatile("fence.sc.sys;" ::: "memory");
            }
            if (a.steps & RTK_STORES) st_relaxed_sys((a.steps & RTK_HOST_PROGRESS) ? a.host_progress : a.progress, v);
        }
    }
    if (threadIdx.x == 0) {
        bool good = ok && (!producer || rtk_wait(a, a.theirs, a.n));
        if (producer) a.result[0] = gtimer() - t0;
        a.result[1] = !good;
        __threadfence_system();
    }
    if (sink == 0xffffffffffffull) a.result[1] = 2;  // keeps the consumer's reads
}

static unsigned rtk_steps(const char *steps) {
    unsigned bits = 0;
    for (const char *p = steps; *p; p++) {
        switch (*p) {
        case 'f': bits |= RTK_FENCE; break;
        case 's': bits |= RTK_STORES; break;
        case 'r': bits |= RTK_RECORDS; break;
        case 'j': bits |= RTK_JOIN; break;
        case 'w': bits |= RTK_WRITE; break;
        case 'a': bits |= RTK_ABORT; break;
        case 'o': bits |= RTK_ONE_FENCE; break;
        case 'm': bits |= RTK_MIRROR; break;
        case 'p': bits |= RTK_HOST_PROGRESS; break;
        case 'c': bits |= RTK_HOST_CHECK; break;
        case 'v': bits |= RTK_VIEW; break;
        case 'W': bits |= RTK_WIDE; break;
        case 'g': bits |= RTK_GPU_SCOPE; break;
        case '-': break;
        default: fprintf(stderr, "rtk: unknown step '%c'\n", *p); exit(2);
        }
    }
    return bits;
}

// rtk MEM STEPS N: the round trip of two persistent kernels (needs MPS: both must run at once).
static int run_rtk(bool dev, const char *steps, uint64_t n) {
    unsigned bits = rtk_steps(steps);
    Pair pair = start_pair(dev);
    Counters c = pair.c;
    // The extra words: c.released[1..6] (same memory kind as the counters). The record's state says LIVE (2).
    if (pair.first) {
        uint64_t live = 2;
        CK(cudaMemcpy(c.released[2], &live, 8, cudaMemcpyDefault));
        pair.s->more_released[16 * 5] = 2;  // host[5]: the state word a producer's view reads
    }
    barrier(pair.s, 1);
    RtkArgs a;
    a.mine = pair.first ? c.ping : c.pong;
    a.theirs = pair.first ? c.pong : c.ping;
    a.next_seq = c.released[1];
    a.state = c.released[2];
    a.join = c.released[3];
    a.abort = c.released[4];
    a.progress = pair.first ? c.released[5] : c.released[6];
    // host[k]: the registered page's more_released[16 k] (not the counters in host mode: use these letters with dev).
    uint64_t *host[8];
    for (int k = 0; k < 8; k++) host[k] = c.host_words + 16 * k;
    a.host_mine = pair.first ? host[0] : host[1];
    a.host_theirs = pair.first ? host[1] : host[0];
    a.host_progress = pair.first ? host[2] : host[3];
    a.host_next_seq = host[4];
    a.host_state = host[5];
    a.host_join = host[6];
    a.host_abort = host[7];
    CK(cudaMalloc((void **)&a.buf, 256 * sizeof(unsigned)));
    a.n = n;
    a.steps = bits;
    unsigned long long *result_host;
    CK(cudaHostAlloc((void **)&result_host, 16, cudaHostAllocMapped));
    memset(result_host, 0, 16);
    CK(cudaHostGetDevicePointer((void **)&a.result, result_host, 0));
    k_rtk<<<1, (bits & RTK_WIDE) ? 1024 : 256, 0, pair.st>>>(a, pair.first);
    CK(cudaStreamSynchronize(pair.st));
    const char *mem = dev ? "dev" : "host";
    if (pair.first) {
        if (result_host[1])
            printf("rtk.%s.%s.failed 1 (a wait timed out: are both kernels running at once? MPS)\n", mem, steps);
        else
            printf("rtk.%s.%s.round_trip_us %.3f us (%lu round trips, persistent kernels in both processes)\n", mem,
                   steps, result_host[0] / 1000.0 / (double)(n - 1), (unsigned long)n);
        int status = 0;
        waitpid(pair.child, &status, 0);
        return result_host[1] ? 1 : (WIFEXITED(status) ? WEXITSTATUS(status) : 1);
    }
    _exit(result_host[1] ? 1 : 0);
}

