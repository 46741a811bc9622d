//! The frame-sharing API end to end on a real GPU, in separate processes: for each backend and each sync
//! strategy, one producer and two consumers exchange 10,000 4K RGB frames, every frame checked by a kernel;
//! a consumer killed with SIGKILL mid-run leaves the others running to the end; a producer killed with SIGKILL
//! gives every consumer `ProducerGone` within a second; a ring of 256 slots (control-block layout 2) serves a late
//! joiner and survives a killed consumer. Ignored without a GPU.
//!
//! With `GPU_IPC_RESULTS_DIR` set, each run's figures are appended to `frames-<GPU_IPC_RESULTS_TAG>.jsonl`
//! there (the GPU suite runs this file once without MPS and once under a private MPS daemon).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::{Duration, Instant};

use common::{consumer, producer, socket, without_mps};

const BACKENDS: [&str; 2] = ["legacy", "vmm"];
const FRAMES: u64 = 10_000;

fn record(result: &serde_json::Value) {
    common::record("frames", result);
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn every_backend_and_strategy_moves_10000_verified_4k_frames_to_two_consumers() {
    for backend in BACKENDS {
        for sync in without_mps() {
            let sock = socket(&format!("{backend}-{sync}"));
            let p = producer(backend, sync, &sock, FRAMES, 2);
            let a = consumer("a", backend, &sock, FRAMES);
            let b = consumer("b", backend, &sock, FRAMES);
            let (ps, _, pj) = p.finish(Duration::from_secs(120));
            let (as_, _, aj) = a.finish(Duration::from_secs(10));
            let (bs, _, bj) = b.finish(Duration::from_secs(10));
            assert!(ps.success() && as_.success() && bs.success(), "{backend}/{sync}: {ps} {as_} {bs}");
            for c in [&aj, &bj] {
                assert_eq!(c["frames"], FRAMES, "{backend}/{sync}: {c}");
                assert_eq!(c["first_seq"], 0, "{backend}/{sync}: {c}");
                assert_eq!(c["mismatched_words"], 0, "{backend}/{sync}: {c}");
            }
            assert_eq!(pj["frames"], FRAMES);
            assert_eq!(pj["consumers_at_start"], 2, "{pj}");
            assert_eq!(pj["consumers_lost"], 0, "{pj}");
            record(&serde_json::json!({
                "test": "throughput", "backend": backend, "sync": sync,
                "producer": pj, "consumers": [aj, bj],
            }));
        }
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn a_consumer_killed_mid_run_stalls_nobody() {
    for backend in BACKENDS {
        for sync in without_mps() {
            let sock = socket(&format!("kill-consumer-{backend}-{sync}"));
            let p = producer(backend, sync, &sock, FRAMES, 2);
            let mut victim = consumer("victim", backend, &sock, FRAMES);
            let survivor = consumer("survivor", backend, &sock, FRAMES);
            victim.wait_for_line("frame 1000", Duration::from_secs(60));
            victim.kill9();
            let (vs, _, _) = victim.finish(Duration::from_secs(5));
            assert!(!vs.success());
            let (ps, _, pj) = p.finish(Duration::from_secs(120));
            let (ss, _, sj) = survivor.finish(Duration::from_secs(10));
            assert!(ps.success(), "{backend}/{sync}: producer {ps}");
            assert!(ss.success(), "{backend}/{sync}: survivor {ss}");
            assert_eq!(sj["frames"], FRAMES, "{backend}/{sync}: {sj}");
            assert_eq!(sj["mismatched_words"], 0, "{backend}/{sync}: {sj}");
            assert_eq!(pj["consumers_lost"], 1, "{backend}/{sync}: {pj}");
            record(&serde_json::json!({"test": "kill-consumer", "backend": backend, "sync": sync,
                "producer": pj, "survivor": sj}));
        }
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn a_producer_killed_mid_run_gives_consumers_producer_gone_within_a_second() {
    for backend in BACKENDS {
        for sync in without_mps() {
            let sock = socket(&format!("kill-producer-{backend}-{sync}"));
            let mut p = producer(backend, sync, &sock, u64::MAX / 4, 2);
            let a = consumer("a", backend, &sock, 0);
            let b = consumer("b", backend, &sock, 0);
            a.wait_for_line("frame 1000", Duration::from_secs(60));
            b.wait_for_line("frame 1000", Duration::from_secs(60));
            p.kill9();
            let killed = Instant::now();
            let (as_, _, aj) = a.finish(Duration::from_secs(5));
            let a_after = killed.elapsed();
            let (bs, _, bj) = b.finish(Duration::from_secs(5));
            let b_after = killed.elapsed();
            let _ = p.finish(Duration::from_secs(5));
            for (status, after, json) in [(as_, a_after, &aj), (bs, b_after, &bj)] {
                assert_eq!(status.code(), Some(4), "{backend}/{sync}: consumer exit {status}, {json}");
                assert!(json["producer_gone"].is_string(), "{backend}/{sync}: {json}");
                assert!(after < Duration::from_secs(1), "{backend}/{sync}: ProducerGone after {after:?}");
            }
            record(&serde_json::json!({"test": "kill-producer", "backend": backend, "sync": sync,
                "a_ms": a_after.as_secs_f64() * 1e3, "b_ms": b_after.as_secs_f64() * 1e3}));
        }
    }
}

/// A ring of tensors on each GPU backend (f32 [4, 1024, 1024], 16 MiB a slot): two consumers learn the layout
/// from the offer and the verify kernel checks every word of every slot.
#[test]
#[ignore = "needs a CUDA GPU"]
fn a_ring_of_tensors_moves_verified_slots_on_every_backend() {
    const TENSORS: u64 = 2000;
    for backend in BACKENDS {
        for sync in ["ipc-event", "gpu-stream-ops"] {
            let sock = socket(&format!("tensor-{backend}-{sync}"));
            let p = common::producer_with(backend, sync, &sock, TENSORS, 2, &["--tensor", "f32:4x1024x1024"]);
            let a = consumer("a", backend, &sock, TENSORS);
            let b = consumer("b", backend, &sock, TENSORS);
            let (ps, _, pj) = p.finish(Duration::from_secs(120));
            let (as_, _, aj) = a.finish(Duration::from_secs(10));
            let (bs, _, bj) = b.finish(Duration::from_secs(10));
            assert!(ps.success() && as_.success() && bs.success(), "{backend}/{sync}: {ps} {as_} {bs}");
            for c in [&aj, &bj] {
                assert_eq!(c["slot"], "float32 [4, 1024, 1024] tensors (16777216 bytes)", "{backend}/{sync}: {c}");
                assert_eq!(c["frames"], TENSORS, "{backend}/{sync}: {c}");
                assert_eq!(c["mismatched_words"], 0, "{backend}/{sync}: {c}");
            }
            record(&serde_json::json!({"test": "tensor-ring", "backend": backend, "sync": sync,
                "producer": pj, "consumers": [aj, bj]}));
        }
    }
}

/// A consumer reading "until the producer goes" ends with status 0 after a producer that exits cleanly, with
/// every backend and strategy (GPU-side ones included: frames their waits were queued for past the end are
/// neither read nor mismatched), and says how many frames it read.
#[test]
#[ignore = "needs a CUDA GPU"]
fn reading_until_the_end_of_the_stream_exits_0_with_every_backend_and_strategy() {
    const ENDING: u64 = 2000;
    for backend in BACKENDS {
        for sync in without_mps() {
            let sock = socket(&format!("eos-{backend}-{sync}"));
            let p = producer(backend, sync, &sock, ENDING, 1);
            let c = consumer("until-end", backend, &sock, 0);
            let (ps, _, pj) = p.finish(Duration::from_secs(120));
            let (cs, _, cj) = c.finish(Duration::from_secs(10));
            assert!(ps.success(), "{backend}/{sync}: producer {ps} {pj}");
            assert_eq!(cs.code(), Some(0), "{backend}/{sync}: consumer {cs} {cj}");
            assert_eq!(cj["frames"], ENDING, "{backend}/{sync}: {cj}");
            assert_eq!(cj["end_of_stream_after"], ENDING, "{backend}/{sync}: {cj}");
            assert_eq!(cj["mismatched_words"], 0, "{backend}/{sync}: {cj}");
            assert!(cj["producer_gone"].is_null(), "{backend}/{sync}: {cj}");
            record(&serde_json::json!({"test": "end-of-stream", "backend": backend, "sync": sync,
                "frames": cj["frames"], "frames_past_end": cj["frames_past_end"]}));
        }
    }
}

/// A ring of 256 slots (control-block layout 2, 1080p rgb8 frames: 1.6 GB a ring) on each GPU backend with the
/// strategies a deeper ring lets run ahead: two consumers from the start and one that joins late read every frame
/// verified by the kernel, and a fourth, SIGKILLed mid-run, stalls nobody.
#[test]
#[ignore = "needs a CUDA GPU"]
fn a_256_slot_ring_serves_a_late_joiner_and_survives_a_killed_consumer() {
    const DEEP: [&str; 5] = ["--width", "1920", "--height", "1080", "--until-stdin-closes"];
    for backend in BACKENDS {
        for sync in ["ipc-event", "gpu-stream-ops"] {
            let sock = socket(&format!("deep-{backend}-{sync}"));
            let mut p = common::producer_on(backend, sync, &sock, 0, 2, 256, &DEEP);
            let a = consumer("a", backend, &sock, 0);
            let b = consumer("b", backend, &sock, 0);
            a.wait_for_line("frame 1000", Duration::from_secs(60));
            let late = consumer("late", backend, &sock, 0);
            let mut victim = consumer("victim", backend, &sock, 0);
            victim.wait_for_line("frame 500", Duration::from_secs(60));
            victim.kill9();
            let (vs, _, _) = victim.finish(Duration::from_secs(5));
            assert!(!vs.success());
            late.wait_for_line("frame 2000", Duration::from_secs(60));
            p.close_stdin();
            let (ps, _, pj) = p.finish(Duration::from_secs(120));
            assert!(ps.success(), "{backend}/{sync}: producer {ps} {pj}");
            assert_eq!(pj["slots"], 256, "{pj}");
            let total = pj["frames"].as_u64().unwrap();
            assert_eq!(pj["consumers_lost"], 1, "{backend}/{sync}: {pj}");
            let mut readers = Vec::new();
            for c in [a, b, late] {
                let (status, _, json) = c.finish(Duration::from_secs(10));
                assert_eq!(status.code(), Some(0), "{backend}/{sync}: {json}");
                assert_eq!(json["protocol_version"], gpu_ipc::core::wire::PROTOCOL_VERSION, "{backend}/{sync}: {json}");
                assert_eq!(json["mismatched_words"], 0, "{backend}/{sync}: {json}");
                assert_eq!(json["end_of_stream_after"], total, "{backend}/{sync}: {json}");
                let first = json["first_seq"].as_u64().unwrap();
                assert_eq!(json["frames"].as_u64().unwrap(), total - first, "{backend}/{sync}: {json}");
                readers.push(json);
            }
            assert!(readers[2]["first_seq"].as_u64().unwrap() > 0, "{backend}/{sync}: the late one joined late");
            record(&serde_json::json!({"test": "deep-ring", "backend": backend, "sync": sync,
                "producer": pj, "consumers": readers}));
        }
    }
}
