//! How a frame graph waits (`crate::resident::graph`): with kernels of the ring's device API that poll the ring's
//! words (the lowest latency, but only under MPS: without it a waiting kernel holds its context's time slice and the
//! other process runs only between slices), or with **stream memory operations as graph nodes**
//! (`cuGraphAddBatchMemOpNode`: 64-bit GEQ waits on the control block's counters, as the gpu-stream-ops strategy
//! queues them call by call), which wait in the GPU's front end and work when processes time-slice.
//!
//! A wait node's value is fixed in the graph, but the frame a slot's graph is for moves on by a lap each launch, so
//! the host sets each node's waits before it launches the graph (`cuGraphExecBatchMemOpNodeSetParams`, one call
//! per frame; launches already queued keep theirs): a consumer's wait for `published[slot] >= seq + 1`, a
//! producer's waits for every consumer that has not released the slot's previous frame (as
//! `ProducerControl::pending_releases` says when the graph is launched). A wait the host already sees satisfied is
//! set on a word that always satisfies it (the frame state's reserved word, 0 >= 0, in device memory), and so are
//! the unused waits of a producer's node (one per consumer record).
//!
//! A stream wait cannot time out: a dead peer is released by the poison its survivor writes (bit 62 of the
//! counters, which satisfies every GEQ wait): the consumer's watchdog poisons `published` when the producer dies,
//! the producer poisons a dead consumer's `released`. The step after the wait (`gpu_ipc_graph_check_frame`,
//! `gpu_ipc_graph_mark_slot`) then computes `valid` on the GPU from the stamp and the abort word, without polling.

use super::frame_state::ALWAYS_MET_OFFSET;
use crate::frames::FrameError;
use crate::ring::{ConsumerControl, ProducerControl, Sequence};
use gpu_ipc_driver::{DeviceFeature, DeviceSpan, MemOpBatch, WaitCondition};

/// How a frame graph's opening step waits ([`super::GraphOptions::waits`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum GraphWaits {
    /// Kernels of the ring's device API that poll the ring's words, bounded by the per-frame timeout and the abort
    /// word on the GPU: the lowest latency, under MPS only (without it a waiting kernel holds its context's time
    /// slice).
    Kernels,
    /// Batch memory operation nodes (64-bit GEQ stream waits on the control block, values set by the host at each
    /// launch), then a kernel that judges the frame without polling: works when processes time-slice (no MPS).
    /// The host bounds the wait (the launch's and `finish_frame_graphs`' timeouts); a dead peer's waits are
    /// released by the poison its survivor writes.
    StreamOps,
}

impl GraphWaits {
    /// The waits for a device: [`GraphWaits::Kernels`] where MPS runs (`MpsEvidence::running`), else
    /// [`GraphWaits::StreamOps`].
    pub fn for_device(device: gpu_ipc_driver::Device) -> Self {
        if gpu_ipc_driver::mps::MpsEvidence::gather(device).running() { Self::Kernels } else { Self::StreamOps }
    }

    /// The name the bench and the logs use: `kernel-waits` or `stream-op-waits`.
    pub fn name(self) -> &'static str {
        match self {
            Self::Kernels => "kernel-waits",
            Self::StreamOps => "stream-op-waits",
        }
    }

    /// Whether `device` can run these waits.
    ///
    /// # Errors
    /// [`FrameError::StrategyUnavailable`] for stream-op waits on a device without 64-bit stream memory operations
    /// (the ring's counters are 64-bit); a driver error.
    pub(super) fn check(self, device: gpu_ipc_driver::Device) -> Result<(), FrameError> {
        if self == Self::StreamOps && !device.supports(DeviceFeature::StreamMemOps64)? {
            return Err(FrameError::StrategyUnavailable {
                strategy: "frame graphs with stream-op waits".into(),
                reason: "this device or driver does not offer 64-bit stream memory operations \
                         (CU_DEVICE_ATTRIBUTE_CAN_USE_64_BIT_STREAM_MEM_OPS is 0); use GraphWaits::Kernels under MPS"
                    .into(),
            });
        }
        Ok(())
    }
}

