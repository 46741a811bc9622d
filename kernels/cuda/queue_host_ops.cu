// The work queue's operations for the CPU side of a process (ipc-core/src/queue/gpu_ops.rs): the CPU never
// touches the queue's words in device memory; it launches these one-thread kernels (the reclaim pass runs a grid)
// on a private stream, with inputs and outputs in a staging area of host memory registered for the device.
//
// Files named queue_*.cu are not part of the gpu-ipc-kernels program: scripts/gen_kernels.py compiles them as their
// own program into ipc-core/queue-kernels/, which ipc-core embeds (ipc-core cannot depend on the kernels crate).
//
// Staging entries have the shape of a cell (cell_bytes apart): word 0 is a result or a position, then the id, the
// attempt and length, and the record at byte 32.

#include "work_queue.cuh"

// Holders of a LEASED cell on its way back to the owner (ipc-core/src/queue/layout.rs): given back by its holder,
// for the owner's next sweep to take; taken over by the owner, which copies the task out and frees the cell. Never
// worker slots (those stop at 4096), so no worker's compare-and-swap matches them.
#define GPU_IPC_WQ_GIVEN_BACK 0xfffeu
#define GPU_IPC_WQ_TAKEN 0xffffu

// Copies the task in `cell` (position `position`) into a staging entry: word 0 the position, then the id, the
// attempt and length, and the record.
static __device__ void gpu_ipc_wq_copy_out(unsigned char* entry, const unsigned char* cell, gpu_ipc_wq_u64 position,
                                           unsigned int record_bytes)
{
    gpu_ipc_wq_u64 attempt_len = *(const gpu_ipc_wq_u64*)(cell + GPU_IPC_WQ_CELL_ATTEMPT);
    unsigned int len = (unsigned int)(attempt_len >> 32);
    len = len < record_bytes ? len : record_bytes;
    *(gpu_ipc_wq_u64*)entry = position;
    *(gpu_ipc_wq_u64*)(entry + GPU_IPC_WQ_CELL_ID) = *(const gpu_ipc_wq_u64*)(cell + GPU_IPC_WQ_CELL_ID);
    *(gpu_ipc_wq_u64*)(entry + GPU_IPC_WQ_CELL_ATTEMPT) = (attempt_len & 0xffffffffull) | ((gpu_ipc_wq_u64)len << 32);
    gpu_ipc_wq_copy(entry + GPU_IPC_WQ_CELL_RECORD, cell + GPU_IPC_WQ_CELL_RECORD, len);
}

// Pushes `count` entries in order, stopping at the first that does not go in. Each entry: id (~0: a new task,
// whose id is its position), attempt, len and record in; word 0 out: the result; the id out. out[0]: entries
// tried. flags: bit 0 counts the pushes in the worker's `pushed`, bit 1 passes a closed queue (redeliveries).
extern "C" __global__ void gpu_ipc_wq_host_push(gpu_ipc_wq_u64* q, unsigned int worker, unsigned int flags,
                                                unsigned char* entries, unsigned int count, gpu_ipc_wq_u64* out)
{
    if (threadIdx.x != 0 || blockIdx.x != 0) {
        return;
    }
    gpu_ipc_wq_u64 cell_bytes = *GPU_IPC_WQ_U32(q, GPU_IPC_WQ_OFF_CELL_BYTES);
    unsigned int max = *GPU_IPC_WQ_U32(q, GPU_IPC_WQ_OFF_RECORD_BYTES);
    unsigned int tried = 0;
    for (unsigned int i = 0; i < count; ++i) {
        unsigned char* entry = entries + i * cell_bytes;
        gpu_ipc_wq_u64 id = *(gpu_ipc_wq_u64*)(entry + GPU_IPC_WQ_CELL_ID);
        gpu_ipc_wq_u64 attempt_len = *(gpu_ipc_wq_u64*)(entry + GPU_IPC_WQ_CELL_ATTEMPT);
        unsigned int len = (unsigned int)(attempt_len >> 32);
        gpu_ipc_wq_u64 p = 0;
        int r = len > max ? GPU_IPC_WQ_TOO_LARGE : gpu_ipc_wq_claim(q, worker, (flags & 2) != 0, &p);
        if (r == GPU_IPC_WQ_OK) {
            id = id == ~0ull ? p : id;
            gpu_ipc_wq_write(q, p, id, (unsigned int)attempt_len, entry + GPU_IPC_WQ_CELL_RECORD, len);
            r = gpu_ipc_wq_publish(q, worker, p, (flags & 1) != 0);
        }
        *(gpu_ipc_wq_u64*)entry = (gpu_ipc_wq_u64)r;
        *(gpu_ipc_wq_u64*)(entry + GPU_IPC_WQ_CELL_ID) = id;
        ++tried;
        if (r != GPU_IPC_WQ_OK) {
            break;
        }
    }
    out[0] = tried;
}

