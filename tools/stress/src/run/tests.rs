//! Tests of `run.rs` (kept apart so that the module reads in one screenful more).

#![allow(clippy::unwrap_used)]
use super::*;
use std::os::unix::fs::PermissionsExt;

/// Stand-ins for the example programs (no GPU here): they report progress like the real ones and print a
/// summary; a consumer ends with `GONE_EXIT` (4 plays ProducerGone).
const STAND_IN: &str = r#"#!/bin/sh
frames=0; name=p; every=50
while [ $# -gt 0 ]; do
  case "$1" in --frames) frames=$2; shift;; --name) name=$2; shift;; --progress-every) every=$2; shift;; esac
  shift
done
i=0
while [ "$i" -lt "$frames" ]; do
  i=$((i + every))
  case "$0" in *producer) echo "producer: frame $i" >&2;; *) echo "consumer $name: frame $i" >&2;; esac
  sleep 0.01
done
case "$0" in
  *producer) echo "{\"frames\": $frames, \"consumers_lost\": 1}"; exit 0;;
  *) echo "{\"frames\": $frames, \"mismatched_words\": 0}"; exit "${GONE_EXIT:-0}";;
esac
"#;

fn stand_ins(tag: &str) -> (PathBuf, Bins) {
    let dir = std::env::temp_dir().join(format!("gpu-ipc-stress-stand-ins-{}-{tag}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    for name in ["producer", "consumer"] {
        let path = dir.join(name);
        std::fs::write(&path, STAND_IN).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    let bins = Bins::find(Some(&dir)).unwrap();
    (dir, bins)
}

fn ctx(bins: Bins, env: ChildEnv) -> Ctx {
    Ctx {
        bins,
        env,
        sizes: Sizes { kill_frames: 400, progress_every: 50, ..Sizes::QUICK },
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

use std::path::PathBuf;

#[test]
fn a_consumer_kill_trial_runs_end_to_end_on_stand_ins() {
    let (dir, bins) = stand_ins("consumer");
    let cell = Cell { backend: "vmm", sync: "cpu-spin", victim: Victim::Consumer };
    let t = kill_trial(&ctx(bins, ChildEnv::new()), cell, 0, KillPoint { after_frames: 100, extra_delay_us: 10 });
    assert_eq!(t.outcome, TrialOutcome::Passed, "{t:?}");
    assert!(t.killed_at_ms.is_some());
    assert_eq!((t.lost_frames, t.mismatched_words), (0, 0));
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn a_producer_kill_trial_times_each_consumers_exit_from_the_kill() {
    let (dir, bins) = stand_ins("producer");
    let env = vec![("GONE_EXIT".into(), "4".into())];
    let cell = Cell { backend: "legacy", sync: "gpu-stream-ops", victim: Victim::Producer };
    let t = kill_trial(&ctx(bins, env), cell, 0, KillPoint { after_frames: 50, extra_delay_us: 0 });
    assert_eq!(t.outcome, TrialOutcome::Passed, "{t:?}");
    assert_eq!(t.gone_s.len(), 2);
    assert!(t.gone_s.iter().all(|g| (0.0..2.0).contains(g)), "{:?}", t.gone_s);
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn a_victim_that_never_gets_to_its_kill_point_fails_the_trial() {
    let (dir, bins) = stand_ins("short");
    let cell = Cell { backend: "vmm", sync: "cpu-spin", victim: Victim::Consumer };
    // The run has 400 frames: frame 10,000 never comes.
    let t = kill_trial(&ctx(bins, ChildEnv::new()), cell, 0, KillPoint { after_frames: 10_000, extra_delay_us: 0 });
    assert!(matches!(t.outcome, TrialOutcome::Failed { ref reason } if reason.starts_with("before the kill")), "{t:?}");
    assert_eq!(t.killed_at_ms, None);
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn eviction_fails_when_the_producer_cannot_start() {
    let dir = std::env::temp_dir().join(format!("gpu-ipc-stress-no-evict-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    for name in ["producer", "consumer"] {
        let path = dir.join(name);
        std::fs::write(&path, "#!/bin/sh\necho 'producer: no CUDA driver' >&2\nexit 1\n").unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    let check = evict(&ctx(Bins::find(Some(&dir)).unwrap(), ChildEnv::new()), "vmm", "cpu-spin");
    assert_eq!(check.status, Status::Failed, "{check:?}");
    assert!(check.detail.contains("exit 1"), "{}", check.detail);
    let _ = std::fs::remove_dir_all(dir);
}
