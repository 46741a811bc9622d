//! Careless and hostile clients at a work queue's socket, on the host backend.
//!
//! Each test starts an owner that keeps the queue topped up and a real worker that pops, checks and completes
//! every task, lets one kind of bad client loose on the socket, and then asserts that: the worker never went
//! [`MAX_GAP`] without a task; a new worker still attaches and gets tasks; every worker slot a bad client was
//! offered comes back (a queue with few slots still takes workers afterwards); no task is lost or completed twice;
//! and the process's open fds come back to what they were.
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "../../ipc-core/tests/common/mod.rs"]
mod common;

use common::door_client::{connect, hung_up_on, random_bytes_are_refused};

use std::io::Write;
use std::os::fd::AsFd;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use ipc_core::host::{Host, HostContext};
use ipc_core::wire::{
    Attached, BackendKind, ClientHello, Message, ObjectKind, PROTOCOL_VERSION, RefusalCode, recv_message, send_bytes,
};
use ipc_toolkit::door::DoorConfig;
use ipc_toolkit::queue::{
    QUEUE_OFFER_BYTES, QueueConfig, QueueError, QueueOffer, QueueWorker, WorkQueue, WorkerOptions,
};

const T: Duration = Duration::from_secs(10);
/// The longest the real worker may go without a task while bad clients knock (loaded 2-core CI included).
const MAX_GAP: Duration = Duration::from_millis(1000);
/// Worker slots, the owner's included: few, so that slots a bad client kept would soon refuse real workers.
const SLOTS: u32 = 4;

/// The fd counts are per process: the tests take turns.
static SERIAL: Mutex<()> = Mutex::new(());

/// Open files, each counted once however many fds name it: the door polls duplicates of attached peers'
/// sockets, which come and go (so `door_client::open_fds` would count one per attached worker now and then).
fn open_files() -> usize {
    use std::os::unix::fs::MetadataExt;
    let mut files = std::collections::HashSet::new();
    for entry in std::fs::read_dir("/proc/self/fd").unwrap().flatten() {
        if let Ok(meta) = std::fs::metadata(entry.path()) {
            files.insert((meta.dev(), meta.ino()));
        }
    }
    files.len()
}

/// An owner pushing tasks (its record: the task's number) and a worker streaming them.
struct Rig {
    queue: Arc<WorkQueue<Host>>,
    path: PathBuf,
    stop: Arc<AtomicBool>,
    done: Arc<AtomicU64>,
    longest_gap_us: Arc<AtomicU64>,
    pusher: thread::JoinHandle<u64>,
    streamer: thread::JoinHandle<Result<u64, QueueError>>,
}

impl Rig {
    fn start(name: &str) -> Self {
        let path = common::sock("queue-hostile", name);
        let door = DoorConfig { handshake_timeout: Duration::from_millis(500), ..DoorConfig::default() };
        let config = QueueConfig {
            max_workers: SLOTS,
            reclaim_after: Duration::from_millis(20),
            door,
            ..QueueConfig::new(256, 8)
        };
        let queue = Arc::new(WorkQueue::<Host>::create(&HostContext, &path, config).unwrap());
        let stop = Arc::new(AtomicBool::new(false));
        let (done, longest_gap_us) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
        let pusher = {
            let (queue, stop) = (queue.clone(), stop.clone());
            thread::spawn(move || {
                let mut next = 0u64;
                while !stop.load(Ordering::Acquire) {
                    match queue.try_push(&next.to_le_bytes()).unwrap() {
                        Some(_) => next += 1,
                        None => thread::sleep(Duration::from_micros(200)),
                    }
                }
                next
            })
        };
        let streamer = {
            let (path, done, longest_gap_us) = (path.clone(), done.clone(), longest_gap_us.clone());
            thread::spawn(move || {
                let options = WorkerOptions { name: "streamer".into(), ..WorkerOptions::default() };
                let worker = QueueWorker::<Host>::attach(&HostContext, &path, &options)?;
                let mut last = Instant::now();
                let mut completed = 0u64;
                loop {
                    let task = match worker.pop(T) {
                        Ok(task) => task,
                        Err(QueueError::Closed) => return Ok(completed),
                        Err(e) => return Err(e),
                    };
                    // The record is the task's number, which is its id (the owner is the only pusher).
                    assert_eq!(task.record(), task.id().to_le_bytes(), "task {}", task.id());
                    task.complete()?;
                    completed += 1;
                    done.store(completed, Ordering::Release);
                    let now = Instant::now();
                    longest_gap_us.fetch_max((now - last).as_micros() as u64, Ordering::Relaxed);
                    last = now;
                }
            })
        };
        let rig = Self { queue, path, stop, done, longest_gap_us, pusher, streamer };
        rig.wait_done(100);
        rig
    }

