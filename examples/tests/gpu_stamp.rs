//! Frames a dead producer never wrote never reach a kernel unknowingly, and the ring's device API for persistent
//! kernels, on a real GPU with the example programs in separate processes:
//! - a producer SIGKILLed mid-stream with gpu-stream-ops and gpu-poll, on both backends: every consumer exits with
//!   `ProducerGone`, reports 0 mismatched words (each frame is checked behind its stamp), and its skipped frames are
//!   at most the frames it took that the producer never published;
//! - `consumer --persistent` (one persistent kernel on `gpu_ipc_ring.cuh`, no launch per frame) reads a stream to
//!   its end with 0 mismatched words, leaves at once when its producer is killed, and its round trip through a
//!   one-slot ring is printed (`device API round trip`).
//!
//! gpu-poll and persistent kernels need MPS (without it the kernels of two processes take turns on the GPU, a time
//! slice per frame): those cases sit in `under_mps`, ignored with that reason; the MPS pass of scripts/gpu-suite.sh
//! runs them (`--run-ignored only`, this binary) under its private MPS daemon, its pass without MPS leaves them out,
//! and one asked for where MPS does not run fails (`common::require_mps`). Ignored without a GPU.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::path::Path;
use std::time::Duration;

use common::{BACKENDS, Proc, consumer, consumer_with, producer, producer_on, socket};

fn record(result: &serde_json::Value) {
    common::record("stamp", result);
}

/// A producer of small frames (640x360 rgb8) on `slots` slots, for one consumer, reporting every 500 frames.
fn small_producer(backend: &str, sync: &str, sock: &Path, frames: u64, slots: u32) -> Proc {
    let extra = ["--width", "640", "--height", "360", "--progress-every", "500"];
    producer_on(backend, sync, sock, frames, 1, slots, &extra)
}

/// A `consumer --persistent` of `frames` frames.
fn persistent_consumer(backend: &str, sock: &Path, frames: u64) -> Proc {
    consumer_with("persistent", backend, sock, frames, &["--persistent"])
}

/// Frames a SIGKILLed producer's stream may still publish (its run-ahead depth for 2 slots: max(2 N, 32)).
const LATE_STREAM_FRAMES: u64 = 32;

/// A producer of `sync` on `backend` SIGKILLed mid-stream before two consumers: each exits with `ProducerGone`,
/// reports 0 mismatched words, and skips at most the frames the producer never published.
fn stamp_kill(backend: &str, sync: &str) {
    let sock = socket(&format!("stamp-kill-{backend}-{sync}"));
    let mut p = producer(backend, sync, &sock, u64::MAX / 4, 2);
    let a = consumer("a", backend, &sock, 0);
    let b = consumer("b", backend, &sock, 0);
    a.wait_for_line("frame 1000", Duration::from_secs(120));
    b.wait_for_line("frame 1000", Duration::from_secs(120));
    p.kill9();
    let (a_status, _, aj) = a.finish(Duration::from_secs(10));
    let (b_status, _, bj) = b.finish(Duration::from_secs(10));
    let _ = p.finish(Duration::from_secs(5));
    for (status, json) in [(a_status, &aj), (b_status, &bj)] {
        assert_eq!(status.code(), Some(4), "{backend}/{sync}: consumer exit {status}, {json}");
        assert_eq!(json["mismatched_words"], 0, "{backend}/{sync}: {json}");
        let skipped = json["skipped_frames"].as_u64();
        let never = json["frames_never_published"].as_u64().unwrap();
        assert!(skipped.is_some(), "{backend}/{sync}: frames were not checked behind their stamp: {json}");
        // A dead producer's stream may still publish the frames it had queued (at most its run-ahead depth,
        // max(2 N, 32) frames) after a consumer's stamp check skipped them and before its watchdog counted what was
        // published (docs/ring.md, "Detach and dead peers"): skipping those is the safe side. More than that would
        // be frames the producer had published long before.
        assert!(
            skipped.unwrap() <= never + LATE_STREAM_FRAMES,
            "{backend}/{sync}: skipped frames the producer had published: {json}"
        );
    }
    println!(
        "stamp kill {backend}/{sync}: mismatched words {} and {}; skipped frames {} and {} (never published {} and {})",
        aj["mismatched_words"],
        bj["mismatched_words"],
        aj["skipped_frames"],
        bj["skipped_frames"],
        aj["frames_never_published"],
        bj["frames_never_published"]
    );
    record(&serde_json::json!({"test": "kill-producer-stamped", "backend": backend, "sync": sync,
        "consumers": [aj, bj]}));
}

/// gpu-stream-ops needs no MPS (its waits are the driver's stream memory operations): both passes run it.
#[test]
#[ignore = "needs a CUDA GPU"]
fn after_a_producer_sigkill_gpu_stream_ops_consumers_skip_the_frames_it_never_wrote_and_mismatch_no_word() {
    for backend in BACKENDS {
        stamp_kill(backend, "gpu-stream-ops");
    }
}

/// The cases that need MPS: ignored unless asked for, failing where MPS does not run.
mod under_mps {
    use std::time::{Duration, Instant};

    use super::common::{BACKENDS, gpu_side, require_mps, socket};
    use super::{persistent_consumer, record, small_producer, stamp_kill};

    #[test]
    #[ignore = "needs a CUDA GPU with MPS running (the MPS pass of scripts/gpu-suite.sh runs it)"]
    fn after_a_producer_sigkill_gpu_poll_consumers_skip_the_frames_it_never_wrote_and_mismatch_no_word() {
        require_mps();
        for backend in BACKENDS {
            stamp_kill(backend, "gpu-poll");
        }
    }

