//! The frame-sharing API end to end without a GPU: the host backend behind the same `Producer` and
//! `Consumer`, the real rendezvous socket, `SCM_RIGHTS`, control block and watchdog. Consumers run on threads of
//! this process (the GPU suite runs the same API across processes with real backends).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::{frame_bytes, geometry};

use std::path::PathBuf;
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use ipc_core::backend::SharedRegion;
use ipc_core::frames::{AttachOptions, Consumer, FrameError, Producer, ProducerConfig};
use ipc_core::host::{Host, HostContext};
use ipc_core::wire::{Attached, ClientHello, Message, PROTOCOL_VERSION, PeerConnection, SyncStrategy};

const T: Duration = Duration::from_secs(10);

fn sock(name: &str) -> PathBuf {
    common::sock("frames", name)
}

fn producer(name: &str, sync: SyncStrategy, slots: u32) -> Producer<Host> {
    common::producer(sock(name), sync, slots)
}

/// A consumer thread: attaches, reads `frames` frames checking each byte, returns (first seq, frames, bad frames).
fn spawn_consumer(name: &str, frames: u64) -> thread::JoinHandle<Result<(u64, u64, u64), FrameError>> {
    let path = sock(name);
    thread::spawn(move || {
        let mut c = Consumer::<Host>::attach(&HostContext, &path, &AttachOptions::default())?;
        let first = c.next_sequence();
        let mut bad = 0;
        for _ in 0..frames {
            let frame = c.next_frame(None, T)?;
            let mut got = vec![0u8; frame.bytes() as usize];
            c.region().read(frame.ptr(), &mut got).unwrap();
            if got != frame_bytes(frame.seq().0, got.len()) {
                bad += 1;
            }
            c.release(frame, None)?;
        }
        c.detach();
        Ok((first, frames, bad))
    })
}

fn produce(p: &mut Producer<Host>, frames: u64) {
    for _ in 0..frames {
        let lease = p.acquire(None, T).unwrap();
        p.region().write(lease.ptr(), &frame_bytes(lease.seq().0, lease.bytes() as usize)).unwrap();
        p.publish(lease, None).unwrap();
    }
}

#[test]
fn two_consumers_read_every_frame_intact_with_cpu_spin_and_cpu_sleep() {
    for (name, sync) in [("spin", SyncStrategy::CpuSpin), ("sleep", SyncStrategy::CpuSleep)] {
        let mut p = producer(name, sync, 2);
        let a = spawn_consumer(name, 3000);
        let b = spawn_consumer(name, 3000);
        p.wait_for_consumers(2, T).unwrap();
        produce(&mut p, 3000);
        p.drain(None, T).unwrap();
        for c in [a, b] {
            assert_eq!(c.join().unwrap().unwrap(), (0, 3000, 0), "{name}");
        }
        // One allocation holds both slots: frame n sits in slot n % 2.
        assert!(p.region().len() >= 2 * geometry().frame_bytes());
    }
}

#[test]
fn a_slot_is_not_rewritten_before_every_consumer_released_it() {
    let mut p = producer("backpressure", SyncStrategy::CpuSpin, 2);
    let path = sock("backpressure");
    let (tx, rx) = mpsc::channel();
    let slow = thread::spawn(move || {
        let mut c = Consumer::<Host>::attach(&HostContext, &path, &AttachOptions::default()).unwrap();
        let frame = c.next_frame(None, T).unwrap();
        tx.send(()).unwrap();
        thread::sleep(Duration::from_millis(300)); // hold frame 0
        let mut got = vec![0u8; frame.bytes() as usize];
        c.region().read(frame.ptr(), &mut got).unwrap();
        c.release(frame, None).unwrap();
        got == frame_bytes(0, got.len())
    });
    p.wait_for_consumers(1, T).unwrap();
    produce(&mut p, 2); // frames 0 and 1 fill both slots
    rx.recv().unwrap();
    // Frame 2 reuses slot 0, which the consumer still holds: acquire must wait for its release.
    let started = Instant::now();
    let lease = p.acquire(None, T).unwrap();
    assert!(started.elapsed() >= Duration::from_millis(200), "slot reused after {:?}", started.elapsed());
    assert_eq!((lease.seq().0, lease.slot().0), (2, 0));
    assert!(slow.join().unwrap(), "the held frame was overwritten");
}

#[test]
fn a_late_consumer_starts_at_the_next_frame() {
    let mut p = producer("late", SyncStrategy::CpuSpin, 4);
    let early = spawn_consumer("late", 200);
    p.wait_for_consumers(1, T).unwrap();
    produce(&mut p, 100);
    let late = spawn_consumer("late", 100);
    p.wait_for_consumers(2, T).unwrap();
    let joined_at = p.next_sequence();
    produce(&mut p, 100);
    p.drain(None, T).unwrap();
    assert_eq!(early.join().unwrap().unwrap(), (0, 200, 0));
    assert_eq!(late.join().unwrap().unwrap(), (joined_at, 100, 0));
}

