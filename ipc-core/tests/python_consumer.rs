//! The protocol is implementable from its documentation alone: `tests/python/consumer.py`, a consumer in pure
//! Python written only from `docs/protocol.md` and `docs/ring.md`, attaches to a real `Producer<Host>` of this
//! process as a separate process, reads frames with cpu-spin and cpu-sleep, checks every 8-byte word, and leaves
//! cleanly (the producer counts nobody lost); it exits 4 when the producer goes away while it waits, 2 when offered
//! a strategy it does not implement (telling the producer with `Detach`, reason import failed), and 3 when refused.
//! Two Python consumers read every frame published before a clean close, although the faster one poisons the
//! publish counters when it finds the ring closed; one that stops releasing is evicted and exits 5 while another
//! reads on.
//!
//! `cuda_consumer.py`, its GPU sibling, is checked here only as far as no GPU is needed: its frame check pattern
//! against docs/kernels.md, and its one-line exit without CUDA or a producer.
//!
//! These tests need python3 (3.8 or later; `PYTHON` names another interpreter). Without one they fail, saying so:
//! CI has python3, and a skipped conformance test would pass silently. Every wait is bounded; a Python process
//! still running at its deadline is killed.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::python::{Finished, PyScript};
use common::{geometry, publish};

use std::fs::File;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::thread;
use std::time::{Duration, Instant};

use gpu_ipc_driver::DeviceUuid;
use ipc_core::frames::{AttachOptions, Consumer, FrameError, Producer, ProducerConfig, SlowConsumerPolicy};
use ipc_core::host::{Host, HostContext};
use ipc_core::ring::RingLayout;
use ipc_core::ring::layout::ConsumerState;
use ipc_core::ring::{ConsumerId, LivenessPolicy, ProducerControl, RingConfig, Sequence};
use ipc_core::wire::{
    BackendKind, Detach, DetachReason, HandleType, Message, OfferFds, RefusalCode, Refused, RendezvousListener,
    RingOffer, SyncStrategy, WireError,
};
use rustix::fs::{MemfdFlags, SealFlags, memfd_create};

const T: Duration = Duration::from_secs(10);
const SCRIPT: &str = "consumer.py";

fn sock(name: &str) -> PathBuf {
    common::sock("py", name)
}

fn producer(name: &str, sync: SyncStrategy, slots: u32) -> Producer<Host> {
    common::producer(sock(name), sync, slots)
}

/// The Python consumer's interpreter: 3.8 or later.
fn python() -> String {
    common::python::python(8)
}

/// A Python consumer that reads `frames` frames (0: until the producer is gone) and leaves.
fn py_consumer(python: &str, socket: &Path, frames: u64, name: &str) -> PyScript {
    py_consumer_with(python, socket, name, &["--frames", &frames.to_string()])
}

/// A Python consumer with the script's `options` (`--frames`, `--read-delay`, `--stall-after`).
fn py_consumer_with(python: &str, socket: &Path, name: &str, options: &[&str]) -> PyScript {
    let args = [&["--name", name, "--timeout", "10"][..], options].concat();
    PyScript::spawn(python, SCRIPT, &format!("python consumer {name}"), socket, &args)
}

/// `wait_for_consumers`, reporting the Python consumers' output when they do not attach in time.
fn wait_for(p: &mut Producer<Host>, consumers: &mut [&mut PyScript]) {
    if let Err(err) = p.wait_for_consumers(consumers.len(), T) {
        let outputs: Vec<String> = consumers.iter_mut().map(|c| c.wait(Duration::ZERO).describe()).collect();
        panic!("python consumers did not attach: {err}\n{}", outputs.join("\n"));
    }
}

/// Publishes frames until every consumer has left (bounded), so each can read as many as it wants.
fn publish_until_all_left(p: &mut Producer<Host>, limit: Duration) -> u64 {
    let deadline = Instant::now() + limit;
    let mut published = 0;
    while p.consumers() > 0 {
        assert!(Instant::now() < deadline, "consumers still attached after {limit:?} ({published} frames)");
        publish(p, T).unwrap();
        published += 1;
    }
    published
}

