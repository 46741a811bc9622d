//! The doctor's report: the facts it gathered, the findings it draws from them, and its verdict.
//!
//! These types are the `--json` output, so their field names are a stable interface: add fields, never rename
//! them, and bump [`REPORT_SCHEMA_VERSION`] when a change would break a reader. [`findings`] and [`overall`] are
//! pure functions of the facts, so the table of findings is tested without a GPU.

use gpu_ipc::BackendKind;
use serde::{Deserialize, Serialize};

use harness::cuda::{ComputeMode, DeviceReport, DriverSection};
use harness::fact::Fact;

pub use super::finding::{Finding, Severity};
use super::system::SystemReport;

/// Version of the JSON layout of [`DoctorReport`].
pub const REPORT_SCHEMA_VERSION: u32 = 1;

/// Below this size `/dev/shm` is reported as too small (Docker's default is exactly 64 MiB).
pub const SMALL_DEV_SHM_BYTES: u64 = 64 * 1024 * 1024;

/// The whole doctor report.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DoctorReport {
    /// Layout version of this report, [`REPORT_SCHEMA_VERSION`].
    pub schema_version: u32,
    /// Version of the `gpu-ipc` tool that wrote it.
    pub tool_version: String,
    /// The backends compiled into this binary (Cargo features `legacy`, `vmm`).
    pub built_backends: Vec<BackendKind>,
    /// Whether the CUDA driver could be loaded and initialised.
    pub driver: DriverSection,
    /// One entry per CUDA device, in ordinal order.
    pub devices: Vec<DeviceReport>,
    /// Facts read without CUDA.
    pub system: SystemReport,
    /// End-to-end tests: a second process imports memory the first exported.
    pub self_tests: Vec<SelfTestResult>,
    /// What the facts mean for the user, derived by [`findings`].
    pub findings: Vec<Finding>,
    /// The overall outcome, derived by [`overall`]; it decides the exit code.
    pub verdict: Overall,
}

impl DoctorReport {
    /// Assembles a report from the gathered facts and derives its findings and verdict.
    pub fn new(
        tool_version: String,
        built_backends: Vec<BackendKind>,
        driver: DriverSection,
        devices: Vec<DeviceReport>,
        system: SystemReport,
        self_tests: Vec<SelfTestResult>,
    ) -> Self {
        let mut report = Self {
            schema_version: REPORT_SCHEMA_VERSION,
            tool_version,
            built_backends,
            driver,
            devices,
            system,
            self_tests,
            findings: Vec::new(),
            verdict: Overall::Pass,
        };
        report.findings = findings(&report);
        report.verdict = overall(&report, &report.findings);
        report
    }
}

/// The outcome of one backend's end-to-end self-test.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SelfTestResult {
    /// The backend tested.
    pub backend: BackendKind,
    /// The device it ran on; `None` when it was skipped before one was chosen.
    pub device_ordinal: Option<u32>,
    /// Pass, fail or skipped.
    pub verdict: SelfTestVerdict,
    /// Wall time of the test, in milliseconds.
    pub duration_ms: f64,
    /// What was done, e.g. "exported 4 MiB, child imported it and read the pattern back".
    pub detail: String,
    /// Why it failed or was skipped (the failing call and its `CUresult`).
    pub reason: Option<String>,
    /// What the user can do about it.
    pub fix: Option<String>,
}

/// A self-test's outcome.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SelfTestVerdict {
    /// The backend worked end to end.
    Pass,
    /// The backend failed; `reason` says where.
    Fail,
    /// The test did not run; `reason` says why. It does not count as a pass.
    Skipped,
}

/// The overall outcome; [`super::render::exit_code`] maps it to the process exit code.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Overall {
    /// Every backend built into this binary passed its self-test (or, with no self-tests run, no finding failed).
    Pass,
    /// At least one built backend failed or was skipped (or, with no self-tests run, a finding failed).
    Fail,
    /// No usable CUDA driver, or no GPU: nothing could be tested.
    NoCuda,
}

fn finding(id: &str, severity: Severity, what: String, why: &str, fix: Option<&str>) -> Finding {
    Finding { id: id.to_owned(), severity, what, why: why.to_owned(), fix: fix.map(str::to_owned) }
}

