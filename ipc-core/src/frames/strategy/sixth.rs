//! A sixth strategy, sketched as a test double: what adding one takes, checked.
//!
//! `CpuNap` polls the control block on the CPU with a one-microsecond nap (between `cpu-spin` and `cpu-sleep`). It
//! is a module of its own that implements [`Strategy`] through the ring's types (`Sequence`, `SlotIndex`) and the
//! CPU sides the CPU strategies share; nothing outside this file knows it. A real sixth strategy would also need a
//! wire identity: the files it touches are [`FILES_A_SIXTH_STRATEGY_TOUCHES`], and the test below checks that no
//! other file in the workspace matches on the strategies' variants (so every front end asks the descriptor,
//! `SyncStrategy::traits`, instead).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64};
use std::time::{Duration, Instant};

use super::cpu::{CpuConsumer, CpuProducer};
use super::{ConsumerShared, ConsumerSide, ProducerSide, Setup, Strategy};
use crate::frames::FrameError;
use crate::ring::{ConsumerControl, LivenessPolicy, ProducerControl, RingConfig, Sequence, WaitMode};
use crate::wire::SyncStrategy;
use gpu_ipc_driver::Context;

/// The files a sixth strategy touches, each with what it adds there.
pub(crate) const FILES_A_SIXTH_STRATEGY_TOUCHES: [(&str, &str); 3] = [
    ("ipc-core/src/frames/strategy/<name>.rs", "its module: the `Strategy` implementation (new file)"),
    ("ipc-core/src/frames/strategy/mod.rs", "`mod <name>;` and its line in `strategy()` (registration)"),
    (
        "ipc-core/src/wire/types.rs",
        "its `SyncStrategy` variant (serde name), its entry in `ALL`, its descriptor row in `traits()` (name, wire \
         code, who waits, who publishes, what it needs)",
    ),
];

/// Where a match on the strategies' variants may stay, and why: everything else asks the descriptor.
const MATCHES_ALLOWED: [(&str, &str); 4] = [
    ("ipc-core/src/wire/types.rs", "the descriptor itself"),
    ("ipc-core/src/frames/strategy/mod.rs", "the registration: wire strategy to implementation"),
    ("ipc-core/src/frames/consumer.rs", "`Consumer::wait_published` naps between polls with cpu-sleep only"),
    ("bench/src/targets.rs", "a target that names the two strategies it is set for (ipc-event, gpu-stream-ops)"),
];

/// The test double.
struct CpuNap;

const NAP: WaitMode = WaitMode::Sleep(Duration::from_micros(1));

impl Strategy for CpuNap {
    fn kind(&self) -> SyncStrategy {
        // The one thing a test double cannot add: a wire identity (a `SyncStrategy` variant). It borrows cpu-spin's.
        SyncStrategy::CpuSpin
    }

    fn check(&self, _cuda: Option<&Context>) -> Result<(), FrameError> {
        Ok(())
    }

    fn producer(&self, _setup: Setup<'_>) -> Result<Box<dyn ProducerSide>, FrameError> {
        Ok(Box::new(CpuProducer::new(NAP)))
    }

    fn consumer(&self, _setup: Setup<'_>, _events: &[[u8; 64]]) -> Result<Box<dyn ConsumerSide>, FrameError> {
        Ok(Box::new(CpuConsumer::new(NAP)))
    }
}

fn setup(ring: &ProducerControl) -> Setup<'static> {
    Setup {
        cuda: None,
        block: ring.block().shared(),
        layout: ring.block().layout(),
        slots: 2,
        max_consumers: 1,
        sleep_interval: Duration::from_micros(1),
        device_words: 0,
    }
}

