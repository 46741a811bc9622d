// gpu-ipc frame ring: the consumer's side (gpu_ipc_ring.cuh includes it, and its opening comment has the rules and
// an example): the stamp rule, a frame's counters and bytes, the consumer's view, and the wait for, release of and
// progress through frames, on the descriptor `Consumer::launch_on_ring` passes (struct gpu_ipc_ring_descriptor).

#ifndef GPU_IPC_RING_CONSUMER_CUH
#define GPU_IPC_RING_CONSUMER_CUH

#include "gpu_ipc_ring_waits.cuh"

// The stamp rule: whether `stamp`, a value read from published[seq % N], says frame `seq` is the producer's.
static __device__ __forceinline__ bool gpu_ipc_ring_frame_valid(gpu_ipc_ring_u64 stamp, gpu_ipc_ring_u64 seq)
{
    return (stamp & (GPU_IPC_RING_POISON - 1ull)) == seq + 1ull;
}

static __device__ __forceinline__ gpu_ipc_ring_u64 gpu_ipc_ring_slot(const gpu_ipc_ring_descriptor* d,
                                                                     gpu_ipc_ring_u64 seq)
{
    return gpu_ipc_ring_slot_of(seq, d->slot_count);
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

// What a consumer's kernel learned about the ring between two frames: keep one (per waiting thread) for the
// kernel's life, start it with gpu_ipc_ring_consumer_view_init.
struct gpu_ipc_ring_consumer_view {
    gpu_ipc_ring_u64 host_first;  // 1: the producer's frames were last seen in host memory first (see
                                  // gpu_ipc_ring_wait_mirrored)
    gpu_ipc_ring_watch watch;     // what the exit words said (the lease's clock runs across frames)
};

static __device__ __forceinline__ void gpu_ipc_ring_consumer_view_init(gpu_ipc_ring_consumer_view* view)
{
    view->host_first = 0;
    gpu_ipc_ring_watch_init(&view->watch);
}

// The device copy of published[seq % N] (null without device words).
static __device__ __forceinline__ const gpu_ipc_ring_u64* gpu_ipc_ring_device_published(
    const gpu_ipc_ring_descriptor* d, gpu_ipc_ring_u64 seq)
{
    return d->device_words == 0 ? 0 : (const gpu_ipc_ring_u64*)(d->device_words + 8ull * gpu_ipc_ring_slot(d, seq));
}

// The device copy of this consumer's released[seq % N] (null without device words).
static __device__ __forceinline__ gpu_ipc_ring_u64* gpu_ipc_ring_device_released(const gpu_ipc_ring_descriptor* d,
                                                                                 gpu_ipc_ring_u64 seq)
{
    return d->device_words == 0
               ? 0
               : (gpu_ipc_ring_u64*)(d->device_words + GPU_IPC_RING_DEVICE_RELEASED +
                                     d->consumer_index * GPU_IPC_RING_DEVICE_RECORD + 8ull * gpu_ipc_ring_slot(d, seq));
}

// Waits (one thread) until frame `seq` is published or the producer is gone (its poison), bounded by `deadline`
// and the exit words (GPU_IPC_RING_ABORTED, GPU_IPC_RING_ORPHANED: leave); on GPU_IPC_RING_OK stores the published
// word into *stamp: check it with gpu_ipc_ring_frame_valid before reading the frame. Acquire ordering: the frame's
// reads by this thread come after it; share the answer with the others through a barrier (__syncthreads) before they
// read. With a view (kept across frames) it polls the device copy of the counter when the producer writes it, and
// looks at the exit words once a millisecond even when every frame is there at once; without one it reads both
// copies every poll.
static __device__ __forceinline__ int gpu_ipc_ring_wait_frame(const gpu_ipc_ring_descriptor* d,
                                                              gpu_ipc_ring_consumer_view* view, gpu_ipc_ring_u64 seq,
                                                              gpu_ipc_ring_u64 deadline, gpu_ipc_ring_u64* stamp)
{
    const gpu_ipc_ring_u64* exit = (const gpu_ipc_ring_u64*)d->abort;
    if (gpu_ipc_ring_watch_due(&view->watch)) {
        const int left = gpu_ipc_ring_look(exit, &view->watch);
        if (left != GPU_IPC_RING_OK) {
            return left;
        }
    }
    return gpu_ipc_ring_wait_mirrored_watched(gpu_ipc_ring_published_word(d, seq),
                                              gpu_ipc_ring_device_published(d, seq), seq + 1ull, deadline, exit,
                                              &view->watch, &view->host_first, stamp);
}

static __device__ __forceinline__ int gpu_ipc_ring_wait_frame(const gpu_ipc_ring_descriptor* d, gpu_ipc_ring_u64 seq,
                                                              gpu_ipc_ring_u64 deadline, gpu_ipc_ring_u64* stamp)
{
    gpu_ipc_ring_consumer_view view;
    gpu_ipc_ring_consumer_view_init(&view);
    view.host_first = 1;
    // One frame: the exit words are looked at only when the wait falls short (a look costs a trip over the bus).
    view.watch.next_look = ~0ull;
    return gpu_ipc_ring_wait_frame(d, &view, seq, deadline, stamp);
}

// Releases frame `seq` (one thread, after every read of it: a barrier first when several threads read it): the
// producer may rewrite its slot once every live consumer has. st.release.sys of the device copy of released[seq % N]
// (the one a producer's kernel polls), then of the host copy: the second release waits only for the first store.
static __device__ __forceinline__ void gpu_ipc_ring_release_frame(const gpu_ipc_ring_descriptor* d,
                                                                  gpu_ipc_ring_u64 seq)
{
    gpu_ipc_ring_u64* device = gpu_ipc_ring_device_released(d, seq);
    if (device != 0) {
        gpu_ipc_ring_store_release_gpu(device, seq + 1ull);
    }
    gpu_ipc_ring_store_release(gpu_ipc_ring_released_word(d, seq), seq + 1ull);
}

// Tells the host how far the kernel got: `next` is the first frame it has not released. A relaxed store: the host
// reads the word once the kernel has ended (or, for its bookkeeping only, while it runs).
static __device__ __forceinline__ void gpu_ipc_ring_set_progress(const gpu_ipc_ring_descriptor* d,
                                                                 gpu_ipc_ring_u64 next)
{
    gpu_ipc_ring_store_relaxed((gpu_ipc_ring_u64*)d->progress, next);
}

// Whether the host asked the kernel to leave (a peer died, the consumer is being dropped): the abort word alone, one
// read over the bus (gpu_ipc_ring_exit_raised adds the survivor's word, gpu_ipc_ring_look the lease).
static __device__ __forceinline__ bool gpu_ipc_ring_aborted(const gpu_ipc_ring_descriptor* d)
{
    return gpu_ipc_ring_load_acquire((const gpu_ipc_ring_u64*)d->abort) != 0;
}

#endif // GPU_IPC_RING_CONSUMER_CUH
