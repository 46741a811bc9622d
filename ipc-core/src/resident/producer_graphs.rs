//! A producer's frame graphs (`crate::resident::graph`): one graph per slot that waits until the slot is free, runs
//! the application's kernels that write the frame, and publishes it; one `cuGraphLaunch` per frame.

use std::time::Duration;

use super::graph::{self, FrameGraphs, GraphOptions, GraphSlot, LaunchWaits, PRODUCER_STEPS};
use super::{graph_waits, run_ahead};
use crate::backend::Backend;
use crate::frames::{FrameError, Producer};
use crate::ring::Sequence;
use gpu_ipc_driver::{DeviceMemory, Stream};

/// How often (in frames) launching frame graphs serves the front door (consumers that knock are admitted and join
/// at the next frame the GPU publishes).
const FRONT_DOOR_EVERY: u64 = 32;

impl<B: Backend> Producer<B>
where
    B::Exported: DeviceMemory,
{
    /// Captures the producer's frame graphs on `stream`: for each slot, a wait until every live consumer released
    /// the frame the slot held (bounded by `options.per_frame` and the abort word, raised when the producer is dropped),
    /// then what `record` queues for the slot (the application's kernels writing [`GraphSlot::span`]; they should
    /// do nothing when the frame state says the slot is not valid), then the frame's publish. Nothing runs now:
    /// launch them with [`Producer::launch_frame_graph`]. The wait is a kernel (under MPS) or a node of stream waits
    /// (without it), as `options.waits` says ([`crate::resident::GraphWaits`]).
    ///
    /// # Errors
    /// A strategy that does not register the control block ([`FrameError::StrategyUnavailable`]: use
    /// `gpu-stream-ops` or `gpu-poll`), a kernel or graphs still on the ring, `record`'s error, a capture error.
    pub fn capture_frame_graphs(
        &mut self,
        stream: &Stream,
        options: GraphOptions,
        record: impl FnMut(&GraphSlot<'_>, &Stream) -> Result<(), FrameError>,
    ) -> Result<FrameGraphs, FrameError> {
        let peer_abort = self.peer_abort_address();
        let user = ("frame graphs wait on", "create the producer");
        self.resident.open(peer_abort, self.strategy.kind(), user, stream)?;
        self.check_no_ring_kernel()?;
        let descriptor = self.ring_descriptor().ok_or_else(|| FrameError::Config("no ring descriptor".into()))?;
        let region = self.region.span();
        let bytes = self.config.slot_layout.bytes();
        let slots = (0..u64::from(self.config.slots))
            .map(|slot| region.slice(self.stride * slot, bytes))
            .collect::<Result<Vec<_>, _>>()?;
        let depth = run_ahead::depth_for(self.config.slots) as u64;
        graph::capture(
            stream.context(),
            stream,
            &PRODUCER_STEPS,
            &descriptor.to_words(),
            &slots,
            descriptor.abort,
            depth,
            self.config.max_consumers as usize,
            options,
            record,
        )
    }

    /// Launches the graph of the producer's next frames on `stream` (one `cuGraphLaunch` for
    /// [`FrameGraphs::frames_per_launch`] frames, after napping while the graphs launched are as far ahead of the GPU
    /// as the run-ahead bound allows) and returns the first frame's sequence. The frames queued on `stream` before the first launch go through it first. Every 32 frames the
    /// front door is served. The ring belongs to the graphs until [`Producer::finish_frame_graphs`] (`acquire`
    /// and `publish` refuse while they run).
    ///
    /// # Errors
    /// [`FrameError::GpuWaitGaveUp`] when a graph's wait for a slot gave up (a consumer held it past the timeout;
    /// nothing was published from that frame on: drop the producer), graphs another producer captured, a driver
    /// error.
    pub fn launch_frame_graph(&mut self, graphs: &mut FrameGraphs, stream: &Stream) -> Result<u64, FrameError> {
        let seq = self.next_seq.0;
        if seq % FRONT_DOOR_EVERY < graphs.frames_per_launch() {
            self.serve_front_door();
        }
        let Some(port) = self.resident.port.as_mut() else {
            return Err(FrameError::Config("no frame graphs were captured by this producer".into()));
        };
        let ring = &self.ring;
        let give_up = std::time::Instant::now() + graphs.per_frame();
        let mut for_frame = |frame: u64, wants: &mut Vec<_>| graph_waits::producer_wants(ring, frame, give_up, wants);
        let waits = LaunchWaits { control: self.sync.control_block(), for_frame: &mut for_frame };
        graph::launch(graphs, port, seq, stream, waits, |waited| FrameError::GpuWaitGaveUp {
            what: format!(
                "the consumers to release the slot of frame {seq} or one before it, in a frame graph \
                 (gpu_ipc_graph_acquire_slot); nothing was published from there on: create the producer again"
            ),
            waited,
        })?;
        self.next_seq = Sequence(seq + graphs.frames_per_launch());
        Ok(seq)
    }

    /// Waits, at most `timeout`, until the frame graphs launched have run (serving the front door meanwhile), and
    /// returns the producer's next sequence: `acquire` may be called again.
    ///
    /// # Errors
    /// [`FrameError::Timeout`] when they are still running, a driver error.
    pub fn finish_frame_graphs(&mut self, timeout: Duration) -> Result<u64, FrameError> {
        self.finish_ring_kernel(timeout)
    }
}
