//! Prints the Markdown summary of a micro-benchmark run: criterion's results under `--criterion` (its
//! `CRITERION_HOME`) and the one-by-one distributions under `--samples` (`GPU_IPC_BENCH_SAMPLES`).
//!
//! ```text
//! bench-summary --criterion OUT/criterion-mps --samples OUT/samples-mps --title "GPU micro-benchmarks, MPS"
//! ```
//! Exit status: 0 written; 1 the results could not be read.

#![forbid(unsafe_code)] // Only ipc-core's driver and sys layers may contain `unsafe`.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;
use gpu_ipc_benches::report::{collect_criterion, collect_sample_sets, render_markdown};

/// Summarise a criterion run of the gpu-ipc micro-benchmarks as Markdown.
#[derive(Debug, Parser)]
#[command(version)]
struct Args {
    /// Criterion's output directory (`CRITERION_HOME` of the run).
    #[arg(long)]
    criterion: PathBuf,
    /// Directory of the one-by-one distributions (`GPU_IPC_BENCH_SAMPLES` of the run).
    #[arg(long)]
    samples: Option<PathBuf>,
    /// The heading.
    #[arg(long, default_value = "gpu-ipc micro-benchmarks")]
    title: String,
    /// A line under the heading (commit, device, MPS or not); repeatable.
    #[arg(long)]
    context: Vec<String>,
}

fn main() -> ExitCode {
    let args = Args::parse();
    let results = match collect_criterion(&args.criterion) {
        Ok(results) => results,
        Err(e) => {
            eprintln!("bench-summary: {e}");
            return ExitCode::FAILURE;
        }
    };
    let sets = match args.samples.as_deref().map(collect_sample_sets).transpose() {
        Ok(sets) => sets.unwrap_or_default(),
        Err(e) => {
            eprintln!("bench-summary: {e}");
            return ExitCode::FAILURE;
        }
    };
    print!("{}", render_markdown(&args.title, &args.context, &results, &sets));
    ExitCode::SUCCESS
}
