//! CUDA graphs captured from a stream: a sequence of launches and stream operations recorded once and launched
//! again and again with one call (`cuGraphLaunch`), which costs the CPU far less than queueing each piece.
//!
//! A capture may also add **batch memory operation nodes** (`cuGraphAddBatchMemOpNode`, CUDA 11.7+): 64-bit waits
//! and writes on words, as `cuStreamBatchMemOp` queues them, whose values and addresses can be changed in the
//! instantiated graph between launches ([`Graph::set_mem_ops`], `cuGraphExecBatchMemOpNodeSetParams`). A wait node
//! holds the graph's later nodes in the GPU's front end: no kernel spins, so it works when processes time-slice
//! (no MPS).

use super::batch::{MAX_OPS_PER_CALL, MemOp, MemOpBatch};
use super::context::Context;
use super::error::{DriverError, Result};
use super::loader::{Driver, entry, release_quietly};
use super::stream::Stream;
use super::sys;

/// An instantiated graph (`CUgraphExec`); destroyed on drop (the driver lets work already launched finish).
pub struct Graph {
    ctx: Context,
    exec: sys::CUgraphExec,
    /// The graph it was instantiated from: kept while the batch memory operation nodes may be changed (the node
    /// handles `cuGraphExecBatchMemOpNodeSetParams` takes belong to it). Dropped after `exec` (field order).
    _graph: CapturedGraph,
    /// The batch memory operation nodes the capture added, with their count of operations, in the order added.
    mem_op_nodes: Vec<(sys::CUgraphNode, usize)>,
}

// SAFETY: a CUgraphExec may be launched from any thread whose current context owns it; the driver serialises it.
// The node handles are only passed to the driver, with `&mut self` when they change the graph.
unsafe impl Send for Graph {}
// SAFETY: every `&self` method passes the handle to thread-safe driver calls only (`cuGraphLaunch`).
unsafe impl Sync for Graph {}

impl std::fmt::Debug for Graph {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Graph").field("exec", &self.exec).field("mem_op_nodes", &self.mem_op_nodes.len()).finish()
    }
}

/// A batch memory operation node of a [`Graph`]: its index among the nodes [`GraphCapture::add_mem_ops`] added.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct MemOpNode(usize);

/// A stream being captured into a graph ([`Graph::capture_with_nodes`]): queue work on [`GraphCapture::stream`],
/// add batch memory operation nodes with [`GraphCapture::add_mem_ops`].
#[derive(Debug)]
pub struct GraphCapture<'s> {
    stream: &'s Stream,
    nodes: Vec<(sys::CUgraphNode, usize)>,
}

