use gpu_ipc::BackendKind;

use super::*;
use crate::results::LatencySummary;
use crate::rows::GraphWait;

fn measured(fps: f64, producer_cpu: f64) -> Measurement {
    Measurement {
        frames: 1000,
        seconds: 1000.0 / fps,
        fps,
        ratio_to_single_process: None,
        latency: None,
        producer_cpu_us_per_frame: producer_cpu,
        consumer_cpu_us_per_frame: vec![producer_cpu + 1.0],
        mismatches: 0,
        bandwidth_gb_s: None,
        frame_gb_s: None,
        note: None,
    }
}

fn row(spec: RowSpec, fps: f64, cpu: f64) -> RowResult {
    RowResult { row: spec.name(), spec, outcome: RowOutcome::Measured(measured(fps, cpu)) }
}

fn ours(strategy: SyncStrategy, slots: u32, fps: f64, cpu: f64) -> RowResult {
    row(RowSpec::Ours { backend: BackendKind::Vmm, strategy, slots, consumers: 1 }, fps, cpu)
}

fn results(rows: Vec<RowResult>) -> PipelineResults {
    PipelineResults {
        frame_bytes: 24_883_200,
        frame_shape: [3840, 2160, 3],
        frames: 1000,
        warmup: 100,
        latency_method: String::new(),
        rows,
    }
}

fn mps_run() -> PipelineResults {
    results(vec![
        row(RowSpec::SingleProcess, 60_000.0, 15.0),
        ours(SyncStrategy::CpuSpin, 1, 30_000.0, 30.0),
        ours(SyncStrategy::CpuSleep, 1, 10_000.0, 20.0),
        ours(SyncStrategy::GpuStreamOps, 1, 33_000.0, 4.0),
        ours(SyncStrategy::CpuSpin, 2, 34_000.0, 30.0),
        ours(SyncStrategy::GpuStreamOps, 2, 32_300.0, 4.5),
        ours(SyncStrategy::IpcEvent, 2, 55_000.0, 20.0),
    ])
}

#[test]
fn best_with_mps_is_judged_against_the_single_process_limit_of_its_run() {
    let j = best_under_mps(&mps_run());
    assert_eq!(j.met, Some(true), "{j:?}");
    assert!(j.measured.starts_with("0.92x (ours-vmm-ipc-event-s2-c1"), "{}", j.measured);
    let mut slow = mps_run();
    slow.rows.retain(|r| !r.row.contains("ipc-event"));
    let j = best_under_mps(&slow);
    assert_eq!(j.met, Some(false));
    assert!(j.measured.starts_with("0.57x"), "{}", j.measured);
    // A frame-graph row is a configuration of ours too.
    slow.rows.push(row(
        RowSpec::Graphs {
            backend: BackendKind::Vmm,
            strategy: SyncStrategy::GpuPoll,
            slots: 8,
            waits: GraphWait::Kernels,
        },
        55_000.0,
        1.0,
    ));
    let j = best_under_mps(&slow);
    assert_eq!(j.met, Some(true));
    assert!(j.measured.starts_with("0.92x (graphs-vmm-gpu-poll-s8-kernel-waits"), "{}", j.measured);
}

#[test]
fn gpu_side_strategies_are_compared_with_the_fastest_cpu_strategy_of_each_cell() {
    let j = gpu_side_at_every_slot_count(&mps_run());
    assert_eq!(j.met, Some(false));
    assert!(j.measured.contains("gpu-stream-ops: as fast or faster in 1 of 2 cells"), "{}", j.measured);
    assert!(j.measured.contains("5.0% slower, vmm, 2 slots, 1 consumers"), "{}", j.measured);
    assert!(j.measured.contains("gpu-poll: not measured"), "{}", j.measured);
}

#[test]
fn wrong_data_or_a_failed_row_never_counts() {
    let mut run = mps_run();
    for r in &mut run.rows {
        if r.row == "ours-vmm-gpu-stream-ops-s2-c1" {
            r.outcome = RowOutcome::Failed { reason: "hung".into() };
        }
        if r.row == "ours-vmm-ipc-event-s2-c1"
            && let RowOutcome::Measured(m) = &mut r.outcome
        {
            m.mismatches = 3;
        }
    }
    let j = gpu_side_at_every_slot_count(&run);
    assert_eq!(j.met, Some(true), "{j:?}");
    assert!(best_under_mps(&run).measured.contains("ours-vmm-cpu-spin-s2-c1"));
}

