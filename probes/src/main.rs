//! The `gpu-ipc` command line: `gpu-ipc doctor` checks whether CUDA IPC works on this machine and says why not;
//! `gpu-ipc probe ...` measures the four research questions; `gpu-ipc report` runs them all and writes the answers.

mod answers;
mod bench;
mod doctor;
mod probe;
mod stress;

use std::io::IsTerminal;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};
use gpu_ipc::BackendKind;

use doctor::render::{self, EXIT_NO_CUDA, EXIT_USAGE};
use doctor::report::{self, DoctorReport, Overall, SelfTestResult, SelfTestVerdict};

/// Share GPU memory between processes through the CUDA driver API: diagnostics, probes and benchmarks.
#[derive(Debug, Parser)]
#[command(name = "gpu-ipc", version, propagate_version = true)]
struct Cli {
    /// More log output on stderr (-v: debug, -vv: trace); RUST_LOG overrides.
    #[arg(short, long, action = clap::ArgAction::Count, global = true)]
    verbose: u8,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Check whether CUDA IPC works on this machine, and why not.
    ///
    /// Exit status: 0 every built backend passed its self-test; 1 a backend failed (the report says why and what
    /// to do); 2 usage error; 3 no usable CUDA driver or no GPU.
    Doctor(DoctorArgs),
    /// Measure one of the four research questions on this machine (see `gpu-ipc report` for all four).
    ///
    /// Exit status: 0 the probe ran and printed its verdict; 1 it could not finish; 2 usage error; 3 no usable
    /// CUDA driver or no GPU.
    #[command(subcommand)]
    Probe(ProbeCommand),
    /// Run every probe (without MPS, then under a private MPS daemon) and write the answers: Markdown, plots, JSON.
    ///
    /// Exit status: 0 the report was written; 1 a probe failed (the report says which); 2 usage error; 3 no usable
    /// CUDA driver or no GPU.
    Report(answers::ReportArgs),
    /// End-to-end benchmarks against references measured in the same run.
    #[command(subcommand)]
    Bench(bench::BenchCommand),
    /// Stress runs on the GPU: hostile clients, a PID-namespace consumer, the random-kill matrix (without and
    /// with MPS), attach/detach cycles, eviction; they drive the staged `producer` and `consumer` programs.
    ///
    /// Exit status: 0 every check passed (findings do not fail it); 1 a check failed; 2 usage error.
    Stress(stress::StressArgs),
    /// Internal: a client of another user, run by `gpu-ipc stress` (expects to be refused).
    #[command(hide = true)]
    StressPeer {
        /// The producer's socket.
        #[arg(long)]
        socket: std::path::PathBuf,
    },
    /// Internal: a probe's child process.
    #[command(hide = true)]
    ProbeChild {
        /// The parent's channel socket.
        #[arg(long)]
        socket: std::path::PathBuf,
    },
}

#[derive(Debug, Subcommand)]
enum ProbeCommand {
    /// Is memory imported from another process slower for kernels than the process's own memory?
    Overhead(probe::overhead::ProbeArgs),
    /// When does one process's write become visible to another process's polling kernel, and which loads and
    /// fences are needed?
    Coherency(probe::coherency::ProbeArgs),
    /// What can be shared how: legacy IPC and VMM handles against every kind of allocation.
    VmmCompat(probe::vmm_compat::ProbeArgs),
    /// Does shared memory survive the death of the process that exported it, or of one that imported it?
    Crash(probe::crash::ProbeArgs),
}

