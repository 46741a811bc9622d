// gpu-ipc frame ring: device functions for kernels that wait for, check and release frames on the ring's own
// counters (docs/ring.md, docs/kernels.md "The ring's device API").
//
//   #include "gpu_ipc_ring.cuh"
//   extern "C" __global__ void my_consumer(const gpu_ipc_ring_descriptor* ring, unsigned long long frames, ...)
//   {
//       gpu_ipc_ring_descriptor d = *ring;                 // once: the descriptor does not change
//       gpu_ipc_ring_consumer_view view;                   // what the waits learn, kept across frames
//       gpu_ipc_ring_consumer_view_init(&view);
//       for (unsigned long long seq = d.first_sequence; seq < d.first_sequence + frames; ++seq) {
//           unsigned long long stamp;
//           if (gpu_ipc_ring_wait_frame(&d, &view, seq, gpu_ipc_ring_deadline(1000000000ull), &stamp) != GPU_IPC_RING_OK
//               || !gpu_ipc_ring_frame_valid(stamp, seq)) {
//               break;                                     // aborted, timed out, or the producer is gone
//           }
//           ... read gpu_ipc_ring_frame(&d, seq) (d.slot_bytes bytes) ...
//           gpu_ipc_ring_release_frame(&d, seq);           // after every thread that read it is done
//           gpu_ipc_ring_set_progress(&d, seq + 1);
//       }
//   }
//
// `ring` comes from Rust: `Consumer::launch_on_ring` passes it as the kernel's first argument. Its struct, and every
// constant of the ring's layout, are in gpu_ipc_ring_layout.cuh, generated from ipc-core's Rust definitions
// (ipc_core::resident::RingDescriptor and the others: #[repr(C)], every field a u64), so the two cannot differ;
// copy both headers into your build. Offsets and strides come from the descriptor, never from constants here (the
// device words' fixed layout aside), so the functions work with every control-block layout the Rust side describes.
//
// Both sides: a consumer's kernel waits for frame N, checks it and releases it (gpu_ipc_ring_descriptor, from
// `Consumer::launch_on_ring`); a producer's kernel waits until frame N's slot is free (every live consumer released
// the frame it held, by the host producer's rule on the consumer records) and publishes it
// (gpu_ipc_ring_producer_descriptor, from `Producer::launch_on_ring`).
//
// Device words (docs/ring.md, "Device words"): a ring made by a producer with a GPU-side strategy also keeps a copy
// of `published` and of every consumer's `released` in device memory, at the end of the frame allocation. These
// functions write both copies and poll the device copy, which another kernel on the GPU sees in about 1 us where
// the host copy takes about 2.4 us each way (`scripts/signal-paths.sh OUT 3000 rtk`). Peers that write only the host
// copy (the host-side strategies' streams) are noticed by a look at it every GPU_IPC_RING_HOST_CHECK polls; a
// kernel that keeps a view (gpu_ipc_ring_consumer_view, gpu_ipc_ring_producer_view) then polls that peer's host copy
// from the next frame on. A descriptor whose device_words is 0 (a ring without them, or a consumer on a peer GPU)
// uses the host copy only. The device copy is stored and polled at .gpu scope (st.release.gpu, ld.acquire.gpu): only
// kernels on the ring's own GPU touch it, and a fence.gpu does not wait for writes still crossing the bus.
//
// Memory ordering: the rule `gpu-ipc probe coherency` established (docs/kernels.md): every counter another process
// writes is read with ld.acquire.sys, every counter this kernel publishes is stored with st.release.sys, and every
// wait is bounded by %globaltimer and by the exit words (struct gpu_ipc_ring_exit, at the descriptor's `abort`): the
// abort word, which the host sets when a peer dies or the side is dropped; the survivor's abort word in the control
// block, which the peer raises when it sees this kernel's process gone; and the kernel lease, a heartbeat that the
// launching process moves every 10 ms: a kernel whose heartbeat stands still for the lease leaves
// (GPU_IPC_RING_ORPHANED), so that a killed process's kernel never spins on (under MPS the server's teardown of a
// kernel that does not end faults its other clients: docs/frames.md, "Kills under MPS"). Every fence.sys costs a trip to the memory system (the dearest step of a handoff), so a counter seen in
// its polled copy needs none; a store to both copies is two releases, device copy first. The counters live in the
// ring's control block, host memory registered for the device, and in the device words (.gpu scope, above). No runtime headers: NVRTC and nvcc
// compile it alike.
//
// The stamp rule (docs/ring.md): frame s in slot s % N is the one its producer published iff
// (published[s % N] & (POISON - 1)) == s + 1. A survivor ORs POISON = 2^62 into `published` when the producer dies,
// which releases every wait and keeps the last real frame in the low bits; a frame whose stamp does not match was
// never written (or was overwritten) and must not be used.

