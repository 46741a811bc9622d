//! A consumer's frame graphs (`crate::resident::graph`): one graph per slot that waits for the frame and checks its
//! stamp, runs the application's kernels on it, and releases it; one `cuGraphLaunch` per frame.

use std::time::Duration;

use super::graph::{self, CONSUMER_STEPS, FrameGraphs, GraphOptions, GraphSlot, LaunchWaits};
use super::{graph_waits, run_ahead};
use crate::backend::Backend;
use crate::frames::{Consumer, FrameError};
use gpu_ipc_driver::{DeviceMemory, Stream};

impl<B: Backend> Consumer<B>
where
    B::Imported: DeviceMemory,
{
    /// Captures the consumer's frame graphs on `stream`: for each slot, a wait for the frame (bounded by
    /// `options.per_frame` and the abort word the watchdog raises when the producer dies) that checks its stamp, then what
    /// `record` queues for the slot (the application's kernels reading [`GraphSlot::span`]; they should do nothing
    /// when the frame state says the frame is not valid), then the frame's release. Nothing runs now: launch them
    /// with [`Consumer::launch_frame_graph`]. The wait is a kernel (under MPS) or a stream wait node (without it), as
    /// `options.waits` says ([`crate::resident::GraphWaits`]).
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
        let user = ("frame graphs wait on", "start the producer");
        self.resident.open(peer_abort, self.offer.sync, user, stream)?;
        self.check_no_ring_kernel()?;
        let descriptor = self.ring_descriptor().ok_or_else(|| FrameError::Config("no ring descriptor".into()))?;
        let owner = descriptor.abort;
        let region = self.region.span();
        let (offset, stride, bytes) =
            (self.offer.data_offset, self.offer.slot_stride_bytes, self.offer.slot_layout.bytes());
        let slots = (0..u64::from(self.offer.slot_count))
            .map(|slot| region.slice(offset + stride * slot, bytes))
            .collect::<Result<Vec<_>, _>>()?;
        let depth = run_ahead::depth_for(self.offer.slot_count) as u64;
        graph::capture(
            stream.context(),
            stream,
            &CONSUMER_STEPS,
            &descriptor.to_words(),
            &slots,
            owner,
            depth,
            1,
            options,
            record,
        )
    }

    /// Launches the graph of the consumer's next frames on `stream` (one `cuGraphLaunch` for
    /// [`FrameGraphs::frames_per_launch`] frames, after napping while the graphs launched are as far ahead of the GPU
    /// as the run-ahead bound allows) and returns the first frame's sequence. The frames belong to the graphs until [`Consumer::finish_frame_graphs`] (`next_frame` refuses
    /// while they run).
    ///
    /// # Errors
    /// [`FrameError::ProducerGone`] once the producer died; [`FrameError::GpuWaitGaveUp`] when a graph's wait
    /// gave up (the frames from then on were not read; the consumer cannot go on); graphs another consumer
    /// captured; a driver error.
    pub fn launch_frame_graph(&mut self, graphs: &mut FrameGraphs, stream: &Stream) -> Result<u64, FrameError> {
        let seq = self.next_seq;
        let Some(port) = self.resident.port.as_mut() else {
            return Err(FrameError::Config("no frame graphs were captured by this consumer".into()));
        };
        let ring = &self.shared.ring;
        let mut for_frame = |frame: u64, wants: &mut Vec<_>| {
            graph_waits::consumer_wants(ring, frame, wants);
            Ok(())
        };
        let waits = LaunchWaits { control: self.sync.control_block(), for_frame: &mut for_frame };
        let launched = graph::launch(graphs, port, seq, stream, waits, |waited| FrameError::GpuWaitGaveUp {
            what: format!("frame {seq} or one before it, in a frame graph (gpu_ipc_graph_wait_frame)"),
            waited,
        });
        if let Err(FrameError::GpuWaitGaveUp { .. }) = &launched {
            // The abort word is also raised when the producer hangs up (after the watchdog recorded it): say why, the
            // end of the stream first.
            if let Some(end) = self.shared.ring.closed_after()
                && seq >= end.0
            {
                return Err(FrameError::EndOfStream { published: end.0, past_end: None });
            }
            self.check_producer()?;
        }
        launched?;
        self.next_seq = seq + graphs.frames_per_launch();
        Ok(seq)
    }

    /// Waits, at most `timeout`, until the frame graphs launched have run, and returns the consumer's next
    /// sequence: `next_frame` may be called again.
    ///
    /// # Errors
    /// [`FrameError::Timeout`] when they are still running, a driver error.
    pub fn finish_frame_graphs(&mut self, timeout: Duration) -> Result<u64, FrameError> {
        self.finish_ring_kernel(timeout)
    }
}
