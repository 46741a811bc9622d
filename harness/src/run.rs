//! How one measurement runs, the same for every probe and the pipeline benchmark: the options they all take
//! ([`CommonArgs`]), the JSON envelope they all write ([`MeasurementOutput`] with its [`Verdict`]), why one could
//! not finish ([`MeasurementError`]), and [`execute`], which collects the environment, runs, writes and prints;
//! [`serve`] is the same for a helper process (`gpu-ipc helper`).

use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::Args;
use serde::{Deserialize, Serialize};

use crate::child::{Channel, ChannelError, ChildFailure, ChildTask};
use crate::env::{self, MeasurementEnv};
use crate::exit::{EXIT_FAILED, EXIT_OK};
use crate::progress;

/// The version of the measurements' JSON (probes and benchmark alike); bumped when a field changes meaning.
pub const SCHEMA_VERSION: u32 = 1;

/// Options every measurement takes (every probe, and `gpu-ipc bench pipeline`).
#[derive(Debug, Clone, Args)]
pub struct CommonArgs {
    /// Print the result as JSON on stdout (the same document `--out` writes) instead of text.
    #[arg(long)]
    pub json: bool,
    /// Also write the JSON result to this file.
    #[arg(long, value_name = "FILE")]
    pub out: Option<PathBuf>,
    /// A short pass: fewer repetitions and sizes (minutes become seconds; the JSON says so).
    #[arg(long)]
    pub quick: bool,
    /// The device to run on.
    #[arg(long, default_value_t = 0)]
    pub device: i32,
    /// No progress bar on stderr.
    #[arg(long)]
    pub no_progress: bool,
}

/// A measurement's verdict: the answer in one plain sentence, and the figure it rests on.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Verdict {
    /// The answer, in plain words, one sentence.
    pub answer: String,
    /// The key figure, with its unit and what it is (e.g. "largest read-bandwidth difference: -0.4% (noise 1.2%)").
    pub key_figure: String,
}

/// The document every measurement writes.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct MeasurementOutput<R> {
    /// What was measured: a probe (`overhead`, `coherency`, `vmm-compat`, `crash`) or a benchmark
    /// (`bench-pipeline`, `bench-targets`). The field keeps its first name, `probe`, so recorded results still load.
    pub probe: String,
    /// [`SCHEMA_VERSION`].
    pub schema: u32,
    /// Whether `--quick` was given.
    pub quick: bool,
    /// Where it ran.
    pub env: MeasurementEnv,
    /// Wall time of the whole measurement, in seconds.
    pub seconds: f64,
    /// The measurement's own results.
    pub results: R,
    /// The answer.
    pub verdict: Verdict,
}

