//! What the queue hands out and reports: a popped [`Task`] (a move-only lease), [`QueueStats`], [`LostTask`].

use super::ops::TaskData;
use crate::queue::error::QueueError;

/// What a [`Task`] needs from the queue it came from.
pub(super) trait Lessor: Sync {
    /// Gives up the leases on `positions`, counted as completions; `false` where one was no longer this process's.
    fn complete(&self, positions: &[u64]) -> Result<Vec<bool>, QueueError>;
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

/// A popped task, leased to this process until [`complete`](Task::complete)d. Move-only: completing consumes it,
/// so it cannot be completed twice, and it cannot outlive the queue handle it came from.
///
/// Dropping it without completing leaves it leased: it is handed out again only once this worker is gone
/// (detached or dead), by the owner, with [`attempt`](Task::attempt) one higher.
#[must_use = "a task stays leased to this worker until it is completed"]
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

    /// Marks it done: from now on it is never handed out again.
    ///
    /// # Errors
    /// [`QueueError::LeaseLost`] when the owner had taken it back (it saw this worker's connection hang up) and
    /// handed it to another worker: its result must not be reported. Or the GPU's error.
    pub fn complete(mut self) -> Result<(), QueueError> {
        self.done = true;
        if self.lessor.complete(&[self.data.position])?.first().copied().unwrap_or(false) {
            Ok(())
        } else {
            Err(QueueError::LeaseLost { id: self.data.id })
        }
    }
}

impl Drop for Task<'_> {
    fn drop(&mut self) {
        if !self.done {
            tracing::warn!(
                id = self.data.id,
                "a task was dropped without being completed: it stays leased to this worker until the worker goes"
            );
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

/// Counts over the queue's life, from its shared counters (approximate while peers run; exact when they stop).
///
/// Every delivery ends in exactly one of: `completed`, `redelivered` (taken back from a gone worker and pushed
/// again), `lost` (taken back and reported, see [`LostTask`]), or it is still `in_hand`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct QueueStats {
    /// Tasks pushed (redeliveries not counted).
    pub pushed: u64,
    /// Deliveries: tasks popped.
    pub popped: u64,
    /// Tasks completed.
    pub completed: u64,
    /// Tasks taken back from a gone worker and pushed again.
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
