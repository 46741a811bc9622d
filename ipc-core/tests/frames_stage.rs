//! A pipeline stage on the host backend: a producer, a `Stage` (a consumer of its ring and the producer of another)
//! and a consumer of the second ring, on threads of this process, with the real sockets, control blocks and
//! watchdogs. The end of the stream travels through the stage; an upstream that dies ends the downstream ring as a
//! death; a downstream consumer that leaves stops the stage (or is waited for); work that fails is retried on the
//! same frame. The example programs run the same across processes (examples/tests/host_pipeline.rs).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::{frame_bytes, geometry, publish};

use std::path::PathBuf;
use std::thread;
use std::time::{Duration, Instant};

use ipc_core::frames::{
    AttachOptions, Consumer, DownstreamEmpty, FrameError, Producer, ProducerConfig, Stage, StageConfig, StageError,
    StageIo, StageStep, WorkError,
};
use ipc_core::host::{Host, HostContext};
use ipc_core::wire::SyncStrategy;

const T: Duration = Duration::from_secs(10);

fn sock(name: &str) -> PathBuf {
    common::sock("stage", name)
}

/// The stage's work in these tests: every byte of the frame inverted.
fn invert(io: StageIo<'_, Host, Host>) -> Result<(), WorkError> {
    let mut bytes = vec![0u8; io.input.bytes() as usize];
    io.upstream.region().read(io.input.ptr(), &mut bytes)?;
    bytes.iter_mut().for_each(|b| *b = !*b);
    io.downstream.region().write(io.output.ptr(), &bytes)?;
    Ok(())
}

fn inverted(seq: u64) -> Vec<u8> {
    frame_bytes(seq, geometry().frame_bytes() as usize).iter().map(|b| !b).collect()
}

/// A stage from ring `a` into ring `b`, started on a thread (it waits for its downstream consumer first).
fn start_stage(
    name: &str,
    sync: SyncStrategy,
    when_empty: DownstreamEmpty,
) -> thread::JoinHandle<Result<Stage<Host, Host>, StageError>> {
    let (a, b) = (sock(&format!("{name}-a")), sock(&format!("{name}-b")));
    thread::spawn(move || {
        let mut config = StageConfig::new(a, ProducerConfig::new(b, geometry(), 2, sync));
        config.attach.wait_for_producer = T;
        config.consumer_timeout = Duration::from_secs(2);
        config.when_downstream_empty = when_empty;
        Stage::start(&HostContext, &HostContext, config)
    })
}

/// What a consumer of ring `b` saw: frames read with their content checked, then how the stream ended.
#[derive(Debug)]
struct Seen {
    first: u64,
    frames: u64,
    wrong: u64,
    end: FrameError,
}

/// A consumer of the stage's ring that reads until the stream ends, checking each frame (downstream frame `n` is
/// upstream frame `first_upstream + n`, inverted).
fn spawn_downstream(name: &str, first_upstream: u64) -> thread::JoinHandle<Seen> {
    let path = sock(&format!("{name}-b"));
    thread::spawn(move || {
        let options = AttachOptions { wait_for_producer: T, ..AttachOptions::default() };
        let mut c = Consumer::<Host>::attach(&HostContext, &path, &options).unwrap();
        let first = c.next_sequence();
        let (mut frames, mut wrong) = (0, 0);
        let end = loop {
            let frame = match c.next_frame(None, T) {
                Ok(frame) => frame,
                Err(e) => break e,
            };
            let mut got = vec![0u8; frame.bytes() as usize];
            c.region().read(frame.ptr(), &mut got).unwrap();
            if got != inverted(first_upstream + frame.seq().0) {
                wrong += 1;
            }
            frames += 1;
            if let Err(e) = c.release(frame, None) {
                break e;
            }
        };
        Seen { first, frames, wrong, end }
    })
}

fn upstream(name: &str, sync: SyncStrategy) -> Producer<Host> {
    common::producer(sock(&format!("{name}-a")), sync, 2)
}

