//! Turning a [`DoctorReport`] into what the user sees: aligned plain-text sections, or JSON for `--json`; and the
//! process exit code.
//!
//! The text is never coloured, so `NO_COLOR` and pipes need no special handling, and no terminal library is needed.

use std::fmt::Write as _;

use super::finding::{Finding, Severity};
use super::report::{DoctorReport, Overall, SelfTestResult, SelfTestVerdict, human_bytes};
use super::system::{NamespaceInfo, SystemReport};
use harness::cuda::{ComputeMode, DeviceReport, no_cuda_reason};
use harness::exit::{EXIT_FAILED, EXIT_NO_CUDA, EXIT_OK};
use harness::fact::Fact;

/// The process exit code for a verdict: [`EXIT_OK`] (every built backend passed its self-test), [`EXIT_FAILED`]
/// (at least one failed or was skipped; the report says why) or [`EXIT_NO_CUDA`] (`EXIT_USAGE` never comes from a
/// report).
pub fn exit_code(verdict: Overall) -> u8 {
    match verdict {
        Overall::Pass => EXIT_OK,
        Overall::Fail => EXIT_FAILED,
        Overall::NoCuda => EXIT_NO_CUDA,
    }
}

/// The report as pretty-printed JSON, the `--json` output.
pub fn render_json(report: &DoctorReport) -> Result<String, serde_json::Error> {
    serde_json::to_string_pretty(report)
}

/// One line that states the verdict and its main reason, starting with `gpu-ipc doctor:`. For [`Overall::NoCuda`]
/// it names the missing library or the failing call, so it can stand alone on stderr.
pub fn summary_line(report: &DoctorReport) -> String {
    format!("gpu-ipc doctor: {}", summary(report))
}

/// [`summary_line`] without the command's name, for the other subcommands that stop with the same message in their
/// own name (`gpu-ipc report: no CUDA driver: ...`).
pub fn summary(report: &DoctorReport) -> String {
    match report.verdict {
        Overall::NoCuda => no_cuda_reason(&report.driver, &report.devices)
            .unwrap_or_else(|| "no usable CUDA driver or no GPU.".to_owned()),
        Overall::Pass if report.self_tests.is_empty() => {
            "ready as far as the device attributes show (self-tests not run).".to_owned()
        }
        Overall::Pass => {
            let backends: Vec<&str> = report.built_backends.iter().map(|backend| backend.name()).collect();
            format!("ready: every built backend ({}) passed its self-test.", backends.join(", "))
        }
        Overall::Fail if report.self_tests.is_empty() => {
            let failing: Vec<&str> = report
                .findings
                .iter()
                .filter(|finding| finding.severity == Severity::Fail)
                .map(|finding| finding.what.as_str())
                .collect();
            format!("not ready: {}.", failing.join("; "))
        }
        Overall::Fail => {
            // Built backends first, then any tested one that is not built, so that no failure goes unnamed.
            let mut backends = report.built_backends.clone();
            for test in &report.self_tests {
                if !backends.contains(&test.backend) {
                    backends.push(test.backend);
                }
            }
            let problems: Vec<String> = backends
                .iter()
                .filter_map(|backend| {
                    let tests: Vec<&SelfTestResult> =
                        report.self_tests.iter().filter(|test| test.backend == *backend).collect();
                    match tests.iter().find(|test| test.verdict != SelfTestVerdict::Pass) {
                        Some(test) => Some(format!(
                            "{} {} ({})",
                            backend.name(),
                            verdict_word(test.verdict),
                            test.reason.as_deref().unwrap_or(test.detail.as_str())
                        )),
                        None if tests.is_empty() => Some(format!("{} has no self-test", backend.name())),
                        None => None,
                    }
                })
                .collect();
            format!("not ready: {}.", problems.join("; "))
        }
    }
}

fn verdict_word(verdict: SelfTestVerdict) -> &'static str {
    match verdict {
        SelfTestVerdict::Pass => "passed",
        SelfTestVerdict::Fail => "failed",
        SelfTestVerdict::Skipped => "was skipped",
    }
}

