//! Record lifetimes and back-pressure of the frame API on the fake backend (issue 9): eviction of a stuck
//! consumer, by policy and by hand; frames published before a close are still delivered; a killed consumer's
//! record is reused only once nothing can write it.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::publish;

use std::path::PathBuf;
use std::thread;
use std::time::{Duration, Instant};

use ipc_core::frames::{AttachOptions, Consumer, FrameError, Producer, ProducerConfig, SlowConsumerPolicy};
use ipc_core::host::{Host, HostContext};
use ipc_core::wire::{
    Attached, ClientHello, FrameGeometry, Message, PROTOCOL_VERSION, PeerConnection, PixelFormat, RefusalCode,
    SyncStrategy, WireError,
};

const T: Duration = Duration::from_secs(10);

fn sock(name: &str) -> PathBuf {
    common::sock("life", name)
}

fn config(name: &str, slots: u32) -> ProducerConfig {
    let geometry = FrameGeometry::new(64, 16, PixelFormat::Rgba8).unwrap();
    ProducerConfig::new(sock(name), geometry, slots, SyncStrategy::CpuSpin)
}

/// A consumer thread that reads `frames` frames, releasing each, then detaches.
fn reader(name: &str, frames: u64) -> thread::JoinHandle<Result<u64, FrameError>> {
    let path = sock(name);
    thread::spawn(move || {
        let mut c = Consumer::<Host>::attach(&HostContext, &path, &AttachOptions::default())?;
        for _ in 0..frames {
            let frame = c.next_frame(None, T)?;
            c.release(frame, None)?;
        }
        c.detach();
        Ok(frames)
    })
}

/// A consumer thread that takes one frame and never releases it, then reports what its next call returns once
/// told to go on.
fn stuck(name: &str, go_on: std::sync::mpsc::Receiver<()>) -> thread::JoinHandle<Result<(), FrameError>> {
    let path = sock(name);
    thread::spawn(move || {
        // A record freed moments ago may not be reclaimed yet: a refusal (ring full) is retried for a while.
        let deadline = Instant::now() + T;
        let mut c = loop {
            match Consumer::<Host>::attach(&HostContext, &path, &AttachOptions::default()) {
                Err(FrameError::Wire(WireError::Refused { code: RefusalCode::RingFull, .. }))
                    if Instant::now() < deadline =>
                {
                    thread::sleep(Duration::from_millis(2));
                }
                other => break other?,
            }
        };
        let _held = c.next_frame(None, T)?;
        go_on.recv().unwrap();
        let frame = c.next_frame(None, Duration::from_millis(200))?;
        c.release(frame, None)
    })
}

#[test]
fn the_evict_policy_frees_the_ring_from_a_stuck_consumer_and_tells_it() {
    let mut cfg = config("policy", 2);
    // Long enough that a healthy consumer thread on a loaded CI machine is never taken for a stuck one.
    cfg.slow_consumer = SlowConsumerPolicy::Evict { after: Duration::from_millis(750) };
    let mut p = Producer::<Host>::create(&HostContext, cfg).unwrap();
    let (go_on, wait) = std::sync::mpsc::channel();
    let stuck = stuck("policy", wait);
    let healthy = reader("policy", 200);
    p.wait_for_consumers(2, T).unwrap();
    let start = Instant::now();
    for _ in 0..200 {
        publish(&mut p, Duration::from_secs(5)).unwrap();
    }
    p.drain(None, T).unwrap();
    assert!(start.elapsed() < Duration::from_secs(10), "took {:?}", start.elapsed());
    assert_eq!(healthy.join().unwrap().unwrap(), 200);
    assert_eq!(p.consumers_evicted(), 1);
    assert_eq!(p.consumers_lost(), 0, "an evicted consumer is not counted as lost");
    go_on.send(()).unwrap();
    match stuck.join().unwrap() {
        Err(FrameError::Evicted { .. }) => {}
        other => panic!("the stuck consumer should learn it was evicted, got {other:?}"),
    }
}

#[test]
fn block_waits_for_a_stuck_consumer_until_the_application_evicts_it() {
    let mut p = Producer::<Host>::create(&HostContext, config("block", 1)).unwrap();
    let (go_on, wait) = std::sync::mpsc::channel();
    let stuck = stuck("block", wait);
    p.wait_for_consumers(1, T).unwrap();
    publish(&mut p, T).unwrap();
    // It holds frame 0 in the only slot: the next acquire times out...
    thread::sleep(Duration::from_millis(50));
    match publish(&mut p, Duration::from_millis(100)) {
        Err(FrameError::Timeout { .. }) => {}
        other => panic!("expected a timeout while the consumer holds the slot, got {other:?}"),
    }
    // ...until the application evicts it.
    let ids = p.consumer_ids();
    assert_eq!(ids.len(), 1);
    assert!(p.evict(ids[0]).unwrap());
    assert!(!p.evict(ids[0]).unwrap(), "evicting twice does nothing");
    assert_eq!(publish(&mut p, Duration::from_millis(500)).unwrap(), 1);
    go_on.send(()).unwrap();
    assert!(matches!(stuck.join().unwrap(), Err(FrameError::Evicted { .. })));
}