#[test]
fn no_mps_best_over_the_seed_and_the_cpu_cost_of_the_gpu_side_strategies() {
    let no_mps = results(vec![
        row(RowSpec::Study { design: StudyDesign::LegacyIpcSpin }, 3_000.0, 300.0),
        ours(SyncStrategy::IpcEvent, 32, 28_500.0, 35.0),
    ]);
    let j = no_mps_over_seed(&no_mps);
    assert_eq!(j.met, Some(false));
    assert!(j.measured.starts_with("9.5x"), "{}", j.measured);
    assert!(j.measured.ends_with("above 32 slots not measured"), "{}", j.measured);
    // A deeper ring that reaches the target: met, and the figure says at which depth.
    let mut deeper = no_mps;
    deeper.rows.push(ours(SyncStrategy::IpcEvent, 128, 31_500.0, 35.0));
    let j = no_mps_over_seed(&deeper);
    assert_eq!(j.met, Some(true), "{j:?}");
    assert!(j.measured.starts_with("10.5x (ours-vmm-ipc-event-s128-c1"), "{}", j.measured);
    assert!(
        j.measured.contains("best at 1-32 slots 9.5x (ours-vmm-ipc-event-s32-c1), above 32 slots 10.5x"),
        "{}",
        j.measured
    );
    let j = gpu_side_cpu(&mps_run());
    // Producers 4.0 and 4.5 us, consumers 5.0 and 5.5 us: the consumers miss.
    assert_eq!(j.met, Some(false), "{j:?}");
    assert!(j.measured.contains("gpu-stream-ops: producer 4.0-4.5 us, consumers 5.0-5.5 us"), "{}", j.measured);
    let j = gpu_side_cpu(&results(vec![]));
    assert_eq!(j.met, None);
}

#[test]
fn the_table_says_which_targets_were_missed() {
    let table = markdown(&judge(&results(vec![]), &mps_run()));
    assert!(table.starts_with("| target | measured | met |"));
    assert_eq!(table.lines().count(), 12);
    assert!(table.contains("| **no** |"));
    assert!(table.contains("| not measured |"));
    assert!(table.contains("| without MPS: every strategy paced at 60, 240 and 1,000 FPS"), "{table}");
}

fn paced(strategy: SyncStrategy, fps: u32, achieved: f64, p999_us: f64) -> RowResult {
    let spec = RowSpec::Paced { backend: BackendKind::Vmm, strategy, slots: 4, fps };
    let mut m = measured(achieved, 3.0);
    m.latency = Some(LatencySummary {
        count: 1000,
        p50_us: p999_us / 4.0,
        p99_us: p999_us / 2.0,
        p999_us,
        max_us: p999_us,
        mean_us: p999_us / 4.0,
        cdf: Vec::new(),
    });
    RowResult { row: spec.name(), spec, outcome: RowOutcome::Measured(m) }
}

#[test]
fn paced_rows_must_keep_their_pace_and_finish_each_frame_within_its_interval() {
    let mut run = results(vec![
        paced(SyncStrategy::CpuSpin, 60, 60.1, 50.0),
        paced(SyncStrategy::CpuSpin, 1_000, 1_000.5, 40.0),
        paced(SyncStrategy::IpcEvent, 1_000, 999.0, 900.0),
        RowResult {
            row: "paced-60-vmm-gpu-poll-s4".into(),
            spec: RowSpec::Paced { backend: BackendKind::Vmm, strategy: SyncStrategy::GpuPoll, slots: 4, fps: 60 },
            outcome: RowOutcome::Unavailable { reason: "no MPS".into() },
        },
    ]);
    let j = paced_latency(&run, "with MPS");
    assert_eq!(j.met, Some(true), "{j:?}");
    assert_eq!(j.measured, "3 of 3 rows (1 unavailable here); lowest p99.9 40.0 us (cpu-spin at 1000 FPS)");
    // Too slow for its pace, and too late for its interval.
    run.rows.push(paced(SyncStrategy::GpuStreamOps, 240, 230.0, 100.0));
    run.rows.push(paced(SyncStrategy::CpuSleep, 1_000, 1_000.0, 1_500.0));
    let j = paced_latency(&run, "with MPS");
    assert_eq!(j.met, Some(false));
    assert!(j.measured.starts_with("3 of 5 rows"), "{}", j.measured);
    assert!(j.measured.contains("paced-240-vmm-gpu-stream-ops-s4: ran 230 FPS (0.958x its pace)"), "{}", j.measured);
    assert!(j.measured.contains("paced-1000-vmm-cpu-sleep-s4: p99.9 1500 us > interval 1000 us"), "{}", j.measured);
    assert_eq!(paced_latency(&results(vec![]), "x").met, None);
}