    fn wait_done(&self, tasks: u64) {
        let from = self.done.load(Ordering::Acquire);
        let deadline = Instant::now() + T;
        while self.done.load(Ordering::Acquire) < from + tasks {
            assert!(Instant::now() < deadline, "the streaming worker stalled");
            assert!(!self.streamer.is_finished(), "the streaming worker ended");
            thread::sleep(Duration::from_millis(1));
        }
    }

    fn assert_streaming_on_time(&self) {
        let longest = Duration::from_micros(self.longest_gap_us.load(Ordering::Relaxed));
        assert!(longest < MAX_GAP, "the worker went {longest:?} without a task");
    }

    /// Stops pushing, closes, and checks that every task pushed was completed once (by the streamer, or by a
    /// late worker of [`slots_come_back`]).
    fn finish(self, by_others: u64) {
        self.assert_streaming_on_time();
        self.stop.store(true, Ordering::Release);
        let pushed = self.pusher.join().unwrap();
        self.queue.close().unwrap();
        let streamed = self.streamer.join().unwrap().unwrap();
        assert_eq!(streamed + by_others, pushed);
        let stats = self.queue.wait_until_done(T).unwrap();
        assert_eq!((stats.pushed, stats.completed, stats.lost), (pushed, pushed, 0), "{stats:?}");
    }
}

/// Every slot but the streamer's comes back: that many new workers attach at once and each completes a task.
/// Returns the tasks they completed.
fn slots_come_back(rig: &Rig) -> u64 {
    let deadline = Instant::now() + T;
    while rig.queue.pending_redeliveries() > 0 || rig.queue.workers().len() > 1 {
        assert!(Instant::now() < deadline, "slots still held: {:?}", rig.queue.workers());
        thread::sleep(Duration::from_millis(5));
    }
    let options = WorkerOptions { name: "late".into(), ..WorkerOptions::default() };
    // A slot offered to a client that has not hung up yet comes back when its handshake times out.
    let late: Vec<QueueWorker<Host>> = (0..SLOTS - 2)
        .map(|i| {
            loop {
                match QueueWorker::<Host>::attach(&HostContext, &rig.path, &options) {
                    Ok(worker) => break worker,
                    Err(e) if Instant::now() < deadline => {
                        assert!(e.to_string().contains("worker slots"), "late worker {i}: {e}");
                        thread::sleep(Duration::from_millis(20));
                    }
                    Err(e) => panic!("late worker {i} could not attach: {e}"),
                }
            }
        })
        .collect();
    for worker in &late {
        worker.pop(T).unwrap().complete().unwrap();
    }
    late.len() as u64
}

fn survives(name: &str, bad_clients: impl FnOnce(&Path)) {
    let _turn = SERIAL.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    let rig = Rig::start(name);
    let baseline = open_files();
    bad_clients(&rig.path);
    rig.wait_done(100);
    rig.assert_streaming_on_time();
    let by_others = slots_come_back(&rig);
    fds_back_to(baseline, name);
    rig.finish(by_others);
}

/// Waits up to 3 s for the process's open fds to come back to `baseline`.
fn fds_back_to(baseline: usize, what: &str) {
    let deadline = Instant::now() + Duration::from_secs(3);
    while open_files() > baseline {
        assert!(Instant::now() < deadline, "{what}: {} fds open, {baseline} before", open_files());
        thread::sleep(Duration::from_millis(10));
    }
}

fn hello(object: ObjectKind, backend: Option<BackendKind>) -> Vec<u8> {
    let hello = ClientHello {
        object,
        part: 0,
        protocol_version: PROTOCOL_VERSION,
        client_pid: std::process::id(),
        wanted_backend: backend,
        consumer_name: "hostile".into(),
    };
    Message::ClientHello(hello).encode().unwrap()
}