impl GraphCapture<'_> {
    /// The stream being captured: what is queued on it becomes the graph's next nodes.
    pub fn stream(&self) -> &Stream {
        self.stream
    }

    /// Adds one batch memory operation node after what was captured so far (`cuStreamGetCaptureInfo`,
    /// `cuGraphAddBatchMemOpNode`, then `cuStreamUpdateCaptureDependencies`: the work queued next depends on it).
    /// Its operations run in order at each launch; change their values with [`Graph::set_mem_ops`]. The count and
    /// kind of each operation are fixed here.
    ///
    /// # Errors
    /// An empty batch or one of more than [`MAX_OPS_PER_CALL`] operations
    /// ([`DriverError::InvalidArgument`]); a stream that is not capturing; a driver that refuses the node
    /// (`CUDA_ERROR_NOT_SUPPORTED` on a device without stream memory operations, or before CUDA 11.7).
    pub fn add_mem_ops(&mut self, batch: &MemOpBatch<'_>) -> Result<MemOpNode> {
        let ops = batch.ops();
        check_count(ops.len(), "cuGraphAddBatchMemOpNode")?;
        let d = Driver::get()?;
        let info = entry!(d, cuStreamGetCaptureInfo_v2, "cuStreamGetCaptureInfo")?;
        let add = entry!(d, cuGraphAddBatchMemOpNode, "cuGraphAddBatchMemOpNode")?;
        let update = entry!(d, cuStreamUpdateCaptureDependencies, "cuStreamUpdateCaptureDependencies")?;
        let mut status: sys::CUstreamCaptureStatus = sys::CU_STREAM_CAPTURE_STATUS_NONE;
        let mut graph: sys::CUgraph = std::ptr::null_mut();
        let mut deps: *const sys::CUgraphNode = std::ptr::null();
        let mut count = 0usize;
        // SAFETY: the stream is alive for the borrow; every out-pointer is a valid local; the id is not asked for.
        d.check("cuStreamGetCaptureInfo", unsafe {
            info(self.stream.raw(), &mut status, std::ptr::null_mut(), &mut graph, &mut deps, &mut count)
        })?;
        if status != sys::CU_STREAM_CAPTURE_STATUS_ACTIVE || graph.is_null() {
            return Err(DriverError::InvalidArgument {
                function: "cuGraphAddBatchMemOpNode",
                problem: "the stream is not capturing a graph".into(),
            });
        }
        let mut raw: Vec<sys::CUstreamBatchMemOpParams> = ops.iter().map(|op| op.raw()).collect();
        let params = node_params(self.stream.context(), &mut raw);
        let mut node: sys::CUgraphNode = std::ptr::null_mut();
        // SAFETY: `graph` is the graph being captured (the driver's answer above), `deps` its `count` current
        // dependencies (valid until the next call on the stream, which this is not); `params` points at `raw`,
        // alive for the call (the driver copies it). The addresses were checked by `MemOpBatch` to be aligned words
        // inside spans; only the GPU dereferences them, at each launch (their memory is the owner's to keep alive).
        d.check("cuGraphAddBatchMemOpNode", unsafe { add(&mut node, graph, deps, count, &params) })?;
        // SAFETY: the stream is capturing; `node` is a node of its graph, one element.
        d.check("cuStreamUpdateCaptureDependencies", unsafe {
            update(self.stream.raw(), &mut node, 1, sys::CU_STREAM_SET_CAPTURE_DEPENDENCIES)
        })?;
        self.nodes.push((node, ops.len()));
        Ok(MemOpNode(self.nodes.len() - 1))
    }
}

fn check_count(count: usize, function: &'static str) -> Result<()> {
    if count == 0 || count > MAX_OPS_PER_CALL {
        return Err(DriverError::InvalidArgument {
            function,
            problem: format!("a batch memory operation node holds 1 to {MAX_OPS_PER_CALL} operations, not {count}"),
        });
    }
    Ok(())
}

/// The node parameters over `raw` (which must outlive their use).
fn node_params(ctx: &Context, raw: &mut [sys::CUstreamBatchMemOpParams]) -> sys::CUDA_BATCH_MEM_OP_NODE_PARAMS {
    sys::CUDA_BATCH_MEM_OP_NODE_PARAMS {
        ctx: ctx.as_raw(),
        // At most MAX_OPS_PER_CALL (checked by the callers), so the count fits.
        count: raw.len() as u32,
        paramArray: raw.as_mut_ptr(),
        flags: 0,
    }
}

impl Graph {
    /// Captures what `record` queues on `stream` (`cuStreamBeginCapture`, thread-local mode: this thread must not
    /// make unsafe calls such as a synchronisation meanwhile) and instantiates it. Nothing runs during the capture:
    /// the work runs at each [`Graph::launch`]. The capture is ended even when `record` fails.
    ///
    /// # Errors
    /// `record`'s error; a failing capture or instantiation (a call the capture does not allow, such as a
    /// synchronous copy or a legacy default stream).
    pub fn capture<E: From<DriverError>>(
        stream: &Stream,
        record: impl FnOnce(&Stream) -> std::result::Result<(), E>,
    ) -> std::result::Result<Self, E> {
        Self::capture_with_nodes(stream, |capture| record(capture.stream()))
    }

