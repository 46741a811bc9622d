//! The three-stage pipeline on a real GPU, one process per stage, 4K RGB frames: `generate` (A) -> `transform` (B,
//! `gpu_ipc_xor_words` inverting every bit) -> `verify` (C, the verify kernel on every word of every frame). Each
//! stage with its own strategy, both backends and a stage between two backends; the end of A's stream reaches C with
//! every frame and nothing past it (GPU-side waits released by the end are never sent on); B SIGKILLed and
//! replaced, A SIGKILLed: the others say so within a second, nothing hangs, no wrong word is counted. Ignored
//! without a GPU.
//!
//! With `GPU_IPC_RESULTS_DIR` set, each run's summaries are appended to `pipeline-<GPU_IPC_RESULTS_TAG>.jsonl`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::{Duration, Instant};

use common::{first_stage_killed, generate, socket, transform, verify};

const FRAMES: u64 = 2000;
/// (A's strategy, B's strategy): every strategy upstream and downstream of the stage, GPU-side ones on both sides.
const SYNCS: [(&str, &str); 4] = [
    ("cpu-spin", "gpu-stream-ops"),
    ("gpu-stream-ops", "ipc-event"),
    ("ipc-event", "cpu-sleep"),
    ("gpu-stream-ops", "gpu-stream-ops"),
];
const T: Duration = Duration::from_secs(120);

fn record(result: &serde_json::Value) {
    common::record("pipeline", result);
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn every_frame_goes_through_three_stages_verified_with_every_backend_and_strategy() {
    let mut runs: Vec<(&str, &str, &str, &str)> = Vec::new();
    for backend in ["legacy", "vmm"] {
        runs.extend(SYNCS.iter().map(|&(sa, sb)| (backend, backend, sa, sb)));
    }
    // A stage between two backends: legacy upstream, vmm downstream.
    runs.push(("legacy", "vmm", "gpu-stream-ops", "gpu-stream-ops"));
    for (up, down, sync_a, sync_b) in runs {
        let what = format!("{up}/{sync_a} -> {down}/{sync_b}");
        let tag = format!("{up}-{down}-{sync_a}-{sync_b}");
        let (a, b) = (socket(&format!("gpipe-a-{tag}")), socket(&format!("gpipe-b-{tag}")));
        let c = verify(&b, down, &["--first-upstream", "0"]);
        let t = transform("B transform", &a, &b, (up, down), sync_b, &[]);
        let g = generate(&a, up, sync_a, &["--frames", &FRAMES.to_string()]);
        let (gs, _, gj) = g.finish(T);
        let (ts, _, tj) = t.finish(Duration::from_secs(20));
        let (cs, _, cj) = c.finish(Duration::from_secs(20));
        assert!(gs.success() && ts.success(), "{what}: A {gs} {gj}, B {ts} {tj}");
        assert_eq!(cs.code(), Some(0), "{what}: C {cj}");
        assert_eq!((tj["frames"].as_u64(), tj["upstream_published"].as_u64()), (Some(FRAMES), Some(FRAMES)), "{tj}");
        // Exactly the frames A published: none a GPU-side wait queued past the end went on.
        assert_eq!(cj["frames"], FRAMES, "{what}: {cj}");
        assert_eq!(cj["end_of_stream_after"], FRAMES, "{what}: {cj}");
        assert_eq!(cj["mismatched_words"], 0, "{what}: {cj}");
        assert_eq!(cj["attachments"][0]["last_upstream"], FRAMES - 1, "{what}: {cj}");
        record(&serde_json::json!({"test": "three-stages", "upstream": up, "downstream": down,
            "sync_a": sync_a, "sync_b": sync_b, "generate": gj, "transform": tj, "verify": cj}));
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn the_middle_stage_killed_is_reported_within_a_second_and_replaced_with_no_wrong_word() {
    for (backend, sync) in [("vmm", "gpu-stream-ops"), ("legacy", "cpu-spin"), ("vmm", "ipc-event")] {
        let what = format!("{backend}/{sync}");
        let (a, b) =
            (socket(&format!("gpipe-kill-b-a-{backend}-{sync}")), socket(&format!("gpipe-kill-b-b-{backend}-{sync}")));
        let c = verify(&b, backend, &["--first-upstream", "0", "--reattach", "--progress-every", "500"]);
        let mut t1 = transform("B1 transform", &a, &b, (backend, backend), sync, &[]);
        let g = generate(&a, backend, sync, &["--frames", "6000", "--interval-us", "500"]);
        c.wait_for_line("frame 1000", T);
        t1.kill9();
        let killed = Instant::now();
        let within = killed + Duration::from_secs(1);
        c.wait_for_line("is gone", within.saturating_duration_since(Instant::now()));
        let c_after = killed.elapsed();
        g.wait_for_line("no consumer attached any more", within.saturating_duration_since(Instant::now()));
        let a_after = killed.elapsed();
        assert!(
            c_after < Duration::from_secs(1) && a_after < Duration::from_secs(1),
            "{what}: {c_after:?} {a_after:?}"
        );
        let _ = t1.finish(Duration::from_secs(5));
        let t2 = transform("B2 transform", &a, &b, (backend, backend), sync, &[]);
        let (gs, _, gj) = g.finish(T);
        let (t2s, _, tj) = t2.finish(Duration::from_secs(20));
        let (cs, _, cj) = c.finish(Duration::from_secs(20));
        assert!(gs.success() && t2s.success(), "{what}: A {gj}, B2 {tj}");
        assert_eq!(cs.code(), Some(0), "{what}: C {cj}");
        let attachments = cj["attachments"].as_array().unwrap();
        assert_eq!(attachments.len(), 2, "{what}: {cj}");
        assert_eq!(attachments[1]["first_upstream"], tj["first_upstream"], "{what}: {cj} {tj}");
        assert_eq!(attachments[1]["last_upstream"], 5999, "{what}: {cj}");
        assert_eq!((cj["mismatched_words"].as_u64(), cj["out_of_order"].as_u64()), (Some(0), Some(0)), "{cj}");
        record(&serde_json::json!({"test": "kill-middle", "backend": backend, "sync": sync,
            "c_ms": c_after.as_secs_f64() * 1e3, "a_ms": a_after.as_secs_f64() * 1e3,
            "generate": gj, "transform": tj, "verify": cj}));
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn the_first_stage_killed_ends_the_others_with_producer_gone_within_a_second() {
    for (backend, sync) in [("vmm", "gpu-stream-ops"), ("legacy", "cpu-spin")] {
        let seen = first_stage_killed(&format!("gpipe-kill-a-{backend}-{sync}"), backend, sync, &[], 1000);
        record(&serde_json::json!({"test": "kill-first", "backend": backend, "sync": sync, "verify": seen}));
    }
}