/// Derives the findings from the facts in `report` (its own `findings` and `verdict` fields are ignored), most
/// severe first, in a stable order otherwise.
pub fn findings(report: &DoctorReport) -> Vec<Finding> {
    let mut found = Vec::new();
    driver_findings(report, &mut found);
    for device in &report.devices {
        device_findings(report, device, &mut found);
    }
    system_findings(report, &mut found);
    found.extend(crate::transport::findings(&report.system.transport));
    // A stable sort keeps driver, then device, then system order within one severity.
    found.sort_by_key(|finding| std::cmp::Reverse(finding.severity));
    found
}

/// Severity of a fact that stops `backend`: a failure when the backend is built into this binary, otherwise only
/// worth knowing.
fn backend_severity(report: &DoctorReport, backend: BackendKind) -> Severity {
    if report.built_backends.contains(&backend) { Severity::Fail } else { Severity::Info }
}

fn driver_findings(report: &DoctorReport, found: &mut Vec<Finding>) {
    let driver = &report.driver;
    let system = &report.system;
    let no_device_nodes = system.device_nodes.known().is_some_and(|nodes| nodes.is_empty());
    if !driver.library_found {
        let fix = if system.wsl == Fact::Known(true) {
            "On WSL the driver comes from Windows: install the NVIDIA Windows driver, and check that \
             /usr/lib/wsl/lib is on the loader path (ldconfig -p | grep libcuda)."
        } else if system.container.detected {
            "Start the container with the NVIDIA Container Toolkit (docker run --gpus all, or --runtime=nvidia), \
             which mounts libcuda.so.1 and the /dev/nvidia* nodes."
        } else {
            "Install the NVIDIA driver (it provides libcuda.so.1), or run on a machine with a GPU."
        };
        found.push(finding(
            "driver-library-missing",
            Severity::Fail,
            format!("the CUDA driver library {} could not be loaded", driver.library_name),
            "every CUDA call goes through the driver library; without it nothing can be shared",
            Some(fix),
        ));
    } else if let Some(error) = &driver.error {
        let fix = if no_device_nodes {
            "There are no /dev/nvidia* device nodes: in a container pass the GPUs (--gpus all); on a host check \
             that the NVIDIA kernel module is loaded (nvidia-smi)."
        } else {
            "Run nvidia-smi: if it fails too, the driver is broken (after a driver upgrade, reboot so that the \
             kernel module matches the library); check that CUDA_VISIBLE_DEVICES does not hide every GPU."
        };
        found.push(Finding {
            id: "driver-init-failed".to_owned(),
            severity: Severity::Fail,
            what: format!("the CUDA driver loaded but failed: {error}"),
            why: "a driver that cannot initialise cannot create contexts or share memory".to_owned(),
            fix: Some(fix.to_owned()),
        });
    } else if report.devices.is_empty() {
        found.push(finding(
            "no-device",
            Severity::Fail,
            "the CUDA driver works but reports no device".to_owned(),
            "sharing GPU memory needs a GPU",
            Some("Check CUDA_VISIBLE_DEVICES (an empty or wrong value hides every GPU) and nvidia-smi."),
        ));
    }
    if let Some(nodes) = system.device_nodes.known() {
        let has = |name: &str| nodes.iter().any(|node| node == name);
        if has("nvidiactl") && !has("nvidia-uvm") {
            found.push(finding(
                "uvm-node-missing",
                Severity::Warn,
                "/dev/nvidiactl exists but /dev/nvidia-uvm does not".to_owned(),
                "CUDA needs the nvidia-uvm device; without it cuInit fails",
                Some(
                    "As root run nvidia-modprobe -u -c=0 (or modprobe nvidia-uvm); in a container also pass \
                     /dev/nvidia-uvm.",
                ),
            ));
        }
    }
}

