//! The ring as a producer's kernels see it: the descriptor that hands a persistent kernel the ring's counters (the
//! producer's half of the device API in `kernels/cuda/gpu_ipc_ring.cuh`), so a kernel waits for each slot to come
//! free, writes the frame and publishes it, with no launch and no CPU work per frame.
//!
//! The kernel applies the host producer's rule (docs/ring.md): frame `s` may be written once every consumer record
//! that is `Live` and joined at or before frame `s - N` has released it; it reads the records' state, join sequence
//! and `released` words in the control block, as [`ProducerControl::pending_releases`](
//! crate::ring::ProducerControl::pending_releases) does. Consumers that die are poisoned by the producer's
//! watchdog (their `released` words then satisfy every wait); consumers that knock while the kernel runs are
//! admitted by [`Producer::finish_ring_kernel`], which serves the front door while it waits.

use std::time::{Duration, Instant};

use super::KernelLease;
use super::ring_port::{MAX_DESCRIPTOR_WORDS, RingPort};
use crate::backend::{Backend, SharedRegion};
use crate::frames::{FrameError, Producer};
use crate::ring::layout::{RingLayout, Sequence, SlotIndex};
use gpu_ipc_driver::{Function, KernelArg, LaunchConfig, Stream};

/// Who needs the registered control block, and what to do without it (a producer's kernel on the ring).
const PRODUCER_KERNEL: (&str, &str) = ("a kernel on the ring reads", "create the producer");

device_struct! {
    /// What a kernel needs to act on the ring as its producer, all `u64` and `#[repr(C)]`: the mirror of
    /// `struct gpu_ipc_ring_producer_descriptor`, which `kernels/cuda/gpu_ipc_ring_layout.cuh` defines from this
    /// struct ([`crate::resident::cuda_header`]). Offsets and strides come from the layout's offset functions, so kernels need no layout constants.
    pub struct ProducerRingDescriptor => "gpu_ipc_ring_producer_descriptor" {
        /// [`ProducerRingDescriptor::VERSION`].
        pub version,
        /// Device address of the control block (host memory registered for the device).
        pub control,
        /// Byte offset of `published[0]` in the control block.
        pub published_offset,
        /// Bytes from `published[i]` to `published[i + 1]`.
        pub published_stride,
        /// Byte offset of `next_sequence` (the first frame not yet published).
        pub next_sequence_offset,
        /// Byte offset of consumer record 0 (its state word).
        pub records_offset,
        /// Bytes from one consumer record to the next.
        pub record_stride,
        /// Bytes from a record's state word to its join sequence.
        pub join_offset,
        /// Bytes from a record's state word to its `released[0]`.
        pub released_offset,
        /// Bytes from a record's `released[i]` to `released[i + 1]`.
        pub released_stride,
        /// Consumer records in use (the ring's max consumers).
        pub consumer_records,
        /// Device address of slot 0's frame.
        pub slots,
        /// Bytes from one slot to the next.
        pub slot_stride,
        /// Bytes of a frame.
        pub slot_bytes,
        /// Slots in the ring.
        pub slot_count,
        /// The first frame the kernel is to publish: the producer's next sequence when it launched the kernel.
        pub first_sequence,
        /// Device address of the exit words (`struct gpu_ipc_ring_exit`), the abort word first: non-zero tells the
        /// kernel to leave (the host sets it when the producer is dropped); then the kernel lease's heartbeat and the
        /// survivor's abort word ([`crate::resident::KernelLease`]).
        pub abort,
        /// Device address of the progress word: the first frame the kernel has not published (it stores it).
        pub progress,
        /// Device address of the ring's device words ([`crate::resident::device_words`]), 0 when the ring has none.
        pub device_words,
    }
}

impl ProducerRingDescriptor {
    /// `GPU_IPC_RING_PRODUCER_DESCRIPTOR_VERSION` in the header.
    pub const VERSION: u64 = 3;
    /// The layout part: `[published_offset, published_stride, next_sequence_offset, records_offset, record_stride,
    /// join_offset, released_offset, released_stride]`, from the layout's offset functions.
    fn offsets(layout: RingLayout) -> [u64; 8] {
        let off = |bytes: usize| bytes as u64;
        let record = off(layout.consumer_state_offset(0));
        [
            off(layout.published_offset(SlotIndex(0))),
            off(layout.published_offset(SlotIndex(1))) - off(layout.published_offset(SlotIndex(0))),
            off(layout.next_sequence_offset()),
            record,
            off(layout.consumer_state_offset(1)) - record,
            off(layout.join_sequence_offset(0)) - record,
            off(layout.released_offset(0, SlotIndex(0))) - record,
            off(layout.released_offset(0, SlotIndex(1))) - off(layout.released_offset(0, SlotIndex(0))),
        ]
    }
}

