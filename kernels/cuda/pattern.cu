// Frame check kernels of gpu-ipc: fill a frame with a pattern that depends on its sequence number, count the
// words of a frame that do not hold the pattern of the sequence the reader expects (also behind the frame's stamp,
// so that a frame a dead producer never wrote is skipped, not counted), and XOR a frame into another (the pipeline
// example's transform).
//
// The only #include is the ring's device API (gpu_ipc_ring.cuh, for the stamp rule): NVRTC (scripts/gen_kernels.py)
// and nvcc both compile this file as it is, and the only names used beyond the language are the ones both
// compilers predefine (uint4, make_uint4, __shfl_down_sync, atomicAdd, threadIdx and friends).

#include "gpu_ipc_ring.cuh"
//
// The pattern (docs/kernels.md; the Rust host reference is kernels/src/pattern.rs and must match bit for bit):
//
//     x = (u32)index * 0x9E3779B1 ^ (u32)seq * 0x85EBCA6B ^ 0xA5A5A5A5      (32-bit wrapping products)
//     pattern(seq, index) = x ^ (x >> 16)
//
// Why this shape:
// - index and seq each go through an odd multiplier, a bijection on u32, so two words of one frame (fewer than
//   2^32 words) never hold the same value: a shifted or misplaced copy is caught, and neighbours always differ.
// - for a fixed index, seq -> pattern is a bijection of seq mod 2^32, so two sequences closer than 2^32 give a
//   different value in *every* word: a stale or torn frame is caught word by word. Only the low 32 bits of seq
//   may take part: a u32 word cannot tell apart more than 2^32 sequences, and mixing in seq >> 32 makes some
//   pair of sequences across a 2^32 boundary collide in every word.
// - x ^ (x >> 16) is a bijection too (it keeps both properties) and lets the high bits reach the low ones.
//
// Known vectors (also asserted by kernels/src/pattern.rs):
//     pattern(0, 0)                         = 0xA5A50000
//     pattern(0, 1)                         = 0x3B92E786
//     pattern(1, 0)                         = 0x204E4F80
//     pattern(1, 1)                         = 0xBE79A806
//     pattern(0xffffffff, 7)                = 0x8C354FD2
//     pattern(0x100000000, 7)               = 0xF6210053
//     pattern(0x123456789abcdef0, 0xbc614e) = 0x3970366B
//     pattern(0x2a, 0xffffffff)             = 0x3CC22AA6
//     pattern(0x2a, 0x100000000)            = 0x5D0ACD21
// (pattern(0x100000000, i) == pattern(0, i) by design: the window of distinct sequences is 2^32 wide.)
//
// Launch contract (the typed launchers follow it): 1-D grid and 1-D blocks of any size (a partial last warp is
// handled). No thread returns early, so the warp reduction of the verify kernel always sees every live lane.
// Any grid size is correct (grid-stride loops). Measured on an H100 (driver 580, 512 MiB buffer), 8 blocks of
// 256 per SM: fill 3.1 TB/s, verify 3.05 TB/s, against 3.2 TB/s for cuMemsetD32; a 25 MB frame takes ~10-12 us.
// `dst` / `src` must be 4-byte aligned; 16-byte alignment is not required (a scalar head and tail take the
// words outside the aligned bulk, which moves 16 bytes per access).

#define GPU_IPC_INDEX_MUL 0x9E3779B1u
#define GPU_IPC_SEQ_MUL 0x85EBCA6Bu
#define GPU_IPC_SALT 0xA5A5A5A5u

// The part of the pattern that depends only on the sequence, computed once per thread.
static __device__ __forceinline__ unsigned int gpu_ipc_seq_term(unsigned long long seq)
{
    return ((unsigned int)seq * GPU_IPC_SEQ_MUL) ^ GPU_IPC_SALT;
}

// The pattern from the sequence term and the index term (unsigned int)index * GPU_IPC_INDEX_MUL.
static __device__ __forceinline__ unsigned int gpu_ipc_mix(unsigned int seq_term, unsigned int index_term)
{
    unsigned int x = seq_term ^ index_term;
    return x ^ (x >> 16);
}

static __device__ __forceinline__ unsigned int gpu_ipc_pattern(unsigned int seq_term, unsigned long long index)
{
    return gpu_ipc_mix(seq_term, (unsigned int)index * GPU_IPC_INDEX_MUL);
}

// Splits [0, n_words) of a 4-byte aligned buffer into a scalar head (words before the first 16-byte boundary),
// an aligned bulk of n_vec uint4 starting at word `head`, and a scalar tail; head + tail <= 6 words.
static __device__ __forceinline__ void gpu_ipc_split(const void* base, unsigned long long n_words,
                                                    unsigned long long* head, unsigned long long* n_vec)
{
    unsigned long long h = ((16ull - ((unsigned long long)base & 15ull)) & 15ull) / 4ull;
    if (h > n_words) {
        h = n_words;
    }
    *head = h;
    *n_vec = (n_words - h) / 4ull;
}

// The index of the k-th word outside the bulk: the head first, then the tail.
static __device__ __forceinline__ unsigned long long gpu_ipc_edge_index(unsigned long long k, unsigned long long head,
                                                                       unsigned long long n_vec)
{
    return k < head ? k : k + 4ull * n_vec;
}

