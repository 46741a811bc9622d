//! A status request to a ring's socket (`gpu-ipc ps`): who is attached, what each released, and a client of
//! another kind told what the socket serves.
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "../../ipc-core/tests/common/mod.rs"]
mod common;

use std::time::Duration;

use ipc_core::frames::{AttachOptions, Consumer};
use ipc_core::host::{Host, HostContext};
use ipc_core::wire::{BackendKind, RefusalCode, SyncStrategy};
use ipc_toolkit::door::{self, DoorError, ObjectKind, PeerState};

const T: Duration = Duration::from_secs(10);

#[test]
fn a_ring_reports_its_consumers_by_name_with_the_frames_they_released() {
    let path = common::sock("status", "ring");
    let mut producer = common::producer(path.clone(), SyncStrategy::CpuSpin, 2);
    let consumer = {
        let path = path.clone();
        std::thread::spawn(move || {
            let options = AttachOptions { name: "viewer".into(), timeout: T, ..AttachOptions::default() };
            let mut c = Consumer::<Host>::attach(&HostContext, &path, &options).unwrap();
            for _ in 0..3 {
                let frame = c.next_frame(None, T).unwrap();
                c.release(frame, None).unwrap();
            }
            // Stay attached until the test has looked.
            std::thread::sleep(Duration::from_millis(400));
            c.detach();
        })
    };
    producer.wait_for_consumers(1, T).unwrap();
    for _ in 0..3 {
        let lease = producer.acquire(None, T).unwrap();
        producer.publish(lease, None).unwrap();
    }
    // The consumer releases frame 2 right after it is published; give it a moment.
    let mut report = door::status(&path, T).unwrap();
    for _ in 0..100 {
        if report.peers.first().is_some_and(|p| p.detail.starts_with("released frame 2")) {
            break;
        }
        std::thread::sleep(Duration::from_millis(2));
        report = door::status(&path, T).unwrap();
    }
    assert_eq!(
        (report.kind, report.backend, report.owner_pid),
        (ObjectKind::Ring, BackendKind::Host, std::process::id())
    );
    assert_eq!(report.peers.len(), 1, "{report:?}");
    let peer = report.peers.first().unwrap();
    assert_eq!((peer.state, peer.name.as_str(), peer.pid), (PeerState::Attached, "viewer", Some(std::process::id())));
    assert_eq!(peer.detail, "released frame 2; the producer is at frame 3");
    assert!(peer.last_sign_ms.is_some_and(|ms| ms < 5_000), "{peer:?}");
    assert!(peer.since_unix_ms > 0);

    // A pool client at the ring's socket is told what it serves.
    let error = door::attach(&path, ObjectKind::Pool, None, "lost", T, |_, _| Ok::<_, DoorError>(())).unwrap_err();
    match error {
        DoorError::Refused { code: RefusalCode::WrongObject, message } => {
            assert!(message.contains("serves a ring"), "{message}")
        }
        other => panic!("{other}"),
    }
    consumer.join().unwrap();
}
