//! What the queue's operations say, whoever does them (the CPU on host memory, `host_ops.rs`, or the GPU on device
//! memory, `gpu_ops.rs`, both behind one `Engine`, `engine.rs`): their requests, results and statuses, and the
//! statistics read from a snapshot of the queue's words.

use super::QueueStats;
use super::layout::{Geometry, header, worker};

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
