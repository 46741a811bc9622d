//! GPU tests of the grid persistent kernels the resident rows run (`gpu_ipc_persistent_fill_grid`,
//! `gpu_ipc_persistent_verify_grid`): a producer and a consumer in this process, each kernel on its own stream of one
//! context (kernels of one context run at once without MPS, so these need no MPS; the bench's rows, one process a
//! side, do). Marked ignored: the GPU suite runs them (`scripts/gpu-suite.sh`, its first pass). In the bench's unit
//! tests rather than a test binary of their own: one binary less to build and stage.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use gpu_ipc::core::frames::{AttachOptions, Consumer, Producer, ProducerConfig};
use gpu_ipc::driver::{Context, Stream};
use gpu_ipc::kernels::launch::PatternKernels;
use gpu_ipc::kernels::persistent::{GridShape, PersistentFillGrid, PersistentOutcome, PersistentVerifyGrid};
use gpu_ipc::vmm::Vmm;
use gpu_ipc::{FrameGeometry, PixelFormat, SyncStrategy};

fn ctx() -> Context {
    Context::for_ordinal(0).unwrap()
}

fn sock(name: &str) -> PathBuf {
    std::env::temp_dir().join(format!("gpu-ipc-resident-{name}-{}.sock", std::process::id()))
}

/// A producer and one attached consumer on a ring of `slots` slots of `width` x `height` RGB frames (gpu-stream-ops:
/// the control block registered for the device, which kernels on the ring need).
fn ring(ctx: &Context, name: &str, width: u32, height: u32, slots: u32) -> (Producer<Vmm>, Consumer<Vmm>) {
    let path = sock(name);
    let geometry = FrameGeometry::new(width, height, PixelFormat::Rgb8).unwrap();
    let config = ProducerConfig::new(&path, geometry, slots, SyncStrategy::GpuStreamOps);
    let mut producer = Producer::<Vmm>::create(ctx, config).unwrap();
    let consumer = std::thread::scope(|scope| {
        let attach = scope.spawn(|| {
            let options = AttachOptions { name: name.into(), ..AttachOptions::default() };
            Consumer::<Vmm>::attach(ctx, &path, &options).unwrap()
        });
        producer.wait_for_consumers(1, Duration::from_secs(10)).unwrap();
        attach.join().unwrap()
    });
    (producer, consumer)
}

