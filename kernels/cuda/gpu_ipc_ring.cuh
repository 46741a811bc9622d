// gpu-ipc frame ring: device functions for kernels that wait for, check and release frames on the ring's own
// counters (docs/ring.md, docs/kernels.md "The ring's device API").
//
//   #include "gpu_ipc_ring.cuh"
//   extern "C" __global__ void my_consumer(const gpu_ipc_ring_descriptor* ring, unsigned long long frames, ...)
//   {
//       gpu_ipc_ring_descriptor d = *ring;                 // once: the descriptor does not change
//       for (unsigned long long seq = d.first_sequence; seq < d.first_sequence + frames; ++seq) {
//           unsigned long long stamp;
//           if (gpu_ipc_ring_wait_frame(&d, seq, gpu_ipc_ring_deadline(1000000000ull), &stamp) != GPU_IPC_RING_OK
//               || !gpu_ipc_ring_frame_valid(stamp, seq)) {
//               break;                                     // aborted, timed out, or the producer is gone
//           }
//           ... read gpu_ipc_ring_frame(&d, seq) (d.slot_bytes bytes) ...
//           gpu_ipc_ring_release_frame(&d, seq);           // after every thread that read it is done
//           gpu_ipc_ring_set_progress(&d, seq + 1);
//       }
//   }
//
// `ring` comes from Rust: `Consumer::launch_on_ring` passes it as the kernel's first argument. Its fields mirror
// `ipc_core::frames::RingDescriptor` (#[repr(C)], every field a u64; a unit test checks both agree). Offsets and
// strides come from the descriptor, never from constants here, so the functions work with every control-block
// layout the Rust side describes.
//
// Both sides: a consumer's kernel waits for frame N, checks it and releases it (gpu_ipc_ring_descriptor, from
// `Consumer::launch_on_ring`); a producer's kernel waits until frame N's slot is free (every live consumer released
// the frame it held, read from the consumer records as the host producer reads them) and publishes it
// (gpu_ipc_ring_producer_descriptor, from `Producer::launch_on_ring`).
//
// Memory ordering: the rule `gpu-ipc probe coherency` established (docs/kernels.md): every counter another process
// writes is read with ld.acquire.sys, every counter this kernel publishes is stored with st.release.sys, and every
// wait is bounded by %globaltimer and by the abort word, which the host sets when a peer dies or the consumer is
// dropped. The counters live in the ring's control block, host memory registered for the device. No runtime
// headers: NVRTC and nvcc compile it alike.
//
// The stamp rule (docs/ring.md): frame s in slot s % N is the one its producer published iff
// (published[s % N] & (POISON - 1)) == s + 1. A survivor ORs POISON = 2^62 into `published` when the producer dies,
// which releases every wait and keeps the last real frame in the low bits; a frame whose stamp does not match was
// never written (or was overwritten) and must not be used.

#ifndef GPU_IPC_RING_CUH
#define GPU_IPC_RING_CUH

typedef unsigned long long gpu_ipc_ring_u64;

// The value a survivor ORs into a dead peer's counters (ipc_core::ring::POISON).
#define GPU_IPC_RING_POISON (1ull << 62)
// The version of gpu_ipc_ring_descriptor (ipc_core::frames::RingDescriptor::VERSION).
#define GPU_IPC_RING_DESCRIPTOR_VERSION 1ull
// The version of gpu_ipc_ring_producer_descriptor (ipc_core::frames::ProducerRingDescriptor::VERSION).
#define GPU_IPC_RING_PRODUCER_DESCRIPTOR_VERSION 1ull
// A consumer record's state word is (epoch << 8) | state; the states a producer's kernel acts on
// (ipc_core::ring::layout::ConsumerState).
#define GPU_IPC_RING_STATE_MASK 0xffull
#define GPU_IPC_RING_STATE_JOINING 1ull
#define GPU_IPC_RING_STATE_LIVE 2ull
// How many polls pass between two looks at the abort word (a look is a read over the bus).
#define GPU_IPC_RING_ABORT_CHECK 1024u

// Outcomes of a wait.
#define GPU_IPC_RING_OK 0
#define GPU_IPC_RING_TIMED_OUT 1
#define GPU_IPC_RING_ABORTED 2

