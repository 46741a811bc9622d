// signal-paths: what the hardware and the driver cost for a cross-process handoff, without gpu-ipc.
//
// A reference measurement ("what is in the way"): the same handoffs gpu-ipc's GPU-side strategies
// make, written directly against the CUDA driver in two processes (a fork before CUDA is touched), so that the
// library's figures can be set against the floor the driver gives. Built and run on the GPU machine by
// tools/scripts/signal-paths.sh (nvcc is there, Rust is not). Every wait is bounded (alarm, %globaltimer).
//
//   signal-paths single N                     fill + verify of a 4K RGB frame N times, one process, one stream
//   signal-paths cpu N                        CPU cost per driver call (one process)
//   signal-paths rt MEM MECH N                round trip between two processes, MEM host|dev, MECH ops|batch1|ours|ours-lite
//   signal-paths rtk MEM STEPS N              round trip between two persistent kernels (MPS), one per process, each
//                                             waiting with ld.acquire.sys and answering with st.release.sys; STEPS adds
//                                             the per-frame steps of gpu-ipc's device API one at a time ("-": none):
//                                             f fence.sc.sys after the publish, s the extra relaxed stores (next
//                                             sequence, progress words), r the release and state read together with a
//                                             fence.acq_rel.sys first, j the join word read before polling, w a 256-byte
//                                             write / read by 256 threads between two barriers, a the abort word read
//                                             after the first poll that falls short, o one fence.sc.sys before a
//                                             relaxed publish in place of f and the release; with MEM dev, m a copy
//                                             of each store in host memory (a second release), p the progress word in host memory, c a
//                                             look at the host copy and the abort word every 64 polls, v the
//                                             producer's view of the records (in host memory) once per 16 frames;
//                                             W blocks of 1,024 threads instead of 256 (with w: the barriers' cost);
//                                             g the two counters at .gpu scope (ld.acquire.gpu, st.release.gpu)
//   signal-paths pipe PROCS MECH SLOTS N      fill -> verify through SLOTS buffers, every kernel stamped with
//                                             %globaltimer: where the time per frame goes (signal-paths-pipe.cuh)
//   signal-paths killwait MEM MECH            SIGKILL an importer holding a GPU-side wait (MECH stream|kernel) on
//                                             shared memory; does the exporter's context survive?
//   signal-paths frames MEM SLOTS N [C]       producer fill -> C consumers' verify (default 1) of N 4K frames
//                                             through SLOTS slots, counters in MEM (host: a registered shared mapping; dev: cuMemAlloc
//                                             memory shared with a legacy IPC handle)
// Output: one line per figure, "key value unit".
#include <cuda.h>
#include <cuda_runtime.h>
#include <errno.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define CK(x)                                                                                                      \
    do {                                                                                                           \
        cudaError_t e_ = (x);                                                                                      \
        if (e_ != cudaSuccess) {                                                                                   \
            fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_));                     \
            exit(1);                                                                                               \
        }                                                                                                          \
    } while (0)
#define CD(x)                                                                                                      \
    do {                                                                                                           \
        CUresult r_ = (x);                                                                                         \
        if (r_ != CUDA_SUCCESS) {                                                                                  \
            const char *s_ = "?";                                                                                  \
            cuGetErrorString(r_, &s_);                                                                             \
            fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, s_);                                         \
            exit(1);                                                                                               \
        }                                                                                                          \
    } while (0)

static const size_t FRAME = 3840ull * 2160ull * 3ull;
static const uint64_t SPIN_LIMIT_NS = 1000000000ull;
#define MAX_CONSUMERS 8

// The host page both processes map (before the fork): counters, a barrier, the IPC handles.
struct Shared {
    volatile uint64_t ping __attribute__((aligned(128)));
    volatile uint64_t pong __attribute__((aligned(128)));
    volatile uint64_t gate __attribute__((aligned(128)));
    volatile uint64_t arrived __attribute__((aligned(128)));
    volatile uint64_t ready __attribute__((aligned(128)));
    cudaIpcMemHandle_t counters __attribute__((aligned(128)));
    cudaIpcMemHandle_t frames;
    volatile uint64_t timeouts;
    // `released` counters of consumers 1.. of `frames` (consumer 0's is `pong`), 128 bytes apart.
    volatile uint64_t more_released[MAX_CONSUMERS * 16] __attribute__((aligned(128)));
};

