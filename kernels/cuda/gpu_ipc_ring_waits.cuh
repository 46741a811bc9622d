// gpu-ipc frame ring: what the device functions of both sides stand on (gpu_ipc_ring.cuh includes it, and its
// opening comment has the rules): the generated layout, %globaltimer deadlines, the ordered loads and stores, a
// frame's slot, the exit words' watch and the bounded waits on a counter and on its two copies.

#ifndef GPU_IPC_RING_WAITS_CUH
#define GPU_IPC_RING_WAITS_CUH

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

#endif // GPU_IPC_RING_WAITS_CUH