const _: () = assert!(ProducerRingDescriptor::WORDS <= MAX_DESCRIPTOR_WORDS);
// gpu_ipc_ring_acquire_slot gives each consumer record a lane of one warp.
const _: () = assert!(crate::ring::layout::MAX_CONSUMERS <= 32);

/// How often [`Producer::finish_ring_kernel`] serves the front door and looks at the kernel.
const FINISH_POLL: Duration = Duration::from_micros(200);

impl<B: Backend> Producer<B> {
    /// How this producer's kernels on the ring learn that its process is gone, from the next launch (or capture of
    /// frame graphs) on ([`KernelLease`]; [`KernelLease::default`] at creation, which reads [`LEASE_ENV`](
    /// crate::resident::LEASE_ENV)).
    pub fn set_kernel_lease(&mut self, lease: KernelLease) {
        self.resident.lease = lease;
    }

    /// The lease this producer's kernels on the ring get ([`Producer::set_kernel_lease`]).
    pub fn kernel_lease(&self) -> KernelLease {
        self.resident.lease
    }

    /// The device address of the producer's kernel abort word in the control block (a consumer raises it when it
    /// sees this producer's process gone), or `None` when the strategy does not register the control block.
    pub(super) fn peer_abort_address(&self) -> Option<u64> {
        let control = self.sync.control_block()?;
        Some(control.ptr().raw() + self.ring.block().layout().producer_kernel_abort_offset() as u64)
    }

    /// The descriptor a kernel launched now by [`Producer::launch_on_ring`] gets: the ring's counters, the slots,
    /// the next frame to publish. `None` when the strategy does not register the control block for the device
    /// (use `GpuStreamOps` or `GpuPoll`); the abort and progress words' addresses are 0 before the first launch.
    pub fn ring_descriptor(&self) -> Option<ProducerRingDescriptor> {
        let control = self.sync.control_block()?;
        let layout = self.ring.block().layout();
        let [
            published_offset,
            published_stride,
            next_sequence_offset,
            records_offset,
            record_stride,
            join_offset,
            released_offset,
            released_stride,
        ] = ProducerRingDescriptor::offsets(layout);
        let (abort, progress) = self.resident.port.as_ref().map_or((0, 0), RingPort::word_addresses);
        Some(ProducerRingDescriptor {
            version: ProducerRingDescriptor::VERSION,
            control: control.ptr().raw(),
            published_offset,
            published_stride,
            next_sequence_offset,
            records_offset,
            record_stride,
            join_offset,
            released_offset,
            released_stride,
            consumer_records: u64::from(self.config.max_consumers),
            slots: self.region.ptr().raw(),
            slot_stride: self.stride,
            slot_bytes: self.config.slot_layout.bytes(),
            slot_count: u64::from(self.config.slots),
            first_sequence: self.next_seq.0,
            abort,
            progress,
            device_words: if self.device_words == 0 || !crate::resident::device_words::enabled() {
                0
            } else {
                self.region.ptr().raw() + self.device_words
            },
        })
    }

