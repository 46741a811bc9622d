//! Frame graphs: one CUDA graph per slot, captured once, holding the ring step that opens a frame (a consumer's wait
//! for it, a producer's wait for its slot), the application's own kernels for that slot, and the step that closes it
//! (release, publish). Each frame is then one `cuGraphLaunch`: no stream memory operation, no ring bookkeeping and
//! no launch of the application's kernels on the CPU per frame (docs/frames.md, "Frame graphs").
//!
//! A graph's kernel arguments are fixed when it is captured, so the frame it runs for lives in device memory: the
//! frame state (`struct gpu_ipc_graph_frame`, `kernels/cuda/gpu_ipc_ring.cuh`), which the opening step reads
//! (`sequence`) and marks (`valid`), and the closing step advances. The application's kernels read it through
//! [`GraphSlot::frame_state`]. The steps are the ring's device API (`kernels/cuda/ring_graph.cu`); they wait on the
//! GPU, bounded by the per-frame timeout and the side's abort word, so the side's waits are kernels, as with
//! `gpu-poll`: use them under MPS (without it a waiting kernel holds its context's time slice). Without MPS the
//! opening step is a batch memory operation node of stream waits instead, whose values the host sets at each launch,
//! then a kernel that judges the frame without polling ([`GraphWaits`], `graph_waits.rs`).

use std::time::{Duration, Instant};

use super::frame_state::{GraphFrameState, STATE_BYTES};
use super::graph_waits::{self, GraphWaits, WaitOn};
use super::ring_kernels::ring_module;
use super::ring_port::RingPort;
use crate::frames::FrameError;
use gpu_ipc_driver::{
    Context, DeviceBuffer, DeviceMemory, DeviceSpan, Function, Graph, KernelArg, LaunchConfig, MemOpBatch, MemOpNode,
    MemOpScratch, Module, Stream,
};

/// The shortest and the longest nap while the graphs launched are as far ahead of the GPU as allowed. Between them
/// a nap lasts as long as the frames it waits for should take at the pace the GPU went at since the last one: every
/// wake-up costs the CPU a few microseconds of system time, and a fixed 20 us nap (70 us with the kernel's timer
/// slack) woke it several times per frame of 4K.
const MIN_NAP: Duration = Duration::from_micros(20);
const MAX_NAP: Duration = Duration::from_millis(1);
/// A reading of the progress word older than this says nothing of the GPU's pace now (the application was away,
/// and the GPU may have waited for it): the measure starts again from the next reading.
const STALE_READING: Duration = Duration::from_millis(4);

/// The GPU's pace through a side's frame graphs, as the naps see it: nanoseconds per frame between two readings of
/// the progress word at which it had moved. A reading at which it had not moved keeps the older one: measuring
/// from it would time only the last nap, so that naps shorter than a frame would measure the pace as the nap's
/// own length and stay that short (the CPU then wakes several times per frame: 5.3-5.5 us of CPU per frame on
/// both sides of one frame-graph row of the bench where the others spent 0.8-1.9 us).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Pace {
    /// The progress word and when it was read, at the last reading at which it had moved.
    since: Option<(u64, Instant)>,
    /// Nanoseconds per frame between the last two such readings (0: not known yet).
    frame_ns: u64,
}

impl Pace {
    /// Takes a reading of the progress word.
    fn observe(&mut self, progress: u64, now: Instant) {
        match self.since {
            Some((before, at)) if now.saturating_duration_since(at) <= STALE_READING => {
                if progress > before {
                    let ns = u64::try_from(now.saturating_duration_since(at).as_nanos()).unwrap_or(u64::MAX);
                    self.frame_ns = ns / (progress - before);
                    self.since = Some((progress, now));
                }
            }
            _ => self.since = Some((progress, now)),
        }
    }

    /// How long to nap for `frames` frames at this pace, within [`MIN_NAP`, `MAX_NAP`].
    fn nap(&self, frames: u64) -> Duration {
        Duration::from_nanos(self.frame_ns.saturating_mul(frames)).clamp(MIN_NAP, MAX_NAP)
    }
}

