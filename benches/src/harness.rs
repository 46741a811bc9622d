//! What every bench binary shares: criterion's settings (short, so the GPU run fits its time budget), whether
//! this run measures (criterion's `--bench`) or only checks that each bench runs (`--test`, `cargo test
//! --benches`), the GPU benches' skip without a GPU, and where one-by-one timings go.

use std::path::PathBuf;
use std::time::Duration;

use criterion::Criterion;
use gpu_ipc_driver::Context;

use crate::report::{SAMPLES_DIR_ENV, SampleSet};
use ::harness::stats::Distribution;

/// Set to `1` on the GPU machine: a GPU bench that finds no usable GPU fails instead of skipping.
pub const REQUIRE_GPU_ENV: &str = "GPU_IPC_BENCH_REQUIRE_GPU";

/// The CUDA device ordinal the GPU benches use (default 0).
pub const DEVICE_ENV: &str = "GPU_IPC_BENCH_DEVICE";

/// Criterion with the benches' defaults, short so that a GPU run of every bench fits in minutes: 0.3 s warm-up,
/// 1 s measurement, 20 samples, 20,000 bootstrap resamples; then the command line (`--warm-up-time`,
/// `--measurement-time`, `--sample-size`, filters) on top.
pub fn criterion() -> Criterion {
    Criterion::default()
        .warm_up_time(Duration::from_millis(300))
        .measurement_time(Duration::from_secs(1))
        .sample_size(20)
        .nresamples(20_000)
        .configure_from_args()
}

/// Whether criterion measures with these arguments (as it decides: `--bench` without `--test`, `--list` or
/// `--profile-time`), as opposed to running each bench once to check it (`cargo test --benches`).
pub fn benchmark_mode(args: &[String]) -> bool {
    let has = |flag: &str| args.iter().any(|a| a == flag || a.starts_with(&format!("{flag}=")));
    has("--bench") && !has("--test") && !has("--list") && !has("--profile-time")
}

/// [`benchmark_mode`] of this process's arguments.
pub fn measuring() -> bool {
    benchmark_mode(&std::env::args().collect::<Vec<_>>())
}

/// The device ordinal from [`DEVICE_ENV`].
pub fn device_ordinal() -> i32 {
    std::env::var(DEVICE_ENV).ok().and_then(|v| v.parse().ok()).unwrap_or(0)
}

/// The CUDA context the GPU bench `bench` runs in, or `None` after printing one line that says the bench is
/// skipped and why (no driver, no device). With [`REQUIRE_GPU_ENV`]`=1` the process exits with status 1 instead.
pub fn gpu_or_skip(bench: &str) -> Option<Context> {
    let device = device_ordinal();
    match Context::for_ordinal(device) {
        Ok(ctx) => Some(ctx),
        Err(e) => {
            let line = skip_line(bench, device, &e.to_string());
            if std::env::var(REQUIRE_GPU_ENV).is_ok_and(|v| v == "1") {
                eprintln!("{line} ({REQUIRE_GPU_ENV}=1: failing)");
                std::process::exit(1);
            }
            println!("{line}");
            None
        }
    }
}

/// The line a skipped GPU bench prints.
pub fn skip_line(bench: &str, device: i32, reason: &str) -> String {
    format!("{bench}: skipped: needs a CUDA GPU (device {device}): {reason}")
}

/// Writes the one-by-one timings of the bench `id` (nanoseconds) where [`SAMPLES_DIR_ENV`] points, and prints
/// their percentiles. Nothing is written when the variable is unset.
pub fn record_one_by_one(id: &str, what: &str, mut samples_ns: Vec<f64>) {
    let Some(ns) = Distribution::from_samples(&mut samples_ns) else { return };
    let set = SampleSet { id: id.to_owned(), what: what.to_owned(), ns };
    println!(
        "{id}: {what}: p50 {} p99 {} p99.9 {} max {} ({} samples)",
        crate::report::format_ns(ns.p50),
        crate::report::format_ns(ns.p99),
        ns.p999.map_or_else(|| "-".to_owned(), crate::report::format_ns),
        crate::report::format_ns(ns.max),
        ns.count
    );
    if let Some(dir) = std::env::var_os(SAMPLES_DIR_ENV).map(PathBuf::from)
        && let Err(e) = set.write_to(&dir)
    {
        eprintln!("{id}: could not write its samples to {}: {e}", dir.display());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| (*s).to_owned()).collect()
    }

    #[test]
    fn only_cargo_bench_measures() {
        assert!(benchmark_mode(&args(&["gpu_signal", "--bench"])));
        assert!(benchmark_mode(&args(&["gpu_signal", "--bench", "round-trip"])));
        assert!(!benchmark_mode(&args(&["gpu_signal"])), "cargo test --benches passes no --bench");
        assert!(!benchmark_mode(&args(&["gpu_signal", "--bench", "--test"])));
        assert!(!benchmark_mode(&args(&["gpu_signal", "--bench", "--list"])));
        assert!(!benchmark_mode(&args(&["gpu_signal", "--bench", "--profile-time=5"])));
    }

    #[test]
    fn the_skip_line_says_what_is_missing() {
        assert_eq!(
            skip_line("gpu_memory", 0, "libcuda.so.1 not found"),
            "gpu_memory: skipped: needs a CUDA GPU (device 0): libcuda.so.1 not found"
        );
    }
}