/// The report as plain-text sections: the summary line, then driver, devices, capabilities, system, self-tests and
/// findings (empty sections are left out), then the exit code.
pub fn render_human(report: &DoctorReport) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "gpu-ipc doctor {}", report.tool_version);
    let _ = writeln!(out, "{}", summary_line(report));

    section(&mut out, "Driver", &key_values(&driver_rows(report)));
    if !report.devices.is_empty() {
        section(&mut out, "Devices", &device_table(&report.devices));
        section(&mut out, "Capabilities", &capability_table(&report.devices));
    }
    section(&mut out, "System", &key_values(&system_rows(&report.system)));
    if !report.self_tests.is_empty() {
        section(&mut out, "Self-tests", &self_test_table(&report.self_tests));
    }
    if !report.findings.is_empty() {
        section(&mut out, "Findings", &findings_text(&report.findings));
    }
    let _ = writeln!(out, "\nexit code {}", exit_code(report.verdict));
    out
}

fn section(out: &mut String, title: &str, body: &str) {
    let _ = writeln!(out, "\n{title}");
    out.push_str(body);
}

/// Rows of cells as columns padded to their widest cell, two spaces apart, indented by two spaces; the last
/// column is not padded, so no line ends in spaces.
fn table(rows: &[Vec<String>]) -> String {
    let columns = rows.iter().map(Vec::len).max().unwrap_or(0);
    let widths: Vec<usize> = (0..columns)
        .map(|column| rows.iter().filter_map(|row| row.get(column)).map(|cell| cell.chars().count()).max().unwrap_or(0))
        .collect();
    let mut out = String::new();
    for row in rows {
        let mut line = String::from("  ");
        for (column, cell) in row.iter().enumerate() {
            if column + 1 == row.len() {
                line.push_str(cell);
            } else {
                let _ = write!(line, "{cell:<width$}  ", width = widths[column]);
            }
        }
        let _ = writeln!(out, "{}", line.trim_end());
    }
    out
}

fn key_values(rows: &[(&str, String)]) -> String {
    let rows: Vec<Vec<String>> = rows.iter().map(|(key, value)| vec![(*key).to_owned(), value.clone()]).collect();
    table(&rows)
}

fn probe_text<T>(probe: &Fact<T>, show: impl Fn(&T) -> String) -> String {
    match probe {
        Fact::Known(value) => show(value),
        Fact::Unknown(why) => format!("unknown ({why})"),
    }
}

fn flag(value: Option<bool>) -> String {
    match value {
        Some(true) => "yes".to_owned(),
        Some(false) => "no".to_owned(),
        None => "unknown".to_owned(),
    }
}

fn driver_rows(report: &DoctorReport) -> Vec<(&'static str, String)> {
    let driver = &report.driver;
    let library = if driver.library_found {
        driver.library_path_or_error.clone()
    } else {
        format!("{} not loaded ({})", driver.library_name, driver.library_path_or_error)
    };
    let mut rows = vec![("library", library)];
    if let Some(version) = driver.driver_version {
        rows.push(("CUDA version", format!("{}.{}", version.major, version.minor)));
    }
    if let Some(error) = &driver.error {
        rows.push(("error", error.clone()));
    }
    let module = probe_text(&report.system.nvidia_kernel_module, |module| {
        format!("{}{}", module.version, if module.open { " (open)" } else { " (proprietary)" })
    });
    rows.push(("kernel module", module));
    rows
}

fn device_table(devices: &[DeviceReport]) -> String {
    let mut rows = vec![["GPU", "name", "cc", "memory", "PCI bus", "UUID"].map(str::to_owned).to_vec()];
    for device in devices {
        rows.push(vec![
            device.ordinal.to_string(),
            device.name.clone(),
            format!("{}.{}", device.compute_capability.major, device.compute_capability.minor),
            human_bytes(device.total_memory_bytes),
            device.pci_bus_id.clone(),
            device.uuid.clone(),
        ]);
    }
    table(&rows)
}