/// How frame graphs are captured ([`crate::frames::Consumer::capture_frame_graphs`],
/// [`crate::frames::Producer::capture_frame_graphs`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GraphOptions {
    /// Bound on each ring step's wait on the GPU (the slot to come free, the frame to come).
    pub per_frame: Duration,
    /// Frames each graph holds, one after the other: `launch_frame_graph` launches that many frames with one
    /// `cuGraphLaunch`, so the CPU's cost per frame is divided by it (1 to 256; default 1). The side's frames then go
    /// in batches of this many: a consumer that stops in the middle of a batch has launched its rest, and a
    /// producer publishes whole batches.
    pub frames_per_launch: u32,
    /// How the opening steps wait: `None` (the default) chooses at capture by whether MPS runs
    /// ([`GraphWaits::for_device`]: kernels under MPS, stream-op nodes without); [`FrameGraphs::waits`] says which.
    pub waits: Option<GraphWaits>,
}

impl GraphOptions {
    /// One frame per launch, each wait bounded by `per_frame`, the waits chosen by whether MPS runs.
    pub fn new(per_frame: Duration) -> Self {
        Self { per_frame, frames_per_launch: 1, waits: None }
    }

    /// Waits of this kind, whether MPS runs or not (see [`GraphOptions::waits`]).
    #[must_use]
    pub fn waits(mut self, waits: GraphWaits) -> Self {
        self.waits = Some(waits);
        self
    }

    /// `frames` frames per launch (see [`GraphOptions::frames_per_launch`]).
    #[must_use]
    pub fn frames_per_launch(mut self, frames: u32) -> Self {
        self.frames_per_launch = frames;
        self
    }
}

/// Most frames one graph may hold.
const MAX_FRAMES_PER_LAUNCH: u32 = 256;

/// What the application's work for one slot gets while its graph is captured ([`crate::frames::Consumer::
/// capture_frame_graphs`], [`crate::frames::Producer::capture_frame_graphs`]). Launch kernels on the stream passed
/// with it; they run at each launch of the slot's graph.
#[derive(Debug, Clone, Copy)]
pub struct GraphSlot<'a> {
    /// The slot (0..N) the graph is for.
    pub slot: u32,
    /// The slot's frame: what the consumer's kernels read, the producer's write.
    pub span: DeviceSpan<'a>,
    /// The frame state (32 bytes of device memory, `struct gpu_ipc_graph_frame` of `gpu_ipc_ring.cuh`): word 0 the
    /// sequence of the frame the launch is for, word 1 non-zero when the slot may be used (0: the wait gave up, or
    /// the frame's stamp is not the producer's: do not read or write the slot). Pass it to kernels that need either
    /// (the kernels crate's `gpu_ipc_fill_pattern_at` and `gpu_ipc_verify_pattern_at` do).
    pub frame_state: DeviceSpan<'a>,
}

/// The graphs of one side of one ring, from `capture_frame_graphs`: launch them in order with the same side's
/// `launch_frame_graph`.
pub struct FrameGraphs {
    graphs: Vec<Graph>,
    /// The ring's program the graphs' steps come from: unloaded after them.
    _module: Module,
    state: DeviceBuffer,
    _descriptor: DeviceBuffer,
    /// The abort word's address of the side that captured them: whose graphs these are.
    owner: u64,
    /// The sequence the frame state holds once every graph launched so far has run.
    next: Option<u64>,
    /// Frames allowed in flight.
    depth: u64,
    per_frame: Duration,
    /// Frames each graph holds.
    frames_per_launch: u64,
    /// The GPU's pace, as the naps saw it.
    pace: Pace,
    /// How the opening steps wait.
    waits: GraphWaits,
    /// With stream-op waits: per graph, the wait node of each of its frames, in order.
    wait_nodes: Vec<Vec<MemOpNode>>,
    /// Waits in each frame's node (with stream-op waits).
    waits_per_frame: usize,
    scratch: MemOpScratch,
    wants: Vec<WaitOn>,
}

impl std::fmt::Debug for FrameGraphs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FrameGraphs").field("slots", &self.graphs.len()).field("next", &self.next).finish()
    }
}

impl FrameGraphs {
    /// One graph per slot (the slot of the first frame it holds).
    pub fn slots(&self) -> usize {
        self.graphs.len()
    }

    /// Frames each launch runs ([`GraphOptions::frames_per_launch`]).
    pub fn frames_per_launch(&self) -> u64 {
        self.frames_per_launch
    }

