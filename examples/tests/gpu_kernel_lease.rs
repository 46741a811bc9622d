//! The kernel lease and the survivor's abort word (`gpu_ipc::core::resident::KernelLease`, docs/frames.md, "Kills
//! under MPS"): a persistent kernel on the ring leaves by itself when its process is gone. On a real GPU, both sides
//! of a ring in this process (vmm backend, gpu-stream-ops), the example persistent kernels of the kernels crate:
//! - a persistent consumer whose lease is shorter than the heartbeat's period takes its (live) process for gone and
//!   leaves as orphaned, long before its per-frame timeout; so does a persistent producer waiting for a slot;
//! - with the default lease (100 ms) the heartbeat keeps a kernel waiting 600 ms for a frame alive: it times out,
//!   it is not orphaned;
//! - an evicted consumer's kernel leaves at once on the word the producer raises in the control block (the
//!   survivor's abort word), and waits out its timeout with the lease off (the comparison).
//!
//! These need no MPS: one process, whose kernel waits for host work. What the lease is for, a SIGKILL under MPS that
//! faults the server's other clients, is measured by the stress run's mps-kills cells (with the lease on and off),
//! not here: a fault would take the rest of an MPS test pass with it. The kills that need MPS are in `under_mps`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use gpu_ipc::core::frames::{AttachOptions, Consumer, Producer, ProducerConfig};
use gpu_ipc::core::resident::KernelLease;
use gpu_ipc::driver::{Context, Stream};
use gpu_ipc::kernels::persistent::{PersistentFill, PersistentOutcome, PersistentVerify};
use gpu_ipc::vmm::Vmm;
use gpu_ipc::{FrameGeometry, PixelFormat, SyncStrategy};

fn ctx() -> Context {
    Context::for_ordinal(0).expect("device 0")
}

fn sock(name: &str) -> PathBuf {
    std::env::temp_dir().join(format!("gpu-ipc-lease-{}-{name}.sock", std::process::id()))
}

/// A producer of 64x16 gray frames on `slots` slots (gpu-stream-ops: its control block is registered for the
/// device, as kernels on the ring need) and one consumer attached to it.
fn ring(ctx: &Context, name: &str, slots: u32) -> (Producer<Vmm>, Consumer<Vmm>) {
    let path = sock(name);
    let geometry = FrameGeometry::new(64, 16, PixelFormat::Gray8).unwrap();
    let config = ProducerConfig::new(&path, geometry, slots, SyncStrategy::GpuStreamOps);
    let mut producer = Producer::<Vmm>::create(ctx, config).unwrap();
    let consumer = std::thread::scope(|scope| {
        let attach = scope.spawn(|| attach(ctx, &path));
        producer.wait_for_consumers(1, Duration::from_secs(10)).unwrap();
        attach.join().unwrap()
    });
    (producer, consumer)
}

fn attach(ctx: &Context, path: &Path) -> Consumer<Vmm> {
    let options = AttachOptions { name: "lease".into(), ..AttachOptions::default() };
    Consumer::<Vmm>::attach(ctx, path, &options).unwrap()
}