#ifndef GPU_IPC_RING_CUH
#define GPU_IPC_RING_CUH

// The ring's layout, generated from ipc-core: gpu_ipc_ring_u64, GPU_IPC_RING_POISON, the consumer states, the device
// words, the descriptor versions, struct gpu_ipc_ring_exit, gpu_ipc_ring_descriptor,
// gpu_ipc_ring_producer_descriptor and gpu_ipc_graph_frame.
#include "gpu_ipc_ring_layout.cuh"

// How many polls of a device word pass between two looks at its host copy (and at the abort word).
#define GPU_IPC_RING_HOST_CHECK 1024u
// How many frames a producer's view of the consumer records serves (gpu_ipc_ring_acquire_slot with a view): the
// records are read, with a fence.sc.sys, once per that many frames, and a consumer registering meanwhile joins up
// to that many frames later.
#define GPU_IPC_RING_VIEW_FRAMES 128ull
// How many polls pass between two looks at the exit words (a look is a read over the bus).
#define GPU_IPC_RING_ABORT_CHECK 1024u
// How often, in %globaltimer ns, a kernel whose waits never fall short still looks at its exit words (the waits
// that keep a view across frames): once a millisecond.
#define GPU_IPC_RING_LOOK_NS 1000000ull

// Outcomes of a wait.
#define GPU_IPC_RING_OK 0
#define GPU_IPC_RING_TIMED_OUT 1
#define GPU_IPC_RING_ABORTED 2
// The launching process is gone: its heartbeat stood still for the kernel lease (struct gpu_ipc_ring_exit). 4, not 3:
// the example persistent kernels report their own 3 (GPU_IPC_PERSISTENT_STAMP_INVALID) beside these.
#define GPU_IPC_RING_ORPHANED 4

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

