//! `gpu-ipc bench ...`: end-to-end benchmarks. `bench pipeline` runs the research's 4K frame pipeline (a producer
//! kernel writes each frame, each consumer kernel reads every byte of it) in every design worth comparing, all in
//! one run against references measured in the same run (see docs/benchmarks.md, "Method"):
//!
//! 1. the single-process limit (fill + verify in one process) and the memory-bandwidth floor (a frame copy);
//! 2. the study's four designs (pageable host copies, pinned staging, legacy IPC with a sleeping or spinning CPU);
//! 3. ours, through the real `Producer`/`Consumer` API: each backend x strategy x ring slots x consumer count;
//! 4. three-stage pipelines (A -> B -> C through two rings, B a `Stage` that inverts every word), each backend x
//!    strategy at 4 slots, beside the two-process rows of the same backend, strategy and depth;
//! 5. ours with the producer paced at 60, 240 and 1,000 FPS (latency under a frame rate), every strategy;
//! 6. the research's other measurements: its mapped zero-copy design, its basic design with the 16 ms sleeps it had,
//!    the memory benchmarks (pinned copies, kernels on mapped host memory, copies with an imported buffer) and
//!    each kernel alone.
//!
//! Each row is its own set of processes: the producer is this process, each consumer a `gpu-ipc helper`
//! with role `bench-consumer`, a three-stage row's middle stage one with role `bench-stage`, the exporter of an
//! imported-buffer row one with role `bench-exporter`. Every wait is bounded; a row that fails or hangs is recorded
//! as failed, with why, and the bench goes on.

#![forbid(unsafe_code)] // Only ipc-core's driver and sys layers may contain `unsafe`.

pub mod child;
pub mod consumer;
pub mod graphs;
pub mod memory;
pub mod ours;
pub mod paced;
pub mod references;
pub mod render;
pub mod resident;
pub mod results;
pub mod rig;
pub mod rows;
pub mod run;
pub mod shared;
pub mod stage;
pub mod study;
pub mod tables;
pub mod targets;
pub mod tasks;

use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use clap::{Args, Subcommand};
use gpu_ipc::BackendKind;

use harness::child::{Channel, ChildTask};
use harness::exit::{EXIT_FAILED, EXIT_OK};
use harness::{CommonArgs, MeasurementError};
use results::{PipelineResults, RowResult};
use rows::RowSpec;

/// Frames measured per row by default.
pub const DEFAULT_FRAMES: u64 = 2_000;
/// Frames measured per row with `--quick`.
pub const QUICK_FRAMES: u64 = 300;
/// The research's frame: 3840 x 2160 RGB, 24,883,200 bytes.
pub const FRAME_SHAPE: [u32; 3] = [3840, 2160, 3];

/// The benchmarks.
#[derive(Debug, Subcommand)]
pub enum BenchCommand {
    /// The 4K frame pipeline: the single-process limit, the bandwidth floor, each kernel alone, the study's designs
    /// and ours (every backend, sync strategy, ring depth and consumer count; three stages; paced at 60, 240 and
    /// 1,000 FPS), and the memory benchmarks, each row in its own processes.
    ///
    /// Exit status: 0 the bench ran (failed rows are in the results); 1 it could not run; 2 usage error; 3 no
    /// usable CUDA driver or no GPU.
    Pipeline(PipelineArgs),
    /// Whether this machine meets the project's performance targets (docs/benchmarks.md), judged from two `bench
    /// pipeline` JSONs of one machine (without MPS, under MPS), each figure against the references of its own run;
    /// needs no GPU.
    ///
    /// Exit status: 0 judged (met or not: read the table); 1 a file could not be read or is not what it was given
    /// as; 2 usage error.
    Targets(targets::TargetsArgs),
}

