//! What can go wrong with a work queue, with what to do about it.

use std::path::PathBuf;
use std::time::Duration;

use crate::door::DoorError;
use gpu_ipc_driver::DriverError;
use ipc_core::backend::BackendError;
use ipc_core::shm::ShmError;
use ipc_core::wire::WireError;

/// Why a work-queue call failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum QueueError {
    /// A value out of range in the configuration or a call.
    #[error("work queue: {0}")]
    Config(String),
    /// `push` found no free cell before its deadline.
    #[error(
        "the work queue stayed full for {waited:?}: every cell holds a task that is queued or in a worker's hands; \
         add workers, complete tasks sooner, or create the queue with a larger capacity"
    )]
    Full {
        /// How long it waited.
        waited: Duration,
    },
    /// `pop` found no task before its deadline.
    #[error("no task arrived within {waited:?}")]
    Timeout {
        /// How long it waited.
        waited: Duration,
    },
    /// `wait_until_done` reached its deadline with tasks not done: what the owner saw then.
    #[error(
        "{completed} of {pushed} tasks completed, {in_flight} in flight ({queued} queued, {in_hand} in workers' \
         hands, {pending} taken back and waiting to be pushed again), {lost} lost; timed out after {waited:?}"
    )]
    NotDone {
        /// How long it waited.
        waited: Duration,
        /// Tasks pushed (redeliveries not counted).
        pushed: u64,
        /// Tasks completed.
        completed: u64,
        /// Of those pushed, how many are neither completed nor lost: `queued + in_hand + pending` (and pushes still
        /// being written).
        in_flight: u64,
        /// Tasks queued.
        queued: u64,
        /// Tasks leased to workers (or given back and not yet taken).
        in_hand: u64,
        /// Tasks taken back and not yet pushed again, or a gone worker's cells not yet looked at.
        pending: u64,
        /// Tasks reported lost.
        lost: u64,
    },
    /// The owner closed the queue: a push is refused; a pop finds it drained.
    #[error("the work queue is closed: its owner takes no more tasks, and every task pushed before was handed out")]
    Closed,
    /// The owner's process is gone (its connection hung up), so nobody accounts for tasks any more.
    #[error(
        "the work queue's owner at {} is gone: no task is handed out again from now on; create the queue again and \
         attach to the new one",
        socket.display()
    )]
    OwnerGone {
        /// The queue's socket.
        socket: PathBuf,
    },
    /// The owner took this worker's task back: its lease expired, or the owner declared the worker gone (its
    /// connection hung up), or it was given back already.
    #[error(
        "task {id}: the owner took it back from this worker (its lease expired, or the owner saw this worker's \
         connection hang up) to hand it to another; do not report its result"
    )]
    LeaseLost {
        /// The task's id.
        id: u64,
    },
    /// A record longer than the queue's records.
    #[error("a record of {len} bytes does not fit this queue's {max}-byte records")]
    RecordTooLarge {
        /// Its length.
        len: usize,
        /// The queue's record size.
        max: u32,
    },
    /// The queue's memory does not hold the layout the offer described.
    #[error("the work queue's memory: {0}")]
    Layout(String),
    /// The operation needs a GPU backend.
    #[error("{what} needs a GPU backend (legacy or vmm); the host backend runs no kernels")]
    NeedsGpu {
        /// What was asked.
        what: &'static str,
    },
    /// The queue's own kernels could not be loaded.
    #[error("loading the work queue's kernels ({image}) failed: {source}; update the NVIDIA driver")]
    Kernels {
        /// The image tried.
        image: &'static str,
        /// The driver's error.
        source: DriverError,
    },
    /// The GPU did not finish one of the queue's own operations in time (a device that is stuck or starved).
    #[error(
        "the GPU did not finish a work-queue operation within {waited:?}: another process may be holding the GPU \
         (without MPS, kernels of different processes take turns); try again, or run an MPS daemon"
    )]
    GpuBusy {
        /// How long it waited.
        waited: Duration,
    },
    /// The owner could not open its socket, or a worker could not attach.
    #[error(transparent)]
    Door(#[from] DoorError),
    /// A malformed offer.
    #[error(transparent)]
    Wire(#[from] WireError),
    /// The backend could not allocate, export or import the queue's memory.
    #[error(transparent)]
    Backend(#[from] BackendError),
    /// A CUDA call failed.
    #[error(transparent)]
    Driver(#[from] DriverError),
    /// Shared memory (the host backend's, or a staging area) failed.
    #[error(transparent)]
    Shm(#[from] ShmError),
    /// A thread could not start.
    #[error("starting the work queue's {what} thread: {source}")]
    Thread {
        /// Which thread.
        what: &'static str,
        /// The OS error.
        source: std::io::Error,
    },
}
