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

use super::ring_port::{MAX_DESCRIPTOR_WORDS, RingPort};
use crate::backend::{Backend, SharedRegion};
use crate::frames::{FrameError, Producer};
use crate::ring::layout::{RingLayout, SlotIndex};
use gpu_ipc_driver::{Function, KernelArg, LaunchConfig, Stream};

/// Who needs the registered control block, and what to do without it (a producer's kernel on the ring).
const PRODUCER_KERNEL: (&str, &str) = ("a kernel on the ring reads", "create the producer");

/// What a kernel needs to act on the ring as its producer, all `u64` and `#[repr(C)]`: the mirror of
/// `struct gpu_ipc_ring_producer_descriptor` in `kernels/cuda/gpu_ipc_ring.cuh` (a test checks both agree, field by
/// field). Offsets and strides come from the layout's offset functions, so kernels need no layout constants.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(C)]
pub struct ProducerRingDescriptor {
    /// [`ProducerRingDescriptor::VERSION`].
    pub version: u64,
    /// Device address of the control block (host memory registered for the device).
    pub control: u64,
    /// Byte offset of `published[0]` in the control block.
    pub published_offset: u64,
    /// Bytes from `published[i]` to `published[i + 1]`.
    pub published_stride: u64,
    /// Byte offset of `next_sequence` (the first frame not yet published).
    pub next_sequence_offset: u64,
    /// Byte offset of consumer record 0 (its state word).
    pub records_offset: u64,
    /// Bytes from one consumer record to the next.
    pub record_stride: u64,
    /// Bytes from a record's state word to its join sequence.
    pub join_offset: u64,
    /// Bytes from a record's state word to its `released[0]`.
    pub released_offset: u64,
    /// Bytes from a record's `released[i]` to `released[i + 1]`.
    pub released_stride: u64,
    /// Consumer records in use (the ring's max consumers).
    pub consumer_records: u64,
    /// Device address of slot 0's frame.
    pub slots: u64,
    /// Bytes from one slot to the next.
    pub slot_stride: u64,
    /// Bytes of a frame.
    pub slot_bytes: u64,
    /// Slots in the ring.
    pub slot_count: u64,
    /// The first frame the kernel is to publish: the producer's next sequence when it launched the kernel.
    pub first_sequence: u64,
    /// Device address of the abort word: non-zero tells the kernel to leave (the host sets it when the producer
    /// is dropped).
    pub abort: u64,
    /// Device address of the progress word: the first frame the kernel has not published (it stores it).
    pub progress: u64,
    /// Device address of the ring's device words ([`crate::resident::device_words`]), 0 when the ring has none.
    pub device_words: u64,
}

impl ProducerRingDescriptor {
    /// `GPU_IPC_RING_PRODUCER_DESCRIPTOR_VERSION` in the header.
    pub const VERSION: u64 = 2;
    /// Its size in 64-bit words.
    pub const WORDS: usize = size_of::<Self>() / 8;

    /// The fields in order, as the kernel reads them.
    pub fn to_words(&self) -> [u64; Self::WORDS] {
        [
            self.version,
            self.control,
            self.published_offset,
            self.published_stride,
            self.next_sequence_offset,
            self.records_offset,
            self.record_stride,
            self.join_offset,
            self.released_offset,
            self.released_stride,
            self.consumer_records,
            self.slots,
            self.slot_stride,
            self.slot_bytes,
            self.slot_count,
            self.first_sequence,
            self.abort,
            self.progress,
            self.device_words,
        ]
    }

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

const _: () = assert!(size_of::<ProducerRingDescriptor>() == 8 * ProducerRingDescriptor::WORDS);
const _: () = assert!(ProducerRingDescriptor::WORDS <= MAX_DESCRIPTOR_WORDS);
// gpu_ipc_ring_acquire_slot gives each consumer record a lane of one warp.
const _: () = assert!(crate::ring::layout::MAX_CONSUMERS <= 32);

/// How often [`Producer::finish_ring_kernel`] serves the front door and looks at the kernel.
const FINISH_POLL: Duration = Duration::from_micros(200);

impl<B: Backend> Producer<B> {
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
            first_sequence: self.next_seq,
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
        let registered = self.sync.control_block().is_some();
        self.resident.open(registered, self.strategy.kind(), PRODUCER_KERNEL, stream)?;
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
            let Some(port) = self.resident.port.as_mut() else { return Ok(self.next_seq) };
            let step = (Instant::now() + FINISH_POLL).min(deadline);
            match port.finish(step, false) {
                Ok(progress) => return Ok(self.take_ring_back(progress)),
                Err(FrameError::Timeout { .. }) if Instant::now() < deadline => {
                    // Retired records and new consumers are judged at the kernel's frame, not the host's last.
                    self.next_seq = self.next_seq.max(port.progress());
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
        self.next_seq = self.next_seq.max(progress);
        self.ring.rewind_next(crate::ring::Sequence(self.next_seq));
        self.next_seq
    }

    /// [`FrameError::Config`] while a kernel launched on the ring may still run: it owns the ring. One that has
    /// finished gives it back (as [`Producer::finish_ring_kernel`]).
    pub(crate) fn check_no_ring_kernel(&mut self) -> Result<(), FrameError> {
        match &self.resident.port {
            Some(port) if port.busy()? => Err(FrameError::Config(
                "a kernel launched on the ring still publishes its frames: call finish_ring_kernel first".into(),
            )),
            Some(_) => self.finish_ring_kernel(Duration::ZERO).map(|_| ()),
            None => Ok(()),
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn the_descriptor_mirrors_the_cuda_header_field_by_field() {
        let header = include_str!("../../../kernels/cuda/gpu_ipc_ring.cuh");
        let body = &header[header.find("struct gpu_ipc_ring_producer_descriptor {").unwrap()..];
        let body = &body[..body.find("};").unwrap()];
        let fields: Vec<&str> = body
            .lines()
            .skip(1)
            .filter_map(|line| line.trim().strip_prefix("gpu_ipc_ring_u64 "))
            .map(|rest| rest.split(';').next().unwrap().trim())
            .collect();
        assert_eq!(
            fields,
            [
                "version",
                "control",
                "published_offset",
                "published_stride",
                "next_sequence_offset",
                "records_offset",
                "record_stride",
                "join_offset",
                "released_offset",
                "released_stride",
                "consumer_records",
                "slots",
                "slot_stride",
                "slot_bytes",
                "slot_count",
                "first_sequence",
                "abort",
                "progress",
                "device_words"
            ]
        );
        assert_eq!(fields.len(), ProducerRingDescriptor::WORDS);
        assert!(header.contains(&format!(
            "#define GPU_IPC_RING_PRODUCER_DESCRIPTOR_VERSION {}ull",
            ProducerRingDescriptor::VERSION
        )));
        use crate::ring::layout::ConsumerState;
        assert!(header.contains(&format!("#define GPU_IPC_RING_STATE_JOINING {}ull", ConsumerState::Joining as u64)));
        assert!(header.contains(&format!("#define GPU_IPC_RING_STATE_LIVE {}ull", ConsumerState::Live as u64)));
        assert!(header.contains(&format!("#define GPU_IPC_RING_STATE_MASK {:#x}ull", crate::ring::layout::STATE_MASK)));
    }

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