/// A successful run: exit 0 and a summary of `frames` frames from frame 0 with no mismatched word.
fn assert_read_everything(run: &Finished, frames: u64) {
    assert_eq!(run.code, Some(0), "{}", run.describe());
    assert_eq!(run.summary("frames"), frames, "{}", run.describe());
    assert_eq!(run.summary("first_seq"), 0, "{}", run.describe());
    assert_eq!(run.summary("mismatched_words"), 0, "{}", run.describe());
}

/// The producer's view once the consumers have left: nobody attached, nobody lost.
fn assert_left_cleanly(p: &mut Producer<Host>) {
    let deadline = Instant::now() + T;
    while p.consumers() != 0 {
        assert!(Instant::now() < deadline, "{} consumers still counted after they left", p.consumers());
        thread::sleep(Duration::from_millis(1));
    }
    assert_eq!(p.consumers_lost(), 0, "a Python consumer left without the ring-level detach");
}

#[test]
fn two_python_consumers_read_300_frames_each_with_cpu_spin_and_detach() {
    let python = python();
    let mut p = producer("spin", SyncStrategy::CpuSpin, 2);
    let mut a = py_consumer(&python, &sock("spin"), 300, "a");
    let mut b = py_consumer(&python, &sock("spin"), 300, "b");
    wait_for(&mut p, &mut [&mut a, &mut b]);
    let published = publish_until_all_left(&mut p, Duration::from_secs(60));
    let (ra, rb) = (a.wait(T), b.wait(T));
    assert_read_everything(&ra, 300);
    assert_read_everything(&rb, 300);
    assert_ne!(ra.summary("consumer_id"), rb.summary("consumer_id"), "two consumers got one record");
    assert_left_cleanly(&mut p);
    println!("cpu-spin: {published} frames published; consumers took {:?} and {:?}", ra.elapsed, rb.elapsed);
}

#[test]
fn a_python_consumer_reads_300_frames_with_cpu_sleep_from_one_slot() {
    let python = python();
    let mut p = producer("sleep", SyncStrategy::CpuSleep, 1);
    let mut c = py_consumer(&python, &sock("sleep"), 300, "sleeper");
    wait_for(&mut p, &mut [&mut c]);
    let published = publish_until_all_left(&mut p, Duration::from_secs(60));
    let run = c.wait(T);
    assert_read_everything(&run, 300);
    assert_left_cleanly(&mut p);
    println!("cpu-sleep: {published} frames published; the consumer took {:?}", run.elapsed);
}

#[test]
fn a_python_consumer_exits_4_when_the_producer_goes_away_while_it_waits() {
    let python = python();
    let mut p = producer("gone", SyncStrategy::CpuSpin, 2);
    let mut c = py_consumer(&python, &sock("gone"), 1000, "waiter");
    wait_for(&mut p, &mut [&mut c]);
    for _ in 0..3 {
        publish(&mut p, T).unwrap(); // the third waits for the release of frame 0: the consumer is reading
    }
    thread::sleep(Duration::from_millis(200)); // it reads frames 1 and 2, then waits for frame 3
    let dropped = Instant::now();
    drop(p);
    let run = c.wait(Duration::from_secs(5));
    assert_eq!(run.code, Some(4), "{}", run.describe());
    assert!(run.stderr.contains("producer"), "{}", run.describe());
    // Frames 0 to 2 were published before the close, so it read them all (its summary says so), then found the
    // producer gone while it waited for frame 3.
    assert_eq!(run.summary("frames"), 3, "{}", run.describe());
    assert_eq!(run.summary("mismatched_words"), 0, "{}", run.describe());
    println!("producer gone: the consumer exited {:?} after the drop: {}", dropped.elapsed(), run.stderr.trim());
}

