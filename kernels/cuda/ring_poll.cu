// Ring sync kernels of the gpu-poll strategy (ipc-core/src/frames/strategy/gpu_poll.rs): a one-thread kernel that
// polls the ring's 64-bit counters until they reach a target, and a one-thread kernel that publishes a counter.
//
// Files named ring_*.cu are not part of the gpu-ipc-kernels program: scripts/gen_kernels.py compiles them as their
// own program into ipc-core/ring-kernels/, which ipc-core embeds (ipc-core cannot depend on the kernels crate).
//
// The memory-ordering rule is the one `gpu-ipc probe coherency` established (docs/kernels.md, docs/answers):
// publish with st.release.sys, poll with ld.acquire.sys, bound every poll by %globaltimer. The counters live in the
// ring's control block, host memory registered for the device (the same words the other strategies use).
//
// Comparison: a wait is satisfied when counter >= target, unsigned. Counters only grow, and a survivor writes
// POISON = 2^62 into a dead peer's counters, which is above every sequence number, so poison ends every wait.

#include "gpu_ipc_ring.cuh"

#define RING_TIMED_OUT (1ull << 63)

// Waits until counters[first_word + i * word_stride] >= target for every bit i set in `mask`, or until
// %globaltimer has advanced `timeout_ns` past the kernel's start, or until *abort is non-zero (read before each
// counter's wait and every GPU_IPC_RING_ABORT_CHECK polls). Then stores into *outcome, with st.release.sys,
// `outcome_value` when every counter got there, or `outcome_value | 2^63` when it gave up; giving up also stores 1
// into *abort, so the polls queued behind this one give up at once (the host sets *abort too, at teardown). Only the
// first thread of the first block works; launch it with one thread. The host checks that every word the mask can
// name lies inside the span it passes as `counters`. The wait is the ring's device API (gpu_ipc_ring.cuh).

extern "C" __global__ void gpu_ipc_ring_wait(const unsigned long long* counters, unsigned long long first_word,
                                             unsigned long long word_stride, unsigned int mask,
                                             unsigned long long target, unsigned long long timeout_ns,
                                             unsigned long long* outcome, unsigned long long outcome_value,
                                             unsigned long long* abort)
{
    if (threadIdx.x != 0 || blockIdx.x != 0) {
        return;
    }
    // One deadline for every counter; the wait itself is the device API's (gpu_ipc_ring.cuh).
    unsigned long long deadline = gpu_ipc_ring_deadline(timeout_ns);
    bool gave_up = gpu_ipc_ring_load_acquire(abort) != 0;
    for (unsigned int bits = mask; bits != 0 && !gave_up; bits &= bits - 1) {
        unsigned int i = (unsigned int)(__ffs((int)bits) - 1);
        const unsigned long long* word = counters + first_word + (unsigned long long)i * word_stride;
        gave_up = gpu_ipc_ring_wait_at_least(word, target, deadline, abort) != GPU_IPC_RING_OK;
    }
    if (gave_up) {
        gpu_ipc_ring_store_release(abort, 1);
    }
    gpu_ipc_ring_store_release(outcome, gave_up ? (outcome_value | RING_TIMED_OUT) : outcome_value);
}

// Stores `value` into *counter with st.release.sys: every write of the work queued before this kernel on its stream
// is visible to whoever acquires the counter. Launch it with one thread.
extern "C" __global__ void gpu_ipc_ring_release(unsigned long long* counter, unsigned long long value)
{
    if (threadIdx.x == 0 && blockIdx.x == 0) {
        gpu_ipc_ring_store_release(counter, value);
    }
}
