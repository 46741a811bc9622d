//! Marks after queued stream waits: an event recorded right after each `cuStreamWaitValue64` a handle queues on a
//! word of registered host memory, so that teardown can tell when no stream polls the word any more and never
//! unregisters it before (the semaphore's GPU side and a weights reader's stream gate both use it).

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use gpu_ipc_driver::{Context, DriverError, Event, EventFlags, Stream};

/// A queued wait: the event recorded after it, and the value it waits for (a semaphore's ticket, a generation).
struct Mark {
    event: Event,
    target: u64,
}

/// The marks of one handle's queued stream waits, oldest first, with the events of passed ones kept for reuse.
pub(crate) struct StreamMarks {
    ctx: Context,
    marks: VecDeque<Mark>,
    spare: Vec<Event>,
}

impl StreamMarks {
    /// No marks yet; events are made in `ctx`.
    pub(crate) fn new(ctx: &Context) -> Self {
        Self { ctx: ctx.clone(), marks: VecDeque::new(), spare: Vec::new() }
    }

    /// Records on `stream`, right after a wait for `target` queued there, the mark that says when the stream has
    /// passed it. A failed record is logged, not returned: the wait is queued already, and the mark kept anyway
    /// (its event never completes, so teardown then leaks the registration rather than risk unregistering it).
    ///
    /// # Errors
    /// Making a new event failed (nothing recorded: the caller decides what the queued wait then means).
    pub(crate) fn record(&mut self, stream: &Stream, target: u64, what: &str) -> Result<(), DriverError> {
        self.prune();
        let event = match self.spare.pop() {
            Some(event) => event,
            None => Event::new(&self.ctx, EventFlags::default())?,
        };
        let recorded = event.record(stream);
        self.marks.push_back(Mark { event, target });
        if let Err(e) = recorded {
            tracing::warn!(error = %e, "{what}: recording the mark after a stream wait failed");
        }
        Ok(())
    }

    /// Forgets the marks the streams have passed.
    pub(crate) fn prune(&mut self) {
        while let Some(mark) = self.marks.front() {
            if !matches!(mark.event.is_complete(), Ok(true)) {
                break;
            }
            if let Some(mark) = self.marks.pop_front() {
                self.spare.push(mark.event);
            }
        }
    }

    /// Teardown: waits up to `settle` for the streams to pass every queued wait, as long as `reached(target)` says
    /// each one's target has been reached (a wait whose word already satisfies it passes soon; any other may hold
    /// its stream indefinitely, so waiting for it would be a hang). Returns whether every wait was passed: only
    /// then may the word's registration go. On `false` the caller leaks it, never unregistering memory a stream
    /// may still poll.
    pub(crate) fn settle(&mut self, settle: Duration, reached: impl Fn(u64) -> bool, what: &str) -> bool {
        let deadline = Instant::now() + settle;
        loop {
            self.prune();
            let Some(oldest) = self.marks.front() else { return true };
            let all_reached = self.marks.iter().all(|mark| reached(mark.target));
            if !all_reached || Instant::now() >= deadline {
                tracing::debug!(
                    target = oldest.target,
                    waits = self.marks.len(),
                    "{what}: a stream may still wait on the registered word: leaking its registration"
                );
                return false;
            }
            std::thread::sleep(Duration::from_micros(100));
        }
    }
}