#[test]
fn two_python_consumers_read_every_frame_published_before_a_clean_close() {
    // A fast and a slow reader (50 ms per frame), both until the producer is gone; 16 slots, so the 10 frames never
    // wait for a release. The fast one reads them all, finds the ring CLOSED and poisons every publish counter, as
    // a consumer does when the producer is gone, while the slow one has most of its frames still to read: they
    // were published before the clean close, so the poison must not hide them (protocol.md, "When frame s is
    // readable").
    const FRAMES: u64 = 10;
    let python = python();
    let mut p = producer("close", SyncStrategy::CpuSpin, 16);
    let mut fast = py_consumer_with(&python, &sock("close"), "fast", &["--frames", "0"]);
    let mut slow = py_consumer_with(&python, &sock("close"), "slow", &["--frames", "0", "--read-delay", "0.05"]);
    wait_for(&mut p, &mut [&mut fast, &mut slow]);
    for _ in 0..FRAMES {
        publish(&mut p, Duration::from_millis(100)).unwrap(); // never waits: 16 slots
    }
    let dropped = Instant::now();
    drop(p);
    let rf = fast.wait(T);
    let fast_after = dropped.elapsed();
    let rs = slow.wait(T);
    let slow_after = dropped.elapsed();
    for run in [&rf, &rs] {
        // Exit 4 is the end of a run until the producer is gone; the summary says what it read.
        assert_eq!(run.code, Some(4), "{}", run.describe());
        assert_eq!(run.summary("frames"), FRAMES, "{}", run.describe());
        assert_eq!(run.summary("first_seq"), 0, "{}", run.describe());
        assert_eq!(run.summary("mismatched_words"), 0, "{}", run.describe());
        assert_eq!(run.summary("held"), 0, "{}", run.describe());
    }
    // What the test is for happened: the slow consumer read frames whose publish counter was already poisoned (by
    // the fast one: the producer poisons only release counters), and found the poison where it stopped.
    let past_poison = rs.summary("read_past_poison");
    assert!(past_poison >= 1, "the slow consumer never met the poison\n{}", rs.describe());
    assert!(rs.stderr.contains("poisoned"), "{}", rs.describe());
    println!(
        "clean close: both read {FRAMES} frames, the slow one {past_poison} of them past the poison; they exited \
         {fast_after:?} (fast) and {slow_after:?} (slow) after the drop"
    );
}

#[test]
fn a_python_consumer_that_stops_releasing_is_evicted_and_exits_5_while_another_reads_on() {
    // 4 slots: the stalled consumer releases frames 0 to 4, then reads and holds 5 to 8, and the producer's frame 9
    // needs slot 1, which it holds; 200 ms later the producer evicts it. It must notice (its record is no longer
    // LIVE) and exit 5 while the other consumer reads its 200 frames.
    const STALL_AFTER: u64 = 5;
    const SLOTS: u64 = 4;
    let python = python();
    let mut config = ProducerConfig::new(sock("evict"), geometry(), SLOTS as u32, SyncStrategy::CpuSpin);
    config.slow_consumer = SlowConsumerPolicy::Evict { after: Duration::from_millis(200) };
    let mut p = Producer::<Host>::create(&HostContext, config).unwrap();
    let stall = STALL_AFTER.to_string();
    let mut stalled = py_consumer_with(&python, &sock("evict"), "stalled", &["--frames", "0", "--stall-after", &stall]);
    let mut reader = py_consumer(&python, &sock("evict"), 200, "reader");
    wait_for(&mut p, &mut [&mut stalled, &mut reader]);
    // Publish until the reader has left and the stalled one has exited, noting when each thing happened.
    let deadline = Instant::now() + Duration::from_secs(30);
    let (mut evicted_at, mut exited_at, mut published) = (None, None, 0);
    while p.consumers() > 0 || exited_at.is_none() {
        assert!(Instant::now() < deadline, "still running after 30 s ({published} frames published)");
        if exited_at.is_none() && stalled.has_exited() {
            exited_at = Some(Instant::now());
        }
        if p.consumers() > 0 {
            publish(&mut p, T).unwrap();
            published += 1;
        } else {
            thread::sleep(Duration::from_millis(1));
        }
        if evicted_at.is_none() && p.consumers_evicted() > 0 {
            evicted_at = Some(Instant::now());
        }
    }
    let evicted_at = evicted_at.expect("the producer never evicted the stalled consumer");
    let exit_delay = exited_at.unwrap().saturating_duration_since(evicted_at);
    let (rs, rr) = (stalled.wait(T), reader.wait(T));
    assert_eq!(rs.code, Some(5), "{}", rs.describe());
    assert!(rs.stderr.contains("no longer LIVE"), "{}", rs.describe());
    assert!(exit_delay < Duration::from_secs(3), "exited {exit_delay:?} after its eviction\n{}", rs.describe());
    // It read and released the first frames, then held at most a ring's worth (frames read after the eviction do
    // not count: their slot may have been rewritten).
    let frames = rs.summary("frames");
    assert!((STALL_AFTER..=STALL_AFTER + SLOTS).contains(&frames), "{}", rs.describe());
    assert_eq!(rs.summary("held"), frames - STALL_AFTER, "{}", rs.describe());
    assert_eq!(rs.summary("mismatched_words"), 0, "{}", rs.describe());
    assert_read_everything(&rr, 200);
    assert_eq!(p.consumers_evicted(), 1, "only the stalled consumer is evicted (counted after it hung up too)");
    assert_left_cleanly(&mut p);
    println!(
        "eviction: {published} frames published; the stalled consumer read {frames} ({} held) and exited 5 {exit_delay:?} \
         after its eviction; the reader took {:?}",
        rs.summary("held"),
        rr.elapsed
    );
}