/// Options of `gpu-ipc bench pipeline`.
#[derive(Debug, Clone, Args)]
pub struct PipelineArgs {
    /// `--json`, `--out`, `--quick`, `--device`, `--no-progress`, as every probe takes them.
    #[command(flatten)]
    pub common: CommonArgs,
    /// Frames measured per row, after the warm-up [default: 2000; 300 with --quick].
    #[arg(long, value_name = "N")]
    pub frames: Option<u64>,
    /// Frames run before each row's measured window [default: a tenth of --frames, at least 10].
    #[arg(long, value_name = "N")]
    pub warmup: Option<u64>,
    /// Only the rows matching one of these filters (comma-separated; a filter matches a row whose name contains
    /// each of its `+`-separated parts, e.g. `study,vmm+gpu-stream-ops`; `paced` the rows paced at a frame rate,
    /// `graphs` the rows on frame graphs, `memory` the memory benchmarks, `kernel` the kernels alone; `--list`
    /// shows the names). The references
    /// always run.
    #[arg(long, value_delimiter = ',', value_name = "FILTER")]
    pub rows: Vec<String>,
    /// Our rows, the paced rows and the imported-buffer rows for this backend only (default: every backend built
    /// in; the paced rows use one, vmm when built in).
    #[arg(long)]
    pub backend: Option<BackendKind>,
    /// Start a private MPS daemon, run the bench as its client, and stop it (without this flag the bench measures
    /// the machine as it finds it: its JSON says whether MPS was on).
    #[arg(long)]
    pub mps: bool,
    /// Also write the plots (SVG: FPS by ring slots per strategy, latency CDF) into this directory.
    #[arg(long, value_name = "DIR")]
    pub plots: Option<PathBuf>,
    /// Also write the Markdown table to this file.
    #[arg(long, value_name = "FILE")]
    pub markdown: Option<PathBuf>,
    /// Bound of every wait for one frame, in seconds.
    #[arg(long, default_value_t = 10, value_name = "SECONDS")]
    pub frame_timeout: u64,
    /// Bound of one row, in seconds (a row past it is recorded as failed).
    #[arg(long, default_value_t = 300, value_name = "SECONDS")]
    pub row_timeout: u64,
    /// Our rows at these ring depths only (comma-separated, each 1 to 256; above 32 the ring's control block uses
    /// layout 2), every strategy and consumer count, instead of the grid's depths; `--rows` still filters them.
    #[arg(long, value_delimiter = ',', value_name = "N", value_parser = clap::value_parser!(u32).range(1..=256))]
    pub slots: Vec<u32>,
    /// Print the names of the rows that would run, and exit (needs no GPU).
    #[arg(long)]
    pub list: bool,
}

impl PipelineArgs {
    /// Frames measured per row.
    pub fn frames(&self) -> u64 {
        self.frames.unwrap_or(if self.common.quick { QUICK_FRAMES } else { DEFAULT_FRAMES }).max(1)
    }

    /// Warm-up frames per row.
    pub fn warmup(&self) -> u64 {
        self.warmup.unwrap_or((self.frames() / 10).max(10))
    }

    /// The rows this run selects, in the order they run.
    pub fn selected_rows(&self) -> Vec<RowSpec> {
        let backends: Vec<BackendKind> = self.backend.map_or_else(|| gpu_ipc::COMPILED_GPU.to_vec(), |b| vec![b]);
        let grid = match self.slots.as_slice() {
            [] => rows::all_rows(&backends, self.common.quick),
            slots => rows::rows_at_slots(&backends, slots),
        };
        rows::select(&grid, &self.rows)
    }
}

/// How the latency is timed, as the results record it.
const LATENCY_METHOD: &str = "CLOCK_MONOTONIC at the producer's publish (after its fill completed for the CPU \
    strategies and the study's designs; when the publish was queued for ipc-event, gpu-stream-ops and gpu-poll), \
    stored in a shared memfd indexed by sequence, to the first moment the consumer's CPU saw its verify of that \
    frame complete (an event after the verify, polled); percentiles from an HDR histogram (3 significant digits) \
    over every consumer's measured frames; paced rows: the consumer waits for each frame's verify to complete \
    before it asks for the next frame, so every frame's completion is seen within one poll";

