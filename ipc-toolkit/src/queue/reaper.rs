//! The owner's reaper thread. It takes tasks back and pushes them again with their attempt counted (or reports
//! them lost after [`QueueConfig::max_deliveries`](super::QueueConfig::max_deliveries)):
//! - a gone worker's (its connection hung up), once
//!   [`QueueConfig::reclaim_after`](super::QueueConfig::reclaim_after) has passed; the worker's unfinished pushes
//!   become holes that pops skip, and then its slot is free for the next worker;
//! - every [`QueueConfig::sweep_every`](super::QueueConfig::sweep_every), a sweep over every cell: tasks given back,
//!   and leases its sweeps have seen held for [`QueueConfig::lease`](super::QueueConfig::lease).
//!
//! Taking a task over is one compare-and-swap to holder [`TAKEN`], so a late completion or give-back by the old
//! holder fails; the owner then copies the task out, frees the cell, and pushes it again. All of that, and the
//! owner's look at whether every task is done ([`settle`]), runs under one lock (`Owner::taking`), so the cells,
//! the backlog and the owner's counters always account for every task between two such steps.
//!
//! Why wait after a hang-up: a process that is killed closes its sockets first, while its last kernels may still
//! run for a while (the driver tears its GPU work down as the process exits). Every change of a cell's state is a
//! compare-and-swap on the whole state word, holder included, so a late completion or publish by the dead worker
//! fails once the owner holds the cell; only the bytes of a record it was still writing could land late, and the
//! wait keeps them off a cell that another push may already reuse.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use super::layout::{CLOSED, CellState, CellWord, OWNER_SLOT, TAKEN, cell, header, lap_delta};
use super::ops::{Census, PushFlags, PushRequest, Status, TaskData, derived_stats};
use super::shared::{Owner, Slot};
use super::task::{LostReason, LostTask};
use super::{QueueBackend, QueueStats};
use crate::queue::error::QueueError;

/// Leases taken over in one pass (one staging batch on the GPU).
const PASS: usize = 256;
/// How soon the reaper tries again to push tasks that did not fit, or to reclaim a slot after an error.
const RETRY: Duration = Duration::from_millis(5);
/// How often it sweeps a closed queue with nothing queued and tasks still in hand (its end waits for a sweep).
const TAIL_SWEEP: Duration = Duration::from_millis(5);
/// How long it sleeps at most with nothing to do (a gone worker or a stop wakes it at once).
const IDLE: Duration = Duration::from_millis(100);

/// The reaper's loop, until the owner stops.
pub(super) fn run<B: QueueBackend>(owner: &Owner<B>) {
    let mut next_sweep = Instant::now();
    loop {
        {
            let _taking = owner.taking();
            hold_the_seal(owner, None);
        }
        let due = {
            let mut state = owner.lock();
            if owner.stop.load(Ordering::Acquire) {
                return;
            }
            let now = Instant::now();
            let (due, later): (Vec<_>, Vec<_>) = state.gone.drain(..).partition(|(_, when)| *when <= now);
            state.gone = later;
            if due.is_empty() && state.backlog.is_empty() && now < next_sweep {
                let next = state.gone.iter().map(|(_, when)| *when).min().map_or(next_sweep, |w| w.min(next_sweep));
                let nap = next.saturating_duration_since(now).min(IDLE);
                let _ = owner.wake.wait_timeout(state, nap);
                continue;
            }
            due
        };
        let sweep = Instant::now() >= next_sweep;
        let outcome = {
            let _taking = owner.taking();
            for (slot, _) in due {
                match reclaim(owner, slot) {
                    Ok(()) => owner.lock().slots[usize::from(slot)] = Slot::Free,
                    Err(error) => {
                        tracing::error!(slot, %error, "work queue: taking a gone worker's tasks back failed; trying again");
                        owner.lock().gone.push((slot, Instant::now() + RETRY));
                    }
                }
            }
            if sweep {
                next_sweep = Instant::now() + owner.config.sweep_every;
                match sweep_all(owner) {
                    Ok(census) => {
                        hold_the_seal(owner, Some(census));
                        // The end of a closed queue waits for a sweep that sees nothing in flight: look often once
                        // nothing is queued, so that the last completion ends it soon.
                        if owner.closed.load(Ordering::Acquire) && census.full == 0 && census.in_flight() > 0 {
                            next_sweep = Instant::now() + owner.config.sweep_every.min(TAIL_SWEEP);
                        }
                    }
                    Err(error) => tracing::error!(%error, "work queue: the sweep over the cells failed; trying again"),
                }
            }
            redeliver(owner)
        };
        match outcome {
            Ok(true) => {}
            Ok(false) => {
                let state = owner.lock();
                let _ = owner.wake.wait_timeout(state, RETRY);
            }
            Err(error) => {
                tracing::error!(%error, "work queue: pushing tasks again failed; trying again");
                let state = owner.lock();
                let _ = owner.wake.wait_timeout(state, RETRY);
            }
        }
    }
}

