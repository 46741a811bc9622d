//! The benches' results as a short Markdown summary: criterion's own files (`<id>/new/benchmark.json`,
//! `estimates.json`, `sample.json` under `CRITERION_HOME`) read back, plus the distributions the benches time one
//! by one ([`SampleSet`], written where `GPU_IPC_BENCH_SAMPLES` points). Parsing and rendering are pure; only
//! [`collect_criterion`] and [`collect_sample_sets`] touch the file system.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use ::harness::stats::Distribution;

/// Where the benches write their [`SampleSet`]s (one JSON file each); unset: they write none.
pub const SAMPLES_DIR_ENV: &str = "GPU_IPC_BENCH_SAMPLES";

/// Work done by one iteration, as criterion records it (`Throughput` in `benchmark.json`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Throughput {
    /// Bytes per iteration (criterion reports binary units).
    Bytes(u64),
    /// Bytes per iteration (decimal units).
    BytesDecimal(u64),
    /// Elements per iteration.
    Elements(u64),
    /// Bits per iteration.
    Bits(u64),
}

/// One benchmark's figures, per iteration, in nanoseconds.
#[derive(Debug, Clone, PartialEq)]
pub struct BenchResult {
    /// Criterion's group (`read-256MiB`).
    pub group: String,
    /// The full id (`read-256MiB/legacy-imported`).
    pub id: String,
    /// Criterion's estimate of the median time per iteration.
    pub median_ns: f64,
    /// Its confidence interval (lower, upper).
    pub median_ci_ns: (f64, f64),
    /// Criterion's estimate of the mean time per iteration.
    pub mean_ns: f64,
    /// Work per iteration, if the bench declared it.
    pub throughput: Option<Throughput>,
    /// Time per iteration of each sample (sample time / its iterations).
    pub sample_means: Option<Distribution>,
}

impl BenchResult {
    /// Work per second at the median time: `2712 GB/s` for bytes, `2.60 M/s` for elements.
    pub fn rate(&self) -> Option<String> {
        if self.median_ns <= 0.0 || !self.median_ns.is_finite() {
            return None;
        }
        let per_second = |amount: u64| amount as f64 / (self.median_ns * 1e-9);
        Some(match self.throughput? {
            Throughput::Bytes(b) | Throughput::BytesDecimal(b) => format!("{} GB/s", significant(per_second(b) / 1e9)),
            Throughput::Bits(b) => format!("{} Gbit/s", significant(per_second(b) / 1e9)),
            Throughput::Elements(e) => {
                let v = per_second(e);
                let (scaled, prefix) = match v {
                    v if v >= 1e9 => (v / 1e9, " G"),
                    v if v >= 1e6 => (v / 1e6, " M"),
                    v if v >= 1e3 => (v / 1e3, " k"),
                    v => (v, " "),
                };
                format!("{}{prefix}/s", significant(scaled))
            }
        })
    }
}

/// A distribution a bench timed one operation at a time (criterion times batches), e.g. round trips.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SampleSet {
    /// The criterion id of the bench it belongs to.
    pub id: String,
    /// What one sample is, in words.
    pub what: String,
    /// The samples' summary, in nanoseconds.
    pub ns: Distribution,
}

impl SampleSet {
    /// Writes it as `<dir>/<id with / as __>.json`.
    ///
    /// # Errors
    /// The file cannot be written.
    pub fn write_to(&self, dir: &Path) -> std::io::Result<PathBuf> {
        std::fs::create_dir_all(dir)?;
        let path = dir.join(format!("{}.json", self.id.replace(['/', ' '], "__")));
        std::fs::write(&path, serde_json::to_vec_pretty(self).map_err(std::io::Error::other)?)?;
        Ok(path)
    }
}

#[derive(Deserialize)]
struct RawBenchmark {
    group_id: String,
    full_id: String,
    throughput: Option<Throughput>,
}

#[derive(Deserialize)]
struct RawInterval {
    lower_bound: f64,
    upper_bound: f64,
}

