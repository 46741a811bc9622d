// gpu-ipc frame ring: the producer's side (gpu_ipc_ring.cuh includes it, and its opening comment has the rules):
// a slot to write, the producer's view of the consumer records, the wait for a free slot and the publish, on the
// descriptor `Producer::launch_on_ring` passes (struct gpu_ipc_ring_producer_descriptor).

#ifndef GPU_IPC_RING_PRODUCER_CUH
#define GPU_IPC_RING_PRODUCER_CUH

#include "gpu_ipc_ring_waits.cuh"

// The producer's descriptor, struct gpu_ipc_ring_producer_descriptor, is in gpu_ipc_ring_layout.cuh (generated from
// ipc_core::resident::ProducerRingDescriptor, which `Producer::launch_on_ring` passes).

static __device__ __forceinline__ gpu_ipc_ring_u64* gpu_ipc_ring_control_word(gpu_ipc_ring_u64 control,
                                                                              gpu_ipc_ring_u64 offset)
{
    return (gpu_ipc_ring_u64*)(control + offset);
}

// The first byte of frame `seq`'s slot, to write before publishing it.
static __device__ __forceinline__ void* gpu_ipc_ring_slot_to_write(const gpu_ipc_ring_producer_descriptor* d,
                                                                   gpu_ipc_ring_u64 seq)
{
    return (void*)(d->slots + gpu_ipc_ring_slot_of(seq, d->slot_count) * d->slot_stride);
}

// What a producer's kernel learned about the consumer records: one per lane of the warp that calls
// gpu_ipc_ring_acquire_slot, kept for the kernel's life, started with gpu_ipc_ring_producer_view_init. Lane L looks
// after record L (a ring has at most 16).
struct gpu_ipc_ring_producer_view {
    gpu_ipc_ring_u64 until;       // the records below were read for the frames before this one (0: not yet read)
    gpu_ipc_ring_u64 state;       // the lane's record's state word as read then
    gpu_ipc_ring_u64 join;        // its join sequence (meaningful when the state says Live)
    gpu_ipc_ring_u64 host_first;  // 1: its releases were last seen in host memory first (gpu_ipc_ring_wait_mirrored)
    gpu_ipc_ring_watch watch;     // what the exit words said (the lease's clock runs across frames)
};

static __device__ __forceinline__ void gpu_ipc_ring_producer_view_init(gpu_ipc_ring_producer_view* view)
{
    view->until = 0;
    view->state = 0;
    view->join = 0;
    view->host_first = 0;
    gpu_ipc_ring_watch_init(&view->watch);
}

// Reads the consumer records for frames seq .. seq + frames - 1 into each lane's view (one warp, all lanes): first
// next_sequence := seq + frames and a fence.sc.sys. That pairs with the host's registration of a consumer (it
// claims a record, then reads next_sequence as the consumer's join sequence): a consumer this read misses joins at
// seq + frames or later, so it holds none of the slots these frames overwrite. A record mid-registration (Joining)
// is waited out (the host sets its join sequence in microseconds). Lane 31 looks at the exit words.
static __device__ __forceinline__ int gpu_ipc_ring_read_records(const gpu_ipc_ring_producer_descriptor* d,
                                                                gpu_ipc_ring_producer_view* view,
                                                                gpu_ipc_ring_u64 seq, gpu_ipc_ring_u64 frames,
                                                                gpu_ipc_ring_u64 deadline)
{
    const unsigned int lane = threadIdx.x % 32u;
    if (lane == 0) {
        gpu_ipc_ring_store_relaxed(gpu_ipc_ring_control_word(d->control, d->next_sequence_offset), seq + frames);
    }
    __syncwarp();
    asm volatile("fence.sc.sys;" : : : "memory");
    const gpu_ipc_ring_u64 record = d->records_offset + lane * d->record_stride;
    const gpu_ipc_ring_u64* state_word = gpu_ipc_ring_control_word(d->control, record);
    const gpu_ipc_ring_u64* join_word = gpu_ipc_ring_control_word(d->control, record + d->join_offset);
    const bool mine = lane < d->consumer_records;
    const gpu_ipc_ring_u64* exit = (const gpu_ipc_ring_u64*)d->abort;
    // The state and the join sequence side by side (and lane 31's look at the exit words), then one fence gives them
    // acquire ordering.
    gpu_ipc_ring_u64 state = mine ? gpu_ipc_ring_load_relaxed(state_word) : 0ull;
    gpu_ipc_ring_u64 join = mine ? gpu_ipc_ring_load_relaxed(join_word) : 0ull;
    int outcome = lane == 31u ? gpu_ipc_ring_look(exit, &view->watch) : GPU_IPC_RING_OK;
    gpu_ipc_ring_fence_acq_rel();
    unsigned int polls = 0;
    while (outcome == GPU_IPC_RING_OK && (state & GPU_IPC_RING_STATE_MASK) == GPU_IPC_RING_STATE_JOINING) {
        if (gpu_ipc_ring_globaltimer() >= deadline) {
            outcome = GPU_IPC_RING_TIMED_OUT;
        } else if (++polls % GPU_IPC_RING_ABORT_CHECK == 0 &&
                   (outcome = gpu_ipc_ring_look(exit, &view->watch)) != GPU_IPC_RING_OK) {
            // The exit words say to leave.
        } else {
            // Acquire on the state orders the join read after the host's registration, which wrote it before Live.
            state = gpu_ipc_ring_load_acquire(state_word);
            join = gpu_ipc_ring_load_acquire(join_word);
        }
    }
    view->until = seq + frames;
    view->state = state;
    view->join = join;
    return outcome;
}