// Pops up to `max` tasks into the entries (word 0: the position). out[0]: tasks popped; out[1]: the result that
// stopped it.
extern "C" __global__ void gpu_ipc_wq_host_pop(gpu_ipc_wq_u64* q, unsigned int worker, unsigned char* entries,
                                               unsigned int max, gpu_ipc_wq_u64* out)
{
    if (threadIdx.x != 0 || blockIdx.x != 0) {
        return;
    }
    gpu_ipc_wq_u64 cell_bytes = *GPU_IPC_WQ_U32(q, GPU_IPC_WQ_OFF_CELL_BYTES);
    unsigned int n = 0;
    int r = GPU_IPC_WQ_OK;
    while (n < max) {
        gpu_ipc_wq_task task;
        r = gpu_ipc_wq_try_pop(q, worker, &task);
        if (r != GPU_IPC_WQ_OK) {
            break;
        }
        unsigned char* entry = entries + n * cell_bytes;
        *(gpu_ipc_wq_u64*)entry = task.position;
        *(gpu_ipc_wq_u64*)(entry + GPU_IPC_WQ_CELL_ID) = task.id;
        *(gpu_ipc_wq_u64*)(entry + GPU_IPC_WQ_CELL_ATTEMPT) = (gpu_ipc_wq_u64)task.attempt | ((gpu_ipc_wq_u64)task.len << 32);
        gpu_ipc_wq_copy(entry + GPU_IPC_WQ_CELL_RECORD, task.record, task.len);
        ++n;
    }
    out[0] = n;
    out[1] = (gpu_ipc_wq_u64)r;
}

// Gives up `count` leases of `worker`, by position; out[i]: 1 where the lease was still the worker's. flags bit 0:
// count them as completed (a task done), else not (the owner freeing a cell it took back); bit 1: give them back to
// the owner instead (LEASED(L, worker) to LEASED(L, GIVEN_BACK), one compare-and-swap), for it to push again.
extern "C" __global__ void gpu_ipc_wq_host_complete(gpu_ipc_wq_u64* q, unsigned int worker, unsigned int flags,
                                                    const gpu_ipc_wq_u64* positions, unsigned int count,
                                                    gpu_ipc_wq_u64* out)
{
    if (threadIdx.x != 0 || blockIdx.x != 0) {
        return;
    }
    for (unsigned int i = 0; i < count; ++i) {
        if (flags & 2) {
            gpu_ipc_wq_u64 lap = gpu_ipc_wq_lap(q, positions[i]);
            gpu_ipc_wq_u64 leased = gpu_ipc_wq_pack(lap, GPU_IPC_WQ_STATE_LEASED, worker);
            gpu_ipc_wq_u64 back = gpu_ipc_wq_pack(lap, GPU_IPC_WQ_STATE_LEASED, GPU_IPC_WQ_GIVEN_BACK);
            out[i] = gpu_ipc_wq_cas((gpu_ipc_wq_u64*)gpu_ipc_wq_cell(q, positions[i]), leased, back) == leased ? 1 : 0;
        } else {
            out[i] = gpu_ipc_wq_release_lease(q, worker, positions[i], (flags & 1) != 0) == GPU_IPC_WQ_OK ? 1 : 0;
        }
    }
}

