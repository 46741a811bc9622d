// Generated from ipc-core (ipc_core::resident::cuda_header) by scripts/gen-kernels.sh: do not edit. Change the Rust
// definitions and run the script; `scripts/gen-kernels.sh --check` and a unit test fail while this file differs from
// them.
//
// The frame ring's layout as kernels see it: the control block's constants, the device words' layout, and the structs
// a kernel on the ring reads, each the mirror of a #[repr(C)] Rust struct of u64 fields. Included by gpu_ipc_ring.cuh
// (the device API); copy both files into your build.

#ifndef GPU_IPC_RING_LAYOUT_CUH
#define GPU_IPC_RING_LAYOUT_CUH

typedef unsigned long long gpu_ipc_ring_u64;

// The value a survivor ORs into a dead peer's counters (ipc_core::ring::POISON): above every sequence, so it
// satisfies every wait.
#define GPU_IPC_RING_POISON (1ull << 62)
// The bits of a `published` word that hold the frame (s + 1): the stamp rule compares them
// (ipc_core::resident::STAMP_MASK).
#define GPU_IPC_RING_STAMP_MASK 0x3fffffffffffffffull
// Most slots a ring can have (ipc_core::ring::layout::MAX_SLOTS).
#define GPU_IPC_RING_MAX_SLOTS 256ull
// Most consumers that can be attached at once (ipc_core::ring::layout::MAX_CONSUMERS).
#define GPU_IPC_RING_MAX_CONSUMERS 16ull
// The device words' layout (ipc_core::resident::device_words): published[i] at 8 i, consumer c's released[i] at
// GPU_IPC_RING_DEVICE_RELEASED + c GPU_IPC_RING_DEVICE_RECORD + 8 i, in GPU_IPC_RING_DEVICE_BYTES bytes.
#define GPU_IPC_RING_DEVICE_RELEASED 2048ull
#define GPU_IPC_RING_DEVICE_RECORD 2048ull
#define GPU_IPC_RING_DEVICE_BYTES 34816ull
// A consumer record's state word is (epoch << 8) | state (ipc_core::ring::layout::ConsumerState).
#define GPU_IPC_RING_STATE_MASK 0xffull
#define GPU_IPC_RING_STATE_FREE 0ull
#define GPU_IPC_RING_STATE_JOINING 1ull
#define GPU_IPC_RING_STATE_LIVE 2ull
#define GPU_IPC_RING_STATE_DETACHED 3ull
#define GPU_IPC_RING_STATE_DEAD 4ull
// The versions of the descriptors (their VERSION in Rust), in their `version` field.
#define GPU_IPC_RING_DESCRIPTOR_VERSION 3ull
#define GPU_IPC_RING_PRODUCER_DESCRIPTOR_VERSION 3ull

// gpu_ipc_ring_exit mirrors ipc_core::resident's ExitWords (the first words of a side's port).
struct gpu_ipc_ring_exit {
    // Non-zero: leave now (the host raises it at teardown and when its watchdog sees the peer die; a ring step that
    // gives up raises it too, so the steps queued behind it leave).
    gpu_ipc_ring_u64 abort;
    // Moved forward by this process's heartbeat thread every 10 ms while the process lives.
    gpu_ipc_ring_u64 heartbeat;
    // 0: no lease. Else nanoseconds of %globaltimer: a kernel that sees `heartbeat` stand still that long takes its
    // process for gone and leaves (GPU_IPC_RING_ORPHANED).
    gpu_ipc_ring_u64 lease_ns;
    // Device address of the word the survivor raises in the control block when it sees this side's process gone (the
    // producer's or this consumer's kernel abort word); 0: none. Non-zero there: leave now.
    gpu_ipc_ring_u64 peer_abort;
};