    /// Launches `kernel` on `stream` with the ring's producer descriptor as its first argument
    /// (`const gpu_ipc_ring_producer_descriptor* ring`, `kernels/cuda/gpu_ipc_ring.cuh`), then `args`: a persistent
    /// kernel that waits for each slot to come free, writes the frame and publishes it, from
    /// [`Producer::next_sequence`] on, with no launch and no CPU work per frame. Until
    /// [`Producer::finish_ring_kernel`] the kernel owns the ring: `acquire` and `publish` refuse. The work queued
    /// on `stream` before (the frames published with `acquire`/`publish`) is waited for first, so the kernel's
    /// frames follow them. Consumers may attach while it runs (`finish_ring_kernel` admits them; they join up to
    /// 128 frames after the kernel's current one, where it keeps `next_sequence`) and may die (the watchdog poisons
    /// their counters, which releases the kernel's waits);
    /// a consumer that holds a slot is never evicted while a kernel publishes. When the producer is dropped the
    /// abort word is raised and the kernel must leave. Read docs/kernels.md before using one under MPS.
    ///
    /// # Errors
    /// A strategy that does not register the control block ([`FrameError::StrategyUnavailable`]: use
    /// `gpu-stream-ops` or `gpu-poll`), a kernel already running on the ring, the stream's earlier work not done
    /// within the producer's GPU timeout, a driver error.
    pub fn launch_on_ring(
        &mut self,
        kernel: &Function,
        stream: &Stream,
        config: LaunchConfig,
        args: &[KernelArg<'_>],
    ) -> Result<(), FrameError> {
        let peer_abort = self.peer_abort_address();
        self.resident.open(peer_abort, self.strategy.kind(), PRODUCER_KERNEL, stream)?;
        self.check_no_ring_kernel()?;
        self.serve_front_door();
        // The frames queued so far go through the stream before the kernel publishes the next ones.
        self.sync.drain(Some(stream), Instant::now() + self.config.gpu_timeout)?;
        // Both exist now: the control block was checked above, the port made.
        let descriptor = self.ring_descriptor().ok_or_else(|| FrameError::Config("no ring descriptor".into()))?;
        let port = self.resident.port.as_mut().ok_or_else(|| FrameError::Config("no ring port".into()))?;
        port.launch(&descriptor.to_words(), descriptor.first_sequence, kernel, stream, config, args)
    }

    /// Waits, at most `timeout`, until the kernel launched by [`Producer::launch_on_ring`] is done, serving the
    /// front door meanwhile (consumers that knock are admitted and join where the kernel keeps `next_sequence`),
    /// and takes the ring back: the producer's next sequence, and the control block's `next_sequence`, become the
    /// first frame the kernel did not publish (its progress word), which this returns. Nothing launched: the next
    /// sequence as it is.
    ///
    /// # Errors
    /// [`FrameError::Timeout`] when the kernel is still running (call again, or drop the producer, which raises the
    /// abort word first), a driver error.
    pub fn finish_ring_kernel(&mut self, timeout: Duration) -> Result<u64, FrameError> {
        let deadline = Instant::now() + timeout;
        loop {
            let Some(port) = self.resident.port.as_mut() else { return Ok(self.next_seq.0) };
            let step = (Instant::now() + FINISH_POLL).min(deadline);
            match port.finish(step, false) {
                Ok(progress) => return Ok(self.take_ring_back(progress)),
                Err(FrameError::Timeout { .. }) if Instant::now() < deadline => {
                    // Retired records and new consumers are judged at the kernel's frame, not the host's last.
                    self.next_seq = self.next_seq.max(Sequence(port.progress()));
                    self.serve_front_door();
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// Takes the ring back from the kernel (or frame graphs) that ended at `progress` (its progress word): the next
    /// sequence becomes the first frame not published, here and in the control block, where the kernel may have
    /// moved `next_sequence` ahead of its frames (gpu_ipc_ring_acquire_slot's view of the records).
    pub(crate) fn take_ring_back(&mut self, progress: u64) -> u64 {
        self.next_seq = self.next_seq.max(Sequence(progress));
        self.ring.rewind_next(self.next_seq);
        self.next_seq.0
    }

    /// [`FrameError::Config`] while a kernel launched on the ring may still run: it owns the ring. One that has
    /// finished gives it back (as [`Producer::finish_ring_kernel`]).
    pub(crate) fn check_no_ring_kernel(&mut self) -> Result<(), FrameError> {
        if self.resident.check_no_kernel_running("publishes its frames")? {
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
    fn descriptor_offsets_land_on_the_layout_words() {
        for layout in [RingLayout::V1, RingLayout::V2] {
            let [published, published_stride, next, records, record_stride, join, released, released_stride] =
                ProducerRingDescriptor::offsets(layout);
            let at = |bytes: u64| bytes as usize;
            assert_eq!(at(published + 7 * published_stride), layout.published_offset(SlotIndex(7)), "{layout}");
            assert_eq!(at(next), layout.next_sequence_offset());
            let record = |c: u64| records + c * record_stride;
            assert_eq!(at(record(3)), layout.consumer_state_offset(3));
            assert_eq!(at(record(3) + join), layout.join_sequence_offset(3));
            assert_eq!(at(record(3) + released + 5 * released_stride), layout.released_offset(3, SlotIndex(5)));
        }
    }
}
