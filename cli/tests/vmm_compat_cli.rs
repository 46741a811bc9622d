//! `gpu-ipc probe vmm-compat` as a user runs it: `--help` everywhere; the whole cross-process matrix on a GPU.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::process::Command;

mod common;

fn gpu_ipc() -> Command {
    Command::new(common::gpu_ipc_exe())
}

#[test]
fn help_works_without_a_gpu() {
    let out = gpu_ipc().args(["probe", "vmm-compat", "--help"]).output().unwrap();
    assert!(out.status.success(), "{out:?}");
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(text.contains("--json"), "{text}");
    assert!(text.contains("--device"), "{text}");
}

/// The real matrix between two processes; the backends' checks must agree with it.
#[test]
#[ignore = "needs a CUDA GPU"]
fn the_matrix_runs_and_the_backends_agree_with_it() {
    let out = gpu_ipc().args(["probe", "vmm-compat", "--json", "--no-progress"]).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let cells = json["results"]["cells"].as_array().unwrap();
    assert_eq!(cells.len(), 9 * 13);
    let cell = |allocation: &str, operation: &str| {
        cells
            .iter()
            .find(|c| c["allocation"] == allocation && c["operation"] == operation)
            .unwrap_or_else(|| panic!("{allocation} / {operation} missing"))
    };
    // Documented and measured facts (docs/answers/README.md: legacy IPC and VMM POSIX-fd work on the H100).
    assert_eq!(
        cell("mem-alloc", "legacy-import")["observed"]["outcome"],
        "works",
        "{}",
        cell("mem-alloc", "legacy-import")
    );
    assert_eq!(
        cell("vmm-posix-fd", "fd-import")["observed"]["outcome"],
        "works",
        "{}",
        cell("vmm-posix-fd", "fd-import")
    );
    assert_eq!(cell("vmm-posix-fd", "legacy-export")["observed"]["code"], "CUDA_ERROR_INVALID_VALUE");
    assert_eq!(
        cell("async-fd-pool", "pool-import")["observed"]["outcome"],
        "works",
        "{}",
        cell("async-fd-pool", "pool-import")
    );
    // The first GPU run read the child's write back only after the same-process control had rewritten the
    // memory: every data-moving import then read DATA_MISMATCH. None may.
    for c in cells {
        assert_ne!(c["observed"]["code"], "DATA_MISMATCH", "{c}");
    }
    // No cell is a child that died or hung.
    for c in cells {
        let code = c["observed"]["code"].as_str().unwrap();
        assert!(code != "CHILD_DIED" && code != "CHILD_TIMEOUT", "{c}");
    }
    assert!(!json["verdict"]["answer"].as_str().unwrap().contains("no allocation"), "{}", json["verdict"]["answer"]);
    assert!(
        json["verdict"]["answer"].as_str().unwrap().contains("the backends' capability checks agree with the matrix"),
        "{}",
        json["verdict"]["answer"]
    );
}
