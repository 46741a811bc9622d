//! The `gpu-poll` strategy on a GPU: polling kernels (`ld.acquire.sys`, bounded by `%globaltimer`) and release
//! kernels (`st.release.sys`) move verified frames between a producer and two consumers; a silent producer makes
//! the consumer's poll give up in bounded time, a killed producer (the `producer` example, SIGKILLed) ends it at
//! once (the watchdog's poison), and teardown never waits out a poll. The VMM backend; producer and consumers in one
//! process (it may import its own export) except for the kill, so MPS is not needed: `GPU_IPC_ASSUME_MPS=1` is set
//! here (and for the child) unless the environment already sets it. Ignored without a GPU. Not for a run under MPS:
//! there the producer's SIGKILL while its poll spins (the consumer has stopped releasing) faults the MPS server, and
//! the consumer's stream fails with `CUDA_ERROR_ILLEGAL_ADDRESS` (docs/frames.md, gpu-poll; seen on an H100 on
//! 2026-11-26 with the library of `be534d8` as with later ones).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::path::PathBuf;
use std::sync::Once;
use std::time::{Duration, Instant};

use gpu_ipc::core::frames::{AttachOptions, Consumer, FrameError, Producer, ProducerConfig};
use gpu_ipc::core::wire::{FrameGeometry, PixelFormat, SyncStrategy};
use gpu_ipc::driver::{Context, DeviceBuffer, DeviceMemory, Stream};
use gpu_ipc::kernels::launch::PatternKernels;
use gpu_ipc::vmm::Vmm;

const T: Duration = Duration::from_secs(10);
const ASSUME_MPS: &str = "GPU_IPC_ASSUME_MPS";

/// Every test calls this first, so no test thread reads the environment while it is written.
fn assume_mps() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        if std::env::var_os(ASSUME_MPS).is_none() {
            #[allow(unsafe_code)]
            // SAFETY: every test of this binary calls `assume_mps` before anything else, and `call_once` holds the
            // others until the write is done, so no thread of ours reads the environment meanwhile.
            unsafe {
                std::env::set_var(ASSUME_MPS, "1");
            }
        }
    });
}

fn socket(tag: &str) -> PathBuf {
    std::env::temp_dir().join(format!("gpu-ipc-poll-{}-{tag}.sock", std::process::id()))
}

fn geometry() -> FrameGeometry {
    FrameGeometry::new(1280, 720, PixelFormat::Rgb8).unwrap()
}

fn producer(ctx: &Context, tag: &str, slots: u32) -> Producer<Vmm> {
    let mut config = ProducerConfig::new(socket(tag), geometry(), slots, SyncStrategy::GpuPoll);
    config.gpu_timeout = Duration::from_secs(2);
    Producer::<Vmm>::create(ctx, config).unwrap()
}

/// Attaches `count` consumers from other threads while the producer admits them.
fn attach(ctx: &Context, producer: &mut Producer<Vmm>, tag: &str, count: usize) -> Vec<Consumer<Vmm>> {
    let handles: Vec<_> = (0..count)
        .map(|i| {
            let (ctx, path) = (ctx.clone(), socket(tag));
            std::thread::spawn(move || {
                ctx.bind().unwrap();
                let options = AttachOptions {
                    name: format!("poll-{i}"),
                    gpu_timeout: Duration::from_secs(2),
                    ..AttachOptions::default()
                };
                Consumer::<Vmm>::attach(&ctx, &path, &options).unwrap()
            })
        })
        .collect();
    producer.wait_for_consumers(count, T).unwrap();
    handles.into_iter().map(|h| h.join().unwrap()).collect()
}

