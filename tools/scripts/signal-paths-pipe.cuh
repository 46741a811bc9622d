// signal-paths, `pipe`: fill -> verify of 4K frames through SLOTS buffers, every kernel stamping its start and end
// with %globaltimer (one clock for every process on the GPU), so that a run says where its time per frame goes:
// each kernel's duration, the gaps a stream leaves between two of its kernels, the handoff from a fill's end to its
// verify's start, and how much of the time the two kernels overlap. Included by signal-paths.cu after its shared
// helpers (gtimer, Counters, counters, mem_op, barrier, shared_page, grid_blocks).
//
//   pipe PROCS MECH SLOTS N   PROCS 1: one process, fill on one stream and verify on another (the bench's pipelined
//                             reference when MECH is event); 2: a producer and a consumer process.
//                             MECH event: cuStreamWaitEvent on the other side's event (PROCS 2: IPC events; each CPU
//                             queues its wait once the other has queued the record, so no CPU waits for the GPU);
//                             host / dev: cuStreamWaitValue64 / cuStreamWriteValue64 on counters in registered host
//                             memory / device memory (what gpu-ipc's gpu-stream-ops does). khost / kdev: a one-warp
//                             kernel polls the counter (host memory, ld.acquire.sys; device memory, ld.acquire.gpu)
//                             and a one-thread kernel stores it (st.release.sys / .gpu): gpu-ipc's gpu-poll, on the
//                             control block or on device words (two processes: under MPS only); kdevm: kdev with
//                             the stores gpu-poll's kernels add (an outcome and a progress mark after a wait, the
//                             counter's host copy and the mark after a store).
#include <algorithm>
#include <vector>

// The fill and verify of signal-paths.cu, with the earliest block start and the latest block end of each launch.
__global__ void k_fill_t(uint4 *p, size_t n, uint32_t v, unsigned long long *t0, unsigned long long *t1) {
    if (threadIdx.x == 0) atomicMin(t0, (unsigned long long)gtimer());
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        p[i] = make_uint4(v, v + 1, v + 2, v + 3);
    __syncthreads();
    if (threadIdx.x == 0) atomicMax(t1, (unsigned long long)gtimer());
}
__global__ void k_verify_t(const uint4 *p, size_t n, uint32_t v, unsigned long long *bad, unsigned long long *t0,
                           unsigned long long *t1) {
    if (threadIdx.x == 0) atomicMin(t0, (unsigned long long)gtimer());
    unsigned long long b = 0;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        uint4 w = p[i];
        b += (w.x != v) + (w.y != v + 1) + (w.z != v + 2) + (w.w != v + 3);
    }
    if (b) atomicAdd(bad, b);
    __syncthreads();
    if (threadIdx.x == 0) atomicMax(t1, (unsigned long long)gtimer());
}

