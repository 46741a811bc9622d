//! Every probe and the report on the command line, without a GPU: `--help` works, and on a machine without a driver
//! each probe stops with the doctor's one-line message in its own name and exit status 3 (the driver is hidden with
//! `GPU_IPC_LIBCUDA`, so this also runs on the GPU machine).

use std::process::Command;

mod common;

const PROBES: [&str; 4] = ["overhead", "coherency", "vmm-compat", "crash"];

#[test]
fn every_probe_and_the_report_have_help() {
    for args in PROBES.iter().map(|p| vec!["probe", p, "--help"]).chain([vec!["report", "--help"]]) {
        let out = Command::new(common::gpu_ipc_exe()).args(&args).output().unwrap_or_else(|e| panic!("{e}"));
        let text = String::from_utf8_lossy(&out.stdout);
        assert_eq!(out.status.code(), Some(0), "{args:?}: {out:?}");
        assert!(text.contains("--json"), "{args:?} lists --json: {text}");
        assert!(text.contains("--quick"), "{args:?} lists --quick: {text}");
    }
}

#[test]
fn without_a_driver_every_probe_says_so_and_exits_3() {
    for probe in PROBES {
        let out = Command::new(common::gpu_ipc_exe())
            .args(["probe", probe])
            .env("GPU_IPC_LIBCUDA", "/nonexistent/libcuda.so.1")
            .output()
            .unwrap_or_else(|e| panic!("{e}"));
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(3), "{probe}: {out:?}");
        // One line, in the subcommand's own name.
        assert_eq!(stderr.lines().count(), 1, "{probe}: {stderr}");
        assert!(stderr.starts_with(&format!("gpu-ipc probe {probe}: no CUDA driver: ")), "{probe}: {stderr}");
        assert!(out.stdout.is_empty(), "{probe} printed nothing on stdout: {out:?}");
    }
}

#[test]
fn unknown_probe_is_a_usage_error() {
    let out =
        Command::new(common::gpu_ipc_exe()).args(["probe", "nonsense"]).output().unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(out.status.code(), Some(2), "{out:?}");
}