    /// Bound on each wait ([`GraphOptions::per_frame`]).
    pub fn per_frame(&self) -> Duration {
        self.per_frame
    }

    /// How the graphs' opening steps wait (chosen at capture, see [`GraphOptions::waits`]).
    pub fn waits(&self) -> GraphWaits {
        self.waits
    }

    /// The frame state's counter of frames a consumer's graphs skipped (their wait gave up or their stamp was not
    /// the producer's: a dead producer's). Read it once the graphs are finished (a synchronous copy).
    ///
    /// # Errors
    /// A driver error.
    pub fn skipped(&self) -> Result<u64, FrameError> {
        let mut words = [0u64; GraphFrameState::WORDS];
        self.state.read(0, &mut words)?;
        Ok(words[std::mem::offset_of!(GraphFrameState, skipped) / 8])
    }
}

/// The ring steps of a side, from the ring's program, and the threads of the opening one.
pub(super) struct Steps {
    pub open: &'static str,
    pub close: &'static str,
    pub open_threads: u32,
    /// With stream-op waits: the step after the wait node that judges the frame (one thread, no polling).
    pub check: &'static str,
}

/// Consumer: wait for the frame, check its stamp; release it.
pub(super) const CONSUMER_STEPS: Steps = Steps {
    open: "gpu_ipc_graph_wait_frame",
    close: "gpu_ipc_graph_release_frame",
    open_threads: 1,
    check: "gpu_ipc_graph_check_frame",
};
/// Producer: wait for the slot (one warp); publish.
pub(super) const PRODUCER_STEPS: Steps = Steps {
    open: "gpu_ipc_graph_acquire_slot",
    close: "gpu_ipc_graph_publish_frame",
    open_threads: 32,
    check: "gpu_ipc_graph_mark_slot",
};

