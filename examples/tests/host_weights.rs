//! The `weights` example program on the host backend (no GPU): `bench` publishes generations while a reader
//! process follows them and checks every byte and checksum of each generation it takes.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::process::{Command, Stdio};

use common::exe;

#[test]
fn bench_verifies_every_generation_the_reader_takes() {
    let out = Command::new(exe("weights"))
        .args(["bench", "--backend", "host", "--tensors", "300", "--mib", "4", "--generations", "6", "--json"])
        .stderr(Stdio::inherit())
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", out.status);
    let summary: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let reader = &summary["reader"];
    assert_eq!(
        (reader["tensors"].as_u64(), reader["verified_generations"].as_u64()),
        (Some(300), Some(6)),
        "{summary}"
    );
    assert_eq!(reader["switches"], 5, "{summary}");
}