fn shape(ctx: &Context, bytes: u64) -> GridShape {
    GridShape::per_sm(bytes, ctx.device().sm_count().unwrap())
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn grid_kernels_move_4k_frames_intact_and_time_every_frame() {
    let ctx = ctx();
    let (mut producer, mut consumer) = ring(&ctx, "grid-4k", 3840, 2160, 4);
    let bytes = producer.slot_layout().bytes();
    let (fill_stream, verify_stream) = (Stream::new(&ctx).unwrap(), Stream::new(&ctx).unwrap());
    let mut fill = PersistentFillGrid::load(&ctx).unwrap();
    let mut verify = PersistentVerifyGrid::load(&ctx).unwrap();
    let frames = 500;
    let per_frame = Duration::from_secs(2);
    let start = Instant::now();
    verify.launch(&mut consumer, &verify_stream, frames, per_frame, shape(&ctx, bytes)).unwrap();
    fill.launch(&mut producer, &fill_stream, frames, per_frame, shape(&ctx, bytes)).unwrap();
    let made = fill.finish(&mut producer, Duration::from_secs(60)).unwrap();
    let checked = verify.finish(&mut consumer, Duration::from_secs(60)).unwrap();
    let wall = start.elapsed();
    assert_eq!((made.frames, made.outcome, made.stopped_at), (frames, PersistentOutcome::Done, frames), "{made:?}");
    assert_eq!((checked.frames, checked.outcome), (frames, PersistentOutcome::Done), "{checked:?}");
    assert_eq!(checked.mismatched_words, 0, "{checked:?}");
    assert_eq!(consumer.next_sequence(), frames, "the consumer takes the ring back after the kernel's frames");
    assert_eq!(producer.next_sequence(), frames);
    let published = fill.grid().frame_times().unwrap();
    let released = verify.grid().frame_times().unwrap();
    assert_eq!((published.len(), released.len()), (frames as usize, frames as usize));
    assert!(published.iter().chain(&released).all(|&t| t > 0), "every frame's time written");
    // Each frame is released after it was published, well within its bound (the times are read just after the stores,
    // so allow a few microseconds of their delays either way); frame s + 4 is published after frame s was released
    // (4 slots), with the same allowance.
    let slack = 50_000;
    for s in 0..frames as usize {
        assert!(
            released[s] + slack >= published[s],
            "frame {s}: released {} before published {}",
            released[s],
            published[s]
        );
        assert!(released[s] - published[s].min(released[s]) < 2_000_000_000, "frame {s}");
        if s + 4 < frames as usize {
            assert!(published[s + 4] + slack >= released[s], "frame {}: published before frame {s}'s release", s + 4);
        }
    }
    let window = released[frames as usize - 1] - released[0];
    let fps = (frames - 1) as f64 / (window as f64 / 1e9);
    eprintln!("grid kernels, 4 slots, 4K RGB: {fps:.0} FPS on the GPU's clock ({wall:?} wall for {frames} frames)");
    assert!(window > 0);
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn the_grid_consumer_counts_every_word_of_frames_with_the_wrong_pattern() {
    let ctx = ctx();
    let (mut producer, mut consumer) = ring(&ctx, "grid-wrong", 640, 360, 2);
    let bytes = producer.slot_layout().bytes();
    let stream = Stream::new(&ctx).unwrap();
    let verify_stream = Stream::new(&ctx).unwrap();
    let kernels = PatternKernels::load(&ctx).unwrap();
    let mut verify = PersistentVerifyGrid::load(&ctx).unwrap();
    let frames = 20;
    verify.launch(&mut consumer, &verify_stream, frames, Duration::from_secs(2), shape(&ctx, bytes)).unwrap();
    for seq in 0..frames {
        let lease = producer.acquire(Some(&stream), Duration::from_secs(5)).unwrap();
        // Every word of pattern(seq + 1) differs from pattern(seq)'s (docs/kernels.md, the pattern).
        kernels.fill(&stream, producer.slot_span(&lease).unwrap(), seq + 1).unwrap();
        producer.publish(lease, Some(&stream)).unwrap();
    }
    let checked = verify.finish(&mut consumer, Duration::from_secs(30)).unwrap();
    assert_eq!((checked.frames, checked.outcome), (frames, PersistentOutcome::Done), "{checked:?}");
    assert_eq!(checked.mismatched_words, frames * (bytes / 4), "{checked:?}");
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn a_grid_consumer_whose_frames_never_come_leaves_every_block_after_its_timeout() {
    let ctx = ctx();
    let (_producer, mut consumer) = ring(&ctx, "grid-nothing", 640, 360, 2);
    let bytes = consumer.slot_layout().bytes();
    let stream = Stream::new(&ctx).unwrap();
    let mut verify = PersistentVerifyGrid::load(&ctx).unwrap();
    let per_frame = Duration::from_millis(200);
    let start = Instant::now();
    verify.launch(&mut consumer, &stream, 100, per_frame, shape(&ctx, bytes)).unwrap();
    let checked = verify.finish(&mut consumer, Duration::from_secs(10)).unwrap();
    let took = start.elapsed();
    assert_eq!((checked.frames, checked.outcome, checked.stopped_at), (0, PersistentOutcome::TimedOut, 0));
    assert!(took >= per_frame && took < Duration::from_secs(5), "left after {took:?}");
    // A second launch on the same words works (they are reset).
    verify.launch(&mut consumer, &stream, 1, per_frame, shape(&ctx, bytes)).unwrap();
    let again = verify.finish(&mut consumer, Duration::from_secs(10)).unwrap();
    assert_eq!((again.frames, again.outcome), (0, PersistentOutcome::TimedOut));
}