// What a kernel needs to act on the ring as one consumer: device addresses and byte offsets, all u64.
struct gpu_ipc_ring_descriptor {
    gpu_ipc_ring_u64 version;           // GPU_IPC_RING_DESCRIPTOR_VERSION
    gpu_ipc_ring_u64 control;           // device address of the control block (registered host memory)
    gpu_ipc_ring_u64 published_offset;  // byte offset of published[0] in the control block
    gpu_ipc_ring_u64 published_stride;  // bytes from published[i] to published[i + 1]
    gpu_ipc_ring_u64 released_offset;   // byte offset of this consumer's released[0]
    gpu_ipc_ring_u64 released_stride;   // bytes from its released[i] to released[i + 1]
    gpu_ipc_ring_u64 slots;             // device address of slot 0's frame (this process's mapping)
    gpu_ipc_ring_u64 slot_stride;       // bytes from one slot to the next
    gpu_ipc_ring_u64 slot_bytes;        // bytes of a frame
    gpu_ipc_ring_u64 slot_count;        // N
    gpu_ipc_ring_u64 consumer_index;    // this consumer's record
    gpu_ipc_ring_u64 first_sequence;    // the first frame this kernel is to read
    gpu_ipc_ring_u64 abort;             // device address of the abort word: non-zero means leave now
    gpu_ipc_ring_u64 progress;          // device address of the progress word: the next frame not yet released
};

