//! The work queue's leases on the host backend, owner and workers in one process: a `Task` dropped in a live
//! worker goes back to the queue, an explicit give-back, a lease that expires is handed out again and its late
//! completion refused (one completion counts), give-backs count towards `max_deliveries`, a task given back after
//! `close` is still handed out before the queue ends, and the owner's timeout says what is in flight.
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "../../ipc-core/tests/common/mod.rs"]
mod common;

use std::time::Duration;

use ipc_core::host::{Host, HostContext};
use ipc_toolkit::queue::{LostReason, QueueConfig, QueueError, QueueWorker, WorkQueue, WorkerOptions};

const T: Duration = Duration::from_secs(5);

/// Sweeps every 10 ms; leases of `lease`.
fn owner(name: &str, lease: Duration) -> WorkQueue<Host> {
    let config = QueueConfig {
        reclaim_after: Duration::from_millis(50),
        lease,
        sweep_every: Duration::from_millis(10),
        ..QueueConfig::new(16, 8)
    };
    WorkQueue::<Host>::create(&HostContext, common::sock("queue-lease", name), config).unwrap()
}

fn worker(queue: &WorkQueue<Host>, name: &str) -> QueueWorker<Host> {
    let options = WorkerOptions { name: name.into(), ..WorkerOptions::default() };
    QueueWorker::<Host>::attach(&HostContext, queue.socket(), &options).unwrap()
}

#[test]
fn a_task_dropped_in_a_live_worker_goes_back_to_the_queue() {
    let queue = owner("dropped", Duration::from_secs(60));
    let (a, b) = (worker(&queue, "a"), worker(&queue, "b"));
    let id = queue.push(b"dropped!", T).unwrap();
    drop(a.pop(T).unwrap());
    // Worker a is alive and attached, its lease far from expiring: the task comes back because it was dropped.
    let again = b.pop(T).unwrap();
    assert_eq!((again.id(), again.attempt(), again.record()), (id, 1, &b"dropped!"[..]));
    again.complete().unwrap();
    let stats = queue.wait_until_done(T).unwrap();
    assert_eq!((stats.pushed, stats.completed, stats.redelivered, stats.lost), (1, 1, 1, 0));
}

#[test]
fn a_task_given_back_is_handed_to_the_next_pop_and_counts_as_a_delivery() {
    let queue = WorkQueue::<Host>::create(
        &HostContext,
        common::sock("queue-lease", "give-back"),
        QueueConfig { max_deliveries: 2, sweep_every: Duration::from_millis(10), ..QueueConfig::new(8, 8) },
    )
    .unwrap();
    let w = worker(&queue, "w");
    let id = queue.push(b"give it", T).unwrap();
    w.pop(T).unwrap().give_back().unwrap();
    let again = w.pop(T).unwrap();
    assert_eq!((again.id(), again.attempt()), (id, 1));
    // The second give-back is the second delivery: reported lost, not handed out a third time.
    again.give_back().unwrap();
    assert!(matches!(w.pop(Duration::from_millis(200)), Err(QueueError::Timeout { .. })));
    let stats = queue.wait_until_done(T).unwrap();
    assert_eq!((stats.pushed, stats.completed, stats.redelivered, stats.lost), (1, 0, 1, 1));
    let lost = queue.take_lost();
    assert_eq!(lost.len(), 1);
    assert_eq!((lost[0].id, lost[0].deliveries, lost[0].reason), (id, 2, LostReason::TooManyDeliveries));
}