/// A sealed memfd of `size` zero bytes, as the protocol requires of both fds.
fn sealed_memfd(size: u64) -> OwnedFd {
    let fd = memfd_create("python-consumer-test", MemfdFlags::CLOEXEC | MemfdFlags::ALLOW_SEALING).unwrap();
    let file = File::from(fd);
    file.set_len(size).unwrap();
    let fd = OwnedFd::from(file);
    rustix::fs::fcntl_add_seals(&fd, SealFlags::SHRINK | SealFlags::GROW).unwrap();
    fd
}

/// A well-formed host-fake offer of a two-slot ring (8192 bytes of data) for a hand-made producer.
fn host_fake_offer(sync: SyncStrategy, generation: u64, consumer_id: u32) -> RingOffer {
    RingOffer {
        backend: BackendKind::Host,
        handle_type: HandleType::HostMemfd,
        sync,
        device_uuid: DeviceUuid([0; 16]),
        producer_pid: std::process::id(),
        generation,
        consumer_id,
        slot_layout: geometry().into(),
        slot_count: 2,
        slot_stride_bytes: 4096,
        data_offset: 0,
        allocation_bytes: 8192,
        granularity: 8192,
        control_bytes: RingLayout::V1.block_bytes() as u64,
        legacy_mem_handle: None,
        event_handles: Vec::new(),
    }
}

/// Accepts one connection on `listener` and reads its hello, which must want host-fake.
fn accept_hello(listener: &RendezvousListener, name: &str) -> ipc_core::wire::PeerConnection {
    let connection = listener.accept(T).unwrap();
    match connection.recv(T).unwrap().message {
        Message::ClientHello(hello) => {
            assert_eq!(hello.wanted_backend, Some(BackendKind::Host));
            assert_eq!(hello.consumer_name, name);
        }
        other => panic!("expected a ClientHello, got {other:?}"),
    }
    connection
}

#[test]
fn a_python_consumer_offered_a_gpu_strategy_says_import_failed_and_exits_2() {
    // `Producer<Host>` cannot run a GPU strategy (it refuses to be created), so the producer here is
    // hand-made from the wire layer: a well-formed host-fake offer naming gpu-stream-ops.
    let python = python();
    let path = sock("gpu-strategy");
    let listener = RendezvousListener::bind(&path).unwrap();
    let mut c = py_consumer(&python, &path, 10, "gpu");
    let connection = accept_hello(&listener, "gpu");
    let offer = host_fake_offer(SyncStrategy::GpuStreamOps, 1, 3);
    let fds = OfferFds { control: sealed_memfd(RingLayout::V1.block_bytes() as u64), data: Some(sealed_memfd(8192)) };
    connection.send(&Message::RingOffer(offer), fds.into_vec(), T).unwrap();
    let answer = connection.recv(T).unwrap().message;
    assert_eq!(answer, Message::Detach(Detach { consumer_id: 3, reason: DetachReason::ImportFailed }));
    let run = c.wait(T);
    assert_eq!(run.code, Some(2), "{}", run.describe());
    assert!(run.stderr.contains("gpu-stream-ops"), "{}", run.describe());
}

