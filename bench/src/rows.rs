//! What `gpu-ipc bench pipeline` measures: the rows (two references, the research's four designs, ours over every
//! backend, strategy, ring depth and consumer count, and three-stage pipelines), their names, and which of them a
//! run selects.

use gpu_ipc::BackendKind;
use gpu_ipc::core::wire::SyncStrategy;
use serde::{Deserialize, Serialize};

/// Ring depths of our rows.
pub const SLOTS: [u32; 6] = [1, 2, 4, 8, 16, 32];
/// Ring depths of the deep rows (control-block layout 2), beyond [`SLOTS`]: where the ring's depth still hides
/// the time-slicing of two processes without MPS.
pub const DEEP_SLOTS: [u32; 3] = [64, 128, 256];
/// Ring depths of our rows with `--quick`.
pub const QUICK_SLOTS: [u32; 2] = [1, 4];
/// Consumer counts of our rows.
pub const CONSUMERS: [u32; 2] = [1, 4];
/// Ring depth of the three-stage rows (both rings), the depth of the two-process rows they are read beside
/// (`ours-BACKEND-STRATEGY-s4-c1`), in the quick grid too.
pub const THREE_STAGE_SLOTS: u32 = 4;
/// The mask the three-stage rows' middle stage XORs every word with (every bit inverted).
pub const THREE_STAGE_MASK: u32 = u32::MAX;

/// One of the four designs of the frame-pipeline study, reproduced as the study describes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum StudyDesign {
    /// (a) Host shared memory (a memfd), pageable `cuMemcpyDtoH` in the producer and `cuMemcpyHtoD` in the
    /// consumer, a CPU flag polled with 1 ms sleeps.
    PageableShm,
    /// (b) The same buffer page-locked (`cuMemHostRegister`) in each process, async copies on a stream, an atomic
    /// frame counter and a ready flag in shared memory, polled with 1 us sleeps.
    PinnedStaging,
    /// (c) One device buffer shared with a legacy IPC handle; the CPU polls a shared flag with 10 us sleeps.
    LegacyIpcSleep,
    /// (d) As (c), the CPU spinning on the flag, one stream synchronisation per frame (the seed architecture).
    LegacyIpcSpin,
}

impl StudyDesign {
    /// Every design, in the study's order.
    pub const ALL: [Self; 4] = [Self::PageableShm, Self::PinnedStaging, Self::LegacyIpcSleep, Self::LegacyIpcSpin];

    /// The row name, e.g. `study-d-ipc-spin`.
    pub fn name(self) -> &'static str {
        match self {
            Self::PageableShm => "study-a-pageable-shm",
            Self::PinnedStaging => "study-b-pinned-staging",
            Self::LegacyIpcSleep => "study-c-ipc-sleep",
            Self::LegacyIpcSpin => "study-d-ipc-spin",
        }
    }

    /// How each side waits for the other's flag: `None` spins, `Some(d)` sleeps `d` between polls.
    pub fn poll_interval(self) -> Option<std::time::Duration> {
        use std::time::Duration;
        match self {
            // The study capped its sleep at 16 ms; 1 ms is the shortest `Sleep(1)` a WDDM thread gets.
            Self::PageableShm => Some(Duration::from_millis(1)),
            Self::PinnedStaging => Some(Duration::from_micros(1)),
            Self::LegacyIpcSleep => Some(Duration::from_micros(10)),
            Self::LegacyIpcSpin => None,
        }
    }

    /// Whether the frame travels through host memory (designs a and b) rather than a shared device buffer.
    pub fn through_host(self) -> bool {
        matches!(self, Self::PageableShm | Self::PinnedStaging)
    }
}

/// Whether the producer's `publish` returns before the frame's work is done with `strategy` (so the bench cannot
/// time the publish on the CPU after the work, only when it was queued).
pub fn publishes_on_gpu(strategy: SyncStrategy) -> bool {
    matches!(strategy, SyncStrategy::IpcEvent | SyncStrategy::GpuStreamOps | SyncStrategy::GpuPoll)
}