/// Sends `bytes` and returns what the owner said before it hung up (within 2 s).
fn answer_then_hang_up(path: &Path, bytes: &[u8]) -> Vec<u8> {
    let stream = connect(path);
    send_bytes(stream.as_fd(), bytes, Vec::new(), T).unwrap();
    hung_up_on(stream)
}

fn refused_with(path: &Path, bytes: &[u8], code: RefusalCode) -> String {
    match Message::decode(&answer_then_hang_up(path, bytes)) {
        Ok(Message::Refused(refused)) if refused.code == code => refused.message,
        other => panic!("expected Refused {code:?}, got {other:?}"),
    }
}

#[test]
fn random_bytes_and_malformed_hellos() {
    survives("random", |path| {
        random_bytes_are_refused(path);
        let mut bad = hello(ObjectKind::WorkQueue, None);
        bad[32..34].copy_from_slice(&60u16.to_le_bytes());
        refused_with(path, &bad, RefusalCode::MalformedHello);
        for cut in [1usize, 23, 30] {
            let stream = connect(path);
            (&stream).write_all(&hello(ObjectKind::WorkQueue, None)[..cut]).unwrap();
            drop(stream);
        }
    });
}

#[test]
fn other_objects_and_other_backends_are_refused_with_what_the_socket_serves() {
    survives("wrong", |path| {
        for object in [ObjectKind::Ring, ObjectKind::Pool, ObjectKind::Semaphore] {
            let message = refused_with(path, &hello(object, None), RefusalCode::WrongObject);
            assert!(message.contains("work-queue"), "{message}");
        }
        for backend in [BackendKind::Legacy, BackendKind::Vmm] {
            refused_with(path, &hello(ObjectKind::WorkQueue, Some(backend)), RefusalCode::BackendMismatch);
        }
    });
}

#[test]
fn silent_and_idle_connections_do_not_keep_a_worker_out() {
    survives("silent", |path| {
        let idle: Vec<UnixStream> = (0..100).map(|_| connect(path)).collect();
        let started = Instant::now();
        let options = WorkerOptions { name: "among idle".into(), ..WorkerOptions::default() };
        let worker = QueueWorker::<Host>::attach(&HostContext, path, &options).unwrap();
        assert!(started.elapsed() < Duration::from_secs(3), "attaching took {:?}", started.elapsed());
        drop(worker);
        thread::sleep(Duration::from_millis(600));
        drop(idle);
    });
}

/// Takes the offer (and the queue's fd) and hangs up, or confirms and then hangs up: more times than there are
/// slots. Every one of them is a worker gone; its slot must come back.
#[test]
fn offers_taken_and_abandoned_give_their_slots_back() {
    survives("abandoned", |path| {
        for round in 0..(3 * SLOTS) {
            let deadline = Instant::now() + T;
            loop {
                let stream = connect(path);
                let hello = hello(ObjectKind::WorkQueue, Some(BackendKind::Host));
                send_bytes(stream.as_fd(), &hello, Vec::new(), T).unwrap();
                let received = recv_message(stream.as_fd(), T).unwrap_or_else(|e| panic!("round {round}: {e}"));
                match received.message {
                    Message::ObjectOffer(offer) => {
                        assert_eq!(received.fds.len(), 1, "round {round}: the queue's memfd");
                        assert_eq!((offer.kind, offer.body.len()), (ObjectKind::WorkQueue, QUEUE_OFFER_BYTES));
                        let body = QueueOffer::decode(&offer.body).unwrap();
                        assert!(body.worker >= 1 && u32::from(body.worker) < SLOTS, "{body:?}");
                        if round % 2 == 1 {
                            let attached = Message::Attached(Attached { consumer_id: offer.peer_id });
                            send_bytes(stream.as_fd(), &attached.encode().unwrap(), Vec::new(), T).unwrap();
                        }
                        break;
                    }
                    // Every free slot went to earlier rounds: the owner gives them back once they are gone.
                    Message::Refused(refused) if refused.code == RefusalCode::RingFull => {
                        assert!(Instant::now() < deadline, "round {round}: no slot came back: {}", refused.message);
                        thread::sleep(Duration::from_millis(20));
                    }
                    other => panic!("round {round}: {other:?}"),
                }
            }
        }
    });
}
