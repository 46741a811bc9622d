//! The host state machine on its own: pushes, pops, completions, the full and empty edges, closing and sealing,
//! taking a gone worker's cells back, and many threads at once.

use std::collections::HashSet;
use std::sync::Mutex;

use super::*;
use crate::queue::layout::{CLOSED, OWNER_SLOT};
use crate::queue::ops::stats_of;

fn queue(capacity: u64, record_bytes: u32) -> (SharedMemory, Geometry) {
    let g = Geometry::new(capacity, record_bytes, 8).unwrap();
    let memory = SharedMemory::create("queue-unit", g.total_bytes as usize).unwrap();
    HostQueue::new(&memory, g).unwrap().init();
    (memory, g)
}

fn push(q: &HostQueue<'_>, slot: u16, record: &[u8]) -> (Status, u64) {
    q.push(slot, &[PushRequest { record, id: None, attempt: 0 }], PushFlags::NEW)[0]
}

fn pop(q: &HostQueue<'_>, slot: u16) -> Result<TaskData, Status> {
    let (mut tasks, status) = q.pop(slot, 1);
    tasks.pop().ok_or(status)
}

#[test]
fn fifo_ids_records_and_the_full_and_empty_edges() {
    let (memory, g) = queue(4, 12);
    let q = HostQueue::new(&memory, g).unwrap();
    assert_eq!(pop(&q, 1), Err(Status::Empty));
    for i in 0..4u8 {
        assert_eq!(push(&q, 1, &[i; 12]), (Status::Ok, u64::from(i)));
    }
    assert_eq!(push(&q, 1, &[9; 12]).0, Status::Full);
    let first = pop(&q, 2).unwrap();
    assert_eq!((first.id, first.attempt, first.record.as_slice()), (0, 0, &[0u8; 12][..]));
    // Popped but not completed: its cell is still taken.
    assert_eq!(push(&q, 1, &[9; 12]).0, Status::Full);
    assert_eq!(q.complete(2, &[first.position], true), [true]);
    assert_eq!(q.complete(2, &[first.position], true), [false], "a lease completes once");
    assert_eq!(push(&q, 1, &[4; 3]), (Status::Ok, 4));
    let ids: Vec<u64> = (0..4).map(|_| pop(&q, 3).unwrap().id).collect();
    assert_eq!(ids, [1, 2, 3, 4]);
    let stats = stats_of(&q.snapshot(), &g);
    assert_eq!((stats.pushed, stats.popped, stats.completed, stats.in_hand), (5, 5, 1, 4));
}

#[test]
fn a_completion_by_another_worker_is_refused() {
    let (memory, g) = queue(4, 8);
    let q = HostQueue::new(&memory, g).unwrap();
    push(&q, 1, b"12345678");
    let task = pop(&q, 2).unwrap();
    assert_eq!(q.complete(3, &[task.position], true), [false]);
    assert_eq!(q.complete(2, &[task.position], true), [true]);
}

#[test]
fn closing_refuses_pushes_drains_then_seals() {
    let (memory, g) = queue(8, 8);
    let q = HostQueue::new(&memory, g).unwrap();
    push(&q, 1, b"aaaaaaaa");
    q.close();
    assert_eq!(push(&q, 1, b"bbbbbbbb").0, Status::Closed);
    let task = pop(&q, 2).unwrap();
    assert_eq!(pop(&q, 2), Err(Status::Closed));
    assert_eq!(pop(&q, 3), Err(Status::Closed), "sealed for everyone");
    // A redelivery cannot land past the seal.
    let again = PushRequest { record: b"aaaaaaaa", id: Some(task.id), attempt: 1 };
    assert_eq!(q.push(OWNER_SLOT, &[again], PushFlags::AGAIN)[0].0, Status::Closed);
    assert!(stats_of(&q.snapshot(), &g).closed);
}

