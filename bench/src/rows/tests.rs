//! Tests of `rows.rs`: the grid, the names, the budgets and the selection.

use super::*;

/// References in every run: the single-process limit, the pipelined ones handed over by events and by stream memory
/// operations, the bandwidth floor.
const REFERENCES: usize = 8;

/// Rows besides ours and the three-stage ones: references, kernels alone, study designs, paced, frame graphs,
/// resident, memory.
fn others(backends: usize) -> usize {
    REFERENCES
        + 2
        + 6
        + PACES.len() * 5
        + backends * graph_strategies().count() * GRAPH_SLOTS.len() * GraphWait::ALL.len()
        + backends * (PIPELINED_SLOTS.len() + 1)
        + MemoryTest::ALL.len()
        + backends * 3
}

#[test]
fn the_full_grid_and_the_quick_one() {
    let backends = gpu_ipc::COMPILED_GPU;
    let full = all_rows(backends, false);
    let deep = backends.len() * 3 * DEEP_SLOTS.len();
    assert_eq!(full.len(), others(backends.len()) + backends.len() * 5 * 6 * 2 + backends.len() * 5 + deep);
    assert_eq!(full[0], RowSpec::SingleProcess);
    assert_eq!(full[1], RowSpec::SingleProcessPipelined { slots: 2 });
    assert_eq!(full[3].name(), "single-process-pipelined-s8");
    assert_eq!(full[4], RowSpec::SingleProcessMemOps { slots: 2 });
    assert_eq!(full[6].name(), "single-process-memops-s8");
    assert_eq!(full[7], RowSpec::Bandwidth);
    assert!(full[..REFERENCES].iter().all(RowSpec::is_reference) && !full[REFERENCES].is_reference());
    // The kernels alone right after the references, then the study's designs, the basic one as it was first.
    assert_eq!(full[8].name(), "kernel-fill-only");
    assert_eq!(full[9].name(), "kernel-verify-only");
    assert_eq!(full[10].name(), "study-a-pageable-shm-16ms");
    assert_eq!(full[11].name(), "study-a-pageable-shm");
    let quick = all_rows(backends, true);
    assert_eq!(quick.len(), others(backends.len()) + backends.len() * 5 * 3 + backends.len() * 5);
    let names: Vec<String> = quick.iter().map(RowSpec::name).collect();
    let backend = backends[0].name();
    assert!(names.contains(&format!("ours-{backend}-cpu-spin-s4-c4")));
    assert!(!names.contains(&format!("ours-{backend}-cpu-spin-s1-c4")));
    // Every three-stage and every paced row has its two-process row beside it in both grids.
    for name in names.iter().filter(|n| n.starts_with("three-stage-")) {
        let two = name.replace("three-stage-", "ours-") + "-c1";
        assert!(names.contains(&two), "{name} without {two}");
    }
    let paced: Vec<&String> = names.iter().filter(|n| n.starts_with("paced-")).collect();
    assert_eq!(paced.len(), 15);
    for name in paced {
        let rest = name.splitn(3, '-').nth(2).unwrap();
        let two = format!("ours-{rest}-c1");
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
    let base = base_rows(&[backend]).len();
    assert!(at[..base].iter().all(|r| r.is_reference() || matches!(r, RowSpec::Study { .. })), "{at:?}");
    assert_eq!(at.len(), base + 5 * 2, "{at:?}");
    assert!(at[base..].iter().all(|r| matches!(r, RowSpec::Ours { slots: 200, .. })));
    assert_eq!(at[base].name(), format!("ours-{b}-cpu-spin-s200-c1"));
}

#[test]
fn the_paced_rows_use_one_backend_vmm_first() {
    assert_eq!(paced_backend(&[BackendKind::Legacy, BackendKind::Vmm]), Some(BackendKind::Vmm));
    assert_eq!(paced_backend(&[BackendKind::Legacy]), Some(BackendKind::Legacy));
    assert_eq!(paced_backend(&[]), None);
    let rows = all_rows(&[], false);
    assert!(rows.iter().all(|r| !matches!(r, RowSpec::Paced { .. } | RowSpec::Imported { .. })));
    let row = RowSpec::Paced { backend: BackendKind::Vmm, strategy: SyncStrategy::GpuStreamOps, slots: 4, fps: 240 };
    assert_eq!(row.name(), "paced-240-vmm-gpu-stream-ops-s4");
    let json = serde_json::to_string(&row).unwrap();
    assert_eq!(json, r#"{"kind":"paced","backend":"vmm","strategy":"gpu-stream-ops","slots":4,"fps":240}"#);
    assert_eq!(serde_json::from_str::<RowSpec>(&json).unwrap(), row);
}

#[test]
fn budgets_per_row() {
    let vmm = BackendKind::Vmm;
    let paced = |fps| RowSpec::Paced { backend: vmm, strategy: SyncStrategy::CpuSpin, slots: 4, fps };
    // At least 1,000 frames and 2 s, at most --frames.
    assert_eq!(paced_frames(60, 2_000), 1_000);
    assert_eq!(paced_frames(1_000, 2_000), 2_000);
    assert_eq!(paced_frames(1_000, 5_000), 2_000);
    assert_eq!(paced_frames(60, 300), 300);
    assert_eq!(paced_frames(60, 0), 1);
    assert_eq!(paced(240).budget(2_000, 200), (1_000, PACED_WARMUP));
    assert_eq!(paced(1_000).budget(300, 30), (300, 10));
    // The 16 ms design and what crosses PCIe measure fewer; everything else the run's own.
    let study = |design| RowSpec::Study { design };
    assert_eq!(study(StudyDesign::PageableShm16ms).budget(2_000, 200), (SLOW_STUDY_FRAMES, 10));
    assert_eq!(study(StudyDesign::MappedZeroCopy).budget(2_000, 200), (PCIE_FRAMES, 50));
    assert_eq!(study(StudyDesign::MappedZeroCopy).budget(300, 30), (300, 30));
    assert_eq!(study(StudyDesign::LegacyIpcSpin).budget(2_000, 200), (2_000, 200));
    assert_eq!(RowSpec::Memory { test: MemoryTest::PinnedHtoD }.budget(2_000, 200), (PCIE_FRAMES, 50));
    assert_eq!(RowSpec::Memory { test: MemoryTest::LocalWithin }.budget(2_000, 200), (2_000, 200));
    assert_eq!(RowSpec::Imported { backend: vmm, copy: ImportedCopy::To }.budget(2_000, 200), (2_000, 200));
    assert_eq!(RowSpec::SingleProcess.budget(7, 3), (7, 3));
}

#[test]
fn the_new_rows_names_and_json() {
    let names: Vec<String> = all_rows(&[BackendKind::Legacy, BackendKind::Vmm], false)
        .iter()
        .map(RowSpec::name)
        .filter(|n| n.starts_with("memory-") || n.starts_with("kernel-") || n.contains("zero-copy"))
        .collect();
    assert_eq!(
        names,
        [
            "kernel-fill-only",
            "kernel-verify-only",
            "study-mapped-zero-copy",
            "memory-pinned-htod",
            "memory-pinned-dtoh",
            "memory-mapped-kernel-write",
            "memory-mapped-kernel-read",
            "memory-local-within",
            "memory-imported-legacy-to",
            "memory-imported-legacy-from",
            "memory-imported-legacy-within",
            "memory-imported-vmm-to",
            "memory-imported-vmm-from",
            "memory-imported-vmm-within",
        ]
    );
    for row in [
        RowSpec::Memory { test: MemoryTest::MappedKernelRead },
        RowSpec::Imported { backend: BackendKind::Legacy, copy: ImportedCopy::Within },
        RowSpec::Kernel { kernel: KernelAlone::Verify },
        RowSpec::Study { design: StudyDesign::PageableShm16ms },
    ] {
        let json = serde_json::to_string(&row).unwrap();
        assert_eq!(serde_json::from_str::<RowSpec>(&json).unwrap(), row, "{json}");
    }
    assert_eq!(
        serde_json::to_string(&RowSpec::Memory { test: MemoryTest::PinnedDtoH }).unwrap(),
        r#"{"kind":"memory","test":"pinned-dtoh"}"#
    );
    assert!(StudyDesign::MappedZeroCopy.in_host_memory() && !StudyDesign::MappedZeroCopy.through_host());
    assert!(StudyDesign::PageableShm16ms.through_host() && !StudyDesign::PageableShm16ms.pinned());
    assert_eq!(StudyDesign::PageableShm16ms.poll_interval(), Some(std::time::Duration::from_millis(16)));
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
    assert_eq!(alone.len(), REFERENCES + gpu_ipc::COMPILED_GPU.len() * 5, "{alone:?}");
    let backend = gpu_ipc::COMPILED_GPU[0].name();
    let mut pair = names(&[&format!("{backend}+gpu-stream-ops+s4")]);
    pair.retain(|n| !n.starts_with("paced-") && !n.starts_with("graphs-"));
    assert_eq!(
        pair[REFERENCES..],
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
    assert_eq!(names.len(), REFERENCES + 6, "{names:?}");
    assert_eq!(names[0], "single-process");
    assert_eq!(names[REFERENCES - 1], "bandwidth-floor");
    assert!(names[REFERENCES..].iter().all(|n| n.contains("gpu-stream-ops") && n.ends_with("-c4")));
    let study = select(&rows, &["study".to_owned(), "nothing-matches".to_owned()]);
    assert_eq!(study.len(), REFERENCES + 6);
    let paced = select(&rows, &["paced-60-".to_owned()]);
    assert_eq!(paced.len(), REFERENCES + 5, "one pace, every strategy");
    let graphs = select(&rows, &["graphs-".to_owned()]);
    assert_eq!(graphs.len(), REFERENCES + gpu_ipc::COMPILED_GPU.len() * 8, "two strategies at two depths, two waits");
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

#[test]
fn the_frame_graph_rows_and_their_laps() {
    let backend = gpu_ipc::COMPILED_GPU[0];
    let names: Vec<String> = all_rows(&[backend], true).iter().map(RowSpec::name).collect();
    let b = backend.name();
    for strategy in ["gpu-stream-ops", "gpu-poll"] {
        for slots in GRAPH_SLOTS {
            // Each with kernel waits (MPS) and with stream-op waits (both passes), the name saying which.
            for waits in ["kernel-waits", "stream-op-waits"] {
                let name = format!("graphs-{b}-{strategy}-s{slots}-{waits}");
                assert!(names.contains(&name), "{name}");
            }
            // Each beside the same ring driven call by call in the full grid.
            let calls = format!("ours-{b}-{strategy}-s{slots}-c1");
            assert!(all_rows(&[backend], false).iter().any(|r| r.name() == calls), "{calls}");
        }
    }
    assert!(names.iter().all(|n| !n.starts_with("graphs-") || !n.contains("cpu-")), "GPU-side strategies only");
    let row = RowSpec::Graphs {
        backend: BackendKind::Vmm,
        strategy: SyncStrategy::GpuPoll,
        slots: 8,
        waits: GraphWait::Kernels,
    };
    let json = serde_json::to_string(&row).unwrap();
    assert_eq!(json, r#"{"kind":"graphs","backend":"vmm","strategy":"gpu-poll","slots":8,"waits":"kernels"}"#);
    assert_eq!(serde_json::from_str::<RowSpec>(&json).unwrap(), row);
    // Results from before stream-op waits read as kernel waits.
    let old = r#"{"kind":"graphs","backend":"vmm","strategy":"gpu-poll","slots":8}"#;
    assert_eq!(serde_json::from_str::<RowSpec>(old).unwrap(), row);
    let ops = RowSpec::Graphs {
        backend: BackendKind::Vmm,
        strategy: SyncStrategy::GpuPoll,
        slots: 8,
        waits: GraphWait::StreamOps,
    };
    assert_eq!(ops.name(), "graphs-vmm-gpu-poll-s8-stream-op-waits");
    assert!(!row.is_reference() && RowSpec::SingleProcessMemOps { slots: 8 }.is_reference());
    // A lap per launch when the warm-up and the window are whole laps, else one frame.
    assert_eq!(graph_lap(8, 2_000, 200), 8);
    assert_eq!(graph_lap(8, 2_000, 10), 1);
    assert_eq!(graph_lap(8, 300, 40), 1);
    assert_eq!(graph_lap(4, 300, 40), 4);
    assert_eq!(graph_lap(0, 10, 10), 1);
}

#[test]
fn the_resident_rows_sit_at_the_depths_of_the_pipelined_references_and_select_alone() {
    let backends = gpu_ipc::COMPILED_GPU;
    let backend = backends[0];
    let mine: Vec<String> = resident_rows(backend).map(|r| r.name()).collect();
    let b = backend.name();
    assert_eq!(
        mine,
        [
            format!("resident-{b}-s2"),
            format!("resident-{b}-s4"),
            format!("resident-{b}-s8"),
            format!("resident-{b}-s{ONE_BLOCK_SLOTS}-one-block")
        ]
    );
    for quick in [true, false] {
        let rows = all_rows(backends, quick);
        let picked = select(&rows, &["resident".to_owned()]);
        assert_eq!(picked.len(), REFERENCES + backends.len() * 4, "{picked:?}");
        // Each has its pipelined reference at the same depth among the references.
        for row in &picked[REFERENCES..] {
            let RowSpec::Resident { slots, .. } = *row else { panic!("{row:?}") };
            assert!(picked[..REFERENCES].contains(&RowSpec::SingleProcessPipelined { slots }), "{row:?}");
        }
        // The other families' filters do not pick them.
        for filter in ["graphs", "paced", "kernel", "memory", "gpu-stream-ops", "-c1", "three-stage"] {
            let other = select(&rows, &[filter.to_owned()]);
            assert!(!other.iter().any(|r| matches!(r, RowSpec::Resident { .. })), "{filter}");
        }
    }
    let grid = select(&all_rows(backends, true), &[format!("resident-{b}-s4")]);
    assert_eq!(grid.len(), REFERENCES + 2, "the grid row and the one-block row at 4 slots: {grid:?}");
}

#[test]
fn resident_rows_round_trip_as_json_and_default_to_the_grid() {
    let backend = gpu_ipc::COMPILED_GPU[0];
    let row = RowSpec::Resident { backend, slots: 4, shape: ResidentShape::OneBlock };
    let json = serde_json::to_value(row).unwrap();
    assert_eq!(json["kind"], "resident");
    assert_eq!(json["shape"], "one-block");
    assert_eq!(serde_json::from_value::<RowSpec>(json.clone()).unwrap(), row);
    let mut without = json;
    without.as_object_mut().unwrap().remove("shape");
    let back: RowSpec = serde_json::from_value(without).unwrap();
    assert_eq!(back, RowSpec::Resident { backend, slots: 4, shape: ResidentShape::Grid });
    assert_eq!(back.budget(2_000, 200), (2_000, 200), "the run's frames and warm-up");
    assert!(!back.is_reference());
}
