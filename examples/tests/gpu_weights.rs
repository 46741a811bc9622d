//! Weight sets on a real GPU, legacy and vmm: the `weights` program publishes generations of a set (291 tensors,
//! like Llama-3-8B's count, 256 MiB; and 19,000 small tensors) while a reader process follows them and checks every
//! byte and checksum of each generation it takes; the cold open and switch times are printed (and appended to
//! `weights-<GPU_IPC_RESULTS_TAG>.jsonl` in `GPU_IPC_RESULTS_DIR` when set). Ignored without a GPU.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::process::{Command, Stdio};

use common::exe;

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