/// Keeps the header's `RECLAIMING` word nonzero while pops must not seal a closed queue (they say "empty" meanwhile,
/// and the tasks come back to them): while a gone worker's cells are still to be looked at, tasks taken back are
/// still to be pushed again, or (the queue closed) the last sweep's `census` saw tasks in flight, any of which may
/// yet come back (given back, expired, or its holder gone). So closing, and a worker's death, expiry or give-back at
/// the same time, lose nothing. Without a census it only raises the word (a death is heard of long before
/// `reclaim_after` has passed); only a census lowers it for a closed queue. Called under `Owner::taking`.
fn hold_the_seal<B: QueueBackend>(owner: &Owner<B>, census: Option<Census>) {
    let pending = {
        let state = owner.lock();
        !state.backlog.is_empty() || state.slots.contains(&Slot::Reclaiming)
    };
    let closed = owner.closed.load(Ordering::Acquire);
    let wanted = match census {
        Some(census) => pending || (closed && census.in_flight() > 0),
        None => pending || owner.seal_held.load(Ordering::Acquire),
    };
    if let Err(error) = move_the_seal(owner, wanted) {
        tracing::error!(%error, "work queue: the reclaim gate could not be moved; trying again");
    }
}

/// Raises or lowers the header's `RECLAIMING` word (a no-op when it already is so).
pub(super) fn move_the_seal<B: QueueBackend>(owner: &Owner<B>, raise: bool) -> Result<(), QueueError> {
    if owner.seal_held.load(Ordering::Acquire) != raise {
        let local = &owner.local;
        local.engine().add(local.access(), header::RECLAIMING, if raise { 1 } else { u64::MAX })?;
        owner.seal_held.store(raise, Ordering::Release);
    }
    Ok(())
}

/// Takes every lease and unfinished push of worker `slot` back.
fn reclaim<B: QueueBackend>(owner: &Owner<B>, slot: u16) -> Result<(), QueueError> {
    let local = &owner.local;
    loop {
        let pass = local.engine().reclaim(local.access(), TAKEN, slot, PASS)?;
        if pass.abandoned > 0 {
            tracing::info!(slot, pushes = pass.abandoned, "work queue: a gone worker's unfinished pushes were dropped");
        }
        if !pass.stolen.is_empty() {
            tracing::info!(slot, tasks = pass.stolen.len(), "work queue: took a gone worker's tasks back");
        }
        take_back(owner, pass.stolen)?;
        if !pass.more {
            return Ok(());
        }
    }
}

/// One sweep over every cell (as many passes as it takes to take every task due): takes the tasks given back and
/// those whose lease expired. Returns the cells' census, less what it took.
fn sweep_all<B: QueueBackend>(owner: &Owner<B>) -> Result<Census, QueueError> {
    let local = &owner.local;
    loop {
        let swept = local.engine().sweep(local.access(), owner.config.lease, PASS)?;
        let taken = swept.stolen.len() as u64;
        if taken > 0 {
            tracing::info!(tasks = taken, "work queue: took back tasks given back or whose lease expired");
        }
        take_back(owner, swept.stolen)?;
        if !swept.more {
            let mut census = swept.census;
            census.leased = census.leased.saturating_sub(taken);
            return Ok(census);
        }
    }
}