#[test]
fn frames_go_through_transformed_and_the_end_of_the_stream_follows_them() {
    for (name, up, down) in [
        ("spin-sleep", SyncStrategy::CpuSpin, SyncStrategy::CpuSleep),
        ("sleep-spin", SyncStrategy::CpuSleep, SyncStrategy::CpuSpin),
    ] {
        let mut a = upstream(name, up);
        let stage = start_stage(name, down, DownstreamEmpty::Fail);
        let c = spawn_downstream(name, 0);
        a.wait_for_consumers(1, T).unwrap();
        let stage_thread = thread::spawn(move || {
            let mut stage = stage.join().unwrap().unwrap();
            assert_eq!(stage.first_upstream(), 0);
            let published = stage.run(None, invert).unwrap();
            // Every call after the end says so again.
            assert_eq!(stage.process(None, invert).unwrap(), StageStep::End { upstream_published: published });
            let frames = stage.frames();
            (published, frames, stage.finish(None, T).unwrap())
        });
        for _ in 0..1000 {
            publish(&mut a, T).unwrap();
        }
        a.drain(None, T).unwrap();
        drop(a); // the clean end of the upstream stream
        assert_eq!(stage_thread.join().unwrap(), (1000, 1000, 1000), "{name}");
        let seen = c.join().unwrap();
        assert_eq!((seen.first, seen.frames, seen.wrong), (0, 1000, 0), "{name}: {seen:?}");
        assert!(matches!(seen.end, FrameError::EndOfStream { published: 1000, past_end: None }), "{name}: {seen:?}");
    }
}

#[test]
fn an_upstream_that_dies_ends_the_downstream_ring_as_a_death_not_an_end() {
    let name = "upstream-dies";
    let mut a = upstream(name, SyncStrategy::CpuSpin);
    let stage = start_stage(name, SyncStrategy::CpuSpin, DownstreamEmpty::Fail);
    let c = spawn_downstream(name, 0);
    a.wait_for_consumers(1, T).unwrap();
    let stage_thread = thread::spawn(move || {
        let mut stage = stage.join().unwrap().unwrap();
        let error = stage.run(None, invert).unwrap_err();
        let frames = stage.frames();
        let at = Instant::now();
        drop(stage);
        (error, frames, at)
    });
    for _ in 0..300 {
        publish(&mut a, T).unwrap();
    }
    // A producer that goes without closing its ring: what its consumers see of a crash.
    let died = Instant::now();
    a.abandon();
    let (error, frames, _) = stage_thread.join().unwrap();
    let noticed = died.elapsed();
    assert!(error.is_upstream_gone(), "{error}");
    assert!(error.to_string().contains(&sock(&format!("{name}-a")).display().to_string()), "{error}");
    assert!(noticed < Duration::from_secs(1), "the stage noticed after {noticed:?}");
    let seen = c.join().unwrap();
    assert!(matches!(seen.end, FrameError::ProducerGone { .. }), "{seen:?}");
    // The consumer read what the stage moved, but for the frames the stage had published and the consumer not yet
    // read when the stage, its upstream dead, let go of its ring (a death too: those slots are poisoned, at most
    // the ring's 2). Under load that is one frame now and then (it once failed here: 299 read of 300 moved).
    assert_eq!(seen.wrong, 0, "{seen:?}");
    assert!(seen.frames <= frames && frames - seen.frames <= 2, "{seen:?} of {frames} moved");
    // Frames the upstream published but the stage had not taken when it died may be lost the same way.
    assert!(frames <= 300);
}

#[test]
fn a_producer_abandoned_gives_its_consumers_producer_gone_not_the_end_of_the_stream() {
    let mut p = common::producer(sock("abandon"), SyncStrategy::CpuSpin, 2);
    let path = sock("abandon");
    let c = thread::spawn(move || {
        let mut c = Consumer::<Host>::attach(&HostContext, &path, &AttachOptions::default()).unwrap();
        let mut frames = 0;
        loop {
            match c.next_frame(None, T) {
                Ok(frame) => {
                    frames += 1;
                    c.release(frame, None).unwrap();
                }
                Err(e) => return (frames, e),
            }
        }
    });
    p.wait_for_consumers(1, T).unwrap();
    for _ in 0..10 {
        publish(&mut p, T).unwrap();
    }
    p.drain(None, T).unwrap();
    p.abandon();
    let (frames, end) = c.join().unwrap();
    assert_eq!(frames, 10);
    assert!(matches!(end, FrameError::ProducerGone { .. }), "{end}");
}

/// A stage (`when_empty`) whose one downstream consumer read frame 0 and detached; returns the upstream producer,
/// the stage and the downstream socket.
fn stage_whose_consumer_left(name: &str, when_empty: DownstreamEmpty) -> (Producer<Host>, Stage<Host, Host>, PathBuf) {
    let mut a = upstream(name, SyncStrategy::CpuSpin);
    let stage = start_stage(name, SyncStrategy::CpuSpin, when_empty);
    let path = sock(&format!("{name}-b"));
    let options = AttachOptions { wait_for_producer: T, ..AttachOptions::default() };
    let mut c = Consumer::<Host>::attach(&HostContext, &path, &options).unwrap();
    a.wait_for_consumers(1, T).unwrap();
    let mut stage = stage.join().unwrap().unwrap();
    publish(&mut a, T).unwrap();
    assert_eq!(stage.process(None, invert).unwrap(), StageStep::Frame { upstream: 0, downstream: 0 });
    let frame = c.next_frame(None, T).unwrap();
    c.release(frame, None).unwrap();
    c.detach();
    (a, stage, path)
}