    #[test]
    #[ignore = "needs a CUDA GPU with MPS running (the MPS pass of scripts/gpu-suite.sh runs it)"]
    fn a_persistent_consumer_reads_a_stream_to_its_end_and_leaves_when_its_producer_is_killed() {
        require_mps();
        for backend in BACKENDS {
            for sync in gpu_side() {
                let sock = socket(&format!("persistent-{backend}-{sync}"));
                let p = small_producer(backend, sync, &sock, 3000, 4);
                let c = persistent_consumer(backend, &sock, 3000);
                let (ps, _, pj) = p.finish(Duration::from_secs(120));
                let (cs, _, cj) = c.finish(Duration::from_secs(30));
                assert!(ps.success() && cs.success(), "{backend}/{sync}: producer {ps} {pj}, consumer {cs} {cj}");
                assert_eq!(cj["frames"], 3000, "{backend}/{sync}: {cj}");
                assert_eq!(cj["mismatched_words"], 0, "{backend}/{sync}: {cj}");
                assert_eq!(cj["persistent"]["outcome"], "done", "{backend}/{sync}: {cj}");

                let sock = socket(&format!("persistent-kill-{backend}-{sync}"));
                let mut p = small_producer(backend, sync, &sock, u64::MAX / 4, 4);
                let c = persistent_consumer(backend, &sock, u64::MAX / 4);
                p.wait_for_line("frame 1000", Duration::from_secs(120));
                p.kill9();
                let killed = Instant::now();
                let (cs, _, cj) = c.finish(Duration::from_secs(15));
                let after = killed.elapsed();
                let _ = p.finish(Duration::from_secs(5));
                assert_eq!(cs.code(), Some(4), "{backend}/{sync}: consumer exit {cs}, {cj}");
                assert_eq!(cj["mismatched_words"], 0, "{backend}/{sync}: {cj}");
                let outcome = cj["persistent"]["outcome"].as_str().unwrap_or_default().to_owned();
                assert!(outcome == "aborted" || outcome == "stamp-invalid", "{backend}/{sync}: {cj}");
                assert!(after < Duration::from_secs(2), "{backend}/{sync}: the persistent kernel left after {after:?}");
                println!("persistent kill {backend}/{sync}: left after {after:?} ({outcome}), {} frames", cj["frames"]);
                record(&serde_json::json!({"test": "persistent", "backend": backend, "sync": sync, "consumer": cj,
                    "left_after_kill_ms": after.as_secs_f64() * 1e3}));
            }
        }
    }

    /// A ring of 256 slots (control-block layout 2): the persistent kernel finds its counters through the descriptor's
    /// 8-byte strides, and reads every frame intact to the end of the stream.
    #[test]
    #[ignore = "needs a CUDA GPU with MPS running (the MPS pass of scripts/gpu-suite.sh runs it)"]
    fn a_persistent_consumer_reads_a_256_slot_ring() {
        require_mps();
        for backend in BACKENDS {
            for sync in gpu_side() {
                let sock = socket(&format!("persistent-deep-{backend}-{sync}"));
                let p = small_producer(backend, sync, &sock, 3000, 256);
                let c = persistent_consumer(backend, &sock, 3000);
                let (ps, _, pj) = p.finish(Duration::from_secs(120));
                let (cs, _, cj) = c.finish(Duration::from_secs(30));
                assert!(ps.success() && cs.success(), "{backend}/{sync}: producer {ps} {pj}, consumer {cs} {cj}");
                assert_eq!(pj["slots"], 256, "{pj}");
                assert_eq!(cj["frames"], 3000, "{backend}/{sync}: {cj}");
                assert_eq!(cj["mismatched_words"], 0, "{backend}/{sync}: {cj}");
                assert_eq!(cj["persistent"]["outcome"], "done", "{backend}/{sync}: {cj}");
            }
        }
    }

    /// A one-slot ring of small frames: the producer may write frame s + 1 only once the persistent kernel released
    /// frame s, so each frame costs one round trip (producer publish, kernel sees it, kernel releases, producer sees
    /// that) plus a small fill and check. Prints the figure; asserts only that every frame arrived intact.
    #[test]
    #[ignore = "needs a CUDA GPU with MPS running (the MPS pass of scripts/gpu-suite.sh runs it)"]
    fn device_api_round_trip_through_a_one_slot_ring() {
        const FRAMES: u64 = 20_000;
        require_mps();
        for sync in gpu_side() {
            let sock = socket(&format!("persistent-rtt-{sync}"));
            let p = small_producer("vmm", sync, &sock, FRAMES, 1);
            let c = persistent_consumer("vmm", &sock, FRAMES);
            let (ps, _, pj) = p.finish(Duration::from_secs(120));
            let (cs, _, cj) = c.finish(Duration::from_secs(30));
            assert!(ps.success() && cs.success(), "{sync}: producer {ps} {pj}, consumer {cs} {cj}");
            assert_eq!(cj["frames"], FRAMES, "{sync}: {cj}");
            assert_eq!(cj["mismatched_words"], 0, "{sync}: {cj}");
            let fps = pj["fps"].as_f64().unwrap();
            assert!(fps > 0.0, "{pj}");
            println!(
                "device API round trip ({sync} producer, persistent consumer, 1 slot, 640x360 rgb8): {:.2} us per frame \
                 ({fps:.0} frames/s)",
                1e6 / fps
            );
            record(&serde_json::json!({"test": "persistent-round-trip", "sync": sync, "us_per_frame": 1e6 / fps,
                "producer": pj, "consumer": cj}));
        }
    }
}
