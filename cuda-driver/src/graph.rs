//! CUDA graphs captured from a stream: a sequence of launches and stream operations recorded once and launched
//! again and again with one call (`cuGraphLaunch`), which costs the CPU far less than queueing each piece.

use super::context::Context;
use super::error::{DriverError, Result};
use super::loader::{Driver, entry, release_quietly};
use super::stream::Stream;
use super::sys;

/// An instantiated graph (`CUgraphExec`); destroyed on drop (the driver lets work already launched finish).
pub struct Graph {
    _ctx: Context,
    exec: sys::CUgraphExec,
}

// SAFETY: a CUgraphExec may be launched from any thread whose current context owns it; the driver serialises it.
unsafe impl Send for Graph {}
// SAFETY: every method passes the handle to thread-safe driver calls only.
unsafe impl Sync for Graph {}

impl std::fmt::Debug for Graph {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Graph").field("exec", &self.exec).finish()
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
        let ctx = stream.context().clone();
        ctx.bind()?;
        let d = Driver::get()?;
        let begin = entry!(d, cuStreamBeginCapture_v2, "cuStreamBeginCapture")?;
        let end = entry!(d, cuStreamEndCapture, "cuStreamEndCapture")?;
        // SAFETY: the stream is alive for the borrow; the mode is one of the enum's values.
        d.check("cuStreamBeginCapture", unsafe { begin(stream.raw(), sys::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL) })?;
        let recorded = record(stream);
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
        Ok(Self { _ctx: ctx, exec })
    }

    /// Launches the graph on `stream`: after the work queued there so far, like a kernel.
    ///
    /// # Errors
    /// A failing `cuGraphLaunch`.
    pub fn launch(&self, stream: &Stream) -> Result<()> {
        let d = Driver::get()?;
        let f = entry!(d, cuGraphLaunch, "cuGraphLaunch")?;
        // SAFETY: both handles are alive for the borrows.
        d.check("cuGraphLaunch", unsafe { f(self.exec, stream.raw()) })
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

/// The graph a capture made, destroyed once instantiated (or when the capture failed).
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