#[test]
fn a_consumer_that_vanishes_stops_counting() {
    let mut p = producer("vanish", SyncStrategy::CpuSpin, 2);
    let path = sock("vanish");
    let quitter = thread::spawn(move || {
        let mut c = Consumer::<Host>::attach(&HostContext, &path, &AttachOptions::default()).unwrap();
        let _held = c.next_frame(None, T).unwrap();
        // Vanish while holding frame 0: no release, no detach; the connection closes when `c` drops.
        drop(c);
    });
    let stayer = spawn_consumer("vanish", 500);
    p.wait_for_consumers(2, T).unwrap();
    produce(&mut p, 500);
    p.drain(None, T).unwrap();
    quitter.join().unwrap();
    assert_eq!(stayer.join().unwrap().unwrap(), (0, 500, 0));
    assert_eq!(p.consumers(), 0);
    // Dropping a consumer detaches it; only a process that dies without unwinding (SIGKILL) is "lost": the GPU
    // suite kills one and checks that count.
    assert_eq!(p.consumers_lost(), 0);
}

#[test]
fn consumers_of_a_producer_that_closed_get_end_of_stream_quickly_and_never_a_death() {
    let mut p = producer("gone", SyncStrategy::CpuSpin, 2);
    let path = sock("gone");
    let waiter = thread::spawn(move || {
        let mut c = Consumer::<Host>::attach(&HostContext, &path, &AttachOptions::default()).unwrap();
        let frame = c.next_frame(None, T).unwrap();
        c.release(frame, None).unwrap();
        let waiting_since = Instant::now();
        let err = c.next_frame(None, T).unwrap_err(); // frame 1 never comes
        (err, waiting_since.elapsed())
    });
    p.wait_for_consumers(1, T).unwrap();
    produce(&mut p, 1);
    thread::sleep(Duration::from_millis(100));
    drop(p);
    let (err, waited) = waiter.join().unwrap();
    // A producer dropped (its ring closed) is a clean end, not a death: the consumer learns how many frames there
    // were.
    assert!(matches!(err, FrameError::EndOfStream { published: 1, past_end: None }), "{err}");
    assert!(err.is_end_of_stream());
    assert!(waited < Duration::from_secs(1), "{waited:?}");
}

#[test]
fn attaching_without_a_producer_says_to_start_it() {
    let err = Consumer::<Host>::attach(
        &HostContext,
        &sock("nobody"),
        &AttachOptions { timeout: Duration::from_millis(200), ..AttachOptions::default() },
    )
    .err()
    .unwrap();
    assert!(err.to_string().contains("start the producer"), "{err}");
}

#[test]
fn gpu_strategies_need_a_gpu_backend() {
    // IpcEvent runs on the host backend, with stand-ins for its events (tests/ipc_event_fallback.rs).
    for sync in [SyncStrategy::GpuStreamOps, SyncStrategy::GpuPoll] {
        let err = Producer::<Host>::create(&HostContext, ProducerConfig::new(sock("nogpu"), geometry(), 2, sync)).err();
        assert!(matches!(err, Some(FrameError::StrategyUnavailable { .. })), "{sync}: {err:?}");
    }
}

#[test]
fn eight_consumers_read_every_frame_of_one_ring() {
    let mut p = producer("eight", SyncStrategy::CpuSpin, 3);
    let consumers: Vec<_> = (0..8).map(|_| spawn_consumer("eight", 1000)).collect();
    p.wait_for_consumers(8, T).unwrap();
    produce(&mut p, 1000);
    p.drain(None, T).unwrap();
    for c in consumers {
        assert_eq!(c.join().unwrap().unwrap(), (0, 1000, 0));
    }
    assert_eq!(p.consumers_lost(), 0);
}

#[test]
fn records_of_consumers_that_left_are_reused() {
    // 16 records; 40 consumers come one after another, read a few frames and detach.
    let mut p = producer("reuse", SyncStrategy::CpuSpin, 2);
    for round in 0..40u64 {
        let c = spawn_consumer("reuse", 5);
        p.wait_for_consumers(1, T).unwrap();
        produce(&mut p, 5);
        let (_, frames, bad) = c.join().unwrap().unwrap();
        assert_eq!((frames, bad), (5, 0), "round {round}");
        let deadline = Instant::now() + T;
        while p.consumers() != 0 {
            assert!(Instant::now() < deadline, "consumer of round {round} never left");
            thread::sleep(Duration::from_millis(1));
        }
    }
    assert_eq!(p.consumers_lost(), 0);
}

#[test]
fn the_producer_stays_send_and_sync_and_the_consumer_send() {
    fn send<T: Send>() {}
    fn sync<T: Sync>() {}
    send::<Producer<Host>>();
    sync::<Producer<Host>>();
    send::<Consumer<Host>>();
}