#[test]
fn a_refused_python_consumer_prints_the_code_and_message_and_exits_3() {
    let python = python();
    let path = sock("refused");
    let listener = RendezvousListener::bind(&path).unwrap();
    let mut c = py_consumer(&python, &path, 10, "late");
    let connection = accept_hello(&listener, "late");
    let message = "every consumer record is taken; try again when a consumer leaves";
    let refusal = Refused { code: RefusalCode::RingFull, message: message.into() };
    connection.send(&Message::Refused(refusal), Vec::new(), T).unwrap();
    drop(connection);
    let run = c.wait(T);
    assert_eq!(run.code, Some(3), "{}", run.describe());
    assert!(run.stderr.contains("code 3") && run.stderr.contains(message), "{}", run.describe());
}

/// A hand-made producer whose control block (a real ring, generation 7, one LIVE record) is not the ring its offer
/// describes (generation 8): the consumer at `path` must say import failed, and leave that block's record alone.
fn offer_another_generation(listener: &RendezvousListener, name: &str) {
    let config = RingConfig { slot_count: 2, max_consumers: 16, generation: 7 };
    let ring = ProducerControl::create(config, LivenessPolicy::default()).unwrap();
    let id = ring.register_consumer(None).unwrap();
    let connection = accept_hello(listener, name);
    let offer = host_fake_offer(SyncStrategy::CpuSpin, 8, id.index());
    let fds = OfferFds { control: ring.block().memory().try_clone_fd().unwrap(), data: Some(sealed_memfd(8192)) };
    connection.send(&Message::RingOffer(offer), fds.into_vec(), T).unwrap();
    let answer = connection.recv(T).unwrap().message;
    assert_eq!(answer, Message::Detach(Detach { consumer_id: id.index(), reason: DetachReason::ImportFailed }));
    // The consumer has hung up: whatever it did to the block is done.
    assert!(matches!(connection.recv(T), Err(WireError::PeerHungUp { .. })));
    assert_record_untouched(&ring, id);
}

/// Record `id` of `ring` is still LIVE in its epoch, with its release counters as registration left them.
fn assert_record_untouched(ring: &ProducerControl, id: ConsumerId) {
    assert_eq!(ring.block().consumer_state(id.index()), Some((ConsumerState::Live, id.epoch())));
    let mut pending = Vec::new();
    ring.pending_releases(Sequence(2), &mut pending).unwrap();
    assert_eq!(pending.len(), 1, "its release counter of slot 0 was written: {pending:?}");
}

/// A hand-made producer that sends the offer for a LIVE record and hangs up at once (first saying `Refused` code 5,
/// shutting down, when `shutting_down`); returns what the Rust consumer's attach gave, the ring and the record.
fn offer_then_hang_up(name: &str, shutting_down: bool) -> (Result<(), FrameError>, ProducerControl, ConsumerId) {
    let path = sock(name);
    let listener = RendezvousListener::bind(&path).unwrap();
    let consumer = thread::spawn(move || {
        let options = AttachOptions { name: "dropped".into(), ..AttachOptions::default() };
        Consumer::<Host>::attach(&HostContext, &path, &options).map(|_| ())
    });
    let config = RingConfig { slot_count: 2, max_consumers: 16, generation: 1 };
    let ring = ProducerControl::create(config, LivenessPolicy::default()).unwrap();
    let id = ring.register_consumer(None).unwrap();
    let connection = accept_hello(&listener, "dropped");
    let offer = host_fake_offer(SyncStrategy::CpuSpin, 1, id.index());
    let fds = OfferFds { control: ring.block().memory().try_clone_fd().unwrap(), data: Some(sealed_memfd(8192)) };
    connection.send(&Message::RingOffer(offer), fds.into_vec(), T).unwrap();
    if shutting_down {
        let refusal = Refused { code: RefusalCode::ShuttingDown, message: "the producer is shutting down".into() };
        // The consumer may have joined and left already (it saw the connection open): then nobody reads this.
        let _ = connection.send(&Message::Refused(refusal), Vec::new(), T);
    }
    drop(connection);
    (consumer.join().unwrap(), ring, id)
}

