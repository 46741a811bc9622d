// The ring steps of frame graphs (ipc-core/src/resident/graph.rs): one CUDA graph per slot, captured once, holds the
// step that opens the frame, the application's own kernels for the slot, and the step that closes it; each frame is
// then one cuGraphLaunch. The steps are the ring's device API (gpu_ipc_ring.cuh) in kernels of one thread (one warp
// for the producer's acquire), their descriptor and the frame state (struct gpu_ipc_graph_frame) in device memory.
// The frame a launch is for is state->sequence, advanced on the GPU by the closing step, so the graph's arguments
// never change. Part of the ring program (files named ring_*.cu, which ipc-core embeds; see ring_poll.cu).
//
// A step that gives up (its deadline passed, or the kernel lease ran out: the launching process is gone) raises the
// abort word: every step queued behind it returns at once, and the host reports the give-up at its next launch. A
// graph launched for the wrong slot (not state->sequence's) raises it too. A step that finds the abort word raised
// (the host raises it when the peer dies or the side is dropped; the waiting steps also watch the survivor's abort
// word and the kernel lease) leaves `valid` at 0.

#include "gpu_ipc_ring.cuh"

// Consumer: waits (bounded by `timeout_ns` and the abort word) for frame state->sequence, which must be in `slot`,
// and checks its stamp; valid := 1 when the frame is the producer's, else counts it in `skipped`. One thread.
extern "C" __global__ void gpu_ipc_graph_wait_frame(const gpu_ipc_ring_descriptor* ring, gpu_ipc_graph_frame* state,
                                                    unsigned long long slot, unsigned long long timeout_ns)
{
    if (threadIdx.x != 0 || blockIdx.x != 0) {
        return;
    }
    const gpu_ipc_ring_u64 seq = state->sequence;
    state->valid = 0;
    if (seq % ring->slot_count != slot) {
        gpu_ipc_ring_store_release((gpu_ipc_ring_u64*)ring->abort, 1);
        return;
    }
    gpu_ipc_ring_u64 stamp = 0;
    const int waited = gpu_ipc_ring_wait_frame(ring, seq, gpu_ipc_ring_deadline(timeout_ns), &stamp);
    if (waited == GPU_IPC_RING_TIMED_OUT || waited == GPU_IPC_RING_ORPHANED) {
        gpu_ipc_ring_store_release((gpu_ipc_ring_u64*)ring->abort, 1);
    }
    if (waited == GPU_IPC_RING_OK && gpu_ipc_ring_frame_valid(stamp, seq)) {
        state->valid = 1;
    } else {
        state->skipped += 1;
    }
}

// Consumer: releases frame state->sequence (after the graph's kernels that read it) and moves to the next. One
// thread.
extern "C" __global__ void gpu_ipc_graph_release_frame(const gpu_ipc_ring_descriptor* ring, gpu_ipc_graph_frame* state)
{
    if (threadIdx.x != 0 || blockIdx.x != 0) {
        return;
    }
    const gpu_ipc_ring_u64 seq = state->sequence;
    gpu_ipc_ring_release_frame(ring, seq);
    state->sequence = seq + 1ull;
    gpu_ipc_ring_set_progress(ring, seq + 1ull);
}

// Producer: waits (bounded by `timeout_ns` and the abort word) until frame state->sequence's slot, which must be
// `slot`, is free; valid := 1 when it is. Launch it with one warp (32 threads): the consumer records are read side
// by side.
extern "C" __global__ void gpu_ipc_graph_acquire_slot(const gpu_ipc_ring_producer_descriptor* ring,
                                                      gpu_ipc_graph_frame* state, unsigned long long slot,
                                                      unsigned long long timeout_ns)
{
    if (blockIdx.x != 0 || threadIdx.x >= 32u) {
        return;
    }
    const gpu_ipc_ring_u64 seq = state->sequence;
    if (seq % ring->slot_count != slot) {
        if (threadIdx.x == 0) {
            state->valid = 0;
            gpu_ipc_ring_store_release((gpu_ipc_ring_u64*)ring->abort, 1);
        }
        return;
    }
    const int acquired = gpu_ipc_ring_acquire_slot(ring, seq, gpu_ipc_ring_deadline(timeout_ns));
    if (threadIdx.x == 0) {
        state->valid = acquired == GPU_IPC_RING_OK ? 1ull : 0ull;
        if (acquired == GPU_IPC_RING_TIMED_OUT || acquired == GPU_IPC_RING_ORPHANED) {
            gpu_ipc_ring_store_release((gpu_ipc_ring_u64*)ring->abort, 1);
        }
    }
}