// The owner's pass over a gone worker's cells (grid-stride, one cell per thread): its leases become the owner's
// (up to `max`, copied into the entries; out[0] counts them, out[2] those put back for a later pass), its
// unfinished pushes become holes that pops skip (out[1], and the header's abandoned counter). `out` is in device
// memory (zeroed by the caller): the threads count there with atomics.
extern "C" __global__ void gpu_ipc_wq_host_reclaim(gpu_ipc_wq_u64* q, unsigned int owner, unsigned int dead,
                                                   unsigned char* entries, unsigned int max, gpu_ipc_wq_u64* out)
{
    gpu_ipc_wq_u64 capacity = *GPU_IPC_WQ_U64(q, GPU_IPC_WQ_OFF_CAPACITY);
    gpu_ipc_wq_u64 cells = *GPU_IPC_WQ_U64(q, GPU_IPC_WQ_OFF_CELLS);
    gpu_ipc_wq_u64 cell_bytes = *GPU_IPC_WQ_U32(q, GPU_IPC_WQ_OFF_CELL_BYTES);
    unsigned int log2 = *GPU_IPC_WQ_U32(q, GPU_IPC_WQ_OFF_CAPACITY_LOG2);
    unsigned int record_bytes = *GPU_IPC_WQ_U32(q, GPU_IPC_WQ_OFF_RECORD_BYTES);
    gpu_ipc_wq_u64 stride = (gpu_ipc_wq_u64)gridDim.x * blockDim.x;
    for (gpu_ipc_wq_u64 i = (gpu_ipc_wq_u64)blockIdx.x * blockDim.x + threadIdx.x; i < capacity; i += stride) {
        unsigned char* cell = (unsigned char*)q + cells + i * cell_bytes;
        gpu_ipc_wq_u64* state_word = (gpu_ipc_wq_u64*)cell;
        gpu_ipc_wq_u64 s = gpu_ipc_wq_load_acquire(state_word);
        unsigned int state = (unsigned int)((s >> 16) & 0xff);
        gpu_ipc_wq_u64 lap = s >> 24;
        if ((s & 0xffff) != dead) {
            continue;
        }
        if (state == GPU_IPC_WQ_STATE_LEASED) {
            gpu_ipc_wq_u64 mine = gpu_ipc_wq_pack(lap, GPU_IPC_WQ_STATE_LEASED, owner);
            if (gpu_ipc_wq_cas(state_word, s, mine) != s) {
                continue;
            }
            gpu_ipc_wq_u64 ticket = atomicAdd(&out[0], 1ull);
            if (ticket >= max) {
                gpu_ipc_wq_cas(state_word, mine, s);
                atomicAdd(&out[2], 1ull);
                continue;
            }
            gpu_ipc_wq_copy_out(entries + ticket * cell_bytes, cell, (lap << log2) | i, record_bytes);
        } else if (state == GPU_IPC_WQ_STATE_WRITING) {
            if (gpu_ipc_wq_cas(state_word, s, gpu_ipc_wq_pack(lap + 1, GPU_IPC_WQ_STATE_EMPTY, 0)) == s) {
                atomicAdd(&out[1], 1ull);
                atomicAdd(GPU_IPC_WQ_U64(q, GPU_IPC_WQ_OFF_ABANDONED), 1ull);
            }
        }
    }
}

