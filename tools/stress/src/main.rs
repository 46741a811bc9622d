//! `gpu-ipc-stress`: the GPU stress run (hostile clients, a PID-namespace consumer, other users, the random-kill
//! matrix without and with MPS, attach/detach cycles, eviction). A development harness that drives the staged
//! `producer` and `consumer` programs; see `docs/gpu-testing.md`, "The stress run".

use std::ffi::OsString;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;
use gpu_ipc_stress::StressArgs;
use harness::exit::EXIT_USAGE;

/// The GPU stress run of gpu-ipc (a development tool).
///
/// Exit status: 0 every check passed (findings do not fail it); 1 a check failed; 2 usage error.
#[derive(Debug, Parser)]
#[command(name = "gpu-ipc-stress", version)]
struct Cli {
    /// More log output on stderr (-v: debug, -vv: trace); RUST_LOG overrides.
    #[arg(short, long, action = clap::ArgAction::Count)]
    verbose: u8,
    #[command(flatten)]
    args: StressArgs,
}

/// `gpu-ipc-stress stress-peer --socket PATH`: the client of another user that the `users` and hostile parts
/// start (it expects to be refused). Parsed apart from [`Cli`], whose first argument is the part to run.
#[derive(Debug, Parser)]
#[command(name = "gpu-ipc-stress stress-peer", hide = true)]
struct PeerCli {
    /// The producer's socket.
    #[arg(long)]
    socket: PathBuf,
}

fn main() -> ExitCode {
    let argv: Vec<OsString> = std::env::args_os().collect();
    if argv.get(1).is_some_and(|arg| arg == "stress-peer") {
        return match PeerCli::try_parse_from(argv.iter().skip(1)) {
            Ok(peer) => ExitCode::from(gpu_ipc_stress::hostile::peer_main(&peer.socket)),
            Err(e) => exit_for(&e),
        };
    }
    let cli = match Cli::try_parse_from(argv) {
        Ok(cli) => cli,
        Err(e) => return exit_for(&e),
    };
    init_logging(cli.verbose);
    ExitCode::from(gpu_ipc_stress::main(&cli.args))
}

/// Prints clap's message; --help and --version are not errors, everything else is a usage error.
fn exit_for(e: &clap::Error) -> ExitCode {
    let _ = e.print();
    if e.use_stderr() { ExitCode::from(EXIT_USAGE) } else { ExitCode::SUCCESS }
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