/// `gpu-ipc bench pipeline`. Returns the exit status.
pub fn pipeline_main(args: &PipelineArgs) -> u8 {
    let selected = args.selected_rows();
    if args.list {
        use std::io::Write;
        let mut stdout = std::io::stdout().lock();
        // A closed pipe (`| head`) ends the list; it is not an error.
        let _ = selected.iter().try_for_each(|row| writeln!(stdout, "{}", row.name()));
        return EXIT_OK;
    }
    if args.mps {
        // No daemon is started, and nothing written, on a machine without a driver: the same one line as below.
        if let Err((line, code)) = harness::env::collect("gpu-ipc bench pipeline") {
            eprintln!("{line}");
            return code;
        }
        return under_private_mps(args, selected.len());
    }
    let cfg = rig::RunConfig {
        device: args.common.device,
        shape: FRAME_SHAPE,
        frames: args.frames(),
        warmup: args.warmup(),
        frame_timeout: Duration::from_secs(args.frame_timeout.max(1)),
        row_timeout: Duration::from_secs(args.row_timeout.max(1)),
    };
    let mut table = None;
    let code = harness::execute(
        "bench-pipeline",
        &args.common,
        |_env, progress| {
            let gpu = harness::gpu::GpuSetup::open(cfg.device)?;
            let mut results = PipelineResults {
                frame_bytes: cfg.frame_bytes(),
                frame_shape: cfg.shape,
                frames: cfg.frames,
                warmup: cfg.warmup,
                latency_method: LATENCY_METHOD.to_owned(),
                rows: Vec::with_capacity(selected.len()),
            };
            progress.stage("rows", selected.len() as u64);
            for spec in &selected {
                let started = Instant::now();
                let outcome = run::run_row(&gpu, &cfg, *spec);
                tracing::info!(row = %spec.name(), seconds = started.elapsed().as_secs_f64(), ?outcome, "row done");
                results.rows.push(RowResult { row: spec.name(), spec: *spec, outcome });
                progress.step(&spec.name());
            }
            results.fill_derived();
            table = Some(render::markdown_table(&results));
            if let Some(dir) = &args.plots {
                render::write_charts(&render::charts(&results), dir)?;
            }
            let verdict = render::verdict(&results);
            Ok((results, verdict))
        },
        |output| render::render_text(output, args.common.device),
    );
    if let (Some(path), Some(table)) = (&args.markdown, table)
        && let Err(e) = std::fs::write(path, table)
    {
        eprintln!("gpu-ipc bench pipeline: could not write {}: {e}", path.display());
        return EXIT_FAILED;
    }
    code
}

/// `--mps`: starts a private MPS daemon (the guard `gpu-ipc report` uses), runs this same command without `--mps`
/// as the daemon's client, bounded by the rows' limits, and stops the daemon whatever happened.
fn under_private_mps(args: &PipelineArgs, rows: usize) -> u8 {
    use harness::mps::{MpsControl, MpsDaemon};
    let mut daemon = match MpsDaemon::start(&MpsControl::from_path()) {
        Ok(daemon) => daemon,
        Err(reason) => {
            eprintln!("gpu-ipc bench pipeline: cannot start a private MPS daemon: {reason}");
            return EXIT_FAILED;
        }
    };
    let exe = match std::env::current_exe() {
        Ok(exe) => exe,
        Err(e) => {
            eprintln!("gpu-ipc bench pipeline: cannot find this program: {e}");
            return EXIT_FAILED;
        }
    };
    let mut command = Command::new(exe);
    command.args(std::env::args_os().skip(1).filter(|a| a != "--mps"));
    for (key, value) in daemon.client_env() {
        match value {
            Some(value) => command.env(key, value),
            None => command.env_remove(key),
        };
    }
    let limit = Duration::from_secs(args.row_timeout.max(1)) * u32::try_from(rows + 1).unwrap_or(u32::MAX);
    let code = match command.spawn() {
        Ok(mut child) => match harness::process::wait_until(&mut child, Instant::now() + limit) {
            Ok(Some(status)) => status.code().and_then(|c| u8::try_from(c).ok()).unwrap_or(EXIT_FAILED),
            Ok(None) | Err(_) => {
                let _ = child.kill();
                let _ = child.wait();
                eprintln!("gpu-ipc bench pipeline: the run under MPS passed its limit of {limit:?}; killed");
                EXIT_FAILED
            }
        },
        Err(e) => {
            eprintln!("gpu-ipc bench pipeline: cannot start the run under MPS: {e}");
            EXIT_FAILED
        }
    };
    if let Err(problem) = daemon.stop() {
        eprintln!("gpu-ipc bench pipeline: {problem}");
    }
    code
}

/// The prefix of the benchmark's helper roles (`bench-consumer`, `bench-stage`).
pub const ROLE_PREFIX: &str = "bench-";

/// Runs `gpu-ipc bench ...`; returns the exit status.
pub fn main(command: &BenchCommand) -> u8 {
    match command {
        BenchCommand::Pipeline(args) => pipeline_main(args),
        BenchCommand::Targets(args) => targets::targets_main(args),
    }
}

/// The bench's helper processes (its roles, [`tasks::BenchTask`]).
///
/// # Errors
/// A task that is not the bench's, or the role's failure.
pub fn child(task: ChildTask, channel: &Channel) -> Result<(), MeasurementError> {
    child::child(task, channel)
}