#[test]
fn frames_published_before_the_producer_closed_are_all_delivered() {
    let mut p = Producer::<Host>::create(&HostContext, config("close", 16)).unwrap();
    let path = sock("close");
    let consumer = thread::spawn(move || {
        let c = Consumer::<Host>::attach(&HostContext, &path, &AttachOptions::default()).unwrap();
        let (tx, rx) = std::sync::mpsc::channel::<()>();
        (
            c.next_sequence(),
            tx,
            rx,
            {
                // Wait until told that the producer is gone, then read everything.
                move |c: &mut Consumer<Host>| {
                    let mut got = Vec::new();
                    loop {
                        match c.next_frame(None, Duration::from_secs(1)) {
                            Ok(frame) => {
                                let mut word = [0u8; 8];
                                c.region().read(frame.ptr(), &mut word).unwrap();
                                assert_eq!(u64::from_le_bytes(word), frame.seq().0, "frame {} intact", frame.seq().0);
                                got.push(frame.seq().0);
                                c.release(frame, None).unwrap();
                            }
                            Err(FrameError::EndOfStream { .. }) => return got,
                            Err(e) => panic!("{e}"),
                        }
                    }
                }
            },
            c,
        )
    });
    p.wait_for_consumers(1, T).unwrap();
    let (first, _tx, _rx, read_all, mut c) = consumer.join().unwrap();
    assert_eq!(first, 0);
    for _ in 0..10 {
        publish(&mut p, T).unwrap();
    }
    drop(p);
    assert_eq!(read_all(&mut c), (0..10).collect::<Vec<_>>());
}

#[test]
fn a_killed_consumers_record_is_quarantined_while_the_watchdog_may_write_it() {
    // CPU strategies: a dead consumer's process writes nothing after it dies, so its record is free again as soon
    // as the watchdog has acted on the hang-up; the next consumer gets clean counters.
    let mut cfg = config("quarantine", 1);
    cfg.max_consumers = 1;
    let mut p = Producer::<Host>::create(&HostContext, cfg).unwrap();
    for round in 0..20 {
        // A consumer that completes the handshake and vanishes without detaching. (The previous round's record
        // comes back within a few watchdog periods of its owner's hang-up: retry while the ring is full.)
        let deadline = Instant::now() + T;
        let (conn, offer) = loop {
            let conn = PeerConnection::connect(sock("quarantine"), T).unwrap();
            let hello = ClientHello {
                object: Default::default(),
                part: 0,
                protocol_version: PROTOCOL_VERSION,
                client_pid: std::process::id(),
                wanted_backend: None,
                consumer_name: format!("ghost {round}"),
            };
            conn.send(&Message::ClientHello(hello), Vec::new(), T).unwrap();
            let received = loop {
                p.admit_pending().unwrap();
                if let Ok(received) = conn.recv(Duration::from_millis(5)) {
                    break received;
                }
                assert!(Instant::now() < deadline, "no answer");
            };
            match received.into_ring_offer() {
                Ok((offer, _fds)) => break (conn, offer),
                Err(e) => {
                    assert!(Instant::now() < deadline, "round {round}: never admitted: {e}");
                    thread::sleep(Duration::from_millis(2));
                }
            }
        };
        conn.send(&Message::Attached(Attached { consumer_id: offer.consumer_id }), Vec::new(), T).unwrap();
        p.wait_for_consumers(1, T).unwrap();
        drop(conn);
        // Its record comes back for the next consumer, which then holds the producer back as it should.
        let start = Instant::now();
        while p.consumers() != 0 {
            assert!(start.elapsed() < T, "hang-up not noticed");
            thread::sleep(Duration::from_millis(1));
        }
        let (go_on, wait) = std::sync::mpsc::channel();
        let holder = stuck("quarantine", wait);
        p.wait_for_consumers(1, T).unwrap();
        publish(&mut p, T).unwrap();
        thread::sleep(Duration::from_millis(5));
        assert!(
            matches!(publish(&mut p, Duration::from_millis(30)), Err(FrameError::Timeout { .. })),
            "round {round}: the new consumer's counters were poisoned: the producer overwrote the frame it holds"
        );
        let ids = p.consumer_ids();
        p.evict(ids[0]).unwrap();
        go_on.send(()).unwrap();
        let _ = holder.join().unwrap();
        publish(&mut p, T).unwrap();
    }
}