/// One row per capability, one column per device, so eight GPUs still fit a terminal.
fn capability_table(devices: &[DeviceReport]) -> String {
    type Cell = fn(&DeviceReport) -> String;
    let capabilities: [(&str, Cell); 12] = [
        ("compute mode", |d| match d.compute_mode {
            ComputeMode::Default => "default".to_owned(),
            ComputeMode::Prohibited => "PROHIBITED".to_owned(),
            ComputeMode::ExclusiveProcess => "EXCLUSIVE_PROCESS".to_owned(),
            ComputeMode::Unknown(code) => format!("unknown ({code})"),
        }),
        ("unified addressing (legacy)", |d| flag(d.unified_addressing)),
        ("virtual memory mgmt (vmm)", |d| flag(d.vmm_supported)),
        ("POSIX fd handles (vmm)", |d| flag(d.posix_fd_handles)),
        ("fabric handles", |d| flag(d.fabric_handles)),
        ("IPC events", |d| flag(d.ipc_events)),
        ("64-bit stream mem ops", |d| flag(d.stream_mem_ops.ops_64_bit)),
        ("stream wait NOR", |d| flag(d.stream_mem_ops.wait_value_nor)),
        ("flush remote writes", |d| flag(d.stream_mem_ops.flush_remote_writes)),
        ("memory pools", |d| flag(d.memory_pools)),
        ("VMM granularity", |d| match d.vmm_granularity_bytes {
            Some(g) if g.minimum_bytes == g.recommended_bytes => human_bytes(g.minimum_bytes),
            Some(g) => {
                format!("{} min, {} recommended", human_bytes(g.minimum_bytes), human_bytes(g.recommended_bytes))
            }
            None => "unknown".to_owned(),
        }),
        ("host ptr for registered mem", |d| flag(d.can_use_host_pointer_for_registered_mem)),
    ];
    let mut header = vec![String::new()];
    header.extend(devices.iter().map(|device| format!("GPU {}", device.ordinal)));
    let mut rows = vec![header];
    for (name, cell) in capabilities {
        let mut row = vec![name.to_owned()];
        row.extend(devices.iter().map(cell));
        rows.push(row);
    }
    let mut out = table(&rows);
    for device in devices {
        for error in &device.query_errors {
            let _ = writeln!(out, "  GPU {}: query failed: {error}", device.ordinal);
        }
    }
    out
}

fn namespace_text(probe: &Fact<NamespaceInfo>) -> String {
    probe_text(probe, |ns| {
        let place = if ns.initial { "initial (host)" } else { "private" };
        let pid1 = match ns.same_as_pid1 {
            Some(true) => ", shared with PID 1",
            Some(false) => ", not PID 1's",
            None => "",
        };
        format!("{place}, inode {}{pid1}", ns.inode)
    })
}

fn system_rows(system: &SystemReport) -> Vec<(&'static str, String)> {
    let mps = &system.mps;
    let processes = probe_text(&mps.processes, |processes| {
        if processes.is_empty() {
            "no MPS process visible".to_owned()
        } else {
            let listed: Vec<String> =
                processes.iter().map(|process| format!("{:?} pid {}", process.role, process.pid)).collect();
            listed.join(", ")
        }
    });
    let pipe = probe_text(&mps.control_pipe, |present| {
        let source = if mps.pipe_directory_from_env { " (CUDA_MPS_PIPE_DIRECTORY)" } else { "" };
        let state = if *present { "control pipe in" } else { "no control pipe in" };
        format!("{state} {}{source}", mps.pipe_directory)
    });
    let container = if system.container.detected {
        format!("yes: {}", system.container.evidence.join("; "))
    } else if system.container.evidence.is_empty() {
        "no sign of one".to_owned()
    } else {
        format!("no sign of one ({})", system.container.evidence.join("; "))
    };
    vec![
        ("kernel", system.kernel_release.clone()),
        ("WSL", probe_text(&system.wsl, |wsl| if *wsl { "yes" } else { "no" }.to_owned())),
        ("container", container),
        ("PID namespace", namespace_text(&system.pid_namespace)),
        ("IPC namespace", namespace_text(&system.ipc_namespace)),
        ("Yama ptrace_scope", probe_text(&system.ptrace_scope, u8::to_string)),
        (
            "/dev/shm",
            probe_text(&system.dev_shm, |shm| {
                format!("{} total, {} free", human_bytes(shm.total_bytes), human_bytes(shm.free_bytes))
            }),
        ),
        ("MPS", format!("{}; {processes}; {pipe}", if mps.active() { "active" } else { "inactive" })),
        (
            "device nodes",
            probe_text(&system.device_nodes, |nodes| {
                if nodes.is_empty() { "no /dev/nvidia* nodes".to_owned() } else { nodes.join(" ") }
            }),
        ),
        ("to other machines", crate::transport::describe(&system.transport)),
    ]
}

