//! A consumer that cannot open the producer's IPC events (in a container with its own IPC namespace,
//! `cuIpcOpenEventHandle` fails with `CUDA_ERROR_MAP_FAILED`) still reads an `ipc-event` ring: it says so at the
//! handshake (`AttachedWithoutEvents`, protocol version 4) and runs the ring on its counters; a producer too old to be
//! told is refused in words that name the cause and the fixes, and is not left waiting. Run on the host backend,
//! whose stand-in events fail to open on a thread that asked (`host::set_ipc_events_openable(false)`). The same code
//! on a GPU, across a real IPC namespace: `tools/stress` (its container cells) and `docs/containers.md`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::frame_bytes;

use std::path::{Path, PathBuf};
use std::thread;
use std::time::{Duration, Instant};

use gpu_ipc_driver::DriverError;
use ipc_core::frames::{AttachOptions, Consumer, FrameError, Producer};
use ipc_core::host::{Host, HostContext, HostEvent, set_ipc_events_openable};
use ipc_core::wire::{
    Attached, DetachReason, Header, Message, MessageType, PeerConnection, PeerState, RendezvousListener, SyncStrategy,
    WITHOUT_EVENTS_VERSION, WireError,
};

const T: Duration = Duration::from_secs(10);

fn sock(name: &str) -> PathBuf {
    common::sock("ipc-event-fallback", name)
}

/// What a consumer thread saw: whether it ran without events, its first frame, frames read, frames not intact.
#[derive(Debug, PartialEq, Eq)]
struct Read {
    without_events: bool,
    first: u64,
    frames: u64,
    bad: u64,
}

/// A consumer thread that can (`events_open`) or cannot open IPC events: attaches, reads `frames` frames checking
/// every byte, detaches.
fn spawn_consumer(path: &Path, events_open: bool, frames: u64) -> thread::JoinHandle<Result<Read, FrameError>> {
    let path = path.to_path_buf();
    thread::spawn(move || {
        set_ipc_events_openable(events_open);
        let mut c = Consumer::<Host>::attach(&HostContext, &path, &AttachOptions::default())?;
        let read = Read { without_events: c.without_ipc_events(), first: c.next_sequence(), frames, bad: 0 };
        let mut bad = 0;
        for _ in 0..frames {
            let frame = c.next_frame(None, T)?;
            let mut got = vec![0u8; frame.bytes() as usize];
            c.region().read(frame.ptr(), &mut got).unwrap();
            bad += u64::from(got != frame_bytes(frame.seq().0, got.len()));
            c.release(frame, None)?;
        }
        c.detach();
        Ok(Read { bad, ..read })
    })
}

fn produce(p: &mut Producer<Host>, frames: u64) {
    for _ in 0..frames {
        common::publish(p, T).unwrap();
    }
}

#[test]
fn a_consumer_that_cannot_open_ipc_events_reads_every_frame_on_the_counters() {
    let path = sock("alone");
    let mut p = common::producer(path.clone(), SyncStrategy::IpcEvent, 2);
    let consumer = spawn_consumer(&path, false, 500);
    // The producer is not left waiting: the consumer attaches (without events) well within the bound.
    let started = Instant::now();
    p.wait_for_consumers(1, T).unwrap();
    assert!(started.elapsed() < Duration::from_secs(2), "{:?}", started.elapsed());
    produce(&mut p, 500);
    p.drain(None, T).unwrap();
    assert_eq!(consumer.join().unwrap().unwrap(), Read { without_events: true, first: 0, frames: 500, bad: 0 });
    assert_eq!(p.consumers_lost(), 0);
}

#[test]
fn consumers_with_and_without_ipc_events_share_one_ring() {
    let path = sock("mixed");
    let mut p = common::producer(path.clone(), SyncStrategy::IpcEvent, 3);
    let inside = spawn_consumer(&path, false, 300);
    let outside = spawn_consumer(&path, true, 300);
    p.wait_for_consumers(2, T).unwrap();
    produce(&mut p, 300);
    p.drain(None, T).unwrap();
    assert_eq!(inside.join().unwrap().unwrap(), Read { without_events: true, first: 0, frames: 300, bad: 0 });
    assert_eq!(outside.join().unwrap().unwrap(), Read { without_events: false, first: 0, frames: 300, bad: 0 });
    assert_eq!(p.consumers_lost(), 0);
}

#[test]
fn a_consumer_without_events_joins_a_ring_already_running() {
    let path = sock("late");
    let mut p = common::producer(path.clone(), SyncStrategy::IpcEvent, 2);
    let early = spawn_consumer(&path, true, 200);
    p.wait_for_consumers(1, T).unwrap();
    produce(&mut p, 50);
    let late = spawn_consumer(&path, false, 150);
    // It joins at whatever frame is next when its record is taken; the producer serves it between frames.
    p.wait_for_consumers(2, T).unwrap();
    produce(&mut p, 150);
    p.drain(None, T).unwrap();
    assert_eq!(early.join().unwrap().unwrap(), Read { without_events: false, first: 0, frames: 200, bad: 0 });
    assert_eq!(late.join().unwrap().unwrap(), Read { without_events: true, first: 50, frames: 150, bad: 0 });
}