#[test]
fn consumers_attach_and_detach_while_the_producer_publishes_flat_out() {
    // The producer publishes as fast as it can with nobody attached (one slot), and one consumer attaches, reads
    // four frames and detaches, again and again: every attach gets its offer at once. Before the producer took
    // the records itself, a record taken on the admission thread counted in back-pressure from the next frame on
    // while its offer waited for the producer's next `acquire`, which waited for that record's release: the attach
    // timed out (the `gpu-ipc stress` cycles failure on the H100). Cycling faster than records are freed must not
    // be refused as "ring full" either (16 records, 2,000 cycles).
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let (ready_tx, ready) = std::sync::mpsc::channel();
    let producer = {
        let stop = stop.clone();
        thread::spawn(move || {
            let mut p = Producer::<Host>::create(&HostContext, config("flat-out", 1)).unwrap();
            ready_tx.send(()).unwrap();
            let mut published = 0u64;
            while !stop.load(std::sync::atomic::Ordering::Acquire) {
                publish(&mut p, T).unwrap();
                published += 1;
            }
            published
        })
    };
    ready.recv().unwrap();
    let path = sock("flat-out");
    let options = AttachOptions { timeout: Duration::from_secs(2), ..AttachOptions::default() };
    let mut slowest = Duration::ZERO;
    for cycle in 0..2000 {
        let started = Instant::now();
        let mut c =
            Consumer::<Host>::attach(&HostContext, &path, &options).unwrap_or_else(|e| panic!("attach {cycle}: {e}"));
        slowest = slowest.max(started.elapsed());
        for _ in 0..4 {
            let frame = c.next_frame(None, T).unwrap();
            let mut word = [0u8; 8];
            c.region().read(frame.ptr(), &mut word).unwrap();
            assert_eq!(u64::from_le_bytes(word), frame.seq().0, "cycle {cycle}: frame {} intact", frame.seq().0);
            c.release(frame, None).unwrap();
        }
        c.detach();
    }
    stop.store(true, std::sync::atomic::Ordering::Release);
    let published = producer.join().unwrap();
    assert!(published >= 8000, "the producer published {published} frames");
    assert!(slowest < Duration::from_secs(1), "the slowest attach took {slowest:?}");
}

#[test]
fn a_consumer_attaches_while_the_producer_waits_for_a_slow_one() {
    // One slot, the default policy (wait for slow consumers): consumer A holds frame 0 for 3 s, so the producer's
    // `acquire` of frame 1 waits that long. Consumer B, allowed 1 s to attach, must get in meanwhile (the producer
    // serves the front door while it waits) and read from frame 1 on, once A lets go.
    let mut p = Producer::<Host>::create(&HostContext, config("slow-a", 1)).unwrap();
    let path = sock("slow-a");
    let (held_tx, held) = std::sync::mpsc::channel();
    let a = {
        let path = path.clone();
        thread::spawn(move || -> Result<(), FrameError> {
            let mut c = Consumer::<Host>::attach(&HostContext, &path, &AttachOptions::default())?;
            let frame = c.next_frame(None, T)?;
            held_tx.send(frame.seq().0).unwrap();
            thread::sleep(Duration::from_secs(3));
            c.release(frame, None)?;
            let frame = c.next_frame(None, T)?;
            c.release(frame, None)?;
            c.detach();
            Ok(())
        })
    };
    p.wait_for_consumers(1, T).unwrap();
    assert_eq!(publish(&mut p, T).unwrap(), 0);
    assert_eq!(held.recv_timeout(T).unwrap(), 0);
    let b = thread::spawn(move || -> Result<(Duration, u64), FrameError> {
        let started = Instant::now();
        let options = AttachOptions { timeout: Duration::from_secs(1), ..AttachOptions::default() };
        let mut c = Consumer::<Host>::attach(&HostContext, &path, &options)?;
        let attached_after = started.elapsed();
        let frame = c.next_frame(None, T)?;
        let seq = frame.seq().0;
        c.release(frame, None)?;
        c.detach();
        Ok((attached_after, seq))
    });
    // Blocks about 3 s on A; B attaches meanwhile.
    assert_eq!(publish(&mut p, T).unwrap(), 1);
    let (attached_after, first) = b.join().unwrap().unwrap();
    a.join().unwrap().unwrap();
    assert!(attached_after < Duration::from_secs(1), "B attached after {attached_after:?}");
    assert_eq!(first, 1, "B joins at the frame the producer was waiting to write");
}

