//! What the queue hands out and reports: a popped [`Task`] (a move-only lease), [`QueueStats`], [`LostTask`].

use super::ops::TaskData;
use crate::queue::error::QueueError;

/// What a [`Task`] needs from the queue it came from.
pub(super) trait Lessor: Sync {
    /// Gives up the leases on `positions`, counted as completions; `false` where one was no longer this process's.
    fn complete(&self, positions: &[u64]) -> Result<Vec<bool>, QueueError>;
    /// Hands the leases on `positions` back to the owner, to be pushed again; `false` where one was no longer this
    /// process's.
    fn give_back(&self, positions: &[u64]) -> Result<Vec<bool>, QueueError>;
}

/// Completes `tasks` (those leased by `lessor` with one call, others each through their own queue handle).
///
/// # Errors
/// [`QueueError::LeaseLost`] for the first task that was taken back (the others are completed all the same), or the
/// GPU's error.
pub(super) fn complete_all(lessor: &dyn Lessor, tasks: Vec<Task<'_>>) -> Result<(), QueueError> {
    let (mine, others): (Vec<Task<'_>>, Vec<Task<'_>>) =
        tasks.into_iter().partition(|t| std::ptr::addr_eq(t.lessor as *const dyn Lessor, lessor as *const dyn Lessor));
    let positions: Vec<u64> = mine.iter().map(|t| t.data.position).collect();
    let done = lessor.complete(&positions)?;
    let mut first_lost = None;
    for (mut task, completed) in mine.into_iter().zip(done) {
        task.done = true;
        if !completed && first_lost.is_none() {
            first_lost = Some(task.data.id);
        }
    }
    for task in others {
        if let Err(e) = task.complete() {
            first_lost.get_or_insert(match e {
                QueueError::LeaseLost { id } => id,
                other => return Err(other),
            });
        }
    }
    first_lost.map_or(Ok(()), |id| Err(QueueError::LeaseLost { id }))
}

/// A popped task, leased to this process until [`complete`](Task::complete)d or [`give_back`](Task::give_back)n.
/// Move-only: completing consumes it, so it cannot be completed twice, and it cannot outlive the queue handle it
/// came from.
///
/// Dropping it without completing gives it back (as [`Task::give_back`] does, errors logged): the owner's next
/// sweep pushes it again, with [`attempt`](Task::attempt) one higher. A lease also ends on its own after the
/// queue's [`lease`](super::QueueConfig::lease), and when this worker goes.
#[must_use = "a task dropped without being completed is handed out again"]
pub struct Task<'q> {
    lessor: &'q dyn Lessor,
    data: TaskData,
    done: bool,
}

impl std::fmt::Debug for Task<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Task")
            .field("id", &self.data.id)
            .field("attempt", &self.data.attempt)
            .field("bytes", &self.data.record.len())
            .finish_non_exhaustive()
    }
}

impl<'q> Task<'q> {
    pub(super) fn new(lessor: &'q dyn Lessor, data: TaskData) -> Self {
        Self { lessor, data, done: false }
    }

    /// The task's id: the position of its first push, unique for the queue's life; kept when it is handed out
    /// again.
    pub fn id(&self) -> u64 {
        self.data.id
    }

    /// How many times it was handed out before this (0 the first time). Above 0, a worker that had it died (or
    /// detached) before completing it: its work may have been done, in part or in full, once already.
    pub fn attempt(&self) -> u32 {
        self.data.attempt
    }

    /// The record, as pushed.
    pub fn record(&self) -> &[u8] {
        &self.data.record
    }

    /// Marks it done: from now on it is never handed out again. One compare-and-swap of the cell's state word,
    /// which is also what the owner counts, so a crash right after it loses no count.
    ///
    /// # Errors
    /// [`QueueError::LeaseLost`] when the owner had taken it back (this worker's connection hung up, or the lease
    /// expired) to hand it to another worker: its result must not be reported; the redelivered copy's completion
    /// is the one that counts. Or the GPU's error.
    pub fn complete(mut self) -> Result<(), QueueError> {
        self.done = true;
        if self.lessor.complete(&[self.data.position])?.first().copied().unwrap_or(false) {
            Ok(())
        } else {
            Err(QueueError::LeaseLost { id: self.data.id })
        }
    }