// gpu_ipc_ring_descriptor mirrors ipc_core::resident::RingDescriptor (Consumer::launch_on_ring).
struct gpu_ipc_ring_descriptor {
    // `RingDescriptor::VERSION`.
    gpu_ipc_ring_u64 version;
    // Device address of the control block (host memory registered for the device).
    gpu_ipc_ring_u64 control;
    // Byte offset of `published[0]` in the control block.
    gpu_ipc_ring_u64 published_offset;
    // Bytes from `published[i]` to `published[i + 1]`.
    gpu_ipc_ring_u64 published_stride;
    // Byte offset of this consumer's `released[0]`.
    gpu_ipc_ring_u64 released_offset;
    // Bytes from its `released[i]` to `released[i + 1]`.
    gpu_ipc_ring_u64 released_stride;
    // Device address of slot 0's frame, in this process's mapping.
    gpu_ipc_ring_u64 slots;
    // Bytes from one slot to the next.
    gpu_ipc_ring_u64 slot_stride;
    // Bytes of a frame.
    gpu_ipc_ring_u64 slot_bytes;
    // Slots in the ring.
    gpu_ipc_ring_u64 slot_count;
    // This consumer's record index.
    gpu_ipc_ring_u64 consumer_index;
    // The first frame the kernel is to read: the consumer's next sequence when it launched the kernel.
    gpu_ipc_ring_u64 first_sequence;
    // Device address of the exit words (`struct gpu_ipc_ring_exit`), the abort word first: non-zero tells the kernel
    // to leave (the host sets it when the producer dies or the consumer is dropped); then the kernel lease's
    // heartbeat and the survivor's abort word (`ipc_core::resident::KernelLease`).
    gpu_ipc_ring_u64 abort;
    // Device address of the progress word: the first frame the kernel has not released (it stores it).
    gpu_ipc_ring_u64 progress;
    // Device address of the ring's device words (`ipc_core::resident::device_words`) in this process's mapping, 0
    // when the ring has none.
    gpu_ipc_ring_u64 device_words;
};

// gpu_ipc_ring_producer_descriptor mirrors ipc_core::resident::ProducerRingDescriptor (Producer::launch_on_ring).
struct gpu_ipc_ring_producer_descriptor {
    // `ProducerRingDescriptor::VERSION`.
    gpu_ipc_ring_u64 version;
    // Device address of the control block (host memory registered for the device).
    gpu_ipc_ring_u64 control;
    // Byte offset of `published[0]` in the control block.
    gpu_ipc_ring_u64 published_offset;
    // Bytes from `published[i]` to `published[i + 1]`.
    gpu_ipc_ring_u64 published_stride;
    // Byte offset of `next_sequence` (the first frame not yet published).
    gpu_ipc_ring_u64 next_sequence_offset;
    // Byte offset of consumer record 0 (its state word).
    gpu_ipc_ring_u64 records_offset;
    // Bytes from one consumer record to the next.
    gpu_ipc_ring_u64 record_stride;
    // Bytes from a record's state word to its join sequence.
    gpu_ipc_ring_u64 join_offset;
    // Bytes from a record's state word to its `released[0]`.
    gpu_ipc_ring_u64 released_offset;
    // Bytes from a record's `released[i]` to `released[i + 1]`.
    gpu_ipc_ring_u64 released_stride;
    // Consumer records in use (the ring's max consumers).
    gpu_ipc_ring_u64 consumer_records;
    // Device address of slot 0's frame.
    gpu_ipc_ring_u64 slots;
    // Bytes from one slot to the next.
    gpu_ipc_ring_u64 slot_stride;
    // Bytes of a frame.
    gpu_ipc_ring_u64 slot_bytes;
    // Slots in the ring.
    gpu_ipc_ring_u64 slot_count;
    // The first frame the kernel is to publish: the producer's next sequence when it launched the kernel.
    gpu_ipc_ring_u64 first_sequence;
    // Device address of the exit words (`struct gpu_ipc_ring_exit`), the abort word first: non-zero tells the kernel
    // to leave (the host sets it when the producer is dropped); then the kernel lease's heartbeat and the survivor's
    // abort word (`ipc_core::resident::KernelLease`).
    gpu_ipc_ring_u64 abort;
    // Device address of the progress word: the first frame the kernel has not published (it stores it).
    gpu_ipc_ring_u64 progress;
    // Device address of the ring's device words (`ipc_core::resident::device_words`), 0 when the ring has none.
    gpu_ipc_ring_u64 device_words;
};

// gpu_ipc_graph_frame mirrors ipc_core::resident's GraphFrameState (frame graphs).
struct gpu_ipc_graph_frame {
    // The frame the graph launched now is for.
    gpu_ipc_ring_u64 sequence;
    // 1 when the slot may be used; 0: the wait gave up or the frame is not the producer's: do not read or write the
    // slot.
    gpu_ipc_ring_u64 valid;
    // Frames whose wait gave up or whose stamp was not the producer's (consumer side).
    gpu_ipc_ring_u64 skipped;
    // Always 0: what a stream-op wait that must hold at once waits on (0 >= 0).
    gpu_ipc_ring_u64 reserved;
};

#endif // GPU_IPC_RING_LAYOUT_CUH