/// Why a measurement (a probe, the benchmark, or one of their helper processes) could not finish.
#[derive(Debug, thiserror::Error)]
pub enum MeasurementError {
    /// A CUDA call failed.
    #[error(transparent)]
    Driver(#[from] gpu_ipc::driver::DriverError),
    /// A kernel could not be loaded or launched.
    #[error(transparent)]
    Kernel(#[from] gpu_ipc::kernels::launch::KernelError),
    /// A backend refused.
    #[error(transparent)]
    Backend(#[from] gpu_ipc::core::backend::BackendError),
    /// Talking to a child process failed.
    #[error(transparent)]
    Channel(#[from] ChannelError),
    /// A child reported a failure.
    #[error("the {role} child process failed: {reason}")]
    Child {
        /// Its role.
        role: String,
        /// What it said.
        reason: String,
    },
    /// A backend this build does not have was asked for.
    #[error(transparent)]
    BackendUnavailable(#[from] gpu_ipc::BackendUnavailable),
    /// Shared host memory (a memfd) could not be made, sent or mapped.
    #[error(transparent)]
    SharedMemory(#[from] gpu_ipc::core::shm::ShmError),
    /// The frame API failed (producer or consumer).
    #[error("frame API: {0}")]
    Frames(#[from] gpu_ipc::core::frames::FrameError),
    /// A message between the parent and a helper, or a helper's task, did not decode.
    #[error("{what}: malformed: {source}")]
    Malformed {
        /// Which message or task.
        what: String,
        /// The decoding error.
        source: serde_json::Error,
    },
    /// A helper (or the parent) said something other than what the protocol expects at this point.
    #[error("{peer}: expected {expected}, got {got}")]
    Unexpected {
        /// Who spoke.
        peer: &'static str,
        /// What was due.
        expected: &'static str,
        /// What came, in debug form.
        got: String,
    },
    /// Something a step needs did not come or does not exist (an fd with a message, a buffer, a sample).
    #[error("{0}")]
    Missing(&'static str),
    /// A bounded wait ran out or failed; says what was waited for.
    #[error("{0}")]
    Wait(String),
    /// A chart could not be drawn.
    #[error(transparent)]
    Plot(#[from] crate::plot::PlotError),
    /// A system call failed (duplicating an fd, writing a file).
    #[error("{op}: {source}")]
    Io {
        /// What was being done.
        op: &'static str,
        /// The OS error.
        source: std::io::Error,
    },
    /// A helper process was given a role no room owns (a binary and its helper from different versions).
    #[error("unknown helper role {0:?}")]
    UnknownRole(String),
    /// Anything else, said in words.
    #[error("{0}")]
    Other(String),
    /// What was asked needs what this machine does not offer (e.g. a sync strategy that needs MPS): not a failure
    /// of the thing measured.
    #[error("unavailable here: {0}")]
    Unavailable(String),
}

/// Runs one measurement the way every probe and benchmark runs: collect the environment (or stop with the doctor's message), run,
/// write the JSON, print JSON or text. Returns the exit status.
pub fn execute<R: Serialize>(
    name: &str,
    common: &CommonArgs,
    run: impl FnOnce(&MeasurementEnv, &progress::Progress) -> Result<(R, Verdict), MeasurementError>,
    render_text: impl FnOnce(&MeasurementOutput<R>) -> String,
) -> u8 {
    // Messages name the subcommand the user typed: `gpu-ipc probe overhead`, `gpu-ipc bench pipeline`.
    let command = match name.strip_prefix("bench-") {
        Some(bench) => format!("gpu-ipc bench {bench}"),
        None => format!("gpu-ipc probe {name}"),
    };
    let env = match env::collect(&command) {
        Ok(env) => env,
        Err((line, code)) => {
            eprintln!("{line}");
            return code;
        }
    };
    let progress = progress::Progress::new(name, !common.no_progress && !common.json);
    let started = std::time::Instant::now();
    let (results, verdict) = match run(&env, &progress) {
        Ok(done) => done,
        Err(e) => {
            progress.finish();
            eprintln!("{command}: {e}");
            return EXIT_FAILED;
        }
    };
    progress.finish();
    let output = MeasurementOutput {
        probe: name.to_owned(),
        schema: SCHEMA_VERSION,
        quick: common.quick,
        env,
        seconds: started.elapsed().as_secs_f64(),
        results,
        verdict,
    };
    let json = match serde_json::to_string_pretty(&output) {
        Ok(json) => json,
        Err(e) => {
            eprintln!("{command}: could not encode the result as JSON: {e}");
            return EXIT_FAILED;
        }
    };
    if let Some(path) = &common.out
        && let Err(e) = write_file(path, &json)
    {
        eprintln!("{command}: could not write {}: {e}", path.display());
        return EXIT_FAILED;
    }
    let mut stdout = std::io::stdout().lock();
    let printed = if common.json { writeln!(stdout, "{json}") } else { write!(stdout, "{}", render_text(&output)) };
    if printed.is_err() {
        return EXIT_FAILED;
    }
    EXIT_OK
}

fn write_file(path: &Path, text: &str) -> std::io::Result<()> {
    if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
        std::fs::create_dir_all(parent)?;
    }
    std::fs::write(path, format!("{text}\n"))
}

/// The helper process's side of `gpu-ipc helper --socket PATH`: connects, reads its task and hands it to
/// `run`, the command's dispatch to the room that owns the task. Returns the exit status (0 done, 1 failed; the
/// failure is also reported over the channel where possible).
pub fn serve(socket: &Path, run: impl FnOnce(ChildTask, &Channel) -> Result<(), MeasurementError>) -> u8 {
    let channel = match Channel::connect(socket) {
        Ok(channel) => channel,
        Err(e) => {
            eprintln!("gpu-ipc helper: {e}");
            return EXIT_FAILED;
        }
    };
    let task: ChildTask = match channel.recv_plain(Duration::from_secs(30)) {
        Ok(task) => task,
        Err(e) => {
            eprintln!("gpu-ipc helper: no task: {e}");
            return EXIT_FAILED;
        }
    };
    let role = task.role.clone();
    let result = run(task, &channel);
    match result {
        Ok(()) => EXIT_OK,
        Err(e) => {
            eprintln!("gpu-ipc helper ({role}): {e}");
            let _ = channel.send(&ChildFailure { error: e.to_string() }, Vec::new());
            EXIT_FAILED
        }
    }
}