// Producer: publishes frame state->sequence (after the graph's kernels that wrote it) and moves to the next; a slot
// that was not acquired is not published and the sequence stays. One thread.
extern "C" __global__ void gpu_ipc_graph_publish_frame(const gpu_ipc_ring_producer_descriptor* ring,
                                                       gpu_ipc_graph_frame* state)
{
    if (threadIdx.x != 0 || blockIdx.x != 0 || state->valid == 0) {
        return;
    }
    const gpu_ipc_ring_u64 seq = state->sequence;
    gpu_ipc_ring_publish_frame(ring, seq);
    state->sequence = seq + 1ull;
}

// ---- Stream-op waits (GraphWaits::StreamOps) ---------------------------------------------------------------------
//
// Without MPS a waiting kernel holds its context's time slice, so there the graphs wait with batch memory operation
// nodes (cuStreamWaitValue64 GEQ on the control block's counters, values set by the host before each launch) and
// these steps only judge what the wait let through: they never poll. A dead peer's counters hold the poison (bit
// 62), which satisfies every GEQ wait: the survivor's watchdog releases the waits by writing it.

// Consumer, after the graph's wait for published[slot] >= state->sequence + 1: valid := 1 when the frame is the
// producer's (its stamp), else counts it in `skipped` (the wait was released by the poison of a dead producer, or
// the side is aborting). A launch for the wrong slot raises the abort word. One thread.
extern "C" __global__ void gpu_ipc_graph_check_frame(const gpu_ipc_ring_descriptor* ring, gpu_ipc_graph_frame* state,
                                                     unsigned long long slot)
{
    if (threadIdx.x != 0 || blockIdx.x != 0) {
        return;
    }
    const gpu_ipc_ring_u64 seq = state->sequence;
    state->valid = 0;
    if (seq % ring->slot_count != slot) {
        gpu_ipc_ring_store_release((gpu_ipc_ring_u64*)ring->abort, 1);
        state->skipped += 1;
        return;
    }
    const gpu_ipc_ring_u64 stamp = gpu_ipc_ring_load_acquire(gpu_ipc_ring_published_word(ring, seq));
    if (!gpu_ipc_ring_aborted(ring) && gpu_ipc_ring_frame_valid(stamp, seq)) {
        state->valid = 1;
    } else {
        state->skipped += 1;
    }
}

// Producer, after the graph's waits for the consumers' releases of the slot's previous frame (the host chose whom
// to wait for when it launched the graph, and moved next_sequence past the frame then): valid := 1 unless the
// abort word is raised (the producer is being dropped: nothing is published from there on). A launch for the wrong
// slot raises the abort word. One thread.
extern "C" __global__ void gpu_ipc_graph_mark_slot(const gpu_ipc_ring_producer_descriptor* ring,
                                                   gpu_ipc_graph_frame* state, unsigned long long slot)
{
    if (threadIdx.x != 0 || blockIdx.x != 0) {
        return;
    }
    const gpu_ipc_ring_u64 seq = state->sequence;
    if (seq % ring->slot_count != slot) {
        state->valid = 0;
        gpu_ipc_ring_store_release((gpu_ipc_ring_u64*)ring->abort, 1);
        return;
    }
    // The abort word alone (one read over the bus per frame): this step judges, it does not wait.
    const bool aborted = gpu_ipc_ring_load_acquire((const gpu_ipc_ring_u64*)ring->abort) != 0;
    state->valid = aborted ? 0ull : 1ull;
}