fn device_findings(report: &DoctorReport, device: &DeviceReport, found: &mut Vec<Finding>) {
    let gpu = format!("GPU {} ({})", device.ordinal, device.name);
    match device.compute_mode {
        ComputeMode::Default => {}
        ComputeMode::Prohibited => found.push(Finding {
            id: "compute-mode-prohibited".to_owned(),
            severity: Severity::Fail,
            what: format!("{gpu} is in compute mode Prohibited"),
            why: "no process may create a context on it, so neither backend can use it".to_owned(),
            fix: Some(format!("As root: nvidia-smi -i {} -c DEFAULT", device.ordinal)),
        }),
        ComputeMode::ExclusiveProcess if report.system.mps.active() => found.push(Finding {
            id: "compute-mode-exclusive-process".to_owned(),
            severity: Severity::Info,
            what: format!("{gpu} is in compute mode ExclusiveProcess, with MPS active"),
            why: "the MPS server is the one process holding the GPU and its clients share it, so several processes \
                  can still use it, as long as all of them are MPS clients"
                .to_owned(),
            fix: None,
        }),
        ComputeMode::ExclusiveProcess => found.push(Finding {
            id: "compute-mode-exclusive-process".to_owned(),
            severity: Severity::Fail,
            what: format!("{gpu} is in compute mode ExclusiveProcess"),
            why: "only one process at a time may hold a context, so a second process cannot attach to shared memory"
                .to_owned(),
            fix: Some(format!(
                "As root: nvidia-smi -i {} -c DEFAULT, or start MPS (nvidia-cuda-mps-control -d) so that both \
                 processes share the MPS server",
                device.ordinal
            )),
        }),
        ComputeMode::Unknown(code) => found.push(Finding {
            id: "compute-mode-unknown".to_owned(),
            severity: Severity::Warn,
            what: format!("{gpu} reports compute mode {code}, which this tool does not know"),
            why: "a restrictive mode may stop a second process from creating a context".to_owned(),
            fix: Some(format!("Check with nvidia-smi -i {} -q -d COMPUTE", device.ordinal)),
        }),
    }
    if device.unified_addressing == Some(false) {
        found.push(Finding {
            id: "legacy-needs-unified-addressing".to_owned(),
            severity: backend_severity(report, BackendKind::Legacy),
            what: format!("legacy backend unavailable on {gpu}: no unified addressing"),
            why: "cuIpcGetMemHandle works only on devices with unified addressing".to_owned(),
            fix: Some("Use the vmm backend on this device.".to_owned()),
        });
    }
    let mut vmm_missing = Vec::new();
    if device.vmm_supported == Some(false) {
        vmm_missing.push("virtual memory management");
    }
    if device.posix_fd_handles == Some(false) {
        vmm_missing.push("POSIX file-descriptor handles");
    }
    if !vmm_missing.is_empty() {
        found.push(Finding {
            id: "vmm-unsupported".to_owned(),
            severity: backend_severity(report, BackendKind::Vmm),
            what: format!("vmm backend unavailable on {gpu}: no {}", vmm_missing.join(", no ")),
            why: "the vmm backend allocates with cuMemCreate and exports a POSIX fd; the device or driver supports \
                  neither or not both"
                .to_owned(),
            fix: Some("Use the legacy backend on this device, or a newer driver (VMM needs CUDA 10.2+).".to_owned()),
        });
    }
    let unknown: Vec<&str> = [
        ("unified addressing", device.unified_addressing),
        ("virtual memory management", device.vmm_supported),
        ("POSIX fd handles", device.posix_fd_handles),
    ]
    .into_iter()
    .filter_map(|(name, value)| value.is_none().then_some(name))
    .collect();
    if !unknown.is_empty() {
        found.push(Finding {
            id: "capability-unknown".to_owned(),
            severity: Severity::Warn,
            what: format!("could not query {} on {gpu}", unknown.join(", ")),
            why: "the backends depend on these attributes; the self-tests show whether they work anyway".to_owned(),
            fix: Some("See the device's query errors; a newer driver usually knows the attribute.".to_owned()),
        });
    }
    if device.ipc_events == Some(false) {
        found.push(finding(
            "ipc-events-unsupported",
            Severity::Warn,
            format!("{gpu} does not support IPC events"),
            "the IPC-event sync strategy cannot be used on this device",
            Some("Use the GPU-side (stream memory operations) or a CPU sync strategy."),
        ));
    }
    if device.stream_mem_ops.ops_64_bit == Some(false) {
        found.push(finding(
            "stream-mem-ops-64-unsupported",
            Severity::Warn,
            format!("{gpu} does not support 64-bit stream memory operations"),
            "the GPU-side sync strategy waits on 64-bit sequence counters with cuStreamWaitValue64",
            Some("Use the IPC-event or a CPU sync strategy on this device."),
        ));
    }
}