impl std::fmt::Display for GraphWaits {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// One wait of a frame's node, as the host computes it: the counter at byte `offset` of the control block must
/// reach `at_least`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct WaitOn {
    pub offset: u64,
    pub at_least: u64,
}

/// The `count` waits of one frame's node: `wants` (`Some`), then waits that hold at once (`None`) up to `count`.
///
/// # Errors
/// More waits wanted than the node holds (a [`FrameError::Config`]).
pub(super) fn padded(wants: &[WaitOn], count: usize) -> Result<impl Iterator<Item = Option<WaitOn>> + '_, FrameError> {
    if wants.len() > count {
        return Err(FrameError::Config(format!(
            "a frame graph's node holds {count} waits, and {} are needed",
            wants.len()
        )));
    }
    Ok(wants.iter().copied().map(Some).chain(std::iter::repeat_n(None, count - wants.len())))
}

/// Fills `batch` with the `count` waits of one frame's node ([`padded`]): `wants` on the control block, the rest
/// on `always_met`'s reserved word (0 >= 0).
///
/// # Errors
/// As [`padded`]; a word outside its span.
pub(super) fn frame_waits<'a>(
    batch: &mut MemOpBatch<'a>,
    wants: &[WaitOn],
    count: usize,
    control: &DeviceSpan<'a>,
    always_met: &DeviceSpan<'a>,
) -> Result<(), FrameError> {
    for wait in padded(wants, count)? {
        match wait {
            Some(want) => batch.wait_u64(control, want.offset, want.at_least, WaitCondition::AtLeast)?,
            None => batch.wait_u64(always_met, ALWAYS_MET_OFFSET, 0, WaitCondition::AtLeast)?,
        };
    }
    Ok(())
}

/// The consumer's wait for frame `seq` (none when the host already sees it published, or poisoned).
pub(super) fn consumer_wants(ring: &ConsumerControl, seq: u64, out: &mut Vec<WaitOn>) {
    out.clear();
    let seq = Sequence(seq);
    if matches!(ring.is_published(seq), Ok(true)) {
        return;
    }
    let block = ring.block();
    let offset = block.layout().published_offset(block.slot_for(seq)) as u64;
    out.push(WaitOn { offset, at_least: seq.done_value() });
}

