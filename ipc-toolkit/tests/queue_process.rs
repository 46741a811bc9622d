//! The work queue between real processes on the host backend: the owner (this test) pushes a million tasks
//! through four worker processes started from this very test binary (`GPU_IPC_QUEUE_CHILD` selects the role), one
//! of which is SIGKILLed while it holds tasks, half of them worked on. Every task's work is tallied by value in a
//! shared memfd, with the attempt it came with, so the test can tell "exactly once", "handed out again after its
//! worker died" and "lost" apart.
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "../../ipc-core/tests/common/mod.rs"]
mod common;

use std::io::{BufRead, BufReader, Write};
use std::os::fd::{AsRawFd, OwnedFd};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use ipc_core::host::{Host, HostContext};
use ipc_core::shm::SharedMemory;
use ipc_toolkit::queue::{QueueConfig, QueueError, QueueWorker, WorkQueue, WorkerOptions};
use rustix::io::FdFlags;

const ROLE: &str = "GPU_IPC_QUEUE_CHILD";
const SOCKET: &str = "GPU_IPC_QUEUE_SOCKET";
const TALLY_FD: &str = "GPU_IPC_QUEUE_TALLY_FD";
const TASKS: u64 = 1_000_000;
const WORKERS: usize = 4;
/// Tasks the victim completes before it holds a batch and waits to be killed.
const VICTIM_COMPLETES: usize = 50_000;
/// Tasks the victim holds when it is killed; it does the work of the first `VICTIM_WORKED`.
const VICTIM_HOLDS: usize = 16;
const VICTIM_WORKED: usize = 8;
/// A tally word: how many times a task's work was done (low 32 bits) and the sum of the attempts it came with.
const ONE_ATTEMPT: u64 = 1 << 32;

/// An inheritable duplicate of `memory`'s fd (std and rustix create close-on-exec descriptors).
fn inheritable(memory: &SharedMemory) -> OwnedFd {
    let dup = rustix::io::dup(memory.fd()).unwrap();
    rustix::io::fcntl_setfd(&dup, FdFlags::empty()).unwrap();
    dup
}

fn spawn_child(role: &str, socket: &str, tally_fd: i32) -> Child {
    Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "child_process_entry_point", "--ignored", "--nocapture", "--test-threads=1"])
        .env(ROLE, role)
        .env(SOCKET, socket)
        .env(TALLY_FD, tally_fd.to_string())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap()
}

/// Not a test of its own: the body of the worker processes the test starts. Without the role variable (a normal
/// test run) it returns at once.
#[test]
#[ignore = "child-process entry point; run by the cross-process test, not on its own"]
fn child_process_entry_point() {
    let Ok(role) = std::env::var(ROLE) else { return };
    let fd = std::env::var(TALLY_FD).unwrap();
    let file = std::fs::OpenOptions::new().read(true).write(true).open(format!("/proc/self/fd/{fd}")).unwrap();
    let tally = SharedMemory::from_fd(OwnedFd::from(file), TASKS as usize * 8).unwrap();
    let tally = tally.words(0, TASKS as usize).unwrap();
    let options = WorkerOptions { name: role.clone(), ..WorkerOptions::default() };
    let worker = QueueWorker::<Host>::attach(&HostContext, std::env::var(SOCKET).unwrap(), &options).unwrap();
    let work = |record: &[u8], attempt: u32| {
        let value = u64::from_le_bytes(record.try_into().unwrap());
        tally[value as usize].fetch_add(1 + u64::from(attempt) * ONE_ATTEMPT, Ordering::Relaxed);
    };
    let mut completed = 0usize;
    loop {
        if role == "victim" && completed >= VICTIM_COMPLETES {
            // The other workers keep the queue short: gather the batch over several pops.
            let mut held = Vec::new();
            while held.len() < VICTIM_HOLDS {
                held.extend(worker.pop_many(VICTIM_HOLDS - held.len(), Duration::from_secs(10)).unwrap());
            }
            for task in held.iter().take(VICTIM_WORKED) {
                work(task.record(), task.attempt());
            }
            println!("HOLDING {}", held.len());
            std::io::stdout().flush().unwrap();
            std::thread::sleep(Duration::from_secs(120));
            unreachable!("the victim is killed while it holds its tasks");
        }
        let batch = match worker.pop_many(64, Duration::from_secs(20)) {
            Ok(batch) => batch,
            Err(QueueError::Closed) => break,
            Err(error) => panic!("worker {role}: {error}"),
        };
        for task in batch {
            work(task.record(), task.attempt());
            task.complete().unwrap();
            completed += 1;
        }
    }
    println!("DONE completed={completed}");
}

