//! The object door with a host that offers a memfd: attach, refusals, the registry, and a peer's end reported.

use std::io::{Read, Seek, Write};
use std::os::fd::OwnedFd;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use super::*;

/// A host that offers one memfd holding `b"hello"` and records what the door tells it.
struct Recorder {
    kind: ObjectKind,
    attached: Mutex<Vec<u32>>,
    gone: Mutex<Vec<u32>>,
}

impl Recorder {
    fn new(kind: ObjectKind) -> Arc<Self> {
        Arc::new(Self { kind, attached: Mutex::default(), gone: Mutex::default() })
    }

    fn gone_within(&self, id: u32, limit: Duration) -> bool {
        let start = Instant::now();
        while start.elapsed() < limit {
            if self.gone.lock().unwrap().contains(&id) {
                return true;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        false
    }
}

impl ObjectHost for Recorder {
    fn kind(&self) -> ObjectKind {
        self.kind
    }

    fn backend(&self) -> BackendKind {
        BackendKind::Host
    }

    fn offer(&self, peer: &PeerInfo) -> Result<(Vec<u8>, Vec<OwnedFd>), (RefusalCode, String)> {
        if peer.name == "unwelcome" {
            return Err((RefusalCode::PeerNotAllowed, "not you".to_owned()));
        }
        let fd = rustix::fs::memfd_create("door-test", rustix::fs::MemfdFlags::CLOEXEC).unwrap();
        let mut file = std::fs::File::from(fd);
        file.write_all(b"hello").unwrap();
        Ok((peer.id.to_le_bytes().to_vec(), vec![OwnedFd::from(file)]))
    }

    fn attached(&self, peer: &PeerInfo) {
        self.attached.lock().unwrap().push(peer.id);
    }

    fn gone(&self, peer: &PeerInfo) {
        self.gone.lock().unwrap().push(peer.id);
    }
}

/// A socket path of this test's own (the door removes the file when it goes).
fn socket(name: &str) -> ((), PathBuf) {
    ((), std::env::temp_dir().join(format!("gpu-ipc-door-{}-{name}", std::process::id())))
}

fn read_memfd(fd: OwnedFd) -> String {
    let mut file = std::fs::File::from(fd);
    file.rewind().unwrap();
    let mut text = String::new();
    file.read_to_string(&mut text).unwrap();
    text
}

const LIMIT: Duration = Duration::from_secs(2);

#[test]
fn a_peer_attaches_is_listed_and_its_end_is_reported() {
    let (_dir, path) = socket("pool.sock");
    let host = Recorder::new(ObjectKind::Pool);
    let door = ObjectDoor::open(&path, host.clone(), DoorConfig::default()).unwrap();
    let (text, link) = attach(&path, ObjectKind::Pool, Some(BackendKind::Host), "reader", LIMIT, |offer, mut fds| {
        assert_eq!(offer.body, offer.peer_id.to_le_bytes());
        Ok::<_, DoorError>(read_memfd(fds.remove(0)))
    })
    .unwrap();
    assert_eq!(text, "hello");
    assert!(!link.owner_gone());
    let start = Instant::now();
    while door.peers().is_empty() && start.elapsed() < LIMIT {
        std::thread::sleep(Duration::from_millis(5));
    }
    let peers = door.peers();
    assert_eq!(peers.len(), 1, "{peers:?}");
    let peer = peers.first().unwrap();
    assert_eq!((peer.id, peer.pid, peer.name.as_str()), (link.peer_id(), Some(std::process::id()), "reader"));
    assert_eq!(*host.attached.lock().unwrap(), vec![link.peer_id()]);
    let id = link.peer_id();
    drop(link);
    assert!(host.gone_within(id, Duration::from_secs(1)), "the door did not report the hang-up within 1 s");
    assert!(door.peers().is_empty());
}

#[test]
fn the_owner_going_is_seen_by_the_peer() {
    let (_dir, path) = socket("sem.sock");
    let door = ObjectDoor::open(&path, Recorder::new(ObjectKind::Semaphore), DoorConfig::default()).unwrap();
    let ((), link) =
        attach(&path, ObjectKind::Semaphore, None, "waiter", LIMIT, |_, _| Ok::<_, DoorError>(())).unwrap();
    drop(door);
    assert!(link.owner_gone());
    assert!(!path.exists(), "the socket file outlived its door");
}

#[test]
fn another_kind_of_client_is_refused_with_words_that_say_what_the_socket_serves() {
    let (_dir, path) = socket("queue.sock");
    let _door = ObjectDoor::open(&path, Recorder::new(ObjectKind::WorkQueue), DoorConfig::default()).unwrap();
    for kind in [ObjectKind::Ring, ObjectKind::Pool] {
        let error = attach(&path, kind, None, "lost", LIMIT, |_, _| Ok::<_, DoorError>(())).unwrap_err();
        match error {
            DoorError::Refused { code: RefusalCode::WrongObject, message } => {
                assert!(message.contains("serves a work-queue"), "{message}");
            }
            other => panic!("{other}"),
        }
    }
}

#[test]
fn another_backend_and_a_refused_peer_are_told_why() {
    let (_dir, path) = socket("pool.sock");
    let host = Recorder::new(ObjectKind::Pool);
    let _door = ObjectDoor::open(&path, host.clone(), DoorConfig::default()).unwrap();
    let error = attach(&path, ObjectKind::Pool, Some(BackendKind::Vmm), "gpu", LIMIT, |_, _| Ok::<_, DoorError>(()))
        .unwrap_err();
    assert!(matches!(error, DoorError::Refused { code: RefusalCode::BackendMismatch, .. }), "{error}");
    let error = attach(&path, ObjectKind::Pool, None, "unwelcome", LIMIT, |_, _| Ok::<_, DoorError>(())).unwrap_err();
    assert!(
        matches!(error, DoorError::Refused { code: RefusalCode::PeerNotAllowed, ref message } if message == "not you")
    );
    assert!(host.gone.lock().unwrap().is_empty(), "a refused peer was never offered anything");
}

#[test]
fn a_failed_import_gives_the_peer_number_back() {
    let (_dir, path) = socket("pool.sock");
    let host = Recorder::new(ObjectKind::Pool);
    let _door = ObjectDoor::open(&path, host.clone(), DoorConfig::default()).unwrap();
    let mut offered = None;
    let error = attach(&path, ObjectKind::Pool, None, "clumsy", LIMIT, |offer, _| {
        offered = Some(offer.peer_id);
        Err::<(), _>(DoorError::Thread(std::io::Error::other("import failed")))
    })
    .unwrap_err();
    assert!(error.to_string().contains("import failed"));
    assert!(host.gone_within(offered.unwrap(), Duration::from_secs(1)));
    assert!(host.attached.lock().unwrap().is_empty());
}

#[test]
fn no_owner_says_start_it_first() {
    let (_dir, path) = socket("nobody.sock");
    let error = attach(&path, ObjectKind::Pool, None, "early", LIMIT, |_, _| Ok::<_, DoorError>(())).unwrap_err();
    assert!(matches!(error, DoorError::NoOwner { .. }), "{error}");
    assert!(error.to_string().contains("start the process that creates the pool first"), "{error}");
}

#[test]
fn a_status_request_lists_the_attached_peers_and_takes_no_record() {
    let (_dir, path) = socket("status.sock");
    let host = Recorder::new(ObjectKind::Semaphore);
    let door = ObjectDoor::open(&path, host.clone(), DoorConfig::default()).unwrap();
    let ((), link) =
        attach(&path, ObjectKind::Semaphore, None, "poster", LIMIT, |_, _| Ok::<_, DoorError>(())).unwrap();
    let start = Instant::now();
    while door.peers().is_empty() && start.elapsed() < LIMIT {
        std::thread::sleep(Duration::from_millis(5));
    }
    let report = status(&path, LIMIT).unwrap();
    assert_eq!(
        (report.kind, report.backend, report.owner_pid),
        (ObjectKind::Semaphore, BackendKind::Host, std::process::id())
    );
    assert_eq!(report.peers.len(), 1, "{report:?}");
    let peer = report.peers.first().unwrap();
    assert_eq!(
        (peer.id, peer.pid, peer.state, peer.name.as_str()),
        (link.peer_id(), Some(std::process::id()), PeerState::Attached, "poster")
    );
    assert_eq!(peer.uid, rustix::process::geteuid().as_raw());
    assert!(peer.since_unix_ms > 0);
    assert_eq!(*host.attached.lock().unwrap(), vec![link.peer_id()], "the status request attached nothing");
    assert!(host.gone.lock().unwrap().is_empty());
}