fn system_findings(report: &DoctorReport, found: &mut Vec<Finding>) {
    let system = &report.system;
    if system.wsl == Fact::Known(true) {
        found.push(finding(
            "wsl-legacy-unsupported",
            backend_severity(report, BackendKind::Legacy),
            "running under WSL".to_owned(),
            "CUDA on WSL does not support legacy IPC (cuIpc*)",
            Some("Use the vmm backend if its self-test passes here, or run on native Linux."),
        ));
    }
    if let Some(scope) = system.ptrace_scope.known().copied().filter(|scope| *scope >= 2) {
        found.push(finding(
            "ptrace-scope-restrictive",
            Severity::Info,
            format!("Yama ptrace_scope is {scope}"),
            "gpu-ipc passes file descriptors with SCM_RIGHTS, which ptrace_scope does not affect; it only stops \
             tools that take a peer's fd with pidfd_getfd (scope 2 needs CAP_SYS_PTRACE, scope 3 forbids it)",
            None,
        ));
    }
    if let Some(shm) = system.dev_shm.known().filter(|shm| shm.total_bytes < SMALL_DEV_SHM_BYTES) {
        found.push(Finding {
            id: "dev-shm-small".to_owned(),
            severity: Severity::Warn,
            what: format!("/dev/shm is only {} ({} free)", human_bytes(shm.total_bytes), human_bytes(shm.free_bytes)),
            why: "MPS and multi-process GPU libraries (NCCL, PyTorch workers) keep shared state in /dev/shm; when it \
                  fills up they fail with errors that do not mention it"
                .to_owned(),
            fix: Some(
                "In Docker pass --shm-size=1g (or --ipc=host); on a host: mount -o remount,size=1G /dev/shm".to_owned(),
            ),
        });
    }
    let private_pid = system.pid_namespace.known().is_some_and(|ns| !ns.initial);
    let private_ipc = system.ipc_namespace.known().is_some_and(|ns| !ns.initial);
    if private_pid || private_ipc {
        let private: Vec<&str> = [(private_pid, "PID"), (private_ipc, "IPC")]
            .into_iter()
            .filter_map(|(private, name)| private.then_some(name))
            .collect();
        let place = if system.container.detected { "this container has" } else { "this process runs in" };
        found.push(Finding {
            id: "private-namespaces".to_owned(),
            severity: Severity::Info,
            what: format!("{place} its own {} namespace", private.join(" and ")),
            why: "the vmm backend passes its fds with SCM_RIGHTS over the Unix socket, which needs nothing but a \
                  socket both can reach, in any PID namespace (pids are not used for liveness when they do not \
                  translate: the socket's hang-up is); legacy CUDA IPC handles also crossed a PID namespace in the \
                  H100 stress run (unshare --pid, root, driver 580; docs/results.md), but pidfd_getfd-based \
                  sharing needs one PID namespace and CAP_SYS_PTRACE, and containers usually isolate more than pids"
                .to_owned(),
            fix: Some(
                "Processes in this namespace can share with each other. To share with another container, use the \
                 vmm backend with a socket in a shared volume, or start both containers with --pid=host --ipc=host \
                 (or --pid=container:<name> --ipc=container:<name>)."
                    .to_owned(),
            ),
        });
    }
    if system.mps.active() {
        found.push(finding(
            "mps-active",
            Severity::Info,
            format!("MPS is active (pipe directory {})", system.mps.pipe_directory),
            "CUDA processes here become MPS clients: kernels of two processes can run on the GPU at the same time \
             instead of taking turns, so cross-process polling is cheap; all processes must use the same pipe \
             directory and run as the user that started the daemon",
            None,
        ));
        found.push(mps_kill_warning());
    } else {
        found.push(finding(
            "mps-inactive",
            Severity::Info,
            "MPS is not active".to_owned(),
            "kernels of two processes take turns on the GPU (time slicing), so a kernel that waits for another \
             process's kernel waits out whole time slices; GPU-side stream waits and deeper rings avoid this",
            Some("For concurrent kernels across processes, start MPS: nvidia-cuda-mps-control -d"),
        ));
    }
}

