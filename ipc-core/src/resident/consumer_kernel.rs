//! The ring as a consumer's kernels see it: the stamp a kernel checks before it reads a frame, and the descriptor
//! that hands a persistent kernel the ring's counters (the device API of `kernels/cuda/gpu_ipc_ring.cuh`).
//!
//! The stamp rule (docs/ring.md): frame `s` in slot `s % N` is the one the producer published iff
//! `(published[s % N] & (POISON - 1)) == s + 1`. The survivor of a dead producer ORs [`POISON`] into `published`,
//! which releases every GPU-side wait on it (so a kernel queued behind such a wait runs) and keeps the last real
//! frame in the low bits: a kernel that checks the stamp first never reads a frame the producer did not write.

use std::time::{Duration, Instant};

use super::KernelLease;
use super::ring_port::{MAX_DESCRIPTOR_WORDS, RingPort};
use crate::backend::{Backend, SharedRegion};
use crate::frames::{Consumer, Frame, FrameError};
use crate::ring::POISON;
use crate::ring::layout::{RingLayout, SlotIndex};
use gpu_ipc_driver::{DevicePtr, DeviceSpan, Function, KernelArg, LaunchConfig, Stream};

/// Who needs the registered control block, and what to do without it (a consumer's kernel on the ring).
const CONSUMER_KERNEL: (&str, &str) = ("a kernel on the ring reads", "start the producer");

/// Where a kernel finds frame `seq`'s stamp, and what it must hold: see [`Frame::stamp`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct FrameStamp {
    /// Device address (in this process) of the `published` word of the frame's slot: a 64-bit word of the
    /// control block, host memory registered for the device. Valid while the consumer is attached; read it with
    /// `ld.acquire.sys` (or `cuda::atomic_ref<..., thread_scope_system>::load(memory_order_acquire)`).
    pub device_ptr: DevicePtr,
    /// `seq + 1`: the frame is real iff `(word & STAMP_MASK) == expected` ([`FrameStamp::matches`]).
    pub expected: u64,
}

/// The bits of a `published` word that hold the frame (`s + 1`); the bit above them is [`POISON`].
pub const STAMP_MASK: u64 = POISON - 1;

impl FrameStamp {
    /// The stamp rule: whether `word`, read from [`FrameStamp::device_ptr`], says the frame is the producer's.
    pub const fn matches(&self, word: u64) -> bool {
        word & STAMP_MASK == self.expected
    }
}

device_struct! {
    /// What a kernel needs to act on the ring as one consumer, all `u64` and `#[repr(C)]`: the mirror of
    /// `struct gpu_ipc_ring_descriptor`, which `kernels/cuda/gpu_ipc_ring_layout.cuh` defines from this struct
    /// ([`crate::resident::cuda_header`]).
    /// Offsets and strides come from the layout's offset functions, so kernels need no layout constants.
    pub struct RingDescriptor => "gpu_ipc_ring_descriptor" {
        /// [`RingDescriptor::VERSION`].
        pub version,
        /// Device address of the control block (host memory registered for the device).
        pub control,
        /// Byte offset of `published[0]` in the control block.
        pub published_offset,
        /// Bytes from `published[i]` to `published[i + 1]`.
        pub published_stride,
        /// Byte offset of this consumer's `released[0]`.
        pub released_offset,
        /// Bytes from its `released[i]` to `released[i + 1]`.
        pub released_stride,
        /// Device address of slot 0's frame, in this process's mapping.
        pub slots,
        /// Bytes from one slot to the next.
        pub slot_stride,
        /// Bytes of a frame.
        pub slot_bytes,
        /// Slots in the ring.
        pub slot_count,
        /// This consumer's record index.
        pub consumer_index,
        /// The first frame the kernel is to read: the consumer's next sequence when it launched the kernel.
        pub first_sequence,
        /// Device address of the exit words (`struct gpu_ipc_ring_exit`), the abort word first: non-zero tells the
        /// kernel to leave (the host sets it when the producer dies or the consumer is dropped); then the kernel
        /// lease's heartbeat and the survivor's abort word ([`crate::resident::KernelLease`]).
        pub abort,
        /// Device address of the progress word: the first frame the kernel has not released (it stores it).
        pub progress,
        /// Device address of the ring's device words ([`crate::resident::device_words`]) in this process's mapping, 0
        /// when the ring has none.
        pub device_words,
    }
}

