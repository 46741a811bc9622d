//! The work queue through its door on the host backend, owner and workers in one process: round trips, the
//! owner's accounting when a worker goes holding tasks (handed out again, then reported lost), the owner's end,
//! closing, slots running out, and malformed calls.
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "../../ipc-core/tests/common/mod.rs"]
mod common;

use std::time::{Duration, Instant};

use ipc_core::host::{Host, HostContext};
use ipc_core::wire::RefusalCode;
use ipc_toolkit::door::DoorError;
use ipc_toolkit::queue::{LostReason, QueueConfig, QueueError, QueueWorker, WorkQueue, WorkerOptions};

const T: Duration = Duration::from_secs(5);

fn owner(name: &str, config: QueueConfig) -> WorkQueue<Host> {
    WorkQueue::<Host>::create(&HostContext, common::sock("queue", name), config).unwrap()
}

fn fast(capacity: u64, record_bytes: u32) -> QueueConfig {
    QueueConfig { reclaim_after: Duration::from_millis(50), ..QueueConfig::new(capacity, record_bytes) }
}

fn worker(queue: &WorkQueue<Host>, name: &str) -> QueueWorker<Host> {
    let options = WorkerOptions { name: name.into(), ..WorkerOptions::default() };
    QueueWorker::<Host>::attach(&HostContext, queue.socket(), &options).unwrap()
}

#[test]
fn tasks_go_from_owner_to_workers_and_back_with_their_ids_and_records() {
    let queue = owner("round-trip", fast(16, 24));
    let (a, b) = (worker(&queue, "a"), worker(&queue, "b"));
    assert_ne!(a.worker(), b.worker());
    assert!(a.worker() > 0 && b.worker() > 0, "slot 0 is the owner's");
    let ids: Vec<u64> = (0..3u8).map(|i| queue.push(&[i; 24], T).unwrap()).collect();
    assert_eq!(ids, [0, 1, 2]);
    let id = a.push(b"from a", T).unwrap();
    assert_eq!(id, 3);
    let first = b.pop(T).unwrap();
    assert_eq!((first.id(), first.attempt(), first.record()), (0, 0, &[0u8; 24][..]));
    first.complete().unwrap();
    let batch = a.pop_many(8, T).unwrap();
    let records: Vec<&[u8]> = batch.iter().map(|t| t.record()).collect();
    assert_eq!(records, [&[1u8; 24][..], &[2u8; 24][..], b"from a"]);
    a.complete_many(batch).unwrap();
    let stats = queue.stats().unwrap();
    assert_eq!((stats.pushed, stats.popped, stats.completed, stats.in_hand, stats.queued), (4, 4, 4, 0, 0));
    assert_eq!(b.stats().unwrap(), stats, "every peer reads the same counters");
    assert!(matches!(a.pop(Duration::from_millis(20)), Err(QueueError::Timeout { .. })));
    assert!(matches!(queue.push(&[0; 25], T), Err(QueueError::RecordTooLarge { len: 25, max: 24 })));
    // The owner learns of an `Attached` on its door's thread, a moment after `attach` returned.
    queue.wait_for_workers(2, T).unwrap();
    assert_eq!(queue.workers().len(), 2);
}

#[test]
fn a_gone_workers_tasks_are_handed_out_again_then_reported_lost() {
    let queue = owner("gone", QueueConfig { max_deliveries: 2, ..fast(8, 8) });
    let survivor = worker(&queue, "survivor");
    for i in 0..3u64 {
        queue.push(&i.to_le_bytes(), T).unwrap();
    }
    // The clock starts before `leaver` hangs up (at the block's end, after its value is taken): the bound below then
    // holds however long the drop itself takes on a loaded machine.
    let start = {
        let leaver = worker(&queue, "leaver");
        let held = leaver.pop_many(2, T).unwrap();
        assert_eq!(held.len(), 2);
        // Neither completed nor given back (a dropped task is given back, and the next sweep, within 50 ms, hands it
        // out again: the bound below failed once that way): leased to `leaver` until it goes.
        std::mem::forget(held);
        assert!(queue.pending_redeliveries() == 0);
        Instant::now()
    };
    let mut again = Vec::new();
    while again.len() < 3 {
        let task = survivor.pop(T).unwrap();
        again.push((task.id(), task.attempt()));
        if task.attempt() == 0 {
            task.complete().unwrap();
        } else {
            // Second delivery of 0 and 1: let them go once more, with their holder.
            std::mem::forget(task);
        }
    }
    assert!(start.elapsed() >= Duration::from_millis(40), "taken back only after reclaim_after");
    again.sort_unstable();
    assert_eq!(again, [(0, 1), (1, 1), (2, 0)]);
    drop(survivor);
    let stats = queue.wait_until_done(T).unwrap();
    let mut lost = queue.take_lost();
    lost.sort_by_key(|t| t.id);
    assert_eq!(lost.len(), 2, "{lost:?}");
    for (task, id) in lost.iter().zip(0u64..) {
        assert_eq!((task.id, task.deliveries, task.reason), (id, 2, LostReason::TooManyDeliveries));
        assert_eq!(task.record, id.to_le_bytes());
    }
    assert_eq!((stats.completed, stats.redelivered, stats.lost, stats.in_hand), (1, 2, 2, 0));
    assert_eq!(stats.popped, stats.completed + stats.redelivered + stats.lost);
}