#[test]
fn the_research_measurements_are_judged_on_being_measured_cleanly() {
    assert_eq!(research_measured(&results(vec![]), "without MPS").met, None);
    let mut rows = vec![
        row(RowSpec::Study { design: StudyDesign::MappedZeroCopy }, 400.0, 1.0),
        row(RowSpec::Study { design: StudyDesign::PageableShm16ms }, 30.0, 1.0),
        row(RowSpec::Study { design: StudyDesign::PageableShm }, 130.0, 1.0),
        row(RowSpec::Kernel { kernel: KernelAlone::Fill }, 100_000.0, 1.0),
        row(RowSpec::Kernel { kernel: KernelAlone::Verify }, 80_000.0, 1.0),
    ];
    rows.extend(MemoryTest::ALL.map(|test| row(RowSpec::Memory { test }, 2_000.0, 1.0)));
    rows.extend(
        ImportedCopy::ALL.map(|copy| row(RowSpec::Imported { backend: BackendKind::Vmm, copy }, 50_000.0, 1.0)),
    );
    let mut run = results(rows);
    for r in &mut run.rows {
        if let RowOutcome::Measured(m) = &mut r.outcome {
            m.bandwidth_gb_s = Some(if r.row == "memory-local-within" { 2_500.0 } else { 2_450.0 });
        }
    }
    run.fill_derived();
    let j = research_measured(&run, "without MPS");
    assert_eq!(j.met, Some(true), "{j:?}");
    assert!(j.measured.starts_with("mapped zero-copy 400 FPS; basic design 16 ms sleeps 30.0 FPS, 1 ms 130 FPS; pinned copies host-to-device 49.8 GB/s"), "{}", j.measured);
    assert!(j.measured.contains("fill alone 10.0 us, verify alone 12.5 us"), "{}", j.measured);
    assert!(
        j.measured.contains("copies within an imported buffer 0.980-0.980x the same within a local one"),
        "{}",
        j.measured
    );
    // A row that read wrong data is not measured.
    if let RowOutcome::Measured(m) = &mut run.rows[0].outcome {
        m.mismatches = 1;
    }
    let j = research_measured(&run, "without MPS");
    assert_eq!(j.met, Some(false));
    assert!(j.measured.ends_with("not measured cleanly: study-mapped-zero-copy"), "{}", j.measured);
}

#[test]
fn ipc_event_and_gpu_stream_ops_are_judged_against_the_pipelined_reference_of_their_depth() {
    let pipelined = |slots: u32, fps: f64| row(RowSpec::SingleProcessPipelined { slots }, fps, 15.0);
    let run = results(vec![
        pipelined(2, 50_000.0),
        pipelined(8, 40_000.0),
        ours(SyncStrategy::IpcEvent, 2, 48_000.0, 20.0),
        ours(SyncStrategy::GpuStreamOps, 8, 38_500.0, 5.0),
        ours(SyncStrategy::CpuSpin, 2, 10_000.0, 30.0), // not judged: a CPU strategy
        ours(SyncStrategy::IpcEvent, 16, 1_000.0, 20.0), // not judged: no reference at 16 buffers
    ]);
    let judged = over_pipelined(&run);
    assert_eq!(judged.met, Some(true), "{}", judged.measured);
    assert!(judged.measured.starts_with("0.96x-0.96x over 2 rows"), "{}", judged.measured);

    let slower = results(vec![pipelined(2, 50_000.0), ours(SyncStrategy::GpuStreamOps, 2, 40_000.0, 5.0)]);
    let judged = over_pipelined(&slower);
    assert_eq!(judged.met, Some(false));
    assert!(judged.measured.contains("below: ours-vmm-gpu-stream-ops-s2-c1"), "{}", judged.measured);

    assert_eq!(over_pipelined(&results(vec![pipelined(2, 50_000.0)])).met, None);

    // The handoff's floor from the same run: the memory-operations reference over the event one, and the
    // gpu-stream-ops rows over that floor; the target itself is still judged against the event reference.
    let mut floor = slower;
    floor.rows.push(row(RowSpec::SingleProcessMemOps { slots: 2 }, 40_000.0, 15.0));
    let judged = over_pipelined(&floor);
    assert_eq!(judged.met, Some(false));
    assert!(
        judged.measured.ends_with(
            "stream memory operations instead of events reach 0.80x-0.80x the reference (that handoff's floor, \
             same run); gpu-stream-ops is 1.00x-1.00x that floor"
        ),
        "{}",
        judged.measured
    );
    // The frame-graph rows against the same references, in words only.
    floor.rows.push(row(
        RowSpec::Graphs {
            backend: BackendKind::Vmm,
            strategy: SyncStrategy::GpuPoll,
            slots: 2,
            waits: GraphWait::Kernels,
        },
        48_000.0,
        1.0,
    ));
    let judged = over_pipelined(&floor);
    assert_eq!(judged.met, Some(false));
    assert!(judged.measured.ends_with("; the same rings on frame graphs: 0.96x-0.96x"), "{}", judged.measured);
}

