// gpu-ipc work queue: device functions for kernels that push and pop tasks (docs/work-queue.md).
//
//   #include "work_queue.cuh"
//   extern "C" __global__ void my_worker(unsigned long long* queue, unsigned int worker, ...)
//   {
//       gpu_ipc_wq_task task;
//       while (gpu_ipc_wq_pop_until(queue, worker, &task, gpu_ipc_wq_deadline(1000000000ull)) == GPU_IPC_WQ_OK) {
//           ... read task.record (task.len bytes, in the queue's memory, 16-byte aligned) ...
//           gpu_ipc_wq_complete(queue, worker, &task);
//       }
//   }
//
// `queue` is the start of the queue's allocation as this process maps it and `worker` this process's worker slot:
// both from `QueueWorker::device_queue()` (Rust), or the owner's `WorkQueue::device_queue()`. Every function acts
// for one thread; any number of threads, blocks and processes may call them at once. A popped task is leased to
// `worker` until completed: if the process dies first, the queue's owner takes the task back and hands it out
// again (its `attempt` then counts the earlier deliveries). The state machine is the one ipc-core's host code runs
// (ipc-core/src/queue/host_ops.rs); the byte offsets below are checked against ipc-core/src/queue/layout.rs by a
// unit test. No runtime headers: NVRTC and nvcc compile it alike.
//
// Memory ordering follows the rule `gpu-ipc probe coherency` established (docs/kernels.md): every read of a word
// another process writes is ld.acquire.sys, every change of state a system-scope compare-and-swap with
// acquire-release semantics, so the record written before a publish is seen by whoever acquires the published
// state, in any process. The words live in device memory: all their atomics are done by the GPU.

#ifndef GPU_IPC_WORK_QUEUE_CUH
#define GPU_IPC_WORK_QUEUE_CUH

typedef unsigned long long gpu_ipc_wq_u64;

// Header: byte offsets.
#define GPU_IPC_WQ_MAGIC 0x5157435049555047ull
#define GPU_IPC_WQ_OFF_RECORD_BYTES 12
#define GPU_IPC_WQ_OFF_CAPACITY 16
#define GPU_IPC_WQ_OFF_CELL_BYTES 24
#define GPU_IPC_WQ_OFF_CELLS 32
#define GPU_IPC_WQ_OFF_WORKERS 40
#define GPU_IPC_WQ_OFF_CAPACITY_LOG2 56
#define GPU_IPC_WQ_OFF_ABANDONED 80
#define GPU_IPC_WQ_OFF_RECLAIMING 88
#define GPU_IPC_WQ_OFF_ENQUEUE 128
#define GPU_IPC_WQ_OFF_DEQUEUE 256
// Worker table: one entry per worker slot, counters at these offsets.
#define GPU_IPC_WQ_WORKER_ENTRY_BYTES 64
#define GPU_IPC_WQ_W_PUSHED 0
#define GPU_IPC_WQ_W_POPPED 8
#define GPU_IPC_WQ_W_COMPLETED 16
// Cell: state word at 0, then these.
#define GPU_IPC_WQ_CELL_ID 8
#define GPU_IPC_WQ_CELL_ATTEMPT 16
#define GPU_IPC_WQ_CELL_LEN 20
#define GPU_IPC_WQ_CELL_RECORD 32
// Bit 63 of the enqueue position: closed to pushes.
#define GPU_IPC_WQ_CLOSED_BIT 0x8000000000000000ull
// State word: lap << 24 | state << 16 | holder.
#define GPU_IPC_WQ_LAP_MASK 0xffffffffffull
#define GPU_IPC_WQ_STATE_EMPTY 0
#define GPU_IPC_WQ_STATE_WRITING 1
#define GPU_IPC_WQ_STATE_FULL 2
#define GPU_IPC_WQ_STATE_LEASED 3
#define GPU_IPC_WQ_STATE_SEALED 4

// Results.
#define GPU_IPC_WQ_OK 0
#define GPU_IPC_WQ_EMPTY 1
#define GPU_IPC_WQ_FULL 2
#define GPU_IPC_WQ_CLOSED 3
#define GPU_IPC_WQ_CONTENDED 4
#define GPU_IPC_WQ_LEASE_LOST 5
#define GPU_IPC_WQ_TIMEOUT 6
#define GPU_IPC_WQ_TOO_LARGE 7

