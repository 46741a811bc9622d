// Ring sync kernels of the gpu-poll strategy (ipc-core/src/frames/strategy/gpu_poll.rs): a one-thread kernel that
// polls the ring's 64-bit counters until they reach a target, and a one-thread kernel that publishes a counter.
// Each also stores the side's run-ahead mark when it is done (ipc-core/src/resident/run_ahead.rs): no stream memory
// operation between the kernels.
//
// Files named ring_*.cu are not part of the gpu-ipc-kernels program: scripts/gen_kernels.py compiles them as their
// own program into ipc-core/ring-kernels/, which ipc-core embeds (ipc-core cannot depend on the kernels crate).
//
// The memory-ordering rule is the one `gpu-ipc probe coherency` established (docs/kernels.md, docs/answers):
// publish with st.release.sys, poll with ld.acquire.sys, bound every poll by %globaltimer. The counters live in the
// ring's control block, host memory registered for the device (the same words the other strategies use), and, for
// peers on the ring's GPU, in its device words (docs/ring.md, "Device words"): the release kernel stores the device
// copy (st.release.gpu) before the control block's, and the wait polls the device copy as the device API does
// (gpu_ipc_ring_wait_mirrored), looking at the control block's copy too, so a peer that writes only that one (another
// implementation, a peer GPU) is still seen. Under MPS, a process SIGKILLed while either kernel's poll spins faults
// the MPS server for every client, whether it polls host or device memory (docs/frames.md, gpu-poll).
//
// Comparison: a wait is satisfied when counter >= target, unsigned. Counters only grow, and a survivor writes
// POISON = 2^62 into a dead peer's counters, which is above every sequence number, so poison ends every wait.

#include "gpu_ipc_ring.cuh"

#define RING_TIMED_OUT (1ull << 63)

// Waits until counters[first_word + i * word_stride] >= target for every bit i set in `mask`, or until
// %globaltimer has advanced `timeout_ns` past the kernel's start, or until *abort is non-zero (looked at once a poll
// falls short: at once on the control block's copy, with the host copy every GPU_IPC_RING_HOST_CHECK polls on the
// device copy; a wait already satisfied does not read it). `abort` is the side's exit words (struct
// gpu_ipc_ring_exit), whose lease and survivor's word are 0 here: a poll ends by itself within its budget. Then stores
// into *outcome `outcome_value` when every counter got there, or `outcome_value | 2^63` when it gave up; giving up
// also stores 1 into *abort, so the polls queued behind this one give up within those polls (the host sets *abort
// too, at teardown). Only the first thread of the first block works; launch it with one thread. The host checks that
// every word the mask can name lies inside the span it passes as `counters`. The wait is the ring's device API
// (gpu_ipc_ring.cuh). `mirror` (null: none): the device words; counter i's copy there is
// mirror[mirror_first_word + i * mirror_stride], and host_first[i] (device memory the side keeps, zeroed) is the
// wait's choice of copy between launches. Last, `mark` is stored into *progress (null: none) with st.release.sys, the
// side's run-ahead mark: one release orders the outcome before it (the CPU reads an outcome only once the stream has
// passed its mark); without a progress word the outcome is stored with st.release.sys itself.

extern "C" __global__ void gpu_ipc_ring_wait(const unsigned long long* counters, unsigned long long first_word,
                                             unsigned long long word_stride, unsigned int mask,
                                             unsigned long long target, unsigned long long timeout_ns,
                                             unsigned long long* outcome, unsigned long long outcome_value,
                                             unsigned long long* abort, const unsigned long long* mirror,
                                             unsigned long long mirror_first_word, unsigned long long mirror_stride,
                                             unsigned long long* host_first, unsigned long long* progress,
                                             unsigned long long mark)
{
    if (threadIdx.x != 0 || blockIdx.x != 0) {
        return;
    }
    // One deadline for every counter; the wait itself is the device API's (gpu_ipc_ring.cuh).
    unsigned long long deadline = gpu_ipc_ring_deadline(timeout_ns);
    bool gave_up = false;
    for (unsigned int bits = mask; bits != 0 && !gave_up; bits &= bits - 1) {
        unsigned int i = (unsigned int)(__ffs((int)bits) - 1);
        const unsigned long long* word = counters + first_word + (unsigned long long)i * word_stride;
        const unsigned long long* copy =
            mirror == 0 ? 0 : mirror + mirror_first_word + (unsigned long long)i * mirror_stride;
        gave_up = gpu_ipc_ring_wait_mirrored(word, copy, target, deadline, abort, host_first + i) != GPU_IPC_RING_OK;
    }
    if (gave_up) {
        gpu_ipc_ring_store_release(abort, 1);
    }
    const unsigned long long result = gave_up ? (outcome_value | RING_TIMED_OUT) : outcome_value;
    if (progress != 0) {
        gpu_ipc_ring_store_relaxed(outcome, result);
        gpu_ipc_ring_store_release(progress, mark);
    } else {
        gpu_ipc_ring_store_release(outcome, result);
    }
}

// Stores `value` into *mirror (the counter's device copy; null: none) with st.release.gpu, then into *counter with
// st.release.sys: every write of the work queued before this kernel on its stream is visible to whoever acquires
// either. Then `mark` into *progress (null: none), the side's run-ahead mark. Launch it with one thread.
extern "C" __global__ void gpu_ipc_ring_release(unsigned long long* counter, unsigned long long value,
                                                unsigned long long* mirror, unsigned long long* progress,
                                                unsigned long long mark)
{
    if (threadIdx.x == 0 && blockIdx.x == 0) {
        if (mirror != 0) {
            gpu_ipc_ring_store_release_gpu(mirror, value);
        }
        gpu_ipc_ring_store_release(counter, value);
        if (progress != 0) {
            gpu_ipc_ring_store_release(progress, mark);
        }
    }
}