/// Waits for the child to print a line containing `tag`; returns it. The rest of its output is read on a thread,
/// so that the child never writes into a closed pipe.
fn wait_for_line(child: &mut Child, tag: &str) -> String {
    let mut reader = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    loop {
        line.clear();
        assert!(reader.read_line(&mut line).unwrap() > 0, "child ended before printing {tag}");
        if let Some(at) = line.find(tag) {
            std::thread::spawn(move || std::io::copy(&mut reader, &mut std::io::sink()));
            return line[at..].trim().to_owned();
        }
    }
}

#[test]
fn a_million_tasks_through_four_worker_processes_exactly_once_with_one_killed() {
    let start = Instant::now();
    let tally_memory = SharedMemory::create("queue-tally", TASKS as usize * 8).unwrap();
    let socket = common::sock("queue-process", "million");
    let config = QueueConfig { reclaim_after: Duration::from_millis(200), max_workers: 8, ..QueueConfig::new(4096, 8) };
    let queue = WorkQueue::<Host>::create(&HostContext, &socket, config).unwrap();
    let fd = inheritable(&tally_memory);
    let sock = socket.to_str().unwrap();
    let mut victim = spawn_child("victim", sock, fd.as_raw_fd());
    let mut workers: Vec<Child> = (1..WORKERS).map(|_| spawn_child("worker", sock, fd.as_raw_fd())).collect();
    drop(fd);
    queue.wait_for_workers(WORKERS, Duration::from_secs(30)).unwrap();

    let killed = AtomicU64::new(0);
    std::thread::scope(|s| {
        s.spawn(|| {
            let line = wait_for_line(&mut victim, "HOLDING");
            assert_eq!(line, format!("HOLDING {VICTIM_HOLDS}"));
            victim.kill().unwrap();
            victim.wait().unwrap();
            killed.store(1, Ordering::Release);
        });
        let records: Vec<[u8; 8]> = (0..TASKS).map(u64::to_le_bytes).collect();
        let mut next = 0usize;
        let deadline = Instant::now() + Duration::from_secs(60);
        while next < records.len() {
            let batch: Vec<&[u8]> = records[next..(next + 256).min(records.len())].iter().map(|r| &r[..]).collect();
            let ids = queue.try_push_many(&batch).unwrap();
            next += ids.len();
            if ids.is_empty() {
                assert!(Instant::now() < deadline, "pushing stalled at task {next}");
                std::thread::sleep(Duration::from_micros(100));
            }
        }
    });
    assert_eq!(killed.load(Ordering::Acquire), 1);
    queue.close().unwrap();
    let stats = queue.wait_until_done(Duration::from_secs(60)).unwrap();
    for mut worker in workers.drain(..) {
        let line = wait_for_line(&mut worker, "DONE");
        assert!(line.starts_with("DONE completed="), "{line}");
        assert!(worker.wait().unwrap().success());
    }

    // The queue's own accounting: every task completed once, the victim's held tasks handed out again.
    assert_eq!(stats.pushed, TASKS);
    assert_eq!(stats.completed, TASKS, "{stats:?}");
    assert_eq!((stats.redelivered, stats.lost, stats.in_hand), (VICTIM_HOLDS as u64, 0, 0), "{stats:?}");
    assert_eq!(stats.popped, TASKS + VICTIM_HOLDS as u64);
    assert!(queue.take_lost().is_empty());
    // The work, by task: once each, except the victim's worked-on tasks, done again on their second delivery.
    let tally = tally_memory.words(0, TASKS as usize).unwrap();
    let (mut once, mut twice_after_death, mut once_after_death) = (0u64, 0u64, 0u64);
    for (value, word) in tally.iter().enumerate() {
        match word.load(Ordering::Relaxed) {
            1 => once += 1,
            w if w == 2 + ONE_ATTEMPT => twice_after_death += 1,
            w if w == 1 + ONE_ATTEMPT => once_after_death += 1,
            w => panic!("task {value}: done {} times with attempts summing to {}", w & 0xffff_ffff, w >> 32),
        }
    }
    assert_eq!(twice_after_death, VICTIM_WORKED as u64, "the victim's worked-on tasks, handed out again");
    assert_eq!(once_after_death, (VICTIM_HOLDS - VICTIM_WORKED) as u64);
    assert_eq!(once + twice_after_death + once_after_death, TASKS);
    eprintln!("{TASKS} tasks through {WORKERS} worker processes in {:?}: {stats:?}", start.elapsed());
}
