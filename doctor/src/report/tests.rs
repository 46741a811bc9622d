//! Tests of `report.rs` (kept apart so that the module reads in one screenful more).

use super::super::system::{ContainerHints, NamespaceInfo, ShmSpace};
use super::*;
use gpu_ipc::BackendKind;
use harness::mps::{MpsProcess, MpsRole};

fn ids(report: &DoctorReport) -> Vec<(String, Severity)> {
    findings(report).into_iter().map(|finding| (finding.id, finding.severity)).collect()
}

fn has(report: &DoctorReport, id: &str, severity: Severity) -> bool {
    ids(report).contains(&(id.to_owned(), severity))
}

/// The sample with every self-test passing, so each test changes one fact.
fn healthy() -> DoctorReport {
    let mut report = sample_report();
    for test in &mut report.self_tests {
        test.verdict = SelfTestVerdict::Pass;
    }
    report
}

#[test]
fn healthy_machine_only_has_the_mps_and_rdma_notes_and_passes() {
    let report = healthy();
    assert_eq!(
        ids(&report),
        vec![("mps-inactive".to_owned(), Severity::Info), ("no-rdma-device".to_owned(), Severity::Info)]
    );
    assert_eq!(overall(&report, &findings(&report)), Overall::Pass);
}

#[test]
fn human_bytes_uses_binary_units() {
    assert_eq!(human_bytes(512), "512 B");
    assert_eq!(human_bytes(64 << 20), "64.0 MiB");
    assert_eq!(human_bytes(85_045_346_304), "79.2 GiB");
}

#[test]
fn compute_modes_map_to_findings() {
    let mut report = healthy();
    report.devices[1].compute_mode = ComputeMode::Prohibited;
    assert!(has(&report, "compute-mode-prohibited", Severity::Fail));
    let prohibited = findings(&report).into_iter().find(|f| f.id == "compute-mode-prohibited").unwrap();
    assert_eq!(prohibited.fix.as_deref(), Some("As root: nvidia-smi -i 1 -c DEFAULT"));

    report.devices[1].compute_mode = ComputeMode::ExclusiveProcess;
    assert!(has(&report, "compute-mode-exclusive-process", Severity::Fail));
    report.system.mps.processes = Fact::Known(vec![MpsProcess { pid: 7, role: MpsRole::Control }]);
    assert!(has(&report, "compute-mode-exclusive-process", Severity::Info));
    assert!(has(&report, "mps-active", Severity::Info));
    assert!(has(&report, "mps-persistent-kernels", Severity::Warn));

    report.devices[1].compute_mode = ComputeMode::Unknown(1);
    assert!(has(&report, "compute-mode-unknown", Severity::Warn));
}

#[test]
fn missing_capabilities_fail_only_built_backends() {
    let mut report = healthy();
    report.devices[0].unified_addressing = Some(false);
    report.devices[0].posix_fd_handles = Some(false);
    assert!(has(&report, "legacy-needs-unified-addressing", Severity::Fail));
    assert!(has(&report, "vmm-unsupported", Severity::Fail));
    report.built_backends = vec![BackendKind::Legacy];
    assert!(has(&report, "vmm-unsupported", Severity::Info));
    report.devices[0].vmm_supported = None;
    assert!(has(&report, "capability-unknown", Severity::Warn));
}

#[test]
fn sync_strategy_gaps_warn() {
    let mut report = healthy();
    report.devices[0].ipc_events = Some(false);
    report.devices[0].stream_mem_ops.ops_64_bit = Some(false);
    assert!(has(&report, "ipc-events-unsupported", Severity::Warn));
    assert!(has(&report, "stream-mem-ops-64-unsupported", Severity::Warn));
}

#[test]
fn system_facts_map_to_findings() {
    let mut report = healthy();
    report.system.wsl = Fact::Known(true);
    report.system.ptrace_scope = Fact::Known(2);
    report.system.dev_shm = Fact::Known(ShmSpace { total_bytes: 32 << 20, free_bytes: 30 << 20 });
    report.system.container = ContainerHints { detected: true, evidence: vec!["/.dockerenv exists".to_owned()] };
    report.system.pid_namespace =
        Fact::Known(NamespaceInfo { inode: 4_026_532_301, initial: false, same_as_pid1: Some(true) });
    assert!(has(&report, "wsl-legacy-unsupported", Severity::Fail));
    assert!(has(&report, "ptrace-scope-restrictive", Severity::Info));
    assert!(has(&report, "dev-shm-small", Severity::Warn));
    let namespaces = findings(&report).into_iter().find(|f| f.id == "private-namespaces").unwrap();
    assert_eq!(namespaces.severity, Severity::Info);
    assert_eq!(namespaces.what, "this container has its own PID namespace");

    report.system.ptrace_scope = Fact::Known(1);
    report.system.dev_shm = Fact::Known(ShmSpace { total_bytes: 64 << 20, free_bytes: 64 << 20 });
    assert!(!ids(&report).iter().any(|(id, _)| id == "ptrace-scope-restrictive" || id == "dev-shm-small"));
}