#[test]
fn a_closed_queue_is_not_sealed_while_the_owner_takes_tasks_back() {
    let (memory, g) = queue(8, 8);
    let q = HostQueue::new(&memory, g).unwrap();
    q.close();
    q.add(header::RECLAIMING, 1);
    assert_eq!(pop(&q, 2), Err(Status::Empty), "tasks may still come back");
    let again = PushRequest { record: b"aaaaaaaa", id: Some(5), attempt: 1 };
    assert_eq!(q.push(OWNER_SLOT, &[again], PushFlags::AGAIN)[0], (Status::Ok, 5));
    q.add(header::RECLAIMING, u64::MAX);
    assert_eq!(pop(&q, 2).unwrap().id, 5);
    assert_eq!(pop(&q, 2), Err(Status::Closed));
}

#[test]
fn a_redelivery_passes_a_closed_queue_that_is_not_drained() {
    let (memory, g) = queue(8, 8);
    let q = HostQueue::new(&memory, g).unwrap();
    push(&q, 1, b"aaaaaaaa");
    push(&q, 1, b"bbbbbbbb");
    let held = pop(&q, 2).unwrap();
    q.close();
    let again = PushRequest { record: b"aaaaaaaa", id: Some(held.id), attempt: 1 };
    assert_eq!(q.push(OWNER_SLOT, &[again], PushFlags::AGAIN)[0], (Status::Ok, held.id));
    assert_eq!(pop(&q, 3).unwrap().record, b"bbbbbbbb");
    let redelivered = pop(&q, 3).unwrap();
    assert_eq!((redelivered.id, redelivered.attempt), (held.id, 1));
    assert_eq!(pop(&q, 3), Err(Status::Closed));
    assert_eq!(memory.words(header::ENQUEUE as usize / 8, 1).unwrap()[0].load(Ordering::Relaxed) & CLOSED, CLOSED);
}

#[test]
fn reclaim_takes_leases_over_and_turns_unfinished_pushes_into_holes() {
    let (memory, g) = queue(8, 8);
    let q = HostQueue::new(&memory, g).unwrap();
    for i in 0..3u8 {
        push(&q, 1, &[i; 8]);
    }
    let a = pop(&q, 5).unwrap();
    let b = pop(&q, 5).unwrap();
    let _c = pop(&q, 6).unwrap();
    // Worker 5 also claimed a cell for a push and died before publishing it.
    let p = memory.words(header::ENQUEUE as usize / 8, 1).unwrap()[0].load(Ordering::Relaxed);
    let state = &memory.words(g.cell(p) as usize / 8, 1).unwrap()[0];
    state.store(CellWord::pack(g.lap(p), CellState::Writing, 5), Ordering::Relaxed);
    memory.words(header::ENQUEUE as usize / 8, 1).unwrap()[0].store(p + 1, Ordering::Relaxed);
    push(&q, 1, &[7; 8]);

    let reclaimed = q.reclaim(OWNER_SLOT, 5, 1);
    assert_eq!((reclaimed.stolen.len(), reclaimed.more, reclaimed.abandoned), (1, true, 1));
    let rest = q.reclaim(OWNER_SLOT, 5, 10);
    assert_eq!((rest.stolen.len(), rest.more), (1, false));
    let mut ids: Vec<u64> = reclaimed.stolen.iter().chain(&rest.stolen).map(|t| t.id).collect();
    ids.sort_unstable();
    assert_eq!(ids, [a.id, b.id]);
    // The dead worker's late completion fails; the owner frees the cells.
    assert_eq!(q.complete(5, &[a.position], true), [false]);
    assert_eq!(q.complete(OWNER_SLOT, &[a.position, b.position], false), [true, true]);
    // The hole is skipped: the next pop is the task pushed after it.
    assert_eq!(pop(&q, 6).unwrap().record, [7; 8]);
    assert_eq!(pop(&q, 6), Err(Status::Empty));
    assert_eq!(stats_of(&q.snapshot(), &g).abandoned, 1);
}

