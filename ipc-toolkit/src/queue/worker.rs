//! A worker's side: [`QueueWorker`] attaches through the owner's door, imports the queue's memory, and pushes,
//! pops and completes as its worker slot, from the CPU or from its kernels.

use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use super::body::QueueOffer;
use super::local::Local;
use super::task::Task;
use super::{DeviceQueue, QueueBackend, QueueStats};
use crate::door::{self, DoorError, ObjectKind, ObjectOffer, OwnerLink};
use crate::queue::error::QueueError;
use gpu_ipc_driver::{Function, KernelArg, LaunchConfig, Stream};
use ipc_core::backend::{ExportedHandle, SharedRegion};

/// How a worker attaches.
#[derive(Debug, Clone)]
pub struct WorkerOptions {
    /// A name for the owner's logs and peer list.
    pub name: String,
    /// Bound on the handshake with the owner.
    pub timeout: Duration,
    /// How long to retry while nothing listens at the socket yet (zero: fail at once with
    /// [`DoorError::NoOwner`]).
    pub wait_for_owner: Duration,
}

impl Default for WorkerOptions {
    fn default() -> Self {
        Self { name: "worker".into(), timeout: Duration::from_secs(5), wait_for_owner: Duration::ZERO }
    }
}

/// A process's attachment to a work queue as a worker. Tasks it pops are leased to it until completed; if the
/// process dies (or this value is dropped) first, the owner hands them out again.
///
/// Dropping it waits (bounded) for kernels launched through [`QueueWorker::launch`], unmaps the queue, and hangs
/// up, which the owner sees as this worker's end.
pub struct QueueWorker<B: QueueBackend> {
    local: Local<B::Imported>,
    link: OwnerLink,
    socket: PathBuf,
    _ctx: B::Context,
}

impl<B: QueueBackend> std::fmt::Debug for QueueWorker<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("QueueWorker")
            .field("backend", &B::KIND)
            .field("socket", &self.socket)
            .field("worker", &self.local.slot)
            .finish_non_exhaustive()
    }
}

impl<B: QueueBackend> QueueWorker<B> {
    /// Attaches to the queue served at `socket`.
    ///
    /// # Errors
    /// [`QueueError::Door`] (no owner: "start the process that creates the work-queue first"; refused: another
    /// backend, every worker slot taken, another user), a malformed offer ([`QueueError::Wire`]), the import's
    /// error, or a queue on another GPU.
    pub fn attach(ctx: &B::Context, socket: impl AsRef<Path>, options: &WorkerOptions) -> Result<Self, QueueError> {
        let socket = socket.as_ref().to_path_buf();
        let give_up = Instant::now() + options.wait_for_owner;
        loop {
            let attempt = door::attach(
                &socket,
                ObjectKind::WorkQueue,
                Some(B::KIND),
                &options.name,
                options.timeout,
                |offer, fds| import::<B>(ctx, offer, fds),
            );
            match attempt {
                Ok((local, link)) => {
                    tracing::info!(worker = local.slot, socket = %socket.display(), "attached to a work queue");
                    return Ok(Self { local, link, socket, _ctx: ctx.clone() });
                }
                Err(QueueError::Door(DoorError::NoOwner { .. })) if Instant::now() < give_up => {
                    std::thread::sleep(
                        Duration::from_millis(20).min(give_up.saturating_duration_since(Instant::now())),
                    );
                }
                Err(error) => return Err(error),
            }
        }
    }

    /// This worker's slot: the `worker` argument of the device functions.
    pub fn worker(&self) -> u16 {
        self.local.slot
    }

    /// Bytes of a record at most.
    pub fn record_bytes(&self) -> u32 {
        self.local.g.record_bytes
    }

    /// Whether the owner is gone (its process ended, or it dropped the queue).
    pub fn owner_gone(&self) -> bool {
        self.link.owner_gone()
    }

    fn alive(&self) -> Result<(), QueueError> {
        if self.link.owner_gone() { Err(QueueError::OwnerGone { socket: self.socket.clone() }) } else { Ok(()) }
    }

    /// Pushes `record` as a new task, waiting up to `timeout` while the queue is full; returns its id.
    ///
    /// # Errors
    /// [`QueueError::Full`], [`QueueError::Closed`], [`QueueError::OwnerGone`], [`QueueError::RecordTooLarge`],
    /// or the GPU's error.
    pub fn push(&self, record: &[u8], timeout: Duration) -> Result<u64, QueueError> {
        self.local.push(record, timeout, || self.alive())
    }

    /// Pushes `record` if a cell is free now.
    ///
    /// # Errors
    /// As [`QueueWorker::push`], without the wait.
    pub fn try_push(&self, record: &[u8]) -> Result<Option<u64>, QueueError> {
        self.local.try_push(record)
    }

