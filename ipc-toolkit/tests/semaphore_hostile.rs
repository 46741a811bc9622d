//! Careless and hostile clients at a semaphore's door, on the host backend.
//!
//! Each test starts an owner with two real peers passing posts back and forth (a poster every millisecond, a waiter
//! taking them), lets one kind of bad client loose on the socket, and then asserts that: the semaphore is still
//! open and the waiter still took posts while the bad clients knocked; every peer record a bad client was offered
//! is free again (all the records can be claimed by real peers afterwards); a real peer attaches, posts and waits;
//! and the process's open fds come back to what they were before.
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "../../ipc-core/tests/common/mod.rs"]
mod common;

use common::door_client::{connect, hung_up_on, open_fds, random_bytes_are_refused};

use std::io::Write;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use ipc_core::host::{Host, HostContext};
use ipc_core::shm::SharedMemory;
use ipc_core::wire::{
    Attached, BackendKind, ClientHello, Message, ObjectKind, PROTOCOL_VERSION, RefusalCode, recv_message, send_bytes,
};
use ipc_toolkit::door::DoorConfig;
use ipc_toolkit::semaphore::layout::{
    FLAG_POSTED, RECORD_FLAGS, RECORD_TICKETS, RECORD_WORDS, RECORDS_WORD, SHARED_BYTES,
};
use ipc_toolkit::semaphore::{
    AttachOptions, MAX_PEERS, OwnerOptions, Semaphore, SemaphoreError, SemaphoreOffer, SemaphoreOwner,
};

const T: Duration = Duration::from_secs(10);
/// The door's handshake bound in these tests (a silent client is dropped after it).
const HANDSHAKE: Duration = Duration::from_millis(300);

/// The fd counts are per process: under `cargo test` (threads of one process) the tests take turns.
static SERIAL: Mutex<()> = Mutex::new(());

fn sock(name: &str) -> PathBuf {
    common::sock("semaphore-hostile", name)
}

/// The most fds open over 100 ms: the door's service thread holds a duplicate of each attached peer's connection
/// while it polls them (most of the time, not all of it).
fn fds_at_most() -> usize {
    let until = Instant::now() + Duration::from_millis(100);
    let mut most = 0;
    while Instant::now() < until {
        most = most.max(open_fds());
        thread::sleep(Duration::from_millis(1));
    }
    most
}

fn peer(path: &Path, name: &str, posts: bool) -> Semaphore {
    let options = AttachOptions { name: name.into(), posts, timeout: T, ..AttachOptions::default() };
    Semaphore::attach::<Host>(&HostContext, path, &options).unwrap_or_else(|e| panic!("{name}: {e}"))
}

/// An owner, a poster posting every millisecond and a waiter taking the posts.
struct Rig {
    owner: SemaphoreOwner,
    stop: Arc<AtomicBool>,
    took: Arc<AtomicU64>,
    threads: Vec<thread::JoinHandle<Result<(), SemaphoreError>>>,
}

impl Rig {
    fn start(name: &str) -> Self {
        let options = OwnerOptions {
            door: DoorConfig { handshake_timeout: HANDSHAKE, ..DoorConfig::default() },
            ..OwnerOptions::default()
        };
        let owner = SemaphoreOwner::create_with::<Host>(&HostContext, &sock(name), &options).unwrap();
        let (stop, took) = (Arc::new(AtomicBool::new(false)), Arc::new(AtomicU64::new(0)));
        let poster = peer(owner.path(), "rig-poster", true);
        let waiter = peer(owner.path(), "rig-waiter", false);
        let threads = vec![
            {
                let stop = stop.clone();
                thread::spawn(move || {
                    while !stop.load(Ordering::Acquire) {
                        poster.post(1)?;
                        thread::sleep(Duration::from_millis(1));
                    }
                    Ok(())
                })
            },
            {
                let (stop, took) = (stop.clone(), took.clone());
                thread::spawn(move || {
                    while !stop.load(Ordering::Acquire) {
                        match waiter.wait(Duration::from_millis(100)) {
                            Ok(()) => {
                                took.fetch_add(1, Ordering::Relaxed);
                            }
                            Err(SemaphoreError::Timeout { .. }) => {}
                            Err(e) => return Err(e),
                        }
                    }
                    Ok(())
                })
            },
        ];
        let rig = Self { owner, stop, took, threads };
        rig.wait_took(10);
        rig
    }