// Waits (one lane) until its record no longer holds frame `previous`: it released it (a dead or departed consumer's
// counters hold POISON, which satisfies the wait), or its state word is no longer the one the view read (the
// consumer left, died, or a newcomer took the record: a newcomer joined after the frames the view serves). The
// release is polled as gpu_ipc_ring_wait_mirrored does; the state is looked at with the host copy.
static __device__ __forceinline__ int gpu_ipc_ring_wait_record(const gpu_ipc_ring_producer_descriptor* d,
                                                               gpu_ipc_ring_producer_view* view,
                                                               gpu_ipc_ring_u64 previous, gpu_ipc_ring_u64 deadline)
{
    const unsigned int lane = threadIdx.x % 32u;
    const gpu_ipc_ring_u64 record = d->records_offset + lane * d->record_stride;
    const gpu_ipc_ring_u64 slot = gpu_ipc_ring_slot_of(previous, d->slot_count);
    const gpu_ipc_ring_u64* state_word = gpu_ipc_ring_control_word(d->control, record);
    const gpu_ipc_ring_u64* host = gpu_ipc_ring_control_word(
        d->control, record + d->released_offset + slot * d->released_stride);
    const gpu_ipc_ring_u64* device =
        d->device_words == 0 ? 0
                             : (const gpu_ipc_ring_u64*)(d->device_words + GPU_IPC_RING_DEVICE_RELEASED +
                                                         lane * GPU_IPC_RING_DEVICE_RECORD + 8ull * slot);
    const gpu_ipc_ring_u64* exit = (const gpu_ipc_ring_u64*)d->abort;
    const gpu_ipc_ring_u64 target = previous + 1ull;
    for (unsigned int polls = 0;; ++polls) {
        bool done = false;
        int left = GPU_IPC_RING_OK;
        if (device != 0 && view->host_first == 0) {
            // The device copy with ld.acquire.sys; the host copy, the state and the exit words now and then.
            done = gpu_ipc_ring_load_acquire_gpu(device) >= target;
            if (!done && polls % GPU_IPC_RING_HOST_CHECK == GPU_IPC_RING_HOST_CHECK - 1u) {
                const gpu_ipc_ring_u64 on_host = gpu_ipc_ring_load_relaxed(host);
                const gpu_ipc_ring_u64 state = gpu_ipc_ring_load_relaxed(state_word);
                left = gpu_ipc_ring_look(exit, &view->watch);
                if (on_host >= target || state != view->state) {
                    gpu_ipc_ring_fence_acq_rel();
                    view->host_first = on_host >= target ? 1ull : view->host_first;
                    done = true;
                }
            }
        } else {
            // The host copy with ld.acquire.sys (and the device copy beside it, when there is one); the state and
            // the exit words every GPU_IPC_RING_ABORT_CHECK polls.
            const gpu_ipc_ring_u64 on_device = device != 0 ? gpu_ipc_ring_load_relaxed(device) : 0ull;
            done = gpu_ipc_ring_load_acquire(host) >= target;
            if (!done && on_device >= target) {
                gpu_ipc_ring_fence_acq_rel();
                view->host_first = 0;
                done = true;
            }
            if (!done && polls % GPU_IPC_RING_ABORT_CHECK == GPU_IPC_RING_ABORT_CHECK - 1u) {
                left = gpu_ipc_ring_look(exit, &view->watch);
                if (gpu_ipc_ring_load_acquire(state_word) != view->state) {
                    done = true;
                }
            }
        }
        if (done) {
            return GPU_IPC_RING_OK;
        }
        if (left != GPU_IPC_RING_OK) {
            return left;
        }
        if (gpu_ipc_ring_globaltimer() >= deadline) {
            return GPU_IPC_RING_TIMED_OUT;
        }
    }
}

