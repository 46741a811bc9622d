//! The rendezvous socket for real: two threads, two processes, two users; file mode, stale
//! and live sockets, paths that are not sockets, and the errors a user sees.
//!
//! The cross-process tests run this very binary again as the consumer: `child_process_entry_point` is an
//! ignored test that does nothing unless `GPU_IPC_WIRE_CHILD` says which role to play.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::fs::File;
use std::os::fd::OwnedFd;
use std::os::unix::fs::{FileExt, PermissionsExt};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

use gpu_ipc_driver::DeviceUuid;
use ipc_core::wire::{
    Attached, BackendKind, ClientHello, Detach, DetachReason, FrameGeometry, HandleType, Message, OfferFds,
    PROTOCOL_VERSION, PeerConnection, PixelFormat, RefusalCode, RendezvousListener, RingOffer, SyncStrategy, WireError,
};
use rustix::fs::{MemfdFlags, SealFlags, memfd_create};
use rustix::net::{AddressFamily, SocketAddrUnix, SocketFlags, SocketType, bind, socket_with};

const T: Duration = Duration::from_secs(10);
const CHILD_ROLE: &str = "GPU_IPC_WIRE_CHILD";
const CHILD_SOCKET: &str = "GPU_IPC_WIRE_SOCKET";
const NOBODY: u32 = 65534;

/// A fresh directory (mode 0755, so another user can reach a socket inside) removed on drop.
struct TempDir(PathBuf);

