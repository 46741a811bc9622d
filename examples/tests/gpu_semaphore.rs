//! The semaphore's stream side on a real GPU, between processes (the `semaphore` example program), for both
//! backends: a stream wait released by a CPU post of another process; a stream post taken by a CPU waiter; stream
//! waits released by the poison when the poster is SIGKILLed, and by an importer's watchdog when the owner is; a
//! dead waiter's queued stream waits swallowing no post; the status word each stream wait leaves for the work
//! queued after it (copied on the GPU right after the wait: a post, or the poison); and the round trips, CPU and stream, which are printed and
//! (with `GPU_IPC_RESULTS_DIR` set) appended to `semaphore-<GPU_IPC_RESULTS_TAG>.jsonl` there. Ignored without a
//! GPU.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::io::Write;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use common::{field, semaphore, semaphore_owner, semaphore_poster, semaphore_waiter, socket};

const BACKENDS: [&str; 2] = ["legacy", "vmm"];
/// How soon waiters must learn of a death.
const WITHIN: Duration = Duration::from_secs(1);
const FINISH: Duration = Duration::from_secs(60);

fn sock(backend: &str, tag: &str) -> PathBuf {
    socket(&format!("gpu-sem-{backend}-{tag}"))
}

fn done(name: &str, p: common::Proc) -> serde_json::Value {
    let (status, _, json) = p.finish(FINISH);
    assert!(status.success(), "{name}: {status}: {json}");
    assert_eq!(field(&json, "outcome"), "done", "{name}: {json}");
    json
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn a_stream_wait_is_released_by_a_cpu_post_of_another_process() {
    for backend in BACKENDS {
        let path = sock(backend, "stream-wait");
        let mut owner = semaphore_owner(backend, &path, 0);
        let w = semaphore_waiter("stream-waiter", backend, &path, 3, 30_000, &["--stream"]);
        std::thread::sleep(Duration::from_millis(200));
        let p = semaphore_poster("cpu-poster", backend, &path, 3, &[]);
        done("poster", p);
        let json = done("stream waiter", w);
        assert_eq!(field(&json, "count"), 3, "{backend}: {json}");
        assert_eq!(field(&json, "gpu_poisoned"), 0, "{backend}: the GPU saw posts release every wait: {json}");
        owner.close_stdin();
        let json = done("owner", owner);
        assert_eq!(field(&json, "value"), 0, "{backend}: {json}");
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn a_stream_post_is_taken_by_a_cpu_waiter_of_another_process() {
    for backend in BACKENDS {
        let path = sock(backend, "stream-post");
        let mut owner = semaphore_owner(backend, &path, 0);
        let w = semaphore_waiter("cpu-waiter", backend, &path, 5, 30_000, &[]);
        let p = semaphore_poster("stream-poster", backend, &path, 5, &["--stream"]);
        done("stream poster", p);
        let json = done("cpu waiter", w);
        assert_eq!(field(&json, "count"), 5, "{backend}: {json}");
        owner.close_stdin();
        done("owner", owner);
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn stream_waits_are_released_by_the_poison_when_the_poster_is_sigkilled() {
    for backend in BACKENDS {
        let path = sock(backend, "poster-killed");
        let mut owner = semaphore_owner(backend, &path, 0);
        let w = semaphore_waiter("stream-waiter", backend, &path, 10, 30_000, &["--stream", "--stream-ahead", "4"]);
        let mut p = semaphore_poster("poster", backend, &path, 2, &["--hold-secs", "60"]);
        p.wait_for_line("posted 2", Duration::from_secs(30));
        std::thread::sleep(Duration::from_millis(200));
        p.kill9();
        let killed = Instant::now();
        let (status, _, json) = w.finish(FINISH);
        let after = killed.elapsed();
        assert!(after < WITHIN, "{backend}: the stream waiter learnt of the death after {after:?}: {json}");
        assert_eq!(status.code(), Some(4), "{backend}: {json}");
        assert_eq!(field(&json, "outcome"), "poster-died", "{backend}: {json}");
        // Two posts came for the first four waits: the work queued after the other two saw the poison on the GPU.
        assert_eq!(field(&json, "gpu_poisoned"), 2, "{backend}: {json}");
        let _ = p.finish(FINISH);
        owner.close_stdin();
        let _ = owner.finish(FINISH);
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn stream_waits_are_released_by_an_importers_watchdog_when_the_owner_is_sigkilled() {
    for backend in BACKENDS {
        let path = sock(backend, "owner-killed");
        let mut owner = semaphore_owner(backend, &path, 0);
        let w = semaphore_waiter("stream-waiter", backend, &path, 4, 30_000, &["--stream", "--stream-ahead", "4"]);
        w.wait_for_line("stream waits queued", Duration::from_secs(30));
        owner.kill9();
        let killed = Instant::now();
        let (status, _, json) = w.finish(FINISH);
        let after = killed.elapsed();
        assert!(after < WITHIN, "{backend}: the stream waiter learnt of the death after {after:?}: {json}");
        assert_eq!(status.code(), Some(4), "{backend}: {json}");
        assert_eq!(field(&json, "outcome"), "owner-gone", "{backend}: {json}");
        assert_eq!(field(&json, "gpu_poisoned"), 4, "{backend}: {json}");
        let _ = owner.finish(FINISH);
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn a_waiter_killed_with_queued_stream_waits_swallows_no_post() {
    for backend in BACKENDS {
        let path = sock(backend, "waiter-killed");
        let mut owner = semaphore_owner(backend, &path, 0);
        let mut doomed = semaphore_waiter("doomed", backend, &path, 4, 30_000, &["--stream", "--stream-ahead", "4"]);
        doomed.wait_for_line("stream waits queued", Duration::from_secs(30));
        doomed.kill9();
        let _ = doomed.finish(FINISH);
        // Its four tickets are made good when the owner sees it go; then every post is a live waiter's.
        std::thread::sleep(Duration::from_millis(300));
        let w = semaphore_waiter("survivor", backend, &path, 2, 5_000, &[]);
        done("poster", semaphore_poster("poster", backend, &path, 2, &[]));
        let json = done("survivor", w);
        assert_eq!(field(&json, "count"), 2, "{backend}: {json}");
        owner.close_stdin();
        done("owner", owner);
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn round_trips_cpu_and_stream_between_two_processes() {
    for backend in BACKENDS {
        let p = semaphore("bench", backend, &["bench", "--rounds", "5000", "--mode", "both"]);
        let json = done("bench", p);
        let trips = field(&json, "round_trips").as_array().unwrap();
        assert_eq!(trips.len(), 2, "{backend}: cpu and stream: {json}");
        for trip in trips {
            let (p50, p99) = (trip["p50_us"].as_f64().unwrap(), trip["p99_us"].as_f64().unwrap());
            assert!(p50 > 0.0 && p50 <= p99, "{backend}: {trip}");
            eprintln!(
                "semaphore {backend}: {} over {}: p50 {p50:.1} us, p99 {p99:.1} us",
                trip["mode"], trip["rounds"]
            );
        }
        if let Some(dir) = std::env::var_os("GPU_IPC_RESULTS_DIR") {
            let tag = std::env::var("GPU_IPC_RESULTS_TAG").unwrap_or_else(|_| "default".into());
            let path = PathBuf::from(dir).join(format!("semaphore-{tag}.jsonl"));
            let mut file = std::fs::OpenOptions::new().create(true).append(true).open(path).unwrap();
            writeln!(file, "{}", serde_json::json!({ "test": "round-trip", "backend": backend, "bench": json }))
                .unwrap();
        }
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn a_stream_waiter_sigkilled_breaks_nothing_and_a_reset_makes_stream_waits_work_again() {
    for backend in BACKENDS {
        let path = sock(backend, "reset");
        let args = ["owner", "--socket", path.to_str().unwrap(), "--reset-when-poisoned"];
        let mut owner = semaphore("owner", backend, &args);
        owner.wait_for_line("ready", Duration::from_secs(30));
        // A stream waiter that never posted dies with waits queued: nothing breaks.
        let mut doomed = semaphore_waiter("doomed", backend, &path, 4, 30_000, &["--stream", "--stream-ahead", "4"]);
        doomed.wait_for_line("stream waits queued", Duration::from_secs(30));
        doomed.kill9();
        let _ = doomed.finish(FINISH);
        // A poster that posted dies: poisoned, then reset by the owner.
        let mut p = semaphore_poster("doomed-poster", backend, &path, 1, &["--stream", "--hold-secs", "60"]);
        p.wait_for_line("posted 1", Duration::from_secs(30));
        p.kill9();
        let _ = p.finish(FINISH);
        owner.wait_for_line("owner: reset (value", Duration::from_secs(10));
        let w = semaphore_waiter("stream-waiter", backend, &path, 3, 30_000, &["--stream"]);
        done("poster", semaphore_poster("poster", backend, &path, 3, &["--stream"]));
        let json = done("stream waiter", w);
        assert_eq!((field(&json, "count"), field(&json, "gpu_poisoned")), (&3.into(), &0.into()), "{backend}: {json}");
        owner.close_stdin();
        let json = done("owner", owner);
        assert_eq!(field(&json, "resets"), 1, "{backend}: {json}");
    }
}