fn self_test_table(tests: &[SelfTestResult]) -> String {
    let mut rows = vec![["backend", "GPU", "result", "time", "detail"].map(str::to_owned).to_vec()];
    let mut notes: Vec<(usize, String)> = Vec::new();
    for test in tests {
        let result = match test.verdict {
            SelfTestVerdict::Pass => "pass",
            SelfTestVerdict::Fail => "FAIL",
            SelfTestVerdict::Skipped => "skipped",
        };
        rows.push(vec![
            test.backend.name().to_owned(),
            test.device_ordinal.map_or_else(|| "-".to_owned(), |ordinal| ordinal.to_string()),
            result.to_owned(),
            format!("{:.1} ms", test.duration_ms),
            test.detail.clone(),
        ]);
        let row_index = rows.len() - 1;
        if let Some(reason) = &test.reason {
            notes.push((row_index, format!("reason: {reason}")));
        }
        if let Some(fix) = &test.fix {
            notes.push((row_index, format!("fix:    {fix}")));
        }
    }
    // Reason and fix go on their own lines under the test they belong to, outside the column layout.
    let lines: Vec<String> = table(&rows).lines().map(str::to_owned).collect();
    let mut out = String::new();
    for (index, line) in lines.iter().enumerate() {
        let _ = writeln!(out, "{line}");
        for (_, note) in notes.iter().filter(|(row, _)| *row == index) {
            let _ = writeln!(out, "      {note}");
        }
    }
    out
}

/// Width that findings' explanations are wrapped to, so they read well in an 80-to-120-column terminal.
const TEXT_WIDTH: usize = 100;

pub(crate) fn findings_text(findings: &[Finding]) -> String {
    let mut out = String::new();
    for finding in findings {
        let label = match finding.severity {
            Severity::Info => "info",
            Severity::Warn => "WARN",
            Severity::Fail => "FAIL",
        };
        let _ = writeln!(out, "  {label:<4}  {} [{}]", finding.what, finding.id);
        push_wrapped(&mut out, "        why: ", &finding.why);
        if let Some(fix) = &finding.fix {
            push_wrapped(&mut out, "        fix: ", fix);
        }
    }
    out
}