impl TempDir {
    fn new(name: &str) -> Self {
        let path = std::env::temp_dir().join(format!("gpu-ipc-wire-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&path);
        std::fs::create_dir(&path).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
        Self(path)
    }

    fn join(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A memfd of `size` bytes starting with `bytes`, sealed against resizing as the protocol requires.
fn memfd_with(bytes: &[u8], size: u64) -> OwnedFd {
    let file = File::from(memfd_create("rendezvous-test", MemfdFlags::CLOEXEC | MemfdFlags::ALLOW_SEALING).unwrap());
    file.set_len(size).unwrap();
    file.write_all_at(bytes, 0).unwrap();
    rustix::fs::fcntl_add_seals(&file, SealFlags::SHRINK | SealFlags::GROW).unwrap();
    file.into()
}

fn offer_for(consumer_id: u32) -> RingOffer {
    RingOffer {
        backend: BackendKind::Host,
        handle_type: HandleType::HostMemfd,
        sync: SyncStrategy::CpuSpin,
        device_uuid: DeviceUuid([3; 16]),
        producer_pid: std::process::id(),
        generation: 77,
        consumer_id,
        slot_layout: FrameGeometry::new(32, 8, PixelFormat::Gray8).unwrap().into(),
        slot_count: 2,
        slot_stride_bytes: 256,
        data_offset: 0,
        allocation_bytes: 4096,
        granularity: 4096,
        control_bytes: 64,
        legacy_mem_handle: None,
        event_handles: Vec::new(),
    }
}

/// The consumer side of the handshake: hello, offer, check the frame bytes, write a reply into
/// the control block, attached; then wait for the producer's detach.
fn consume(path: &Path, name: &str) -> u64 {
    let connection = PeerConnection::connect(path, T).unwrap();
    connection
        .send(
            &Message::ClientHello(ClientHello {
                object: Default::default(),
                part: 0,
                protocol_version: PROTOCOL_VERSION,
                client_pid: std::process::id(),
                wanted_backend: Some(BackendKind::Host),
                consumer_name: name.to_owned(),
            }),
            Vec::new(),
            T,
        )
        .unwrap();
    let (offer, fds) = connection.recv(T).unwrap().into_ring_offer().unwrap();
    let data = File::from(fds.data.unwrap());
    let mut frame = [0u8; 5];
    data.read_exact_at(&mut frame, 256).unwrap();
    assert_eq!(&frame, b"slot1");
    File::from(fds.control).write_all_at(&u64::from(offer.consumer_id + 1000).to_le_bytes(), 0).unwrap();
    connection.send(&Message::Attached(Attached { consumer_id: offer.consumer_id }), Vec::new(), T).unwrap();
    let detach = connection.recv(T).unwrap().message;
    assert_eq!(
        detach,
        Message::Detach(Detach { consumer_id: offer.consumer_id, reason: DetachReason::ProducerShutdown })
    );
    offer.generation
}

/// The producer side for one consumer; returns the consumer's hello and the u64 it wrote.
fn serve_one(listener: &RendezvousListener, consumer_id: u32) -> (PeerConnection, ClientHello, u64) {
    let connection = listener.accept(T).unwrap();
    let hello = match connection.recv(T).unwrap().message {
        Message::ClientHello(hello) => hello,
        other => panic!("expected hello, got {other:?}"),
    };
    let control = memfd_with(&[0; 8], 64);
    let reader = File::from(control.try_clone().unwrap());
    let mut frames = vec![0u8; 4096];
    frames[256..261].copy_from_slice(b"slot1");
    connection
        .send(
            &Message::RingOffer(offer_for(consumer_id)),
            OfferFds { control, data: Some(memfd_with(&frames, 4096)) }.into_vec(),
            T,
        )
        .unwrap();
    assert_eq!(connection.recv(T).unwrap().message, Message::Attached(Attached { consumer_id }));
    let mut written = [0u8; 8];
    reader.read_exact_at(&mut written, 0).unwrap();
    connection
        .send(&Message::Detach(Detach { consumer_id, reason: DetachReason::ProducerShutdown }), Vec::new(), T)
        .unwrap();
    (connection, hello, u64::from_le_bytes(written))
}

#[test]
fn producer_and_consumer_threads_complete_the_handshake() {
    let dir = TempDir::new("threads");
    let path = dir.join("producer.sock");
    let listener = RendezvousListener::bind(&path).unwrap();
    let consumer_path = path.clone();
    let consumer = std::thread::spawn(move || consume(&consumer_path, "thread"));
    let (connection, hello, written) = serve_one(&listener, 5);
    assert_eq!(consumer.join().unwrap(), 77);
    assert_eq!(hello.consumer_name, "thread");
    assert_eq!(hello.client_pid, std::process::id());
    assert_eq!(written, 1005);
    assert_eq!(connection.peer().pid, Some(std::process::id()));
    assert_eq!(connection.peer().uid, rustix::process::geteuid().as_raw());
    // The consumer thread has returned and dropped its end.
    assert!(connection.is_peer_gone().unwrap());
    drop(listener);
    assert!(!path.exists(), "listener did not unlink its socket");
}

fn spawn_child(role: &str, path: &Path, uid: Option<u32>) -> std::process::Child {
    // A child of another user runs a copy of this binary that it can read (the build directory may be closed).
    let exe = if uid.is_some() { common::binary_for_nobody() } else { std::env::current_exe().unwrap() };
    let mut command = Command::new(exe);
    command
        .args(["--exact", "child_process_entry_point", "--ignored", "--nocapture", "--test-threads=1"])
        .env(CHILD_ROLE, role)
        .env(CHILD_SOCKET, path)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    if let Some(uid) = uid {
        command.uid(uid).gid(uid);
    }
    command.spawn().unwrap()
}

fn assert_child_passed(output: &Output) {
    assert!(
        output.status.success(),
        "child failed: {}\n{}\n{}",
        output.status,
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    // Guards against the child mode silently not running (a filter typo would "pass").
    assert!(String::from_utf8_lossy(&output.stdout).contains("1 passed"));
}

#[test]
fn producer_and_consumer_processes_complete_the_handshake() {
    let dir = TempDir::new("processes");
    let path = dir.join("producer.sock");
    let listener = RendezvousListener::bind(&path).unwrap();
    let child = spawn_child("consume", &path, None);
    let child_pid = child.id();
    let (connection, hello, written) = serve_one(&listener, 2);
    assert_child_passed(&child.wait_with_output().unwrap());
    assert_eq!(connection.peer().pid, Some(child_pid));
    assert_eq!(hello.client_pid, child_pid);
    assert_eq!(hello.consumer_name, "child");
    assert_eq!(written, 1002);
    assert!(connection.is_peer_gone().unwrap());
    let error = connection.recv(T).unwrap_err();
    assert!(matches!(error, WireError::PeerHungUp { transferred: 0, .. }), "{error:?}");
}

/// Runs only as a child of the tests above (see the module comment).
#[test]
#[ignore = "child-process entry point; run by the cross-process tests, not on its own"]
fn child_process_entry_point() {
    let (Ok(role), Some(path)) = (std::env::var(CHILD_ROLE), std::env::var_os(CHILD_SOCKET)) else {
        println!("not started as a child: nothing to do");
        return;
    };
    let path = PathBuf::from(path);
    match role.as_str() {
        "consume" => {
            consume(&path, "child");
        }
        "expect-permission-denied" => {
            let error = PeerConnection::connect(&path, T).unwrap_err();
            assert!(matches!(error, WireError::PermissionDenied { op: "connect", .. }), "{error:?}");
            assert!(
                error.to_string().contains("--allow-uid") && error.to_string().contains("--check-socket"),
                "{error}"
            );
        }
        // In a PID namespace of its own: the producer (the parent test) is not visible from here, so
        // `SO_PEERCRED` names pid 0. That must not stop the connection.
        "connect-from-pid-namespace" => {
            let connection = PeerConnection::connect(&path, T).unwrap();
            assert_eq!(connection.peer().pid, None, "the producer should be invisible from this PID namespace");
            assert_eq!(connection.peer().uid, rustix::process::geteuid().as_raw());
            let hello = ClientHello {
                object: Default::default(),
                part: 0,
                protocol_version: PROTOCOL_VERSION,
                client_pid: std::process::id(),
                wanted_backend: None,
                consumer_name: "pid-namespace".into(),
            };
            connection.send(&Message::ClientHello(hello), Vec::new(), T).unwrap();
            let answer = connection.recv(T).unwrap();
            assert_eq!(answer.message, Message::Attached(Attached { consumer_id: 9 }));
        }
        // A listener in a PID namespace of its own: the connecting parent is not visible from here.
        "listen-in-pid-namespace" => {
            let listener = RendezvousListener::bind(&path).unwrap();
            let connection = listener.accept(T).unwrap();
            assert_eq!(connection.peer().pid, None, "the consumer should be invisible from this PID namespace");
            assert_eq!(connection.peer().uid, rustix::process::geteuid().as_raw());
            connection.send(&Message::Attached(Attached { consumer_id: 11 }), Vec::new(), T).unwrap();
            // Wait for the parent to hang up, so that it reads the message before we close.
            let error = connection.recv(T).unwrap_err();
            assert!(matches!(error, WireError::PeerHungUp { transferred: 0, .. }), "{error:?}");
        }
        "expect-uid-mismatch" => {
            let error = PeerConnection::connect(&path, T).unwrap_err();
            assert!(matches!(error, WireError::PeerUidMismatch { peer_uid: 0, our_uid: NOBODY, .. }), "{error:?}");
        }
        other => panic!("unknown child role {other}"),
    }
}

/// Why `unshare --pid --fork` cannot run here, or `None` when it can.
fn pid_namespaces_unavailable() -> Option<String> {
    match Command::new("unshare").args(["--pid", "--fork", "true"]).output() {
        Ok(output) if output.status.success() => None,
        Ok(output) => Some(format!(
            "`unshare --pid --fork true` failed ({}): {}",
            output.status,
            String::from_utf8_lossy(&output.stderr).trim()
        )),
        Err(e) => Some(format!("cannot run unshare: {e}")),
    }
}

/// Runs this binary's child entry point in a new PID namespace (as its pid 1).
fn spawn_child_in_pid_namespace(role: &str, path: &Path) -> std::process::Child {
    Command::new("unshare")
        .args(["--pid", "--fork"])
        .arg(std::env::current_exe().unwrap())
        .args(["--exact", "child_process_entry_point", "--ignored", "--nocapture", "--test-threads=1"])
        .env(CHILD_ROLE, role)
        .env(CHILD_SOCKET, path)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap()
}

/// A peer in another PID namespace, whose pid `SO_PEERCRED` reports as 0, is a valid peer on both sides: a
/// consumer connecting to a producer it cannot see, and a producer accepting a consumer it cannot see. The uid
/// check still applies (both run as the same user here).
#[test]
fn peers_in_another_pid_namespace_connect_and_are_accepted() {
    if let Some(why) = pid_namespaces_unavailable() {
        println!("SKIPPED peers_in_another_pid_namespace_connect_and_are_accepted: {why}");
        return;
    }
    let dir = TempDir::new("pid-namespace");

    // Consumer side: the child connects from its own PID namespace.
    let path = dir.join("producer.sock");
    let listener = RendezvousListener::bind(&path).unwrap();
    let child = spawn_child_in_pid_namespace("connect-from-pid-namespace", &path);
    let connection = listener.accept(T).unwrap();
    // The child is below us: we see its pid (not the 1 it sees itself as).
    let seen = connection.peer().pid.expect("a process in a child PID namespace is visible from its parent");
    let Message::ClientHello(hello) = connection.recv(T).unwrap().message else { panic!("expected a hello") };
    assert_eq!(hello.client_pid, 1, "the child is pid 1 of its namespace");
    assert_ne!(seen, hello.client_pid);
    connection.send(&Message::Attached(Attached { consumer_id: 9 }), Vec::new(), T).unwrap();
    assert_child_passed(&child.wait_with_output().unwrap());
    drop(listener);

    // Producer side: the child listens in its own PID namespace and accepts us.
    let path = dir.join("child-producer.sock");
    let child = spawn_child_in_pid_namespace("listen-in-pid-namespace", &path);
    let deadline = std::time::Instant::now() + T;
    let connection = loop {
        match PeerConnection::connect(&path, T) {
            Ok(connection) => break connection,
            Err(_) if std::time::Instant::now() < deadline => std::thread::sleep(Duration::from_millis(10)),
            Err(e) => panic!("the child producer never listened: {e}"),
        }
    };
    assert!(connection.peer().pid.is_some(), "a process in a child PID namespace is visible from its parent");
    assert_eq!(connection.recv(T).unwrap().message, Message::Attached(Attached { consumer_id: 11 }));
    drop(connection);
    assert_child_passed(&child.wait_with_output().unwrap());
}

/// Root only: a consumer running as `nobody` is kept out by the 0600 mode, and, with the mode
/// widened, by the `SO_PEERCRED` check on both sides.
#[test]
#[ignore = "needs root: starts a child as another user (scripts/test.sh runs it when root)"]
fn another_user_is_kept_out() {
    assert!(rustix::process::geteuid().is_root(), "this test needs root (it starts a child as nobody)");
    let dir = TempDir::new("other-user");
    let path = dir.join("producer.sock");
    let listener = RendezvousListener::bind(&path).unwrap();

    let child = spawn_child("expect-permission-denied", &path, Some(NOBODY));
    assert_child_passed(&child.wait_with_output().unwrap());

    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o666)).unwrap();
    let child = spawn_child("expect-uid-mismatch", &path, Some(NOBODY));
    let error = listener.accept(T).unwrap_err();
    assert!(matches!(error, WireError::PeerUidMismatch { peer_uid: NOBODY, our_uid: 0, .. }), "{error:?}");
    assert_child_passed(&child.wait_with_output().unwrap());
}

#[test]
fn socket_file_is_mode_0600() {
    let dir = TempDir::new("mode");
    let path = dir.join("producer.sock");
    let _listener = RendezvousListener::bind(&path).unwrap();
    let meta = std::fs::symlink_metadata(&path).unwrap();
    assert!(std::os::unix::fs::FileTypeExt::is_socket(&meta.file_type()));
    assert_eq!(meta.permissions().mode() & 0o7777, 0o600);
}

#[test]
fn a_stale_socket_is_replaced() {
    let dir = TempDir::new("stale");
    let path = dir.join("producer.sock");
    // A socket file nobody listens on, as a crashed producer leaves behind.
    let orphan = socket_with(AddressFamily::UNIX, SocketType::STREAM, SocketFlags::CLOEXEC, None).unwrap();
    bind(&orphan, &SocketAddrUnix::new(&path).unwrap()).unwrap();
    drop(orphan);
    assert!(matches!(PeerConnection::connect(&path, T).unwrap_err(), WireError::NoProducer { .. }));

    let listener = RendezvousListener::bind(&path).unwrap();
    let client = std::thread::spawn({
        let path = path.clone();
        move || PeerConnection::connect(&path, T).map(|c| c.peer().pid)
    });
    let connection = listener.accept(T).unwrap();
    assert_eq!(client.join().unwrap().unwrap(), Some(std::process::id()));
    assert_eq!(connection.peer().pid, Some(std::process::id()));
}

#[test]
fn a_live_socket_is_not_taken_over() {
    let dir = TempDir::new("live");
    let path = dir.join("producer.sock");
    let first = RendezvousListener::bind(&path).unwrap();
    let error = RendezvousListener::bind(&path).unwrap_err();
    assert!(matches!(error, WireError::PathInUse { .. }), "{error:?}");
    assert!(error.to_string().contains("already listening"));
    // The failed attempt left the first producer's socket in place and working.
    let _client = PeerConnection::connect(&path, T).unwrap();
    first.accept(T).unwrap();
}

#[test]
fn a_path_that_is_not_a_socket_is_left_alone() {
    let dir = TempDir::new("not-socket");
    let path = dir.join("precious.txt");
    std::fs::write(&path, b"keep me").unwrap();
    let error = RendezvousListener::bind(&path).unwrap_err();
    assert!(matches!(error, WireError::PathNotSocket { ref path } if path.ends_with("precious.txt")), "{error:?}");
    assert_eq!(std::fs::read(&path).unwrap(), b"keep me");
}

#[test]
fn drop_leaves_a_successors_socket_alone() {
    let dir = TempDir::new("successor");
    let path = dir.join("producer.sock");
    let old = RendezvousListener::bind(&path).unwrap();
    std::fs::remove_file(&path).unwrap();
    let new = RendezvousListener::bind(&path).unwrap();
    drop(old);
    assert!(path.exists());
    let _client = PeerConnection::connect(&path, T).unwrap();
    new.accept(T).unwrap();
}

#[test]
fn connect_errors_tell_the_user_what_to_do() {
    let dir = TempDir::new("errors");
    let missing = dir.join("nobody-home.sock");
    let error = PeerConnection::connect(&missing, T).unwrap_err();
    assert!(matches!(error, WireError::NoProducer { .. }), "{error:?}");
    assert_eq!(
        error.to_string(),
        format!("no producer is listening at {}: start the producer first", missing.display())
    );

    let long = dir.join(&"x".repeat(120));
    assert!(matches!(RendezvousListener::bind(&long).unwrap_err(), WireError::PathTooLong { .. }));
    assert!(matches!(PeerConnection::connect(&long, T).unwrap_err(), WireError::PathTooLong { .. }));
}

#[test]
fn accept_without_a_consumer_times_out() {
    let dir = TempDir::new("accept-timeout");
    let listener = RendezvousListener::bind(dir.join("producer.sock")).unwrap();
    let error = listener.accept(Duration::from_millis(30)).unwrap_err();
    assert!(matches!(error, WireError::Timeout { op: "accept", .. }), "{error:?}");
}

#[test]
fn refusal_reaches_the_consumer_as_an_error() {
    let (producer, consumer) = PeerConnection::pair().unwrap();
    producer
        .send(
            &Message::Refused(ipc_core::wire::Refused {
                code: RefusalCode::BackendMismatch,
                message: "this ring uses the vmm backend".to_owned(),
            }),
            Vec::new(),
            T,
        )
        .unwrap();
    let error = consumer.recv(T).unwrap().into_ring_offer().unwrap_err();
    assert!(
        matches!(error, WireError::Refused { code: RefusalCode::BackendMismatch, ref message } if message.contains("vmm")),
        "{error:?}"
    );
}
