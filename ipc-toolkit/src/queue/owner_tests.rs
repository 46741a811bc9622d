//! The owner's accounting when a peer dies at the worst moment, with the crash points made deterministic by
//! driving the queue's words directly (the host state machine with its count left out, as a peer killed between
//! its compare-and-swap and its count leaves them).

use std::time::Duration;

use super::*;
use crate::queue::host_ops::HostQueue;
use crate::queue::ops::{PushFlags, PushRequest, Status};
use crate::queue::{MemoryAccess, QueueWorker, WorkerOptions};
use ipc_core::host::{Host, HostContext};

const T: Duration = Duration::from_secs(5);

fn owner(name: &str) -> WorkQueue<Host> {
    let socket = std::env::temp_dir().join(format!("gpu-ipc-queue-owner-{}-{name}.sock", std::process::id()));
    let config = QueueConfig { reclaim_after: Duration::from_millis(20), ..QueueConfig::new(16, 8) };
    WorkQueue::<Host>::create(&HostContext, socket, config).unwrap()
}

/// The owner's queue memory, as the host state machine sees it.
fn words<R>(queue: &WorkQueue<Host>, f: impl FnOnce(&HostQueue<'_>) -> R) -> R {
    let MemoryAccess::Host(memory) = queue.owner.local.access() else { panic!("the host backend's memory") };
    f(&HostQueue::new(memory, queue.owner.local.g).unwrap())
}

#[test]
fn a_worker_killed_between_marking_done_and_counting_still_lets_the_owner_finish() {
    let queue = owner("done-not-counted");
    let worker = QueueWorker::<Host>::attach(&HostContext, queue.socket(), &WorkerOptions::default()).unwrap();
    for i in 0..3u8 {
        queue.push(&[i; 8], T).unwrap();
    }
    worker.pop(T).unwrap().complete().unwrap();
    worker.pop(T).unwrap().complete().unwrap();
    let last = worker.pop(T).unwrap();
    // The crash point: the cell is marked done (its one compare-and-swap), the worker's count never happens.
    let (slot, position) = (worker.worker(), last.id());
    assert_eq!(words(&queue, |q| q.complete(slot, &[position], false)), [true]);
    std::mem::forget(last);
    drop(worker);
    let stats = queue.wait_until_done(T).unwrap();
    assert_eq!((stats.pushed, stats.completed, stats.lost, stats.in_hand, stats.queued), (3, 3, 0, 0, 0));
}

#[test]
fn a_push_published_but_never_counted_is_still_waited_for_and_counted() {
    let queue = owner("pushed-not-counted");
    queue.push(b"counted!", T).unwrap();
    // The crash point of a push: published, its pusher gone before its count.
    let request = PushRequest { record: b"uncount!", id: None, attempt: 0 };
    let outcome = words(&queue, |q| q.push(5, &[request], PushFlags { count: false, force: false }));
    assert_eq!(outcome, [(Status::Ok, 1)]);
    queue.pop(T).unwrap().complete().unwrap();
    // One task is still queued: the owner does not call it done.
    let waited = queue.wait_until_done(Duration::from_millis(100));
    assert!(waited.is_err(), "{waited:?}");
    queue.pop(T).unwrap().complete().unwrap();
    let stats = queue.wait_until_done(T).unwrap();
    assert_eq!((stats.pushed, stats.completed, stats.lost), (2, 2, 0));
}