/// Stands between a consumer and a real producer as a producer of the release before version 4 would: the hello is
/// passed on announcing version 3, so the offer comes back in version 3. Returns what the consumer answered (passed
/// on to the producer too).
fn old_producer_in_front_of(listener: &RendezvousListener, producer: &Path) -> Message {
    let consumer = listener.accept(T).unwrap();
    let Message::ClientHello(mut hello) = consumer.recv(T).unwrap().message else { panic!("no hello") };
    assert!(hello.protocol_version >= WITHOUT_EVENTS_VERSION);
    hello.protocol_version = WITHOUT_EVENTS_VERSION - 1;
    let upstream = PeerConnection::connect(producer, T).unwrap();
    upstream.send(&Message::ClientHello(hello), Vec::new(), T).unwrap();
    let offer = upstream.recv(T).unwrap();
    assert_eq!(offer.version, WITHOUT_EVENTS_VERSION - 1);
    consumer.send_in(offer.version, &offer.message, offer.fds, T).unwrap();
    let answer = consumer.recv(T).unwrap().message;
    upstream.send_in(offer.version, &answer, Vec::new(), T).unwrap();
    answer
}

#[test]
fn a_producer_too_old_to_run_without_events_is_refused_with_the_cause_and_the_fix_and_not_left_waiting() {
    let path = sock("old");
    let front = sock("old-front");
    let mut p = common::producer(path.clone(), SyncStrategy::IpcEvent, 2);
    let listener = RendezvousListener::bind(&front).unwrap();
    let old = {
        let path = path.clone();
        thread::spawn(move || old_producer_in_front_of(&listener, &path))
    };
    let consumer = {
        let front = front.clone();
        thread::spawn(move || {
            set_ipc_events_openable(false);
            Consumer::<Host>::attach(&HostContext, &front, &AttachOptions::default()).map(|_| ())
        })
    };
    while !old.is_finished() {
        p.admit_pending().unwrap();
        thread::sleep(Duration::from_millis(1));
    }
    // The consumer told the producer why it leaves, instead of confirming.
    match old.join().unwrap() {
        Message::Detach(detach) => assert_eq!(detach.reason, DetachReason::ImportFailed),
        other => panic!("{other:?}"),
    }
    match consumer.join().unwrap() {
        Err(FrameError::StrategyUnavailable { strategy, reason }) => {
            assert_eq!(strategy, "ipc-event");
            for words in [
                "CUDA_ERROR_MAP_FAILED",
                "IPC namespace",
                "gpu-stream-ops",
                "cpu-spin",
                "--ipc=host",
                "hostIPC: true",
                "upgrade the producer",
            ] {
                assert!(reason.contains(words), "{words}: {reason}");
            }
        }
        other => panic!("{other:?}"),
    }
    // The producer ended that handshake at once: no record is left joining or attached.
    let deadline = Instant::now() + Duration::from_secs(1);
    loop {
        p.admit_pending().unwrap();
        let report = common::door_client::status(&path);
        if report.peers.iter().all(|peer| !matches!(peer.state, PeerState::Attached | PeerState::Joining)) {
            break;
        }
        assert!(Instant::now() < deadline, "the producer still holds the refused consumer: {:?}", report.peers);
        thread::sleep(Duration::from_millis(5));
    }
    assert_eq!(p.consumers(), 0);
}

#[test]
fn a_host_event_that_cannot_be_opened_is_the_typed_error_of_another_ipc_namespace() {
    set_ipc_events_openable(false);
    let error = HostEvent::open_ipc(&HostEvent::HANDLE).unwrap_err();
    assert!(matches!(error, DriverError::IpcEventUnreachable), "{error:?}");
    assert_eq!(error.cuda_code(), Some(205));
    let text = error.to_string();
    assert!(text.contains("IPC namespace") && text.contains("--ipc=host") && text.contains("gpu-stream-ops"), "{text}");
    set_ipc_events_openable(true);
    assert_eq!(HostEvent::open_ipc(&HostEvent::HANDLE).unwrap(), HostEvent);
    assert!(HostEvent::open_ipc(&[0; 64]).is_err());
}

#[test]
fn attached_without_events_is_type_9_in_version_4_with_attached_s_payload() {
    let message = Message::AttachedWithoutEvents(Attached { consumer_id: 0x0102_0304 });
    let bytes = message.encode().unwrap();
    let header = Header::decode(&bytes).unwrap();
    assert_eq!(
        (header.version, header.message_type, header.payload_len, header.fd_count),
        (4, MessageType::AttachedWithoutEvents, 8, 0)
    );
    assert_eq!(&bytes[8..12], &[4, 0, 9, 0], "version 4, type 9, little endian");
    assert_eq!(&bytes[24..], &[4, 3, 2, 1, 0, 0, 0, 0], "consumer_id, then a reserved zero u32");
    assert_eq!(Message::decode(&bytes).unwrap(), message);
    // A version-3 peer never sends nor receives it.
    assert!(matches!(message.encode_in(3), Err(WireError::NeedsVersion { version: 3, needs: 4, .. })));
    let mut v3 = bytes.clone();
    v3[8..10].copy_from_slice(&3u16.to_le_bytes());
    assert!(matches!(Message::decode(&v3), Err(WireError::NeedsVersion { version: 3, needs: 4, .. })));
    // Its reserved word is checked like Attached's.
    let mut reserved = bytes;
    reserved[28] = 1;
    assert!(Message::decode(&reserved).is_err());
}