#[derive(Debug, Args)]
struct DoctorArgs {
    /// Print the report as JSON (stable field names; see docs/doctor.md).
    #[arg(long)]
    json: bool,
    /// The device the self-tests run on.
    #[arg(long, default_value_t = 0)]
    device: i32,
    /// Self-test only this backend (default: every backend built in: legacy, vmm).
    #[arg(long)]
    backend: Option<BackendKind>,
    /// Skip the end-to-end self-tests (facts and findings only).
    #[arg(long)]
    no_self_test: bool,
    /// Only check whether this process could attach to the producer whose socket is at PATH (the file, its
    /// directories, who listens and whom it lets in; no CUDA needed), and say what to change if not. Exit status
    /// 0: it could; 1: it could not.
    #[arg(long, value_name = "PATH")]
    check_socket: Option<std::path::PathBuf>,
    /// Time limit of each self-test, in seconds.
    #[arg(long, default_value_t = 30)]
    timeout: u64,
    /// Internal: the child process of a self-test.
    #[arg(long, hide = true, value_name = "BACKEND")]
    self_test_child: Option<BackendKind>,
    /// Internal: the sync strategy of a self-test's child.
    #[arg(long, hide = true, value_name = "SYNC")]
    self_test_sync: Option<String>,
    /// Internal: the rendezvous socket of a self-test.
    #[arg(long, hide = true)]
    socket: Option<std::path::PathBuf>,
}

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            let _ = e.print();
            // --help and --version are not errors; everything else is a usage error.
            return if e.use_stderr() { ExitCode::from(EXIT_USAGE) } else { ExitCode::SUCCESS };
        }
    };
    init_logging(cli.verbose);
    match cli.command {
        Command::Doctor(args) => ExitCode::from(doctor(&args)),
        Command::Probe(ProbeCommand::Overhead(args)) => ExitCode::from(probe::overhead::main(&args)),
        Command::Probe(ProbeCommand::Coherency(args)) => ExitCode::from(probe::coherency::main(&args)),
        Command::Probe(ProbeCommand::VmmCompat(args)) => ExitCode::from(probe::vmm_compat::main(&args)),
        Command::Probe(ProbeCommand::Crash(args)) => ExitCode::from(probe::crash::main(&args)),
        Command::Report(args) => ExitCode::from(answers::main(&args)),
        Command::Bench(bench::BenchCommand::Pipeline(args)) => ExitCode::from(bench::pipeline_main(&args)),
        Command::Bench(bench::BenchCommand::Targets(args)) => ExitCode::from(bench::targets::targets_main(&args)),
        Command::Stress(args) => ExitCode::from(stress::main(&args)),
        Command::StressPeer { socket } => ExitCode::from(stress::hostile::peer_main(&socket)),
        Command::ProbeChild { socket } => ExitCode::from(probe::child_main(&socket)),
    }
}

fn init_logging(verbose: u8) {
    let default = match verbose {
        0 => "warn",
        1 => "debug",
        _ => "trace",
    };
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default));
    tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).init();
}

fn doctor(args: &DoctorArgs) -> u8 {
    if let Some(backend) = args.self_test_child {
        return doctor::selftest::child_main(
            backend,
            args.self_test_sync.as_deref(),
            args.device,
            args.socket.as_deref(),
        );
    }
    if let Some(path) = &args.check_socket {
        return check_socket(path, args.json);
    }
    let progress = !args.json && std::io::stderr().is_terminal();
    let system = doctor::system::collect(&doctor::system::SystemRoot::real());
    let driver = doctor::cuda::driver_section();
    let devices = doctor::cuda::devices();
    let built: Vec<report::Backend> = gpu_ipc::COMPILED_GPU.iter().filter_map(|b| report_backend(*b)).collect();
    let mut self_tests = Vec::new();
    let cuda_usable = driver.error.is_none() && !devices.is_empty();
    if cuda_usable && !args.no_self_test {
        let chosen: Vec<BackendKind> = args.backend.map_or_else(|| gpu_ipc::COMPILED_GPU.to_vec(), |b| vec![b]);
        for (backend, reported) in chosen.into_iter().filter_map(|b| report_backend(b).map(|r| (b, r))) {
            if progress {
                eprintln!("gpu-ipc doctor: self-test of the {backend} backend on device {}...", args.device);
            }
            let outcome = doctor::selftest::run(backend, args.device, Duration::from_secs(args.timeout));
            self_tests.push(SelfTestResult {
                backend: reported,
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
    let report = doctor::socket::SocketReport::new(doctor::socket::gather(path));
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

/// The doctor's name of a GPU backend compiled in; `None` for the host fake (nothing on a GPU to check).
fn report_backend(b: BackendKind) -> Option<report::Backend> {
    match b {
        #[cfg(feature = "legacy")]
        BackendKind::Legacy => Some(report::Backend::Legacy),
        #[cfg(feature = "vmm")]
        BackendKind::Vmm => Some(report::Backend::Vmm),
        _ => None,
    }
}