/// Polls `stream` until it is idle (an error fails the test) or `timeout` passes.
fn wait_idle(stream: &Stream, timeout: Duration) -> bool {
    let deadline = Instant::now() + timeout;
    while Instant::now() < deadline {
        if stream.is_idle().expect("the stream failed") {
            return true;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    false
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn gpu_poll_moves_verified_frames_to_two_consumers() {
    moves_verified_frames_to_two_consumers("frames", 2, 600);
}

/// A ring of 256 slots (control-block layout 2): the consumers' counters of a slot are 8 bytes apart within a
/// record and one record (2,304 bytes) apart across consumers, which the producer's poll mask walks.
#[test]
#[ignore = "needs a CUDA GPU"]
fn gpu_poll_moves_verified_frames_through_256_slots() {
    moves_verified_frames_to_two_consumers("deep", 256, 1200);
}

fn moves_verified_frames_to_two_consumers(tag: &str, slots: u32, frames: u64) {
    assume_mps();
    let ctx = Context::for_ordinal(0).unwrap();
    ctx.bind().unwrap();
    let kernels = PatternKernels::load(&ctx).unwrap();
    let mut producer = producer(&ctx, tag, slots);
    let mut consumers = attach(&ctx, &mut producer, tag, 2);
    let producer_stream = Stream::new(&ctx).unwrap();
    let streams: Vec<Stream> = consumers.iter().map(|_| Stream::new(&ctx).unwrap()).collect();
    let counters: Vec<DeviceBuffer> = consumers.iter().map(|_| DeviceBuffer::alloc(&ctx, 8).unwrap()).collect();
    for (counter, stream) in counters.iter().zip(&streams) {
        counter.span().fill_u32_async(0, stream).unwrap();
    }
    let start = Instant::now();
    for seq in 0..frames {
        let lease = producer.acquire(Some(&producer_stream), T).unwrap();
        assert_eq!(lease.seq().0, seq);
        kernels.fill(&producer_stream, producer.slot_span(&lease).unwrap(), seq).unwrap();
        producer.publish(lease, Some(&producer_stream)).unwrap();
        for ((consumer, stream), counter) in consumers.iter_mut().zip(&streams).zip(&counters) {
            let frame = consumer.next_frame(Some(stream), T).unwrap();
            assert_eq!(frame.seq().0, seq);
            // The verify runs after the poll on the same stream: it reads the frame only once it is published.
            kernels.verify(stream, consumer.frame_span(&frame).unwrap(), seq, counter.span()).unwrap();
            consumer.release(frame, Some(stream)).unwrap();
        }
    }
    producer.drain(Some(&producer_stream), T).unwrap();
    for (stream, counter) in streams.iter().zip(&counters) {
        assert!(wait_idle(stream, T), "a consumer's stream never finished");
        let mut mismatches = [u64::MAX];
        counter.span().read(0, &mut mismatches).unwrap();
        assert_eq!(mismatches[0], 0, "words that were not the published frame's");
    }
    let took = start.elapsed();
    eprintln!("gpu-poll: {frames} frames of 1280x720 rgb8 through {slots} slots to 2 consumers in {took:?}");
    for consumer in consumers {
        consumer.detach();
    }
    assert_eq!(producer.consumers_lost(), 0);
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn a_silent_producer_makes_the_consumers_poll_give_up_in_bounded_time() {
    assume_mps();
    let ctx = Context::for_ordinal(0).unwrap();
    ctx.bind().unwrap();
    let mut producer = producer(&ctx, "silent", 2);
    let mut consumer = attach(&ctx, &mut producer, "silent", 1).pop().unwrap();
    let (producer_stream, consumer_stream) = (Stream::new(&ctx).unwrap(), Stream::new(&ctx).unwrap());
    // Frame 0 is published; after it the producer stays alive and says nothing.
    let lease = producer.acquire(Some(&producer_stream), T).unwrap();
    producer.publish(lease, Some(&producer_stream)).unwrap();
    let frame = consumer.next_frame(Some(&consumer_stream), T).unwrap();
    consumer.release(frame, Some(&consumer_stream)).unwrap();
    assert!(wait_idle(&consumer_stream, T));
    // Polls for frame 1 on: each is given twice the 200 ms timeout plus 1 s, then gives up.
    let timeout = Duration::from_millis(200);
    let start = Instant::now();
    let error = loop {
        assert!(start.elapsed() < Duration::from_secs(10), "the consumer never reported the poll that gave up");
        match consumer.next_frame(Some(&consumer_stream), timeout) {
            Ok(frame) => consumer.release(frame, Some(&consumer_stream)).unwrap(),
            // The CPU's own run-ahead bound: the stream is still inside a poll.
            Err(FrameError::Timeout { .. }) => {}
            Err(e) => break e,
        }
    };
    let took = start.elapsed();
    let text = error.to_string();
    assert!(matches!(error, FrameError::GpuWaitGaveUp { .. }), "{error:?}");
    assert!(text.contains("waiting for frame 1 (gpu-poll") && text.contains("attach again"), "{text}");
    assert!(took >= Duration::from_millis(1_300) && took < Duration::from_secs(4), "gave up after {took:?}");
    // The polls queued behind it gave up at once: the stream is idle, and the side stays failed.
    assert!(wait_idle(&consumer_stream, Duration::from_millis(500)), "polls behind the one that gave up still run");
    let again = consumer.next_frame(Some(&consumer_stream), timeout).unwrap_err();
    assert!(matches!(again, FrameError::GpuWaitGaveUp { .. }), "the side stays failed: {again:?}");
    drop(consumer);
    drop(producer);
}

/// The `producer` example, as nextest names it when it replays an archive, or as cargo built it.
fn producer_exe() -> PathBuf {
    std::env::var_os("NEXTEST_BIN_EXE_producer")
        .map_or_else(|| PathBuf::from(env!("CARGO_BIN_EXE_producer")), PathBuf::from)
}

/// A child process, SIGKILLed when dropped (so a failing test leaves nothing running).
struct Child(std::process::Child);

impl Child {
    fn kill9(&mut self) {
        let pid = rustix::process::Pid::from_child(&self.0);
        rustix::process::kill_process(pid, rustix::process::Signal::KILL).unwrap();
        self.0.wait().unwrap();
    }
}

impl Drop for Child {
    fn drop(&mut self) {
        if matches!(self.0.try_wait(), Ok(None)) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn a_killed_producer_ends_the_consumers_poll_with_producer_gone() {
    assume_mps();
    let sock = socket("killed");
    let args = ["--backend", "vmm", "--sync", "gpu-poll", "--slots", "2", "--consumers", "1", "--frames", "0"];
    let mut child = Child(
        std::process::Command::new(producer_exe())
            .args(args)
            .args(["--width", "1280", "--height", "720", "--socket", sock.to_str().unwrap()])
            .env(ASSUME_MPS, "1")
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .spawn()
            .unwrap(),
    );
    let ctx = Context::for_ordinal(0).unwrap();
    ctx.bind().unwrap();
    let options = AttachOptions { gpu_timeout: Duration::from_secs(2), ..AttachOptions::default() };
    let start = Instant::now();
    let mut consumer = loop {
        match Consumer::<Vmm>::attach(&ctx, &sock, &options) {
            Ok(consumer) => break consumer,
            Err(e) if start.elapsed() < Duration::from_secs(30) => {
                eprintln!("waiting for the producer: {e}");
                std::thread::sleep(Duration::from_millis(100));
            }
            Err(e) => panic!("the producer never let us attach: {e}"),
        }
    };
    let stream = Stream::new(&ctx).unwrap();
    for _ in 0..20 {
        let frame = consumer.next_frame(Some(&stream), T).unwrap();
        consumer.release(frame, Some(&stream)).unwrap();
    }
    assert!(wait_idle(&stream, T), "the first frames never came");
    child.kill9();
    // The consumer's watchdog sees the hang-up and writes POISON (2^62) into `published`: the poll for the first
    // frame that never came ends at once (its own bound would be 3 s), and the consumer says the producer is gone.
    let start = Instant::now();
    let error = loop {
        assert!(start.elapsed() < Duration::from_secs(2), "no ProducerGone within 2 s of the kill");
        match consumer.next_frame(Some(&stream), Duration::from_secs(1)) {
            Ok(frame) => {
                if let Err(e) = consumer.release(frame, Some(&stream)) {
                    break e;
                }
            }
            Err(e) => break e,
        }
    };
    assert!(matches!(error, FrameError::ProducerGone { .. }), "{error:?}");
    assert!(wait_idle(&stream, Duration::from_secs(2)), "POISON did not end the poll");
    assert!(start.elapsed() < Duration::from_secs(2), "took {:?}", start.elapsed());
    drop(consumer);
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn a_consumer_dropped_during_a_poll_aborts_it_and_leaves_cleanly() {
    assume_mps();
    let ctx = Context::for_ordinal(0).unwrap();
    ctx.bind().unwrap();
    let mut producer = producer(&ctx, "teardown", 2);
    let mut consumer = attach(&ctx, &mut producer, "teardown", 1).pop().unwrap();
    let consumer_stream = Stream::new(&ctx).unwrap();
    let _frame = consumer.next_frame(Some(&consumer_stream), T).unwrap();
    std::thread::sleep(Duration::from_millis(50));
    assert!(!consumer_stream.is_idle().unwrap(), "the poll did not wait");
    let start = Instant::now();
    drop(consumer);
    // Teardown sets the abort word: the poll gives up within about a thousand polls, so nothing is leaked.
    assert!(start.elapsed() < Duration::from_secs(1), "drop took {:?}", start.elapsed());
    assert!(wait_idle(&consumer_stream, Duration::from_millis(100)));
    let producer_stream = Stream::new(&ctx).unwrap();
    for _ in 0..4 {
        let lease = producer.acquire(Some(&producer_stream), T).unwrap();
        producer.publish(lease, Some(&producer_stream)).unwrap();
    }
    producer.drain(Some(&producer_stream), T).unwrap();
    assert_eq!(producer.consumers(), 0);
    assert_eq!(producer.consumers_lost(), 0, "the consumer left cleanly");
}

/// A peer whose kernels use the control block only (`GPU_IPC_DEVICE_WORDS=0`, as a consumer on another GPU or another
/// implementation of the protocol does): the other side's polls, which poll the device words, see its stores in the
/// control block and go on. Each way round, with the producer and consumer programs: 300 frames, every word checked.
#[test]
#[ignore = "needs a CUDA GPU"]
fn a_peer_that_writes_only_the_control_block_is_still_seen() {
    assume_mps();
    let words = gpu_ipc::core::frames::device_words::ENV;
    for (producer_words, consumer_words) in [("1", "0"), ("0", "1")] {
        let tag = format!("words-{producer_words}{consumer_words}");
        let sock = socket(&tag);
        let args = common::producer_args("vmm", "gpu-poll", &sock, 300, 1, 2, &["--width", "640", "--height", "360"]);
        let producer = common::Proc::spawn_env(&tag, producer_exe(), &args, &[(words, producer_words)]);
        let args = common::consumer_args(&tag, "vmm", &sock, 300, &[]);
        let consumer = common::Proc::spawn_env(&tag, common::exe("consumer"), &args, &[(words, consumer_words)]);
        let (status, took, summary) = consumer.finish(Duration::from_secs(60));
        assert!(status.success(), "{tag}: consumer {status:?}: {summary}");
        assert_eq!(summary["frames"], 300, "{tag}: {summary}");
        assert_eq!(summary["mismatched_words"], 0, "{tag}: {summary}");
        let (status, _, summary) = producer.finish(Duration::from_secs(30));
        assert!(status.success(), "{tag}: producer {status:?}: {summary}");
        eprintln!("{tag}: 300 frames in {took:?}");
    }
}
