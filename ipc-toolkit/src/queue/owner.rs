//! The owner's side: [`WorkQueue`] makes the queue's memory, serves it through an [`ObjectDoor`], gives each
//! worker a slot, and takes back what a gone worker held (the reaper, `reaper.rs`).

use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::body::QueueOffer;
use super::layout::{Geometry, OWNER_SLOT};
use super::local::Local;
use super::shared::{Owner, OwnerState, Slot};
use super::task::{LostTask, Task};
use super::{DeviceQueue, QueueBackend, QueueConfig, QueueStats, reaper};
use crate::door::{ObjectDoor, ObjectHost, PeerInfo};
use crate::queue::error::QueueError;
use gpu_ipc_driver::{DeviceUuid, Function, KernelArg, LaunchConfig, Stream};
use ipc_core::backend::SharedRegion;
use ipc_core::ring::{WaitMode, bounded_wait};
use ipc_core::wire::BackendKind;

/// A work queue's owner: it creates the queue, serves workers at its socket, and accounts for every task. Workers
/// attach with [`QueueWorker::attach`](super::QueueWorker::attach); the owner may push and pop too.
///
/// Dropping it closes the socket and stops taking tasks back: workers then get [`QueueError::OwnerGone`].
pub struct WorkQueue<B: QueueBackend> {
    door: Option<ObjectDoor>,
    reaper: Option<JoinHandle<()>>,
    owner: Arc<Owner<B>>,
    socket: PathBuf,
    _ctx: B::Context,
}

impl<B: QueueBackend> std::fmt::Debug for WorkQueue<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WorkQueue")
            .field("backend", &B::KIND)
            .field("socket", &self.socket)
            .field("geometry", &self.owner.local.g)
            .finish_non_exhaustive()
    }
}

impl<B: QueueBackend> WorkQueue<B> {
    /// Allocates the queue (`config.capacity` cells of `config.record_bytes`) with backend `B` in `ctx`, and
    /// starts serving workers at `socket` (mode 0600; see [`QueueConfig::door`] for other users).
    ///
    /// # Errors
    /// A configuration out of range ([`QueueError::Config`]), the backend's allocation or export error, the
    /// queue's kernels not loading (GPU backends), or the socket not opening ([`QueueError::Door`]).
    pub fn create(ctx: &B::Context, socket: impl AsRef<Path>, config: QueueConfig) -> Result<Self, QueueError> {
        let g = Geometry::new(config.capacity, config.record_bytes, config.max_workers)?;
        if config.max_deliveries == 0 {
            return Err(QueueError::Config("max_deliveries 0: a task must be handed out at least once".into()));
        }
        if config.sweep_every.is_zero() || config.lease.is_zero() {
            return Err(QueueError::Config(format!(
                "lease {:?}, sweep_every {:?}: both must be above zero (Duration::MAX: leases never expire)",
                config.lease, config.sweep_every
            )));
        }
        B::check_support(ctx)?;
        let cuda = B::cuda_context(ctx);
        let region = B::allocate(ctx, g.total_bytes)?;
        let local = Local::new(region, cuda, g, OWNER_SLOT)?;
        local.engine().init(local.access())?;
        let exported = B::export(local.region())?;
        let legacy_mem_handle = match B::KIND {
            BackendKind::Legacy => Some(<[u8; 64]>::try_from(exported.bytes.as_slice()).map_err(|_| {
                QueueError::Layout(format!("the legacy handle is {} bytes, not 64", exported.bytes.len()))
            })?),
            _ => None,
        };
        let device_uuid = match cuda {
            Some(c) => c.device().uuid()?,
            None => DeviceUuid([0; 16]),
        };
        let template = QueueOffer {
            backend: B::KIND,
            worker: OWNER_SLOT,
            geometry: g,
            allocation_bytes: exported.size.max(local.region().len()),
            device_uuid,
            legacy_mem_handle,
        };
        let mut slots = vec![Slot::Free; g.max_workers as usize];
        slots[usize::from(OWNER_SLOT)] = Slot::Peer(u32::MAX);
        let state = OwnerState { slots, gone: Vec::new(), backlog: VecDeque::new(), lost: Vec::new() };
        let door_config = config.door.clone();
        let owner = Arc::new(Owner {
            local,
            config,
            template,
            fd: exported.fd,
            state: Mutex::new(state),
            wake: Condvar::new(),
            stop: AtomicBool::new(false),
            seal_held: AtomicBool::new(false),
            closed: AtomicBool::new(false),
            taking: Mutex::new(()),
        });
        let reaper = {
            let owner = owner.clone();
            std::thread::Builder::new()
                .name("gpu-ipc-queue-reaper".into())
                .spawn(move || reaper::run(&owner))
                .map_err(|source| QueueError::Thread { what: "reaper", source })?
        };
        let socket = socket.as_ref().to_path_buf();
        let host: Arc<dyn ObjectHost> = owner.clone();
        let mut queue = Self { door: None, reaper: Some(reaper), owner, socket, _ctx: ctx.clone() };
        let door = ObjectDoor::open(&queue.socket, host, door_config)?;
        queue.socket = door.path().to_path_buf();
        queue.door = Some(door);
        tracing::info!(backend = B::KIND.name(), capacity = g.capacity, record_bytes = g.record_bytes, socket = %queue.socket.display(), "work queue ready");
        Ok(queue)
    }