#[test]
fn a_client_evicted_before_it_attached_counts_as_evicted_not_lost() {
    // A raw client takes the offer and holds up the one-slot ring without attaching; the eviction policy evicts it.
    // When it then says `Attached` and leaves, the producer counts one eviction and no loss.
    let mut cfg = config("evicted-early", 1);
    cfg.slow_consumer = SlowConsumerPolicy::Evict { after: Duration::from_millis(100) };
    let mut p = Producer::<Host>::create(&HostContext, cfg).unwrap();
    let conn = PeerConnection::connect(sock("evicted-early"), T).unwrap();
    let hello = ClientHello {
        object: Default::default(),
        part: 0,
        protocol_version: PROTOCOL_VERSION,
        client_pid: std::process::id(),
        wanted_backend: Some(ipc_core::wire::BackendKind::Host),
        consumer_name: "late".into(),
    };
    conn.send(&Message::ClientHello(hello), Vec::new(), T).unwrap();
    // The producer makes the offer in a call after the hello arrived; the client's record then holds up frame 1.
    let deadline = Instant::now() + T;
    let received = loop {
        p.admit_pending().unwrap();
        match conn.recv(Duration::from_millis(5)) {
            Ok(received) => break received,
            Err(WireError::Timeout { .. }) if Instant::now() < deadline => {}
            Err(e) => panic!("no offer: {e}"),
        }
    };
    let (offer, _fds) = received.into_ring_offer().unwrap();
    publish(&mut p, T).unwrap();
    publish(&mut p, T).unwrap(); // waits 100 ms, evicts the client, goes on
    assert_eq!(p.consumers_evicted(), 1);
    conn.send(&Message::Attached(Attached { consumer_id: offer.consumer_id }), Vec::new(), T).unwrap();
    // The producer takes the `Attached` (a dead record's consumer is not counted in), then the hang-up.
    let publish_for = |p: &mut Producer<Host>, how_long: Duration| {
        let until = Instant::now() + how_long;
        while Instant::now() < until {
            publish(p, T).unwrap();
            thread::sleep(Duration::from_millis(1));
        }
    };
    publish_for(&mut p, Duration::from_millis(200));
    drop(conn);
    publish_for(&mut p, Duration::from_millis(200));
    assert_eq!((p.consumers(), p.consumers_evicted(), p.consumers_lost()), (0, 1, 0));
}

#[test]
fn handshake_deadlines_as_short_as_an_attach_never_poison_the_ring() {
    // The real producer with handshake deadlines of 0.1-2 ms, about as long as an attach takes, and four threads
    // attaching, holding for 3 ms and leaving in a loop: many handshakes are dropped at every stage. The producer
    // must never find its publish counters poisoned (a consumer whose handshake was dropped after its `Attached`
    // took the hang-up for the producer's death: 55 of 60 such rounds before the fix, second review 2026-11-24).
    for round in 0..30u64 {
        let name = format!("deadline-race-{round}");
        let mut cfg = config(&name, 2);
        cfg.handshake_timeout = Duration::from_micros(100 + (round * 61) % 1900);
        let mut p = Producer::<Host>::create(&HostContext, cfg).unwrap();
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let joiners: Vec<_> = (0..4)
            .map(|_| {
                let (path, stop) = (sock(&name), stop.clone());
                thread::spawn(move || {
                    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                        if let Ok(c) = Consumer::<Host>::attach(&HostContext, &path, &AttachOptions::default()) {
                            thread::sleep(Duration::from_millis(3));
                            drop(c);
                        }
                    }
                })
            })
            .collect();
        let until = Instant::now() + Duration::from_millis(100);
        while Instant::now() < until {
            match publish(&mut p, T) {
                Ok(_) | Err(FrameError::Timeout { .. }) => {}
                Err(e) => panic!("round {round}: the producer stopped: {e}"),
            }
        }
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        for joiner in joiners {
            joiner.join().unwrap();
        }
    }
}

#[test]
fn a_handshake_the_producer_drops_before_its_offer_tells_the_consumer_to_attach_again() {
    let mut cfg = config("drop-before-offer", 2);
    cfg.handshake_timeout = Duration::from_millis(50);
    // This producer's thread never serves its front door, so it never makes the offer: its admission thread drops
    // the handshake at the deadline.
    let producer = Producer::<Host>::create(&HostContext, cfg).unwrap();
    let started = Instant::now();
    let error = Consumer::<Host>::attach(&HostContext, &sock("drop-before-offer"), &AttachOptions::default())
        .err()
        .expect("no offer, no consumer");
    assert!(
        matches!(&error, FrameError::Config(message) if message.contains("dropped this handshake") && message.contains("attach again")),
        "{error}"
    );
    assert!(started.elapsed() < Duration::from_secs(2), "at the producer's deadline: {:?}", started.elapsed());
    drop(producer);
}
