//! The work queue (master/worker): a bounded multi-producer, multi-consumer queue of fixed-size task records in
//! shared device memory. An owner process creates it ([`WorkQueue::create`]) and serves it at a socket; worker
//! processes attach ([`QueueWorker::attach`]); anyone pushes and pops, from the CPU or from kernels (the device
//! functions of `kernels/cuda/work_queue.cuh`). See `docs/work-queue.md`.
//!
//! **Exactly once, or reported.** A popped [`Task`] is leased to the worker that popped it: the cell's state word
//! names the worker until it completes the task, a single compare-and-swap that is also the completion's count
//! (the owner derives its counts from the cells, see [`WorkQueue::stats`]). A lease comes back to the owner when
//! the worker goes (its connection hangs up: death or a clean detach; after [`QueueConfig::reclaim_after`]), when
//! it has been held for [`QueueConfig::lease`], or when the worker gives it back ([`Task::give_back`], or drops
//! the `Task`). The owner takes it over with a compare-and-swap, so a late completion by the old holder fails with
//! [`QueueError::LeaseLost`] (the current lease wins: exactly one completion counts), and pushes the task again
//! with [`Task::attempt`] one higher; after [`QueueConfig::max_deliveries`] deliveries it reports the task lost
//! ([`WorkQueue::take_lost`]) instead. So a task is completed at most once, and never silently dropped; a task
//! handed out again may have been worked on, in part or in full, by an earlier holder, which its `attempt` says.
//!
//! **Where the words live.** Everything is in the queue's one allocation of device memory: every change of state
//! is a read-modify-write, and the CPU's atomics and the GPU's are not atomic with each other on host memory
//! mapped over PCIe (only with `CU_DEVICE_ATTRIBUTE_HOST_NATIVE_ATOMIC_SUPPORTED`), while device memory has no CPU
//! atomics at all. So on the GPU backends every operation is done by the GPU: kernels call the device functions,
//! and the CPU API launches the queue's own small kernels (a launch and a stream wait per call, batched by
//! `*_many`). On the host backend the "device memory" is host memory and the CPU does the same state machine.
//!
//! ```no_run
//! use std::time::Duration;
//! use ipc_core::host::{HostContext, Host};
//! use ipc_toolkit::queue::{QueueConfig, QueueWorker, WorkQueue, WorkerOptions};
//!
//! # fn main() -> Result<(), ipc_toolkit::queue::QueueError> {
//! // The owner.
//! let queue = WorkQueue::<Host>::create(&HostContext, "/tmp/tasks.sock", QueueConfig::new(1024, 16))?;
//! queue.push(&42u64.to_le_bytes(), Duration::from_secs(1))?;
//! queue.close()?;
//! // A worker (in another process).
//! let worker = QueueWorker::<Host>::attach(&HostContext, "/tmp/tasks.sock", &WorkerOptions::default())?;
//! let task = worker.pop(Duration::from_secs(1))?;
//! assert_eq!(task.record(), 42u64.to_le_bytes());
//! task.complete()?;
//! # Ok(()) }
//! ```

mod body;
mod engine;
mod error;
#[cfg(feature = "fuzzing")]
pub(crate) mod fuzzing;
mod gpu_ops;
mod host_ops;
pub mod layout;
mod local;
mod ops;
mod owner;
mod reaper;
mod shared;
mod task;
mod worker;

use std::time::Duration;

pub use body::{QUEUE_OFFER_BYTES, QueueOffer};
pub use error::QueueError;
pub use owner::WorkQueue;
pub use task::{LostReason, LostTask, QueueStats, Task};
pub use worker::{QueueWorker, WorkerOptions};

use crate::door::DoorConfig;
use gpu_ipc_driver::{DeviceSpan, KernelArg};
pub use ipc_core::backend::MemoryAccess;
use ipc_core::backend::{Backend, ReachableRegion};

/// Memory a queue can live in: a backend's region, host or device.
pub trait QueueMemory: ReachableRegion {}

impl<T: ReachableRegion> QueueMemory for T {}

/// A backend a work queue runs on: every backend whose regions are [`QueueMemory`] (legacy, vmm, host).
pub trait QueueBackend: Backend<Exported: QueueMemory, Imported: QueueMemory> {}

impl<B> QueueBackend for B
where
    B: Backend,
    B::Exported: QueueMemory,
    B::Imported: QueueMemory,
{
}

/// The queue as a kernel of this process sees it: the `queue` and `worker` arguments of the device functions.
#[derive(Debug, Clone, Copy)]
pub struct DeviceQueue<'a> {
    span: DeviceSpan<'a>,
    worker: u16,
}

impl<'a> DeviceQueue<'a> {
    /// The queue's memory in this process (`unsigned long long* queue`).
    pub fn span(&self) -> DeviceSpan<'a> {
        self.span
    }

    /// This process's worker slot (`unsigned int worker`).
    pub fn worker(&self) -> u16 {
        self.worker
    }

    /// Both, as the first two arguments of a launch.
    pub fn args(&self) -> [KernelArg<'a>; 2] {
        [KernelArg::Span(self.span), KernelArg::U32(u32::from(self.worker))]
    }
}

/// How a work queue is made.
#[derive(Debug, Clone)]
pub struct QueueConfig {
    /// Cells: tasks queued and in workers' hands at most. A power of two, 2 to 2^26.
    pub capacity: u64,
    /// Bytes of a record at most (1 to 4096); each cell holds this rounded up to 16, plus 32.
    pub record_bytes: u32,
    /// Worker slots, the owner's included (2 to 4096; default 64): how many workers may be attached at once, with
    /// those gone whose tasks are still being taken back.
    pub max_workers: u32,
    /// How many times a task is handed out at most (default 3): when its holder goes before completing it that
    /// many times, it is reported lost rather than handed to the next worker.
    pub max_deliveries: u32,
    /// How long after a worker's hang-up the owner takes its tasks back (default 1 s): long enough for a killed
    /// process's kernels to have stopped writing.
    pub reclaim_after: Duration,
    /// How long a worker may hold a task (default 30 s, as SQS's visibility timeout): a lease the owner's sweeps
    /// have seen held for this long is taken back and the task pushed again, as for a gone worker, and the late
    /// holder's `complete` says [`QueueError::LeaseLost`]. The owner looks every [`QueueConfig::sweep_every`], so a
    /// lease ends between `lease` and `lease + sweep_every` after the pop. Set it above your longest task;
    /// `Duration::MAX`: never.
    pub lease: Duration,
    /// How often the owner looks over every cell (default 50 ms): for expired leases, for tasks given back
    /// ([`Task::give_back`], or a `Task` dropped), and, once the queue is closed, for tasks still in flight.
    pub sweep_every: Duration,
    /// The socket's settings: handshake bound, pending handshakes, who may connect.
    pub door: DoorConfig,
}

impl QueueConfig {
    /// `capacity` cells of `record_bytes`, with the defaults for the rest.
    pub fn new(capacity: u64, record_bytes: u32) -> Self {
        Self {
            capacity,
            record_bytes,
            max_workers: 64,
            max_deliveries: 3,
            reclaim_after: Duration::from_secs(1),
            lease: Duration::from_secs(30),
            sweep_every: Duration::from_millis(50),
            door: DoorConfig::default(),
        }
    }
}