#[test]
fn driver_problems_fail_and_mean_no_cuda() {
    let mut report = healthy();
    report.devices.clear();
    report.self_tests.clear();
    report.driver.library_found = false;
    report.driver.library_path_or_error = "libcuda.so.1: cannot open shared object file".to_owned();
    report.system.container.detected = true;
    let missing = findings(&report).into_iter().find(|f| f.id == "driver-library-missing").unwrap();
    assert_eq!(missing.severity, Severity::Fail);
    assert!(missing.fix.unwrap().contains("--gpus all"));
    assert_eq!(overall(&report, &findings(&report)), Overall::NoCuda);

    report.driver.library_found = true;
    report.driver.error = Some("cuInit: CUDA_ERROR_NO_DEVICE".to_owned());
    report.system.device_nodes = Fact::Known(Vec::new());
    let init = findings(&report).into_iter().find(|f| f.id == "driver-init-failed").unwrap();
    assert!(init.fix.unwrap().contains("no /dev/nvidia* device nodes"));
    assert_eq!(overall(&report, &findings(&report)), Overall::NoCuda);

    report.driver.error = None;
    assert!(has(&report, "no-device", Severity::Fail));

    report.system.device_nodes = Fact::Known(vec!["nvidia0".to_owned(), "nvidiactl".to_owned()]);
    assert!(has(&report, "uvm-node-missing", Severity::Warn));
}

#[test]
fn findings_are_sorted_most_severe_first() {
    let mut report = healthy();
    report.system.ptrace_scope = Fact::Known(3);
    report.devices[0].ipc_events = Some(false);
    report.devices[1].compute_mode = ComputeMode::Prohibited;
    let severities: Vec<Severity> = findings(&report).into_iter().map(|f| f.severity).collect();
    assert_eq!(severities, vec![Severity::Fail, Severity::Warn, Severity::Info, Severity::Info, Severity::Info]);
}

#[test]
fn overall_follows_self_tests_of_built_backends() {
    let sample = sample_report();
    assert_eq!(sample.verdict, Overall::Fail, "the sample's vmm self-test fails");

    let mut report = healthy();
    report.self_tests[1].verdict = SelfTestVerdict::Skipped;
    assert_eq!(overall(&report, &findings(&report)), Overall::Fail, "skipped is not a pass");

    report.self_tests.truncate(1);
    assert_eq!(overall(&report, &[]), Overall::Fail, "vmm is built but has no self-test");
    report.built_backends = vec![BackendKind::Legacy];
    assert_eq!(overall(&report, &[]), Overall::Pass);

    report.self_tests.clear();
    report.devices[0].compute_mode = ComputeMode::Prohibited;
    assert_eq!(overall(&report, &findings(&report)), Overall::Fail, "no self-tests: fail findings decide");
}

#[test]
fn under_mps_a_warning_says_a_kill_of_a_polling_process_can_fault_every_client_and_what_to_do() {
    let mut report = healthy();
    assert!(!findings(&report).iter().any(|f| f.id == "mps-persistent-kernels"));
    report.system.mps.processes = Fact::Known(vec![MpsProcess { pid: 7, role: MpsRole::Server }]);
    let all = findings(&report);
    let warning = all.iter().find(|f| f.id == "mps-persistent-kernels").unwrap();
    assert_eq!(warning.severity, Severity::Warn);
    assert!(warning.what.contains("SIGKILL") && warning.what.contains("every MPS client"), "{}", warning.what);
    for named in ["gpu-poll", "persistent kernels", "frame graphs", "error 700", "cuStreamWaitValue64"] {
        assert!(warning.why.contains(named), "{named} not in {}", warning.why);
    }
    let fix = warning.fix.as_deref().unwrap();
    assert!(fix.contains("abort word") && fix.contains("prefer gpu-stream-ops"), "{fix}");
    // What the library does about it, and how it is turned off.
    for named in ["kernel lease", "survivor's abort word", "GPU_IPC_KERNEL_LEASE_MS=0", "mps-kills"] {
        assert!(warning.why.contains(named), "{named} not in {}", warning.why);
    }
    assert!(fix.contains("Keep the kernel lease on"), "{fix}");
    // A warning does not fail the doctor by itself.
    assert_ne!(overall(&report, &all), Overall::Fail);
}
