//! The owner's reaper thread: once a worker is gone (its connection hung up) and
//! [`QueueConfig::reclaim_after`](super::QueueConfig::reclaim_after) has passed, it takes the worker's leases over,
//! frees their cells and pushes the tasks again with their attempt counted, or reports them lost after
//! [`QueueConfig::max_deliveries`](super::QueueConfig::max_deliveries); the worker's unfinished pushes become holes
//! that pops skip. Then the worker's slot is free for the next worker.
//!
//! Why wait: a process that is killed closes its sockets first, while its last kernels may still run for a while
//! (the driver tears its GPU work down as the process exits). Every change of a cell's state is a compare-and-swap
//! on the whole state word, holder included, so a late completion or publish by the dead worker fails once the
//! owner holds the cell; only the bytes of a record it was still writing could land late, and the wait keeps
//! them off a cell that another push may already reuse.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use super::QueueBackend;
use super::layout::{OWNER_SLOT, header};
use super::ops::{PushFlags, PushRequest, Status, TaskData};
use super::owner::{Owner, Slot};
use super::task::{LostReason, LostTask};
use crate::queue::error::QueueError;

/// Leases taken over in one pass (one staging batch on the GPU).
const PASS: usize = 256;
/// How soon the reaper tries again to push tasks that did not fit, or to reclaim a slot after an error.
const RETRY: Duration = Duration::from_millis(5);
/// How long it sleeps with nothing to do (a gone worker or a stop wakes it at once).
const IDLE: Duration = Duration::from_millis(100);

/// The reaper's loop, until the owner stops.
pub(super) fn run<B: QueueBackend>(owner: &Owner<B>) {
    loop {
        hold_the_seal(owner);
        let due = {
            let mut state = owner.lock();
            if owner.stop.load(Ordering::Acquire) {
                return;
            }
            let now = Instant::now();
            let (due, later): (Vec<_>, Vec<_>) = state.gone.drain(..).partition(|(_, when)| *when <= now);
            state.gone = later;
            if due.is_empty() && state.backlog.is_empty() {
                let next = state.gone.iter().map(|(_, when)| *when).min();
                let nap = next.map_or(IDLE, |when| when.saturating_duration_since(now).min(IDLE));
                let _ = owner.wake.wait_timeout(state, nap);
                continue;
            }
            due
        };
        for (slot, _) in due {
            match reclaim(owner, slot) {
                Ok(()) => owner.lock().slots[usize::from(slot)] = Slot::Free,
                Err(error) => {
                    tracing::error!(slot, %error, "work queue: taking a gone worker's tasks back failed; trying again");
                    owner.lock().gone.push((slot, Instant::now() + RETRY));
                }
            }
        }
        match redeliver(owner) {
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

/// Keeps the header's `RECLAIMING` word nonzero while a gone worker's cells are still to be looked at or tasks
/// taken back are still to be pushed again: pops do not seal a closed queue meanwhile (they say "empty", and the
/// tasks come back to them), so that closing and a worker's death at the same time lose nothing. Raised as soon as
/// the reaper hears of the death, long before `reclaim_after` has passed.
fn hold_the_seal<B: QueueBackend>(owner: &Owner<B>) {
    let wanted = {
        let state = owner.lock();
        !state.backlog.is_empty() || state.slots.contains(&Slot::Reclaiming)
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
        let pass = local.engine().reclaim(local.access(), OWNER_SLOT, slot, PASS)?;
        if pass.abandoned > 0 {
            tracing::info!(slot, pushes = pass.abandoned, "work queue: a gone worker's unfinished pushes were dropped");
        }
        let positions: Vec<u64> = pass.stolen.iter().map(|task| task.position).collect();
        let mut lost = 0;
        {
            let mut state = owner.lock();
            for task in pass.stolen {
                let deliveries = task.attempt.saturating_add(1);
                if deliveries >= owner.config.max_deliveries {
                    tracing::warn!(
                        id = task.id,
                        deliveries,
                        "work queue: a task's holders all went; reporting it lost"
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
        if !positions.is_empty() {
            tracing::info!(slot, tasks = positions.len(), "work queue: took a gone worker's tasks back");
            local.engine().complete(local.access(), OWNER_SLOT, &positions, false)?;
        }
        if !pass.more {
            return Ok(());
        }
    }
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
                owner.lock().backlog.pop_front();
                local.engine().add(local.access(), header::REDELIVERED, 1)?;
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
