//! The queue's operations, whoever does them: the CPU on host memory ([`HostQueue`], the host fake), or the GPU
//! on device memory ([`GpuOps`], which launches the queue's own kernels), behind one [`Engine`].

use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use super::gpu_ops::GpuOps;
use super::host_ops::HostQueue;
use super::layout::{Geometry, header, worker};
use super::{MemoryAccess, QueueStats};
use crate::queue::error::QueueError;
use gpu_ipc_driver::Context;

/// What became of one operation; the codes are those of `kernels/cuda/work_queue.cuh` (`GPU_IPC_WQ_*`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Status {
    /// Done.
    Ok = 0,
    /// Nothing to pop now.
    Empty = 1,
    /// No free cell to push into now.
    Full = 2,
    /// Closed (push), or closed and drained (pop).
    Closed = 3,
    /// Other peers' moves won every attempt: try again.
    Contended = 4,
    /// The owner took the cell back: this worker was declared gone.
    LeaseLost = 5,
}

impl Status {
    pub(super) fn from_code(code: u64) -> Self {
        match code {
            0 => Self::Ok,
            1 => Self::Empty,
            2 => Self::Full,
            3 => Self::Closed,
            5 => Self::LeaseLost,
            _ => Self::Contended,
        }
    }
}

/// One record to push: a new task (`id` `None`: its id is the position it lands at) or one handed out again.
#[derive(Debug, Clone, Copy)]
pub(super) struct PushRequest<'r> {
    pub(super) record: &'r [u8],
    pub(super) id: Option<u64>,
    pub(super) attempt: u32,
}

/// How a push counts and whether it passes a closed queue (the owner's redeliveries do both differently).
#[derive(Debug, Clone, Copy)]
pub(super) struct PushFlags {
    /// Count it in the pusher's `pushed`.
    pub(super) count: bool,
    /// Push even though the queue is closed (to a cell not yet sealed).
    pub(super) force: bool,
}

impl PushFlags {
    /// A worker's or the owner's own push.
    pub(super) const NEW: Self = Self { count: true, force: false };
    /// The owner's redelivery.
    pub(super) const AGAIN: Self = Self { count: false, force: true };
}

/// A popped task, copied out of its cell.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct TaskData {
    /// Where it was popped (the cell and lap its lease is on).
    pub(super) position: u64,
    pub(super) id: u64,
    pub(super) attempt: u32,
    pub(super) record: Vec<u8>,
}

/// What one reclaim pass over a gone worker's cells found.
#[derive(Debug, Default)]
pub(super) struct Reclaimed {
    /// Its leases, now the owner's.
    pub(super) stolen: Vec<TaskData>,
    /// Its unfinished pushes, turned into holes.
    pub(super) abandoned: u64,
    /// More leases are left than the pass could take.
    pub(super) more: bool,
}

/// How many cells one sweep found in each state that holds work (a count while peers move: exact only when they
/// stop).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(super) struct Census {
    /// Pushes claimed and not yet published.
    pub(super) writing: u64,
    /// Tasks queued.
    pub(super) full: u64,
    /// Tasks in someone's hands (workers', the owner's, given back, or being taken back).
    pub(super) leased: u64,
}

impl Census {
    /// Cells that hold work.
    pub(super) fn in_flight(&self) -> u64 {
        self.writing + self.full + self.leased
    }
}

/// What one sweep of the owner over every cell found and took.
#[derive(Debug, Default)]
pub(super) struct Swept {
    /// Tasks given back, or whose lease expired, now held by the owner ([`TAKEN`](super::layout::TAKEN)).
    pub(super) stolen: Vec<TaskData>,
    /// More were due than the pass could take.
    pub(super) more: bool,
    /// The cells' states, as the pass saw them before it took anything.
    pub(super) census: Census,
}

/// Who does the operations of one process on one queue.
pub(super) enum Engine {
    /// The CPU, on host memory; with the owner's record of the leases it has seen (see [`Engine::sweep`]).
    Host(Geometry, Mutex<Vec<(u64, Instant)>>),
    /// The GPU, through the queue's kernels (one stream and staging area, used by one thread at a time).
    Gpu(Box<Mutex<GpuOps>>),
}

