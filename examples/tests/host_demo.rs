//! The README's demo without a GPU: the example programs on the host backend, as separate processes. A consumer
//! reading until the end of the stream exits 0 and says how many frames it read; after a producer SIGKILL it says
//! the producer died (status 4). A ring of tensors (`--tensor`) runs the same way.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::Duration;

use common::{consumer, producer_with, socket};

const SMALL: [&str; 4] = ["--width", "64", "--height", "32"];

#[test]
fn a_consumer_reading_until_the_end_exits_0_after_a_clean_producer_exit() {
    for sync in ["cpu-spin", "cpu-sleep"] {
        let sock = socket(&format!("host-eos-{sync}"));
        let p = producer_with("host", sync, &sock, 500, 1, &SMALL);
        let c = consumer("until-end", "host", &sock, 0);
        let (ps, _, pj) = p.finish(Duration::from_secs(60));
        let (cs, _, cj) = c.finish(Duration::from_secs(10));
        assert!(ps.success(), "{sync}: producer {ps} {pj}");
        assert_eq!(cs.code(), Some(0), "{sync}: {cj}");
        assert_eq!(cj["frames"], 500, "{sync}: {cj}");
        assert_eq!(cj["end_of_stream_after"], 500, "{sync}: {cj}");
        assert_eq!(cj["mismatched_words"], 0, "{sync}: {cj}");
        assert_eq!(cj["backend"], "host", "{cj}");
        assert_eq!(pj["frames"], 500, "{pj}");
    }
}

#[test]
fn a_ring_of_tensors_runs_across_processes() {
    // f32 [4, 64, 64]: 64 KiB a slot; the consumer learns the layout from the offer and checks every word.
    let sock = socket("host-tensor");
    let p = producer_with("host", "cpu-spin", &sock, 300, 2, &["--tensor", "f32:4x64x64"]);
    let a = consumer("tensor-a", "host", &sock, 300);
    let b = consumer("tensor-b", "host", &sock, 0);
    let (ps, _, pj) = p.finish(Duration::from_secs(60));
    let (as_, _, aj) = a.finish(Duration::from_secs(10));
    let (bs, _, bj) = b.finish(Duration::from_secs(10));
    assert!(ps.success(), "producer {ps} {pj}");
    let slot = "float32 [4, 64, 64] tensors (65536 bytes)";
    assert_eq!((pj["slot"].as_str(), pj["frame_bytes"].as_u64()), (Some(slot), Some(65_536)), "{pj}");
    for (status, json) in [(as_, &aj), (bs, &bj)] {
        assert_eq!(status.code(), Some(0), "{json}");
        assert_eq!(json["slot"], slot, "{json}");
        assert_eq!(json["protocol_version"], gpu_ipc::core::wire::PROTOCOL_VERSION, "{json}");
        assert_eq!(json["frames"], 300, "{json}");
        assert_eq!(json["mismatched_words"], 0, "{json}");
    }
    assert_eq!(bj["end_of_stream_after"], 300, "{bj}");
    // A pixel ring says so too, in the same words as the library.
    let sock = socket("host-pixels");
    let p = producer_with("host", "cpu-sleep", &sock, 10, 1, &SMALL);
    let c = consumer("pixels", "host", &sock, 10);
    let ((ps, _, _), (cs, _, cj)) = (p.finish(Duration::from_secs(60)), c.finish(Duration::from_secs(10)));
    assert!(ps.success() && cs.success(), "{cj}");
    assert_eq!(cj["slot"], "64x32 rgb8 frames (6144 bytes)", "{cj}");
}

#[test]
fn a_tensor_and_a_pixel_geometry_cannot_both_be_asked_for() {
    let out = std::process::Command::new(common::exe("producer"))
        .args(["--backend", "host", "--socket", "/tmp/gpu-ipc-conflict.sock", "--tensor", "f32:4", "--width", "8"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "a usage error");
    assert!(String::from_utf8_lossy(&out.stderr).contains("--tensor"), "{}", String::from_utf8_lossy(&out.stderr));
    let out = std::process::Command::new(common::exe("producer"))
        .args(["--backend", "host", "--socket", "/tmp/gpu-ipc-bad-tensor.sock", "--tensor", "f33:4"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("element type") && stderr.contains("bf16"), "{stderr}");
}

#[test]
fn after_a_producer_sigkill_the_consumer_says_it_died() {
    let sock = socket("host-kill");
    let _cleanup = common::RemoveOnDrop(sock.clone());
    let mut p = producer_with("host", "cpu-spin", &sock, 0, 1, &SMALL);
    let c = consumer("victim-of", "host", &sock, 0);
    c.wait_for_line("frame 1000", Duration::from_secs(60));
    p.kill9();
    let (cs, after, cj) = c.finish(Duration::from_secs(5));
    let _ = p.finish(Duration::from_secs(5));
    assert_eq!(cs.code(), Some(4), "{cj}");
    assert!(cj["producer_gone"].is_string(), "{cj}");
    assert!(cj["end_of_stream_after"].is_null(), "{cj}");
    assert!(after < Duration::from_secs(2), "{after:?}");
}

#[test]
fn without_a_driver_a_gpu_backend_says_so_in_one_line_with_status_3() {
    if gpu_ipc::driver::Driver::get().is_ok() {
        return; // a machine with a driver: the GPU tests cover it
    }
    for program in ["producer", "consumer"] {
        let out = std::process::Command::new(common::exe(program))
            .args(["--backend", "vmm", "--socket", "/tmp/gpu-ipc-no-driver.sock"])
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(3), "{program}: {stderr}");
        let lines: Vec<&str> = stderr.lines().filter(|l| !l.starts_with("producer: waiting")).collect();
        assert_eq!(lines.len(), 1, "{program}: {stderr}");
        assert!(lines[0].starts_with(&format!("{program}: no CUDA driver")), "{program}: {stderr}");
        assert!(lines[0].contains("--backend host"), "{program}: {stderr}");
    }
}