/// Tasks the owner has taken over ([`TAKEN`]): into the backlog with their attempt counted, or reported lost after
/// `max_deliveries`; then their cells are freed.
fn take_back<B: QueueBackend>(owner: &Owner<B>, stolen: Vec<TaskData>) -> Result<(), QueueError> {
    if stolen.is_empty() {
        return Ok(());
    }
    let local = &owner.local;
    let positions: Vec<u64> = stolen.iter().map(|task| task.position).collect();
    let mut lost = 0;
    {
        let mut state = owner.lock();
        for task in stolen {
            let deliveries = task.attempt.saturating_add(1);
            if deliveries >= owner.config.max_deliveries {
                tracing::warn!(
                    id = task.id,
                    deliveries,
                    "work queue: a task was taken back from every holder; reporting it lost"
                );
                state.lost.push(LostTask {
                    id: task.id,
                    deliveries,
                    record: task.record,
                    reason: LostReason::TooManyDeliveries,
                });
                lost += 1;
            } else {
                state.backlog.push_back(TaskData { attempt: deliveries, ..task });
            }
        }
    }
    if lost > 0 {
        local.engine().add(local.access(), header::LOST, lost)?;
    }
    local.engine().complete(local.access(), TAKEN, &positions, false)?;
    Ok(())
}

/// The owner's look at whether every task pushed so far is done: a sweep (which also takes back what is due), the
/// tasks taken back pushed again, then the counters and the cells. Returns whether nothing is left (no cell holds
/// work, nothing waits to be pushed again, and no push started while it looked), with the statistics derived from
/// the cells ([`derived_stats`]) and how many tasks or gone workers' cells wait to be taken back or pushed again.
pub(super) fn settle<B: QueueBackend>(owner: &Owner<B>) -> Result<(bool, QueueStats, u64), QueueError> {
    let local = &owner.local;
    let engine = local.engine();
    let _taking = owner.taking();
    let before = engine.word(local.access(), header::ENQUEUE)?;
    let census = sweep_all(owner)?;
    redeliver(owner)?;
    let words = engine.snapshot(local.access())?;
    let after = words.get((header::ENQUEUE / 8) as usize).copied().unwrap_or(0);
    // A push that claimed the next cell after the sweep passed it has not moved the enqueue position yet: the
    // cell says so.
    let next = after & !CLOSED;
    let word = CellWord::unpack(engine.word(local.access(), local.g.cell(next) + cell::STATE)?);
    let untouched =
        lap_delta(word.lap, local.g.lap(next)) == 0 && matches!(word.state, Some(CellState::Empty | CellState::Sealed));
    let (backlog, reclaiming) = {
        let state = owner.lock();
        (state.backlog.len() as u64, state.slots.iter().filter(|s| **s == Slot::Reclaiming).count() as u64)
    };
    let stats = derived_stats(&words, census, backlog, &local.g);
    let quiet = census.in_flight() == 0 && backlog == 0 && before == after && untouched;
    Ok((quiet, stats, backlog + reclaiming))
}

/// Pushes the backlog again, oldest first; `false` when some did not fit yet.
fn redeliver<B: QueueBackend>(owner: &Owner<B>) -> Result<bool, QueueError> {
    let local = &owner.local;
    loop {
        let Some(task) = owner.lock().backlog.front().cloned() else { return Ok(true) };
        let request = PushRequest { record: &task.record, id: Some(task.id), attempt: task.attempt };
        let outcome = local.engine().push(local.access(), OWNER_SLOT, &[request], PushFlags::AGAIN)?;
        match outcome.first().map(|(status, _)| *status) {
            Some(Status::Ok) => {
                local.engine().add(local.access(), header::REDELIVERED, 1)?;
                owner.lock().backlog.pop_front();
            }
            Some(Status::Closed) => {
                let mut state = owner.lock();
                state.backlog.pop_front();
                state.lost.push(LostTask {
                    id: task.id,
                    deliveries: task.attempt,
                    record: task.record,
                    reason: LostReason::QueueClosed,
                });
                drop(state);
                tracing::warn!(id = task.id, "work queue: closed and drained; a task taken back is reported lost");
                local.engine().add(local.access(), header::LOST, 1)?;
            }
            _ => return Ok(false),
        }
    }
}