impl RingDescriptor {
    /// `GPU_IPC_RING_DESCRIPTOR_VERSION` in the header.
    pub const VERSION: u64 = 3;
    /// The layout part of a consumer's descriptor: offsets and strides from the block's layout's offset functions
    /// (128-byte strides in layout 1, 8-byte ones in layout 2: rings of more than 32 slots).
    fn offsets(layout: RingLayout, consumer_index: u32) -> [u64; 4] {
        let published = layout.published_offset(SlotIndex(0)) as u64;
        let released = layout.released_offset(consumer_index, SlotIndex(0)) as u64;
        [
            published,
            layout.published_offset(SlotIndex(1)) as u64 - published,
            released,
            layout.released_offset(consumer_index, SlotIndex(1)) as u64 - released,
        ]
    }
}

const _: () = assert!(RingDescriptor::WORDS <= MAX_DESCRIPTOR_WORDS);

/// The span of frame stamps: the 8 bytes of `published[slot]` in `control`, a block of `layout`.
fn stamp_span<'a>(control: DeviceSpan<'a>, layout: RingLayout, slot: SlotIndex) -> Result<DeviceSpan<'a>, FrameError> {
    Ok(control.slice(layout.published_offset(slot) as u64, 8)?)
}

impl<B: Backend> Consumer<B> {
    /// The span of `frame`'s stamp word ([`Frame::stamp`]), borrowed from the consumer so that it cannot outlive
    /// the control block's registration: what a launcher passes to a kernel that checks the stamp first (the
    /// kernels crate's `gpu_ipc_verify_stamped`). `None` when the strategy does not register the control block.
    ///
    /// # Errors
    /// A frame that is not this consumer's ([`FrameError::ForeignToken`]).
    pub fn stamp_span(&self, frame: &Frame) -> Result<Option<DeviceSpan<'_>>, FrameError> {
        self.check_owner(frame)?;
        let layout = self.shared.ring.block().layout();
        self.sync.control_block().map(|control| stamp_span(control, layout, frame.slot())).transpose()
    }

    /// How this consumer's kernels on the ring learn that its process is gone, from the next launch (or capture of
    /// frame graphs) on ([`KernelLease`]; [`KernelLease::default`] at attach, which reads [`LEASE_ENV`](
    /// crate::resident::LEASE_ENV)).
    pub fn set_kernel_lease(&mut self, lease: KernelLease) {
        self.resident.lease = lease;
    }

    /// The lease this consumer's kernels on the ring get ([`Consumer::set_kernel_lease`]).
    pub fn kernel_lease(&self) -> KernelLease {
        self.resident.lease
    }

    /// The device address of this consumer's kernel abort word in the control block (the producer raises it when
    /// it declares this consumer dead), or `None` when the strategy does not register the control block.
    pub(super) fn peer_abort_address(&self) -> Option<u64> {
        let control = self.sync.control_block()?;
        let layout = self.shared.ring.block().layout();
        Some(control.ptr().raw() + layout.kernel_abort_offset(self.shared.ring.id().index()) as u64)
    }

    /// The descriptor a kernel launched now by [`Consumer::launch_on_ring`] gets: this consumer's counters, the
    /// slots in this process's mapping, the next frame to read. `None` when the strategy does not register the
    /// control block for the device (use `GpuStreamOps` or `GpuPoll`), or before the first launch made the abort
    /// and progress words (their addresses are then 0).
    pub fn ring_descriptor(&self) -> Option<RingDescriptor> {
        let control = self.sync.control_block()?;
        let index = self.shared.ring.id().index();
        let layout = self.shared.ring.block().layout();
        let [published_offset, published_stride, released_offset, released_stride] =
            RingDescriptor::offsets(layout, index);
        let (abort, progress) = self.resident.port.as_ref().map_or((0, 0), RingPort::word_addresses);
        Some(RingDescriptor {
            version: RingDescriptor::VERSION,
            control: control.ptr().raw(),
            published_offset,
            published_stride,
            released_offset,
            released_stride,
            slots: self.region.ptr().offset(self.offer.data_offset).raw(),
            slot_stride: self.offer.slot_stride_bytes,
            slot_bytes: self.offer.slot_layout.bytes(),
            slot_count: u64::from(self.offer.slot_count),
            consumer_index: u64::from(index),
            first_sequence: self.next_seq,
            abort,
            progress,
            device_words: if self.device_words == 0 { 0 } else { self.region.ptr().offset(self.device_words).raw() },
        })
    }

    /// Launches `kernel` on `stream` with the ring's descriptor as its first argument
    /// (`const gpu_ipc_ring_descriptor* ring`, `kernels/cuda/gpu_ipc_ring.cuh`), then `args`: a persistent kernel
    /// that waits for, checks and releases frames from [`Consumer::next_sequence`] on, with no launch and no CPU
    /// work per frame. Until [`Consumer::finish_ring_kernel`] the kernel owns the frames: `next_frame` refuses.
    /// The host keeps watching the producer: at its hang-up, and when the consumer is detached or dropped, the
    /// abort word is raised and the kernel must leave (every wait in the header is bounded by it and by
    /// `%globaltimer`). Read docs/kernels.md before using one under MPS: a process killed while its kernel polls
    /// host memory faults the MPS server for every client.
    ///
    /// # Errors
    /// A strategy that does not register the control block ([`FrameError::StrategyUnavailable`]: use
    /// `gpu-stream-ops` or `gpu-poll`), a kernel already running on the ring, the producer gone, this consumer
    /// evicted, a driver error.
    pub fn launch_on_ring(
        &mut self,
        kernel: &Function,
        stream: &Stream,
        config: LaunchConfig,
        args: &[KernelArg<'_>],
    ) -> Result<(), FrameError> {
        let peer_abort = self.peer_abort_address();
        self.resident.open(peer_abort, self.offer.sync, CONSUMER_KERNEL, stream)?;
        self.check_no_ring_kernel()?;
        self.check_producer()?;
        // Both exist now: the control block was checked above, the port made.
        let descriptor = self.ring_descriptor().ok_or_else(|| FrameError::Config("no ring descriptor".into()))?;
        let port = self.resident.port.as_mut().ok_or_else(|| FrameError::Config("no ring port".into()))?;
        if port.aborted() {
            return Err(self.shared.gone("its connection hung up (the process exited or was killed)"));
        }
        port.launch(&descriptor.to_words(), descriptor.first_sequence, kernel, stream, config, args)
    }

    /// Waits, at most `timeout`, until the kernel launched by [`Consumer::launch_on_ring`] is done, and takes the
    /// frames back: the consumer's next sequence becomes the first frame the kernel did not release (its progress
    /// word), which this returns. Nothing launched: the next sequence as it is.
    ///
    /// # Errors
    /// [`FrameError::Timeout`] when the kernel is still running (call again, or drop the consumer, which raises
    /// the abort word first), a driver error.
    pub fn finish_ring_kernel(&mut self, timeout: Duration) -> Result<u64, FrameError> {
        if let Some(port) = self.resident.port.as_mut() {
            self.next_seq = self.next_seq.max(port.finish(Instant::now() + timeout, false)?);
        }
        Ok(self.next_seq)
    }

    /// [`FrameError::Config`] while a kernel launched on the ring may still run: it owns the frames. One that has
    /// finished gives them back (as [`Consumer::finish_ring_kernel`]).
    pub(crate) fn check_no_ring_kernel(&mut self) -> Result<(), FrameError> {
        if self.resident.check_no_kernel_running("reads its frames")? {
            self.finish_ring_kernel(Duration::ZERO)?;
        }
        Ok(())
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn the_stamp_rule_keeps_the_frame_under_poison_and_refuses_every_other_value() {
        let stamp = FrameStamp { device_ptr: DevicePtr(0), expected: 8 };
        assert!(stamp.matches(8));
        assert!(stamp.matches(8 | POISON), "a producer that published frame 7 and then died");
        assert!(!stamp.matches(POISON), "poisoned before anything was published in the slot");
        assert!(!stamp.matches(4 | POISON), "the slot's previous frame, then the poison: frame 7 never came");
        assert!(!stamp.matches(4), "not yet published");
        assert!(!stamp.matches(12), "overwritten by a later frame");
    }

    #[test]
    fn descriptor_offsets_come_from_the_layout_functions() {
        for (layout, stride) in [(RingLayout::V1, 128), (RingLayout::V2, 8)] {
            let [published, published_stride, released, released_stride] = RingDescriptor::offsets(layout, 3);
            assert_eq!((published_stride, released_stride), (stride, stride), "{layout}");
            assert_eq!(published, layout.published_offset(SlotIndex(0)) as u64);
            assert_eq!(published + 5 * published_stride, layout.published_offset(SlotIndex(5)) as u64);
            assert_eq!(released + 7 * released_stride, layout.released_offset(3, SlotIndex(7)) as u64);
        }
    }
}