    /// The socket workers attach at.
    pub fn socket(&self) -> &Path {
        &self.socket
    }

    /// Cells: tasks queued and in hand at most.
    pub fn capacity(&self) -> u64 {
        self.owner.local.g.capacity
    }

    /// Bytes of a record at most.
    pub fn record_bytes(&self) -> u32 {
        self.owner.local.g.record_bytes
    }

    /// Pushes `record` as a new task, waiting up to `timeout` while the queue is full; returns its id.
    ///
    /// # Errors
    /// [`QueueError::Full`] at the deadline, [`QueueError::Closed`], [`QueueError::RecordTooLarge`], or the
    /// GPU's error.
    pub fn push(&self, record: &[u8], timeout: Duration) -> Result<u64, QueueError> {
        self.owner.local.push(record, timeout, || Ok(()))
    }

    /// Pushes `record` if a cell is free now.
    ///
    /// # Errors
    /// As [`WorkQueue::push`], without the wait.
    pub fn try_push(&self, record: &[u8]) -> Result<Option<u64>, QueueError> {
        self.owner.local.try_push(record)
    }

    /// Pushes as many of `records` as go in now, in order (on a GPU backend, one kernel launch per batch);
    /// returns the ids of those pushed.
    ///
    /// # Errors
    /// As [`WorkQueue::push`], without the wait.
    pub fn try_push_many(&self, records: &[&[u8]]) -> Result<Vec<u64>, QueueError> {
        self.owner.local.try_push_many(records)
    }

