//! Replays the committed corpus (the seeds and every crash found and fixed, `corpus/<target>/`) through each
//! target without libFuzzer: `cargo test` in `fuzz/` is the regression test of every finding.
#![allow(clippy::expect_used)]

use std::path::PathBuf;

#[test]
fn every_committed_input_runs_clean() {
    let root = PathBuf::from(
        std::env::var_os("CARGO_MANIFEST_DIR").expect("run with cargo test, which sets CARGO_MANIFEST_DIR"),
    )
    .join("corpus");
    for target in gpu_ipc_fuzz::TARGETS {
        let mut inputs = 0;
        for entry in std::fs::read_dir(root.join(target)).expect("a corpus folder per target").flatten() {
            let data = std::fs::read(entry.path()).expect("a corpus file");
            gpu_ipc_fuzz::run(target, &data);
            inputs += 1;
        }
        assert!(inputs > 0, "{target} has no corpus");
    }
}

#[test]
fn the_committed_seeds_are_what_the_encoders_make() {
    let root = PathBuf::from(
        std::env::var_os("CARGO_MANIFEST_DIR").expect("run with cargo test, which sets CARGO_MANIFEST_DIR"),
    )
    .join("corpus");
    for (target, seeds) in gpu_ipc_fuzz::seeds() {
        assert!(!seeds.is_empty(), "{target}");
        for (i, seed) in seeds.iter().enumerate() {
            let committed = std::fs::read(root.join(target).join(format!("seed-{i:02}"))).expect("a seed");
            assert!(
                &committed == seed,
                "{target} seed {i} changed: run `cargo run --release --bin gen-corpus` in fuzz/"
            );
        }
    }
}
