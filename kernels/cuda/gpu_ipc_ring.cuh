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
// copy every gpu_ipc_ring*.cuh header into your build. Offsets and strides come from the descriptor, never from
// constants here (the device words' fixed layout aside), so the functions work with every control-block layout the
// Rust side describes.
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

// The device API in a file per side, each standing on gpu_ipc_ring_waits.cuh (the layout, the ordered loads and
// stores, the exit words, the bounded waits): a kernel of one side may include that side's file alone.
#include "gpu_ipc_ring_consumer.cuh"
#include "gpu_ipc_ring_producer.cuh"

// ---- Frame graphs ----------------------------------------------------------------------------------------------

// The frame graphs' per-ring state in device memory (docs/frames.md, "Frame graphs"), struct gpu_ipc_graph_frame, is
// in gpu_ipc_ring_layout.cuh (generated from ipc-core's GraphFrameState): one CUDA graph per slot is captured once,
// its kernels' arguments fixed, so the frame a graph launch is for lives there. The ring step that opens a frame
// (gpu_ipc_graph_wait_frame, gpu_ipc_graph_acquire_slot) writes `valid`; the one that closes it advances `sequence`.
// The application's kernels in the graph read `sequence` (which frame) and `valid` (0: the wait gave up or the frame
// is not the producer's; do not read or write the slot).

#endif // GPU_IPC_RING_CUH