    fn wait_took(&self, n: u64) {
        let from = self.took.load(Ordering::Relaxed);
        let deadline = Instant::now() + T;
        while self.took.load(Ordering::Relaxed) < from + n {
            assert!(Instant::now() < deadline, "the waiter stopped taking posts");
            assert!(self.threads.iter().all(|t| !t.is_finished()), "a rig peer ended");
            thread::sleep(Duration::from_millis(1));
        }
    }

    fn finish(self) {
        self.stop.store(true, Ordering::Release);
        for t in self.threads {
            t.join().unwrap().unwrap_or_else(|e| panic!("a rig peer ended with an error: {e}"));
        }
        self.owner.semaphore().check().unwrap();
    }
}

/// Waits up to 3 s for `condition`.
fn eventually(what: &str, condition: impl Fn() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(3);
    while !condition() {
        assert!(Instant::now() < deadline, "{what}: not within 3 s");
        thread::sleep(Duration::from_millis(5));
    }
}

/// Runs `bad_clients` against a working semaphore and checks what the module comment says.
fn survives(name: &str, bad_clients: impl FnOnce(&Path)) {
    let _turn = SERIAL.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    let rig = Rig::start(name);
    let baseline = fds_at_most();
    bad_clients(rig.owner.path());
    rig.wait_took(20);
    assert!(rig.owner.semaphore().check().is_ok(), "{name}: the semaphore ended");
    // Every record a bad client held is free again: real peers fill all the others (2 are the rig's, 0 the owner's).
    eventually("the bad clients' records are freed", || rig.owner.peers().len() == 2);
    let fill: Vec<Semaphore> = (3..MAX_PEERS).map(|i| peer(rig.owner.path(), &format!("fill-{i}"), true)).collect();
    fill[0].post(1).unwrap();
    drop(fill);
    eventually("the fill peers detached", || rig.owner.peers().len() == 2);
    eventually("fds back", || open_fds() <= baseline);
    rig.wait_took(5);
    rig.finish();
}

fn hello(object: ObjectKind, wanted_backend: Option<BackendKind>) -> Vec<u8> {
    let hello = ClientHello {
        protocol_version: PROTOCOL_VERSION,
        client_pid: std::process::id(),
        wanted_backend,
        consumer_name: "hostile".into(),
        object,
        part: 0,
    };
    Message::ClientHello(hello).encode().unwrap()
}

fn expect_refused(path: &Path, bytes: &[u8], code: RefusalCode) -> String {
    let stream = connect(path);
    send_bytes(stream.as_fd(), bytes, Vec::new(), T).unwrap();
    match Message::decode(&hung_up_on(stream)) {
        Ok(Message::Refused(refused)) if refused.code == code => refused.message,
        other => panic!("expected Refused {code:?}, got {other:?}"),
    }
}

/// Says a semaphore hello and receives the offer: the connection, the decoded body and the memfd.
fn take_offer(path: &Path) -> (UnixStream, u32, SemaphoreOffer, OwnedFd) {
    let stream = connect(path);
    send_bytes(stream.as_fd(), &hello(ObjectKind::Semaphore, None), Vec::new(), T).unwrap();
    let received = recv_message(stream.as_fd(), T).unwrap();
    let Message::ObjectOffer(offer) = received.message else { panic!("no offer: {:?}", received.message) };
    let body = SemaphoreOffer::decode(&offer.body).unwrap();
    let fd = received.fds.into_iter().next().unwrap();
    (stream, offer.peer_id, body, fd)
}

#[test]
fn random_bytes_and_truncated_headers() {
    survives("random", random_bytes_are_refused);
}

#[test]
fn hellos_for_another_object_or_backend_are_refused_with_what_the_socket_serves() {
    survives("kind", |path| {
        for kind in [ObjectKind::Ring, ObjectKind::Pool, ObjectKind::WorkQueue] {
            let message = expect_refused(path, &hello(kind, None), RefusalCode::WrongObject);
            assert!(message.contains("semaphore"), "{message}");
        }
        expect_refused(path, &hello(ObjectKind::Semaphore, Some(BackendKind::Vmm)), RefusalCode::BackendMismatch);
    });
}