static __device__ __forceinline__ unsigned long long gpu_ipc_thread_index()
{
    return (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;
}

static __device__ __forceinline__ unsigned long long gpu_ipc_thread_count()
{
    return (unsigned long long)gridDim.x * blockDim.x;
}

// Word i of dst := pattern(seq, i), for i in [0, n_words). Every thread of the grid calls it.
static __device__ __forceinline__ void gpu_ipc_fill(unsigned int* dst, unsigned long long n_words,
                                                    unsigned long long seq)
{
    const unsigned int seq_term = gpu_ipc_seq_term(seq);
    const unsigned long long first = gpu_ipc_thread_index();
    const unsigned long long stride = gpu_ipc_thread_count();
    unsigned long long head;
    unsigned long long n_vec;
    gpu_ipc_split(dst, n_words, &head, &n_vec);

    uint4* bulk = (uint4*)(dst + head);
    for (unsigned long long v = first; v < n_vec; v += stride) {
        // Consecutive index terms differ by the multiplier: one multiply per 4 words.
        const unsigned int t0 = (unsigned int)(head + 4ull * v) * GPU_IPC_INDEX_MUL;
        bulk[v] = make_uint4(gpu_ipc_mix(seq_term, t0), gpu_ipc_mix(seq_term, t0 + GPU_IPC_INDEX_MUL),
                             gpu_ipc_mix(seq_term, t0 + 2u * GPU_IPC_INDEX_MUL),
                             gpu_ipc_mix(seq_term, t0 + 3u * GPU_IPC_INDEX_MUL));
    }

    const unsigned long long n_edge = n_words - 4ull * n_vec;
    for (unsigned long long k = first; k < n_edge; k += stride) {
        const unsigned long long i = gpu_ipc_edge_index(k, head, n_vec);
        dst[i] = gpu_ipc_pattern(seq_term, i);
    }
}

// Word i of dst := pattern(seq, i), for i in [0, n_words).
extern "C" __global__ void gpu_ipc_fill_pattern(unsigned int* dst, unsigned long long n_words, unsigned long long seq)
{
    gpu_ipc_fill(dst, n_words, seq);
}

// *mismatches += the number of words i in [0, n_words) of src with src[i] != pattern(seq, i). Every thread of the
// grid calls it (the warp sum needs every live lane).
static __device__ __forceinline__ void gpu_ipc_count_mismatches(const unsigned int* src, unsigned long long n_words,
                                                                unsigned long long seq,
                                                                unsigned long long* mismatches)
{
    const unsigned int seq_term = gpu_ipc_seq_term(seq);
    const unsigned long long first = gpu_ipc_thread_index();
    const unsigned long long stride = gpu_ipc_thread_count();
    unsigned long long head;
    unsigned long long n_vec;
    gpu_ipc_split(src, n_words, &head, &n_vec);

    // Counted in 32 bits per 4-word step, summed in 64: a thread may see more than 2^32 words in a small grid.
    unsigned long long bad = 0;
    const uint4* bulk = (const uint4*)(src + head);
    for (unsigned long long v = first; v < n_vec; v += stride) {
        const unsigned int t0 = (unsigned int)(head + 4ull * v) * GPU_IPC_INDEX_MUL;
        const uint4 w = bulk[v];
        bad += (unsigned int)(w.x != gpu_ipc_mix(seq_term, t0)) +
               (unsigned int)(w.y != gpu_ipc_mix(seq_term, t0 + GPU_IPC_INDEX_MUL)) +
               (unsigned int)(w.z != gpu_ipc_mix(seq_term, t0 + 2u * GPU_IPC_INDEX_MUL)) +
               (unsigned int)(w.w != gpu_ipc_mix(seq_term, t0 + 3u * GPU_IPC_INDEX_MUL));
    }

    const unsigned long long n_edge = n_words - 4ull * n_vec;
    for (unsigned long long k = first; k < n_edge; k += stride) {
        const unsigned long long i = gpu_ipc_edge_index(k, head, n_vec);
        bad += (unsigned long long)(src[i] != gpu_ipc_pattern(seq_term, i));
    }

    // Warp sum. The last warp of a block whose size is not a multiple of 32 is partial: the mask names only its
    // live lanes, and a lane never adds a value shuffled from a lane that does not exist.
    const unsigned int lane = threadIdx.x & 31u;
    const unsigned int warp_first = threadIdx.x - lane;
    const unsigned int live = blockDim.x - warp_first < 32u ? blockDim.x - warp_first : 32u;
    const unsigned int mask = live == 32u ? 0xFFFFFFFFu : (1u << live) - 1u;
    for (unsigned int offset = 16; offset > 0; offset >>= 1) {
        const unsigned long long other = __shfl_down_sync(mask, bad, offset);
        if (lane + offset < live) {
            bad += other;
        }
    }
    if (lane == 0 && bad != 0) {
        atomicAdd(mismatches, bad);
    }
}

// *mismatches += the number of words i in [0, n_words) of src with src[i] != pattern(seq, i).
extern "C" __global__ void gpu_ipc_verify_pattern(const unsigned int* src, unsigned long long n_words,
                                                  unsigned long long seq, unsigned long long* mismatches)
{
    gpu_ipc_count_mismatches(src, n_words, seq, mismatches);
}

// The frame's stamp, read once: thread 0 loads *stamp (the ring's published[slot], registered host memory) with
// ld.acquire.sys and stores into *valid (device memory) 1 when (*stamp & (POISON - 1)) == stamp_expected (the stamp
// rule: stamp_expected is the frame's own sequence + 1, which may differ from the pattern's `seq`, as for a
// transformed frame), else 0, adding 1 to *skipped. Launch it with one thread, then gpu_ipc_verify_stamped on the
// same stream: the stream orders every read of the frame after this acquire. One read of host memory per frame:
// a read in each block of the check (one per block, over PCIe, at a thousand blocks) made a 4K frame's check
// milliseconds long.
extern "C" __global__ void gpu_ipc_check_stamp(const unsigned long long* stamp, unsigned long long stamp_expected,
                                               unsigned long long* valid, unsigned long long* skipped)
{
    if (threadIdx.x != 0 || blockIdx.x != 0) {
        return;
    }
    const bool ok = gpu_ipc_ring_frame_valid(gpu_ipc_ring_load_acquire(stamp), stamp_expected - 1ull);
    *valid = ok ? 1ull : 0ull;
    if (!ok) {
        atomicAdd(skipped, 1ull);
    }
}

// As gpu_ipc_verify_pattern when *valid (written by gpu_ipc_check_stamp, earlier on the same stream) is non-zero;
// otherwise no word of the frame is read. Every frame is counted once: as skipped (by gpu_ipc_check_stamp), or by its
// mismatched words. The stamp only goes from "not this frame" to "this frame" when the producer publishes it, after
// its words are written, so a frame seen valid is read finished.
extern "C" __global__ void gpu_ipc_verify_stamped(const unsigned int* src, unsigned long long n_words,
                                                  unsigned long long seq, unsigned long long* mismatches,
                                                  const unsigned long long* valid)
{
    if (*valid == 0ull) {
        return;
    }
    gpu_ipc_count_mismatches(src, n_words, seq, mismatches);
}

// dst[i] := src[i] ^ mask, for i in [0, n_words): a frame transformed word by word (mask 0xFFFFFFFF inverts every
// bit), the middle stage of the pipeline example. dst and src are two buffers (two rings' slots) that must not
// overlap. A pattern frame XORed with a constant is the pattern frame of another sequence (`xor_sequence` in
// kernels/src/pattern.rs), so gpu_ipc_verify_pattern checks a transformed frame as it is.
extern "C" __global__ void gpu_ipc_xor_words(unsigned int* dst, const unsigned int* src, unsigned long long n_words,
                                             unsigned int mask)
{
    const unsigned long long first = gpu_ipc_thread_index();
    const unsigned long long stride = gpu_ipc_thread_count();
    if ((((unsigned long long)dst ^ (unsigned long long)src) & 15ull) != 0ull) {
        // The two buffers are not aligned alike: word by word (the rings' slots always are: 256-byte aligned).
        for (unsigned long long i = first; i < n_words; i += stride) {
            dst[i] = src[i] ^ mask;
        }
    } else {
        unsigned long long head;
        unsigned long long n_vec;
        gpu_ipc_split(dst, n_words, &head, &n_vec);
        uint4* out = (uint4*)(dst + head);
        const uint4* in = (const uint4*)(src + head);
        for (unsigned long long v = first; v < n_vec; v += stride) {
            const uint4 w = in[v];
            out[v] = make_uint4(w.x ^ mask, w.y ^ mask, w.z ^ mask, w.w ^ mask);
        }
        const unsigned long long n_edge = n_words - 4ull * n_vec;
        for (unsigned long long k = first; k < n_edge; k += stride) {
            const unsigned long long i = gpu_ipc_edge_index(k, head, n_vec);
            dst[i] = src[i] ^ mask;
        }
    }
}

// Outcomes of gpu_ipc_persistent_verify, in result[2]: every frame done, or why it left early (the device API's
// GPU_IPC_RING_TIMED_OUT, GPU_IPC_RING_ABORTED and GPU_IPC_RING_ORPHANED, or a frame whose stamp was not the
// producer's).
#define GPU_IPC_PERSISTENT_DONE 0ull
#define GPU_IPC_PERSISTENT_STAMP_INVALID 3ull

// A persistent consumer on the ring's device API (gpu_ipc_ring.cuh): one launch for `frames` frames from
// ring->first_sequence on, no CPU work per frame. For each frame, thread 0 waits for it (bounded by `timeout_ns`
// per frame and by the exit words: the abort word, the survivor's, the kernel lease) and checks its stamp; the block
// counts the words that differ from the pattern, then thread 0 releases the frame and moves the progress word. It
// leaves at the first frame that does not come (timed out, aborted, orphaned) or whose stamp is not the producer's
// (it died), without touching that frame. Launch it with
// ONE block (of any size): the frame's release must follow every read of it, which a barrier gives within a block.
// result[0] frames released, result[1] mismatched words, result[2] outcome (above), result[3] the frame it stopped at.
extern "C" __global__ void gpu_ipc_persistent_verify(const gpu_ipc_ring_descriptor* ring, unsigned long long frames,
                                                     unsigned long long timeout_ns, unsigned long long* result)
{
    __shared__ gpu_ipc_ring_descriptor d;
    __shared__ unsigned long long outcome;
    __shared__ unsigned long long bad;
    if (blockIdx.x != 0) {
        return;
    }
    if (threadIdx.x == 0) {
        d = *ring;
        bad = 0;
    }
    __syncthreads();
    const unsigned long long n_words = d.slot_bytes / 4ull;
    // Thread 0's view of the ring, kept across frames (which copy of `published` to poll).
    gpu_ipc_ring_consumer_view view;
    gpu_ipc_ring_consumer_view_init(&view);
    unsigned long long done = 0;
    for (; done < frames; ++done) {
        const unsigned long long seq = d.first_sequence + done;
        if (threadIdx.x == 0) {
            unsigned long long stamp = 0;
            const int waited = gpu_ipc_ring_wait_frame(&d, &view, seq, gpu_ipc_ring_deadline(timeout_ns), &stamp);
            outcome = waited != GPU_IPC_RING_OK             ? (unsigned long long)waited
                      : gpu_ipc_ring_frame_valid(stamp, seq) ? GPU_IPC_PERSISTENT_DONE
                                                             : GPU_IPC_PERSISTENT_STAMP_INVALID;
        }
        // Every thread sees the outcome, and reads the frame only after thread 0's acquire.
        __syncthreads();
        if (outcome != GPU_IPC_PERSISTENT_DONE) {
            break;
        }
        const unsigned int* words = (const unsigned int*)gpu_ipc_ring_frame(&d, seq);
        const unsigned int seq_term = gpu_ipc_seq_term(seq);
        unsigned long long mine = 0;
        for (unsigned long long i = threadIdx.x; i < n_words; i += blockDim.x) {
            mine += (unsigned long long)(words[i] != gpu_ipc_pattern(seq_term, i));
        }
        if (mine != 0) {
            atomicAdd(&bad, mine);
        }
        // Every read of the frame is done before thread 0 releases it (and before it writes `outcome` again).
        __syncthreads();
        if (threadIdx.x == 0) {
            gpu_ipc_ring_release_frame(&d, seq);
            gpu_ipc_ring_set_progress(&d, seq + 1ull);
        }
    }
    if (threadIdx.x == 0) {
        result[0] = done;
        result[1] = bad;
        result[2] = done == frames ? GPU_IPC_PERSISTENT_DONE : outcome;
        result[3] = d.first_sequence + done;
        __threadfence_system();
    }
}

// A persistent producer on the ring's device API (gpu_ipc_ring.cuh): one launch for `frames` frames from
// ring->first_sequence on, no CPU work per frame. For each frame, the first warp waits until its slot is free (every live
// consumer released the frame it held; bounded by `timeout_ns` per frame and by the exit words), the block writes
// the frame's pattern, then thread 0 publishes it. It leaves at the first slot that does not come free (timed out,
// aborted, orphaned). Launch it with ONE block of at least 32 threads (whole warps): the publish must follow every write of
// the frame, which a barrier gives within a block. result[0] frames published, result[1] 0, result[2] outcome (as
// gpu_ipc_persistent_verify's), result[3] the frame it stopped at (the first not published).
extern "C" __global__ void gpu_ipc_persistent_fill(const gpu_ipc_ring_producer_descriptor* ring,
                                                   unsigned long long frames, unsigned long long timeout_ns,
                                                   unsigned long long* result)
{
    __shared__ gpu_ipc_ring_producer_descriptor d;
    __shared__ int outcome;
    if (blockIdx.x != 0) {
        return;
    }
    if (threadIdx.x == 0) {
        d = *ring;
    }
    __syncthreads();
    const unsigned long long n_words = d.slot_bytes / 4ull;
    // Each lane of the first warp keeps its view of one consumer record across frames.
    gpu_ipc_ring_producer_view view;
    gpu_ipc_ring_producer_view_init(&view);
    unsigned long long done = 0;
    for (; done < frames; ++done) {
        const unsigned long long seq = d.first_sequence + done;
        if (threadIdx.x < 32u) {
            // The first warp waits for the consumer records side by side.
            const int acquired = gpu_ipc_ring_acquire_slot(&d, &view, seq, gpu_ipc_ring_deadline(timeout_ns));
            if (threadIdx.x == 0) {
                outcome = acquired;
            }
        }
        // Every thread sees the outcome, and writes the slot only after thread 0's acquire of the releases.
        __syncthreads();
        if (outcome != GPU_IPC_RING_OK) {
            break;
        }
        unsigned int* words = (unsigned int*)gpu_ipc_ring_slot_to_write(&d, seq);
        const unsigned int seq_term = gpu_ipc_seq_term(seq);
        for (unsigned long long i = threadIdx.x; i < n_words; i += blockDim.x) {
            words[i] = gpu_ipc_pattern(seq_term, i);
        }
        // Every write of the frame is done before thread 0 publishes it (and before it writes `outcome` again).
        __syncthreads();
        if (threadIdx.x == 0) {
            gpu_ipc_ring_publish_frame(&d, seq);
        }
    }
    if (threadIdx.x == 0) {
        result[0] = done;
        result[1] = 0;
        result[2] = done == frames ? GPU_IPC_PERSISTENT_DONE : (unsigned long long)outcome;
        result[3] = d.first_sequence + done;
        __threadfence_system();
    }
}

// ---- Persistent kernels over the whole GPU ----------------------------------------------------------------------
//
// The two kernels above run in ONE block, which is what their handoff latency needs (a 256-byte frame) but not what
// a 4K frame needs: one SM moves a small share of the GPU's memory bandwidth, so a 25 MB frame takes one block
// many times longer than a full grid (the bench's rows `resident-BACKEND-sN-one-block` measure it). The two below
// spread each frame over the GPU, still one launch for the whole run:
//
// - block 0 is the LEADER: its first warp (the producer's) or first thread (the consumer's) does the ring's waits
//   with the device API, frame after frame, as far ahead as the ring allows, and opens each frame to the workers
//   through the GATE word in device memory (st.release.gpu of seq + 1; GPU_IPC_GRID_STOP | seq when it stopped at
//   frame seq: timed out, aborted, orphaned, or a stamp not the producer's);
// - blocks 1 .. gridDim.x - 1 are WORKERS: thread 0 waits until the gate passes the frame (ld.acquire.gpu, bounded by
//   twice the timeout per frame), the block writes (or checks) its share of the frame (grid-stride over the workers'
//   threads), and thread 0 counts the block out of the frame (a fence, then an atomic add on the slot's counter);
//   the block that counts last publishes (or releases) the frame, so the publish follows every block's writes (the
//   release follows every block's reads), the pattern cooperative groups' grid barrier uses, without a barrier.
//
// No frame is opened to a worker before the ring let the leader have it, and the last worker's publish or release
// is the only store the peer waits on. Every wait is bounded, so a grid that cannot be wholly resident (a worker
// waits for a gate whose leader is not scheduled) leaves with GPU_IPC_RING_TIMED_OUT instead of hanging; launch it
// with at most as many blocks as fit beside the peer's grid (the Rust launchers: one leader and a worker per SM but
// one, GPU_IPC_GRID_THREADS each, so that one block of each side's grid fits on every SM together).
//
// Arguments after the descriptor, both sides: `frames`, `timeout_ns` (per frame), `result` (4 words, as the
// one-block kernels': frames done, mismatched words, outcome, the frame it stopped at; written by the block that
// leaves last), `scratch` (struct gpu_ipc_grid_scratch in device memory, zeroed before each launch) and `times`
// (device memory, `frames` words, or null): times[i] := %globaltimer when frame first_sequence + i was published
// (released), so a run is timed on the GPU's clock, the same in both processes.

// Threads per block of the grid kernels, and blocks of them that __launch_bounds__ makes fit on one SM at once (at
// most 64 registers a thread: 2 x 512 x 64 = the 64 K registers of an SM): one of the producer's and one of the
// consumer's beside it.
#define GPU_IPC_GRID_THREADS 512
#define GPU_IPC_GRID_MIN_BLOCKS 2
// The gate's flag: the leader stopped at the frame in the low bits.
#define GPU_IPC_GRID_STOP (1ull << 63)
// A worker that saw the gate stop before its frame (not an outcome of its own: the leader's is reported).
#define GPU_IPC_GRID_STOPPED 5

// The grid kernels' words in device memory (zeroed by the host before each launch): the gate alone on its line,
// the outcomes and counts, and per slot the workers' count of blocks done with the slot's frames (it grows by the
// number of workers per frame, so it needs no reset between the laps of the ring).
struct gpu_ipc_grid_scratch {
    unsigned long long gate;
    unsigned long long gate_line[15];
    unsigned long long leader_outcome;
    unsigned long long worker_outcome;
    unsigned long long completed;
    unsigned long long exited;
    unsigned long long counts_line[12];
    unsigned long long done[GPU_IPC_RING_MAX_SLOTS];
};

// A 16-byte load and store in the global state space. The grid kernels find their frames through the ring's
// descriptor, so the compiler sees generic pointers and would emit generic accesses; the one-shot kernels get theirs
// as kernel parameters, global accesses: these keep the two the same instructions. Volatile with a memory clobber:
// never merged or moved across the barriers between two frames of one slot.
static __device__ __forceinline__ unsigned long long gpu_ipc_global_address(const void* p)
{
    unsigned long long g;
    asm("cvta.to.global.u64 %0, %1;" : "=l"(g) : "l"(p));
    return g;
}

static __device__ __forceinline__ uint4 gpu_ipc_load_v4(const uint4* p)
{
    uint4 v;
    asm volatile("ld.global.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(gpu_ipc_global_address(p))
                 : "memory");
    return v;
}

static __device__ __forceinline__ void gpu_ipc_store_v4(uint4* p, uint4 v)
{
    asm volatile("st.global.v4.u32 [%0], {%1, %2, %3, %4};"
                 :
                 : "l"(gpu_ipc_global_address(p)), "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w)
                 : "memory");
}

// Word i of dst := pattern(seq, i) for the words of [0, n_words) this thread owns in a grid-stride loop that starts
// at `first` and steps by `stride` (in 16-byte vectors, then edge words).
static __device__ __forceinline__ void gpu_ipc_fill_range(unsigned int* dst, unsigned long long n_words,
                                                          unsigned long long seq, unsigned long long first,
                                                          unsigned long long stride)
{
    const unsigned int seq_term = gpu_ipc_seq_term(seq);
    unsigned long long head;
    unsigned long long n_vec;
    gpu_ipc_split(dst, n_words, &head, &n_vec);
    uint4* bulk = (uint4*)(dst + head);
    for (unsigned long long v = first; v < n_vec; v += stride) {
        const unsigned int t0 = (unsigned int)(head + 4ull * v) * GPU_IPC_INDEX_MUL;
        const uint4 w = make_uint4(gpu_ipc_mix(seq_term, t0), gpu_ipc_mix(seq_term, t0 + GPU_IPC_INDEX_MUL),
                                   gpu_ipc_mix(seq_term, t0 + 2u * GPU_IPC_INDEX_MUL),
                                   gpu_ipc_mix(seq_term, t0 + 3u * GPU_IPC_INDEX_MUL));
        gpu_ipc_store_v4(&bulk[v], w);
    }
    const unsigned long long n_edge = n_words - 4ull * n_vec;
    for (unsigned long long k = first; k < n_edge; k += stride) {
        const unsigned long long i = gpu_ipc_edge_index(k, head, n_vec);
        dst[i] = gpu_ipc_pattern(seq_term, i);
    }
}

// Words of the 16-byte vector `w` at word `index` that differ from the pattern.
static __device__ __forceinline__ unsigned int gpu_ipc_vec_mismatches(uint4 w, unsigned int seq_term,
                                                                     unsigned long long index)
{
    const unsigned int t0 = (unsigned int)index * GPU_IPC_INDEX_MUL;
    return (unsigned int)(w.x != gpu_ipc_mix(seq_term, t0)) +
           (unsigned int)(w.y != gpu_ipc_mix(seq_term, t0 + GPU_IPC_INDEX_MUL)) +
           (unsigned int)(w.z != gpu_ipc_mix(seq_term, t0 + 2u * GPU_IPC_INDEX_MUL)) +
           (unsigned int)(w.w != gpu_ipc_mix(seq_term, t0 + 3u * GPU_IPC_INDEX_MUL));
}

// The words of [0, n_words) of src this thread owns (as gpu_ipc_fill_range) that differ from pattern(seq, i). Four
// vectors are loaded before any is compared: a grid of one block per SM has a quarter of the threads of the
// one-shot verify kernel's (8 blocks of 256 per SM), and so keeps as many bytes in flight per SM with the same
// arithmetic per word.
static __device__ __forceinline__ unsigned long long gpu_ipc_count_range(const unsigned int* src,
                                                                        unsigned long long n_words,
                                                                        unsigned long long seq,
                                                                        unsigned long long first,
                                                                        unsigned long long stride)
{
    const unsigned int seq_term = gpu_ipc_seq_term(seq);
    unsigned long long head;
    unsigned long long n_vec;
    gpu_ipc_split(src, n_words, &head, &n_vec);
    const uint4* bulk = (const uint4*)(src + head);
    unsigned long long bad = 0;
    unsigned long long v = first;
    for (; v + 3ull * stride < n_vec; v += 4ull * stride) {
        uint4 w[4];
#pragma unroll
        for (unsigned int k = 0; k < 4u; ++k) {
            w[k] = gpu_ipc_load_v4(&bulk[v + k * stride]);
        }
#pragma unroll
        for (unsigned int k = 0; k < 4u; ++k) {
            bad += gpu_ipc_vec_mismatches(w[k], seq_term, head + 4ull * (v + k * stride));
        }
    }
    for (; v < n_vec; v += stride) {
        bad += gpu_ipc_vec_mismatches(gpu_ipc_load_v4(&bulk[v]), seq_term, head + 4ull * v);
    }
    const unsigned long long n_edge = n_words - 4ull * n_vec;
    for (unsigned long long k = first; k < n_edge; k += stride) {
        const unsigned long long i = gpu_ipc_edge_index(k, head, n_vec);
        bad += (unsigned long long)(src[i] != gpu_ipc_pattern(seq_term, i));
    }
    return bad;
}

// Twice `timeout_ns`, saturating: a worker's bound on the gate, past the leader's own bound on the frame.
static __device__ __forceinline__ unsigned long long gpu_ipc_grid_worker_timeout(unsigned long long timeout_ns)
{
    return timeout_ns > (~0ull >> 1) ? ~0ull : 2ull * timeout_ns;
}

// Thread 0 of a worker: waits until the leader opened frame `seq` (GPU_IPC_RING_OK), stopped before it
// (GPU_IPC_GRID_STOPPED), or `deadline` passed (GPU_IPC_RING_TIMED_OUT). ld.acquire.gpu: the block's reads and writes
// of the frame, after a barrier, follow the leader's acquire on the ring.
static __device__ __forceinline__ int gpu_ipc_grid_wait_gate(const unsigned long long* gate, unsigned long long seq,
                                                             unsigned long long deadline)
{
    for (unsigned int polls = 0;; ++polls) {
        const unsigned long long g = gpu_ipc_ring_load_acquire_gpu(gate);
        if ((g & GPU_IPC_GRID_STOP) != 0ull) {
            return (g & ~GPU_IPC_GRID_STOP) > seq ? GPU_IPC_RING_OK : GPU_IPC_GRID_STOPPED;
        }
        if (g > seq) {
            return GPU_IPC_RING_OK;
        }
        if (polls % 64u == 63u) {
            if (gpu_ipc_ring_globaltimer() >= deadline) {
                return GPU_IPC_RING_TIMED_OUT;
            }
            // Many workers poll one word while the peer is behind: spread their reads out a little.
            __nanosleep(64);
        }
    }
}

// Thread 0 of a worker, after a barrier behind the block's work on the frame in `slot` (its `lap`-th frame there in
// this launch): counts the block out; true for the block that counts last, which then sees every block's work.
static __device__ __forceinline__ bool gpu_ipc_grid_count_out(gpu_ipc_grid_scratch* s, unsigned long long slot,
                                                              unsigned long long lap, unsigned long long workers)
{
    __threadfence();
    const unsigned long long before = atomicAdd(&s->done[slot], 1ull);
    if (before != (lap + 1ull) * workers - 1ull) {
        return false;
    }
    __threadfence();
    return true;
}

// Thread 0 of a worker, once the block's work on frame `seq` (its `done`-th of the launch) is behind a barrier: counts
// the block out; the block that counts last does `last_out(seq)` (publish or release), notes the time and the frame.
template <typename LastOut>
static __device__ __forceinline__ void gpu_ipc_grid_frame_out(gpu_ipc_grid_scratch* s, unsigned long long seq,
                                                              unsigned long long done, unsigned long long slot_count,
                                                              unsigned long long* times, LastOut last_out)
{
    const unsigned long long workers = (unsigned long long)gridDim.x - 1ull;
    if (!gpu_ipc_grid_count_out(s, gpu_ipc_ring_slot_of(seq, slot_count), done / slot_count, workers)) {
        return;
    }
    last_out(seq);
    if (times != 0) {
        times[done] = gpu_ipc_ring_globaltimer();
    }
    atomicAdd(&s->completed, 1ull);
}

// A worker block's frames, `frames` from `first_sequence` on: for each, one thread waits for the gate, the block does
// `work(seq)` (its share of the frame), and thread 0 counts the block out (gpu_ipc_grid_frame_out with `last_out`).
// With three slots or more, thread 0 counts the block out of a frame right after the barrier that opens the next one,
// while the other warps already work on it: the count's fence and atomic (a trip to L2 and back) are off the block's
// path, and the gate is waited for by thread 32 meanwhile. Fewer slots cannot: each side that overlaps holds a frame
// one step longer, and with both sides doing it the producer's gate for frame s + 1 waits (through the consumer's
// release of s - 1, its gate for s and the producer's publish of s) for its own gate: a cycle at two slots (measured:
// the grid producer stopped at frame 2 of a 2-slot ring, H200, 2026-11-28), and at one slot the next frame's gate
// waits for that very count. There thread 0 counts out behind a second barrier first.
template <typename Work, typename LastOut>
static __device__ __forceinline__ void gpu_ipc_grid_worker(gpu_ipc_grid_scratch* s, unsigned long long first_sequence,
                                                           unsigned long long slot_count, unsigned long long frames,
                                                           unsigned long long timeout_ns, unsigned long long* times,
                                                           Work work, LastOut last_out)
{
    // `go` of frames done and done + 1 side by side: a thread reads its frame's after the barrier that opens it, and
    // the gate's thread writes the next frame's before the next barrier, which no thread passes before it read.
    __shared__ int go[2];
    const bool overlap = slot_count >= 3ull && blockDim.x > 32u;
    const unsigned int gate_thread = overlap ? 32u : 0u;
    bool pending = false;
    unsigned long long done = 0;
    for (; done < frames; ++done) {
        const unsigned long long seq = first_sequence + done;
        if (threadIdx.x == gate_thread) {
            const int waited = gpu_ipc_grid_wait_gate(&s->gate, seq,
                                                      gpu_ipc_ring_deadline(gpu_ipc_grid_worker_timeout(timeout_ns)));
            if (waited == GPU_IPC_RING_TIMED_OUT) {
                s->worker_outcome = GPU_IPC_RING_TIMED_OUT;
            }
            go[done & 1ull] = waited == GPU_IPC_RING_OK;
        }
        // The block's work on the previous frame is done, and the gate's answer for this one is in.
        __syncthreads();
        if (pending && threadIdx.x == 0) {
            gpu_ipc_grid_frame_out(s, seq - 1ull, done - 1ull, slot_count, times, last_out);
        }
        pending = false;
        if (!go[done & 1ull]) {
            break;
        }
        work(seq);
        if (overlap) {
            pending = true;
        } else {
            __syncthreads();
            if (threadIdx.x == 0) {
                gpu_ipc_grid_frame_out(s, seq, done, slot_count, times, last_out);
            }
        }
    }
    if (pending) {
        // The last frame: every frame asked for was worked, the last one not yet counted out.
        __syncthreads();
        if (threadIdx.x == 0) {
            gpu_ipc_grid_frame_out(s, first_sequence + done - 1ull, done - 1ull, slot_count, times, last_out);
        }
    }
}

// Every block at its end (all its threads): counts itself out; the last one writes the result words.
static __device__ __forceinline__ void gpu_ipc_grid_leave(gpu_ipc_grid_scratch* s, unsigned long long first_sequence,
                                                          unsigned long long* result)
{
    __syncthreads();
    if (threadIdx.x != 0) {
        return;
    }
    __threadfence();
    if (atomicAdd(&s->exited, 1ull) != (unsigned long long)gridDim.x - 1ull) {
        return;
    }
    __threadfence();
    const unsigned long long completed = atomicAdd(&s->completed, 0ull);
    const unsigned long long leader = atomicAdd(&s->leader_outcome, 0ull);
    const unsigned long long worker = atomicAdd(&s->worker_outcome, 0ull);
    result[0] = completed;
    result[2] = leader != GPU_IPC_PERSISTENT_DONE ? leader : worker;
    result[3] = first_sequence + completed;
    __threadfence_system();
}

// Adds every thread's count of mismatched words into *total (a warp sum, then one atomic per warp).
static __device__ __forceinline__ void gpu_ipc_grid_add_mismatches(unsigned long long bad, unsigned long long* total)
{
    for (unsigned int offset = 16; offset > 0; offset >>= 1) {
        bad += __shfl_down_sync(0xFFFFFFFFu, bad, offset);
    }
    if ((threadIdx.x & 31u) == 0u && bad != 0ull) {
        atomicAdd(total, bad);
    }
}

// The consumer's persistent kernel over the whole GPU (above): frames from ring->first_sequence on, each checked
// word by word against its pattern and released. result[1]: mismatched words over every frame.
extern "C" __global__ void __launch_bounds__(GPU_IPC_GRID_THREADS, GPU_IPC_GRID_MIN_BLOCKS)
    gpu_ipc_persistent_verify_grid(const gpu_ipc_ring_descriptor* ring, unsigned long long frames,
                                   unsigned long long timeout_ns, unsigned long long* result,
                                   gpu_ipc_grid_scratch* scratch, unsigned long long* times)
{
    __shared__ gpu_ipc_ring_descriptor d;
    if (threadIdx.x == 0) {
        d = *ring;
    }
    __syncthreads();
    if (blockIdx.x == 0) {
        if (threadIdx.x == 0) {
            gpu_ipc_ring_consumer_view view;
            gpu_ipc_ring_consumer_view_init(&view);
            unsigned long long outcome = GPU_IPC_PERSISTENT_DONE;
            unsigned long long opened = 0;
            for (; opened < frames; ++opened) {
                const unsigned long long seq = d.first_sequence + opened;
                unsigned long long stamp = 0;
                const int waited = gpu_ipc_ring_wait_frame(&d, &view, seq, gpu_ipc_ring_deadline(timeout_ns), &stamp);
                if (waited != GPU_IPC_RING_OK) {
                    outcome = (unsigned long long)waited;
                    break;
                }
                if (!gpu_ipc_ring_frame_valid(stamp, seq)) {
                    outcome = GPU_IPC_PERSISTENT_STAMP_INVALID;
                    break;
                }
                gpu_ipc_ring_store_release_gpu(&scratch->gate, seq + 1ull);
            }
            if (opened < frames) {
                gpu_ipc_ring_store_release_gpu(&scratch->gate, GPU_IPC_GRID_STOP | (d.first_sequence + opened));
            }
            scratch->leader_outcome = outcome;
        }
    } else {
        const unsigned long long workers = (unsigned long long)gridDim.x - 1ull;
        const unsigned long long first = ((unsigned long long)blockIdx.x - 1ull) * blockDim.x + threadIdx.x;
        const unsigned long long stride = workers * blockDim.x;
        const unsigned long long n_words = d.slot_bytes / 4ull;
        unsigned long long bad = 0;
        gpu_ipc_grid_worker(
            scratch, d.first_sequence, d.slot_count, frames, timeout_ns, times,
            [&](unsigned long long seq) {
                bad += gpu_ipc_count_range((const unsigned int*)gpu_ipc_ring_frame(&d, seq), n_words, seq, first,
                                           stride);
            },
            [&](unsigned long long seq) {
                gpu_ipc_ring_release_frame(&d, seq);
                gpu_ipc_ring_set_progress(&d, seq + 1ull);
            });
        gpu_ipc_grid_add_mismatches(bad, &result[1]);
    }
    gpu_ipc_grid_leave(scratch, d.first_sequence, result);
}

// The producer's persistent kernel over the whole GPU (above): frames from ring->first_sequence on, each written with
// its pattern once its slot is free, and published. result[1] stays 0.
extern "C" __global__ void __launch_bounds__(GPU_IPC_GRID_THREADS, GPU_IPC_GRID_MIN_BLOCKS)
    gpu_ipc_persistent_fill_grid(const gpu_ipc_ring_producer_descriptor* ring, unsigned long long frames,
                                 unsigned long long timeout_ns, unsigned long long* result,
                                 gpu_ipc_grid_scratch* scratch, unsigned long long* times)
{
    __shared__ gpu_ipc_ring_producer_descriptor d;
    if (threadIdx.x == 0) {
        d = *ring;
    }
    __syncthreads();
    if (blockIdx.x == 0) {
        if (threadIdx.x < 32u) {
            // The first warp waits for the consumer records side by side, lane L for record L.
            gpu_ipc_ring_producer_view view;
            gpu_ipc_ring_producer_view_init(&view);
            int outcome = GPU_IPC_RING_OK;
            unsigned long long opened = 0;
            for (; opened < frames; ++opened) {
                const unsigned long long seq = d.first_sequence + opened;
                outcome = gpu_ipc_ring_acquire_slot(&d, &view, seq, gpu_ipc_ring_deadline(timeout_ns));
                if (outcome != GPU_IPC_RING_OK) {
                    break;
                }
                if (threadIdx.x == 0) {
                    gpu_ipc_ring_store_release_gpu(&scratch->gate, seq + 1ull);
                }
            }
            if (threadIdx.x == 0) {
                if (opened < frames) {
                    gpu_ipc_ring_store_release_gpu(&scratch->gate, GPU_IPC_GRID_STOP | (d.first_sequence + opened));
                }
                scratch->leader_outcome = (unsigned long long)outcome;
            }
        }
    } else {
        const unsigned long long workers = (unsigned long long)gridDim.x - 1ull;
        const unsigned long long first = ((unsigned long long)blockIdx.x - 1ull) * blockDim.x + threadIdx.x;
        const unsigned long long stride = workers * blockDim.x;
        const unsigned long long n_words = d.slot_bytes / 4ull;
        gpu_ipc_grid_worker(
            scratch, d.first_sequence, d.slot_count, frames, timeout_ns, times,
            [&](unsigned long long seq) {
                gpu_ipc_fill_range((unsigned int*)gpu_ipc_ring_slot_to_write(&d, seq), n_words, seq, first, stride);
            },
            [&](unsigned long long seq) { gpu_ipc_ring_publish_frame(&d, seq); });
    }
    gpu_ipc_grid_leave(scratch, d.first_sequence, result);
}

// The pattern kernels for frame graphs (docs/frames.md, "Frame graphs"), whose arguments are fixed when the graph is
// captured: the sequence is read from the frame state (struct gpu_ipc_graph_frame, device memory) that the graph's
// ring step wrote, and nothing is done when the state says the slot may not be used (valid == 0).
extern "C" __global__ void gpu_ipc_fill_pattern_at(unsigned int* dst, unsigned long long n_words,
                                                   const gpu_ipc_graph_frame* state)
{
    if (state->valid == 0ull) {
        return;
    }
    gpu_ipc_fill(dst, n_words, state->sequence);
}

extern "C" __global__ void gpu_ipc_verify_pattern_at(const unsigned int* src, unsigned long long n_words,
                                                     const gpu_ipc_graph_frame* state, unsigned long long* mismatches)
{
    if (state->valid == 0ull) {
        return;
    }
    gpu_ipc_count_mismatches(src, n_words, state->sequence, mismatches);
}
