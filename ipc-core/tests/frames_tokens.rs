//! Leases and frames are move-only tokens, checked before anything is queued; and a producer that closes its ring
//! ends the stream cleanly (`EndOfStream` with the number of frames), with every CPU strategy. Host fake backend,
//! consumers on threads.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::frame_bytes;

use std::path::PathBuf;
use std::thread;
use std::time::Duration;

use ipc_core::frames::{AttachOptions, Consumer, FrameError, Producer};
use ipc_core::host::{Host, HostContext};
use ipc_core::ring::Sequence;
use ipc_core::wire::{SyncStrategy, WireError};

const T: Duration = Duration::from_secs(10);

fn sock(name: &str) -> PathBuf {
    common::sock("tokens", name)
}

fn producer(name: &str, sync: SyncStrategy) -> Producer<Host> {
    common::producer(sock(name), sync, 2)
}

#[test]
fn a_second_lease_for_the_same_frame_is_refused_and_publishes_nothing() {
    let mut p = producer("twice", SyncStrategy::CpuSpin);
    let first = p.acquire(None, T).unwrap();
    let second = p.acquire(None, T).unwrap();
    assert_eq!(first.seq(), second.seq(), "both leases are for frame 0");
    p.publish(first, None).unwrap();
    assert_eq!(p.next_sequence(), 1);
    let err = p.publish(second, None).unwrap_err();
    assert!(matches!(err, FrameError::ForeignToken { token: "slot lease", .. }), "{err}");
    assert!(err.to_string().contains("frame 0 was published already"), "{err}");
    assert_eq!(p.next_sequence(), 1, "the refused lease published nothing");
}

#[test]
fn a_lease_of_another_producer_is_refused_before_anything_is_published() {
    let mut a = producer("lease-a", SyncStrategy::CpuSpin);
    let mut b = producer("lease-b", SyncStrategy::CpuSpin);
    let of_a = a.acquire(None, T).unwrap();
    let err = b.publish(of_a, None).unwrap_err();
    assert!(matches!(err, FrameError::ForeignToken { .. }), "{err}");
    assert!(err.to_string().contains("another producer's"), "{err}");
    assert_eq!(b.next_sequence(), 0, "nothing was published on the ring the lease is not of");
    assert_eq!(a.next_sequence(), 0);
    // Both rings go on as if nothing happened.
    let lease = b.acquire(None, T).unwrap();
    assert_eq!(lease.seq(), Sequence(0));
    b.publish(lease, None).unwrap();
}

#[test]
fn a_frame_of_another_consumer_is_refused() {
    let mut p = producer("frame-other", SyncStrategy::CpuSpin);
    let path = sock("frame-other");
    let attach = || {
        let path = path.clone();
        thread::spawn(move || Consumer::<Host>::attach(&HostContext, &path, &AttachOptions::default()).unwrap())
    };
    let (t1, t2) = (attach(), attach());
    p.wait_for_consumers(2, T).unwrap();
    let (mut c1, mut c2) = (t1.join().unwrap(), t2.join().unwrap());
    let lease = p.acquire(None, T).unwrap();
    p.publish(lease, None).unwrap();
    let f1 = c1.next_frame(None, T).unwrap();
    let f2 = c2.next_frame(None, T).unwrap();
    let err = c2.release(f1, None).unwrap_err();
    assert!(matches!(err, FrameError::ForeignToken { token: "frame", .. }), "{err}");
    c2.release(f2, None).unwrap();
}