#[test]
fn threads_push_and_pop_every_task_exactly_once() {
    const PER_PUSHER: u64 = 20_000;
    let (memory, g) = queue(64, 8);
    let q = HostQueue::new(&memory, g).unwrap();
    let seen = Mutex::new(HashSet::new());
    let popped = AtomicU64::new(0);
    std::thread::scope(|s| {
        for pusher in 0..3u64 {
            let q = &q;
            s.spawn(move || {
                for i in 0..PER_PUSHER {
                    let value = pusher * PER_PUSHER + i;
                    while push(q, 1 + pusher as u16, &value.to_le_bytes()).0 != Status::Ok {
                        std::thread::yield_now();
                    }
                }
            });
        }
        for popper in 0..3u16 {
            let (q, seen, popped) = (&q, &seen, &popped);
            s.spawn(move || {
                let mut mine = Vec::new();
                while popped.load(Ordering::Acquire) < 3 * PER_PUSHER {
                    match pop(q, 4 + popper) {
                        Ok(task) => {
                            assert_eq!(q.complete(4 + popper, &[task.position], true), [true]);
                            mine.push(u64::from_le_bytes(task.record.try_into().unwrap()));
                            popped.fetch_add(1, Ordering::AcqRel);
                        }
                        Err(_) => std::thread::yield_now(),
                    }
                }
                let mut seen = seen.lock().unwrap();
                for value in mine {
                    assert!(seen.insert(value), "{value} delivered twice");
                }
            });
        }
    });
    assert_eq!(seen.lock().unwrap().len(), (3 * PER_PUSHER) as usize);
    let stats = stats_of(&q.snapshot(), &g);
    assert_eq!((stats.pushed, stats.popped, stats.completed), (3 * PER_PUSHER, 3 * PER_PUSHER, 3 * PER_PUSHER));
}

#[test]
fn a_sweep_takes_what_was_given_back_at_once_and_a_lease_once_seen_held_for_the_lease() {
    use crate::queue::layout::TAKEN;
    use crate::queue::ops::Census;
    use std::time::Duration;
    let (memory, g) = queue(8, 8);
    let q = HostQueue::new(&memory, g).unwrap();
    for i in 0..3u8 {
        push(&q, 1, &[i; 8]);
    }
    let a = pop(&q, 2).unwrap();
    let b = pop(&q, 3).unwrap();
    assert_eq!(q.give_back(2, &[b.position]), [false], "only its holder gives a task back");
    assert_eq!(q.give_back(3, &[b.position]), [true]);
    assert_eq!(q.give_back(3, &[b.position]), [false], "once");
    let ids = |swept: &Swept| swept.stolen.iter().map(|t| (t.id, t.record.clone())).collect::<Vec<_>>();
    let mut seen = Vec::new();
    // The first sweep takes b at once and sees a's lease for the first time: not due yet, even with a lease of 0.
    let first = q.sweep(&mut seen, Duration::ZERO, 8);
    assert_eq!(ids(&first), [(b.id, vec![1; 8])]);
    assert_eq!(first.census, Census { writing: 0, full: 1, leased: 2 });
    let second = q.sweep(&mut seen, Duration::ZERO, 8);
    assert_eq!(ids(&second), [(a.id, vec![0; 8])]);
    // Its holder's late completion and give-back fail; the owner frees both cells.
    assert_eq!(q.complete(2, &[a.position], true), [false]);
    assert_eq!(q.give_back(2, &[a.position]), [false]);
    assert_eq!(q.complete(TAKEN, &[a.position, b.position], false), [true, true]);
    // A lease of a minute is not taken by sweeps a moment apart.
    let c = pop(&q, 4).unwrap();
    for _ in 0..3 {
        let swept = q.sweep(&mut seen, Duration::from_secs(60), 8);
        assert!(swept.stolen.is_empty());
        assert_eq!(swept.census, Census { writing: 0, full: 0, leased: 1 });
    }
    assert_eq!(q.complete(4, &[c.position], true), [true]);
    assert_eq!(q.sweep(&mut seen, Duration::ZERO, 8).census, Census::default());
}