/// The warning while MPS runs: a SIGKILL of a process with a running persistent kernel (or another kernel that polls
/// shared memory: gpu-poll, frame graphs' ring steps) can fault every MPS client on the GPU; what the library does
/// about it (the kernel lease and the survivor's abort word, `ipc_core::resident::KernelLease`), and what is left to
/// the user.
pub fn mps_kill_warning() -> Finding {
    finding(
        "mps-persistent-kernels",
        Severity::Warn,
        "Under MPS, SIGKILL of a process whose kernel polls shared memory can fault every MPS client".to_owned(),
        "the crash probe and the H200 stress run found that SIGKILLing a process whose kernel waited on memory shared \
         with another process faulted the MPS server, and every client on the GPU with it \
         (CUDA_ERROR_ILLEGAL_ADDRESS, error 700, in processes that never touched that memory), most often with a \
         persistent kernel, which the server must tear down because it never ends; gpu-poll's polling kernels, \
         persistent kernels on the ring's device API (gpu_ipc_ring.cuh, either side) and the ring steps of frame \
         graphs are such kernels, while a pending cuStreamWaitValue64 (gpu-stream-ops) is not. gpu-ipc makes its \
         kernels leave by themselves when their process is gone: the kernel lease (a heartbeat the process moves \
         every 10 ms; a kernel that sees it stand still for 100 ms leaves) and the survivor's abort word (the peer \
         raises it in the control block when it sees the process gone), both on by default and off with \
         GPU_IPC_KERNEL_LEASE_MS=0; `gpu-ipc-stress all --only mps-kills` measures the faults with it on and off \
         (\"mps clients faulted: k/3\")",
        Some(
            "Keep the kernel lease on (leave GPU_IPC_KERNEL_LEASE_MS unset), write your own persistent kernels on the \
             device API's waits (they watch the abort word, the survivor's word and the lease), run them only in \
             processes that are not SIGKILLed while they run where you can, and prefer gpu-stream-ops (the driver's \
             waits) wherever a process may be killed (docs/frames.md, \"Kills under MPS\")",
        ),
    )
}

/// Bytes as a short human figure with binary units, e.g. `64.0 MiB`.
pub fn human_bytes(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    // Precision loss above 2^53 bytes is irrelevant for a one-decimal figure.
    #[allow(clippy::cast_precision_loss)]
    let mut value = bytes as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    if unit == 0 { format!("{bytes} B") } else { format!("{value:.1} {}", UNITS[unit]) }
}

/// Decides the overall outcome from the facts in `report` and its `findings`:
/// - [`Overall::NoCuda`] when the driver library is missing, failed before listing devices, or lists none;
/// - otherwise, when self-tests ran: [`Overall::Pass`] if every built backend has at least one self-test and all
///   of its self-tests passed, else [`Overall::Fail`];
/// - otherwise (no self-tests ran): [`Overall::Fail`] if any finding has [`Severity::Fail`], else [`Overall::Pass`].
pub fn overall(report: &DoctorReport, findings: &[Finding]) -> Overall {
    if !report.driver.library_found || report.devices.is_empty() {
        return Overall::NoCuda;
    }
    if report.self_tests.is_empty() {
        return if findings.iter().any(|finding| finding.severity == Severity::Fail) {
            Overall::Fail
        } else {
            Overall::Pass
        };
    }
    let backend_passed = |backend: BackendKind| {
        let mut tests = report.self_tests.iter().filter(|test| test.backend == backend).peekable();
        tests.peek().is_some() && tests.all(|test| test.verdict == SelfTestVerdict::Pass)
    };
    let any_failed = report.self_tests.iter().any(|test| test.verdict == SelfTestVerdict::Fail);
    if any_failed || !report.built_backends.iter().all(|backend| backend_passed(*backend)) {
        Overall::Fail
    } else {
        Overall::Pass
    }
}