#[test]
fn a_consumer_whose_handshake_was_dropped_leaves_its_record_alone() {
    // The producer hangs up right after the offer (as it does when a handshake misses its deadline, before it
    // gives the record to anyone else; or when it shuts down, saying so first). A consumer that finds the
    // connection gone once it has read the record must fail without detaching, since the record may already be a
    // newcomer's, and say why: the shutdown when the producer said so. Whether the hang-up comes before that check
    // is a race the test cannot steer, so it runs the handshake until it has seen that case several times; a
    // consumer that saw the connection open joined its own record, and whatever it did to it is its right.
    for shutting_down in [false, true] {
        let (mut seen, mut other) = (0, 0);
        for round in 0..400 {
            let (result, ring, id) = offer_then_hang_up(&format!("dropped-{shutting_down}-{round}"), shutting_down);
            let reported = match &result {
                Err(FrameError::Config(message)) => !shutting_down && message.contains("dropped this handshake"),
                Err(FrameError::Wire(WireError::Refused { code, .. })) => {
                    shutting_down && *code == RefusalCode::ShuttingDown
                }
                _ => false,
            };
            if reported {
                assert_record_untouched(&ring, id);
                seen += 1;
                if seen == 5 {
                    break;
                }
            } else {
                assert!(
                    !matches!(&result, Err(FrameError::Config(m)) if m.contains("dropped this handshake")),
                    "a shutdown reported as a slow handshake"
                );
                other += 1;
            }
        }
        eprintln!("shutting down {shutting_down}: {seen} found after the record was read, {other} otherwise");
        assert!(seen >= 1, "the consumer never found the connection gone after reading the record");
    }
}

#[test]
fn consumers_refuse_a_control_block_that_is_not_the_offered_ring() {
    // The Rust consumer.
    let path = sock("generation-rust");
    let listener = RendezvousListener::bind(&path).unwrap();
    let consumer = thread::spawn(move || {
        let options = AttachOptions { name: "generation".into(), ..AttachOptions::default() };
        Consumer::<Host>::attach(&HostContext, &path, &options).map(|_| ())
    });
    offer_another_generation(&listener, "generation");
    match consumer.join().unwrap() {
        Err(e) => assert!(e.to_string().contains("generation 7"), "{e}"),
        Ok(()) => panic!("the consumer attached to a control block that is not the offered ring"),
    }
    // The Python consumer, from the docs.
    let python = python();
    let path = sock("generation-python");
    let listener = RendezvousListener::bind(&path).unwrap();
    let mut c = py_consumer(&python, &path, 10, "generation");
    offer_another_generation(&listener, "generation");
    let run = c.wait(T);
    assert_eq!(run.code, Some(1), "{}", run.describe());
}

#[test]
fn a_handshake_dropped_after_the_consumers_attached_was_sent_does_not_poison_the_ring() {
    // The handshake deadline passes while the consumer's `Attached` sits unread: the producer marks the record dead
    // and hangs up (as `fail` does). The consumer's attach has returned by then; at the hang-up its watchdog must not
    // take the producer for dead and poison the publish counters every consumer and the producer share, since its
    // own record says it was dropped. (Second review, 2026-11-24: the ring was poisoned every time before.)
    let path = sock("late-attached");
    let listener = RendezvousListener::bind(&path).unwrap();
    let config = RingConfig { slot_count: 2, max_consumers: 16, generation: 1 };
    let ring = ProducerControl::create(config, LivenessPolicy::default()).unwrap();
    let consumer = {
        let path = path.clone();
        thread::spawn(move || {
            let c = Consumer::<Host>::attach(&HostContext, &path, &AttachOptions::default());
            // Keep it (and its watchdog) alive while the producer hangs up.
            thread::sleep(Duration::from_millis(200));
            c.map(|_| ())
        })
    };
    let connection = accept_hello(&listener, "consumer");
    let id = ring.register_consumer(None).unwrap();
    let fds = OfferFds { control: ring.block().memory().try_clone_fd().unwrap(), data: Some(sealed_memfd(8192)) };
    connection
        .send(&Message::RingOffer(host_fake_offer(SyncStrategy::CpuSpin, 1, id.index())), fds.into_vec(), T)
        .unwrap();
    // Its `Attached` arrives; the deadline is found passed before it is read.
    assert!(matches!(connection.recv(T).unwrap().message, Message::Attached(_)));
    ring.mark_consumer_dead(id).unwrap();
    drop(connection);
    let _ = consumer.join().unwrap();
    let published = ring.publish(Sequence(0));
    assert!(published.is_ok(), "one consumer's dropped handshake stopped the ring for everyone: {published:?}");
}