impl Engine {
    /// The engine for memory reached as `access`; device memory needs `cuda`.
    pub(super) fn new(access: MemoryAccess<'_>, cuda: Option<&Context>, g: Geometry) -> Result<Self, QueueError> {
        match (access, cuda) {
            (MemoryAccess::Host(memory), _) => {
                HostQueue::new(memory, g)?;
                Ok(Self::Host(g, Mutex::new(Vec::new())))
            }
            (MemoryAccess::Device(_), Some(ctx)) => Ok(Self::Gpu(Box::new(Mutex::new(GpuOps::new(ctx, g)?)))),
            (MemoryAccess::Device(_), None) => Err(QueueError::NeedsGpu { what: "a queue in device memory" }),
        }
    }

    /// Runs `host` or `gpu`, whichever matches the engine and the memory.
    fn with<T>(
        &self,
        access: MemoryAccess<'_>,
        host: impl FnOnce(&HostQueue<'_>) -> T,
        gpu: impl FnOnce(&mut GpuOps, gpu_ipc_driver::DeviceSpan<'_>) -> Result<T, QueueError>,
    ) -> Result<T, QueueError> {
        match (self, access) {
            (Self::Host(g, _), MemoryAccess::Host(memory)) => Ok(host(&HostQueue::new(memory, *g)?)),
            (Self::Gpu(ops), MemoryAccess::Device(span)) => {
                let mut ops = ops.lock().unwrap_or_else(PoisonError::into_inner);
                gpu(&mut ops, span)
            }
            _ => Err(QueueError::Layout("the engine and the memory disagree on where the queue lives".into())),
        }
    }

    /// Whether no operation's kernel may still run (always, on the host).
    pub(super) fn settled(&self) -> bool {
        match self {
            Self::Host(..) => true,
            Self::Gpu(ops) => ops.lock().unwrap_or_else(PoisonError::into_inner).settled(),
        }
    }

    pub(super) fn init(&self, access: MemoryAccess<'_>) -> Result<(), QueueError> {
        self.with(access, |q| q.init(), |ops, span| ops.init(span))
    }

    pub(super) fn push(
        &self,
        access: MemoryAccess<'_>,
        slot: u16,
        requests: &[PushRequest<'_>],
        flags: PushFlags,
    ) -> Result<Vec<(Status, u64)>, QueueError> {
        self.with(access, |q| q.push(slot, requests, flags), |ops, span| ops.push(span, slot, requests, flags))
    }

    pub(super) fn pop(
        &self,
        access: MemoryAccess<'_>,
        slot: u16,
        max: usize,
    ) -> Result<(Vec<TaskData>, Status), QueueError> {
        self.with(access, |q| q.pop(slot, max), |ops, span| ops.pop(span, slot, max))
    }

    pub(super) fn complete(
        &self,
        access: MemoryAccess<'_>,
        slot: u16,
        positions: &[u64],
        count: bool,
    ) -> Result<Vec<bool>, QueueError> {
        self.with(
            access,
            |q| q.complete(slot, positions, count),
            |ops, span| ops.complete(span, slot, positions, count),
        )
    }

    /// Hands the leases of `positions` held by `slot` back to the owner (holder [`GIVEN_BACK`]); `true` where the
    /// lease was still `slot`'s.
    ///
    /// [`GIVEN_BACK`]: super::layout::GIVEN_BACK
    pub(super) fn give_back(
        &self,
        access: MemoryAccess<'_>,
        slot: u16,
        positions: &[u64],
    ) -> Result<Vec<bool>, QueueError> {
        self.with(access, |q| q.give_back(slot, positions), |ops, span| ops.give_back(span, slot, positions))
    }

    /// The owner's pass over every cell: counts the cells that hold work, and takes over (holder
    /// [`TAKEN`](super::layout::TAKEN)) up to `max` tasks that were given back or whose lease has been seen, by
    /// this pass and earlier ones, held by the same holder in the same lap for `lease` or longer. The record of
    /// what was seen when lives with the engine (host memory, or device memory the GPU's clock stamps), so a lease
    /// runs from the first pass that saw it, not from the pop: no clock is shared with the workers.
    pub(super) fn sweep(&self, access: MemoryAccess<'_>, lease: Duration, max: usize) -> Result<Swept, QueueError> {
        match (self, access) {
            (Self::Host(g, seen), MemoryAccess::Host(memory)) => {
                let mut seen = seen.lock().unwrap_or_else(PoisonError::into_inner);
                Ok(HostQueue::new(memory, *g)?.sweep(&mut seen, lease, max))
            }
            (Self::Gpu(ops), MemoryAccess::Device(span)) => {
                ops.lock().unwrap_or_else(PoisonError::into_inner).sweep(span, lease, max)
            }
            _ => Err(QueueError::Layout("the engine and the memory disagree on where the queue lives".into())),
        }
    }

    /// The word at byte `offset` of the queue.
    pub(super) fn word(&self, access: MemoryAccess<'_>, offset: u64) -> Result<u64, QueueError> {
        self.with(access, |q| q.word_at(offset), |ops, span| ops.word(span, offset))
    }

    pub(super) fn reclaim(
        &self,
        access: MemoryAccess<'_>,
        owner: u16,
        dead: u16,
        max: usize,
    ) -> Result<Reclaimed, QueueError> {
        self.with(access, |q| q.reclaim(owner, dead, max), |ops, span| ops.reclaim(span, owner, dead, max))
    }

    pub(super) fn add(&self, access: MemoryAccess<'_>, offset: u64, value: u64) -> Result<(), QueueError> {
        self.with(access, |q| q.add(offset, value), |ops, span| ops.add(span, offset, value))
    }

    pub(super) fn close(&self, access: MemoryAccess<'_>) -> Result<(), QueueError> {
        self.with(access, |q| q.close(), |ops, span| ops.close(span))
    }

    pub(super) fn header(&self, access: MemoryAccess<'_>) -> Result<[u64; 8], QueueError> {
        self.with(access, |q| q.header(), |ops, span| ops.header(span))
    }

    /// The header and the worker table, word by word.
    pub(super) fn snapshot(&self, access: MemoryAccess<'_>) -> Result<Vec<u64>, QueueError> {
        self.with(access, |q| q.snapshot(), |ops, span| ops.snapshot(span))
    }

    /// The counters of every worker slot and of the header, summed.
    pub(super) fn stats(&self, access: MemoryAccess<'_>, g: &Geometry) -> Result<QueueStats, QueueError> {
        Ok(stats_of(&self.snapshot(access)?, g))
    }
}

/// The statistics in a snapshot of the header and the worker table (word `i` at byte `8 * i`).
pub(super) fn stats_of(words: &[u64], g: &Geometry) -> QueueStats {
    let at = |offset: u64| words.get((offset / 8) as usize).copied().unwrap_or(0);
    let sum = |counter: u64| -> u64 {
        (0..g.max_workers).map(|slot| at(g.worker_entry(slot as u16) + counter)).fold(0, u64::wrapping_add)
    };
    let enqueue = at(header::ENQUEUE);
    let dequeue = at(header::DEQUEUE);
    let (pushed, popped, completed) = (sum(worker::PUSHED), sum(worker::POPPED), sum(worker::COMPLETED));
    let (redelivered, lost, abandoned) = (at(header::REDELIVERED), at(header::LOST), at(header::ABANDONED));
    QueueStats {
        pushed,
        popped,
        completed,
        redelivered,
        lost,
        abandoned,
        queued: (enqueue & !super::layout::CLOSED).saturating_sub(dequeue),
        in_hand: popped.saturating_sub(completed).saturating_sub(redelivered).saturating_sub(lost),
        closed: enqueue & super::layout::CLOSED != 0,
    }
}

/// The statistics an owner can stand behind: what the cells and the owner's own counters say, not what the workers
/// counted. `words` is a snapshot of the header and the worker table, `census` a sweep's count of the cells, and
/// `backlog` the tasks the owner took back and has not pushed again yet.
///
/// Every position below the enqueue position was claimed by one push, and every claim ended in one of: a hole (its
/// pusher went before publishing, `abandoned`), a push still being written, or a delivery; every delivery is
/// queued, in someone's hands, taken back (then pushed again, `redelivered`; reported `lost`; or in the backlog),
/// or completed. So completions are what is left, and a completion is counted by the one compare-and-swap that
/// frees the cell, with nothing after it that a crash could skip; the same holds for pushes. The workers' own
/// counters (`popped`, and the per-slot `pushed` and `completed` words) can fall one short for each peer killed
/// between its compare-and-swap and its count, so only `popped` comes from them.
pub(super) fn derived_stats(words: &[u64], census: Census, backlog: u64, g: &Geometry) -> QueueStats {
    let counted = stats_of(words, g);
    let at = |offset: u64| words.get((offset / 8) as usize).copied().unwrap_or(0);
    let claims = at(header::ENQUEUE) & !super::layout::CLOSED;
    let published = claims.saturating_sub(counted.abandoned).saturating_sub(census.writing);
    let taken_back = counted.redelivered + counted.lost + backlog;
    QueueStats {
        pushed: published.saturating_sub(counted.redelivered),
        completed: published.saturating_sub(census.full + census.leased).saturating_sub(taken_back),
        queued: census.full,
        in_hand: census.leased,
        ..counted
    }
}