#[test]
fn frame_graphs_are_judged_on_both_sides_cpu_per_frame() {
    let graphs = |strategy, slots, fps, cpu| {
        row(RowSpec::Graphs { backend: BackendKind::Vmm, strategy, slots, waits: GraphWait::Kernels }, fps, cpu)
    };
    // Producer 1.0 and 2.5 us, consumers 2.0 and 3.5 us: met.
    let run = results(vec![
        graphs(SyncStrategy::GpuStreamOps, 4, 40_000.0, 1.0),
        graphs(SyncStrategy::GpuPoll, 8, 45_000.0, 2.5),
    ]);
    let j = graph_cpu(&run);
    assert_eq!(j.met, Some(true), "{j:?}");
    assert_eq!(j.measured, "producer 1.0-2.5 us, consumer 2.0-3.5 us over 2 rows (40000-45000 FPS)");
    // One consumer above 4 us: missed.
    let mut slow = run.clone();
    slow.rows.push(graphs(SyncStrategy::GpuPoll, 4, 30_000.0, 3.5));
    assert_eq!(graph_cpu(&slow).met, Some(false));
    // A row that failed is named, and the target is not met.
    let mut failed = run;
    failed.rows.push(RowResult {
        row: "graphs-vmm-gpu-poll-s4-kernel-waits".into(),
        spec: RowSpec::Graphs {
            backend: BackendKind::Vmm,
            strategy: SyncStrategy::GpuPoll,
            slots: 4,
            waits: GraphWait::Kernels,
        },
        outcome: RowOutcome::Failed { reason: "hung".into() },
    });
    let j = graph_cpu(&failed);
    assert_eq!(j.met, Some(false));
    assert!(j.measured.ends_with("; not clean: graphs-vmm-gpu-poll-s4-kernel-waits"), "{}", j.measured);
    assert_eq!(graph_cpu(&results(vec![])).met, None);
}

#[test]
fn a_file_that_is_not_the_run_it_was_given_as_is_refused_by_name() {
    use harness::env::MeasurementEnv;
    use harness::{MeasurementOutput, SCHEMA_VERSION, Verdict};
    let dir = harness::process::PrivateDir::new("targets-test").unwrap();
    let write = |name: &str, probe: &str, mps: bool| {
        let env = MeasurementEnv {
            devices: Vec::new(),
            driver: "13.0".to_owned(),
            mps,
            date: "2026-11-28T00:00:00Z".to_owned(),
            commit: "unknown".to_owned(),
            command: "gpu-ipc bench pipeline".to_owned(),
            host: "h".to_owned(),
        };
        let verdict = Verdict { answer: String::new(), key_figure: String::new() };
        let output = MeasurementOutput {
            probe: probe.to_owned(),
            schema: SCHEMA_VERSION,
            quick: true,
            env,
            seconds: 1.0,
            results: mps_run(),
            verdict,
        };
        let path = dir.path().join(name);
        std::fs::write(&path, serde_json::to_string(&output).unwrap()).unwrap();
        path
    };
    let no_mps = write("no-mps.json", "bench-pipeline", false);
    assert_eq!(load(&no_mps, false).unwrap().rows.len(), mps_run().rows.len());
    let err = load(&no_mps, true).unwrap_err();
    assert!(matches!(err, TargetsError::WrongMps { was_mps: false, .. }), "{err}");
    assert!(err.to_string().ends_with("that run was without MPS, but it was given as the run under MPS"), "{err}");
    let overhead = write("overhead.json", "overhead", false);
    assert!(matches!(load(&overhead, false), Err(TargetsError::OtherMeasurement { found, .. }) if found == "overhead"));
    let text = dir.path().join("text.json");
    std::fs::write(&text, "not json").unwrap();
    assert!(matches!(load(&text, false), Err(TargetsError::NotPipelineJson { .. })));
    assert!(matches!(load(&dir.path().join("none.json"), false), Err(TargetsError::Read { .. })));
}