/// A strategy in the bench's JSON by its name (`cpu-spin`, ...), as recorded results spell it.
mod strategy_name {
    use gpu_ipc::core::wire::SyncStrategy;
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(strategy: &SyncStrategy, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(strategy.name())
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(deserializer: D) -> Result<SyncStrategy, D::Error> {
        let name = String::deserialize(deserializer)?;
        name.parse().map_err(serde::de::Error::custom)
    }
}

/// One row of the benchmark.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "kebab-case")]
pub enum RowSpec {
    /// Fill and verify of the same frames in one process on one stream, back to back.
    SingleProcess,
    /// The same kernels in one process, pipelined through `slots` frame buffers between two streams (fill on one,
    /// verify on the other, each buffer handed over with events): what any design that fills the next frame while
    /// the current one is verified can reach, with no IPC at all.
    SingleProcessPipelined {
        /// Frame buffers.
        slots: u32,
    },
    /// A device-to-device copy of a frame, repeated: the memory-bandwidth floor.
    Bandwidth,
    /// One of the study's designs.
    Study {
        /// Which.
        design: StudyDesign,
    },
    /// The frame API: a `Producer` and `consumers` `Consumer` processes.
    Ours {
        /// The backend.
        backend: BackendKind,
        /// The sync strategy.
        #[serde(with = "strategy_name")]
        strategy: SyncStrategy,
        /// Ring slots.
        slots: u32,
        /// Consumer processes.
        consumers: u32,
    },
    /// A three-stage pipeline through the frame API: a `Producer` (A), a `Stage` process (B) that XORs every word
    /// of each frame into its own ring (`gpu_ipc_xor_words`), and a `Consumer` process (C) that verifies the
    /// transformed frames; latency from A's publish to C's verify done. Both rings have the same backend, strategy
    /// and depth.
    ThreeStage {
        /// The backend of both rings.
        backend: BackendKind,
        /// The sync strategy of both rings.
        #[serde(with = "strategy_name")]
        strategy: SyncStrategy,
        /// Slots of each ring.
        slots: u32,
    },
}

impl RowSpec {
    /// The row's name: `single-process`, `bandwidth-floor`, `study-c-ipc-sleep`, `ours-vmm-gpu-stream-ops-s4-c1`,
    /// `three-stage-vmm-gpu-stream-ops-s4`.
    pub fn name(&self) -> String {
        match self {
            Self::SingleProcess => "single-process".to_owned(),
            Self::SingleProcessPipelined { slots } => format!("single-process-pipelined-s{slots}"),
            Self::Bandwidth => "bandwidth-floor".to_owned(),
            Self::Study { design } => design.name().to_owned(),
            Self::Ours { backend, strategy, slots, consumers } => {
                format!("ours-{}-{}-s{slots}-c{consumers}", backend.name(), strategy.name())
            }
            Self::ThreeStage { backend, strategy, slots } => {
                format!("three-stage-{}-{}-s{slots}", backend.name(), strategy.name())
            }
        }
    }