// The device words are read and written by kernels on the ring's own GPU only (a consumer on a peer GPU gets none in
// its descriptor): .gpu scope, whose fence drains no writes over the bus (a fence.sys waits for them).
static __device__ __forceinline__ gpu_ipc_ring_u64 gpu_ipc_ring_load_acquire_gpu(const gpu_ipc_ring_u64* p)
{
    gpu_ipc_ring_u64 v;
    asm volatile("ld.acquire.gpu.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
    return v;
}

static __device__ __forceinline__ void gpu_ipc_ring_store_release_gpu(gpu_ipc_ring_u64* p, gpu_ipc_ring_u64 v)
{
    asm volatile("st.release.gpu.global.u64 [%0], %1;" : : "l"(p), "l"(v) : "memory");
}

static __device__ __forceinline__ gpu_ipc_ring_u64 gpu_ipc_ring_load_relaxed(const gpu_ipc_ring_u64* p)
{
    gpu_ipc_ring_u64 v;
    asm volatile("ld.relaxed.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
    return v;
}

// After a relaxed load that saw a peer's release: acquire ordering for what follows; before relaxed stores: release
// ordering for what came before.
static __device__ __forceinline__ void gpu_ipc_ring_fence_acq_rel()
{
    asm volatile("fence.acq_rel.sys;" : : : "memory");
}

// For words only the host reads after the kernel ends (the progress word) and for stores a later fence orders: no
// fence of its own, so it does not wait for the stores before it.
static __device__ __forceinline__ void gpu_ipc_ring_store_relaxed(gpu_ipc_ring_u64* p, gpu_ipc_ring_u64 v)
{
    asm volatile("st.relaxed.sys.global.u64 [%0], %1;" : : "l"(p), "l"(v) : "memory");
}

// Slot of frame `seq` in a ring of `count` slots (1 to 256): seq % count without a 64-bit division, which is a
// routine of dozens of instructions on the GPU and lies on the path of every handoff: a mask for a power of two,
// 32-bit arithmetic while the sequence fits.
static __device__ __forceinline__ gpu_ipc_ring_u64 gpu_ipc_ring_slot_of(gpu_ipc_ring_u64 seq, gpu_ipc_ring_u64 count)
{
    if ((count & (count - 1ull)) == 0ull) {
        return seq & (count - 1ull);
    }
    if ((seq >> 32) == 0ull) {
        return (gpu_ipc_ring_u64)((unsigned int)seq % (unsigned int)count);
    }
    return seq % count;
}

// What a thread learned from its exit words (struct gpu_ipc_ring_exit, at the descriptor's `abort`), kept across the
// waits of a kernel's life (the views hold one), started with gpu_ipc_ring_watch_init: the lease and the survivor's
// abort word's address, read at the first look, and when the heartbeat was last seen to move.
struct gpu_ipc_ring_watch {
    gpu_ipc_ring_u64 started;    // 0 until the first look
    gpu_ipc_ring_u64 lease_ns;   // the lease (0: none)
    gpu_ipc_ring_u64 peer;       // device address of the survivor's abort word (0: none)
    gpu_ipc_ring_u64 beat;       // the heartbeat last seen
    gpu_ipc_ring_u64 since;      // %globaltimer when it was last seen to move
    gpu_ipc_ring_u64 next_look;  // %globaltimer from which gpu_ipc_ring_watch_due says to look again
};

static __device__ __forceinline__ void gpu_ipc_ring_watch_init(gpu_ipc_ring_watch* w)
{
    w->started = 0;
    w->lease_ns = 0;
    w->peer = 0;
    w->beat = 0;
    w->since = 0;
    w->next_look = 0;
}

// Looks at the exit words at `exit` (null: nothing to watch): GPU_IPC_RING_ABORTED when the abort word or the
// survivor's abort word is raised, GPU_IPC_RING_ORPHANED when the heartbeat has stood still for the lease (measured
// with %globaltimer from the first look that saw it, so no clock is shared with the host), else GPU_IPC_RING_OK. A
// look reads two or three words of host memory side by side: one trip over the bus.
static __device__ __forceinline__ int gpu_ipc_ring_look(const gpu_ipc_ring_u64* exit, gpu_ipc_ring_watch* w)
{
    if (exit == 0) {
        return GPU_IPC_RING_OK;
    }
    const gpu_ipc_ring_exit* words = (const gpu_ipc_ring_exit*)exit;
    const gpu_ipc_ring_u64 now = gpu_ipc_ring_globaltimer();
    if (w->started == 0) {
        w->lease_ns = gpu_ipc_ring_load_relaxed(&words->lease_ns);
        w->peer = gpu_ipc_ring_load_relaxed(&words->peer_abort);
        w->beat = gpu_ipc_ring_load_relaxed(&words->heartbeat);
        w->since = now;
        w->started = 1;
    }
    const gpu_ipc_ring_u64 abort = gpu_ipc_ring_load_relaxed(&words->abort);
    const gpu_ipc_ring_u64 peer = w->peer != 0 ? gpu_ipc_ring_load_relaxed((const gpu_ipc_ring_u64*)w->peer) : 0ull;
    const gpu_ipc_ring_u64 beat = w->lease_ns != 0 ? gpu_ipc_ring_load_relaxed(&words->heartbeat) : 0ull;
    w->next_look = now + GPU_IPC_RING_LOOK_NS;
    if (abort != 0 || peer != 0) {
        return GPU_IPC_RING_ABORTED;
    }
    if (w->lease_ns != 0) {
        if (beat != w->beat) {
            w->beat = beat;
            w->since = now;
        } else if (now - w->since >= w->lease_ns) {
            return GPU_IPC_RING_ORPHANED;
        }
    }
    return GPU_IPC_RING_OK;
}

// Whether a thread whose waits may never fall short should look at its exit words now (once per
// GPU_IPC_RING_LOOK_NS): the waits with a view ask before they poll.
static __device__ __forceinline__ bool gpu_ipc_ring_watch_due(const gpu_ipc_ring_watch* w)
{
    return gpu_ipc_ring_globaltimer() >= w->next_look;
}

// Whether the abort word at `exit` or the survivor's abort word it names is raised (one look, no lease; two reads
// over the bus one after the other when the survivor's word is named).
static __device__ __forceinline__ bool gpu_ipc_ring_exit_raised(const gpu_ipc_ring_u64* exit)
{
    const gpu_ipc_ring_exit* words = (const gpu_ipc_ring_exit*)exit;
    if (gpu_ipc_ring_load_acquire(&words->abort) != 0) {
        return true;
    }
    const gpu_ipc_ring_u64 peer = gpu_ipc_ring_load_relaxed(&words->peer_abort);
    return peer != 0 && gpu_ipc_ring_load_relaxed((const gpu_ipc_ring_u64*)peer) != 0;
}

// Waits as gpu_ipc_ring_wait_at_least, watching the exit words with `watch` (kept across waits by the caller).
static __device__ __forceinline__ int gpu_ipc_ring_wait_watched(const gpu_ipc_ring_u64* word, gpu_ipc_ring_u64 target,
                                                                gpu_ipc_ring_u64 deadline,
                                                                const gpu_ipc_ring_u64* exit,
                                                                gpu_ipc_ring_watch* watch, gpu_ipc_ring_u64* seen)
{
    unsigned int polls = 0;
    gpu_ipc_ring_u64 value;
    while ((value = gpu_ipc_ring_load_acquire(word)) < target) {
        if (gpu_ipc_ring_globaltimer() >= deadline) {
            return GPU_IPC_RING_TIMED_OUT;
        }
        if (polls++ % GPU_IPC_RING_ABORT_CHECK == 0) {
            const int left = gpu_ipc_ring_look(exit, watch);
            if (left != GPU_IPC_RING_OK) {
                return left;
            }
        }
    }
    if (seen != 0) {
        *seen = value;
    }
    return GPU_IPC_RING_OK;
}

// Waits until *word >= target (unsigned: POISON satisfies every wait), %globaltimer passes `deadline`, or the exit
// words at `abort` say to leave (`abort` may be null): their abort word, the survivor's, or the kernel lease
// (gpu_ipc_ring_look). One thread. The word is read first: a wait that is already satisfied costs one read over the
// bus; the exit words are looked at after the first poll that falls short, then every GPU_IPC_RING_ABORT_CHECK polls
// (a kernel that must not start on an aborted ring reads them itself first, as gpu_ipc_ring_wait does). The lease is
// timed from this call's first look: a kernel that waits many times keeps a gpu_ipc_ring_watch across them instead
// (gpu_ipc_ring_wait_watched; the views do). On GPU_IPC_RING_OK the value seen is stored into *seen when `seen` is not
// null (no second read over the bus).
static __device__ __forceinline__ int gpu_ipc_ring_wait_at_least(const gpu_ipc_ring_u64* word,
                                                                  gpu_ipc_ring_u64 target, gpu_ipc_ring_u64 deadline,
                                                                  const gpu_ipc_ring_u64* abort,
                                                                  gpu_ipc_ring_u64* seen = 0)
{
    gpu_ipc_ring_watch watch;
    gpu_ipc_ring_watch_init(&watch);
    return gpu_ipc_ring_wait_watched(word, target, deadline, abort, &watch, seen);
}

// Waits as gpu_ipc_ring_wait_watched for a counter kept twice: `host` (the control block) and `device`, its copy
// among the device words (null: none; then this is gpu_ipc_ring_wait_watched). `*host_first` picks the copy to poll
// and is updated for the next wait: 0 polls the device copy with ld.acquire.sys and looks at the host copy (and the
// exit words) every GPU_IPC_RING_HOST_CHECK polls, switching to 1 when the host copy got there first (a peer that
// does not write the device copy, or a poison); 1 reads both every poll (the host copy with ld.acquire.sys, the device
// copy relaxed beside it, then a fence.acq_rel.sys if it got there) and switches back to 0 when the device copy got
// there. A frame seen in the device copy costs no fence: a fence.sys is the dearest step of a handoff
// (docs/benchmarks.md). On GPU_IPC_RING_OK the value seen is stored into *seen (when not null).
static __device__ __forceinline__ int gpu_ipc_ring_wait_mirrored_watched(
    const gpu_ipc_ring_u64* host, const gpu_ipc_ring_u64* device, gpu_ipc_ring_u64 target, gpu_ipc_ring_u64 deadline,
    const gpu_ipc_ring_u64* exit, gpu_ipc_ring_watch* watch, gpu_ipc_ring_u64* host_first, gpu_ipc_ring_u64* seen)
{
    if (device == 0) {
        return gpu_ipc_ring_wait_watched(host, target, deadline, exit, watch, seen);
    }
    for (unsigned int polls = 0;; ++polls) {
        gpu_ipc_ring_u64 value = 0;
        int left = GPU_IPC_RING_OK;
        if (*host_first == 0) {
            value = gpu_ipc_ring_load_acquire_gpu(device);
            if (value < target && polls % GPU_IPC_RING_HOST_CHECK == GPU_IPC_RING_HOST_CHECK - 1u) {
                const gpu_ipc_ring_u64 on_host = gpu_ipc_ring_load_relaxed(host);
                left = gpu_ipc_ring_look(exit, watch);
                if (on_host >= target) {
                    gpu_ipc_ring_fence_acq_rel();
                    *host_first = 1;
                    value = on_host;
                }
            }
        } else {
            const gpu_ipc_ring_u64 on_device = gpu_ipc_ring_load_relaxed(device);
            const gpu_ipc_ring_u64 on_host = gpu_ipc_ring_load_acquire(host);
            if (on_device >= target) {
                gpu_ipc_ring_fence_acq_rel();
                *host_first = 0;
                value = on_device;
            } else if (on_host >= target) {
                value = on_host;
            } else if (polls % GPU_IPC_RING_ABORT_CHECK == 0u) {
                left = gpu_ipc_ring_look(exit, watch);
            }
        }
        if (value >= target) {
            if (seen != 0) {
                *seen = value;
            }
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

// gpu_ipc_ring_wait_mirrored_watched with a watch of its own (the lease timed from this call's first look): for a
// kernel that waits once (gpu-poll's).
static __device__ __forceinline__ int gpu_ipc_ring_wait_mirrored(const gpu_ipc_ring_u64* host,
                                                                 const gpu_ipc_ring_u64* device,
                                                                 gpu_ipc_ring_u64 target, gpu_ipc_ring_u64 deadline,
                                                                 const gpu_ipc_ring_u64* abort,
                                                                 gpu_ipc_ring_u64* host_first,
                                                                 gpu_ipc_ring_u64* seen = 0)
{
    gpu_ipc_ring_watch watch;
    gpu_ipc_ring_watch_init(&watch);
    return gpu_ipc_ring_wait_mirrored_watched(host, device, target, deadline, abort, &watch, host_first, seen);
}

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

// ---- The producer's side ----------------------------------------------------------------------------------------

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

// ---- Frame graphs ----------------------------------------------------------------------------------------------

// The frame graphs' per-ring state in device memory (docs/frames.md, "Frame graphs"), struct gpu_ipc_graph_frame, is
// in gpu_ipc_ring_layout.cuh (generated from ipc-core's GraphFrameState): one CUDA graph per slot is captured once,
// its kernels' arguments fixed, so the frame a graph launch is for lives there. The ring step that opens a frame
// (gpu_ipc_graph_wait_frame, gpu_ipc_graph_acquire_slot) writes `valid`; the one that closes it advances `sequence`.
// The application's kernels in the graph read `sequence` (which frame) and `valid` (0: the wait gave up or the frame
// is not the producer's; do not read or write the slot).

#endif // GPU_IPC_RING_CUH