// Waits until frame `seq`'s slot may be written: every consumer that is live and joined at or before frame seq - N
// has released it (the rule of the host producer, docs/ring.md). Call it with ALL 32 lanes of one warp, each with
// its own view, for frames in order: lane L looks after record L, so the records are waited for side by side;
// every lane returns the same outcome. The records themselves (state, join sequence) are read once every
// GPU_IPC_RING_VIEW_FRAMES frames (gpu_ipc_ring_read_records), so the frames between touch only the released words,
// in device memory when the consumers write the device copy. Bounded by `deadline` and the exit words (looked at
// when the records are read, while a wait falls short, and by lane 0 once a millisecond: GPU_IPC_RING_ABORTED,
// GPU_IPC_RING_ORPHANED). Share the answer with the block through a barrier before any thread writes the slot.
static __device__ __forceinline__ int gpu_ipc_ring_acquire_slot(const gpu_ipc_ring_producer_descriptor* d,
                                                                gpu_ipc_ring_producer_view* view,
                                                                gpu_ipc_ring_u64 seq, gpu_ipc_ring_u64 deadline,
                                                                gpu_ipc_ring_u64 frames = GPU_IPC_RING_VIEW_FRAMES)
{
    const unsigned int lane = threadIdx.x % 32u;
    // Lane 0 looks at the exit words once a millisecond, even when no wait falls short; the warp follows its answer.
    int outcome = lane == 0u && gpu_ipc_ring_watch_due(&view->watch)
                      ? gpu_ipc_ring_look((const gpu_ipc_ring_u64*)d->abort, &view->watch)
                      : GPU_IPC_RING_OK;
    outcome = __shfl_sync(0xffffffffu, outcome, 0);
    if (outcome == GPU_IPC_RING_OK && seq >= view->until) {
        outcome = gpu_ipc_ring_read_records(d, view, seq, frames, deadline);
    }
    if (outcome == GPU_IPC_RING_OK && seq >= d->slot_count && lane < d->consumer_records &&
        (view->state & GPU_IPC_RING_STATE_MASK) == GPU_IPC_RING_STATE_LIVE && view->join <= seq - d->slot_count) {
        outcome = gpu_ipc_ring_wait_record(d, view, seq - d->slot_count, deadline);
    }
    // The warp agrees on the worst outcome (ORPHANED > ABORTED > TIMED_OUT > OK): one instruction from sm_80 on.
#if __CUDA_ARCH__ >= 800
    outcome = (int)__reduce_max_sync(0xffffffffu, (unsigned int)outcome);
#else
    for (int lanes = 16; lanes > 0; lanes /= 2) {
        const int other = __shfl_xor_sync(0xffffffffu, outcome, lanes);
        outcome = other > outcome ? other : outcome;
    }
#endif
    return outcome;
}

// Without a view: the records are read for this frame alone (next_sequence := seq + 1 and a fence.sc.sys each
// call), and both copies of each release are read every poll. For kernels that make one frame per launch.
static __device__ __forceinline__ int gpu_ipc_ring_acquire_slot(const gpu_ipc_ring_producer_descriptor* d,
                                                                gpu_ipc_ring_u64 seq, gpu_ipc_ring_u64 deadline)
{
    gpu_ipc_ring_producer_view view;
    gpu_ipc_ring_producer_view_init(&view);
    view.host_first = 1;
    // One frame: the records are read (lane 31 looks at the exit words then); no look of lane 0's on top.
    view.watch.next_look = ~0ull;
    return gpu_ipc_ring_acquire_slot(d, &view, seq, deadline, 1ull);
}

// Publishes frame `seq` (one thread, after every write of the frame: a barrier first when several threads wrote
// it): st.release.sys of published[seq % N] = seq + 1 in the device words (when the ring has them), then in the
// control block, then the progress word (for the host's bookkeeping). next_sequence is not touched here:
// gpu_ipc_ring_acquire_slot moved it past this frame when it read the records.
static __device__ __forceinline__ void gpu_ipc_ring_publish_frame(const gpu_ipc_ring_producer_descriptor* d,
                                                                  gpu_ipc_ring_u64 seq)
{
    const gpu_ipc_ring_u64 slot = gpu_ipc_ring_slot_of(seq, d->slot_count);
    if (d->device_words != 0) {
        gpu_ipc_ring_store_release_gpu((gpu_ipc_ring_u64*)(d->device_words + 8ull * slot), seq + 1ull);
    }
    gpu_ipc_ring_store_release(
        gpu_ipc_ring_control_word(d->control, d->published_offset + slot * d->published_stride), seq + 1ull);
    gpu_ipc_ring_store_relaxed((gpu_ipc_ring_u64*)d->progress, seq + 1ull);
}

#endif // GPU_IPC_RING_PRODUCER_CUH
