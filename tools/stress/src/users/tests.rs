//! Tests of `users.rs` (kept apart so that the module reads in one screenful more).

#![allow(clippy::unwrap_used)]
use super::*;
use crate::procs::{Bins, ChildEnv};
use crate::schedule::Sizes;
use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;

fn ctx(bins: Bins) -> Ctx {
    Ctx {
        bins,
        env: ChildEnv::new(),
        sizes: Sizes::QUICK,
        width: 64,
        height: 16,
        max_gap: Duration::from_millis(100),
        gone_bound: Duration::from_secs(2),
        hang_after: Duration::from_secs(10),
        front_door_sync: "cpu-spin".into(),
        seed: 1,
        mps: false,
    }
}

fn scratch(tag: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("gpu-ipc-stress-users-test-{}-{tag}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    dir
}

fn end(exit: Option<i32>, summary: Option<serde_json::Value>, stderr: &str) -> ProcEnd {
    ProcEnd { name: "consumer uid 65534".into(), exit, summary, stderr_tail: stderr.into(), ..ProcEnd::default() }
}

#[test]
fn every_backend_and_strategy_by_uid_then_one_group_socket() {
    let all = rows(&["legacy", "vmm"]);
    assert_eq!(all.len(), 5);
    assert_eq!(all[0], Row { backend: "legacy", sync: "cpu-spin", door: SocketDoor::Uid });
    assert_eq!(all[3], Row { backend: "vmm", sync: "gpu-stream-ops", door: SocketDoor::Uid });
    assert_eq!(all[4], Row { backend: "vmm", sync: "cpu-spin", door: SocketDoor::Group });
    assert_eq!(rows(&["legacy"])[2], Row { backend: "legacy", sync: "cpu-spin", door: SocketDoor::Group });
    assert!(rows(&[]).is_empty());
}

#[test]
fn the_programs_get_the_door_and_the_producers_uid() {
    let extra = producer_extra(SocketDoor::Uid);
    assert!(extra.windows(2).any(|w| w == ["--allow-uid", "65534"]), "{extra:?}");
    assert!(extra.windows(2).any(|w| w == ["--consumers", "0"]) && extra.contains(&"--until-stdin-closes".into()));
    let extra = producer_extra(SocketDoor::Group);
    assert!(extra.windows(2).any(|w| w == ["--socket-group", "65534"]) && !extra.contains(&"--allow-uid".into()));
    let a = consumer_args(Path::new("/tmp/x.sock"), "legacy", 0);
    for pair in [["--socket", "/tmp/x.sock"], ["--backend", "legacy"], ["--frames", "50"], ["--producer-uid", "0"]] {
        assert!(a.windows(2).any(|w| w == pair), "{pair:?} in {a:?}");
    }
    assert!(a.contains(&"--json".into()));
}

#[test]
fn a_cuda_error_before_the_first_frame_is_the_answer_and_anything_else_fails() {
    let ok = end(Some(0), Some(serde_json::json!({"frames": 50, "mismatched_words": 0})), "consumer users: frame 50");
    assert_eq!(answer_of(&ok, true), CrossUserAnswer::Verified);
    assert_eq!(answer_of(&ok, true).status(), Status::Passed);
    let refused =
        end(Some(1), None, "consumer: cuIpcOpenMemHandle failed: CUDA_ERROR_INVALID_VALUE (1): invalid argument\n");
    let answer = answer_of(&refused, false);
    assert_eq!(
        answer,
        CrossUserAnswer::Refused {
            error: "consumer: cuIpcOpenMemHandle failed: CUDA_ERROR_INVALID_VALUE (1): invalid argument".into()
        }
    );
    assert_eq!(answer.status(), Status::Finding);
    assert!(answer.words().starts_with("refused: consumer: cuIpcOpenMemHandle failed: CUDA_ERROR_INVALID_VALUE"));
    // The same error after frames came is no answer to the question.
    assert_eq!(answer_of(&refused, true).status(), Status::Failed);
    let door = end(Some(1), None, "consumer: permission denied for connect on /tmp/x.sock: ...");
    assert!(
        matches!(answer_of(&door, false), CrossUserAnswer::Failed { ref reason } if reason.contains("permission denied"))
    );
    let corrupt = end(Some(1), Some(serde_json::json!({"frames": 50, "mismatched_words": 7})), "");
    assert!(
        matches!(answer_of(&corrupt, true), CrossUserAnswer::Failed { ref reason } if reason.contains("7 mismatched"))
    );
    let hung = ProcEnd { hung: true, ..end(None, None, "CUDA_ERROR_X") };
    assert!(matches!(answer_of(&hung, false), CrossUserAnswer::Failed { ref reason } if reason.contains("hung")));
}

#[test]
fn device_files_are_judged_for_nobody_and_named_when_closed() {
    let dev = scratch("dev");
    for (name, mode) in [("nvidia0", 0o666), ("nvidiactl", 0o666), ("nvidia-uvm", 0o600), ("null", 0o600)] {
        std::fs::write(dev.join(name), "").unwrap();
        std::fs::set_permissions(dev.join(name), std::fs::Permissions::from_mode(mode)).unwrap();
    }
    std::fs::create_dir(dev.join("nvidia-caps")).unwrap();
    let devices = device_access(&dev, NOBODY, NOBODY);
    let names: Vec<&str> = devices.iter().map(|d| d.path.rsplit('/').next().unwrap()).collect();
    assert_eq!(names, ["nvidia-uvm", "nvidia0", "nvidiactl"]);
    assert_eq!((devices[0].mode.as_str(), devices[0].read_write), ("0600", false));
    assert!(devices[1].read_write && devices[2].read_write);
    let note = devices_note(&devices, NOBODY);
    assert!(note.starts_with("uid 65534 may not open read-write: ") && note.contains("nvidia-uvm (0600 "), "{note}");
    assert!(devices_note(&devices[1..], NOBODY).starts_with("uid 65534 may open every /dev/nvidia* file"));
    assert_eq!(devices_note(&[], NOBODY), "no /dev/nvidia* device files here");
    let _ = std::fs::remove_dir_all(dev);
}

#[test]
fn without_root_or_without_a_consumer_every_row_is_not_run_with_why() {
    let bins =
        Bins { producer: "/nonexistent-gpu-ipc/producer".into(), consumer: "/nonexistent-gpu-ipc/consumer".into() };
    let dev = Path::new("/nonexistent-gpu-ipc/dev");
    let report = users_in(&ctx(bins.clone()), &["legacy", "vmm"], false, dev);
    assert_eq!(report.runs.len(), 5);
    assert!(report.runs.iter().all(|r| r.status == Status::NotRun && r.detail.contains("needs root")));
    assert_eq!(report.devices_note, "no /dev/nvidia* device files here");
    let report = users_in(&ctx(bins), &["vmm"], true, dev);
    assert_eq!(report.runs.len(), 3);
    for r in &report.runs {
        assert_eq!(r.status, Status::NotRun);
        assert!(r.detail.contains("copy /nonexistent-gpu-ipc/consumer"), "{}", r.detail);
    }
}

/// A producer stand-in that streams until its stdin closes; a consumer stand-in that insists on uid and gid
/// 65534 and a `--producer-uid`, then verifies (vmm) or fails as a refused legacy import would.
const PRODUCER: &str = r#"#!/bin/sh
case "$*" in *"--allow-uid 65534"*|*"--socket-group 65534"*) ;; *) echo "producer: no door for 65534" >&2; exit 3;; esac
echo 'producer: frame 100' >&2
cat >/dev/null
echo '{"frames": 100}'
"#;
const CONSUMER: &str = r#"#!/bin/sh
[ "$(id -u):$(id -g)" = "65534:65534" ] || { echo "consumer: running as $(id -u):$(id -g)" >&2; exit 2; }
case "$*" in *--producer-uid*) ;; *) echo "consumer: no --producer-uid" >&2; exit 2;; esac
case "$*" in
  *"--backend vmm"*) echo 'consumer users: frame 50' >&2; echo '{"frames": 50, "mismatched_words": 0}';;
  *) echo 'consumer: cuIpcOpenMemHandle failed: CUDA_ERROR_INVALID_VALUE (1): invalid argument' >&2; exit 1;;