    /// Pushes as many of `records` as go in now, in order; returns the ids of those pushed.
    ///
    /// # Errors
    /// As [`QueueWorker::push`], without the wait.
    pub fn try_push_many(&self, records: &[&[u8]]) -> Result<Vec<u64>, QueueError> {
        self.local.try_push_many(records)
    }

    /// Pops a task, waiting up to `timeout` while the queue is empty.
    ///
    /// # Errors
    /// [`QueueError::Timeout`], [`QueueError::Closed`] once the queue is closed and drained,
    /// [`QueueError::OwnerGone`] (seen while waiting), or the GPU's error.
    pub fn pop(&self, timeout: Duration) -> Result<Task<'_>, QueueError> {
        let mut tasks = self.pop_many(1, timeout)?;
        tasks.pop().ok_or(QueueError::Timeout { waited: timeout })
    }

    /// Pops up to `max` tasks that are there now, waiting up to `timeout` for the first (on a GPU backend, one
    /// kernel launch for the batch).
    ///
    /// # Errors
    /// As [`QueueWorker::pop`].
    pub fn pop_many(&self, max: usize, timeout: Duration) -> Result<Vec<Task<'_>>, QueueError> {
        let tasks = self.local.pop_many(max, timeout, || self.alive())?;
        Ok(tasks.into_iter().map(|data| self.local.task(data)).collect())
    }

    /// Completes every task of `tasks` (on a GPU backend, those of this handle with one kernel launch per 64).
    ///
    /// # Errors
    /// [`QueueError::LeaseLost`] naming the first task the owner had taken back (the others are completed all the
    /// same), or the GPU's error.
    pub fn complete_many(&self, tasks: Vec<Task<'_>>) -> Result<(), QueueError> {
        self.local.complete_all(tasks)
    }

    /// The queue's counters (those of every worker and of the owner).
    ///
    /// # Errors
    /// The GPU's error.
    pub fn stats(&self) -> Result<QueueStats, QueueError> {
        self.local.stats()
    }

    /// The queue for this process's kernels: pass [`DeviceQueue::span`] and [`DeviceQueue::worker`] as the
    /// `queue` and `worker` arguments of the device functions in `work_queue.cuh`.
    ///
    /// # Errors
    /// [`QueueError::NeedsGpu`] on the host backend.
    pub fn device_queue(&self) -> Result<DeviceQueue<'_>, QueueError> {
        self.local.device_queue()
    }

    /// Launches `kernel` on `stream` with the queue and this worker's slot as its first two arguments
    /// (`unsigned long long* queue, unsigned int worker`), then `args`. Dropping the worker waits for it
    /// (bounded) before the queue is unmapped.
    ///
    /// # Errors
    /// [`QueueError::NeedsGpu`] on the host backend; the launch's error.
    pub fn launch(
        &self,
        kernel: &Function,
        stream: &Stream,
        config: LaunchConfig,
        args: &[KernelArg<'_>],
    ) -> Result<(), QueueError> {
        self.local.launch(kernel, stream, config, args)
    }
}

/// Turns the owner's offer into this process's handle on the queue.
fn import<B: QueueBackend>(
    ctx: &B::Context,
    offer: &ObjectOffer,
    mut fds: Vec<OwnedFd>,
) -> Result<Local<B::Imported>, QueueError> {
    let body = QueueOffer::decode(&offer.body)?;
    if body.backend != B::KIND {
        return Err(QueueError::Layout(format!("the owner offered a {} queue to a {} worker", body.backend, B::KIND)));
    }
    if fds.len() != body.fd_count() {
        return Err(QueueError::Layout(format!(
            "the offer came with {} fds; a {} queue sends {}",
            fds.len(),
            body.backend,
            body.fd_count()
        )));
    }
    let cuda = B::cuda_context(ctx);
    if let Some(cuda) = cuda {
        let here = cuda.device().uuid()?;
        if here != body.device_uuid {
            return Err(QueueError::Config(format!(
                "the queue is on GPU {}, this process's context is on GPU {here}: attach from a context on the \
                 queue's GPU",
                body.device_uuid
            )));
        }
    }
    let handle = ExportedHandle {
        bytes: body.legacy_mem_handle.map(|h| h.to_vec()).unwrap_or_default(),
        fd: fds.pop(),
        size: body.allocation_bytes,
    };
    let region = B::import(ctx, handle)?;
    if region.len() < body.geometry.total_bytes {
        return Err(QueueError::Layout(format!(
            "the imported allocation is {} bytes, the layout needs {}",
            region.len(),
            body.geometry.total_bytes
        )));
    }
    let local = Local::new(region, cuda, body.geometry, body.worker)?;
    body.geometry.check_header(&local.engine().header(local.access())?)?;
    Ok(local)
}