// Attempts of one operation against other threads' moves before it returns GPU_IPC_WQ_CONTENDED.
#define GPU_IPC_WQ_MAX_TRIES 256u

// A popped task: valid until completed. `record` points into the queue's memory (16-byte aligned).
struct gpu_ipc_wq_task {
    gpu_ipc_wq_u64 position;
    gpu_ipc_wq_u64 id;
    unsigned int attempt;
    unsigned int len;
    const unsigned char* record;
};

// A cell claimed for a push that writes its record in place (gpu_ipc_wq_begin_push / gpu_ipc_wq_end_push).
struct gpu_ipc_wq_slot {
    gpu_ipc_wq_u64 position;
    unsigned char* record;
};

#define GPU_IPC_WQ_U64(q, off) ((gpu_ipc_wq_u64*)((unsigned char*)(q) + (off)))
#define GPU_IPC_WQ_U32(q, off) ((unsigned int*)((unsigned char*)(q) + (off)))

static __device__ __forceinline__ gpu_ipc_wq_u64 gpu_ipc_wq_globaltimer()
{
    gpu_ipc_wq_u64 t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

// The %globaltimer value `ns` nanoseconds from now (saturating), for the *_until functions.
static __device__ __forceinline__ gpu_ipc_wq_u64 gpu_ipc_wq_deadline(gpu_ipc_wq_u64 ns)
{
    gpu_ipc_wq_u64 now = gpu_ipc_wq_globaltimer();
    return now + ns < now ? ~0ull : now + ns;
}

static __device__ __forceinline__ gpu_ipc_wq_u64 gpu_ipc_wq_load_acquire(const gpu_ipc_wq_u64* p)
{
    gpu_ipc_wq_u64 v;
    asm volatile("ld.acquire.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
    return v;
}

// Compare-and-swap with acquire-release semantics at system scope; returns the value found.
static __device__ __forceinline__ gpu_ipc_wq_u64 gpu_ipc_wq_cas(gpu_ipc_wq_u64* p, gpu_ipc_wq_u64 expected,
                                                                 gpu_ipc_wq_u64 desired)
{
    gpu_ipc_wq_u64 old;
    asm volatile("atom.acq_rel.sys.global.cas.b64 %0, [%1], %2, %3;"
                 : "=l"(old)
                 : "l"(p), "l"(expected), "l"(desired)
                 : "memory");
    return old;
}

static __device__ __forceinline__ gpu_ipc_wq_u64 gpu_ipc_wq_pack(gpu_ipc_wq_u64 lap, unsigned int state,
                                                                  unsigned int holder)
{
    return ((lap & GPU_IPC_WQ_LAP_MASK) << 24) | ((gpu_ipc_wq_u64)state << 16) | (gpu_ipc_wq_u64)(holder & 0xffffu);
}

// How far lap `a` is from lap `b`, signed, in 40-bit wrapping arithmetic.
static __device__ __forceinline__ long long gpu_ipc_wq_lap_delta(gpu_ipc_wq_u64 a, gpu_ipc_wq_u64 b)
{
    gpu_ipc_wq_u64 d = (a - b) & GPU_IPC_WQ_LAP_MASK;
    return ((long long)(d << 24)) >> 24;
}

static __device__ __forceinline__ gpu_ipc_wq_u64 gpu_ipc_wq_lap(const gpu_ipc_wq_u64* q, gpu_ipc_wq_u64 position)
{
    return (position >> *GPU_IPC_WQ_U32(q, GPU_IPC_WQ_OFF_CAPACITY_LOG2)) & GPU_IPC_WQ_LAP_MASK;
}

static __device__ __forceinline__ unsigned char* gpu_ipc_wq_cell(gpu_ipc_wq_u64* q, gpu_ipc_wq_u64 position)
{
    gpu_ipc_wq_u64 capacity = *GPU_IPC_WQ_U64(q, GPU_IPC_WQ_OFF_CAPACITY);
    gpu_ipc_wq_u64 cells = *GPU_IPC_WQ_U64(q, GPU_IPC_WQ_OFF_CELLS);
    gpu_ipc_wq_u64 cell_bytes = *GPU_IPC_WQ_U32(q, GPU_IPC_WQ_OFF_CELL_BYTES);
    return (unsigned char*)q + cells + (position & (capacity - 1)) * cell_bytes;
}

static __device__ __forceinline__ void gpu_ipc_wq_count(gpu_ipc_wq_u64* q, unsigned int worker, unsigned int counter)
{
    gpu_ipc_wq_u64 table = *GPU_IPC_WQ_U64(q, GPU_IPC_WQ_OFF_WORKERS);
    atomicAdd(GPU_IPC_WQ_U64(q, table + (gpu_ipc_wq_u64)worker * GPU_IPC_WQ_WORKER_ENTRY_BYTES + counter), 1ull);
}

// Copies `len` bytes, 8 at a time where both ends allow it.
static __device__ __forceinline__ void gpu_ipc_wq_copy(unsigned char* dst, const unsigned char* src, unsigned int len)
{
    unsigned int i = 0;
    if ((((gpu_ipc_wq_u64)dst | (gpu_ipc_wq_u64)src) & 7) == 0) {
        for (; i + 8 <= len; i += 8) {
            *(gpu_ipc_wq_u64*)(dst + i) = *(const gpu_ipc_wq_u64*)(src + i);
        }
    }
    for (; i < len; ++i) {
        dst[i] = src[i];
    }
}

// Claims the cell of the next push position for `worker` (state WRITING). `force` passes a closed queue (the
// owner's redeliveries) up to the sealed cell.
static __device__ int gpu_ipc_wq_claim(gpu_ipc_wq_u64* q, unsigned int worker, int force, gpu_ipc_wq_u64* position)
{
    gpu_ipc_wq_u64* enqueue = GPU_IPC_WQ_U64(q, GPU_IPC_WQ_OFF_ENQUEUE);
    for (unsigned int tries = 0; tries < GPU_IPC_WQ_MAX_TRIES; ++tries) {
        gpu_ipc_wq_u64 e = gpu_ipc_wq_load_acquire(enqueue);
        gpu_ipc_wq_u64 closed = e & GPU_IPC_WQ_CLOSED_BIT;
        gpu_ipc_wq_u64 p = e & ~GPU_IPC_WQ_CLOSED_BIT;
        if (closed != 0 && !force) {
            return GPU_IPC_WQ_CLOSED;
        }
        gpu_ipc_wq_u64 lap = gpu_ipc_wq_lap(q, p);
        gpu_ipc_wq_u64* state_word = (gpu_ipc_wq_u64*)gpu_ipc_wq_cell(q, p);
        gpu_ipc_wq_u64 s = gpu_ipc_wq_load_acquire(state_word);
        long long d = gpu_ipc_wq_lap_delta(s >> 24, lap);
        unsigned int state = (unsigned int)((s >> 16) & 0xff);
        if (d == 0 && state == GPU_IPC_WQ_STATE_EMPTY) {
            if (gpu_ipc_wq_cas(state_word, s, gpu_ipc_wq_pack(lap, GPU_IPC_WQ_STATE_WRITING, worker)) == s) {
                gpu_ipc_wq_cas(enqueue, e, (p + 1) | closed);
                *position = p;
                return GPU_IPC_WQ_OK;
            }
        } else if (d >= 0 && state == GPU_IPC_WQ_STATE_SEALED) {
            return GPU_IPC_WQ_CLOSED;
        } else if (d >= 0) {
            // Position p was claimed by another push (or is long done): help the enqueue position past it.
            gpu_ipc_wq_cas(enqueue, e, (p + 1) | closed);
        } else if (d == -1 && state != GPU_IPC_WQ_STATE_EMPTY && state <= GPU_IPC_WQ_STATE_SEALED) {
            // The previous lap's task still occupies the cell.
            return GPU_IPC_WQ_FULL;
        }
    }
    return GPU_IPC_WQ_CONTENDED;
}

// Publishes the claimed cell of `position` (WRITING -> FULL). GPU_IPC_WQ_LEASE_LOST when the owner had taken the
// cell back (it declared this worker gone).
static __device__ int gpu_ipc_wq_publish(gpu_ipc_wq_u64* q, unsigned int worker, gpu_ipc_wq_u64 position, int count)
{
    gpu_ipc_wq_u64 lap = gpu_ipc_wq_lap(q, position);
    gpu_ipc_wq_u64 writing = gpu_ipc_wq_pack(lap, GPU_IPC_WQ_STATE_WRITING, worker);
    gpu_ipc_wq_u64* state_word = (gpu_ipc_wq_u64*)gpu_ipc_wq_cell(q, position);
    if (gpu_ipc_wq_cas(state_word, writing, gpu_ipc_wq_pack(lap, GPU_IPC_WQ_STATE_FULL, 0)) != writing) {
        return GPU_IPC_WQ_LEASE_LOST;
    }
    if (count) {
        gpu_ipc_wq_count(q, worker, GPU_IPC_WQ_W_PUSHED);
    }
    return GPU_IPC_WQ_OK;
}

// Writes a claimed cell's id, attempt, length and record.
static __device__ void gpu_ipc_wq_write(gpu_ipc_wq_u64* q, gpu_ipc_wq_u64 position, gpu_ipc_wq_u64 id,
                                        unsigned int attempt, const unsigned char* record, unsigned int len)
{
    unsigned char* cell = gpu_ipc_wq_cell(q, position);
    *(gpu_ipc_wq_u64*)(cell + GPU_IPC_WQ_CELL_ID) = id;
    *(gpu_ipc_wq_u64*)(cell + GPU_IPC_WQ_CELL_ATTEMPT) = (gpu_ipc_wq_u64)attempt | ((gpu_ipc_wq_u64)len << 32);
    gpu_ipc_wq_copy(cell + GPU_IPC_WQ_CELL_RECORD, record, len);
}

// Pushes `len` bytes of `record` as a new task, once: GPU_IPC_WQ_OK (its id in *id when `id` is not null),
// GPU_IPC_WQ_FULL, GPU_IPC_WQ_CLOSED, GPU_IPC_WQ_CONTENDED, GPU_IPC_WQ_TOO_LARGE or GPU_IPC_WQ_LEASE_LOST.
static __device__ int gpu_ipc_wq_try_push(gpu_ipc_wq_u64* q, unsigned int worker, const void* record,
                                          unsigned int len, gpu_ipc_wq_u64* id)
{
    if (len > *GPU_IPC_WQ_U32(q, GPU_IPC_WQ_OFF_RECORD_BYTES)) {
        return GPU_IPC_WQ_TOO_LARGE;
    }
    gpu_ipc_wq_u64 p;
    int r = gpu_ipc_wq_claim(q, worker, 0, &p);
    if (r != GPU_IPC_WQ_OK) {
        return r;
    }
    gpu_ipc_wq_write(q, p, p, 0, (const unsigned char*)record, len);
    if (id) {
        *id = p;
    }
    return gpu_ipc_wq_publish(q, worker, p, 1);
}

// First half of a push that writes the record in place: claims a cell and points slot->record at its record
// (the queue's record size in bytes, 16-byte aligned). Finish with gpu_ipc_wq_end_push.
static __device__ int gpu_ipc_wq_begin_push(gpu_ipc_wq_u64* q, unsigned int worker, gpu_ipc_wq_slot* slot)
{
    gpu_ipc_wq_u64 p;
    int r = gpu_ipc_wq_claim(q, worker, 0, &p);
    if (r == GPU_IPC_WQ_OK) {
        slot->position = p;
        slot->record = gpu_ipc_wq_cell(q, p) + GPU_IPC_WQ_CELL_RECORD;
    }
    return r;
}

// Publishes a cell claimed by gpu_ipc_wq_begin_push as a task of `len` bytes (its id is slot->position).
static __device__ int gpu_ipc_wq_end_push(gpu_ipc_wq_u64* q, unsigned int worker, const gpu_ipc_wq_slot* slot,
                                          unsigned int len)
{
    unsigned int max = *GPU_IPC_WQ_U32(q, GPU_IPC_WQ_OFF_RECORD_BYTES);
    unsigned char* cell = gpu_ipc_wq_cell(q, slot->position);
    *(gpu_ipc_wq_u64*)(cell + GPU_IPC_WQ_CELL_ID) = slot->position;
    *(gpu_ipc_wq_u64*)(cell + GPU_IPC_WQ_CELL_ATTEMPT) = (gpu_ipc_wq_u64)(len < max ? len : max) << 32;
    return gpu_ipc_wq_publish(q, worker, slot->position, 1);
}

// Pops one task, once: GPU_IPC_WQ_OK (the task leased to `worker`), GPU_IPC_WQ_EMPTY, GPU_IPC_WQ_CLOSED (closed
// and drained) or GPU_IPC_WQ_CONTENDED.
static __device__ int gpu_ipc_wq_try_pop(gpu_ipc_wq_u64* q, unsigned int worker, gpu_ipc_wq_task* task)
{
    gpu_ipc_wq_u64* dequeue = GPU_IPC_WQ_U64(q, GPU_IPC_WQ_OFF_DEQUEUE);
    for (unsigned int tries = 0; tries < GPU_IPC_WQ_MAX_TRIES; ++tries) {
        gpu_ipc_wq_u64 p = gpu_ipc_wq_load_acquire(dequeue);
        gpu_ipc_wq_u64 lap = gpu_ipc_wq_lap(q, p);
        unsigned char* cell = gpu_ipc_wq_cell(q, p);
        gpu_ipc_wq_u64* state_word = (gpu_ipc_wq_u64*)cell;
        gpu_ipc_wq_u64 s = gpu_ipc_wq_load_acquire(state_word);
        long long d = gpu_ipc_wq_lap_delta(s >> 24, lap);
        unsigned int state = (unsigned int)((s >> 16) & 0xff);
        if (d == 0 && state == GPU_IPC_WQ_STATE_FULL) {
            if (gpu_ipc_wq_cas(state_word, s, gpu_ipc_wq_pack(lap, GPU_IPC_WQ_STATE_LEASED, worker)) == s) {
                gpu_ipc_wq_cas(dequeue, p, p + 1);
                gpu_ipc_wq_u64 attempt_len = *(const gpu_ipc_wq_u64*)(cell + GPU_IPC_WQ_CELL_ATTEMPT);
                unsigned int len = (unsigned int)(attempt_len >> 32);
                unsigned int max = *GPU_IPC_WQ_U32(q, GPU_IPC_WQ_OFF_RECORD_BYTES);
                task->position = p;
                task->id = *(const gpu_ipc_wq_u64*)(cell + GPU_IPC_WQ_CELL_ID);
                task->attempt = (unsigned int)attempt_len;
                task->len = len < max ? len : max;
                task->record = cell + GPU_IPC_WQ_CELL_RECORD;
                gpu_ipc_wq_count(q, worker, GPU_IPC_WQ_W_POPPED);
                return GPU_IPC_WQ_OK;
            }
        } else if (d == 0 && state == GPU_IPC_WQ_STATE_SEALED) {
            return GPU_IPC_WQ_CLOSED;
        } else if (d == 0 && state == GPU_IPC_WQ_STATE_WRITING) {
            return GPU_IPC_WQ_EMPTY;
        } else if (d == 0 && state == GPU_IPC_WQ_STATE_EMPTY) {
            gpu_ipc_wq_u64 e = gpu_ipc_wq_load_acquire(GPU_IPC_WQ_U64(q, GPU_IPC_WQ_OFF_ENQUEUE));
            if ((e & GPU_IPC_WQ_CLOSED_BIT) == 0) {
                return GPU_IPC_WQ_EMPTY;
            }
            // Tasks taken back from a gone worker may still come: not drained yet.
            if (gpu_ipc_wq_load_acquire(GPU_IPC_WQ_U64(q, GPU_IPC_WQ_OFF_RECLAIMING)) != 0) {
                return GPU_IPC_WQ_EMPTY;
            }
            // Closed, and nothing was pushed at p: seal the cell, so that no late push lands where nobody pops.
            if ((e & ~GPU_IPC_WQ_CLOSED_BIT) <= p &&
                gpu_ipc_wq_cas(state_word, s, gpu_ipc_wq_pack(lap, GPU_IPC_WQ_STATE_SEALED, 0)) == s) {
                return GPU_IPC_WQ_CLOSED;
            }
        } else if (d >= 1 || (d == 0 && state == GPU_IPC_WQ_STATE_LEASED)) {
            // Position p was popped (or its push abandoned): help the dequeue position past it.
            gpu_ipc_wq_cas(dequeue, p, p + 1);
        } else if (d == -1) {
            // The previous lap's task still occupies the cell: nothing was pushed at p yet.
            return GPU_IPC_WQ_EMPTY;
        }
    }
    return GPU_IPC_WQ_CONTENDED;
}

// Gives up a lease held by `worker` on the cell of `position` (LEASED -> EMPTY of the next lap).
static __device__ int gpu_ipc_wq_release_lease(gpu_ipc_wq_u64* q, unsigned int worker, gpu_ipc_wq_u64 position,
                                               int count)
{
    gpu_ipc_wq_u64 lap = gpu_ipc_wq_lap(q, position);
    gpu_ipc_wq_u64 leased = gpu_ipc_wq_pack(lap, GPU_IPC_WQ_STATE_LEASED, worker);
    gpu_ipc_wq_u64* state_word = (gpu_ipc_wq_u64*)gpu_ipc_wq_cell(q, position);
    if (gpu_ipc_wq_cas(state_word, leased, gpu_ipc_wq_pack(lap + 1, GPU_IPC_WQ_STATE_EMPTY, 0)) != leased) {
        return GPU_IPC_WQ_LEASE_LOST;
    }
    if (count) {
        gpu_ipc_wq_count(q, worker, GPU_IPC_WQ_W_COMPLETED);
    }
    return GPU_IPC_WQ_OK;
}

// Marks a popped task done: GPU_IPC_WQ_OK, or GPU_IPC_WQ_LEASE_LOST when the owner had taken it back (it
// declared this worker gone and handed the task to another): then do not report its result.
static __device__ int gpu_ipc_wq_complete(gpu_ipc_wq_u64* q, unsigned int worker, const gpu_ipc_wq_task* task)
{
    return gpu_ipc_wq_release_lease(q, worker, task->position, 1);
}

// Pops, retrying with growing naps (__nanosleep, up to 4 us) while the queue is empty or contended, until a task
// (GPU_IPC_WQ_OK), the queue is closed and drained (GPU_IPC_WQ_CLOSED), or %globaltimer reaches `deadline`
// (GPU_IPC_WQ_TIMEOUT; see gpu_ipc_wq_deadline).
static __device__ int gpu_ipc_wq_pop_until(gpu_ipc_wq_u64* q, unsigned int worker, gpu_ipc_wq_task* task,
                                           gpu_ipc_wq_u64 deadline)
{
    unsigned int nap = 32;
    for (;;) {
        int r = gpu_ipc_wq_try_pop(q, worker, task);
        if (r != GPU_IPC_WQ_EMPTY && r != GPU_IPC_WQ_CONTENDED) {
            return r;
        }
        if (gpu_ipc_wq_globaltimer() >= deadline) {
            return GPU_IPC_WQ_TIMEOUT;
        }
        __nanosleep(nap);
        nap = nap < 4096 ? nap * 2 : nap;
    }
}

// As gpu_ipc_wq_begin_push, retrying while the queue is full or contended until `deadline` (GPU_IPC_WQ_TIMEOUT).
static __device__ int gpu_ipc_wq_begin_push_until(gpu_ipc_wq_u64* q, unsigned int worker, gpu_ipc_wq_slot* slot,
                                                  gpu_ipc_wq_u64 deadline)
{
    unsigned int nap = 32;
    for (;;) {
        int r = gpu_ipc_wq_begin_push(q, worker, slot);
        if (r != GPU_IPC_WQ_FULL && r != GPU_IPC_WQ_CONTENDED) {
            return r;
        }
        if (gpu_ipc_wq_globaltimer() >= deadline) {
            return GPU_IPC_WQ_TIMEOUT;
        }
        __nanosleep(nap);
        nap = nap < 4096 ? nap * 2 : nap;
    }
}

#endif // GPU_IPC_WORK_QUEUE_CUH