/// A complete, realistic report for tests of this module and of rendering: two H100s, legacy passing, vmm failing.
#[cfg(test)]
pub(crate) fn sample_report() -> DoctorReport {
    use super::system::{ContainerHints, NamespaceInfo, NvidiaKernelModule, ShmSpace};
    use harness::cuda::{ComputeCapability, DriverVersion, Granularity, StreamMemOps};
    use harness::mps::MpsStatus;

    let device = |ordinal: u32| DeviceReport {
        ordinal,
        name: "NVIDIA H100 80GB HBM3".to_owned(),
        uuid: gpu_ipc::driver::DeviceUuid([
            0x5a,
            0x1c,
            0x9e,
            0x20,
            0x11,
            0x02,
            0x4c,
            0x3d,
            0x8e,
            0x7f,
            0,
            1,
            2,
            3,
            4,
            ordinal as u8,
        ])
        .to_string(),
        compute_capability: ComputeCapability { major: 9, minor: 0 },
        total_memory_bytes: 85_045_346_304,
        pci_bus_id: format!("0000:{:02X}:00.0", 0x19 + ordinal),
        unified_addressing: Some(true),
        compute_mode: ComputeMode::Default,
        vmm_supported: Some(true),
        posix_fd_handles: Some(true),
        fabric_handles: Some(false),
        ipc_events: Some(true),
        stream_mem_ops: StreamMemOps {
            ops_64_bit: Some(true),
            wait_value_nor: Some(true),
            flush_remote_writes: Some(false),
        },
        memory_pools: Some(true),
        vmm_granularity_bytes: Some(Granularity { minimum_bytes: 2 << 20, recommended_bytes: 2 << 20 }),
        can_use_host_pointer_for_registered_mem: Some(true),
        query_errors: Vec::new(),
    };
    let system = SystemReport {
        kernel_release: "6.8.0-60-generic".to_owned(),
        pid_namespace: Fact::Known(NamespaceInfo { inode: 0xEFFF_FFFC, initial: true, same_as_pid1: None }),
        ipc_namespace: Fact::Known(NamespaceInfo { inode: 0xEFFF_FFFF, initial: true, same_as_pid1: None }),
        ptrace_scope: Fact::Known(1),
        dev_shm: Fact::Known(ShmSpace { total_bytes: 64 << 30, free_bytes: 63 << 30 }),
        wsl: Fact::Known(false),
        container: ContainerHints { detected: false, evidence: Vec::new() },
        mps: MpsStatus {
            processes: Fact::Known(Vec::new()),
            pipe_directory: "/tmp/nvidia-mps".to_owned(),
            pipe_directory_from_env: false,
            control_pipe: Fact::Known(false),
        },
        nvidia_kernel_module: Fact::Known(NvidiaKernelModule {
            version: "580.65.06".to_owned(),
            open: true,
            description: "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.65.06  Release Build".to_owned(),
        }),
        transport: crate::transport::NetworkTransport {
            rdma_devices: Fact::Known(Vec::new()),
            gpudirect_rdma: Fact::Known(false),
            ucx_tls: None,
            ucx_net_devices: None,
        },
        device_nodes: Fact::Known(vec![
            "nvidia-uvm".to_owned(),
            "nvidia0".to_owned(),
            "nvidia1".to_owned(),
            "nvidiactl".to_owned(),
        ]),
    };
    let self_tests = vec![
        SelfTestResult {
            backend: BackendKind::Legacy,
            device_ordinal: Some(0),
            verdict: SelfTestVerdict::Pass,
            duration_ms: 412.5,
            detail: "child imported 4 MiB and read the pattern back".to_owned(),
            reason: None,
            fix: None,
        },
        SelfTestResult {
            backend: BackendKind::Vmm,
            device_ordinal: Some(0),
            verdict: SelfTestVerdict::Fail,
            duration_ms: 388.0,
            detail: "child failed to import the fd".to_owned(),
            reason: Some("cuMemImportFromShareableHandle: CUDA_ERROR_INVALID_VALUE".to_owned()),
            fix: Some("Update the NVIDIA driver.".to_owned()),
        },
    ];
    DoctorReport::new(
        "0.1.0".to_owned(),
        vec![BackendKind::Legacy, BackendKind::Vmm],
        DriverSection {
            library_name: "libcuda.so.1".to_owned(),
            library_found: true,
            library_path_or_error: "/usr/lib/x86_64-linux-gnu/libcuda.so.1".to_owned(),
            driver_version: Some(DriverVersion { major: 13, minor: 0 }),
            error: None,
        },
        vec![device(0), device(1)],
        system,
        self_tests,
    )
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests;
