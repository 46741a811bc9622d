//! The GPU side of a handle: stream waits and stream posts on the count in device memory ([`DeviceCount`]), and a
//! mark (an event) after each, so that teardown never frees or unregisters memory a queued wait or post kernel
//! may still use.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::block::SemaphoreBlock;
use super::count::DeviceCount;
use super::error::SemaphoreError;
use crate::driver::{DevicePtr, DeviceSpan, Event, EventFlags, Stream, sys};

/// How long teardown waits for streams to pass the waits a post has reached and the posts they queued.
const SETTLE: Duration = Duration::from_secs(1);

/// A queued wait (its ticket) or post (`None`): the event recorded after it.
struct Mark {
    event: Event,
    ticket: Option<u64>,
}

/// This handle's queued stream operations on the count.
pub(super) struct GpuSide {
    count: Arc<DeviceCount>,
    /// Whether the device's 64-bit stream waits were checked (on the first stream wait).
    waits_checked: bool,
    /// Marks the streams may not have passed, oldest first.
    marks: VecDeque<Mark>,
    /// Events of passed marks, for reuse.
    spare: Vec<Event>,
}

impl GpuSide {
    /// The GPU side over this process's count.
    pub(super) fn new(count: Arc<DeviceCount>) -> Self {
        Self { count, waits_checked: false, marks: VecDeque::new(), spare: Vec::new() }
    }

    /// The device address of the count in this process: what kernels after a wait read.
    pub(super) fn status_word(&self) -> Result<DevicePtr, SemaphoreError> {
        Ok(self.count.span()?.ptr())
    }

    /// Queues on `stream` a copy of the count into `dst` (8 bytes of device memory): a stream-ordered snapshot,
    /// taken once the stream's earlier work (a wait) is done, for kernels queued after it.
    pub(super) fn copy_status(&self, stream: &Stream, dst: &DeviceSpan<'_>) -> Result<(), SemaphoreError> {
        self.count.copy_on(stream, dst)
    }

    /// Whether `stream` belongs to the context the count is mapped in.
    pub(super) fn same_context(&self, stream: &Stream) -> bool {
        stream.context().as_raw() == self.count.context().as_raw()
    }

    /// Queues on `stream` a wait until the count passes `ticket`, then a mark.
    pub(super) fn queue_wait(&mut self, stream: &Stream, ticket: u64) -> Result<(), SemaphoreError> {
        if !self.waits_checked {
            if !self.count.context().device().flag(sys::CU_DEVICE_ATTRIBUTE_CAN_USE_64_BIT_STREAM_MEM_OPS)? {
                return Err(SemaphoreError::NoStreamMemOps);
            }
            self.waits_checked = true;
        }
        self.prune();
        self.count.wait_on(stream, ticket + 1)?;
        self.mark(stream, Some(ticket));
        Ok(())
    }

    /// Queues on `stream` the post kernel adding `n`, then a mark.
    pub(super) fn queue_post(&mut self, stream: &Stream, n: u64) -> Result<(), SemaphoreError> {
        self.prune();
        self.count.post_on(stream, n)?;
        self.mark(stream, None);
        Ok(())
    }

    fn mark(&mut self, stream: &Stream, ticket: Option<u64>) {
        let event = match self.spare.pop() {
            Some(event) => Ok(event),
            None => Event::new(self.count.context(), EventFlags::default()),
        };
        // Without a mark teardown cannot tell when the operation is done: it then leaks the count's memory.
        let recorded = event.and_then(|event| {
            let recorded = event.record(stream);
            self.marks.push_back(Mark { event, ticket });
            recorded
        });
        if let Err(e) = recorded {
            tracing::warn!(error = %e, "semaphore: recording the mark after a stream operation failed");
        }
    }

    /// Forgets the marks the streams have passed.
    fn prune(&mut self) {
        while let Some(mark) = self.marks.front() {
            if !matches!(mark.event.is_complete(), Ok(true)) {
                break;
            }
            if let Some(mark) = self.marks.pop_front() {
                self.spare.push(mark.event);
            }
        }
    }

    /// Teardown: the count's memory may go once every queued operation is passed. Waits whose ticket a post has
    /// reached, and posts, pass soon (waited for, up to [`SETTLE`]); any other wait may hold its stream until a
    /// post or the poison, so the count's memory and registration are then leaked (kept mapped until the process
    /// exits) rather than freed under a stream that still uses them.
    fn settle(&mut self, block: &SemaphoreBlock) {
        let deadline = Instant::now() + SETTLE;
        loop {
            self.prune();
            if self.marks.is_empty() {
                return;
            }
            let reached =
                self.marks.iter().all(|mark| mark.ticket.is_none_or(|t| block.posted() > t) || block.check().is_err());
            if !reached || Instant::now() >= deadline {
                tracing::debug!(
                    queued = self.marks.len(),
                    "semaphore: a stream may still use the count: leaking this process's mapping of it"
                );
                std::mem::forget(Arc::clone(&self.count));
                return;
            }
            std::thread::sleep(Duration::from_micros(100));
        }
    }

    /// Settles (see `settle`) and drops the side.
    pub(super) fn close(mut self, block: &SemaphoreBlock) {
        self.settle(block);
    }
}
