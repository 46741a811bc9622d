//! Bounds how far the CPU may queue GPU-side work ahead of the GPU (the `GpuStreamOps` strategy), so a producer
//! or consumer never queues an unbounded number of frames behind a stream wait.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use crate::driver::{Context, DriverError, Event, EventFlags, Stream};
use crate::frames::FrameError;

/// How long the CPU naps between polls of the stream's progress: the CPU is not on the per-frame path here, so
/// it may as well sleep.
const NAP: Duration = Duration::from_micros(20);

/// One event per frame in flight: before queueing frame `seq`, the CPU naps until frame `seq - depth` has gone
/// through the stream, or the deadline passes.
pub(crate) struct RunAhead {
    events: Vec<Event>,
    /// Recorded after work queued outside the frame marks (a wait queued before its frame is published or
    /// released).
    tail: Event,
    /// The latest mark, what teardown waits for: [`NOTHING`], [`TAIL`], or frame `seq` as `seq + 1`.
    last: AtomicU64,
}

/// `last`: nothing queued yet.
const NOTHING: u64 = 0;
/// `last`: the tail event is the latest mark.
const TAIL: u64 = u64::MAX;

impl RunAhead {
    /// Allows `depth` frames in flight.
    pub(crate) fn new(ctx: &Context, depth: usize) -> Result<Self, DriverError> {
        let flags = EventFlags { timing: false, blocking_sync: false, interprocess: false };
        let events = (0..depth.max(1)).map(|_| Event::new(ctx, flags)).collect::<Result<Vec<_>, _>>()?;
        Ok(Self { events, tail: Event::new(ctx, flags)?, last: AtomicU64::new(NOTHING) })
    }

    /// Frames allowed in flight.
    pub(crate) fn depth(&self) -> u64 {
        self.events.len() as u64
    }

    fn event(&self, seq: u64) -> &Event {
        &self.events[(seq % self.events.len() as u64) as usize]
    }

    /// Naps until frame `seq - depth` is through the stream (nothing to wait for on the first `depth` frames).
    ///
    /// # Errors
    /// [`FrameError::Timeout`] at `deadline`: the stream is stuck behind a wait that nobody satisfies.
    pub(crate) fn before(&self, seq: u64, deadline: Instant) -> Result<(), FrameError> {
        if seq < self.events.len() as u64 {
            return Ok(());
        }
        let behind = seq - self.events.len() as u64;
        super::wait_for_event(
            self.event(seq),
            deadline,
            Some(NAP),
            || true,
            || format!("the stream to finish frame {behind} (a GPU-side wait is not satisfied)"),
        )
    }

    /// Waits until everything queued on `stream` so far is done, or `deadline` passes.
    ///
    /// # Errors
    /// [`FrameError::Timeout`], driver errors.
    pub(crate) fn drain(&self, stream: &Stream, deadline: Instant) -> Result<(), FrameError> {
        let marker = &self.events[0];
        marker.record(stream)?;
        super::wait_for_event(marker, deadline, Some(NAP), || true, || "the stream to drain".to_owned())
    }

    /// Marks frame `seq` as queued on `stream`.
    pub(crate) fn after(&self, seq: u64, stream: &Stream) -> Result<(), DriverError> {
        self.event(seq).record(stream)?;
        self.last.store(seq.saturating_add(1).min(TAIL - 1), Ordering::Relaxed);
        Ok(())
    }

    /// Marks the latest work queued on `stream` (a wait queued outside [`after`](Self::after)'s frame marks).
    pub(crate) fn mark_tail(&self, stream: &Stream) -> Result<(), DriverError> {
        self.tail.record(stream)?;
        self.last.store(TAIL, Ordering::Relaxed);
        Ok(())
    }

    /// Naps until the stream has passed everything marked so far, or `deadline` passes: before the memory its
    /// waits and writes use is freed.
    ///
    /// # Errors
    /// [`FrameError::Timeout`]: the stream is stuck; the caller must leak that memory rather than free it.
    pub(crate) fn settle(&self, deadline: Instant) -> Result<(), FrameError> {
        let event = match self.last.load(Ordering::Relaxed) {
            NOTHING => return Ok(()),
            TAIL => &self.tail,
            frame => self.event(frame - 1),
        };
        super::wait_for_event(event, deadline, Some(NAP), || true, || "the stream to pass the ring's work".into())
    }
}