esac
"#;

#[test]
#[ignore = "needs root: starts a consumer as nobody (the GPU suite's first pass runs it, as root)"]
fn as_root_the_consumer_runs_as_nobody_and_each_answer_is_recorded() {
    assert!(rustix::process::geteuid().is_root(), "this test needs root (it starts a process as uid {NOBODY})");
    let dir = scratch("bins");
    for (name, text) in [("producer", PRODUCER), ("consumer", CONSUMER)] {
        std::fs::write(dir.join(name), text).unwrap();
        std::fs::set_permissions(dir.join(name), std::fs::Permissions::from_mode(0o700)).unwrap();
    }
    let bins = Bins::find(Some(&dir)).unwrap();
    let report = users_in(&ctx(bins), &["legacy", "vmm"], true, &dir);
    let _ = std::fs::remove_dir_all(&dir);
    assert_eq!(report.runs.len(), 5);
    for r in &report.runs {
        match r.backend.as_str() {
            "vmm" => {
                assert_eq!(
                    (r.status, &r.answer, r.frames, r.attached),
                    (Status::Passed, &CrossUserAnswer::Verified, 50, true),
                    "{r:?}"
                );
            }
            _ => {
                assert_eq!(r.status, Status::Finding, "{r:?}");
                assert_eq!((r.attached, r.consumer_exit, r.consumer_end.as_deref()), (false, Some(1), Some("exit 1")));
                assert!(
                    r.detail.starts_with("refused: consumer: cuIpcOpenMemHandle failed: CUDA_ERROR_INVALID_VALUE"),
                    "{}",
                    r.detail
                );
                assert_eq!(
                    r.consumer_last_lines.last().unwrap(),
                    "consumer: cuIpcOpenMemHandle failed: CUDA_ERROR_INVALID_VALUE (1): invalid argument"
                );
            }
        }
        assert_eq!(r.producer, "producer: exit 0");
    }
}
