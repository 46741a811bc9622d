// Kernels of `gpu-ipc probe coherency`: a writer publishes a payload and then a flag; a reader polls the flag and
// then reads the payload. Each variant is its own extern "C" kernel, so that the instruction under test is the only
// thing that differs between two kernels and `cuobjdump -sass -fun NAME` shows what it became.
//
// The instructions under test are written as inline PTX (never left to the compiler's choice), except the "plain"
// variants, which are ordinary C++ accesses on purpose: how the compiler treats them is part of the answer.
//
// The shared buffer (device memory of one backend, or host memory registered with CUDA for the CPU writer):
//
//     offset 0     flag   u64, on its own 128-byte line: the round the writer has published (0 before the first)
//     offset 128   ack    u64, on its own line: the round the reader has finished reading
//     offset 256   payload, PAYLOAD_WORDS u32 (several 128-byte lines); round r writes coh_value(r, i) into word i
//
// Protocol for round r = 1..rounds (the back channel, ack, always uses the strongest pair, st.release.sys and
// ld.acquire.sys, so that only the forward pair under test decides the outcome):
//     writer: wait until ack >= r - 1; write the payload of round r (plain stores); stamp %globaltimer; write flag = r
//             with the variant under test.
//     reader: poll flag until >= r with the variant under test; stamp %globaltimer; optionally fence; read every
//             payload word with the variant under test, count the words that are not coh_value(r, i); ack = r.
// The reader read every payload line in round r - 1, so its L1 holds them when round r starts: a load that may be
// served from a stale L1 line shows up as stale words.
//
// Every wait is bounded by %globaltimer (round_timeout_ns per round). A flag or ack of COH_ABORT or more means "stop
// now" (the host writes it to release a kernel whose peer has gone). Results (u64 each):
//     results[0] rounds completed   [1] stale rounds   [2] stale words   [3] timed-out rounds (0 or 1: a timeout
//     ends the kernel)   [4] aborted (0/1)   [5] first stale round (0 if none)
// One warp runs each side: lane L reads/writes words L, L+32, L+64, ... (one 128-byte line per step).

#define COH_ABORT (1ull << 62)
#define COH_RESULTS 6