#[derive(Deserialize)]
struct RawEstimate {
    confidence_interval: RawInterval,
    point_estimate: f64,
}

#[derive(Deserialize)]
struct RawEstimates {
    mean: RawEstimate,
    median: RawEstimate,
}

#[derive(Deserialize)]
struct RawSample {
    iters: Vec<f64>,
    times: Vec<f64>,
}

/// Why a run's results could not be summarised: each names the file or directory (run the benches again, or point
/// `--criterion`/`--samples` at the run's own directories).
#[derive(Debug, thiserror::Error)]
pub enum SummaryError {
    /// A file is not what criterion (or the one-by-one benches) write.
    #[error("{file}: {source}")]
    Malformed {
        /// Which file (`benchmark.json`, or a path).
        file: String,
        /// The decoding error.
        source: serde_json::Error,
    },
    /// `sample.json` has another number of iteration counts than of times.
    #[error("sample.json: {iters} iteration counts but {times} times")]
    UnevenSample {
        /// Iteration counts.
        iters: usize,
        /// Times.
        times: usize,
    },
    /// A directory or file could not be read.
    #[error("reading {}: {source}", path.display())]
    Read {
        /// What was read.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// A benchmark's files, in the directory named, did not parse.
    #[error("{}: {source}", dir.display())]
    Benchmark {
        /// The benchmark's `new/` directory.
        dir: PathBuf,
        /// What was wrong.
        source: Box<SummaryError>,
    },
}

/// One benchmark from the contents of its `benchmark.json`, `estimates.json` and (optional) `sample.json`.
///
/// # Errors
/// A file that is not what criterion writes, with which one.
pub fn parse_benchmark(benchmark: &str, estimates: &str, sample: Option<&str>) -> Result<BenchResult, SummaryError> {
    fn malformed(file: &'static str) -> impl FnOnce(serde_json::Error) -> SummaryError {
        move |source| SummaryError::Malformed { file: file.to_owned(), source }
    }
    let b: RawBenchmark = serde_json::from_str(benchmark).map_err(malformed("benchmark.json"))?;
    let e: RawEstimates = serde_json::from_str(estimates).map_err(malformed("estimates.json"))?;
    let sample_means = match sample {
        Some(text) => {
            let s: RawSample = serde_json::from_str(text).map_err(malformed("sample.json"))?;
            if s.iters.len() != s.times.len() {
                return Err(SummaryError::UnevenSample { iters: s.iters.len(), times: s.times.len() });
            }
            let mut means: Vec<f64> =
                s.iters.iter().zip(&s.times).filter(|(i, _)| **i > 0.0).map(|(i, t)| t / i).collect();
            Distribution::from_samples(&mut means)
        }
        None => None,
    };
    Ok(BenchResult {
        group: b.group_id,
        id: b.full_id,
        median_ns: e.median.point_estimate,
        median_ci_ns: (e.median.confidence_interval.lower_bound, e.median.confidence_interval.upper_bound),
        mean_ns: e.mean.point_estimate,
        throughput: b.throughput,
        sample_means,
    })
}

/// Every benchmark under a criterion output directory (each `new/benchmark.json` found), sorted by id; none when
/// the directory does not exist (no bench ran).
///
/// # Errors
/// A directory that cannot be read, or a benchmark whose files do not parse (named).
pub fn collect_criterion(root: &Path) -> Result<Vec<BenchResult>, SummaryError> {
    if !root.exists() {
        return Ok(Vec::new());
    }
    let mut found = Vec::new();
    find_files(root, "benchmark.json", &mut found)
        .map_err(|source| SummaryError::Read { path: root.to_owned(), source })?;
    let mut results = Vec::new();
    for path in found {
        let Some(dir) = path.parent().filter(|d| d.file_name().is_some_and(|n| n == "new")) else { continue };
        let read = |name: &str| std::fs::read_to_string(dir.join(name));
        let (Ok(benchmark), Ok(estimates)) = (read("benchmark.json"), read("estimates.json")) else { continue };
        let sample = read("sample.json").ok();
        results.push(
            parse_benchmark(&benchmark, &estimates, sample.as_deref())
                .map_err(|e| SummaryError::Benchmark { dir: dir.to_owned(), source: Box::new(e) })?,
        );
    }
    results.sort_by(|a, b| a.id.cmp(&b.id));
    Ok(results)
}

/// Every [`SampleSet`] in `dir` (none when it does not exist), sorted by id.
///
/// # Errors
/// A file that does not parse (named).
pub fn collect_sample_sets(dir: &Path) -> Result<Vec<SampleSet>, SummaryError> {
    let Ok(entries) = std::fs::read_dir(dir) else { return Ok(Vec::new()) };
    let mut sets = Vec::new();
    for entry in entries.flatten() {
        let path = entry.path();
        if path.extension().is_some_and(|e| e == "json") {
            let text =
                std::fs::read_to_string(&path).map_err(|source| SummaryError::Read { path: path.clone(), source })?;
            let file = path.display().to_string();
            sets.push(serde_json::from_str(&text).map_err(|source| SummaryError::Malformed { file, source })?);
        }
    }
    sets.sort_by(|a: &SampleSet, b| a.id.cmp(&b.id));
    Ok(sets)
}

fn find_files(dir: &Path, name: &str, out: &mut Vec<PathBuf>) -> std::io::Result<()> {
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        if path.is_dir() {
            find_files(&path, name, out)?;
        } else if path.file_name().is_some_and(|n| n == name) {
            out.push(path);
        }
    }
    Ok(())
}