/// Appends `text` after `lead`, wrapped at word boundaries to [`TEXT_WIDTH`], continuation lines indented to line
/// up under the text. A word longer than the width gets a line of its own rather than being split.
fn push_wrapped(out: &mut String, lead: &str, text: &str) {
    let indent = " ".repeat(lead.chars().count());
    let mut line = lead.to_owned();
    let mut line_has_word = false;
    for word in text.split_whitespace() {
        if line_has_word && line.chars().count() + 1 + word.chars().count() > TEXT_WIDTH {
            let _ = writeln!(out, "{line}");
            line.clone_from(&indent);
            line_has_word = false;
        }
        if line_has_word {
            line.push(' ');
        }
        line.push_str(word);
        line_has_word = true;
    }
    let _ = writeln!(out, "{line}");
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::super::report::sample_report;
    use super::*;
    use harness::cuda::DriverSection;
    use harness::exit::EXIT_USAGE;

    #[test]
    fn wrapping_breaks_at_words_and_keeps_long_words_whole() {
        let mut out = String::new();
        let text = format!("{} {} end", "word ".repeat(30).trim(), "x".repeat(120));
        push_wrapped(&mut out, "  why: ", &text);
        let lines: Vec<&str> = out.lines().collect();
        assert_eq!(lines.len(), 4, "{out}");
        assert!(lines[0].starts_with("  why: word word"));
        assert!(lines[0].chars().count() <= TEXT_WIDTH);
        assert_eq!(lines[2], format!("       {}", "x".repeat(120)));
        assert_eq!(lines[3], "       end");
    }

    #[test]
    fn exit_codes_are_documented_values() {
        assert_eq!(exit_code(Overall::Pass), 0);
        assert_eq!(exit_code(Overall::Fail), 1);
        assert_eq!(EXIT_USAGE, 2);
        assert_eq!(exit_code(Overall::NoCuda), 3);
    }

    #[test]
    fn full_report_renders_every_section() {
        let report = sample_report();
        let text = render_human(&report);
        let lines: Vec<&str> = text.lines().collect();

        assert_eq!(lines[0], "gpu-ipc doctor 0.1.0");
        assert_eq!(
            lines[1],
            "gpu-ipc doctor: not ready: vmm failed (cuMemImportFromShareableHandle: CUDA_ERROR_INVALID_VALUE)."
        );
        for title in ["Driver", "Devices", "Capabilities", "System", "Self-tests", "Findings"] {
            assert!(lines.contains(&title), "missing section {title}\n{text}");
        }
        assert!(lines.contains(&"  CUDA version   13.0"), "{text}");
        assert!(lines.contains(&"  kernel module  580.65.06 (open)"), "{text}");
        assert!(
            lines.contains(
                &"  0    NVIDIA H100 80GB HBM3  9.0  79.2 GiB  0000:19:00.0  GPU-5a1c9e20-1102-4c3d-8e7f-000102030400"
            ),
            "{text}"
        );
        assert!(lines.contains(&"                               GPU 0    GPU 1"), "{text}");
        assert!(lines.contains(&"  compute mode                 default  default"), "{text}");
        assert!(lines.contains(&"  VMM granularity              2.0 MiB  2.0 MiB"), "{text}");
        assert!(lines.contains(&"  legacy   0    pass    412.5 ms  child imported 4 MiB and read the pattern back"));
        assert!(lines.contains(&"  vmm      0    FAIL    388.0 ms  child failed to import the fd"), "{text}");
        assert!(lines.contains(&"      reason: cuMemImportFromShareableHandle: CUDA_ERROR_INVALID_VALUE"));
        assert!(lines.contains(&"      fix:    Update the NVIDIA driver."));
        assert!(lines.contains(&"  info  MPS is not active [mps-inactive]"), "{text}");
        assert!(lines.contains(&"  Yama ptrace_scope  1"), "{text}");
        let why = lines.iter().position(|line| line.starts_with("        why: kernels")).unwrap();
        assert!(lines[why].chars().count() <= TEXT_WIDTH, "{text}");
        assert!(lines[why + 1].starts_with("             "), "wrapped under the text\n{text}");
        assert_eq!(lines.last(), Some(&"exit code 1"));
        assert!(lines.iter().all(|line| !line.ends_with(' ')), "no trailing spaces\n{text}");
        assert!(!text.contains('\u{1b}'), "never coloured");
    }

    #[test]
    fn docs_example_is_the_real_rendering_of_the_sample() {
        let docs = include_str!("../../docs/doctor.md");
        let rendered = render_human(&sample_report());
        assert!(docs.contains(&rendered), "update the example in docs/doctor.md to:\n{rendered}");
    }

    #[test]
    fn missing_driver_gives_the_one_line_explanation() {
        let mut report = sample_report();
        report.driver = DriverSection {
            library_name: "libcuda.so.1".to_owned(),
            library_found: false,
            library_path_or_error: "libcuda.so.1: cannot open shared object file: No such file or directory".to_owned(),
            driver_version: None,
            error: None,
        };
        report.devices.clear();
        report.self_tests.clear();
        let report = DoctorReport::new(
            report.tool_version,
            report.built_backends,
            report.driver,
            report.devices,
            report.system,
            report.self_tests,
        );
        assert_eq!(report.verdict, Overall::NoCuda);
        assert_eq!(
            summary_line(&report),
            "gpu-ipc doctor: no CUDA driver: libcuda.so.1 could not be loaded (libcuda.so.1: cannot open shared \
             object file: No such file or directory). Install the NVIDIA driver or run on a machine with a GPU."
        );
        let text = render_human(&report);
        assert!(!text.contains("\nDevices\n"), "{text}");
        assert!(text.contains("  library        libcuda.so.1 not loaded (libcuda.so.1: cannot open"), "{text}");
        assert!(text.contains("[driver-library-missing]"), "{text}");
        assert!(text.ends_with("exit code 3\n"), "{text}");
    }

    #[test]
    fn passing_report_summarises_backends() {
        let mut report = sample_report();
        report.self_tests[1].verdict = SelfTestVerdict::Pass;
        report.verdict = super::super::report::overall(&report, &report.findings);
        assert_eq!(
            summary_line(&report),
            "gpu-ipc doctor: ready: every built backend (legacy, vmm) passed its self-test."
        );
        assert!(render_human(&report).ends_with("exit code 0\n"));
    }

    #[test]
    fn json_has_stable_field_names_and_round_trips() {
        let report = sample_report();
        let json = render_json(&report).unwrap();
        let value: serde_json::Value = serde_json::from_str(&json).unwrap();

        let top: Vec<&str> = value.as_object().unwrap().keys().map(String::as_str).collect();
        for key in [
            "schema_version",
            "tool_version",
            "built_backends",
            "driver",
            "devices",
            "system",
            "self_tests",
            "findings",
            "verdict",
        ] {
            assert!(top.contains(&key), "missing {key}");
        }
        assert_eq!(value["schema_version"], 1);
        assert_eq!(value["built_backends"], serde_json::json!(["legacy", "vmm"]));
        assert_eq!(value["driver"]["driver_version"], serde_json::json!({"major": 13, "minor": 0}));
        assert_eq!(value["driver"]["library_found"], true);
        let device = &value["devices"][1];
        assert_eq!(device["ordinal"], 1);
        assert_eq!(device["compute_capability"], serde_json::json!({"major": 9, "minor": 0}));
        assert_eq!(device["compute_mode"], serde_json::json!({"mode": "default"}));
        assert_eq!(device["stream_mem_ops"]["ops_64_bit"], true);
        assert_eq!(device["vmm_granularity_bytes"]["minimum_bytes"], 2_097_152);
        assert_eq!(value["system"]["ptrace_scope"], serde_json::json!({"known": 1}));
        assert_eq!(value["system"]["dev_shm"]["known"]["total_bytes"], 68_719_476_736_u64);
        assert_eq!(value["system"]["mps"]["control_pipe"], serde_json::json!({"known": false}));
        assert_eq!(value["self_tests"][1]["backend"], "vmm");
        assert_eq!(value["self_tests"][1]["verdict"], "fail");
        assert_eq!(value["self_tests"][0]["reason"], serde_json::Value::Null);
        assert_eq!(value["findings"][0]["id"], "mps-inactive");
        assert_eq!(value["findings"][0]["severity"], "info");
        assert_eq!(value["verdict"], "fail");

        let unknown_mode = serde_json::to_value(super::ComputeMode::Unknown(1)).unwrap();
        assert_eq!(unknown_mode, serde_json::json!({"mode": "unknown", "code": 1}));
        let unknown_probe = serde_json::to_value(Fact::<u8>::Unknown("no Yama".to_owned())).unwrap();
        assert_eq!(unknown_probe, serde_json::json!({"unknown": "no Yama"}));

        let back: DoctorReport = serde_json::from_value(value).unwrap();
        assert_eq!(back, report);
    }
}