#[test]
#[allow(clippy::unwrap_used)]
fn a_sixth_strategy_runs_a_ring_through_the_trait_alone() {
    let strategy: &dyn Strategy = &CpuNap;
    strategy.check(None).unwrap();
    // Its facts come from its wire identity's descriptor: nothing to override.
    assert!(!strategy.gpu_writes_counters());
    let ring = ProducerControl::create(
        RingConfig { slot_count: 2, max_consumers: 1, generation: 1 },
        LivenessPolicy::default(),
    )
    .unwrap();
    let id = ring.register_consumer(rustix::process::getpid()).unwrap();
    let fd = ring.block().memory().try_clone_fd().unwrap();
    let shared = ConsumerShared {
        ring: Arc::new(ConsumerControl::attach(fd, id, LivenessPolicy::default()).unwrap()),
        producer_hung_up: Arc::new(AtomicBool::new(false)),
        producer_pid: 42,
        published_below_at_hang_up: Arc::new(AtomicU64::new(0)),
    };
    let mut producer = strategy.producer(setup(&ring)).unwrap();
    let mut consumer = strategy.consumer(setup(&ring), &[]).unwrap();
    let soon = || Instant::now() + Duration::from_millis(100);
    for n in 0..6 {
        let seq = Sequence(n);
        let slot = ring.slot_for(seq);
        assert_eq!(slot.0, (n % 2) as u32);
        producer.wait_slot_free(&ring, seq, None, soon()).unwrap();
        producer.publish(&ring, seq, slot, None, soon()).unwrap();
        consumer.wait_frame(&shared, seq, slot, None, soon()).unwrap();
        // Two slots: frame n + 2 needs frame n's release, which has not happened yet.
        match producer.wait_slot_free(&ring, Sequence(n + 2), None, Instant::now() + Duration::from_millis(5)) {
            Err(FrameError::Timeout { .. }) => {}
            other => panic!("frame {}: {other:?}", n + 2),
        }
        consumer.release(&shared, seq, slot, None, soon()).unwrap();
        producer.wait_slot_free(&ring, Sequence(n + 2), None, soon()).unwrap();
    }
    assert_eq!(ring.block().next_sequence(), Sequence(6));
}

/// The workspace's root, found at run time (nextest's `--workspace-remap` sets CARGO_MANIFEST_DIR to the tree the
/// tests run in, which may be another path than the one they were built at), else the build-time path.
fn workspace() -> PathBuf {
    let manifest =
        std::env::var_os("CARGO_MANIFEST_DIR").map_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")), PathBuf::from);
    manifest.parent().map_or_else(|| PathBuf::from(".."), Path::to_path_buf)
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    for entry in entries.flatten() {
        let path = entry.path();
        let name = entry.file_name();
        if path.is_dir() {
            if !matches!(name.to_str(), Some("target" | ".git" | "fuzz")) {
                rust_files(&path, out);
            }
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// Whether `line` matches on a strategy's variant (a match arm, an or-pattern, `matches!`): a restatement of
/// something the descriptor says.
fn matches_on_a_variant(line: &str) -> bool {
    let code = line.split("//").next().unwrap_or("");
    SyncStrategy::ALL.iter().any(|s| {
        let variant = format!("SyncStrategy::{s:?}");
        code.find(&variant).is_some_and(|at| {
            let after = code[at + variant.len()..].trim_start();
            let before = code[..at].trim_end();
            after.starts_with("=>")
                || after.starts_with('|')
                || before.ends_with('|')
                || (before.contains("matches!(") && before.ends_with(','))
        })
    })
}

#[test]
fn no_file_but_the_descriptor_and_the_registration_matches_on_the_strategies() {
    let root = workspace();
    let mut files = Vec::new();
    rust_files(&root, &mut files);
    assert!(files.len() > 100, "found only {} Rust files under {}", files.len(), root.display());
    let this = Path::new("ipc-core/src/frames/strategy/sixth.rs");
    let mut offenders = Vec::new();
    for file in &files {
        let relative = file.strip_prefix(&root).unwrap_or(file);
        if relative == this || MATCHES_ALLOWED.iter().any(|(allowed, _)| relative == Path::new(allowed)) {
            continue;
        }
        let Ok(text) = std::fs::read_to_string(file) else { continue };
        for (n, line) in text.lines().enumerate() {
            if matches_on_a_variant(line) {
                offenders.push(format!("{}:{}: {}", relative.display(), n + 1, line.trim()));
            }
        }
    }
    assert!(
        offenders.is_empty(),
        "these lines restate what SyncStrategy::traits() says (ask it instead):\n{}",
        offenders.join("\n")
    );
}

#[test]
fn the_detector_sees_the_forms_a_restatement_takes() {
    assert!(matches_on_a_variant("        SyncStrategy::CpuSpin => 1,"));
    assert!(matches_on_a_variant("    matches!(sync, SyncStrategy::CpuSpin | SyncStrategy::CpuSleep)"));
    assert!(matches_on_a_variant("    matches!(s, SyncStrategy::GpuPoll)"));
    assert!(matches_on_a_variant("strategy: SyncStrategy::IpcEvent | SyncStrategy::GpuStreamOps,"));
    assert!(!matches_on_a_variant("    let sync = SyncStrategy::GpuStreamOps;"));
    assert!(!matches_on_a_variant("    // SyncStrategy::CpuSpin => 1"));
    let registered: Vec<_> = FILES_A_SIXTH_STRATEGY_TOUCHES.iter().map(|(f, _)| *f).collect();
    for (allowed, _) in &MATCHES_ALLOWED[..2] {
        assert!(registered.contains(allowed), "{allowed}");
    }
}