static double now_s(clockid_t c) {
    struct timespec t;
    clock_gettime(c, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

__device__ __forceinline__ uint64_t gtimer() {
    uint64_t t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}
__device__ __forceinline__ uint64_t ld_acquire_sys(const uint64_t *p) {
    uint64_t v;
    asm volatile("ld.acquire.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
    return v;
}
__device__ __forceinline__ void st_release_sys(uint64_t *p, uint64_t v) {
    asm volatile("st.release.sys.global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}
__device__ bool spin_at_least(const uint64_t *p, uint64_t v) {
    uint64_t start = gtimer();
    while (ld_acquire_sys(p) < v) {
        if (gtimer() - start > SPIN_LIMIT_NS) return false;
    }
    return true;
}

// The importer's polling kernel of `killwait`: wait for `in` to reach `v` (bounded), then store `out`.
__global__ void k_pong(uint64_t *out, const uint64_t *in, uint64_t v, unsigned long long *timeouts) {
    if (!spin_at_least(in, v)) atomicAdd(timeouts, 1ull);
    st_release_sys(out, v);
}
__global__ void k_fill(uint4 *p, size_t n, uint32_t v) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        p[i] = make_uint4(v, v + 1, v + 2, v + 3);
}
__global__ void k_verify(const uint4 *p, size_t n, uint32_t v, unsigned long long *bad) {
    unsigned long long b = 0;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        uint4 w = p[i];
        b += (w.x != v) + (w.y != v + 1) + (w.z != v + 2) + (w.w != v + 3);
    }
    if (b) atomicAdd(bad, b);
}
__global__ void k_empty() {}

static int grid_blocks() {
    int sms = 0;
    CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    return sms * 4;
}

static Shared *shared_page() {
    void *p = mmap(NULL, 1 << 16, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) {
        perror("mmap");
        exit(1);
    }
    memset(p, 0, 1 << 16);
    return (Shared *)p;
}

// Waits until `parties` processes arrived `round` times each.
static void barrier(Shared *s, uint64_t round, uint64_t parties = 2) {
    __atomic_fetch_add(&s->arrived, 1, __ATOMIC_SEQ_CST);
    double start = now_s(CLOCK_MONOTONIC);
    while (__atomic_load_n(&s->arrived, __ATOMIC_SEQ_CST) < parties * round) {
        if (now_s(CLOCK_MONOTONIC) - start > 20) {
            fprintf(stderr, "barrier timed out\n");
            exit(1);
        }
    }
}

// Device pointers to the two counters and the gate, in host (registered) or device memory.
struct Counters {
    uint64_t *ping, *pong, *gate, *mark;
    uint64_t *released[MAX_CONSUMERS];  // for `frames`: consumer c's counter (released[0] == pong)
    uint64_t *host_words;                // the registered page's more_released[] (device address), whatever MEM
    unsigned long long *timeouts;
};

static Counters counters(Shared *s, bool dev, bool first) {
    Counters c;
    CK(cudaHostRegister((void *)s, 1 << 16, cudaHostRegisterPortable | cudaHostRegisterMapped));
    uint64_t *hs;
    CK(cudaHostGetDevicePointer((void **)&hs, (void *)s, 0));
    c.gate = (uint64_t *)((char *)hs + offsetof(Shared, gate));
    c.host_words = (uint64_t *)((char *)hs + offsetof(Shared, more_released));
    if (!dev) {
        c.ping = (uint64_t *)((char *)hs + offsetof(Shared, ping));
        c.pong = (uint64_t *)((char *)hs + offsetof(Shared, pong));
        for (int i = 1; i < MAX_CONSUMERS; i++)
            c.released[i] = (uint64_t *)((char *)hs + offsetof(Shared, more_released) + (i - 1) * 128);
    } else {
        char *d;
        if (first) {
            CK(cudaMalloc((void **)&d, 4096));
            CK(cudaMemset(d, 0, 4096));
            CK(cudaDeviceSynchronize());
            CK(cudaIpcGetMemHandle(&s->counters, d));
            __atomic_store_n(&s->ready, 1, __ATOMIC_SEQ_CST);
        } else {
            while (!__atomic_load_n(&s->ready, __ATOMIC_SEQ_CST)) usleep(100);
            CK(cudaIpcOpenMemHandle((void **)&d, s->counters, cudaIpcMemLazyEnablePeerAccess));
        }
        c.ping = (uint64_t *)d;
        c.pong = (uint64_t *)(d + 128);
        for (int i = 1; i < MAX_CONSUMERS; i++) c.released[i] = (uint64_t *)(d + 128 * (i + 1));
    }
    c.released[0] = c.pong;
    CK(cudaMalloc((void **)&c.timeouts, 8));
    CK(cudaMemset(c.timeouts, 0, 8));
    // A private page-locked progress word, as gpu-ipc's run-ahead has.
    uint64_t *mark_host;
    CK(cudaHostAlloc((void **)&mark_host, 4096, cudaHostAllocMapped | cudaHostAllocPortable));
    CK(cudaHostGetDevicePointer((void **)&c.mark, mark_host, 0));
    return c;
}

// One cuStreamBatchMemOp: a wait on or a write of `p`, followed by a write of `mark` (when given) to `mark_word`: how
// gpu-ipc's gpu-stream-ops queues each step (the mark is its run-ahead progress word).
static void batch_op(CUstream st, uint64_t *p, uint64_t v, bool wait, uint64_t *mark_word, uint64_t mark) {
    CUstreamBatchMemOpParams ops[2];
    memset(ops, 0, sizeof ops);
    if (wait) {
        ops[0].waitValue.operation = CU_STREAM_MEM_OP_WAIT_VALUE_64;
        ops[0].waitValue.address = (CUdeviceptr)p;
        ops[0].waitValue.value64 = v;
        ops[0].waitValue.flags = CU_STREAM_WAIT_VALUE_GEQ;
    } else {
        ops[0].writeValue.operation = CU_STREAM_MEM_OP_WRITE_VALUE_64;
        ops[0].writeValue.address = (CUdeviceptr)p;
        ops[0].writeValue.value64 = v;
        ops[0].writeValue.flags = CU_STREAM_WRITE_VALUE_DEFAULT;
    }
    unsigned count = 1;
    if (mark_word) {
        ops[1].writeValue.operation = CU_STREAM_MEM_OP_WRITE_VALUE_64;
        ops[1].writeValue.address = (CUdeviceptr)mark_word;
        ops[1].writeValue.value64 = mark;
        ops[1].writeValue.flags = CU_STREAM_WRITE_VALUE_DEFAULT;
        count = 2;
    }
    CD(cuStreamBatchMemOp(st, count, ops, 0));
}

static void mem_op(CUstream st, uint64_t *p, uint64_t v, bool wait) {
    if (wait)
        CD(cuStreamWaitValue64(st, (CUdeviceptr)p, v, CU_STREAM_WAIT_VALUE_GEQ));
    else
        CD(cuStreamWriteValue64(st, (CUdeviceptr)p, v, CU_STREAM_WRITE_VALUE_DEFAULT));
}

// Queues `n` round trips on `st` for one side; `first` pings.
static void queue_round_trips(CUstream st, const Counters &c, const char *mech, bool first, uint64_t base,
                              uint64_t n) {
    uint64_t *out = first ? c.ping : c.pong;
    uint64_t *in = first ? c.pong : c.ping;
    // ours: every step one batch ending with a mark (gpu-ipc's gpu-stream-ops as of ba31259); ours-lite: marks
    // only after writes; batch1: every step its own one-operation batch.
    bool ours = !strcmp(mech, "ours"), lite = !strcmp(mech, "ours-lite"), batch1 = !strcmp(mech, "batch1");
    if (ours || lite || batch1) {
        uint64_t mark = base * 2;
        for (uint64_t v = base + 1; v <= base + n; v++) {
            uint64_t *wait_mark = ours ? c.mark : NULL, *write_mark = batch1 ? NULL : c.mark;
            if (first) {
                batch_op(st, out, v, false, write_mark, ++mark);
                batch_op(st, in, v, true, wait_mark, ++mark);
            } else {
                batch_op(st, in, v, true, wait_mark, ++mark);
                batch_op(st, out, v, false, write_mark, ++mark);
            }
        }
        return;
    }
    for (uint64_t v = base + 1; v <= base + n; v++) {
        if (first) {
            mem_op(st, out, v, false);
            mem_op(st, in, v, true);
        } else {
            mem_op(st, in, v, true);
            mem_op(st, out, v, false);
        }
    }
}

// Two processes (forked before CUDA is touched), each with the shared counters and a non-blocking stream: the
// parent is `first` (it pings, or exports).
struct Pair {
    Shared *s;
    pid_t child;
    bool first;
    Counters c;
    cudaStream_t st;
};

static Pair start_pair(bool dev) {
    Pair p;
    p.s = shared_page();
    p.child = fork();
    p.first = p.child != 0;
    alarm(60);
    CK(cudaSetDevice(0));
    p.c = counters(p.s, dev, p.first);
    CK(cudaStreamCreateWithFlags(&p.st, cudaStreamNonBlocking));
    return p;
}

// rt MEM MECH N: gated (everything queued before the GPU starts: the GPU's round trip) and then rolling
// (queued as the CPU goes: what a caller that submits per round trip sees, and its CPU cost).
static int run_rt(bool dev, const char *mech, uint64_t n) {
    Pair pair = start_pair(dev);
    Shared *s = pair.s;
    pid_t child = pair.child;
    bool first = pair.first;
    Counters c = pair.c;
    cudaStream_t st = pair.st;
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    // Gated: both sides queue everything behind a wait on the gate.
    uint64_t gated = n < 500 ? n : 500;
    barrier(s, 1);
    CD(cuStreamWaitValue64((CUstream)st, (CUdeviceptr)c.gate, 1, CU_STREAM_WAIT_VALUE_GEQ));
    if (first) CK(cudaEventRecord(e0, st));
    queue_round_trips((CUstream)st, c, mech, first, 0, gated);
    if (first) CK(cudaEventRecord(e1, st));
    barrier(s, 2);
    if (first) __atomic_store_n(&s->gate, 1, __ATOMIC_SEQ_CST);
    CK(cudaStreamSynchronize(st));
    float ms = 0;
    if (first) {
        CK(cudaEventElapsedTime(&ms, e0, e1));
        printf("rt.%s.%s.gated_us %.3f us (%lu round trips queued before the start)\n", dev ? "dev" : "host", mech,
               ms * 1000.0 / gated, (unsigned long)gated);
    }
    {
        // Rolling: queued as the CPU goes.
        barrier(s, 3);
        double w0 = now_s(CLOCK_MONOTONIC), c0 = now_s(CLOCK_PROCESS_CPUTIME_ID);
        if (first) CK(cudaEventRecord(e0, st));
        queue_round_trips((CUstream)st, c, mech, first, gated, n);
        if (first) CK(cudaEventRecord(e1, st));
        double cq = now_s(CLOCK_PROCESS_CPUTIME_ID) - c0;
        CK(cudaStreamSynchronize(st));
        double w = now_s(CLOCK_MONOTONIC) - w0;
        if (first) {
            CK(cudaEventElapsedTime(&ms, e0, e1));
            printf("rt.%s.%s.rolling_us %.3f us (gpu events; wall %.3f us)\n", dev ? "dev" : "host", mech,
                   ms * 1000.0 / n, w * 1e6 / n);
        }
        printf("rt.%s.%s.cpu_queue_us_%s %.3f us per round trip\n", dev ? "dev" : "host", mech,
               first ? "ping" : "pong", cq * 1e6 / n);
    }
    unsigned long long t = 0;
    CK(cudaMemcpy(&t, c.timeouts, 8, cudaMemcpyDeviceToHost));
    if (t) printf("rt.%s.%s.timeouts_%s %llu\n", dev ? "dev" : "host", mech, first ? "ping" : "pong", t);
    fflush(stdout);
    if (first) {
        int status = 0;
        waitpid(child, &status, 0);
        return WIFEXITED(status) ? WEXITSTATUS(status) : 1;
    }
    _exit(0);
}

// frames MEM SLOTS N [CONSUMERS]: the producer (parent) fills slot seq % SLOTS and writes published = seq; each
// consumer (a child) waits for it, verifies, writes its released = seq; the producer waits for every consumer's
// released >= seq - SLOTS before reusing a slot (one wait per consumer, as gpu-ipc's gpu-stream-ops producer).
static int run_frames(bool dev, uint64_t slots, uint64_t n, int consumers) {
    Shared *s = shared_page();
    int index = -1;  // -1: the producer; else the consumer's number
    pid_t children[MAX_CONSUMERS];
    for (int i = 0; i < consumers; i++) {
        pid_t pid = fork();
        if (pid == 0) {
            index = i;
            break;
        }
        children[i] = pid;
    }
    bool first = index < 0;
    uint64_t parties = (uint64_t)consumers + 1;
    alarm(120);
    CK(cudaSetDevice(0));
    Counters c = counters(s, dev, first);
    uint64_t *published = c.ping;
    size_t words = FRAME / 16;
    char *buf;
    if (first) {
        CK(cudaMalloc((void **)&buf, FRAME * slots));
        CK(cudaIpcGetMemHandle(&s->frames, buf));
        __atomic_store_n(&s->ready, 2, __ATOMIC_SEQ_CST);
    } else {
        while (__atomic_load_n(&s->ready, __ATOMIC_SEQ_CST) < 2) usleep(100);
        CK(cudaIpcOpenMemHandle((void **)&buf, s->frames, cudaIpcMemLazyEnablePeerAccess));
    }
    unsigned long long *bad;
    CK(cudaMalloc((void **)&bad, 8));
    CK(cudaMemset(bad, 0, 8));
    CK(cudaDeviceSynchronize());
    cudaStream_t st;
    CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    int grid = grid_blocks();
    uint64_t warm = 200;
    barrier(s, 1, parties);
    double w0 = 0, c0 = 0;
    for (uint64_t seq = 1; seq <= warm + n; seq++) {
        if (seq == warm + 1) {
            CK(cudaStreamSynchronize(st));
            barrier(s, 2, parties);
            w0 = now_s(CLOCK_MONOTONIC);
            c0 = now_s(CLOCK_PROCESS_CPUTIME_ID);
        }
        uint4 *slot = (uint4 *)(buf + FRAME * (seq % slots));
        if (first) {
            if (seq > slots)
                for (int i = 0; i < consumers; i++) mem_op((CUstream)st, c.released[i], seq - slots, true);
            k_fill<<<grid, 512, 0, st>>>(slot, words, (uint32_t)seq);
            mem_op((CUstream)st, published, seq, false);
        } else {
            mem_op((CUstream)st, published, seq, true);
            k_verify<<<grid, 512, 0, st>>>(slot, words, (uint32_t)seq, bad);
            mem_op((CUstream)st, c.released[index], seq, false);
        }
    }
    double cq = now_s(CLOCK_PROCESS_CPUTIME_ID) - c0;
    CK(cudaStreamSynchronize(st));
    double w = now_s(CLOCK_MONOTONIC) - w0;
    const char *mem = dev ? "dev" : "host";
    char row[64];
    snprintf(row, sizeof row, "frames.%s.s%lu%s", mem, (unsigned long)slots,
             consumers == 1 ? "" : (consumers == 4 ? ".c4" : ".cN"));
    if (first) {
        printf("%s.fps %.0f frames/s\n", row, n / w);
        printf("%s.cpu_us_producer %.3f us/frame\n", row, cq * 1e6 / n);
    } else {
        unsigned long long b = 0;
        CK(cudaMemcpy(&b, bad, 8, cudaMemcpyDeviceToHost));
        if (index == 0) printf("%s.cpu_us_consumer %.3f us/frame\n", row, cq * 1e6 / n);
        printf("%s.mismatched_words_%d %llu\n", row, index, b);
    }
    fflush(stdout);
    if (first) {
        int failed = 0;
        for (int i = 0; i < consumers; i++) {
            int status = 0;
            waitpid(children[i], &status, 0);
            failed |= !(WIFEXITED(status) && WEXITSTATUS(status) == 0);
        }
        return failed;
    }
    _exit(0);
}

// killwait MEM MECH: the importer (child) queues a GPU-side wait that nobody satisfies on memory shared with the
// exporter (parent): MECH stream (cuStreamWaitValue64) or kernel (a polling kernel, 10 s bound). The parent
// SIGKILLs it and then checks that its own context still works (a kernel and a copy). Under MPS a fault of the
// server shows here as an error in the parent, which never waited on anything.
#include "signal-paths-rtk.cuh"
#include "signal-paths-pipe.cuh"

static int run_killwait(bool dev, const char *mech) {
    Pair pair = start_pair(dev);
    Shared *s = pair.s;
    pid_t child = pair.child;
    bool first = pair.first;
    Counters c = pair.c;
    cudaStream_t st = pair.st;
    const char *mem = dev ? "dev" : "host";
    if (!first) {
        if (!strcmp(mech, "kernel"))
            k_pong<<<1, 1, 0, st>>>(c.pong, c.ping, 1, c.timeouts);
        else
            mem_op((CUstream)st, c.ping, 1, true);
        barrier(s, 1);
        pause();
        _exit(0);
    }
    barrier(s, 1);
    usleep(200000);
    kill(child, SIGKILL);
    int status = 0;
    waitpid(child, &status, 0);
    usleep(1000000);
    char *buf;
    cudaError_t e = cudaMalloc((void **)&buf, 1 << 20);
    if (e == cudaSuccess) {
        k_fill<<<64, 256, 0, st>>>((uint4 *)buf, (1 << 20) / 16, 7);
        e = cudaStreamSynchronize(st);
    }
    uint64_t word = 0;
    if (e == cudaSuccess) e = cudaMemcpy(&word, c.ping, 8, cudaMemcpyDeviceToHost);
    printf("killwait.%s.%s.exporter_after_importer_sigkill %s\n", mem, mech,
           e == cudaSuccess ? "ok" : cudaGetErrorName(e));
    return 0;
}

static int run_single(uint64_t n) {
    CK(cudaSetDevice(0));
    char *buf;
    CK(cudaMalloc((void **)&buf, FRAME));
    unsigned long long *bad;
    CK(cudaMalloc((void **)&bad, 8));
    CK(cudaMemset(bad, 0, 8));
    cudaStream_t st;
    CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    int grid = grid_blocks();
    size_t words = FRAME / 16;
    for (uint64_t seq = 1; seq <= 200; seq++) {
        k_fill<<<grid, 512, 0, st>>>((uint4 *)buf, words, (uint32_t)seq);
        k_verify<<<grid, 512, 0, st>>>((uint4 *)buf, words, (uint32_t)seq, bad);
    }
    CK(cudaStreamSynchronize(st));
    double w0 = now_s(CLOCK_MONOTONIC);
    for (uint64_t seq = 201; seq <= 200 + n; seq++) {
        k_fill<<<grid, 512, 0, st>>>((uint4 *)buf, words, (uint32_t)seq);
        k_verify<<<grid, 512, 0, st>>>((uint4 *)buf, words, (uint32_t)seq, bad);
    }
    CK(cudaStreamSynchronize(st));
    double w = now_s(CLOCK_MONOTONIC) - w0;
    unsigned long long b = 0;
    CK(cudaMemcpy(&b, bad, 8, cudaMemcpyDeviceToHost));
    printf("single.fps %.0f frames/s\nsingle.mismatched_words %llu\n", n / w, b);
    return 0;
}

// cpu N: the CPU cost of one call of each kind, queued in chunks of 256 with a sync between chunks (not timed).
static int run_cpu(uint64_t n) {
    CK(cudaSetDevice(0));
    Shared *s = shared_page();
    Counters c = counters(s, false, true);
    uint64_t *dev;
    CK(cudaMalloc((void **)&dev, 4096));
    CK(cudaMemset(dev, 0, 4096));
    cudaStream_t st;
    CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    cudaEvent_t ev;
    CK(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));
    CK(cudaEventRecord(ev, st));
    CK(cudaDeviceSynchronize());
    const char *names[] = {"write_value_host", "write_value_dev",  "wait_value_host_satisfied",
                           "batch_wait_write_host", "launch_empty", "event_record", "stream_wait_event",
                           "event_query"};
    for (int k = 0; k < 8; k++) {
        double cpu = 0, wall = 0;
        for (uint64_t done = 0; done < n; done += 256) {
            double c0 = now_s(CLOCK_PROCESS_CPUTIME_ID), w0 = now_s(CLOCK_MONOTONIC);
            for (int i = 0; i < 256; i++) {
                switch (k) {
                case 0: mem_op((CUstream)st, c.ping, done + i, false); break;
                case 1: mem_op((CUstream)st, dev, done + i, false); break;
                case 2: mem_op((CUstream)st, c.gate, 0, true); break;
                case 3: {
                    CUstreamBatchMemOpParams ops[2];
                    memset(ops, 0, sizeof ops);
                    ops[0].waitValue.operation = CU_STREAM_MEM_OP_WAIT_VALUE_64;
                    ops[0].waitValue.address = (CUdeviceptr)c.gate;
                    ops[0].waitValue.value64 = 0;
                    ops[0].waitValue.flags = CU_STREAM_WAIT_VALUE_GEQ;
                    ops[1].writeValue.operation = CU_STREAM_MEM_OP_WRITE_VALUE_64;
                    ops[1].writeValue.address = (CUdeviceptr)c.pong;
                    ops[1].writeValue.value64 = done + i;
                    ops[1].writeValue.flags = CU_STREAM_WRITE_VALUE_DEFAULT;
                    CD(cuStreamBatchMemOp((CUstream)st, 2, ops, 0));
                    break;
                }
                case 4: k_empty<<<1, 1, 0, st>>>(); break;
                case 5: CK(cudaEventRecord(ev, st)); break;
                case 6: CK(cudaStreamWaitEvent(st, ev, 0)); break;
                case 7: (void)cudaEventQuery(ev); break;
                }
            }
            cpu += now_s(CLOCK_PROCESS_CPUTIME_ID) - c0;
            wall += now_s(CLOCK_MONOTONIC) - w0;
            CK(cudaStreamSynchronize(st));
        }
        printf("cpu.%s %.3f us cpu per call (wall %.3f us)\n", names[k], cpu * 1e6 / n, wall * 1e6 / n);
    }
    return 0;
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: see the head of signal-paths.cu\n");
        return 2;
    }
    setvbuf(stdout, NULL, _IOLBF, 0);
    const char *mode = argv[1];
    if (!strcmp(mode, "single")) return run_single(strtoull(argv[2], 0, 10));
    if (!strcmp(mode, "cpu")) return run_cpu(strtoull(argv[2], 0, 10));
    if (!strcmp(mode, "rt") && argc == 5) return run_rt(!strcmp(argv[2], "dev"), argv[3], strtoull(argv[4], 0, 10));
    if (!strcmp(mode, "rtk") && argc == 5) return run_rtk(!strcmp(argv[2], "dev"), argv[3], strtoull(argv[4], 0, 10));
    if (!strcmp(mode, "pipe") && argc == 6)
        return run_pipe(atoi(argv[2]), argv[3], strtoull(argv[4], 0, 10), strtoull(argv[5], 0, 10));
    if (!strcmp(mode, "killwait") && argc == 4) return run_killwait(!strcmp(argv[2], "dev"), argv[3]);
    if (!strcmp(mode, "frames") && (argc == 5 || argc == 6)) {
        int consumers = argc == 6 ? atoi(argv[5]) : 1;
        if (consumers < 1 || consumers > MAX_CONSUMERS) {
            fprintf(stderr, "frames: 1 to %d consumers\n", MAX_CONSUMERS);
            return 2;
        }
        return run_frames(!strcmp(argv[2], "dev"), strtoull(argv[3], 0, 10), strtoull(argv[4], 0, 10), consumers);
    }
    fprintf(stderr, "usage: see the head of signal-paths.cu\n");
    return 2;
}