/// Launches the persistent consumer kernel on `consumer`'s ring for 100 frames that never come, waiting at most
/// `per_frame` for each; returns how it ended and when, after the launch.
fn wait_for_nothing(ctx: &Context, consumer: &mut Consumer<Vmm>, per_frame: Duration) -> (PersistentOutcome, Duration) {
    let kernel = PersistentVerify::load(ctx).unwrap();
    let stream = Stream::new(ctx).unwrap();
    let start = Instant::now();
    kernel.launch(consumer, &stream, 100, per_frame).unwrap();
    let result = kernel.finish(consumer, per_frame + Duration::from_secs(10)).unwrap();
    assert_eq!(result.frames, 0, "{result:?}");
    (result.outcome, start.elapsed())
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn a_persistent_consumer_whose_lease_runs_out_leaves_as_orphaned() {
    let ctx = ctx();
    let (_producer, mut consumer) = ring(&ctx, "orphan-consumer", 2);
    // The heartbeat moves every 10 ms: a lease of 1 ms runs out between two beats, though the process lives.
    consumer.set_kernel_lease(KernelLease::After(Duration::from_millis(1)));
    let (outcome, took) = wait_for_nothing(&ctx, &mut consumer, Duration::from_secs(5));
    assert_eq!(outcome, PersistentOutcome::Orphaned, "after {took:?}");
    assert!(took < Duration::from_secs(1), "orphaned after {took:?}, not within a few heartbeats");
    println!(
        "a 1 ms lease: the persistent consumer left as orphaned {:.1} ms after its launch",
        took.as_secs_f64() * 1e3
    );
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn the_heartbeat_keeps_a_waiting_persistent_consumer_alive_past_its_lease() {
    let ctx = ctx();
    let (_producer, mut consumer) = ring(&ctx, "alive", 2);
    assert_eq!(consumer.kernel_lease(), KernelLease::from_env());
    consumer.set_kernel_lease(KernelLease::After(KernelLease::DEFAULT));
    let per_frame = Duration::from_millis(600);
    let (outcome, took) = wait_for_nothing(&ctx, &mut consumer, per_frame);
    assert_eq!(outcome, PersistentOutcome::TimedOut, "after {took:?}: the live process's kernel was not orphaned");
    assert!(took >= per_frame - Duration::from_millis(50), "{took:?}: it left before its timeout");
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn a_persistent_producer_whose_lease_runs_out_leaves_as_orphaned() {
    let ctx = ctx();
    // One slot: frame 0 is published, frame 1 waits for the consumer's release of it, which never comes.
    let (mut producer, _consumer) = ring(&ctx, "orphan-producer", 1);
    producer.set_kernel_lease(KernelLease::After(Duration::from_millis(1)));
    let kernel = PersistentFill::load(&ctx).unwrap();
    let stream = Stream::new(&ctx).unwrap();
    let start = Instant::now();
    kernel.launch(&mut producer, &stream, 100, Duration::from_secs(5)).unwrap();
    let result = kernel.finish(&mut producer, Duration::from_secs(15)).unwrap();
    let took = start.elapsed();
    assert_eq!(result.outcome, PersistentOutcome::Orphaned, "{result:?} after {took:?}");
    assert_eq!(result.frames, 1, "frame 0 went out before the wait: {result:?}");
    assert!(took < Duration::from_secs(1), "orphaned after {took:?}");
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn an_evicted_consumers_persistent_kernel_leaves_on_the_producers_word_and_waits_without_the_lease() {
    let ctx = ctx();
    for lease in [KernelLease::After(KernelLease::DEFAULT), KernelLease::Off] {
        let (mut producer, mut consumer) = ring(&ctx, &format!("evicted-{}", lease != KernelLease::Off), 2);
        consumer.set_kernel_lease(lease);
        let kernel = PersistentVerify::load(&ctx).unwrap();
        let stream = Stream::new(&ctx).unwrap();
        let per_frame = Duration::from_secs(2);
        kernel.launch(&mut consumer, &stream, 100, per_frame).unwrap();
        std::thread::sleep(Duration::from_millis(50));
        let evicted_at = Instant::now();
        let id = producer.consumer_ids()[0];
        assert!(producer.evict(id).unwrap());
        let result = kernel.finish(&mut consumer, Duration::from_secs(15)).unwrap();
        let took = evicted_at.elapsed();
        match lease {
            KernelLease::Off => {
                assert_eq!(result.outcome, PersistentOutcome::TimedOut, "{lease:?}: {result:?} after {took:?}");
                assert!(took >= per_frame - Duration::from_millis(200), "{took:?}");
            }
            KernelLease::After(_) => {
                assert_eq!(result.outcome, PersistentOutcome::Aborted, "{lease:?}: {result:?} after {took:?}");
                assert!(took < Duration::from_millis(500), "it left {took:?} after the eviction");
                println!("evicted: the consumer's kernel left {:.1} ms after", took.as_secs_f64() * 1e3);
            }
        }
    }
}

/// SIGKILL of the process whose persistent kernel runs, under MPS, with the lease on: no other client faults, and the
/// survivor gets its typed outcome. One trial per victim (the stress run's mps-kills cells measure rates, with the
/// lease on and off); run last in the MPS pass, since a fault would take the MPS server's other clients with it.
mod under_mps {
    use std::time::Duration;

    use super::common::{consumer_with, producer_on, require_mps, socket};
    use super::{Context, Stream};

    /// This process as a bystander client of the same MPS server: a context, a stream, work queued and waited for,
    /// which a faulted server fails with error 700.
    fn bystander_is_fine() -> Result<(), String> {
        let ctx = Context::for_ordinal(0).map_err(|e| e.to_string())?;
        let stream = Stream::new(&ctx).map_err(|e| e.to_string())?;
        let buffer = gpu_ipc::driver::DeviceBuffer::alloc(&ctx, 1 << 20).map_err(|e| e.to_string())?;
        for _ in 0..20 {
            buffer.write(0, &[7u64; 1024]).map_err(|e| e.to_string())?;
            stream.synchronize().map_err(|e| e.to_string())?;
            std::thread::sleep(Duration::from_millis(25));
        }
        Ok(())
    }

    #[test]
    #[ignore = "needs a CUDA GPU with MPS running (the MPS pass of scripts/gpu-suite.sh runs it)"]
    fn a_killed_persistent_producer_leaves_by_itself_and_faults_no_client() {
        require_mps();
        let sock = socket("lease-kill-producer");
        let extra = ["--width", "640", "--height", "360", "--persistent"];
        let mut p = producer_on("vmm", "gpu-stream-ops", &sock, 200_000, 1, 4, &extra);
        let c = consumer_with("survivor", "vmm", &sock, 0, &[]);
        c.wait_for_line("frame 1000", Duration::from_secs(60));
        p.kill9();
        let _ = p.finish(Duration::from_secs(5));
        let (status, _, json) = c.finish(Duration::from_secs(10));
        assert_eq!(status.code(), Some(4), "the survivor: ProducerGone, exit 4: {status} {json}");
        assert_eq!(json["mismatched_words"], 0, "{json}");
        bystander_is_fine().unwrap();
    }

    #[test]
    #[ignore = "needs a CUDA GPU with MPS running (the MPS pass of scripts/gpu-suite.sh runs it)"]
    fn a_killed_persistent_consumer_leaves_by_itself_and_faults_no_client() {
        require_mps();
        let sock = socket("lease-kill-consumer");
        let extra = ["--width", "640", "--height", "360", "--progress-every", "100"];
        let p = producer_on("vmm", "gpu-stream-ops", &sock, 50_000, 1, 4, &extra);
        let mut c = consumer_with("victim", "vmm", &sock, 50_000, &["--persistent"]);
        p.wait_for_line("frame 1000", Duration::from_secs(60));
        c.kill9();
        let _ = c.finish(Duration::from_secs(5));
        let (status, _, json) = p.finish(Duration::from_secs(60));
        assert!(status.success(), "the producer: every frame, one consumer lost: {status} {json}");
        assert_eq!(json["consumers_lost"], 1, "{json}");
        bystander_is_fine().unwrap();
    }
}