    /// Pops a task for the owner itself, waiting up to `timeout`.
    ///
    /// # Errors
    /// [`QueueError::Timeout`], [`QueueError::Closed`] once closed and drained, or the GPU's error.
    pub fn pop(&self, timeout: Duration) -> Result<Task<'_>, QueueError> {
        let mut tasks = self.owner.local.pop_many(1, timeout, || Ok(()))?;
        let data = tasks.pop().ok_or(QueueError::Timeout { waited: timeout })?;
        Ok(self.owner.local.task(data))
    }

    /// Completes every task of `tasks` (on a GPU backend, those of this handle with one kernel launch per 64).
    ///
    /// # Errors
    /// As [`QueueWorker::complete_many`](super::QueueWorker::complete_many).
    pub fn complete_many(&self, tasks: Vec<Task<'_>>) -> Result<(), QueueError> {
        self.owner.local.complete_all(tasks)
    }

    /// Closes the queue to new pushes. Workers drain what is queued; their pops say [`QueueError::Closed`] once
    /// nothing is queued or in anyone's hands (the owner holds the end open, within a
    /// [`sweep_every`](super::QueueConfig::sweep_every), while a task is in flight, since it may yet come back:
    /// given back, expired, or its worker gone). A task taken back once the queue has ended anyway (a worker that
    /// popped and died in the last few milliseconds) is reported lost
    /// ([`LostReason::QueueClosed`](super::LostReason::QueueClosed)).
    ///
    /// # Errors
    /// The GPU's error.
    pub fn close(&self) -> Result<(), QueueError> {
        {
            let _taking = self.owner.taking();
            self.owner.closed.store(true, Ordering::Release);
            reaper::move_the_seal(&self.owner, true)?;
            self.owner.local.close()?;
        }
        self.owner.wake.notify_all();
        Ok(())
    }

    /// The queue's counters: `pushed`, `completed`, `queued` and `in_hand` derived from the cells' state words and
    /// the owner's own counters (exact whatever became of the workers, once they stop), the rest from the shared
    /// counters. Looks over every cell (a kernel on a GPU backend), and takes back what is due meanwhile.
    ///
    /// # Errors
    /// The GPU's error.
    pub fn stats(&self) -> Result<QueueStats, QueueError> {
        Ok(reaper::settle(&self.owner)?.1)
    }

    /// Tasks taken back from gone workers and waiting to be pushed again, plus gone workers whose cells are still
    /// to be looked at (one each): 0 when nothing is left to hand out again.
    pub fn pending_redeliveries(&self) -> usize {
        let state = self.owner.lock();
        state.backlog.len() + state.slots.iter().filter(|s| **s == Slot::Reclaiming).count()
    }

    /// The tasks reported lost since the last call.
    pub fn take_lost(&self) -> Vec<LostTask> {
        std::mem::take(&mut self.owner.lock().lost)
    }

    /// The workers attached now.
    pub fn workers(&self) -> Vec<PeerInfo> {
        self.door.as_ref().map(ObjectDoor::peers).unwrap_or_default()
    }

    /// Waits until `count` workers are attached, up to `timeout`.
    ///
    /// # Errors
    /// [`QueueError::Timeout`].
    pub fn wait_for_workers(&self, count: usize, timeout: Duration) -> Result<(), QueueError> {
        bounded_wait(
            Instant::now() + timeout,
            WaitMode::Sleep(Duration::from_millis(5)),
            Duration::ZERO,
            || Ok(self.workers().len() >= count),
            || Ok(()),
            |waited| QueueError::Timeout { waited },
        )
    }

    /// Waits until every task pushed so far was completed or reported lost (nothing queued, in hand, or waiting
    /// to be handed out again), up to `timeout`; returns the statistics then (see [`WorkQueue::stats`]). Workers
    /// that went after completing everything they held do not hold this up, and nor does a worker killed between
    /// a completion and its count: the owner looks at the cells themselves (every millisecond at the workers'
    /// counters, and at least every 20 ms over every cell).
    ///
    /// # Errors
    /// [`QueueError::NotDone`] at the deadline, saying how many tasks were completed, in flight and lost; or the
    /// GPU's error.
    pub fn wait_until_done(&self, timeout: Duration) -> Result<QueueStats, QueueError> {
        const LOOK_EVERY: Duration = Duration::from_millis(20);
        let start = Instant::now();
        let deadline = start + timeout;
        // The workers' counters say when to look sooner (but not more often than every 2 ms: they can say "done"
        // while a task is not, when a pusher was killed before its count).
        let (mut next_look, mut next_quick) = (start, start);
        loop {
            let counted = self.owner.local.stats()?;
            let now = Instant::now();
            let counted_done = counted.completed + counted.lost >= counted.pushed;
            if (counted_done && now >= next_quick) || now >= next_look || now >= deadline {
                let (quiet, stats, pending) = reaper::settle(&self.owner)?;
                if quiet {
                    return Ok(stats);
                }
                if Instant::now() >= deadline {
                    return Err(QueueError::NotDone {
                        waited: start.elapsed(),
                        pushed: stats.pushed,
                        completed: stats.completed,
                        in_flight: stats.pushed.saturating_sub(stats.completed + stats.lost),
                        queued: stats.queued,
                        in_hand: stats.in_hand,
                        pending,
                        lost: stats.lost,
                    });
                }
                next_quick = Instant::now() + Duration::from_millis(2);
                next_look = Instant::now() + LOOK_EVERY;
            }
            std::thread::sleep(Duration::from_millis(1).min(deadline.saturating_duration_since(Instant::now())));
        }
    }

    /// The queue for the owner's own kernels (worker slot 0).
    ///
    /// # Errors
    /// [`QueueError::NeedsGpu`] on the host backend.
    pub fn device_queue(&self) -> Result<DeviceQueue<'_>, QueueError> {
        self.owner.local.device_queue()
    }

    /// Launches `kernel` on `stream` with the queue and the owner's worker slot as its first two arguments
    /// (`unsigned long long* queue, unsigned int worker`), then `args`. Dropping the queue waits for it (bounded).
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
        self.owner.local.launch(kernel, stream, config, args)
    }
}

impl<B: QueueBackend> Drop for WorkQueue<B> {
    fn drop(&mut self) {
        // The reaper stops first: nothing is handed out again from now on. So a closed queue's pops may see its end
        // rather than wait for redeliveries that will not come; that is settled before the door shuts, so that a
        // worker draining a closed queue sees `Closed` rather than the owner's hang-up.
        self.owner.stop.store(true, Ordering::Release);
        self.owner.wake.notify_all();
        if let Some(reaper) = self.reaper.take() {
            let _ = reaper.join();
        }
        if let Err(error) = reaper::move_the_seal(&self.owner, false) {
            tracing::warn!(%error, "work queue: could not let the closed queue end");
        }
        self.door = None;
    }
}

#[cfg(test)]
#[path = "owner_tests.rs"]
#[allow(clippy::unwrap_used)]
mod tests;