/// Captures one graph per slot: for each of `options.frames_per_launch` frames from that slot on, `steps.open`, then
/// what `record` queues for the frame's slot, then `steps.close`. `descriptor` is the side's descriptor (its words,
/// copied to device memory), `slots` each slot's frame, `owner` the side's abort-word address, `depth` the frames
/// allowed in flight, `waits_per_frame` the stream waits a frame may need (with stream-op waits: 1 for a consumer,
/// the ring's consumer records for a producer).
#[allow(clippy::too_many_arguments)]
pub(super) fn capture<'a>(
    ctx: &Context,
    stream: &Stream,
    steps: &Steps,
    descriptor: &[u64],
    slots: &[DeviceSpan<'a>],
    owner: u64,
    depth: u64,
    waits_per_frame: usize,
    options: GraphOptions,
    mut record: impl FnMut(&GraphSlot<'_>, &Stream) -> Result<(), FrameError>,
) -> Result<FrameGraphs, FrameError> {
    let GraphOptions { per_frame, frames_per_launch, waits } = options;
    if !(1..=MAX_FRAMES_PER_LAUNCH).contains(&frames_per_launch) {
        return Err(FrameError::Config(format!(
            "frames per launch must be 1 to {MAX_FRAMES_PER_LAUNCH}, not {frames_per_launch}"
        )));
    }
    let waits = waits.unwrap_or_else(|| GraphWaits::for_device(ctx.device()));
    waits.check(ctx.device())?;
    if waits == GraphWaits::StreamOps && !(1..=gpu_ipc_driver::MAX_OPS_PER_CALL).contains(&waits_per_frame) {
        return Err(FrameError::Config(format!(
            "frame graphs with stream-op waits take rings of 1 to {} consumers, not {waits_per_frame}",
            gpu_ipc_driver::MAX_OPS_PER_CALL
        )));
    }
    let n = slots.len() as u32;
    let module = ring_module(ctx, "frame graphs")?;
    let (open, close): (Function, Function) = (module.function(steps.open)?, module.function(steps.close)?);
    let check = module.function(steps.check)?;
    let device_descriptor = DeviceBuffer::alloc(ctx, 8 * descriptor.len() as u64)?;
    device_descriptor.write(0, descriptor)?;
    let state = DeviceBuffer::alloc(ctx, STATE_BYTES)?;
    state.write(0, &GraphFrameState::default().to_words())?;
    let timeout_ns = u64::try_from(per_frame.as_nanos()).unwrap_or(u64::MAX);
    let mut graphs = Vec::with_capacity(slots.len());
    let mut wait_nodes = Vec::new();
    let mut scratch = MemOpScratch::default();
    for first in 0..n {
        let mut nodes = Vec::new();
        let graph = Graph::capture_with_nodes(stream, |capture| -> Result<(), FrameError> {
            let (d, st) = (device_descriptor.span(), state.span());
            for slot in (first..first + frames_per_launch).map(|k| k % n) {
                let s = capture.stream();
                match waits {
                    GraphWaits::Kernels => {
                        let args = [
                            KernelArg::Span(d),
                            KernelArg::Span(st),
                            KernelArg::U64(u64::from(slot)),
                            KernelArg::U64(timeout_ns),
                        ];
                        open.launch_typed(s, LaunchConfig::linear(1, steps.open_threads), &args)?;
                    }
                    GraphWaits::StreamOps => {
                        // Waits that hold at once until the host sets them before a launch.
                        let mut batch = MemOpBatch::new(&mut scratch);
                        graph_waits::frame_waits(&mut batch, &[], waits_per_frame, &st, &st)?;
                        nodes.push(capture.add_mem_ops(&batch)?);
                        let s = capture.stream();
                        let args = [KernelArg::Span(d), KernelArg::Span(st), KernelArg::U64(u64::from(slot))];
                        check.launch_typed(s, LaunchConfig::linear(1, 1), &args)?;
                    }
                }
                let s = capture.stream();
                record(&GraphSlot { slot, span: slots[slot as usize], frame_state: st }, s)?;
                close.launch_typed(s, LaunchConfig::linear(1, 1), &[KernelArg::Span(d), KernelArg::Span(st)])?;
            }
            Ok(())
        })?;
        graphs.push(graph);
        wait_nodes.push(nodes);
    }
    tracing::debug!(slots = n, frames_per_launch, waits = waits.name(), "frame graphs captured");
    Ok(FrameGraphs {
        graphs,
        _module: module,
        state,
        _descriptor: device_descriptor,
        owner,
        next: None,
        depth: depth.max(2 * u64::from(frames_per_launch)),
        per_frame,
        frames_per_launch: u64::from(frames_per_launch),
        pace: Pace::default(),
        waits,
        wait_nodes,
        waits_per_frame,
        scratch,
        wants: Vec::new(),
    })
}

/// What a side's launch needs for stream-op waits: its registration of the control block (the words waited on)
/// and the waits of each frame, computed as the graph is launched (`graph_waits::consumer_wants`,
/// `graph_waits::producer_wants`).
pub(super) struct LaunchWaits<'a, 'f> {
    pub control: Option<DeviceSpan<'a>>,
    pub for_frame: &'f mut FrameWants<'f>,
}

/// Computes the waits of frame `seq` into the vector (cleared first).
pub(super) type FrameWants<'f> = dyn FnMut(u64, &mut Vec<WaitOn>) -> Result<(), FrameError> + 'f;

/// Launches the graph whose first frame is `seq` (it holds `frames_per_launch` frames) on `stream` after checking that `graphs` are this side's and that the GPU is
/// no more than the depth behind (napping until it is, at most the per-frame timeout), then records the port's
/// event after it. `gave_up` makes the error for a raised abort word (the side's peer died, or a step gave up).
/// With stream-op waits, each frame's wait node is set first from `waits`.
pub(super) fn launch(
    graphs: &mut FrameGraphs,
    port: &mut RingPort,
    seq: u64,
    stream: &Stream,
    waits: LaunchWaits<'_, '_>,
    gave_up: impl FnOnce(Duration) -> FrameError,
) -> Result<(), FrameError> {
    if graphs.owner != port.word_addresses().0 {
        return Err(FrameError::ForeignToken {
            token: "frame graphs",
            problem: "they were captured by another producer or consumer".into(),
        });
    }
    if port.aborted() {
        return Err(gave_up(graphs.per_frame));
    }
    if graphs.next != Some(seq) {
        // The first launch, or frames taken on the CPU since: the frame state starts again from `seq`, which needs
        // the graphs launched before to be done.
        if port.busy()? {
            return Err(FrameError::Config(
                "frames were taken on the CPU while frame graphs were in flight: finish_frame_graphs first".into(),
            ));
        }
        graphs.state.write(0, &[seq, 0])?;
        port.set_progress(seq);
    }
    // At the bound, nap until half the depth is through (as the run-ahead of gpu-stream-ops does): the CPU then
    // wakes once per half depth of frames, not once per frame (a nap costs it a few microseconds of system time),
    // and the GPU still holds half the depth of launched frames meanwhile.
    let deadline = Instant::now() + graphs.per_frame;
    let bound = if seq.saturating_sub(port.progress()) >= graphs.depth { graphs.depth / 2 } else { graphs.depth };
    while seq.saturating_sub(port.progress()) >= bound.max(1) {
        if port.aborted() {
            return Err(gave_up(graphs.per_frame));
        }
        if Instant::now() >= deadline {
            return Err(FrameError::Timeout {
                what: format!("frame {} to go through the frame graphs", seq - graphs.depth),
                waited: graphs.per_frame,
            });
        }
        let progress = port.progress();
        graphs.pace.observe(progress, Instant::now());
        let frames = (seq + 1).saturating_sub(bound).saturating_sub(progress).max(1);
        std::thread::sleep(graphs.pace.nap(frames));
    }
    let slot = (seq % graphs.graphs.len() as u64) as usize;
    if graphs.waits == GraphWaits::StreamOps {
        set_waits(graphs, slot, seq, waits)?;
    }
    graphs.graphs[slot].launch(stream)?;
    // The port's event after each launch: what `busy`, `finish` and teardown wait for. (A record node captured in
    // the graphs would spare the CPU this call, but the driver refuses `cuEventQuery` on an event whose last record
    // was captured: CUDA_ERROR_INVALID_VALUE, H100, driver 580.)
    port.record(stream)?;
    graphs.next = Some(seq + graphs.frames_per_launch);
    Ok(())
}

/// Sets the wait node of each frame of graph `slot` (its first frame `seq`) from the waits the side computes now.
fn set_waits(graphs: &mut FrameGraphs, slot: usize, seq: u64, waits: LaunchWaits<'_, '_>) -> Result<(), FrameError> {
    let FrameGraphs { graphs, state, wait_nodes, waits_per_frame, scratch, wants, .. } = graphs;
    let control =
        waits.control.ok_or_else(|| FrameError::Config("no control block registered for the device".into()))?;
    let always_met = state.span();
    for (k, &node) in wait_nodes[slot].iter().enumerate() {
        (waits.for_frame)(seq + k as u64, wants)?;
        let mut batch = MemOpBatch::new(scratch);
        graph_waits::frame_waits(&mut batch, wants, *waits_per_frame, &control, &always_met)?;
        graphs[slot].set_mem_ops(node, &batch)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_pace_is_measured_between_readings_at_which_the_progress_moved() {
        let t0 = Instant::now();
        let at = |us: u64| t0 + Duration::from_micros(us);
        let mut pace = Pace::default();
        assert_eq!(pace.nap(4), MIN_NAP, "not known yet: the shortest nap");
        pace.observe(100, at(0));
        // Frames of 20 us, read every 5 us: the readings at which nothing moved do not shorten the measure.
        for reading in 1..=3 {
            pace.observe(100, at(5 * reading));
            assert_eq!(pace.frame_ns, 0);
        }
        pace.observe(101, at(20));
        assert_eq!(pace.frame_ns, 20_000);
        pace.observe(101, at(25));
        pace.observe(101, at(35));
        pace.observe(102, at(40));
        assert_eq!(pace.frame_ns, 20_000, "measured from the reading at 20 us, not from the one at 35 us");
        pace.observe(106, at(120));
        assert_eq!(pace.frame_ns, 20_000);
        assert_eq!(pace.nap(4), Duration::from_micros(80));
        assert_eq!(pace.nap(1_000), MAX_NAP);
        // A reading long after the last says nothing of the pace: the measure starts again from it.
        pace.observe(200, at(120 + 10_000));
        assert_eq!(pace.frame_ns, 20_000);
        pace.observe(202, at(120 + 10_060));
        assert_eq!(pace.frame_ns, 30_000);
    }
}