#[test]
fn an_expired_lease_is_handed_out_again_and_only_one_completion_counts() {
    let queue = owner("expired", Duration::from_millis(150));
    let (slow, fast) = (worker(&queue, "slow"), worker(&queue, "fast"));
    let id = queue.push(b"slowpoke", T).unwrap();
    let late = slow.pop(T).unwrap();
    // Nobody else can have it while the lease runs.
    assert!(matches!(fast.pop(Duration::from_millis(60)), Err(QueueError::Timeout { .. })));
    let again = fast.pop(T).unwrap();
    assert_eq!((again.id(), again.attempt()), (id, 1));
    // The slow worker finishes after its lease was taken back: refused, its result is not to be reported.
    assert!(matches!(late.complete(), Err(QueueError::LeaseLost { id: lost }) if lost == id));
    again.complete().unwrap();
    let stats = queue.wait_until_done(T).unwrap();
    assert_eq!((stats.pushed, stats.completed, stats.redelivered, stats.lost), (1, 1, 1, 0));
    assert_eq!((stats.queued, stats.in_hand), (0, 0));
}

#[test]
fn a_lease_completed_in_time_is_not_handed_out_again() {
    let queue = owner("in-time", Duration::from_millis(400));
    let (a, b) = (worker(&queue, "a"), worker(&queue, "b"));
    queue.push(b"on time!", T).unwrap();
    let task = a.pop(T).unwrap();
    std::thread::sleep(Duration::from_millis(50));
    task.complete().unwrap();
    // Well past the lease and a sweep: nothing comes back.
    assert!(matches!(b.pop(Duration::from_millis(700)), Err(QueueError::Timeout { .. })));
    let stats = queue.wait_until_done(T).unwrap();
    assert_eq!((stats.pushed, stats.completed, stats.redelivered), (1, 1, 0));
}

#[test]
fn a_task_given_back_after_close_is_handed_out_before_the_queue_ends() {
    let queue = owner("closed", Duration::from_secs(60));
    let (a, b) = (worker(&queue, "a"), worker(&queue, "b"));
    let id = queue.push(b"the last", T).unwrap();
    queue.close().unwrap();
    let held = a.pop(T).unwrap();
    // Drained, but a task is in a's hands and may come back: b's pop waits rather than see the end.
    assert!(matches!(b.pop(Duration::from_millis(100)), Err(QueueError::Timeout { .. })));
    drop(held);
    let again = b.pop(T).unwrap();
    assert_eq!((again.id(), again.attempt()), (id, 1));
    again.complete().unwrap();
    assert!(matches!(b.pop(T), Err(QueueError::Closed)));
    assert!(matches!(a.pop(T), Err(QueueError::Closed)));
    let stats = queue.wait_until_done(T).unwrap();
    assert_eq!((stats.pushed, stats.completed, stats.lost), (1, 1, 0));
    assert!(queue.take_lost().is_empty());
}

#[test]
fn the_owners_timeout_says_how_many_tasks_are_done_in_flight_and_lost() {
    let queue = owner("not-done", Duration::from_secs(60));
    let w = worker(&queue, "w");
    for i in 0..3u8 {
        queue.push(&[i; 8], T).unwrap();
    }
    w.pop(T).unwrap().complete().unwrap();
    let _held = w.pop(T).unwrap();
    let error = queue.wait_until_done(Duration::from_millis(100)).unwrap_err();
    let QueueError::NotDone { pushed, completed, in_flight, queued, in_hand, pending, lost, .. } = error else {
        panic!("{error}");
    };
    assert_eq!((pushed, completed, in_flight, queued, in_hand, pending, lost), (3, 1, 2, 1, 1, 0, 0));
    let message = error.to_string();
    assert!(message.starts_with("1 of 3 tasks completed, 2 in flight (1 queued, 1 in workers' hands"), "{message}");
    assert!(message.contains("0 lost; timed out after"), "{message}");
}

#[test]
fn leases_and_sweeps_of_zero_are_refused() {
    for config in [
        QueueConfig { lease: Duration::ZERO, ..QueueConfig::new(8, 8) },
        QueueConfig { sweep_every: Duration::ZERO, ..QueueConfig::new(8, 8) },
    ] {
        let error = WorkQueue::<Host>::create(&HostContext, common::sock("queue-lease", "zero"), config);
        assert!(matches!(error, Err(QueueError::Config(_))), "{error:?}");
    }
}
