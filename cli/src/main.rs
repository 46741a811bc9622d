//! The `gpu-ipc` command line, a thin command tree over the rooms that do the work: `gpu-ipc doctor` (the
//! `doctor` crate) checks whether CUDA IPC works on this machine and says why not; `gpu-ipc probe ...` answers, by
//! measurement, one of the four questions people ask before they trust shared GPU memory (is imported memory slower,
//! when is a write seen by another process, what can be shared how, what survives a crash) and `gpu-ipc report`
//! answers all four and writes the answers (the `probes` crate); `gpu-ipc bench ...` measures how fast frames move
//! between processes (the `bench` crate). Helper processes of the probes and the
//! benchmark are copies of this binary (`gpu-ipc helper`, `harness::child`).

use std::process::ExitCode;

use clap::{Parser, Subcommand};
use harness::exit::EXIT_USAGE;

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
    Doctor(doctor::DoctorArgs),
    /// Answer one question about shared GPU memory on this machine, by measurement.
    ///
    /// `overhead`: is memory imported from another process slower for kernels? `coherency`: when does another
    /// process see a write? `vmm-compat`: what can be shared how? `crash`: does shared memory survive a process's
    /// death? `gpu-ipc report` answers all four.
    ///
    /// Exit status: 0 the probe ran and printed its verdict; 1 it could not finish; 2 usage error; 3 no usable
    /// CUDA driver or no GPU.
    #[command(subcommand)]
    Probe(probes::ProbeCommand),
    /// Answer all four questions of `gpu-ipc probe` on this machine (without MPS, then under a private MPS daemon)
    /// and write the answers: Markdown, plots, JSON.
    ///
    /// Exit status: 0 the report was written; 1 a probe failed (the report says which); 2 usage error; 3 no usable
    /// CUDA driver or no GPU.
    Report(probes::report::ReportArgs),
    /// Who is attached to a ring, pool, semaphore or work queue: asks its owner over SOCKET (no CUDA needed).
    ///
    /// Exit status: 0 the owner answered; 1 it could not be asked (nothing listens, another user's socket, no
    /// answer in time); 2 usage error.
    Ps(doctor::ps::PsArgs),
    /// How fast frames move between processes here: end-to-end benchmarks against references measured in the same
    /// run.
    #[command(subcommand)]
    Bench(bench::BenchCommand),
    /// Internal: a helper process of a probe or a benchmark (started by `harness::child::ChildProcess`; its
    /// first name, `probe-child`, still works).
    #[command(hide = true, alias = "probe-child")]
    Helper {
        /// The parent's channel socket.
        #[arg(long)]
        socket: std::path::PathBuf,
    },
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
    let status = match cli.command {
        Command::Doctor(args) => doctor::main(&args),
        Command::Probe(probe) => probe.run(),
        Command::Report(args) => probes::report::main(&args),
        Command::Bench(command) => bench::main(&command),
        Command::Ps(args) => doctor::ps::main(&args),
        Command::Helper { socket } => harness::run::serve(&socket, |task, channel| {
            // A role is `<room>-<role>`: the benchmark's own, the doctor's, or a probe's.
            if task.role.starts_with(bench::ROLE_PREFIX) {
                bench::child(task, channel)
            } else if task.role.starts_with(doctor::selftest::ROLE_PREFIX) {
                doctor::selftest::child(task, channel)
            } else {
                probes::child(task, channel)
            }
        }),
    };
    ExitCode::from(status)
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