static __device__ __forceinline__ gpu_ipc_ring_u64 gpu_ipc_ring_globaltimer()
{
    gpu_ipc_ring_u64 t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

// %globaltimer `timeout_ns` from now, saturating: a huge timeout means "no deadline", not one in the past.
static __device__ __forceinline__ gpu_ipc_ring_u64 gpu_ipc_ring_deadline(gpu_ipc_ring_u64 timeout_ns)
{
    gpu_ipc_ring_u64 now = gpu_ipc_ring_globaltimer();
    return now + timeout_ns < now ? ~0ull : now + timeout_ns;
}

static __device__ __forceinline__ gpu_ipc_ring_u64 gpu_ipc_ring_load_acquire(const gpu_ipc_ring_u64* p)
{
    gpu_ipc_ring_u64 v;
    asm volatile("ld.acquire.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
    return v;
}

static __device__ __forceinline__ void gpu_ipc_ring_store_release(gpu_ipc_ring_u64* p, gpu_ipc_ring_u64 v)
{
    asm volatile("st.release.sys.global.u64 [%0], %1;" : : "l"(p), "l"(v) : "memory");
}

// For words only the host reads after the kernel ends (the progress word) and for stores a later fence orders: no
// fence of its own, so it does not wait for the stores before it.
static __device__ __forceinline__ void gpu_ipc_ring_store_relaxed(gpu_ipc_ring_u64* p, gpu_ipc_ring_u64 v)
{
    asm volatile("st.relaxed.sys.global.u64 [%0], %1;" : : "l"(p), "l"(v) : "memory");
}

// Waits until *word >= target (unsigned: POISON satisfies every wait), %globaltimer passes `deadline`, or *abort is
// non-zero (`abort` may be null). One thread. The word is read first: a wait that is already satisfied costs one
// read over the bus; the abort word is looked at after the first poll that falls short, then every
// GPU_IPC_RING_ABORT_CHECK polls (a kernel that must not start on an aborted ring reads it itself first, as
// gpu_ipc_ring_wait does). On GPU_IPC_RING_OK the value seen is stored into *seen when `seen` is not null (no second
// read over the bus).
static __device__ __forceinline__ int gpu_ipc_ring_wait_at_least(const gpu_ipc_ring_u64* word,
                                                                  gpu_ipc_ring_u64 target, gpu_ipc_ring_u64 deadline,
                                                                  const gpu_ipc_ring_u64* abort,
                                                                  gpu_ipc_ring_u64* seen = 0)
{
    unsigned int polls = 0;
    gpu_ipc_ring_u64 value;
    while ((value = gpu_ipc_ring_load_acquire(word)) < target) {
        if (gpu_ipc_ring_globaltimer() >= deadline) {
            return GPU_IPC_RING_TIMED_OUT;
        }
        if (polls++ % GPU_IPC_RING_ABORT_CHECK == 0 && abort != 0 && gpu_ipc_ring_load_acquire(abort) != 0) {
            return GPU_IPC_RING_ABORTED;
        }
    }
    if (seen != 0) {
        *seen = value;
    }
    return GPU_IPC_RING_OK;
}

// The stamp rule: whether `stamp`, a value read from published[seq % N], says frame `seq` is the producer's.
static __device__ __forceinline__ bool gpu_ipc_ring_frame_valid(gpu_ipc_ring_u64 stamp, gpu_ipc_ring_u64 seq)
{
    return (stamp & (GPU_IPC_RING_POISON - 1ull)) == seq + 1ull;
}

static __device__ __forceinline__ gpu_ipc_ring_u64 gpu_ipc_ring_slot(const gpu_ipc_ring_descriptor* d,
                                                                     gpu_ipc_ring_u64 seq)
{
    return seq % d->slot_count;
}

// The counter published[seq % N].
static __device__ __forceinline__ gpu_ipc_ring_u64* gpu_ipc_ring_published_word(const gpu_ipc_ring_descriptor* d,
                                                                                gpu_ipc_ring_u64 seq)
{
    return (gpu_ipc_ring_u64*)(d->control + d->published_offset + gpu_ipc_ring_slot(d, seq) * d->published_stride);
}

// This consumer's counter released[seq % N].
static __device__ __forceinline__ gpu_ipc_ring_u64* gpu_ipc_ring_released_word(const gpu_ipc_ring_descriptor* d,
                                                                               gpu_ipc_ring_u64 seq)
{
    return (gpu_ipc_ring_u64*)(d->control + d->released_offset + gpu_ipc_ring_slot(d, seq) * d->released_stride);
}

// The first byte of frame `seq` (d->slot_bytes bytes, 256-byte aligned).
static __device__ __forceinline__ void* gpu_ipc_ring_frame(const gpu_ipc_ring_descriptor* d, gpu_ipc_ring_u64 seq)
{
    return (void*)(d->slots + gpu_ipc_ring_slot(d, seq) * d->slot_stride);
}

// Waits (one thread) until frame `seq` is published or the producer is gone (its poison), bounded by `deadline`
// and the abort word; on GPU_IPC_RING_OK stores the published word into *stamp: check it with
// gpu_ipc_ring_frame_valid before reading the frame. The acquire load orders the frame's reads after it for this
// thread; share the answer with the others through a barrier (__syncthreads) before they read.
static __device__ __forceinline__ int gpu_ipc_ring_wait_frame(const gpu_ipc_ring_descriptor* d, gpu_ipc_ring_u64 seq,
                                                              gpu_ipc_ring_u64 deadline, gpu_ipc_ring_u64* stamp)
{
    return gpu_ipc_ring_wait_at_least(gpu_ipc_ring_published_word(d, seq), seq + 1ull, deadline,
                                      (const gpu_ipc_ring_u64*)d->abort, stamp);
}

// Releases frame `seq` (one thread, after every read of it: a barrier first when several threads read it): the
// producer may rewrite its slot once every live consumer has.
static __device__ __forceinline__ void gpu_ipc_ring_release_frame(const gpu_ipc_ring_descriptor* d,
                                                                  gpu_ipc_ring_u64 seq)
{
    gpu_ipc_ring_store_release(gpu_ipc_ring_released_word(d, seq), seq + 1ull);
}

// Tells the host how far the kernel got: `next` is the first frame it has not released. A relaxed store: the host
// reads the word once the kernel has ended (or, for its bookkeeping only, while it runs).
static __device__ __forceinline__ void gpu_ipc_ring_set_progress(const gpu_ipc_ring_descriptor* d,
                                                                 gpu_ipc_ring_u64 next)
{
    gpu_ipc_ring_store_relaxed((gpu_ipc_ring_u64*)d->progress, next);
}

// Whether the host asked the kernel to leave (a peer died, the consumer is being dropped).
static __device__ __forceinline__ bool gpu_ipc_ring_aborted(const gpu_ipc_ring_descriptor* d)
{
    return gpu_ipc_ring_load_acquire((const gpu_ipc_ring_u64*)d->abort) != 0;
}

// ---- The producer's side ----------------------------------------------------------------------------------------

// What a kernel needs to act on the ring as its producer: device addresses and byte offsets, all u64. Mirrors
// `ipc_core::frames::ProducerRingDescriptor` (a unit test checks both agree).
struct gpu_ipc_ring_producer_descriptor {
    gpu_ipc_ring_u64 version;                // GPU_IPC_RING_PRODUCER_DESCRIPTOR_VERSION
    gpu_ipc_ring_u64 control;                // device address of the control block (registered host memory)
    gpu_ipc_ring_u64 published_offset;       // byte offset of published[0]
    gpu_ipc_ring_u64 published_stride;       // bytes from published[i] to published[i + 1]
    gpu_ipc_ring_u64 next_sequence_offset;   // byte offset of next_sequence (the first frame not yet published)
    gpu_ipc_ring_u64 records_offset;         // byte offset of consumer record 0 (its state word)
    gpu_ipc_ring_u64 record_stride;          // bytes from one consumer record to the next
    gpu_ipc_ring_u64 join_offset;            // bytes from a record's state word to its join sequence
    gpu_ipc_ring_u64 released_offset;        // bytes from a record's state word to its released[0]
    gpu_ipc_ring_u64 released_stride;        // bytes from a record's released[i] to released[i + 1]
    gpu_ipc_ring_u64 consumer_records;       // records in use (the ring's max consumers)
    gpu_ipc_ring_u64 slots;                  // device address of slot 0's frame
    gpu_ipc_ring_u64 slot_stride;            // bytes from one slot to the next
    gpu_ipc_ring_u64 slot_bytes;             // bytes of a frame
    gpu_ipc_ring_u64 slot_count;             // N
    gpu_ipc_ring_u64 first_sequence;         // the first frame this kernel is to publish
    gpu_ipc_ring_u64 abort;                  // device address of the abort word: non-zero means leave now
    gpu_ipc_ring_u64 progress;               // device address of the progress word: the next frame not published
};

static __device__ __forceinline__ gpu_ipc_ring_u64* gpu_ipc_ring_control_word(gpu_ipc_ring_u64 control,
                                                                              gpu_ipc_ring_u64 offset)
{
    return (gpu_ipc_ring_u64*)(control + offset);
}

// The first byte of frame `seq`'s slot, to write before publishing it.
static __device__ __forceinline__ void* gpu_ipc_ring_slot_to_write(const gpu_ipc_ring_producer_descriptor* d,
                                                                   gpu_ipc_ring_u64 seq)
{
    return (void*)(d->slots + (seq % d->slot_count) * d->slot_stride);
}

// Waits (one thread) until consumer record `i` no longer holds frame `previous`: it released it (a dead consumer's
// counters hold POISON, which satisfies the wait), it is not live, or it joined after that frame. The release and
// the record's state are read together first (one trip over the bus when the consumer is ahead or the record is
// free); then the state again every
// GPU_IPC_RING_ABORT_CHECK polls while it waits: a record that changed hands (the consumer left, died, or a new one
// took the record) is judged again. A record mid-registration (Joining) is waited out: the host decides its join
// sequence in microseconds.
static __device__ __forceinline__ int gpu_ipc_ring_wait_record(const gpu_ipc_ring_producer_descriptor* d,
                                                               gpu_ipc_ring_u64 i, gpu_ipc_ring_u64 previous,
                                                               gpu_ipc_ring_u64 deadline)
{
    const gpu_ipc_ring_u64 record = d->records_offset + i * d->record_stride;
    const gpu_ipc_ring_u64* state = gpu_ipc_ring_control_word(d->control, record);
    const gpu_ipc_ring_u64* released = gpu_ipc_ring_control_word(
        d->control, record + d->released_offset + (previous % d->slot_count) * d->released_stride);
    const gpu_ipc_ring_u64* abort = (const gpu_ipc_ring_u64*)d->abort;
    // The release and the state side by side (two relaxed reads in flight at once), then a fence that gives both
    // acquire ordering: a consumer ahead of the producer, or a record nobody holds, costs one trip over the bus.
    gpu_ipc_ring_u64 seen_released, seen_state;
    asm volatile("ld.relaxed.sys.global.u64 %0, [%1];" : "=l"(seen_released) : "l"(released) : "memory");
    asm volatile("ld.relaxed.sys.global.u64 %0, [%1];" : "=l"(seen_state) : "l"(state) : "memory");
    asm volatile("fence.acq_rel.sys;" : : : "memory");
    const gpu_ipc_ring_u64 seen_kind = seen_state & GPU_IPC_RING_STATE_MASK;
    if (seen_released > previous || (seen_kind != GPU_IPC_RING_STATE_LIVE && seen_kind != GPU_IPC_RING_STATE_JOINING)) {
        return GPU_IPC_RING_OK;
    }
    unsigned int polls = 0;
    // The state seen above (the fence gave it acquire ordering) is judged first; later rounds read it again.
    gpu_ipc_ring_u64 word = seen_state;
    for (bool first = true;; first = false) {
        if (!first) {
            word = gpu_ipc_ring_load_acquire(state);
        }
        const gpu_ipc_ring_u64 kind = word & GPU_IPC_RING_STATE_MASK;
        bool holds = false;
        if (kind == GPU_IPC_RING_STATE_LIVE) {
            // Acquire on the state orders this read after the host's registration, which wrote it before Live.
            holds = gpu_ipc_ring_load_acquire(gpu_ipc_ring_control_word(d->control, record + d->join_offset))
                    <= previous;
        }
        if (kind != GPU_IPC_RING_STATE_JOINING && !holds) {
            return GPU_IPC_RING_OK;
        }
        // Poll the release (or the registration) until the record's state changes.
        do {
            if (kind == GPU_IPC_RING_STATE_LIVE && gpu_ipc_ring_load_acquire(released) > previous) {
                return GPU_IPC_RING_OK;
            }
            if (gpu_ipc_ring_globaltimer() >= deadline) {
                return GPU_IPC_RING_TIMED_OUT;
            }
            if (++polls % GPU_IPC_RING_ABORT_CHECK == 0 && gpu_ipc_ring_load_acquire(abort) != 0) {
                return GPU_IPC_RING_ABORTED;
            }
        } while (polls % GPU_IPC_RING_ABORT_CHECK != 0 || gpu_ipc_ring_load_acquire(state) == word);
    }
}

// Waits until frame `seq`'s slot may be written: every consumer that is live and joined at or before frame seq - N
// has released it (the rule of the host producer, docs/ring.md). Call it with ALL 32 lanes of one warp: lane L
// looks after records L, L + 32, ..., so the records' words are read over the bus side by side, not one after
// another; every lane returns the same outcome. Bounded by `deadline` and the abort word. Share the answer with
// the block through a barrier before any thread writes the slot.
static __device__ __forceinline__ int gpu_ipc_ring_acquire_slot(const gpu_ipc_ring_producer_descriptor* d,
                                                                gpu_ipc_ring_u64 seq, gpu_ipc_ring_u64 deadline)
{
    int outcome = GPU_IPC_RING_OK;
    // The last lane looks at the abort word (with 31 records or fewer it holds none: no trip on the others' path).
    if (threadIdx.x % 32u == 31u && gpu_ipc_ring_load_acquire((const gpu_ipc_ring_u64*)d->abort) != 0) {
        outcome = GPU_IPC_RING_ABORTED;
    } else if (seq >= d->slot_count) {
        const gpu_ipc_ring_u64 previous = seq - d->slot_count;
        for (gpu_ipc_ring_u64 i = threadIdx.x % 32u; i < d->consumer_records; i += 32u) {
            outcome = gpu_ipc_ring_wait_record(d, i, previous, deadline);
            if (outcome != GPU_IPC_RING_OK) {
                break;
            }
        }
    }
    // The warp agrees on the worst outcome (ABORTED > TIMED_OUT > OK).
    for (int lanes = 16; lanes > 0; lanes /= 2) {
        const int other = __shfl_xor_sync(0xffffffffu, outcome, lanes);
        outcome = other > outcome ? other : outcome;
    }
    return outcome;
}

// Publishes frame `seq` (one thread, after every write of the frame: a barrier first when several threads wrote
// it): published[seq % N] = seq + 1 with st.release.sys, then next_sequence and the progress word. The full fence
// after next_sequence pairs with the host's registration of a consumer (it claims a record, then reads
// next_sequence as the consumer's join sequence): the next acquire's reads of the records come after it, so a
// consumer joining now is either seen or joins after this frame. The progress word is for the host's bookkeeping.
static __device__ __forceinline__ void gpu_ipc_ring_publish_frame(const gpu_ipc_ring_producer_descriptor* d,
                                                                  gpu_ipc_ring_u64 seq)
{
    gpu_ipc_ring_store_release(
        gpu_ipc_ring_control_word(d->control, d->published_offset + (seq % d->slot_count) * d->published_stride),
        seq + 1ull);
    gpu_ipc_ring_store_relaxed(gpu_ipc_ring_control_word(d->control, d->next_sequence_offset), seq + 1ull);
    asm volatile("fence.sc.sys;" : : : "memory");
    gpu_ipc_ring_store_relaxed((gpu_ipc_ring_u64*)d->progress, seq + 1ull);
}

// ---- Frame graphs ----------------------------------------------------------------------------------------------

// The frame graphs' per-ring state, in device memory (docs/frames.md, "Frame graphs"): one CUDA graph per slot is
// captured once, its kernels' arguments fixed, so the frame a graph launch is for lives here. The ring step that
// opens a frame (gpu_ipc_graph_wait_frame, gpu_ipc_graph_acquire_slot) writes `valid`; the one that closes it
// advances `sequence`. The application's kernels in the graph read `sequence` (which frame) and `valid` (0: the
// wait gave up or the frame is not the producer's; do not read or write the slot).
struct gpu_ipc_graph_frame {
    gpu_ipc_ring_u64 sequence;  // the frame the graph launched now is for
    gpu_ipc_ring_u64 valid;     // 1 when the slot may be used
    gpu_ipc_ring_u64 skipped;   // frames whose wait gave up or whose stamp was not the producer's (consumer side)
    gpu_ipc_ring_u64 reserved;
};

#endif // GPU_IPC_RING_CUH