#[test]
fn a_consumer_slow_to_import_still_attaches_within_the_default_deadline() {
    // A Python consumer may take seconds to start CUDA between the offer and its `Attached`.
    let mut p = producer("slow-import", SyncStrategy::CpuSpin, 2);
    let path = sock("slow-import");
    let slow = thread::spawn(move || {
        let conn = PeerConnection::connect(&path, T).unwrap();
        let hello = ClientHello {
            object: Default::default(),
            part: 0,
            protocol_version: PROTOCOL_VERSION,
            client_pid: std::process::id(),
            wanted_backend: None,
            consumer_name: "slow".into(),
        };
        conn.send(&Message::ClientHello(hello), Vec::new(), T).unwrap();
        let (offer, _fds) = conn.recv(T).unwrap().into_ring_offer().unwrap();
        thread::sleep(Duration::from_secs(3));
        conn.send(&Message::Attached(Attached { consumer_id: offer.consumer_id }), Vec::new(), T).unwrap();
        conn
    });
    p.wait_for_consumers(1, T).unwrap();
    let conn = slow.join().unwrap();
    assert!(!conn.is_peer_gone().unwrap(), "the producer hung up on a consumer that attached in time");
    assert_eq!(p.consumers(), 1);
}

/// CPU strategies hand out only frames the host saw published: no stamp for a kernel to check, no descriptor for a
/// kernel on the ring, and a finish with nothing launched leaves the next sequence as it is.
#[test]
fn cpu_strategies_give_no_stamp_and_no_ring_descriptor() {
    let mut p = producer("stampless", SyncStrategy::CpuSpin, 2);
    let path = sock("stampless");
    let consumer = thread::spawn(move || {
        let mut c = Consumer::<Host>::attach(&HostContext, &path, &AttachOptions::default()).unwrap();
        let frame = c.next_frame(None, T).unwrap();
        assert_eq!(frame.stamp(), None);
        assert!(c.stamp_span(&frame).unwrap().is_none());
        assert_eq!(c.ring_descriptor(), None);
        c.release(frame, None).unwrap();
        assert_eq!(c.finish_ring_kernel(Duration::ZERO).unwrap(), 1);
        c.detach();
    });
    p.wait_for_consumers(1, T).unwrap();
    produce(&mut p, 1);
    p.drain(None, T).unwrap();
    consumer.join().unwrap();
}

/// A producer holding several slots at once (`acquire_after`), writing them out of order and publishing in order:
/// every frame intact, with every strategy whose waits are on the CPU; and the slot of a frame a consumer still
/// holds is waited for as by `acquire`.
#[test]
fn several_slots_held_at_once_are_written_in_any_order_and_read_intact() {
    for (name, sync) in [
        ("ahead-spin", SyncStrategy::CpuSpin),
        ("ahead-sleep", SyncStrategy::CpuSleep),
        ("ahead-event", SyncStrategy::IpcEvent),
    ] {
        let mut p = producer(name, sync, 4);
        let a = spawn_consumer(name, 900);
        let b = spawn_consumer(name, 900);
        p.wait_for_consumers(2, T).unwrap();
        for _ in 0..300 {
            let first = p.acquire(None, T).unwrap();
            let second = p.acquire_after(&first, None, T).unwrap();
            let third = p.acquire_after(&second, None, T).unwrap();
            assert_eq!((second.seq().0, third.seq().0), (first.seq().0 + 1, first.seq().0 + 2), "{name}");
            assert_ne!(first.slot(), second.slot(), "{name}");
            for lease in [&third, &first, &second] {
                p.region().write(lease.ptr(), &frame_bytes(lease.seq().0, lease.bytes() as usize)).unwrap();
            }
            for lease in [first, second, third] {
                p.publish(lease, None).unwrap();
            }
        }
        p.drain(None, T).unwrap();
        for c in [a, b] {
            assert_eq!(c.join().unwrap().unwrap(), (0, 900, 0), "{name}");
        }
    }
}

#[test]
fn a_slot_held_ahead_waits_for_the_consumer_that_holds_its_last_frame() {
    let name = "ahead-wait";
    let mut p = producer(name, SyncStrategy::CpuSpin, 2);
    let path = sock(name);
    let reader = thread::spawn(move || {
        let mut c = Consumer::<Host>::attach(&HostContext, &path, &AttachOptions::default()).unwrap();
        let held = c.next_frame(None, T).unwrap(); // frame 0, held
        thread::sleep(Duration::from_millis(400));
        c.release(held, None).unwrap();
        c
    });
    p.wait_for_consumers(1, T).unwrap();
    let lease = p.acquire(None, T).unwrap();
    p.publish(lease, None).unwrap();
    let one = p.acquire(None, T).unwrap(); // slot 1: free
    let short = p.acquire_after(&one, None, Duration::from_millis(50)).unwrap_err();
    assert!(matches!(short, FrameError::Timeout { .. }), "frame 2 takes slot 0, still held: {short}");
    let two = p.acquire_after(&one, None, T).unwrap();
    assert_eq!((two.seq().0, two.slot().0), (2, 0));
    p.publish(one, None).unwrap();
    p.publish(two, None).unwrap();
    drop(reader.join().unwrap());
}
