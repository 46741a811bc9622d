// gpu-ipc cross-process semaphore: the device-side check for work queued after a stream wait (docs/semaphore.md,
// "How the work after a stream wait learns what released it").
//
//   #include "gpu_ipc_semaphore.cuh"
//   extern "C" __global__ void consume(const unsigned long long* status, unsigned long long ticket, ...)
//   {
//       if (!gpu_ipc_semaphore_released_by_post(gpu_ipc_semaphore_load(status), ticket)) {
//           return;                           // the poison released the wait: the data was never announced
//       }
//       ... use what the post announced ...
//   }
//
// `status` is either the semaphore's own `posted` word (`StreamWait::status_word()` in Rust: host memory registered
// for the device, read with ld.acquire.sys) or the 8 bytes `Semaphore::copy_status_on` copied, on the same stream,
// right after the wait; `ticket` is `StreamWait::ticket()`. The real count of posts sits in the low 62 bits of the
// word and only grows; bit 62 is the poison. A post released the wait iff the count passed the ticket.

#pragma once

// Mask of the real count in the `posted` word (`ipc_core::semaphore::COUNT_MASK`; a Rust test checks both agree).
#define GPU_IPC_SEMAPHORE_COUNT_MASK 0x3fffffffffffffffull

// Reads a status word once, with acquire ordering at system scope (the word may be host memory a CPU writes).
static __device__ __forceinline__ unsigned long long gpu_ipc_semaphore_load(const unsigned long long* word)
{
    unsigned long long value;
    asm volatile("ld.acquire.sys.global.u64 %0, [%1];" : "=l"(value) : "l"(word) : "memory");
    return value;
}

// Whether a post (not the poison) released the stream wait with `ticket`, from the status word's value.
static __device__ __forceinline__ bool gpu_ipc_semaphore_released_by_post(unsigned long long word,
                                                                          unsigned long long ticket)
{
    return (word & GPU_IPC_SEMAPHORE_COUNT_MASK) > ticket;
}