#[test]
fn a_downstream_consumer_that_leaves_stops_the_stage() {
    // Fail (the default): the next frame is not taken, and the error says what to do.
    let (_a, mut stage, _) = stage_whose_consumer_left("downstream-leaves", DownstreamEmpty::Fail);
    let deadline = Instant::now() + T;
    let error = loop {
        match stage.process(None, invert) {
            Err(e) => break e,
            Ok(step) => assert!(Instant::now() < deadline, "still going: {step:?}"),
        }
    };
    assert!(matches!(error, StageError::NoDownstreamConsumers { lost: 0, evicted: 0, .. }), "{error}");
    assert!(error.to_string().contains("start the next stage again"), "{error}");
}

#[test]
fn a_stage_told_to_wait_goes_on_with_a_new_downstream_consumer() {
    let (mut a, mut stage, path) = stage_whose_consumer_left("downstream-replaced", DownstreamEmpty::Wait);
    let replacement = thread::spawn(move || {
        thread::sleep(Duration::from_millis(200));
        let options = AttachOptions { wait_for_producer: T, ..AttachOptions::default() };
        let mut c = Consumer::<Host>::attach(&HostContext, &path, &options).unwrap();
        let frame = c.next_frame(None, T).unwrap();
        let mut got = vec![0u8; frame.bytes() as usize];
        c.region().read(frame.ptr(), &mut got).unwrap();
        let seq = frame.seq().0;
        c.release(frame, None).unwrap();
        (seq, got == inverted(seq))
    });
    publish(&mut a, T).unwrap();
    let waited = Instant::now();
    // The consumer's detach is seen within milliseconds; the stage then waits for the replacement.
    assert_eq!(stage.process(None, invert).unwrap(), StageStep::Frame { upstream: 1, downstream: 1 });
    assert!(waited.elapsed() >= Duration::from_millis(150), "did not wait: {:?}", waited.elapsed());
    assert_eq!(replacement.join().unwrap(), (1, true));
}

#[test]
fn work_that_fails_is_run_again_on_the_same_frame() {
    let name = "work-fails";
    let mut a = upstream(name, SyncStrategy::CpuSpin);
    let stage = start_stage(name, SyncStrategy::CpuSpin, DownstreamEmpty::Fail);
    let c = spawn_downstream(name, 0);
    a.wait_for_consumers(1, T).unwrap();
    let mut stage = stage.join().unwrap().unwrap();
    publish(&mut a, T).unwrap();
    let error = stage.process(None, |_io| Err("the kernel failed".into())).unwrap_err();
    assert!(matches!(error, StageError::Work { seq: 0, .. }), "{error}");
    assert!(error.to_string().contains("upstream frame 0 failed: the kernel failed"), "{error}");
    for seq in 0..3 {
        if seq > 0 {
            publish(&mut a, T).unwrap();
        }
        assert_eq!(stage.process(None, invert).unwrap(), StageStep::Frame { upstream: seq, downstream: seq });
    }
    a.drain(None, T).unwrap();
    drop(a);
    assert_eq!(stage.run(None, invert).unwrap(), 3);
    assert_eq!(stage.finish(None, T).unwrap(), 3);
    let seen = c.join().unwrap();
    assert_eq!((seen.frames, seen.wrong), (3, 0), "{seen:?}");
    assert!(matches!(seen.end, FrameError::EndOfStream { published: 3, .. }), "{seen:?}");
}

#[test]
fn a_stage_without_its_upstream_says_so_and_abandons_its_downstream_ring() {
    let name = "no-upstream";
    let b = sock(&format!("{name}-b"));
    let stage = {
        let (a, b) = (sock(&format!("{name}-a")), b.clone());
        thread::spawn(move || {
            let config = StageConfig::new(a, ProducerConfig::new(b, geometry(), 2, SyncStrategy::CpuSpin));
            Stage::<Host, Host>::start(&HostContext, &HostContext, config)
        })
    };
    let options = AttachOptions { wait_for_producer: T, ..AttachOptions::default() };
    let mut c = Consumer::<Host>::attach(&HostContext, &b, &options).unwrap();
    let error = stage.join().unwrap().err().unwrap();
    assert!(matches!(error, StageError::Upstream { source: FrameError::Wire(_), .. }), "{error}");
    assert!(error.to_string().contains("start the producer first"), "{error}");
    let end = c.next_frame(None, T).unwrap_err();
    assert!(matches!(end, FrameError::ProducerGone { .. }), "{end}");
}
