//! The GPU side of a handle: the shared block registered for the device (so `cuStreamWaitValue64` can wait on
//! `posted`), and a mark (an event) after each queued wait, so that teardown never unregisters memory a stream may
//! still poll.

use std::sync::Arc;
use std::time::Duration;

use super::block::SemaphoreBlock;
use super::error::SemaphoreError;
use super::layout::{POSTED_OFFSET, SharedWords};
use crate::stream_marks::StreamMarks;
use gpu_ipc_driver::{
    Context, DeviceFeature, DeviceMemory, DevicePtr, DeviceSpan, HostRegistration, Stream, WaitCondition,
};
use ipc_core::shm::SharedObject;

/// How long teardown waits for streams to pass waits whose tickets a post has reached.
const SETTLE: Duration = Duration::from_secs(1);

/// This handle's registration of the shared block and its queued waits.
pub(super) struct GpuSide {
    ctx: Context,
    registration: Arc<HostRegistration<SharedObject<SharedWords>>>,
    /// Marks of waits the stream may not have passed (their ticket as target).
    marks: StreamMarks,
}

impl GpuSide {
    /// Checks that the device can queue 64-bit stream waits and registers the block in `ctx`.
    pub(super) fn new(ctx: &Context, block: &SemaphoreBlock) -> Result<Self, SemaphoreError> {
        if !ctx.device().supports(DeviceFeature::StreamMemOps64)? {
            return Err(SemaphoreError::NoStreamMemOps);
        }
        let registration = Arc::new(HostRegistration::new(ctx, Arc::clone(block.shared()))?);
        Ok(Self { ctx: ctx.clone(), registration, marks: StreamMarks::new(ctx) })
    }

    /// The device address of `posted` in this side's context: what kernels after a wait read.
    pub(super) fn status_word(&self) -> DevicePtr {
        self.registration.device_ptr().offset(POSTED_OFFSET as u64)
    }

    /// Queues on `stream` a copy of the `posted` word into `dst` (8 bytes of device memory): a stream-ordered
    /// snapshot, taken once the stream's earlier work (a wait) is done, for kernels queued after it.
    pub(super) fn copy_status(&self, stream: &Stream, dst: &DeviceSpan<'_>) -> Result<(), SemaphoreError> {
        let word = self.registration.span().slice(POSTED_OFFSET as u64, 8)?;
        dst.copy_from_async(&word, stream)?;
        Ok(())
    }

    /// Whether `stream` belongs to this side's context.
    pub(super) fn same_context(&self, stream: &Stream) -> bool {
        stream.context().as_raw() == self.ctx.as_raw()
    }

    /// Queues on `stream` a wait until `posted >= ticket + 1`, then a mark.
    pub(super) fn queue_wait(&mut self, stream: &Stream, ticket: u64) -> Result<(), SemaphoreError> {
        self.registration.wait_value_u64(stream, POSTED_OFFSET, ticket + 1, WaitCondition::AtLeast)?;
        self.marks.record(stream, ticket, "semaphore")?;
        Ok(())
    }

    /// Teardown: the registration may go once every queued wait is passed. Waits whose ticket a post has reached
    /// pass soon (waited for, up to [`SETTLE`]); any other may hold its stream until a post or the poison, so the
    /// registration is then leaked (64 KiB of page-locked host memory stays mapped) rather than unregistered under
    /// a stream that still polls it.
    fn settle(&mut self, block: &SemaphoreBlock) {
        let reached = |ticket| block.posted() > ticket || block.check().is_err();
        if !self.marks.settle(SETTLE, reached, "semaphore") {
            std::mem::forget(Arc::clone(&self.registration));
        }
    }

    /// Settles (see `settle`) and drops the side.
    pub(super) fn close(mut self, block: &SemaphoreBlock) {
        self.settle(block);
    }
}