    /// As [`Graph::capture`], with batch memory operation nodes: `record` gets the [`GraphCapture`], queues work on
    /// its stream and adds nodes with [`GraphCapture::add_mem_ops`] (whose values [`Graph::set_mem_ops`] changes
    /// between launches).
    ///
    /// # Errors
    /// As [`Graph::capture`].
    pub fn capture_with_nodes<E: From<DriverError>>(
        stream: &Stream,
        record: impl FnOnce(&mut GraphCapture<'_>) -> std::result::Result<(), E>,
    ) -> std::result::Result<Self, E> {
        let ctx = stream.context().clone();
        let _entered = ctx.enter()?;
        let d = Driver::get()?;
        let begin = entry!(d, cuStreamBeginCapture_v2, "cuStreamBeginCapture")?;
        let end = entry!(d, cuStreamEndCapture, "cuStreamEndCapture")?;
        // SAFETY: the stream is alive for the borrow; the mode is one of the enum's values.
        d.check("cuStreamBeginCapture", unsafe { begin(stream.raw(), sys::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL) })?;
        let mut capture = GraphCapture { stream, nodes: Vec::new() };
        let recorded = record(&mut capture);
        let mut graph: sys::CUgraph = std::ptr::null_mut();
        // SAFETY: the stream is capturing (begun above); the out-pointer is a valid local.
        let ended = d.check("cuStreamEndCapture", unsafe { end(stream.raw(), &mut graph) });
        let graph = CapturedGraph(graph);
        recorded?;
        ended?;
        let instantiate = entry!(d, cuGraphInstantiateWithFlags, "cuGraphInstantiateWithFlags")?;
        let mut exec: sys::CUgraphExec = std::ptr::null_mut();
        // SAFETY: `graph.0` is the graph the capture made (non-null when it succeeded); the out-pointer is a local.
        d.check("cuGraphInstantiateWithFlags", unsafe { instantiate(&mut exec, graph.0, 0) })?;
        Ok(Self { ctx, exec, _graph: graph, mem_op_nodes: capture.nodes })
    }

    /// Launches the graph on `stream`: after the work queued there so far, like a kernel.
    ///
    /// # Errors
    /// A failing `cuGraphLaunch`.
    pub fn launch(&self, stream: &Stream) -> Result<()> {
        // In the stream's context (the legacy default stream is the current context's), and the caller's back after.
        let _entered = stream.context().enter()?;
        let d = Driver::get()?;
        let f = entry!(d, cuGraphLaunch, "cuGraphLaunch")?;
        // SAFETY: both handles are alive for the borrows.
        d.check("cuGraphLaunch", unsafe { f(self.exec, stream.raw()) })
    }

    /// Changes the operations of batch memory operation node `node` for the launches from now on
    /// (`cuGraphExecBatchMemOpNodeSetParams`; launches already queued keep theirs): `batch` must hold as many
    /// operations as the node, each of the same kind (a wait stays a wait), with new addresses, values or
    /// conditions.
    ///
    /// # Errors
    /// An unknown node, a batch of another count or kinds ([`DriverError::InvalidArgument`]); a failing call.
    pub fn set_mem_ops(&mut self, node: MemOpNode, batch: &MemOpBatch<'_>) -> Result<()> {
        const F: &str = "cuGraphExecBatchMemOpNodeSetParams";
        let &(raw_node, count) = self.mem_op_nodes.get(node.0).ok_or_else(|| DriverError::InvalidArgument {
            function: F,
            problem: format!(
                "node {} of a graph with {} batch memory operation nodes",
                node.0,
                self.mem_op_nodes.len()
            ),
        })?;
        if batch.len() != count {
            return Err(DriverError::InvalidArgument {
                function: F,
                problem: format!("{} operations for a node of {count}: the count is fixed at capture", batch.len()),
            });
        }
        let d = Driver::get()?;
        let f = entry!(d, cuGraphExecBatchMemOpNodeSetParams, "cuGraphExecBatchMemOpNodeSetParams")?;
        let mut on_stack = [sys::CUstreamBatchMemOpParams { pad: [0; 6] }; 8];
        let mut on_heap = Vec::new();
        let raw: &mut [sys::CUstreamBatchMemOpParams] = if count <= on_stack.len() {
            &mut on_stack[..count]
        } else {
            on_heap.extend(batch.ops().iter().map(|op: &MemOp| op.raw()));
            &mut on_heap[..]
        };
        for (param, op) in raw.iter_mut().zip(batch.ops()) {
            *param = op.raw();
        }
        let params = node_params(&self.ctx, raw);
        // SAFETY: `exec` was instantiated from `_graph`, which is alive and holds `raw_node`; `params` points at
        // `raw`, alive for the call (the driver copies it); the addresses were checked by `MemOpBatch`, and only
        // the GPU dereferences them. `&mut self`: no other call changes this graph meanwhile.
        d.check(F, unsafe { f(self.exec, raw_node, &params) })
    }

    /// How many batch memory operation nodes the capture added.
    pub fn mem_op_nodes(&self) -> usize {
        self.mem_op_nodes.len()
    }
}

impl Drop for Graph {
    fn drop(&mut self) {
        release_quietly("destroying a graph", |d| {
            let f = entry!(d, cuGraphExecDestroy, "cuGraphExecDestroy")?;
            // SAFETY: the executable graph was instantiated by us and is destroyed exactly once, here.
            d.check("cuGraphExecDestroy", unsafe { f(self.exec) })
        });
    }
}

/// The graph a capture made, destroyed when its [`Graph`] is (or when the capture failed).
struct CapturedGraph(sys::CUgraph);

impl Drop for CapturedGraph {
    fn drop(&mut self) {
        if self.0.is_null() {
            return;
        }
        release_quietly("destroying a captured graph", |d| {
            let f = entry!(d, cuGraphDestroy, "cuGraphDestroy")?;
            // SAFETY: the graph came from cuStreamEndCapture and is destroyed exactly once, here.
            d.check("cuGraphDestroy", unsafe { f(self.0) })
        });
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn a_node_holds_one_to_255_operations() {
        assert!(check_count(1, "f").is_ok());
        assert!(check_count(MAX_OPS_PER_CALL, "f").is_ok());
        for bad in [0, MAX_OPS_PER_CALL + 1] {
            let err = check_count(bad, "cuGraphAddBatchMemOpNode").unwrap_err();
            assert!(matches!(err, DriverError::InvalidArgument { function: "cuGraphAddBatchMemOpNode", .. }), "{err}");
        }
    }

    #[test]
    #[ignore = "needs a CUDA GPU"]
    fn a_graph_waits_on_its_mem_op_node_with_the_values_set_before_each_launch() {
        use super::super::{DeviceBuffer, DeviceMemory, MemOpScratch, WaitCondition};
        let ctx = Context::for_ordinal(0).unwrap();
        let stream = Stream::new(&ctx).unwrap();
        let words = DeviceBuffer::alloc(&ctx, 32).unwrap();
        words.write(0, &[0u64; 4]).unwrap();
        let span = words.span();
        let mut scratch = MemOpScratch::default();
        // Per launch: wait until word 0 >= v, then word 1 = v (both set before the launch).
        let mut graph = Graph::capture_with_nodes(&stream, |capture| -> Result<()> {
            let mut batch = MemOpBatch::new(&mut scratch);
            batch.wait_u64(&span, 0, 0, WaitCondition::AtLeast)?.write_u64(&span, 8, 0)?;
            capture.add_mem_ops(&batch)?;
            Ok(())
        })
        .unwrap();
        assert_eq!(graph.mem_op_nodes(), 1);
        for v in 1..=3u64 {
            let mut batch = MemOpBatch::new(&mut scratch);
            batch.wait_u64(&span, 0, v, WaitCondition::AtLeast).unwrap().write_u64(&span, 8, v).unwrap();
            graph.set_mem_ops(MemOpNode(0), &batch).unwrap();
            graph.launch(&stream).unwrap();
            std::thread::sleep(std::time::Duration::from_millis(20));
            let mut back = [0u64; 2];
            words.read(0, &mut back).unwrap();
            assert_eq!(back[1], v - 1, "launch {v} waits for word 0");
            words.write(0, &[v]).unwrap();
            stream.synchronize().unwrap();
            words.read(0, &mut back).unwrap();
            assert_eq!(back, [v, v]);
        }
        let batch = MemOpBatch::new(&mut scratch);
        assert!(graph.set_mem_ops(MemOpNode(0), &batch).is_err(), "the count is fixed");
    }
}
