//! The frame graphs' frame state in device memory ([`GraphFrameState`]): which frame a slot's graph launched now
//! is for, whether its slot may be used, and the word a wait that must hold at once waits on. Both the graphs
//! (`graph.rs`) and their waits (`graph_waits.rs`) stand on it; the CUDA struct is generated from it
//! (`cuda_header.rs`).

device_struct! {
    /// The frame graphs' per-ring state in device memory: one CUDA graph per slot is captured once, its kernels'
    /// arguments fixed, so the frame a graph launch is for lives here. The ring step that opens a frame
    /// (gpu_ipc_graph_wait_frame, gpu_ipc_graph_acquire_slot) writes `valid`; the one that closes it advances
    /// `sequence`. The application's kernels in the graph read `sequence` (which frame) and `valid`. The mirror of
    /// `struct gpu_ipc_graph_frame`, which `kernels/cuda/gpu_ipc_ring_layout.cuh` defines from this struct.
    pub(super) struct GraphFrameState => "gpu_ipc_graph_frame" {
        /// The frame the graph launched now is for.
        pub sequence,
        /// 1 when the slot may be used; 0: the wait gave up or the frame is not the producer's: do not read or write
        /// the slot.
        pub valid,
        /// Frames whose wait gave up or whose stamp was not the producer's (consumer side).
        pub skipped,
        /// Always 0: what a stream-op wait that must hold at once waits on (0 >= 0).
        pub reserved,
    }
}

/// Bytes of the frame state.
pub(super) const STATE_BYTES: u64 = size_of::<GraphFrameState>() as u64;

/// Byte offset, in the frame state, of the word a wait that must hold at once is set on (`reserved`, always 0).
pub(super) const ALWAYS_MET_OFFSET: u64 = std::mem::offset_of!(GraphFrameState, reserved) as u64;
