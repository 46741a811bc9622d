//! Bounds how far the CPU may queue GPU-side work ahead of the GPU (the `GpuStreamOps` strategy), so a producer
//! or consumer never queues an unbounded number of frames behind a stream wait.

use crate::driver::{Context, DriverError, Event, EventFlags, Stream};

/// One blocking-sync event per frame in flight: before queueing frame `seq`, the CPU sleeps until frame
/// `seq - depth` has gone through the stream.
pub(crate) struct RunAhead {
    events: Vec<Event>,
}

impl RunAhead {
    /// Allows `depth` frames in flight.
    pub(crate) fn new(ctx: &Context, depth: usize) -> Result<Self, DriverError> {
        let flags = EventFlags { timing: false, blocking_sync: true, interprocess: false };
        let events = (0..depth.max(1)).map(|_| Event::new(ctx, flags)).collect::<Result<Vec<_>, _>>()?;
        Ok(Self { events })
    }

    fn event(&self, seq: u64) -> &Event {
        &self.events[(seq % self.events.len() as u64) as usize]
    }

    /// Sleeps until frame `seq - depth` is through the stream (nothing to wait for on the first `depth` frames).
    pub(crate) fn before(&self, seq: u64) -> Result<(), DriverError> {
        if seq >= self.events.len() as u64 {
            self.event(seq).synchronize()?;
        }
        Ok(())
    }

    /// Marks frame `seq` as queued on `stream`.
    pub(crate) fn after(&self, seq: u64, stream: &Stream) -> Result<(), DriverError> {
        self.event(seq).record(stream)
    }
}