#[test]
fn a_worker_dying_while_the_closed_queue_drains_loses_nothing() {
    let queue = owner("close-death", QueueConfig { reclaim_after: Duration::from_millis(300), ..fast(8, 8) });
    let survivor = worker(&queue, "survivor");
    for i in 0..4u64 {
        queue.push(&i.to_le_bytes(), T).unwrap();
    }
    let dying = worker(&queue, "dying");
    let held = dying.pop_many(2, T).unwrap();
    queue.close().unwrap();
    for _ in 0..2 {
        survivor.pop(T).unwrap().complete().unwrap();
    }
    std::mem::forget(held);
    drop(dying);
    // The owner hears of the death within milliseconds: from then on the drained queue is not sealed until the two
    // tasks are back (after `reclaim_after`), so the survivor waits for them instead of seeing the end.
    std::thread::sleep(Duration::from_millis(100));
    let mut again = Vec::new();
    while again.len() < 2 {
        let task = survivor.pop(T).unwrap();
        again.push((task.id(), task.attempt()));
        task.complete().unwrap();
    }
    again.sort_unstable();
    assert_eq!(again, [(0, 1), (1, 1)]);
    assert!(matches!(survivor.pop(T), Err(QueueError::Closed)));
    let stats = queue.wait_until_done(T).unwrap();
    assert_eq!((stats.completed, stats.redelivered, stats.lost), (4, 2, 0));
}

#[test]
fn the_workers_slot_is_given_to_the_next_one_once_its_tasks_are_back() {
    let queue = owner("slots", QueueConfig { max_workers: 2, ..fast(8, 8) });
    let only = worker(&queue, "only");
    let options = WorkerOptions { name: "second".into(), ..WorkerOptions::default() };
    let refused = QueueWorker::<Host>::attach(&HostContext, queue.socket(), &options).unwrap_err();
    match refused {
        QueueError::Door(DoorError::Refused { code: RefusalCode::RingFull, message }) => {
            assert!(message.contains("worker slots"), "{message}");
        }
        other => panic!("{other}"),
    }
    let slot = only.worker();
    drop(only);
    let start = Instant::now();
    let next = loop {
        match QueueWorker::<Host>::attach(&HostContext, queue.socket(), &options) {
            Ok(worker) => break worker,
            Err(_) if start.elapsed() < T => std::thread::sleep(Duration::from_millis(10)),
            Err(e) => panic!("{e}"),
        }
    };
    assert_eq!(next.worker(), slot);
}

#[test]
fn closing_drains_then_every_pop_says_closed_and_pushes_are_refused() {
    let queue = owner("close", fast(8, 8));
    let w = worker(&queue, "w");
    queue.push(b"last one", T).unwrap();
    queue.close().unwrap();
    assert!(matches!(w.push(b"too late", T), Err(QueueError::Closed)));
    w.pop(T).unwrap().complete().unwrap();
    assert!(matches!(w.pop(T), Err(QueueError::Closed)));
    assert!(matches!(queue.pop(T), Err(QueueError::Closed)));
    assert!(queue.stats().unwrap().closed);
}

#[test]
fn the_owners_end_is_an_error_for_a_waiting_worker_within_a_second() {
    let queue = owner("owner-gone", fast(8, 8));
    let w = worker(&queue, "w");
    drop(queue);
    let start = Instant::now();
    let error = w.pop(Duration::from_secs(10)).unwrap_err();
    assert!(matches!(error, QueueError::OwnerGone { .. }), "{error}");
    assert!(start.elapsed() < Duration::from_secs(1), "{:?}", start.elapsed());
    assert!(w.owner_gone());
    assert!(error.to_string().contains("create the queue again"), "{error}");
}

#[test]
fn a_worker_of_another_backend_or_before_the_owner_is_told_why() {
    let path = common::sock("queue", "nobody");
    let error = QueueWorker::<Host>::attach(&HostContext, &path, &WorkerOptions::default()).unwrap_err();
    assert!(error.to_string().contains("start the process that creates the work-queue first"), "{error}");
    // Waiting for the owner: it comes up a little later.
    let owner_thread = {
        let path = path.clone();
        std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(100));
            let queue = WorkQueue::<Host>::create(&HostContext, &path, fast(4, 8)).unwrap();
            std::thread::sleep(Duration::from_millis(300));
            queue.stats().unwrap()
        })
    };
    let options = WorkerOptions { wait_for_owner: T, ..WorkerOptions::default() };
    let w = QueueWorker::<Host>::attach(&HostContext, &path, &options).unwrap();
    assert!(w.worker() >= 1);
    owner_thread.join().unwrap();
    assert!(matches!(
        WorkQueue::<Host>::create(&HostContext, common::sock("queue", "bad"), QueueConfig::new(3, 8)),
        Err(QueueError::Config(_))
    ));
    let error = queue_error_kernel(&w);
    assert!(error.contains("needs a GPU backend"), "{error}");
}

fn queue_error_kernel(w: &QueueWorker<Host>) -> String {
    w.device_queue().unwrap_err().to_string()
}