/// A duration in nanoseconds with a unit that keeps three significant digits: `812 ns`, `3.41 us`, `12.3 ms`.
pub fn format_ns(ns: f64) -> String {
    let (value, unit) = if !ns.is_finite() {
        return "n/a".to_owned();
    } else if ns.abs() < 1e3 {
        (ns, "ns")
    } else if ns.abs() < 1e6 {
        (ns / 1e3, "us")
    } else if ns.abs() < 1e9 {
        (ns / 1e6, "ms")
    } else {
        (ns / 1e9, "s")
    };
    format!("{} {unit}", significant(value))
}

/// `value` with three significant digits (no fraction from 100 up): `812`, `3.41`, `12.3`, `2712`.
pub fn significant(value: f64) -> String {
    let digits = if value.abs() >= 100.0 {
        0
    } else if value.abs() >= 10.0 {
        1
    } else {
        2
    };
    format!("{value:.digits$}")
}

/// The Markdown summary: a heading, `context` lines (commit, device, MPS or not), one table per criterion
/// group, then the distributions timed one by one.
pub fn render_markdown(title: &str, context: &[String], results: &[BenchResult], sets: &[SampleSet]) -> String {
    let mut out = format!("# {title}\n\n");
    for line in context {
        out.push_str(&format!("- {line}\n"));
    }
    if !context.is_empty() {
        out.push('\n');
    }
    if results.is_empty() {
        out.push_str("No criterion results found (did the benches run, or were they skipped?).\n");
    }
    let mut groups: Vec<&str> = results.iter().map(|r| r.group.as_str()).collect();
    groups.dedup();
    for group in groups {
        out.push_str(&format!(
            "## {group}\n\n| benchmark | median / iteration | 95% CI of the median | rate | sample means p50 / p99 (n) |\n\
             |---|---:|---:|---:|---:|\n"
        ));
        for r in results.iter().filter(|r| r.group == group) {
            let name = r.id.strip_prefix(&format!("{group}/")).unwrap_or(&r.id);
            let rate = r.rate().unwrap_or_else(|| "-".to_owned());
            let spread = r.sample_means.map_or_else(
                || "-".to_owned(),
                |d| format!("{} / {} ({})", format_ns(d.p50), format_ns(d.p99), d.count),
            );
            out.push_str(&format!(
                "| {name} | {} | {} - {} | {rate} | {spread} |\n",
                format_ns(r.median_ns),
                format_ns(r.median_ci_ns.0),
                format_ns(r.median_ci_ns.1),
            ));
        }
        out.push('\n');
    }
    if !sets.is_empty() {
        out.push_str(
            "## Timed one by one\n\n| benchmark | what one sample is | samples | p50 | p99 | p99.9 | max |\n\
             |---|---|---:|---:|---:|---:|---:|\n",
        );
        for s in sets {
            out.push_str(&format!(
                "| {} | {} | {} | {} | {} | {} | {} |\n",
                s.id,
                s.what,
                s.ns.count,
                format_ns(s.ns.p50),
                format_ns(s.ns.p99),
                s.ns.p999.map_or_else(|| "-".to_owned(), format_ns),
                format_ns(s.ns.max)
            ));
        }
        out.push('\n');
    }
    out
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    // Trimmed copies of what criterion 0.7 writes.
    const BENCHMARK: &str = r#"{"group_id":"read-256MiB","function_id":"legacy-imported","value_str":null,
        "throughput":{"BytesDecimal":268435456},"full_id":"read-256MiB/legacy-imported",
        "directory_name":"read-256MiB/legacy-imported","title":"read-256MiB/legacy-imported"}"#;
    const ESTIMATES: &str = r#"{
        "mean":{"confidence_interval":{"confidence_level":0.95,"lower_bound":99000.0,"upper_bound":101000.0},
                "point_estimate":100000.0,"standard_error":500.0},
        "median":{"confidence_interval":{"confidence_level":0.95,"lower_bound":98000.0,"upper_bound":99500.0},
                  "point_estimate":99000.0,"standard_error":400.0},
        "median_abs_dev":{"confidence_interval":{"confidence_level":0.95,"lower_bound":1.0,"upper_bound":2.0},
                          "point_estimate":1.5,"standard_error":0.1},
        "slope":null,
        "std_dev":{"confidence_interval":{"confidence_level":0.95,"lower_bound":1.0,"upper_bound":2.0},
                   "point_estimate":1.5,"standard_error":0.1}}"#;
    const SAMPLE: &str = r#"{"sampling_mode":"Linear","iters":[1.0,2.0,3.0,4.0],
        "times":[100000.0,196000.0,300000.0,480000.0]}"#;

    fn result() -> BenchResult {
        parse_benchmark(BENCHMARK, ESTIMATES, Some(SAMPLE)).unwrap()
    }

    #[test]
    fn criterion_files_parse_into_per_iteration_figures() {
        let r = result();
        assert_eq!((r.group.as_str(), r.id.as_str()), ("read-256MiB", "read-256MiB/legacy-imported"));
        assert_eq!((r.median_ns, r.median_ci_ns, r.mean_ns), (99_000.0, (98_000.0, 99_500.0), 100_000.0));
        assert_eq!(r.throughput, Some(Throughput::BytesDecimal(268_435_456)));
        // Sample means: 100 us, 98 us, 100 us, 120 us.
        let d = r.sample_means.unwrap();
        assert_eq!((d.count, d.min, d.p50, d.max), (4, 98_000.0, 100_000.0, 120_000.0));
        // 268,435,456 bytes in 99 us.
        assert_eq!(r.rate().unwrap(), "2711 GB/s");
        let per = |throughput, median_ns| BenchResult { throughput, median_ns, ..r.clone() }.rate();
        assert_eq!(per(Some(Throughput::Elements(1)), 392_000.0).unwrap(), "2.55 k/s");
        assert_eq!(per(Some(Throughput::Elements(1)), 384.0).unwrap(), "2.60 M/s");
        assert_eq!(per(Some(Throughput::Elements(1)), 0.0), None);
        assert_eq!(per(None, 384.0), None);
    }

    #[test]
    fn malformed_files_say_which_file() {
        assert!(parse_benchmark("{}", ESTIMATES, None).unwrap_err().to_string().starts_with("benchmark.json:"));
        assert!(parse_benchmark(BENCHMARK, "[]", None).unwrap_err().to_string().starts_with("estimates.json:"));
        let uneven = r#"{"iters":[1.0],"times":[1.0,2.0]}"#;
        assert_eq!(
            parse_benchmark(BENCHMARK, ESTIMATES, Some(uneven)).unwrap_err().to_string(),
            "sample.json: 1 iteration counts but 2 times"
        );
        let r = parse_benchmark(BENCHMARK, ESTIMATES, None).unwrap();
        assert_eq!(r.sample_means, None);
    }

    #[test]
    fn durations_keep_three_significant_digits() {
        assert_eq!(format_ns(812.4), "812 ns");
        assert_eq!(format_ns(3_414.0), "3.41 us");
        assert_eq!(format_ns(12_345_678.0), "12.3 ms");
        assert_eq!(format_ns(2.5e9), "2.50 s");
        assert_eq!(format_ns(f64::NAN), "n/a");
    }

    #[test]
    fn markdown_has_a_table_per_group_and_the_one_by_one_distributions() {
        let mut other = result();
        other.group = "round-trip-vmm".into();
        other.id = "round-trip-vmm/cpu-spin".into();
        other.throughput = None;
        other.sample_means = None;
        let set = SampleSet {
            id: "round-trip-vmm/cpu-spin".into(),
            what: "one round trip".into(),
            ns: Distribution::from_samples(&mut vec![2_000.0, 2_100.0, 9_000.0]).unwrap(),
        };
        let md = render_markdown("GPU micro-benchmarks", &["commit abc".into()], &[result(), other], &[set]);
        assert!(md.starts_with("# GPU micro-benchmarks\n\n- commit abc\n\n## read-256MiB\n"), "{md}");
        assert!(
            md.contains("| legacy-imported | 99.0 us | 98.0 us - 99.5 us | 2711 GB/s | 100 us / 120 us (4) |"),
            "{md}"
        );
        assert!(md.contains("## round-trip-vmm\n"), "{md}");
        assert!(md.contains("| cpu-spin | 99.0 us | 98.0 us - 99.5 us | - | - |"), "{md}");
        assert!(
            md.contains("| round-trip-vmm/cpu-spin | one round trip | 3 | 2.10 us | 9.00 us | 9.00 us | 9.00 us |"),
            "{md}"
        );
        let empty = render_markdown("t", &[], &[], &[]);
        assert!(empty.contains("No criterion results found"), "{empty}");
    }

    #[test]
    fn sample_sets_and_criterion_directories_round_trip_through_files() {
        let dir = std::env::temp_dir().join(format!("gpu-ipc-bench-report-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let set = SampleSet {
            id: "round-trip-legacy/ipc-event".into(),
            what: "one round trip".into(),
            ns: Distribution::from_samples(&mut vec![1.0, 2.0]).unwrap(),
        };
        let written = set.write_to(&dir.join("samples")).unwrap();
        assert!(written.ends_with("round-trip-legacy__ipc-event.json"));
        assert_eq!(collect_sample_sets(&dir.join("samples")).unwrap(), vec![set]);
        assert_eq!(collect_sample_sets(&dir.join("absent")).unwrap(), Vec::new());

        let new = dir.join("criterion/read-256MiB/legacy-imported/new");
        std::fs::create_dir_all(&new).unwrap();
        std::fs::create_dir_all(dir.join("criterion/read-256MiB/legacy-imported/base")).unwrap();
        std::fs::write(new.join("benchmark.json"), BENCHMARK).unwrap();
        std::fs::write(new.join("estimates.json"), ESTIMATES).unwrap();
        // A copy under base/ (criterion's previous run) is not counted twice.
        let base = dir.join("criterion/read-256MiB/legacy-imported/base");
        std::fs::write(base.join("benchmark.json"), BENCHMARK).unwrap();
        assert_eq!(collect_criterion(&dir.join("absent")).unwrap(), Vec::new());
        let found = collect_criterion(&dir.join("criterion")).unwrap();
        assert_eq!(found.len(), 1);
        assert_eq!(found[0].id, "read-256MiB/legacy-imported");
        assert_eq!(found[0].sample_means, None);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
