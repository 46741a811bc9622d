//! The work queue between real processes on the host backend (the `work_queue` example program): tasks through
//! three workers exactly once with one SIGKILLed while it holds tasks, a worker whose owner dies, and the GPU-only
//! commands refused on the host backend with the reason.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::path::PathBuf;
use std::time::{Duration, Instant};

use common::{Proc, field, work_queue};

const FINISH: Duration = Duration::from_secs(60);
/// Tasks a victim holds when it is killed.
const HELD: u64 = 8;

fn sock(tag: &str) -> PathBuf {
    common::socket(&format!("wq-{tag}"))
}

fn owner(path: &str, tasks: u64, workers: usize) -> Proc {
    let (tasks, workers) = (tasks.to_string(), workers.to_string());
    let owner = work_queue(
        "owner",
        "host",
        &["owner", "--socket", path, "--tasks", &tasks, "--workers", &workers, "--reclaim-ms", "100"],
    );
    owner.wait_for_line("serving", Duration::from_secs(30));
    owner
}

fn count(json: &serde_json::Value, key: &str) -> u64 {
    field(json, key).as_u64().unwrap_or_else(|| panic!("{key} is not a number in {json}"))
}

#[test]
fn tasks_go_through_three_worker_processes_exactly_once_with_one_killed_while_holding_tasks() {
    const TASKS: u64 = 50_000;
    let path = sock("kill");
    let p = path.to_str().unwrap();
    let owner = owner(p, TASKS, 3);
    let workers = [
        work_queue("worker-a", "host", &["worker", "--socket", p, "--name", "a"]),
        work_queue("worker-b", "host", &["worker", "--socket", p, "--name", "b"]),
    ];
    let mut victim = work_queue(
        "victim",
        "host",
        &["worker", "--socket", p, "--name", "victim", "--stall-after", "2000", "--hold", &HELD.to_string()],
    );
    // It says so after popping them and before completing any: killed now, it provably holds them.
    victim.wait_for_line(&format!("holding {HELD} tasks"), FINISH);
    victim.kill9();
    let (status, _, json) = owner.finish(FINISH);
    assert!(status.success(), "owner: {json}");
    let stats = field(&json, "stats");
    assert_eq!((count(stats, "pushed"), count(stats, "completed"), count(stats, "lost")), (TASKS, TASKS, 0), "{json}");
    let redelivered = count(stats, "redelivered");
    assert!(redelivered >= HELD, "the victim held {HELD} tasks, {redelivered} were handed out again: {json}");
    let mut seen_again = 0;
    for w in workers {
        let (status, _, json) = w.finish(FINISH);
        assert!(status.success(), "{json}");
        assert_eq!(count(&json, "bad_records"), 0, "{json}");
        seen_again += count(&json, "redelivered");
    }
    assert_eq!(seen_again, redelivered, "the survivors completed every task taken back from the victim");
}

#[test]
fn a_waiting_worker_learns_of_its_owners_death_within_a_second() {
    let path = sock("owner-killed");
    let _cleanup = common::RemoveOnDrop(path.clone());
    let p = path.to_str().unwrap();
    // The owner waits for two workers before it pushes anything: the one worker waits for tasks.
    let mut owner = owner(p, 1000, 2);
    let worker = work_queue("worker", "host", &["worker", "--socket", p]);
    std::thread::sleep(Duration::from_millis(300));
    owner.kill9();
    let killed = Instant::now();
    let (status, took, json) = worker.finish(FINISH);
    assert_eq!(status.code(), Some(4), "{json}");
    assert_eq!(field(&json, "outcome"), "owner-gone", "{json}");
    assert!(took.min(killed.elapsed()) < Duration::from_secs(1), "{took:?}");
}

#[test]
fn kernels_are_refused_on_the_host_backend_with_the_reason() {
    let path = sock("no-gpu");
    let p = path.to_str().unwrap();
    let owner = owner(p, 10, 1);
    let worker = work_queue("kernel worker", "host", &["worker", "--socket", p, "--pop", "kernel"]);
    let (status, _, json) = worker.finish(FINISH);
    assert_eq!(status.code(), Some(1), "{json}");
    let message = field(&json, "message").as_str().unwrap();
    assert!(message.contains("needs a GPU backend"), "{message}");
    let (status, _, json) = work_queue("bench", "host", &["bench"]).finish(FINISH);
    assert_eq!(status.code(), Some(1), "{json}");
    assert!(field(&json, "message").as_str().unwrap().contains("needs a GPU backend"), "{json}");
    // The owner still has its one worker's slot to reclaim, and no tasks were pushed to anyone else: a CPU worker
    // takes them all.
    let (status, _, json) = work_queue("worker", "host", &["worker", "--socket", p]).finish(FINISH);
    assert!(status.success(), "{json}");
    assert_eq!(count(field(&json, "sums"), "count"), 10, "{json}");
    let (status, _, json) = owner.finish(FINISH);
    assert!(status.success(), "{json}");
}
