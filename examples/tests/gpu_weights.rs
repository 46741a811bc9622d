//! Weight sets on a real GPU, legacy and vmm: the `weights` program publishes generations of a set (291 tensors,
//! like Llama-3-8B's count, 256 MiB; and 19,000 small tensors) while a reader process follows them and checks every
//! byte and checksum of each generation it takes; the cold open and switch times are printed (and appended to
//! `weights-<GPU_IPC_RESULTS_TAG>.jsonl` in `GPU_IPC_RESULTS_DIR` when set). And the stream-ordered wait for a
//! generation (`weights stream-wait`): a CUDA stream held until another process publishes the generation, released
//! as "gone" within a second of the owner's SIGKILL, and released (without a hang) when its reader closes. Ignored
//! without a GPU.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{Proc, exe, field, socket};

fn bench(backend: &str, tensors: u64, mib: u64, generations: u64) -> serde_json::Value {
    let args = [
        "bench".to_owned(),
        "--json".to_owned(),
        "--backend".to_owned(),
        backend.to_owned(),
        "--tensors".to_owned(),
        tensors.to_string(),
        "--mib".to_owned(),
        mib.to_string(),
        "--generations".to_owned(),
        generations.to_string(),
    ];
    let out = Command::new(exe("weights")).args(&args).stderr(Stdio::inherit()).output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "weights {args:?}: {}\n{stdout}", out.status);
    let summary: serde_json::Value = serde_json::from_str(stdout.trim()).unwrap();
    common::record("weights", &summary);
    eprintln!("{summary}");
    summary
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn a_reader_process_verifies_every_generation_it_takes_on_both_backends() {
    for backend in ["legacy", "vmm"] {
        for (tensors, mib) in [(291, 256), (19_000, 64)] {
            let summary = bench(backend, tensors, mib, 5);
            let reader = &summary["reader"];
            assert_eq!(reader["tensors"], tensors, "{summary}");
            assert_eq!(reader["verified_generations"].as_u64(), Some(5), "{summary}");
        }
    }
}

/// `GONE_BIT` of a reader's status word.
const GONE_BIT: u64 = 1 << 62;
const FINISH: Duration = Duration::from_secs(60);

fn weights(name: &str, args: &[&str]) -> Proc {
    Proc::spawn(name, exe("weights"), &args.iter().map(|a| (*a).to_owned()).collect::<Vec<_>>())
}

/// An owner of a small set at a fresh socket, once it has published generation 1.
fn owner(backend: &str, tag: &str) -> (Proc, String) {
    let path = socket(&format!("gpu-weights-{backend}-{tag}")).display().to_string();
    let owner = weights("owner", &["owner", "--backend", backend, "--socket", &path]);
    owner.wait_for_line("published 1", Duration::from_secs(30));
    (owner, path)
}

fn stream_wait(backend: &str, path: &str, generation: u64, extra: &[&str]) -> Proc {
    let generation = generation.to_string();
    let mut args = vec!["stream-wait", "--json", "--backend", backend, "--socket", path, "--generation", &generation];
    args.extend_from_slice(extra);
    let p = weights("stream-wait", &args);
    p.wait_for_line("queued", Duration::from_secs(30));
    p
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn a_stream_wait_is_released_by_the_generation_another_process_publishes() {
    for backend in ["legacy", "vmm"] {
        let (mut owner, path) = owner(backend, "stream-publish");
        let waiter = stream_wait(backend, &path, 2, &[]);
        std::thread::sleep(Duration::from_millis(300));
        owner.write_line("publish");
        owner.wait_for_line("published 2", Duration::from_secs(30));
        let (status, _, json) = waiter.finish(FINISH);
        assert!(status.success(), "{backend}: {status}: {json}");
        assert_eq!(field(&json, "gpu_status"), "published", "{backend}: {json}");
        assert_eq!(field(&json, "gpu_word"), 2, "{backend}: the copy after the wait saw generation 2: {json}");
        assert_eq!(field(&json, "cpu_status"), "Published { newest: 2 }", "{backend}: {json}");
        let waited = field(&json, "released_after_ms").as_f64().unwrap();
        assert!(waited >= 250.0, "{backend}: the stream did not wait for the publication: {json}");
        common::record("weights-stream-wait", &json);
        owner.close_stdin();
        let (status, _, _) = owner.finish(FINISH);
        assert!(status.success(), "{backend}: owner {status}");
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn a_stream_wait_is_released_as_gone_within_a_second_of_the_owners_sigkill() {
    for backend in ["legacy", "vmm"] {
        let (mut owner, path) = owner(backend, "stream-owner-killed");
        let waiter = stream_wait(backend, &path, 2, &[]);
        std::thread::sleep(Duration::from_millis(300));
        owner.kill9();
        let killed = Instant::now();
        let (status, _, json) = waiter.finish(FINISH);
        let after = killed.elapsed();
        assert!(status.success(), "{backend}: {status}: {json}");
        assert!(after < Duration::from_secs(1), "{backend}: the stream was released {after:?} after the SIGKILL");
        assert_eq!(field(&json, "gpu_status"), "gone", "{backend}: {json}");
        assert_eq!(field(&json, "gpu_word"), GONE_BIT | 1, "{backend}: {json}");
        assert_eq!(field(&json, "cpu_status"), "OwnerGone { newest: 1 }", "{backend}: {json}");
        let _ = owner.finish(FINISH);
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn a_reader_closed_while_its_stream_waits_releases_the_stream_without_a_hang() {
    for backend in ["legacy", "vmm"] {
        let (mut owner, path) = owner(backend, "stream-reader-closed");
        let waiter = stream_wait(backend, &path, 5, &["--close-after-ms", "300"]);
        let (status, took, json) = waiter.finish(FINISH);
        assert!(status.success(), "{backend}: {status}: {json}");
        assert!(took < Duration::from_secs(10), "{backend}: {took:?}");
        assert_eq!(field(&json, "gpu_status"), "gone", "{backend}: the close released the stream: {json}");
        assert_eq!(field(&json, "gpu_word"), GONE_BIT | 1, "{backend}: {json}");
        let close_ms = field(&json, "close_ms").as_f64().unwrap();
        assert!(close_ms < 1000.0, "{backend}: closing waited out the settle time: {json}");
        owner.close_stdin();
        let _ = owner.finish(FINISH);
    }
}
