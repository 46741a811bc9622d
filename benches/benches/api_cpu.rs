//! The per-frame CPU cost of the frame API itself, without a GPU: `Producer` and `Consumer` over the host-memory
//! fake backend (`ipc_core::host::Host`) with `cpu-spin`, the real control block, socket and watchdog. Runs in
//! CI (`cargo test --benches` runs it once; `cargo bench --bench api_cpu` measures).
//!
//! - `api-cpu-spin/same-thread`: acquire + publish + next_frame + release of one frame, all on one thread: the
//!   calls' own cost, nothing ever waits.
//! - `api-cpu-spin/producer-4-slots`: acquire + publish per frame while one consumer thread does next_frame +
//!   release: what the producer pays per frame with the handoff between cores included.

#![forbid(unsafe_code)]
// Benches may panic on setup failure: there is nobody to report an error to.
#![allow(clippy::expect_used)]

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use criterion::{Criterion, Throughput};
use gpu_ipc_benches::harness;
use gpu_ipc_benches::peer::{flat_geometry, socket_path};
use ipc_core::frames::{AttachOptions, Consumer, FrameError, Producer, ProducerConfig};
use ipc_core::host::{Host, HostContext};
use ipc_core::wire::SyncStrategy;

const T: Duration = Duration::from_secs(10);

fn producer(tag: &str, slots: u32) -> Producer<Host> {
    let geometry = flat_geometry(4096).expect("geometry");
    Producer::<Host>::create(
        &HostContext,
        ProducerConfig::new(socket_path(tag), geometry, slots, SyncStrategy::CpuSpin),
    )
    .expect("a fake-backend producer")
}

fn attach(tag: &str) -> Consumer<Host> {
    Consumer::<Host>::attach(&HostContext, &socket_path(tag), &AttachOptions::default()).expect("attach")
}

fn same_thread(c: &mut Criterion) {
    let mut p = producer("api-same-thread", 1);
    let path = socket_path("api-same-thread");
    let attaching = thread::spawn(move || {
        Consumer::<Host>::attach(&HostContext, &path, &AttachOptions::default()).expect("attach")
    });
    p.wait_for_consumers(1, T).expect("the consumer attaches");
    let mut consumer = attaching.join().expect("attach thread");
    let mut group = c.benchmark_group("api-cpu-spin");
    group.throughput(Throughput::Elements(1));
    group.bench_function("same-thread", |b| {
        b.iter(|| {
            let lease = p.acquire(None, T).expect("acquire");
            p.publish(lease, None).expect("publish");
            let frame = consumer.next_frame(None, T).expect("next_frame");
            consumer.release(frame, None).expect("release");
        });
    });
    group.finish();
    consumer.detach();
}

fn producer_with_consumer_thread(c: &mut Criterion) {
    let tag = "api-threaded";
    let mut p = producer(tag, 4);
    let stop = Arc::new(AtomicBool::new(false));
    let reader = {
        let stop = stop.clone();
        thread::spawn(move || {
            let mut consumer = attach(tag);
            let mut frames = 0u64;
            loop {
                match consumer.next_frame(None, Duration::from_millis(50)) {
                    Ok(frame) => {
                        consumer.release(frame, None).expect("release");
                        frames += 1;
                    }
                    Err(FrameError::Timeout { .. }) if stop.load(Ordering::Acquire) => break,
                    Err(FrameError::Timeout { .. }) => {}
                    Err(e) => panic!("consumer thread: {e}"),
                }
            }
            consumer.detach();
            frames
        })
    };
    p.wait_for_consumers(1, T).expect("the consumer attaches");
    let mut group = c.benchmark_group("api-cpu-spin");
    group.throughput(Throughput::Elements(1));
    group.bench_function("producer-4-slots", |b| {
        b.iter_custom(|iters| {
            let started = Instant::now();
            for _ in 0..iters {
                let lease = p.acquire(None, T).expect("acquire");
                p.publish(lease, None).expect("publish");
            }
            started.elapsed()
        });
    });
    group.finish();
    p.drain(None, T).expect("the consumer reads every frame");
    stop.store(true, Ordering::Release);
    let read = reader.join().expect("consumer thread");
    assert_eq!(read, p.next_sequence(), "the consumer read every frame published");
}

fn main() {
    let mut c = harness::criterion();
    same_thread(&mut c);
    producer_with_consumer_thread(&mut c);
    c.final_summary();
}