// The polling handoff of `khost` / `kdev`: wait until *p >= v (bounded), store *p = v.
__global__ void k_wait_counter(const uint64_t *p, uint64_t v, int gpu_scope) {
    uint64_t start = gtimer(), seen;
    do {
        if (gpu_scope)
            asm volatile("ld.acquire.gpu.global.u64 %0, [%1];" : "=l"(seen) : "l"(p) : "memory");
        else
            seen = ld_acquire_sys(p);
    } while (seen < v && gtimer() - start < SPIN_LIMIT_NS);
}
__global__ void k_store_counter(uint64_t *p, uint64_t v, int gpu_scope) {
    if (gpu_scope)
        asm volatile("st.release.gpu.global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
    else
        st_release_sys(p, v);
}

// `kdevm`: kdev with the stores gpu-ipc's gpu-poll kernels add (host_words: this side's words in registered host
// memory): after a wait, an outcome word (relaxed) and a progress mark (st.release.sys); a store also writes the
// counter's copy in host memory (st.release.sys) and then the mark.
__global__ void k_wait_counter_m(const uint64_t *p, uint64_t v, uint64_t *host_words, uint64_t mark) {
    uint64_t start = gtimer(), seen;
    do {
        asm volatile("ld.acquire.gpu.global.u64 %0, [%1];" : "=l"(seen) : "l"(p) : "memory");
    } while (seen < v && gtimer() - start < SPIN_LIMIT_NS);
    st_relaxed_sys(host_words + 1, v);
    st_release_sys(host_words + 2, mark);
}
__global__ void k_store_counter_m(uint64_t *p, uint64_t v, uint64_t *host_words, uint64_t mark) {
    asm volatile("st.release.gpu.global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
    st_release_sys(host_words, v);
    st_release_sys(host_words + 2, mark);
}

// One side's handoff step: wait for *p >= v, or store *p = v, by MECH (`host_words`, `mark`: for kdevm).
static void pipe_step(const char *mech, cudaStream_t st, uint64_t *p, uint64_t v, bool wait, uint64_t *host_words,
                      uint64_t mark) {
    if (!strcmp(mech, "kdevm")) {
        if (wait)
            k_wait_counter_m<<<1, 32, 0, st>>>(p, v, host_words, mark);
        else
            k_store_counter_m<<<1, 1, 0, st>>>(p, v, host_words, mark);
    } else if (mech[0] == 'k') {
        int gpu_scope = !strcmp(mech, "kdev");
        if (wait)
            k_wait_counter<<<1, 32, 0, st>>>(p, v, gpu_scope);
        else
            k_store_counter<<<1, 1, 0, st>>>(p, v, gpu_scope);
    } else {
        mem_op((CUstream)st, p, v, wait);
    }
}

// Shared between the two processes of `pipe 2 event`: how far each CPU has queued, and the IPC event handles.
struct PipeShared {
    volatile uint64_t published_queued;  // the last frame whose "filled" record the producer queued
    volatile uint64_t released_queued;   // the last frame whose "verified" record the consumer queued
    volatile uint64_t handles_ready;
    cudaIpcEventHandle_t filled[32];
    cudaIpcEventHandle_t verified[32];
};

static void spin_until(volatile uint64_t *word, uint64_t at_least) {
    double start = now_s(CLOCK_MONOTONIC);
    while (__atomic_load_n(word, __ATOMIC_ACQUIRE) < at_least) {
        if (now_s(CLOCK_MONOTONIC) - start > 20) {
            fprintf(stderr, "pipe: the other process did not queue frame %lu within 20 s\n", (unsigned long)at_least);
            exit(1);
        }
    }
}

static double median(std::vector<double> v) {
    if (v.empty()) return 0;
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
}

// Prints the timeline's figures for frames [from, to): stamps[k][seq], k = fill start, fill end, verify start,
// verify end (ns of %globaltimer).
static void pipe_report(const char *row, const std::vector<uint64_t> *stamps, uint64_t from, uint64_t to) {
    std::vector<double> fill, verify, fill_gap, verify_gap, handoff;
    for (uint64_t s = from; s < to; s++) {
        fill.push_back((stamps[1][s] - stamps[0][s]) * 1e-3);
        verify.push_back((stamps[3][s] - stamps[2][s]) * 1e-3);
        handoff.push_back(((double)stamps[2][s] - (double)stamps[1][s]) * 1e-3);
        if (s + 1 < to) {
            fill_gap.push_back(((double)stamps[0][s + 1] - (double)stamps[1][s]) * 1e-3);
            verify_gap.push_back(((double)stamps[2][s + 1] - (double)stamps[3][s]) * 1e-3);
        }
    }
    // Time with both kernels running, and with neither, over the window (intervals of one kind never overlap:
    // each kind runs on one stream).
    uint64_t start = std::min(stamps[0][from], stamps[2][from]);
    uint64_t end = std::max(stamps[1][to - 1], stamps[3][to - 1]);
    double both = 0, busy = 0;
    {
        std::vector<std::pair<uint64_t, int>> edges;
        for (uint64_t s = from; s < to; s++) {
            edges.push_back({stamps[0][s], 1});
            edges.push_back({stamps[1][s], -1});
            edges.push_back({stamps[2][s], 1});
            edges.push_back({stamps[3][s], -1});
        }
        std::sort(edges.begin(), edges.end());
        int running = 0;
        uint64_t last = start;
        for (auto &e : edges) {
            if (running >= 1) busy += e.first - last;
            if (running >= 2) both += e.first - last;
            running += e.second;
            last = e.first;
        }
    }
    double span = (double)(end - start), n = (double)(to - from);
    printf("%s.timeline_us_per_frame %.3f us\n", row, span * 1e-3 / n);
    printf("%s.fill_us_p50 %.3f us\n", row, median(fill));
    printf("%s.verify_us_p50 %.3f us\n", row, median(verify));
    printf("%s.fill_gap_us_p50 %.3f us\n", row, median(fill_gap));
    printf("%s.verify_gap_us_p50 %.3f us\n", row, median(verify_gap));
    printf("%s.handoff_us_p50 %.3f us\n", row, median(handoff));
    printf("%s.both_running_share %.3f of the time\n", row, both / span);
    printf("%s.idle_share %.3f of the time\n", row, 1 - busy / span);
}

static int run_pipe(int procs, const char *mech, uint64_t slots, uint64_t n) {
    bool event = !strcmp(mech, "event"), dev = !strcmp(mech, "dev") || !strcmp(mech, "kdev") || !strcmp(mech, "kdevm");
    if ((!event && !dev && strcmp(mech, "host") && strcmp(mech, "khost")) || slots < 1 || slots > 32 || (procs != 1 && procs != 2)) {
        fprintf(stderr, "pipe: PROCS 1|2, MECH event|host|dev|khost|kdev|kdevm, SLOTS 1..32\n");
        return 2;
    }
    const uint64_t warm = 200, total = warm + n;
    Shared *s = shared_page();
    PipeShared *ps = (PipeShared *)mmap(NULL, sizeof(PipeShared), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS,
                                        -1, 0);
    uint64_t *verify_stamps = (uint64_t *)mmap(NULL, 2 * 8 * (total + 1), PROT_READ | PROT_WRITE,
                                               MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (ps == MAP_FAILED || verify_stamps == MAP_FAILED) {
        perror("mmap");
        return 1;
    }
    memset((void *)ps, 0, sizeof(PipeShared));
    pid_t child = procs == 2 ? fork() : 0;
    bool producer = procs == 1 || child != 0, consumer = procs == 1 || child == 0;
    alarm(120);
    CK(cudaSetDevice(0));
    // Counters: published at ping, released at pong (host: the registered page; dev: device memory, shared).
    Counters c;
    memset(&c, 0, sizeof c);
    if (!event) c = counters(s, dev, producer);
    size_t words = FRAME / 16;
    char *buf;
    if (producer) {
        CK(cudaMalloc((void **)&buf, FRAME * slots));
        if (procs == 2) {
            CK(cudaIpcGetMemHandle(&s->frames, buf));
            __atomic_store_n(&s->ready, 2, __ATOMIC_SEQ_CST);
        }
    } else {
        while (__atomic_load_n(&s->ready, __ATOMIC_SEQ_CST) < 2) usleep(100);
        CK(cudaIpcOpenMemHandle((void **)&buf, s->frames, cudaIpcMemLazyEnablePeerAccess));
    }
    // Events: the producer's "filled" and the consumer's "verified", one per slot.
    cudaEvent_t filled[32], verified[32];
    unsigned flags = cudaEventDisableTiming | (procs == 2 ? cudaEventInterprocess : 0);
    if (event) {
        for (uint64_t i = 0; i < slots; i++) {
            if (producer) CK(cudaEventCreateWithFlags(&filled[i], flags));
            if (consumer) CK(cudaEventCreateWithFlags(&verified[i], flags));
        }
        if (procs == 2) {
            for (uint64_t i = 0; i < slots; i++) {
                if (producer) CK(cudaIpcGetEventHandle(&ps->filled[i], filled[i]));
                else CK(cudaIpcGetEventHandle(&ps->verified[i], verified[i]));
            }
            __atomic_fetch_add(&ps->handles_ready, 1, __ATOMIC_SEQ_CST);
            spin_until(&ps->handles_ready, 2);
            for (uint64_t i = 0; i < slots; i++) {
                if (producer) CK(cudaIpcOpenEventHandle(&verified[i], ps->verified[i]));
                else CK(cudaIpcOpenEventHandle(&filled[i], ps->filled[i]));
            }
        }
    }
    // Stamps in device memory: fill start, fill end, verify start, verify end per frame (starts set high for min).
    unsigned long long *t[4], *bad;
    for (int k = 0; k < 4; k++) {
        CK(cudaMalloc((void **)&t[k], 8 * (total + 1)));
        CK(cudaMemset(t[k], k % 2 == 0 ? 0xff : 0, 8 * (total + 1)));
    }
    CK(cudaMalloc((void **)&bad, 8));
    CK(cudaMemset(bad, 0, 8));
    CK(cudaDeviceSynchronize());
    cudaStream_t fill_st = 0, verify_st = 0;
    if (producer) CK(cudaStreamCreateWithFlags(&fill_st, cudaStreamNonBlocking));
    if (consumer) CK(cudaStreamCreateWithFlags(&verify_st, cudaStreamNonBlocking));
    int grid = grid_blocks();
    if (procs == 2) barrier(s, 1, 2);
    double w0 = 0;
    for (uint64_t seq = 1; seq <= total; seq++) {
        if (seq == warm + 1) {
            if (producer) CK(cudaStreamSynchronize(fill_st));
            if (consumer) CK(cudaStreamSynchronize(verify_st));
            if (procs == 2) barrier(s, 2, 2);
            w0 = now_s(CLOCK_MONOTONIC);
        }
        uint64_t slot = seq % slots;
        uint4 *frame = (uint4 *)(buf + FRAME * slot);
        if (producer) {
            if (seq > slots) {
                if (event) {
                    if (procs == 2) spin_until(&ps->released_queued, seq - slots);
                    CK(cudaStreamWaitEvent(fill_st, verified[slot], 0));
                } else {
                    pipe_step(mech, fill_st, c.pong, seq - slots, true, c.host_words, 2 * seq);
                }
            }
            k_fill_t<<<grid, 512, 0, fill_st>>>(frame, words, (uint32_t)seq, t[0] + seq, t[1] + seq);
            if (event) {
                CK(cudaEventRecord(filled[slot], fill_st));
                __atomic_store_n(&ps->published_queued, seq, __ATOMIC_RELEASE);
            } else {
                pipe_step(mech, fill_st, c.ping, seq, false, c.host_words, 2 * seq + 1);
            }
        }
        if (consumer) {
            if (event) {
                if (procs == 2) spin_until(&ps->published_queued, seq);
                CK(cudaStreamWaitEvent(verify_st, filled[slot], 0));
            } else {
                pipe_step(mech, verify_st, c.ping, seq, true, c.host_words + 8, 2 * seq);
            }
            k_verify_t<<<grid, 512, 0, verify_st>>>(frame, words, (uint32_t)seq, bad, t[2] + seq, t[3] + seq);
            if (event) {
                CK(cudaEventRecord(verified[slot], verify_st));
                __atomic_store_n(&ps->released_queued, seq, __ATOMIC_RELEASE);
            } else {
                pipe_step(mech, verify_st, c.pong, seq, false, c.host_words + 8, 2 * seq + 1);
            }
        }
    }
    if (producer) CK(cudaStreamSynchronize(fill_st));
    if (consumer) CK(cudaStreamSynchronize(verify_st));
    double w = now_s(CLOCK_MONOTONIC) - w0;
    if (consumer) {
        CK(cudaMemcpy(verify_stamps, t[2], 8 * (total + 1), cudaMemcpyDeviceToHost));
        CK(cudaMemcpy(verify_stamps + total + 1, t[3], 8 * (total + 1), cudaMemcpyDeviceToHost));
        unsigned long long b = 0;
        CK(cudaMemcpy(&b, bad, 8, cudaMemcpyDeviceToHost));
        if (b) printf("pipe.%d.%s.s%lu.mismatched_words %llu\n", procs, mech, (unsigned long)slots, b);
    }
    if (!producer) _exit(0);
    int failed = 0;
    if (procs == 2) {
        int status = 0;
        waitpid(child, &status, 0);
        failed = !(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    }
    if (failed) return 1;
    std::vector<uint64_t> stamps[4];
    for (int k = 0; k < 2; k++) {
        stamps[k].resize(total + 1);
        CK(cudaMemcpy(stamps[k].data(), t[k], 8 * (total + 1), cudaMemcpyDeviceToHost));
    }
    stamps[2].assign(verify_stamps, verify_stamps + total + 1);
    stamps[3].assign(verify_stamps + total + 1, verify_stamps + 2 * (total + 1));
    char row[64];
    snprintf(row, sizeof row, "pipe.%d.%s.s%lu", procs, mech, (unsigned long)slots);
    printf("%s.fps %.0f frames/s\n", row, n / w);
    pipe_report(row, stamps, warm + 1, total + 1);
    return 0;
}
