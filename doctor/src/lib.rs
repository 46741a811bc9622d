//! `gpu-ipc doctor`: tells a user whether CUDA IPC will work on this machine, and if not, why and what to do.
//!
//! The doctor gathers facts in two halves: [`system`] reads the machine without CUDA (kernel, namespaces, Yama,
//! `/dev/shm`, WSL, containers, MPS, the NVIDIA kernel module and device nodes); the CUDA half queries the driver and
//! each device's attributes (`harness::cuda`, shared with the probes), then runs an end-to-end self-test per backend. [`report`] holds the facts, derives
//! findings and a verdict from them with pure functions, and [`render`] prints the result as text or JSON and maps
//! the verdict to the exit code. `docs/doctor.md` explains every check and finding.

pub mod finding;
pub mod ps;
pub mod render;
pub mod report;
pub mod selftest;
pub mod socket;
pub mod system;
pub mod transport;

use std::io::IsTerminal;
use std::time::Duration;

use clap::Args;
use gpu_ipc::BackendKind;
use harness::cuda;
use harness::exit::EXIT_NO_CUDA;

use report::{DoctorReport, Overall, SelfTestResult, SelfTestVerdict};

/// The options of `gpu-ipc doctor`.
#[derive(Debug, Args)]
pub struct DoctorArgs {
    /// Print the report as JSON (stable field names; see docs/doctor.md).
    #[arg(long)]
    pub json: bool,
    /// The device the self-tests run on.
    #[arg(long, default_value_t = 0)]
    pub device: i32,
    /// Self-test only this backend (default: every backend built in: legacy, vmm).
    #[arg(long)]
    pub backend: Option<BackendKind>,
    /// Skip the end-to-end self-tests (facts and findings only).
    #[arg(long)]
    pub no_self_test: bool,
    /// Only check whether this process could attach to the producer whose socket is at PATH (the file, its
    /// directories, who listens and whom it lets in; no CUDA needed), and say what to change if not. Exit status
    /// 0: it could; 1: it could not.
    #[arg(long, value_name = "PATH")]
    pub check_socket: Option<std::path::PathBuf>,
    /// Time limit of each self-test, in seconds.
    #[arg(long, default_value_t = 30)]
    pub timeout: u64,
}

/// Runs `gpu-ipc doctor` with `args`; returns the exit status ([`harness::exit`]).
pub fn main(args: &DoctorArgs) -> u8 {
    if let Some(path) = &args.check_socket {
        return check_socket(path, args.json);
    }
    if let Some(backend) = args.backend.filter(|b| !gpu_ipc::COMPILED_GPU.contains(b)) {
        let names: Vec<&str> = gpu_ipc::COMPILED_GPU.iter().map(|b| b.name()).collect();
        eprintln!(
            "gpu-ipc doctor: --backend {backend}: the doctor checks the GPU backends built here ({}); the {} backend \
             shares host memory and needs no check",
            names.join(", "),
            gpu_ipc::BackendKind::Host
        );
        return harness::exit::EXIT_USAGE;
    }
    let progress = !args.json && std::io::stderr().is_terminal();
    let system = system::collect(&system::SystemRoot::real());
    let driver = cuda::driver_section();
    let devices = cuda::devices();
    let built: Vec<BackendKind> = gpu_ipc::COMPILED_GPU.to_vec();
    let mut self_tests = Vec::new();
    let cuda_usable = driver.error.is_none() && !devices.is_empty();
    if cuda_usable && !args.no_self_test {
        let chosen: Vec<BackendKind> = args.backend.map_or_else(|| gpu_ipc::COMPILED_GPU.to_vec(), |b| vec![b]);
        for backend in chosen {
            if progress {
                eprintln!("gpu-ipc doctor: self-test of the {backend} backend on device {}...", args.device);
            }
            let outcome = selftest::run(backend, args.device, Duration::from_secs(args.timeout));
            self_tests.push(SelfTestResult {
                backend,
                device_ordinal: u32::try_from(args.device).ok(),
                verdict: if outcome.passed { SelfTestVerdict::Pass } else { SelfTestVerdict::Fail },
                duration_ms: outcome.duration.as_secs_f64() * 1e3,
                detail: outcome.detail,
                reason: outcome.reason,
                fix: outcome.fix,
            });
        }
    }
    let report = DoctorReport::new(env!("CARGO_PKG_VERSION").to_owned(), built, driver, devices, system, self_tests);
    emit(&report, args.json)
}

fn check_socket(path: &std::path::Path, json: bool) -> u8 {
    let report = socket::SocketReport::new(socket::gather(path));
    if json {
        match serde_json::to_string_pretty(&report) {
            Ok(text) => println!("{text}"),
            Err(e) => {
                eprintln!("gpu-ipc doctor: could not encode the report as JSON: {e}");
                return 1;
            }
        }
    } else {
        print!("{}", report.text());
    }
    u8::from(!report.attachable)
}

fn emit(report: &DoctorReport, json: bool) -> u8 {
    let code = render::exit_code(report.verdict);
    if json {
        match render::render_json(report) {
            Ok(text) => println!("{text}"),
            Err(e) => {
                eprintln!("gpu-ipc doctor: could not encode the report as JSON: {e}");
                return 1;
            }
        }
    } else if report.verdict == Overall::NoCuda {
        // The one-line explanation; the full report would be a table of unknowns.
        eprintln!("{}", render::summary_line(report));
        return EXIT_NO_CUDA;
    } else {
        print!("{}", render::render_human(report));
    }
    if json && code != 0 {
        eprintln!("{}", render::summary_line(report));
    }
    code
}
