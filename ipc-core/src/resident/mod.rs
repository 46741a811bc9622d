//! The GPU-resident path: work that runs on the ring from the GPU with no CPU call per frame. Kernels launched on
//! the ring ([`crate::frames::Producer::launch_on_ring`], [`crate::frames::Consumer::launch_on_ring`]: a persistent
//! kernel that waits for, writes or reads, and publishes or releases frame after frame), frame graphs (one CUDA graph
//! per slot, one `cuGraphLaunch` per frame: `capture_frame_graphs`, `launch_frame_graph`), and what they stand on:
//!
//! - the descriptors a kernel gets as its first argument ([`RingDescriptor`], [`ProducerRingDescriptor`]), built from
//!   the control block's layout (`crate::ring::layout`) and mirrored by the device API of
//!   `kernels/cuda/gpu_ipc_ring.cuh`, whose constants and structs are generated from this module
//!   ([`cuda_header`], `scripts/gen-kernels.sh`);
//! - the ring's device words ([`device_words`]): a copy of the counters in device memory, which kernels poll;
//! - the port of a side's kernels (`ring_port.rs`): its abort word, its progress word, its descriptor, and its
//!   **kernel lease** ([`KernelLease`]): a word this process's heartbeat thread moves forward, so that a kernel whose
//!   process is gone (killed, crashed) leaves by itself within the lease instead of spinning under MPS until the
//!   server tears it down (which faults the server's other clients: docs/frames.md, "Kills under MPS");
//! - the run-ahead bound (`run_ahead.rs`): how far the CPU may queue GPU-side work ahead of the stream (the
//!   `gpu-stream-ops` and `gpu-poll` strategies, and frame graphs);
//! - the ring's own kernel images (`ring_kernels.rs`), loaded by frame graphs and the `gpu-poll` strategy.
//!
//! Layer: it stands on the frame ring (`crate::frames`: the producer and consumer it adds methods to, their errors),
//! the control block (`crate::ring`), shared memory (`crate::shm`) and the driver layer (`gpu_ipc_driver`). The
//! host-driven ring in `crate::frames` uses only what this module exports: a side's `ResidentSide` (abort word,
//! port, lease), the run-ahead bound its GPU-side strategies queue with, the device words' placement, and the
//! ring's kernel images; `frames` re-exports the public items under their old paths (`ipc_core::frames::...`).

/// Defines a `#[repr(C)]` struct of `u64` fields that kernels read (a descriptor, the port's exit words, the frame
/// graphs' frame state), its size in words, `to_words` (the fields in order) and its [`cuda_header::DeviceStruct`]
/// description: the CUDA struct's name and each field's name and doc lines, from which [`cuda_header`] writes the
/// CUDA struct, so the two cannot differ.
macro_rules! device_struct {
    (
        $(#[$meta:meta])*
        $vis:vis struct $name:ident => $c_name:literal {
            $( $(#[doc = $doc:literal])+ pub $field:ident, )+
        }
    ) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
        #[repr(C)]
        $vis struct $name {
            $( $(#[doc = $doc])+ pub $field: u64, )+
        }

        impl $name {
            /// Its size in 64-bit words.
            pub const WORDS: usize = [$(stringify!($field)),+].len();

            /// The fields in order, as the kernel reads them.
            #[allow(dead_code, reason = "the exit words are written one by one, never as a whole")]
            pub fn to_words(self) -> [u64; Self::WORDS] {
                [$(self.$field),+]
            }
        }

        impl $crate::resident::cuda_header::DeviceStruct for $name {
            const C_NAME: &'static str = $c_name;
            const FIELDS: &'static [(&'static str, &'static str)] =
                &[$((stringify!($field), concat!($($doc, "\n"),+))),+];
        }

        const _: () = assert!(size_of::<$name>() == 8 * $name::WORDS);
    };
}

mod consumer_graphs;
mod consumer_kernel;
pub mod cuda_header;
pub mod device_words;
mod frame_state;
mod graph;
mod graph_waits;
mod lease;
mod producer_graphs;
mod producer_kernel;
mod ring_kernels;
mod ring_port;
mod run_ahead;

pub use consumer_kernel::{FrameStamp, RingDescriptor, STAMP_MASK};
pub use graph::{FrameGraphs, GraphOptions, GraphSlot};
pub use graph_waits::GraphWaits;
pub use lease::{HEARTBEAT_PERIOD, KernelLease, LEASE_ENV};
pub use producer_kernel::ProducerRingDescriptor;

#[cfg(test)]
pub(crate) use ring_kernels::IMAGES as RING_IMAGES;
pub(crate) use ring_kernels::select_image as select_ring_image;
pub(crate) use ring_port::{Departure, ExitWords, ResidentSide};
pub(crate) use run_ahead::{RunAhead, Tail};

/// How many frames a GPU-side end (gpu-stream-ops, gpu-poll) of a ring of `slots` slots may queue on its stream
/// beyond what the stream has run (its run-ahead bound: twice the slots, at least 32). A producer killed with frames
/// queued has told its consumers those frames were published (its count passed them as it queued them), though its
/// stream never ran them: their stamps say so.
pub const fn run_ahead_depth(slots: u32) -> usize {
    run_ahead::depth_for(slots)
}
