//! Rings of more than 32 slots (control-block layout 2) at the handshake and in use, on the fake backend: a
//! consumer that reads only layout 1 (a hello announcing protocol version 1 or 2, and the independent Python
//! consumer written from `docs/ring.md` version 1) is refused with code 1 in words that name the layout and the
//! slot count; a consumer of this release attaches to a 256-slot ring with each CPU strategy and reads every frame
//! through all 256 slots, the producer held back once it is 256 frames ahead; a ring of 32 slots still offers layout
//! 1 to every client.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::os::fd::OwnedFd;
use std::path::PathBuf;
use std::thread;
use std::time::{Duration, Instant};

use common::python::PyScript;
use common::{frame_bytes, producer, publish};
use ipc_core::frames::{AttachOptions, Consumer, FrameError, Producer};
use ipc_core::host::{Host, HostContext};
use ipc_core::ring::RingLayout;
use ipc_core::wire::{ClientHello, Message, ObjectKind, PROTOCOL_VERSION, RefusalCode, Refused, SyncStrategy};

const T: Duration = Duration::from_secs(10);

fn sock(name: &str) -> PathBuf {
    common::sock("deep", name)
}

/// The answer of the producer at socket `name` to a hello announcing `version` (encoded in version 1, as every
/// client sends it), and its fds.
fn answer_to(p: &mut Producer<Host>, name: &str, version: u16) -> (Message, Vec<OwnedFd>) {
    let hello = ClientHello {
        protocol_version: version,
        client_pid: std::process::id(),
        wanted_backend: None,
        consumer_name: format!("speaks-{version}"),
        object: ObjectKind::Ring,
        part: 0,
    };
    let (bytes, fds, _stream) = common::raw_answer(p, &sock(name), &Message::ClientHello(hello).encode().unwrap());
    (Message::decode(&bytes).unwrap(), fds)
}

#[test]
fn a_consumer_that_reads_only_layout_1_is_refused_by_a_256_slot_ring_with_code_1_naming_layout_and_slots() {
    let mut p = producer(sock("refuse"), SyncStrategy::CpuSpin, 256);
    for version in [1, 2] {
        let (answer, fds) = answer_to(&mut p, "refuse", version);
        assert!(fds.is_empty(), "version {version}: no control block travels with a refusal");
        let Message::Refused(Refused { code, message }) = answer else { panic!("version {version}: {answer:?}") };
        assert_eq!(code, RefusalCode::UnsupportedVersion, "{message}");
        for words in ["256 slots", "control-block layout 2", &format!("protocol version {version} cannot map"), "3"] {
            assert!(message.contains(words), "version {version}: {words:?} missing from {message:?}");
        }
    }
    // Nothing was taken for them; a client of this release gets the offer of the 64 KiB layout-2 block.
    assert_eq!(p.consumers(), 0);
    let (answer, fds) = answer_to(&mut p, "refuse", PROTOCOL_VERSION);
    let Message::RingOffer(offer) = answer else { panic!("{answer:?}") };
    assert_eq!((offer.slot_count, offer.control_bytes, fds.len()), (256, RingLayout::V2.block_bytes() as u64, 2));
}

#[test]
fn a_32_slot_ring_still_offers_control_block_layout_1_to_every_client() {
    let mut p = producer(sock("shallow"), SyncStrategy::CpuSpin, 32);
    for version in [1, 2, PROTOCOL_VERSION] {
        let (answer, _fds) = answer_to(&mut p, "shallow", version);
        let Message::RingOffer(offer) = answer else { panic!("version {version}: {answer:?}") };
        assert_eq!((offer.slot_count, offer.control_bytes), (32, 131_072), "version {version}");
    }
}

#[test]
fn the_independent_python_consumer_of_layout_1_is_refused_by_a_256_slot_ring_and_says_why() {
    let python = common::python::python(8);
    let mut p = producer(sock("python"), SyncStrategy::CpuSleep, 256);
    let args = ["--name", "layout-1", "--timeout", "10", "--frames", "10"];
    let mut c = PyScript::spawn(&python, "consumer.py", "python consumer", &sock("python"), &args);
    let deadline = Instant::now() + T;
    while !c.has_exited() {
        assert!(Instant::now() < deadline, "the Python consumer neither attached nor left");
        p.admit_pending().unwrap();
        thread::sleep(Duration::from_millis(1));
    }
    let run = c.wait(T);
    assert_eq!(run.code, Some(3), "refused: {}", run.describe());
    assert!(run.stderr.contains("code 1"), "{}", run.describe());
    assert!(run.stderr.contains("256 slots") && run.stderr.contains("control-block layout 2"), "{}", run.describe());
    assert_eq!(p.consumers(), 0);
}

#[test]
fn a_consumer_of_this_release_reads_every_frame_through_256_slots_with_each_cpu_strategy() {
    for sync in [SyncStrategy::CpuSpin, SyncStrategy::CpuSleep] {
        let name = format!("read-{sync}");
        let mut p = producer(sock(&name), sync, 256);
        let path = sock(&name);
        // The consumer takes 10 frames and then holds off releasing until told, so the producer runs into its
        // 256-frame bound.
        let (go, wait) = std::sync::mpsc::channel::<()>();
        let reader = thread::spawn(move || {
            let mut c = Consumer::<Host>::attach(&HostContext, &path, &AttachOptions::default()).unwrap();
            assert_eq!((c.protocol_version(), c.offer().slot_count), (PROTOCOL_VERSION, 256));
            let mut mismatched = 0;
            for n in 0..1000u64 {
                let frame = c.next_frame(None, T).unwrap();
                assert_eq!(frame.seq().0, n);
                let mut data = vec![0u8; frame.bytes() as usize];
                c.region().read(frame.ptr(), &mut data).unwrap();
                mismatched += u64::from(data != frame_bytes(n, data.len()));
                if n == 10 {
                    wait.recv_timeout(T).unwrap();
                }
                c.release(frame, None).unwrap();
            }
            c.detach();
            mismatched
        });
        p.wait_for_consumers(1, T).unwrap();
        // Frames 0..=255 fill the ring; frame 256 reuses slot 0, which the consumer released (it holds frame 10).
        // Frame 10 + 256 must wait for frame 10's release.
        for _ in 0..(10 + 256) {
            publish(&mut p, T).unwrap();
        }
        let held_back = publish(&mut p, Duration::from_millis(200));
        assert!(
            matches!(held_back, Err(FrameError::Timeout { .. })),
            "{sync}: published frame 266 while frame 10 was held: {held_back:?}"
        );
        go.send(()).unwrap();
        let mut published = 10 + 256;
        while published < 1000 {
            publish(&mut p, T).unwrap();
            published += 1;
        }
        assert_eq!(reader.join().unwrap(), 0, "{sync}: mismatched frames");
    }
}