#[test]
fn a_consumer_that_reads_its_given_back_record_is_told_its_handshake_was_dropped() {
    // Slower than the deadline: the producer marked the record dead and hung up before the consumer read it. The
    // consumer must say "dropped this handshake; attach again" (what callers retry on), not that its record is
    // not live.
    let path = sock("given-back");
    let listener = RendezvousListener::bind(&path).unwrap();
    let config = RingConfig { slot_count: 2, max_consumers: 16, generation: 1 };
    let ring = ProducerControl::create(config, LivenessPolicy::default()).unwrap();
    let consumer = {
        let path = path.clone();
        thread::spawn(move || Consumer::<Host>::attach(&HostContext, &path, &AttachOptions::default()).map(|_| ()))
    };
    let connection = accept_hello(&listener, "consumer");
    let id = ring.register_consumer(None).unwrap();
    ring.mark_consumer_dead(id).unwrap();
    let fds = OfferFds { control: ring.block().memory().try_clone_fd().unwrap(), data: Some(sealed_memfd(8192)) };
    connection
        .send(&Message::RingOffer(host_fake_offer(SyncStrategy::CpuSpin, 1, id.index())), fds.into_vec(), T)
        .unwrap();
    drop(connection);
    let result = consumer.join().unwrap();
    assert!(matches!(&result, Err(FrameError::Config(m)) if m.contains("dropped this handshake")), "{result:?}");
}

// `tests/python/cuda_consumer.py`, the consumer for the GPU backends (legacy, vmm) written from the docs alone, runs
// against the real producer only on a GPU machine (`scripts/python-gpu-consumer.sh`). What can be checked here:
// its frame check pattern against the table of vectors in docs/kernels.md, and that without CUDA (or without a
// producer) it stops with one line saying what is missing, not a traceback.
const CUDA_SCRIPT: &str = "cuda_consumer.py";

#[test]
fn the_cuda_consumer_s_pattern_matches_the_vectors_of_docs_kernels_md() {
    let python = python();
    let mut run =
        PyScript::spawn(&python, CUDA_SCRIPT, "python cuda consumer --self-test", Path::new(""), &["--self-test"]);
    let finished = run.wait(T);
    assert_eq!(finished.code, Some(0), "{}", finished.describe());
    assert!(finished.stdout.contains(r#""self_test": "passed""#), "{}", finished.describe());
    assert!(finished.stdout.contains(r#""source": "docs/kernels.md""#), "{}", finished.describe());
    assert_eq!(finished.summary("vectors"), 9, "docs/kernels.md's table has 9 rows\n{}", finished.describe());
}

#[test]
fn the_cuda_consumer_without_cuda_or_a_producer_exits_1_saying_why() {
    let python = python();
    let missing = sock("cuda-no-producer");
    let _ = std::fs::remove_file(&missing);
    let mut run = PyScript::spawn(&python, CUDA_SCRIPT, "python cuda consumer", &missing, &["--timeout", "5"]);
    let finished = run.wait(Duration::from_secs(60));
    assert_eq!(finished.code, Some(1), "{}", finished.describe());
    assert!(!finished.stderr.contains("Traceback"), "{}", finished.describe());
    let last = finished.stderr.lines().last().unwrap_or_default();
    assert!(last.starts_with("cuda_consumer: "), "{}", finished.describe());
    // Here: no cuda-bindings (or no driver); on a GPU machine: no producer on that path.
    assert!(
        ["cuda-bindings is not installed", "cuInit failed", "cannot connect to"].iter().any(|why| last.contains(why)),
        "{}",
        finished.describe()
    );
    assert!(finished.stdout.is_empty(), "no summary without a ring\n{}", finished.describe());
}