    /// Whether this row is a reference (always run: the ratios need them).
    pub fn is_reference(&self) -> bool {
        matches!(self, Self::SingleProcess | Self::SingleProcessPipelined { .. } | Self::Bandwidth)
    }
}

/// Buffers of the pipelined single-process references: the shallowest ring that overlaps a fill with a verify, and
/// the depth where the frame API's best rows are.
pub const PIPELINED_SLOTS: [u32; 2] = [2, 8];

/// Every row of a run, references first: the full grid, or with `quick` slots 1 and 4 and 4 consumers only at 4
/// slots; then the three-stage rows (every backend and strategy at [`THREE_STAGE_SLOTS`] slots), in both.
pub fn all_rows(backends: &[BackendKind], quick: bool) -> Vec<RowSpec> {
    let mut rows = vec![RowSpec::SingleProcess];
    rows.extend(PIPELINED_SLOTS.iter().map(|&slots| RowSpec::SingleProcessPipelined { slots }));
    rows.push(RowSpec::Bandwidth);
    rows.extend(StudyDesign::ALL.iter().map(|&design| RowSpec::Study { design }));
    let slots: &[u32] = if quick { &QUICK_SLOTS } else { &SLOTS };
    for &backend in backends {
        for strategy in SyncStrategy::ALL {
            for &consumers in &CONSUMERS {
                for &s in slots {
                    if quick && consumers > 1 && s != 4 {
                        continue;
                    }
                    rows.push(RowSpec::Ours { backend, strategy, slots: s, consumers });
                }
            }
        }
    }
    for &backend in backends {
        for strategy in SyncStrategy::ALL {
            rows.push(RowSpec::ThreeStage { backend, strategy, slots: THREE_STAGE_SLOTS });
        }
    }
    if !quick {
        rows.extend(deep_rows(backends, &DEEP_SLOTS));
    }
    rows
}

/// Our rows at ring depths `slots` (each 1 to 256), one consumer, for the strategies whose frames the CPU does not
/// wait for one by one (`ipc-event`, `gpu-stream-ops`, `gpu-poll`: the ones a deeper ring lets run further
/// ahead; the CPU strategies wait for every frame on the CPU, so depth past the grid's changes nothing for them).
pub fn deep_rows(backends: &[BackendKind], slots: &[u32]) -> Vec<RowSpec> {
    let mut rows = Vec::new();
    for &backend in backends {
        for strategy in SyncStrategy::ALL.into_iter().filter(|&s| publishes_on_gpu(s)) {
            rows.extend(slots.iter().map(|&slots| RowSpec::Ours { backend, strategy, slots, consumers: 1 }));
        }
    }
    rows
}

/// Every row of a run given `--slots`: the references and the study's designs, then our rows at those depths only
/// (every strategy and consumer count of the grid), in place of the grid's depths; no three-stage rows.
pub fn rows_at_slots(backends: &[BackendKind], slots: &[u32]) -> Vec<RowSpec> {
    let mut rows: Vec<RowSpec> = all_rows(backends, true)
        .into_iter()
        .filter(|r| !matches!(r, RowSpec::Ours { .. } | RowSpec::ThreeStage { .. }))
        .collect();
    for &backend in backends {
        for strategy in SyncStrategy::ALL {
            for &consumers in &CONSUMERS {
                rows.extend(slots.iter().map(|&slots| RowSpec::Ours { backend, strategy, slots, consumers }));
            }
        }
    }
    rows
}

/// The rows `filters` select: every reference, and every other row that matches a filter. A filter matches when
/// each of its `+`-separated parts occurs in the row's name (`vmm+gpu-stream-ops` matches
/// `ours-vmm-gpu-stream-ops-s4-c1`); no filter selects everything.
pub fn select(rows: &[RowSpec], filters: &[String]) -> Vec<RowSpec> {
    rows.iter()
        .filter(|row| {
            if row.is_reference() || filters.is_empty() {
                return true;
            }
            let name = row.name();
            filters.iter().any(|f| f.split('+').filter(|p| !p.is_empty()).all(|part| name.contains(part)))
        })
        .copied()
        .collect()
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn the_full_grid_and_the_quick_one() {
        let backends = gpu_ipc::COMPILED_GPU;
        let full = all_rows(backends, false);
        let deep = backends.len() * 3 * DEEP_SLOTS.len();
        assert_eq!(full.len(), 4 + 4 + backends.len() * 5 * 6 * 2 + backends.len() * 5 + deep);
        assert_eq!(full[0], RowSpec::SingleProcess);
        assert_eq!(full[1], RowSpec::SingleProcessPipelined { slots: 2 });
        assert_eq!(full[2].name(), "single-process-pipelined-s8");
        assert_eq!(full[3], RowSpec::Bandwidth);
        assert!(full[..4].iter().all(RowSpec::is_reference) && !full[4].is_reference());
        let quick = all_rows(backends, true);
        assert_eq!(quick.len(), 4 + 4 + backends.len() * 5 * 3 + backends.len() * 5);
        let names: Vec<String> = quick.iter().map(RowSpec::name).collect();
        let backend = backends[0].name();
        assert!(names.contains(&format!("ours-{backend}-cpu-spin-s4-c4")));
        assert!(!names.contains(&format!("ours-{backend}-cpu-spin-s1-c4")));
        // Every three-stage row has its two-process row beside it in both grids.
        for name in names.iter().filter(|n| n.starts_with("three-stage-")) {
            let two = name.replace("three-stage-", "ours-") + "-c1";
            assert!(names.contains(&two), "{name} without {two}");
        }
        let mut unique = names.clone();
        unique.sort();
        unique.dedup();
        assert_eq!(unique.len(), names.len(), "row names are unique");
    }

    #[test]
    fn the_deep_rows_run_the_strategies_a_deeper_ring_helps_at_64_128_and_256_slots() {
        let backend = gpu_ipc::COMPILED_GPU[0];
        let names: Vec<String> = all_rows(&[backend], false).iter().map(RowSpec::name).collect();
        let b = backend.name();
        for slots in DEEP_SLOTS {
            for strategy in ["ipc-event", "gpu-stream-ops", "gpu-poll"] {
                assert!(names.contains(&format!("ours-{b}-{strategy}-s{slots}-c1")), "{strategy} at {slots}");
            }
            assert!(!names.contains(&format!("ours-{b}-cpu-spin-s{slots}-c1")), "cpu-spin at {slots}");
        }
        let quick: Vec<String> = all_rows(&[backend], true).iter().map(RowSpec::name).collect();
        assert!(quick.iter().all(|n| !n.contains("-s256-")), "no deep row in the quick grid");
        // `--slots`: the references and the study, then every strategy and consumer count at the given depths only.
        let at = rows_at_slots(&[backend], &[200]);
        assert_eq!(at.len(), 4 + 4 + 5 * 2, "{at:?}");
        assert!(at[8..].iter().all(|r| matches!(r, RowSpec::Ours { slots: 200, .. })));
        assert_eq!(at[8].name(), format!("ours-{b}-cpu-spin-s200-c1"));
    }

    #[test]
    fn names() {
        let backend = gpu_ipc::COMPILED_GPU[0];
        let row = RowSpec::Ours { backend, strategy: SyncStrategy::GpuStreamOps, slots: 16, consumers: 4 };
        assert_eq!(row.name(), format!("ours-{}-gpu-stream-ops-s16-c4", backend.name()));
        assert_eq!(RowSpec::Study { design: StudyDesign::LegacyIpcSpin }.name(), "study-d-ipc-spin");
        assert_eq!(RowSpec::Bandwidth.name(), "bandwidth-floor");
        let three = RowSpec::ThreeStage { backend, strategy: SyncStrategy::IpcEvent, slots: 4 };
        assert_eq!(three.name(), format!("three-stage-{}-ipc-event-s4", backend.name()));
        assert!(!three.is_reference());
        let json = serde_json::to_string(&three).unwrap();
        assert!(json.contains(r#""kind":"three-stage""#) && json.contains(r#""strategy":"ipc-event""#), "{json}");
        assert_eq!(serde_json::from_str::<RowSpec>(&json).unwrap(), three);
    }

    #[test]
    fn the_three_stage_rows_are_selected_alone_or_with_their_two_process_rows() {
        let rows = all_rows(gpu_ipc::COMPILED_GPU, true);
        let names = |filters: &[&str]| -> Vec<String> {
            let filters: Vec<String> = filters.iter().map(|f| (*f).to_owned()).collect();
            select(&rows, &filters).iter().map(RowSpec::name).collect()
        };
        let alone = names(&["three-stage"]);
        assert_eq!(alone.len(), 4 + gpu_ipc::COMPILED_GPU.len() * 5, "{alone:?}");
        let backend = gpu_ipc::COMPILED_GPU[0].name();
        let pair = names(&[&format!("{backend}+gpu-stream-ops+s4")]);
        assert_eq!(
            pair[4..],
            [
                format!("ours-{backend}-gpu-stream-ops-s4-c1"),
                format!("ours-{backend}-gpu-stream-ops-s4-c4"),
                format!("three-stage-{backend}-gpu-stream-ops-s4")
            ]
        );
    }

    #[test]
    fn selection_keeps_references_and_matches_every_part() {
        let rows = all_rows(gpu_ipc::COMPILED_GPU, false);
        let backend = gpu_ipc::COMPILED_GPU[0].name();
        let picked = select(&rows, &[format!("{backend}+gpu-stream-ops+-c4")]);
        let names: Vec<String> = picked.iter().map(RowSpec::name).collect();
        assert_eq!(names.len(), 4 + 6, "{names:?}");
        assert_eq!(names[0], "single-process");
        assert_eq!(names[3], "bandwidth-floor");
        assert!(names[4..].iter().all(|n| n.contains("gpu-stream-ops") && n.ends_with("-c4")));
        let study = select(&rows, &["study".to_owned(), "nothing-matches".to_owned()]);
        assert_eq!(study.len(), 4 + 4);
        assert_eq!(select(&rows, &[]).len(), rows.len());
    }

    #[test]
    fn strategies_map_to_the_api() {
        for strategy in SyncStrategy::ALL {
            assert_eq!(strategy.to_string(), strategy.name(), "one spelling everywhere");
        }
        assert!(publishes_on_gpu(SyncStrategy::GpuPoll));
        assert!(publishes_on_gpu(SyncStrategy::IpcEvent));
        assert!(!publishes_on_gpu(SyncStrategy::CpuSleep));
        let ours = RowSpec::Ours { backend: BackendKind::Vmm, strategy: SyncStrategy::CpuSpin, slots: 2, consumers: 1 };
        let json = serde_json::to_string(&ours).unwrap();
        assert!(json.contains(r#""strategy":"cpu-spin""#), "{json}");
        assert_eq!(serde_json::from_str::<RowSpec>(&json).unwrap(), ours);
        let row = RowSpec::Study { design: StudyDesign::PinnedStaging };
        let json = serde_json::to_string(&row).unwrap();
        assert_eq!(json, r#"{"kind":"study","design":"pinned-staging"}"#);
        assert_eq!(serde_json::from_str::<RowSpec>(&json).unwrap(), row);
    }
}