/// A consumer that reads "until the producer goes" ends cleanly after a producer that closes its ring, knowing how
/// many frames there were, with every CPU strategy.
#[test]
fn reading_until_the_producer_goes_ends_with_end_of_stream_and_every_frame() {
    for sync in [SyncStrategy::CpuSpin, SyncStrategy::CpuSleep] {
        let name = format!("eos-{sync}");
        let mut p = producer(&name, sync);
        let path = sock(&name);
        let reader = thread::spawn(move || {
            let mut c = Consumer::<Host>::attach(&HostContext, &path, &AttachOptions::default()).unwrap();
            let (mut read, mut bad) = (0u64, 0u64);
            let end = loop {
                let frame = match c.next_frame(None, T) {
                    Ok(frame) => frame,
                    Err(e) => break e,
                };
                let mut got = vec![0u8; frame.bytes() as usize];
                c.region().read(frame.ptr(), &mut got).unwrap();
                bad += u64::from(got != frame_bytes(frame.seq().0, got.len()));
                c.release(frame, None).unwrap();
                read += 1;
            };
            (read, bad, end)
        });
        p.wait_for_consumers(1, T).unwrap();
        for _ in 0..200 {
            let lease = p.acquire(None, T).unwrap();
            p.region().write(lease.ptr(), &frame_bytes(lease.seq().0, lease.bytes() as usize)).unwrap();
            p.publish(lease, None).unwrap();
        }
        drop(p);
        let (read, bad, end) = reader.join().unwrap();
        assert!(matches!(end, FrameError::EndOfStream { published: 200, past_end: None }), "{sync}: {end}");
        assert_eq!(end.to_string(), "end of stream: the producer closed the ring after 200 frames");
        assert_eq!((read, bad), (200, 0), "{sync}");
    }
}

#[test]
fn a_consumer_may_wait_for_its_producer_to_appear() {
    let path = sock("late-producer");
    let _ = std::fs::remove_file(&path);
    // By default it does not wait: "start the producer first", at once.
    let err = Consumer::<Host>::attach(&HostContext, &path, &AttachOptions::default()).err().unwrap();
    assert!(matches!(err, FrameError::Wire(WireError::NoProducer { .. })), "{err}");
    let waiting = {
        let path = path.clone();
        thread::spawn(move || {
            let options = AttachOptions { wait_for_producer: Duration::from_secs(10), ..AttachOptions::default() };
            // Returned, not dropped: it stays attached until the producer has counted it.
            Consumer::<Host>::attach(&HostContext, &path, &options)
        })
    };
    thread::sleep(Duration::from_millis(300));
    let mut p = producer("late-producer", SyncStrategy::CpuSpin);
    p.wait_for_consumers(1, T).unwrap();
    assert_eq!(waiting.join().unwrap().unwrap().next_sequence(), 0);
}

#[test]
fn frames_held_ahead_are_published_in_order_and_never_take_a_slot_still_held() {
    let mut p = producer("ahead", SyncStrategy::CpuSpin);
    let first = p.acquire(None, T).unwrap();
    let second = p.acquire_after(&first, None, T).unwrap();
    assert_eq!(second.seq(), Sequence(1));
    // Two slots, both held: frame 2 would take frame 0's.
    let err = p.acquire_after(&second, None, T).unwrap_err();
    assert!(matches!(err, FrameError::Config(_)), "{err}");
    assert!(err.to_string().contains("holds unpublished"), "{err}");
    // Out of order: refused, nothing published.
    let err = p.publish(second, None).unwrap_err();
    assert!(matches!(err, FrameError::ForeignToken { token: "slot lease", .. }), "{err}");
    assert!(err.to_string().contains("publish the frames in order"), "{err}");
    assert_eq!(p.next_sequence(), 0);
    // The refused lease is gone (publish took it): frame 1 is acquired again after frame 0, and both go out.
    let again = p.acquire_after(&first, None, T).unwrap();
    assert_eq!(again.seq(), Sequence(1));
    p.publish(first, None).unwrap();
    p.publish(again, None).unwrap();
    assert_eq!(p.next_sequence(), 2);
    // Another producer's lease is refused.
    let mut other = producer("ahead-other", SyncStrategy::CpuSpin);
    let theirs = other.acquire(None, T).unwrap();
    let err = p.acquire_after(&theirs, None, T).unwrap_err();
    assert!(err.to_string().contains("another producer's"), "{err}");
    other.publish(theirs, None).unwrap();
}
