//! Teardown respects the GPU (issue 9, defect 3): dropping a consumer or producer whose stream still holds a
//! `cuStreamWaitValue64` on the ring waits for it (bounded), and when the wait cannot finish in time leaks the
//! mappings instead of unregistering them under the GPU; the stream later completes without a fault. One process,
//! the VMM backend (which may import its own export), `gpu-stream-ops`. Ignored without a GPU.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::PathBuf;
use std::time::{Duration, Instant};

use gpu_ipc::core::frames::{AttachOptions, Consumer, Producer, ProducerConfig};
use gpu_ipc::core::wire::{FrameGeometry, PixelFormat, SyncStrategy};
use gpu_ipc::driver::{Context, Stream};
use gpu_ipc::vmm::Vmm;

const T: Duration = Duration::from_secs(10);

fn socket(tag: &str) -> PathBuf {
    std::env::temp_dir().join(format!("gpu-ipc-teardown-{}-{tag}.sock", std::process::id()))
}

fn producer(ctx: &Context, tag: &str) -> Producer<Vmm> {
    let geometry = FrameGeometry::new(1280, 720, PixelFormat::Rgb8).unwrap();
    let mut config = ProducerConfig::new(socket(tag), geometry, 2, SyncStrategy::GpuStreamOps);
    config.gpu_timeout = Duration::from_millis(300);
    Producer::<Vmm>::create(ctx, config).unwrap()
}

/// Attaches a consumer from another thread while the producer admits it.
fn attach(ctx: &Context, producer: &mut Producer<Vmm>, tag: &str) -> Consumer<Vmm> {
    let (ctx2, path) = (ctx.clone(), socket(tag));
    let handle = std::thread::spawn(move || {
        let options = AttachOptions { gpu_timeout: Duration::from_millis(300), ..AttachOptions::default() };
        Consumer::<Vmm>::attach(&ctx2, &path, &options).unwrap()
    });
    producer.wait_for_consumers(1, T).unwrap();
    handle.join().unwrap()
}

/// Polls `stream` until it is idle (an error, e.g. an illegal address, fails the test) or `timeout` passes.
fn wait_idle(stream: &Stream, timeout: Duration) -> bool {
    let deadline = Instant::now() + timeout;
    while Instant::now() < deadline {
        if stream.is_idle().expect("the stream failed: memory freed under it?") {
            return true;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    false
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn a_consumer_dropped_under_a_pending_stream_wait_leaks_its_mappings_and_the_stream_completes_later() {
    let ctx = Context::for_ordinal(0).unwrap();
    let mut producer = producer(&ctx, "consumer");
    let consumer_stream = Stream::new(&ctx).unwrap();
    let mut consumer = attach(&ctx, &mut producer, "consumer");
    // Frame 0 is not published: the consumer's stream now waits on the control block.
    let _frame = consumer.next_frame(Some(&consumer_stream), T).unwrap();
    assert!(!consumer_stream.is_idle().unwrap());
    let start = Instant::now();
    drop(consumer);
    let took = start.elapsed();
    assert!(took >= Duration::from_millis(250), "drop did not wait for the stream ({took:?})");
    assert!(took < Duration::from_secs(3), "drop waited {took:?}, past its bound");
    // The producer counts it as gone (its record stayed LIVE, then the hang-up), and publishes frame 0: the
    // leaked registration is still mapped, so the consumer's stream completes its wait without a fault.
    let start = Instant::now();
    while producer.consumers_lost() != 1 {
        assert!(start.elapsed() < T, "the producer never saw the consumer go");
        std::thread::sleep(Duration::from_millis(1));
    }
    let producer_stream = Stream::new(&ctx).unwrap();
    let lease = producer.acquire(Some(&producer_stream), T).unwrap();
    producer.publish(lease, Some(&producer_stream)).unwrap();
    assert!(wait_idle(&producer_stream, T));
    assert!(wait_idle(&consumer_stream, T), "the consumer's stream never completed its wait");
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn a_consumer_whose_work_is_done_detaches_at_once_and_is_not_counted_lost() {
    let ctx = Context::for_ordinal(0).unwrap();
    let mut producer = producer(&ctx, "clean");
    let (producer_stream, consumer_stream) = (Stream::new(&ctx).unwrap(), Stream::new(&ctx).unwrap());
    let mut consumer = attach(&ctx, &mut producer, "clean");
    for _ in 0..8 {
        let lease = producer.acquire(Some(&producer_stream), T).unwrap();
        producer.publish(lease, Some(&producer_stream)).unwrap();
        let frame = consumer.next_frame(Some(&consumer_stream), T).unwrap();
        consumer.release(frame, Some(&consumer_stream)).unwrap();
    }
    assert!(wait_idle(&consumer_stream, T));
    let start = Instant::now();
    consumer.detach();
    assert!(start.elapsed() < Duration::from_millis(200), "detach took {:?}", start.elapsed());
    producer.drain(Some(&producer_stream), T).unwrap();
    assert_eq!(producer.consumers(), 0);
    assert_eq!(producer.consumers_lost(), 0);
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn a_producer_dropped_with_waits_queued_on_a_consumer_releases_them_and_frees_cleanly() {
    let ctx = Context::for_ordinal(0).unwrap();
    let mut producer = producer(&ctx, "producer");
    let (producer_stream, consumer_stream) = (Stream::new(&ctx).unwrap(), Stream::new(&ctx).unwrap());
    let mut consumer = attach(&ctx, &mut producer, "producer");
    // Two frames fill both slots; the consumer takes frame 0 and never releases it.
    for _ in 0..2 {
        let lease = producer.acquire(Some(&producer_stream), T).unwrap();
        producer.publish(lease, Some(&producer_stream)).unwrap();
    }
    let _held = consumer.next_frame(Some(&consumer_stream), T).unwrap();
    // Frame 2 reuses slot 0: the producer's stream now waits for the consumer's release.
    let _lease = producer.acquire(Some(&producer_stream), T).unwrap();
    assert!(!producer_stream.is_idle().unwrap());
    let start = Instant::now();
    drop(producer);
    // Dropping poisons the counters its stream waits on, so the wait completes and teardown need not leak.
    assert!(start.elapsed() < Duration::from_millis(250), "drop took {:?}", start.elapsed());
    assert!(wait_idle(&producer_stream, T));
    assert!(wait_idle(&consumer_stream, T));
    drop(consumer);
}