// The owner's sweep over every cell (grid-stride, one cell per thread). Counts the cells that hold work into
// out[2] (WRITING), out[3] (FULL) and out[4] (LEASED, any holder). Takes over (LEASED(L, TAKEN)) the tasks given
// back, and those whose lease a sweep has seen unchanged for `lease_ns` (~0: never) by the %globaltimer: `seen` (2
// words per cell, device memory only the owner uses) keeps the LEASED word last seen in the cell and the time a sweep
// first saw it, so a lease runs from the first sweep that saw it and no clock is shared with the workers. Up to
// `max` are copied into the entries (out[0] counts the tickets; a ticket whose compare-and-swap lost, the holder
// having completed meanwhile, has position ~0); out[1] counts those left for the next sweep. `out` is in device
// memory, zeroed by the caller.
extern "C" __global__ void gpu_ipc_wq_host_sweep(gpu_ipc_wq_u64* q, gpu_ipc_wq_u64* seen, gpu_ipc_wq_u64 lease_ns,
                                                 unsigned char* entries, unsigned int max, gpu_ipc_wq_u64* out)
{
    gpu_ipc_wq_u64 capacity = *GPU_IPC_WQ_U64(q, GPU_IPC_WQ_OFF_CAPACITY);
    gpu_ipc_wq_u64 cells = *GPU_IPC_WQ_U64(q, GPU_IPC_WQ_OFF_CELLS);
    gpu_ipc_wq_u64 cell_bytes = *GPU_IPC_WQ_U32(q, GPU_IPC_WQ_OFF_CELL_BYTES);
    unsigned int log2 = *GPU_IPC_WQ_U32(q, GPU_IPC_WQ_OFF_CAPACITY_LOG2);
    unsigned int record_bytes = *GPU_IPC_WQ_U32(q, GPU_IPC_WQ_OFF_RECORD_BYTES);
    gpu_ipc_wq_u64 now = gpu_ipc_wq_globaltimer();
    gpu_ipc_wq_u64 stride = (gpu_ipc_wq_u64)gridDim.x * blockDim.x;
    for (gpu_ipc_wq_u64 i = (gpu_ipc_wq_u64)blockIdx.x * blockDim.x + threadIdx.x; i < capacity; i += stride) {
        unsigned char* cell = (unsigned char*)q + cells + i * cell_bytes;
        gpu_ipc_wq_u64* state_word = (gpu_ipc_wq_u64*)cell;
        gpu_ipc_wq_u64 s = gpu_ipc_wq_load_acquire(state_word);
        unsigned int state = (unsigned int)((s >> 16) & 0xff);
        unsigned int holder = (unsigned int)(s & 0xffff);
        gpu_ipc_wq_u64 lap = s >> 24;
        if (state == GPU_IPC_WQ_STATE_WRITING) {
            atomicAdd(&out[2], 1ull);
        } else if (state == GPU_IPC_WQ_STATE_FULL) {
            atomicAdd(&out[3], 1ull);
        } else if (state == GPU_IPC_WQ_STATE_LEASED) {
            atomicAdd(&out[4], 1ull);
        }
        if (state != GPU_IPC_WQ_STATE_LEASED || holder == GPU_IPC_WQ_TAKEN) {
            continue;
        }
        if (holder != GPU_IPC_WQ_GIVEN_BACK) {
            if (seen[2 * i] != s) {
                seen[2 * i] = s;
                seen[2 * i + 1] = now;
                continue;
            }
            if (lease_ns == ~0ull || now - seen[2 * i + 1] < lease_ns) {
                continue;
            }
        }
        // The ticket first, so that a task the pass has no room for is not taken (its holder may still complete it).
        gpu_ipc_wq_u64 ticket = atomicAdd(&out[0], 1ull);
        if (ticket >= max) {
            atomicAdd(&out[1], 1ull);
            continue;
        }
        unsigned char* entry = entries + ticket * cell_bytes;
        if (gpu_ipc_wq_cas(state_word, s, gpu_ipc_wq_pack(lap, GPU_IPC_WQ_STATE_LEASED, GPU_IPC_WQ_TAKEN)) != s) {
            *(gpu_ipc_wq_u64*)entry = ~0ull;
            continue;
        }
        gpu_ipc_wq_copy_out(entry, cell, (lap << log2) | i, record_bytes);
    }
}

// Adds `value` to a counter of the header.
extern "C" __global__ void gpu_ipc_wq_host_add(gpu_ipc_wq_u64* word, gpu_ipc_wq_u64 value)
{
    if (threadIdx.x == 0 && blockIdx.x == 0) {
        atomicAdd(word, value);
    }
}

// Closes the queue to pushes (bit 63 of the enqueue position).
extern "C" __global__ void gpu_ipc_wq_host_close(gpu_ipc_wq_u64* q)
{
    if (threadIdx.x == 0 && blockIdx.x == 0) {
        gpu_ipc_wq_u64 old;
        asm volatile("atom.acq_rel.sys.global.or.b64 %0, [%1], %2;"
                     : "=l"(old)
                     : "l"(GPU_IPC_WQ_U64(q, GPU_IPC_WQ_OFF_ENQUEUE)), "l"(GPU_IPC_WQ_CLOSED_BIT)
                     : "memory");
        (void)old;
    }
}