/// The producer's waits before it rewrites the slot of frame `seq` (the releases it still needs, as the host sees
/// them now), then `next_sequence` moved past `seq`: a consumer that registers from now on joins after it, so the
/// waits chosen here are all this frame needs (as the gpu-stream-ops strategy does when it queues a frame).
///
/// # Errors
/// A ring error (a frame out of order), or a registration still in progress past `give_up`.
pub(super) fn producer_wants(
    ring: &ProducerControl,
    seq: u64,
    give_up: std::time::Instant,
    out: &mut Vec<WaitOn>,
) -> Result<(), FrameError> {
    let mut pending = Vec::new();
    ring.pending_releases_by(Sequence(seq), give_up, &mut pending)?;
    out.clear();
    out.extend(pending.iter().map(|need| WaitOn { offset: need.offset as u64, at_least: need.at_least }));
    ring.advance(Sequence(seq))?;
    Ok(())
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::Ordering;

    use super::*;
    use crate::ring::{LivenessPolicy, RingConfig};

    fn ring(slots: u32, consumers: u32) -> ProducerControl {
        ProducerControl::create(
            RingConfig { slot_count: slots, max_consumers: consumers, generation: 1 },
            LivenessPolicy::default(),
        )
        .unwrap()
    }

    /// The word at byte `offset` of the control block, as a stream wait on it would read it.
    fn word(ring: &ProducerControl, offset: u64) -> u64 {
        ring.block().memory().words(offset as usize / 8, 1).unwrap()[0].load(Ordering::Acquire)
    }

    #[test]
    fn a_producer_waits_for_the_consumers_that_hold_the_slot_and_the_poison_of_a_dead_one_releases_it() {
        let producer = ring(2, 3);
        let id = producer.register_consumer(None).unwrap();
        let fd = producer.block().memory().try_clone_fd().unwrap();
        let consumer = Arc::new(ConsumerControl::attach(fd, id, LivenessPolicy::default()).unwrap());
        let give_up = std::time::Instant::now() + std::time::Duration::from_secs(1);
        let mut wants = Vec::new();
        // Frames 0 and 1: the slots never held a frame.
        for seq in 0..2 {
            producer_wants(&producer, seq, give_up, &mut wants).unwrap();
            assert!(wants.is_empty(), "frame {seq}");
            producer.block().published(producer.block().slot_for(Sequence(seq))).store(seq + 1, Ordering::Release);
        }
        consumer.release(Sequence(0)).unwrap();
        // Frame 2 rewrites slot 0, released; frame 3 rewrites slot 1, still held: one wait, on released[c][1] >= 2.
        producer_wants(&producer, 2, give_up, &mut wants).unwrap();
        assert!(wants.is_empty(), "frame 0 was released");
        producer_wants(&producer, 3, give_up, &mut wants).unwrap();
        assert_eq!(wants.len(), 1);
        let WaitOn { offset, at_least } = wants[0];
        assert_eq!(at_least, 2);
        assert!(word(&producer, offset) < at_least, "the wait would hold the graph");
        assert_eq!(producer.block().next_sequence(), Sequence(4), "next_sequence moved past the frames launched");
        // The consumer dies: its survivor poisons its counters, which satisfies the wait.
        producer.block().memory().words(offset as usize / 8, 1).unwrap()[0]
            .store(crate::ring::POISON, Ordering::Release);
        assert!(word(&producer, offset) >= at_least, "the poison releases the wait");
        // Frames must be launched in order.
        assert!(producer_wants(&producer, 9, give_up, &mut wants).is_err());
    }

    #[test]
    fn a_consumer_waits_for_unpublished_frames_only_and_the_producers_poison_releases_the_wait() {
        let producer = ring(4, 1);
        let id = producer.register_consumer(None).unwrap();
        let fd = producer.block().memory().try_clone_fd().unwrap();
        let consumer = ConsumerControl::attach(fd, id, LivenessPolicy::default()).unwrap();
        let mut wants = Vec::new();
        producer.publish(Sequence(0)).unwrap();
        consumer_wants(&consumer, 0, &mut wants);
        assert!(wants.is_empty(), "published: no wait");
        consumer_wants(&consumer, 1, &mut wants);
        let WaitOn { offset, at_least } = wants[0];
        assert_eq!((wants.len(), at_least), (1, 2));
        assert!(word(&producer, offset) < at_least);
        // The producer dies: the consumer's watchdog poisons `published`, which satisfies the GEQ wait; the stamp
        // (its low bits) is not frame 1's, so the check kernel marks the frame not valid.
        consumer.poison_published();
        let value = word(&producer, offset);
        assert!(value >= at_least, "the poison releases the wait");
        assert_ne!(value & (crate::ring::POISON - 1), 2, "and the stamp says frame 1 was never written");
    }

    #[test]
    fn a_frames_node_is_padded_with_waits_that_hold_at_once() {
        let want = WaitOn { offset: 64, at_least: 7 };
        assert_eq!(padded(&[want], 3).unwrap().collect::<Vec<_>>(), [Some(want), None, None]);
        assert_eq!(padded(&[], 2).unwrap().collect::<Vec<_>>(), [None, None]);
        assert!(padded(&[want, want], 1).is_err(), "more waits than the node holds");
    }
}
