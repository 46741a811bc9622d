// Demo kernels of the work queue (docs/work-queue.md): a persistent worker that pops tasks, does some work on each
// and completes it, and a producer that pushes tasks from a kernel. The GPU tests and `work_queue bench` run them.
//
// A demo task's record is `record_bytes` long (a multiple of 8): every 64-bit word holds the task's value.

#include "work_queue.cuh"

// Words of a demo worker's result (see gpu_ipc_wq_demo_worker).
#define GPU_IPC_WQ_DEMO_RESULT_WORDS 10

// A 64-bit mix (the finaliser of MurmurHash3): the unit of the worker's "work".
static __device__ __forceinline__ gpu_ipc_wq_u64 gpu_ipc_wq_demo_mix(gpu_ipc_wq_u64 x)
{
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ull;
    x ^= x >> 33;
    return x;
}

// Each warp: lane 0 pops a task (waiting while the queue is empty), the warp reads its record (every lane some
// words, each mixed `work_rounds` times) and checks that every word holds the value, lane 0 completes it. Ends when
// the queue is closed and drained, or `timeout_ns` after the start. Adds into result[0..8]: tasks completed, sum of
// their values, sum of their squares (wrapping), completions refused (lease lost), warps that reached the deadline,
// XOR of the work, tasks that were redeliveries (attempt > 0), records with a word that was not the value; keeps in
// result[8] the earliest %globaltimer at which a warp started (the caller sets it to ~0 first) and in result[9] the
// latest at which one ended: the same clock in every process on the GPU, so runs in several processes can be timed
// together.
extern "C" __global__ void gpu_ipc_wq_demo_worker(gpu_ipc_wq_u64* q, unsigned int worker, gpu_ipc_wq_u64 work_rounds,
                                                  gpu_ipc_wq_u64 timeout_ns, gpu_ipc_wq_u64* result)
{
    const unsigned int all = 0xffffffffu;
    unsigned int lane = threadIdx.x & 31;
    gpu_ipc_wq_u64 started = gpu_ipc_wq_globaltimer();
    gpu_ipc_wq_u64 deadline = gpu_ipc_wq_deadline(timeout_ns);
    gpu_ipc_wq_u64 completed = 0, sum = 0, squares = 0, lost = 0, timed_out = 0, work = 0, again = 0, bad = 0;
    for (;;) {
        gpu_ipc_wq_task task = {0, 0, 0, 0, 0};
        int r = GPU_IPC_WQ_OK;
        if (lane == 0) {
            r = gpu_ipc_wq_pop_until(q, worker, &task, deadline);
        }
        r = __shfl_sync(all, r, 0);
        if (r != GPU_IPC_WQ_OK) {
            timed_out = r == GPU_IPC_WQ_TIMEOUT;
            break;
        }
        // Lane 0 acquired the task; the warp barrier orders the other lanes' reads after it.
        gpu_ipc_wq_u64 record = __shfl_sync(all, (gpu_ipc_wq_u64)task.record, 0);
        unsigned int len = __shfl_sync(all, task.len, 0);
        __syncwarp();
        const gpu_ipc_wq_u64* words = (const gpu_ipc_wq_u64*)record;
        unsigned int n = len / 8;
        gpu_ipc_wq_u64 value = n > 0 ? words[0] : 0;
        gpu_ipc_wq_u64 h = 0;
        unsigned int mismatched = 0;
        for (unsigned int i = lane; i < n; i += 32) {
            gpu_ipc_wq_u64 w = words[i];
            mismatched += w != value ? 1u : 0u;
            gpu_ipc_wq_u64 x = w ^ i;
            for (gpu_ipc_wq_u64 k = 0; k < work_rounds; ++k) {
                x = gpu_ipc_wq_demo_mix(x);
            }
            h ^= x;
        }
        for (int offset = 16; offset > 0; offset /= 2) {
            h ^= __shfl_down_sync(all, h, offset);
            mismatched += __shfl_down_sync(all, mismatched, offset);
        }
        // Every lane's reads of the record come before lane 0 gives the cell back.
        __syncwarp();
        if (lane == 0) {
            if (gpu_ipc_wq_complete(q, worker, &task) == GPU_IPC_WQ_OK) {
                ++completed;
                sum += value;
                squares += value * value;
                work ^= h;
                again += task.attempt > 0 ? 1 : 0;
                bad += mismatched != 0 ? 1 : 0;
            } else {
                ++lost;
            }
        }
    }
    if (lane == 0) {
        atomicAdd(&result[0], completed);
        atomicAdd(&result[1], sum);
        atomicAdd(&result[2], squares);
        atomicAdd(&result[3], lost);
        atomicAdd(&result[4], timed_out);
        atomicXor(&result[5], work);
        atomicAdd(&result[6], again);
        atomicAdd(&result[7], bad);
        atomicMin(&result[8], started);
        atomicMax(&result[9], gpu_ipc_wq_globaltimer());
    }
}

// Pushes `count` tasks with the values first .. first + count - 1 (grid-stride, one push per thread at a time),
// writing each record in place. Waits while the queue is full, until `timeout_ns` after the start. Adds into
// result[0] the tasks pushed, into result[1] those that could not be (deadline, closed queue, or a record size
// larger than the queue's).
extern "C" __global__ void gpu_ipc_wq_demo_producer(gpu_ipc_wq_u64* q, unsigned int worker, gpu_ipc_wq_u64 first,
                                                    gpu_ipc_wq_u64 count, unsigned int record_bytes,
                                                    gpu_ipc_wq_u64 timeout_ns, gpu_ipc_wq_u64* result)
{
    gpu_ipc_wq_u64 deadline = gpu_ipc_wq_deadline(timeout_ns);
    bool fits = record_bytes <= *GPU_IPC_WQ_U32(q, GPU_IPC_WQ_OFF_RECORD_BYTES) && record_bytes % 8 == 0;
    gpu_ipc_wq_u64 pushed = 0, failed = 0;
    gpu_ipc_wq_u64 stride = (gpu_ipc_wq_u64)gridDim.x * blockDim.x;
    for (gpu_ipc_wq_u64 i = (gpu_ipc_wq_u64)blockIdx.x * blockDim.x + threadIdx.x; i < count; i += stride) {
        gpu_ipc_wq_slot slot;
        if (!fits || gpu_ipc_wq_begin_push_until(q, worker, &slot, deadline) != GPU_IPC_WQ_OK) {
            ++failed;
            continue;
        }
        gpu_ipc_wq_u64 value = first + i;
        gpu_ipc_wq_u64* words = (gpu_ipc_wq_u64*)slot.record;
        for (unsigned int w = 0; w < record_bytes / 8; ++w) {
            words[w] = value;
        }
        if (gpu_ipc_wq_end_push(q, worker, &slot, record_bytes) == GPU_IPC_WQ_OK) {
            ++pushed;
        } else {
            ++failed;
        }
    }
    atomicAdd(&result[0], pushed);
    atomicAdd(&result[1], failed);
}