#[test]
fn clients_that_take_the_offer_and_go_silent_say_garbage_or_fail_their_import() {
    survives("after-offer", |path| {
        // Silent after the offer: the handshake bound drops it.
        let (stream, ..) = take_offer(path);
        hung_up_on(stream);
        // Garbage instead of `Attached`.
        let (stream, ..) = take_offer(path);
        (&stream).write_all(&[0xa5; 40]).unwrap();
        hung_up_on(stream);
        // Hangs up at once, holding the memfd.
        let (stream, _, _, fd) = take_offer(path);
        drop(stream);
        drop(fd);
        // Says its import failed.
        let (stream, peer_id, ..) = take_offer(path);
        let bye = ipc_core::wire::Detach { consumer_id: peer_id, reason: ipc_core::wire::DetachReason::ImportFailed };
        send_bytes(stream.as_fd(), &Message::Detach(bye).encode().unwrap(), Vec::new(), T).unwrap();
        hung_up_on(stream);
    });
}

#[test]
fn waiters_that_attach_scribble_over_their_record_and_die_break_nothing() {
    survives("scribble", |path| {
        // More clients than there are records: each one's record must be freed for the next.
        for round in 0..(2 * MAX_PEERS) {
            let (stream, peer_id, body, fd) = take_offer(path);
            let memory = SharedMemory::from_fd(fd, SHARED_BYTES).unwrap();
            let record = RECORDS_WORD + body.record as usize * RECORD_WORDS;
            // Garbage in its ticket slots (not in its flags: a peer whose record says it posted and dies does break it).
            let garbage: Vec<u8> =
                (0..64u64).flat_map(|i| (i.wrapping_mul(0x9e37_79b9) ^ u64::from(round)).to_le_bytes()).collect();
            memory.write_bytes((record + RECORD_TICKETS) * 8, &garbage).unwrap();
            let attached = Message::Attached(Attached { consumer_id: peer_id }).encode().unwrap();
            send_bytes(stream.as_fd(), &attached, Vec::new(), T).unwrap();
            // Dies: hangs up without detaching.
            drop(stream);
        }
    });
}

#[test]
fn a_poster_that_hangs_up_without_detaching_breaks_the_semaphore_for_every_peer() {
    let _turn = SERIAL.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    let owner = SemaphoreOwner::create::<Host>(&HostContext, &sock("poster-dies"), 0).unwrap();
    let waiter = Arc::new(peer(owner.path(), "waiter", false));
    let blocked = {
        let waiter = Arc::clone(&waiter);
        thread::spawn(move || waiter.wait(Duration::from_secs(30)))
    };
    // A poster as a process that dies leaves it: flags say it posted, the record is attached, the socket closes.
    let (stream, peer_id, body, fd) = take_offer(owner.path());
    let memory = SharedMemory::from_fd(fd, SHARED_BYTES).unwrap();
    let flags = RECORDS_WORD + body.record as usize * RECORD_WORDS + RECORD_FLAGS;
    memory.write_bytes(flags * 8, &FLAG_POSTED.to_le_bytes()).unwrap();
    let attached = Message::Attached(Attached { consumer_id: peer_id }).encode().unwrap();
    send_bytes(stream.as_fd(), &attached, Vec::new(), T).unwrap();
    thread::sleep(Duration::from_millis(50));
    let died = Instant::now();
    drop(stream);
    let result = blocked.join().unwrap();
    let after = died.elapsed();
    assert!(matches!(result, Err(SemaphoreError::PosterDied { record, .. }) if record == body.record), "{result:?}");
    assert!(after < Duration::from_secs(1), "the waiter learnt it after {after:?}");
    assert!(matches!(owner.semaphore().check(), Err(SemaphoreError::PosterDied { .. })));
    // Newcomers are told why, in the semaphore's words (not a ring's "producer shutting down").
    let err = Semaphore::attach::<Host>(&HostContext, owner.path(), &AttachOptions::default()).unwrap_err();
    assert!(matches!(err, SemaphoreError::PosterDied { record, .. } if record == body.record), "{err}");
    assert!(err.to_string().contains("poisoned by a dead poster"), "{err}");
    // The owner resets it: the peer attached before and newcomers work again.
    assert_eq!(owner.reset().unwrap(), 0);
    assert!(waiter.check().is_ok());
    let newcomer = peer(owner.path(), "newcomer", true);
    newcomer.post(1).unwrap();
    waiter.wait(Duration::from_secs(5)).unwrap();
    assert_eq!(owner.semaphore().value(), 0);
}