    /// Gives it back without doing it: the owner's next sweep (within
    /// [`QueueConfig::sweep_every`](super::QueueConfig::sweep_every)) pushes it again for any worker, with
    /// [`attempt`](Task::attempt) one higher (a give-back counts as a delivery towards
    /// [`max_deliveries`](super::QueueConfig::max_deliveries)). One compare-and-swap.
    ///
    /// # Errors
    /// [`QueueError::LeaseLost`] when the owner had taken it back already. Or the GPU's error.
    pub fn give_back(mut self) -> Result<(), QueueError> {
        self.done = true;
        if self.lessor.give_back(&[self.data.position])?.first().copied().unwrap_or(false) {
            Ok(())
        } else {
            Err(QueueError::LeaseLost { id: self.data.id })
        }
    }
}

impl Drop for Task<'_> {
    fn drop(&mut self) {
        if self.done {
            return;
        }
        match self.lessor.give_back(&[self.data.position]) {
            Ok(back) if back.first().copied().unwrap_or(false) => {
                tracing::debug!(id = self.data.id, "a task was dropped without being completed: given back");
            }
            Ok(_) => tracing::debug!(id = self.data.id, "a task was dropped after the owner had taken it back"),
            Err(error) => tracing::warn!(
                id = self.data.id,
                %error,
                "a task was dropped without being completed and could not be given back: it comes back when its \
                 lease expires or this worker goes"
            ),
        }
    }
}

/// A task the owner took back from a gone worker and did not hand out again.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LostTask {
    /// Its id.
    pub id: u64,
    /// Times it was handed out.
    pub deliveries: u32,
    /// Its record.
    pub record: Vec<u8>,
    /// Why it was not handed out again.
    pub reason: LostReason,
}

/// Why a task taken back was reported rather than handed out again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LostReason {
    /// It was handed out [`QueueConfig::max_deliveries`](super::QueueConfig::max_deliveries) times and each holder
    /// went before completing it (a task that kills its workers is not handed to the next one).
    TooManyDeliveries,
    /// The queue was closed and drained: no pop would ever reach it.
    QueueClosed,
}

/// Counts over the queue's life (approximate while peers run; exact when they stop).
///
/// Every delivery ends in exactly one of: `completed`, `redelivered` (taken back, from a gone worker, an expired
/// lease or a give-back, and pushed again), `lost` (taken back and reported, see [`LostTask`]), or it is still
/// `in_hand`. The owner's [`WorkQueue::stats`](super::WorkQueue::stats) derives `pushed`, `completed`, `queued`
/// and `in_hand` from the cells' state words and its own counters, so they hold even when a peer was killed in
/// the middle of an operation; a worker's [`QueueWorker::stats`](super::QueueWorker::stats) sums the workers'
/// counters, which can fall one short for each peer killed between a state change and its count.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct QueueStats {
    /// Tasks pushed (redeliveries not counted).
    pub pushed: u64,
    /// Deliveries: tasks popped.
    pub popped: u64,
    /// Tasks completed.
    pub completed: u64,
    /// Tasks taken back (a gone worker's, expired, or given back) and pushed again.
    pub redelivered: u64,
    /// Tasks taken back and reported as lost.
    pub lost: u64,
    /// Pushes cut off by their pusher's end before they were published (never tasks).
    pub abandoned: u64,
    /// Positions pushed and not yet popped.
    pub queued: u64,
    /// Deliveries not completed, taken back or lost: tasks in workers' hands.
    pub in_hand: u64,
    /// Whether the queue is closed to new pushes.
    pub closed: bool,
}