static __device__ __forceinline__ unsigned long long coh_globaltimer()
{
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

static __device__ __forceinline__ unsigned int coh_value(unsigned long long round, unsigned long long index)
{
    unsigned int x = (unsigned int)round * 0x85EBCA6Bu ^ (unsigned int)index * 0x9E3779B1u ^ 0x5A5A5A5Au;
    return x ^ (x >> 15);
}

// ---- flag loads (the reader's poll) ----
enum CohLoad { LOAD_PLAIN = 0, LOAD_VOLATILE = 1, LOAD_RELAXED_SYS = 2, LOAD_ACQUIRE_GPU = 3, LOAD_ACQUIRE_SYS = 4 };

template <int K> static __device__ __forceinline__ unsigned long long coh_load_flag(const unsigned long long* p);

template <> __device__ __forceinline__ unsigned long long coh_load_flag<LOAD_PLAIN>(const unsigned long long* p)
{
    return *p;
}
template <> __device__ __forceinline__ unsigned long long coh_load_flag<LOAD_VOLATILE>(const unsigned long long* p)
{
    unsigned long long v;
    asm volatile("ld.volatile.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
    return v;
}
template <> __device__ __forceinline__ unsigned long long coh_load_flag<LOAD_RELAXED_SYS>(const unsigned long long* p)
{
    unsigned long long v;
    asm volatile("ld.relaxed.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
    return v;
}
template <> __device__ __forceinline__ unsigned long long coh_load_flag<LOAD_ACQUIRE_GPU>(const unsigned long long* p)
{
    unsigned long long v;
    asm volatile("ld.acquire.gpu.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
    return v;
}
template <> __device__ __forceinline__ unsigned long long coh_load_flag<LOAD_ACQUIRE_SYS>(const unsigned long long* p)
{
    unsigned long long v;
    asm volatile("ld.acquire.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
    return v;
}

// ---- payload loads ----
enum CohPayload { PAYLOAD_PLAIN = 0, PAYLOAD_VOLATILE = 1 };

template <int K> static __device__ __forceinline__ unsigned int coh_load_word(const unsigned int* p);
template <> __device__ __forceinline__ unsigned int coh_load_word<PAYLOAD_PLAIN>(const unsigned int* p)
{
    return *p;
}
template <> __device__ __forceinline__ unsigned int coh_load_word<PAYLOAD_VOLATILE>(const unsigned int* p)
{
    unsigned int v;
    asm volatile("ld.volatile.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}

// ---- flag stores (the writer's publish) ----
enum CohStore { STORE_PLAIN = 0, STORE_VOLATILE = 1, STORE_THREADFENCE = 2, STORE_RELEASE_GPU = 3, STORE_RELEASE_SYS = 4 };

template <int K> static __device__ __forceinline__ void coh_store_flag(unsigned long long* p, unsigned long long v);
template <> __device__ __forceinline__ void coh_store_flag<STORE_PLAIN>(unsigned long long* p, unsigned long long v)
{
    *p = v;
}
template <> __device__ __forceinline__ void coh_store_flag<STORE_VOLATILE>(unsigned long long* p, unsigned long long v)
{
    asm volatile("st.volatile.global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}
template <>
__device__ __forceinline__ void coh_store_flag<STORE_THREADFENCE>(unsigned long long* p, unsigned long long v)
{
    __threadfence();  // fence.sc.gpu (membar.gl)
    *p = v;
}
template <>
__device__ __forceinline__ void coh_store_flag<STORE_RELEASE_GPU>(unsigned long long* p, unsigned long long v)
{
    asm volatile("st.release.gpu.global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}
template <>
__device__ __forceinline__ void coh_store_flag<STORE_RELEASE_SYS>(unsigned long long* p, unsigned long long v)
{
    asm volatile("st.release.sys.global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}

// The back channel: always the strongest pair.
static __device__ __forceinline__ unsigned long long coh_load_ack(const unsigned long long* p)
{
    unsigned long long v;
    asm volatile("ld.acquire.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
    return v;
}
static __device__ __forceinline__ void coh_store_ack(unsigned long long* p, unsigned long long v)
{
    asm volatile("st.release.sys.global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}

template <int LOAD, int PAYLOAD, int FENCE>
static __device__ void coh_reader(const unsigned long long* flag, unsigned long long* ack, const unsigned int* payload,
                                  unsigned long long payload_words, unsigned long long rounds,
                                  unsigned long long round_timeout_ns, unsigned long long* seen_ts,
                                  unsigned long long* results)
{
    const unsigned int lane = threadIdx.x & 31u;
    unsigned long long done = 0, stale_rounds = 0, stale_words = 0, timeouts = 0, aborted = 0, first_stale = 0;
    for (unsigned long long r = 1; r <= rounds; ++r) {
        const unsigned long long start = coh_globaltimer();
        unsigned long long f = coh_load_flag<LOAD>(flag);
        while (f < r) {
            if (coh_globaltimer() - start > round_timeout_ns) {
                break;
            }
            f = coh_load_flag<LOAD>(flag);
        }
        const unsigned long long seen = coh_globaltimer();
        // Every lane decides the same way only if it saw the same flag: take lane 0's view.
        f = __shfl_sync(0xFFFFFFFFu, f, 0);
        if (f >= COH_ABORT) {
            aborted = 1;
            break;
        }
        if (f < r) {
            timeouts = 1;
            break;
        }
        if (FENCE) {
            __threadfence();
        }
        unsigned long long bad = 0;
        for (unsigned long long i = lane; i < payload_words; i += 32) {
            bad += (unsigned long long)(coh_load_word<PAYLOAD>(payload + i) != coh_value(r, i));
        }
        for (int off = 16; off > 0; off >>= 1) {
            bad += __shfl_down_sync(0xFFFFFFFFu, bad, off);
        }
        __syncwarp();
        if (lane == 0) {
            seen_ts[r - 1] = seen;
            if (bad != 0) {
                stale_rounds += 1;
                stale_words += bad;
                if (first_stale == 0) {
                    first_stale = r;
                }
            }
            coh_store_ack(ack, r);
        }
        done = r;
    }
    if (lane == 0) {
        results[0] = done;
        results[1] = stale_rounds;
        results[2] = stale_words;
        results[3] = timeouts;
        results[4] = aborted;
        results[5] = first_stale;
    }
}

template <int STORE>
static __device__ void coh_writer(unsigned long long* flag, const unsigned long long* ack, unsigned int* payload,
                                  unsigned long long payload_words, unsigned long long rounds,
                                  unsigned long long round_timeout_ns, unsigned long long* write_ts,
                                  unsigned long long* results)
{
    const unsigned int lane = threadIdx.x & 31u;
    unsigned long long done = 0, timeouts = 0, aborted = 0;
    for (unsigned long long r = 1; r <= rounds; ++r) {
        const unsigned long long start = coh_globaltimer();
        unsigned long long a = coh_load_ack(ack);
        while (a + 1 < r) {
            if (coh_globaltimer() - start > round_timeout_ns) {
                break;
            }
            a = coh_load_ack(ack);
        }
        a = __shfl_sync(0xFFFFFFFFu, a, 0);
        if (a >= COH_ABORT) {
            aborted = 1;
            break;
        }
        if (a + 1 < r) {
            timeouts = 1;
            break;
        }
        for (unsigned long long i = lane; i < payload_words; i += 32) {
            payload[i] = coh_value(r, i);
        }
        __syncwarp();
        if (lane == 0) {
            write_ts[r - 1] = coh_globaltimer();
            coh_store_flag<STORE>(flag, r);
        }
        done = r;
    }
    if (lane == 0) {
        results[0] = done;
        results[3] = timeouts;
        results[4] = aborted;
    }
}

#define COH_READER(NAME, LOAD, PAYLOAD, FENCE)                                                                       \
    extern "C" __global__ void NAME(const unsigned long long* flag, unsigned long long* ack,                         \
                                    const unsigned int* payload, unsigned long long payload_words,                   \
                                    unsigned long long rounds, unsigned long long round_timeout_ns,                  \
                                    unsigned long long* seen_ts, unsigned long long* results)                        \
    {                                                                                                                \
        coh_reader<LOAD, PAYLOAD, FENCE>(flag, ack, payload, payload_words, rounds, round_timeout_ns, seen_ts,        \
                                         results);                                                                   \
    }

// Names: gpu_ipc_coh_read_<flag load>_<payload load>_<fence or nofence>.
COH_READER(gpu_ipc_coh_read_plain_plain_nofence, LOAD_PLAIN, PAYLOAD_PLAIN, 0)
COH_READER(gpu_ipc_coh_read_plain_plain_fence, LOAD_PLAIN, PAYLOAD_PLAIN, 1)
COH_READER(gpu_ipc_coh_read_plain_volatile_nofence, LOAD_PLAIN, PAYLOAD_VOLATILE, 0)
COH_READER(gpu_ipc_coh_read_plain_volatile_fence, LOAD_PLAIN, PAYLOAD_VOLATILE, 1)
COH_READER(gpu_ipc_coh_read_volatile_plain_nofence, LOAD_VOLATILE, PAYLOAD_PLAIN, 0)
COH_READER(gpu_ipc_coh_read_volatile_plain_fence, LOAD_VOLATILE, PAYLOAD_PLAIN, 1)
COH_READER(gpu_ipc_coh_read_volatile_volatile_nofence, LOAD_VOLATILE, PAYLOAD_VOLATILE, 0)
COH_READER(gpu_ipc_coh_read_volatile_volatile_fence, LOAD_VOLATILE, PAYLOAD_VOLATILE, 1)
COH_READER(gpu_ipc_coh_read_relaxedsys_plain_nofence, LOAD_RELAXED_SYS, PAYLOAD_PLAIN, 0)
COH_READER(gpu_ipc_coh_read_relaxedsys_plain_fence, LOAD_RELAXED_SYS, PAYLOAD_PLAIN, 1)
COH_READER(gpu_ipc_coh_read_relaxedsys_volatile_nofence, LOAD_RELAXED_SYS, PAYLOAD_VOLATILE, 0)
COH_READER(gpu_ipc_coh_read_relaxedsys_volatile_fence, LOAD_RELAXED_SYS, PAYLOAD_VOLATILE, 1)
COH_READER(gpu_ipc_coh_read_acquiregpu_plain_nofence, LOAD_ACQUIRE_GPU, PAYLOAD_PLAIN, 0)
COH_READER(gpu_ipc_coh_read_acquiregpu_plain_fence, LOAD_ACQUIRE_GPU, PAYLOAD_PLAIN, 1)
COH_READER(gpu_ipc_coh_read_acquiregpu_volatile_nofence, LOAD_ACQUIRE_GPU, PAYLOAD_VOLATILE, 0)
COH_READER(gpu_ipc_coh_read_acquiregpu_volatile_fence, LOAD_ACQUIRE_GPU, PAYLOAD_VOLATILE, 1)
COH_READER(gpu_ipc_coh_read_acquiresys_plain_nofence, LOAD_ACQUIRE_SYS, PAYLOAD_PLAIN, 0)
COH_READER(gpu_ipc_coh_read_acquiresys_plain_fence, LOAD_ACQUIRE_SYS, PAYLOAD_PLAIN, 1)
COH_READER(gpu_ipc_coh_read_acquiresys_volatile_nofence, LOAD_ACQUIRE_SYS, PAYLOAD_VOLATILE, 0)
COH_READER(gpu_ipc_coh_read_acquiresys_volatile_fence, LOAD_ACQUIRE_SYS, PAYLOAD_VOLATILE, 1)

#define COH_WRITER(NAME, STORE)                                                                                      \
    extern "C" __global__ void NAME(unsigned long long* flag, const unsigned long long* ack, unsigned int* payload,   \
                                    unsigned long long payload_words, unsigned long long rounds,                     \
                                    unsigned long long round_timeout_ns, unsigned long long* write_ts,               \
                                    unsigned long long* results)                                                     \
    {                                                                                                                \
        coh_writer<STORE>(flag, ack, payload, payload_words, rounds, round_timeout_ns, write_ts, results);           \
    }

// Names: gpu_ipc_coh_write_<flag store>.
COH_WRITER(gpu_ipc_coh_write_plain, STORE_PLAIN)
COH_WRITER(gpu_ipc_coh_write_volatile, STORE_VOLATILE)
COH_WRITER(gpu_ipc_coh_write_threadfence, STORE_THREADFENCE)
COH_WRITER(gpu_ipc_coh_write_releasegpu, STORE_RELEASE_GPU)
COH_WRITER(gpu_ipc_coh_write_releasesys, STORE_RELEASE_SYS)

// The host-driven sides, one round per launch (one warp):
// - writer: the stream waits for ack >= r - 1 (cuStreamWaitValue64), this kernel writes the payload of round r and
//   stamps write_ts[r-1], then cuStreamWriteValue64(flag, r) publishes (with its default memory barrier).
// - reader: the stream waits for flag >= r (cuStreamWaitValue64), this kernel stamps seen_ts[r-1] and checks the
//   payload (plain loads), then cuStreamWriteValue64(ack, r). results as above (accumulated over launches).
extern "C" __global__ void gpu_ipc_coh_payload_write(unsigned int* payload, unsigned long long payload_words,
                                                     unsigned long long round, unsigned long long* write_ts)
{
    const unsigned int lane = threadIdx.x & 31u;
    for (unsigned long long i = lane; i < payload_words; i += 32) {
        payload[i] = coh_value(round, i);
    }
    __syncwarp();
    if (lane == 0) {
        write_ts[round - 1] = coh_globaltimer();
    }
}

extern "C" __global__ void gpu_ipc_coh_payload_check(const unsigned long long* flag, const unsigned int* payload,
                                                     unsigned long long payload_words, unsigned long long round,
                                                     unsigned long long* seen_ts, unsigned long long* results)
{
    const unsigned int lane = threadIdx.x & 31u;
    const unsigned long long seen = coh_globaltimer();
    // The stream wait let us through; a flag of COH_ABORT or more means the host released it: nothing to check.
    unsigned long long f;
    asm volatile("ld.relaxed.sys.global.u64 %0, [%1];" : "=l"(f) : "l"(flag) : "memory");
    f = __shfl_sync(0xFFFFFFFFu, f, 0);
    if (f >= COH_ABORT) {
        if (lane == 0) {
            results[4] = 1;
        }
        return;
    }
    unsigned long long bad = 0;
    for (unsigned long long i = lane; i < payload_words; i += 32) {
        bad += (unsigned long long)(payload[i] != coh_value(round, i));
    }
    for (int off = 16; off > 0; off >>= 1) {
        bad += __shfl_down_sync(0xFFFFFFFFu, bad, off);
    }
    if (lane == 0) {
        seen_ts[round - 1] = seen;
        results[0] = round;
        if (bad != 0) {
            results[1] += 1;
            results[2] += bad;
            if (results[5] == 0) {
                results[5] = round;
            }
        }
    }
}
