//! A row's figures and how they are computed: frames per second, the ratio to the single-process limit, latency
//! percentiles from an HDR histogram, CPU time per frame.

use hdrhistogram::Histogram;
pub use hdrhistogram::errors::CreationError;
use serde::{Deserialize, Serialize};

use super::rows::RowSpec;

/// Largest latency the histogram holds (60 s, in nanoseconds); larger values are clamped to it.
const MAX_LATENCY_NS: u64 = 60_000_000_000;

/// The quantiles of the latency CDF kept for the plot.
const CDF_QUANTILES: [f64; 13] = [0.0, 0.01, 0.05, 0.1, 0.25, 0.5, 0.75, 0.9, 0.95, 0.99, 0.995, 0.999, 1.0];

/// A latency histogram in nanoseconds (1 ns to 60 s, 3 significant digits).
#[derive(Debug, Clone)]
pub struct LatencyHistogram(Histogram<u64>);

impl LatencyHistogram {
    /// An empty histogram.
    ///
    /// # Errors
    /// Never in practice (the bounds are constants): the histogram crate's creation error.
    pub fn new() -> Result<Self, CreationError> {
        Histogram::new_with_bounds(1, MAX_LATENCY_NS, 3).map(Self)
    }

    /// Records one latency (clamped to 1 ns .. 60 s).
    pub fn record(&mut self, ns: u64) {
        self.0.saturating_record(ns.clamp(1, MAX_LATENCY_NS));
    }

    /// The summary, `None` when empty.
    pub fn summary(&self) -> Option<LatencySummary> {
        if self.0.is_empty() {
            return None;
        }
        let us = |q: f64| self.0.value_at_quantile(q) as f64 / 1e3;
        Some(LatencySummary {
            count: self.0.len(),
            p50_us: us(0.5),
            p99_us: us(0.99),
            p999_us: us(0.999),
            max_us: self.0.max() as f64 / 1e3,
            mean_us: self.0.mean() / 1e3,
            cdf: CDF_QUANTILES.iter().map(|&q| (us(q), q)).collect(),
        })
    }
}

/// Frame latency, publish to consumer done, in microseconds.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LatencySummary {
    /// Frames measured (over every consumer).
    pub count: u64,
    /// Median.
    pub p50_us: f64,
    /// 99th percentile.
    pub p99_us: f64,
    /// 99.9th percentile.
    pub p999_us: f64,
    /// Largest.
    pub max_us: f64,
    /// Mean.
    pub mean_us: f64,
    /// `(latency_us, quantile)` points of the distribution, for the CDF plot.
    pub cdf: Vec<(f64, f64)>,
}

/// What one consumer process measured and sends back.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ConsumerReport {
    /// Frames it read and verified (warm-up included).
    pub frames: u64,
    /// Frames in its measured window (after the warm-up).
    pub measured_frames: u64,
    /// CPU time (user + system) over the measured window, in nanoseconds.
    pub cpu_ns: u64,
    /// Mismatched 32-bit words over every frame (must be 0).
    pub mismatches: u64,
    /// Per measured frame: consumer done minus producer publish, in nanoseconds (CLOCK_MONOTONIC on both sides).
    pub latencies_ns: Vec<u64>,
    /// Measured frames whose publish time was not found (0 unless something is wrong).
    pub missing_stamps: u64,
    /// Per frame (warm-up included): when the consumer's kernel released it, in ns of the GPU's `%globaltimer`
    /// (the resident rows' grid kernels; empty for every other row).
    #[serde(default)]
    pub gpu_done_ns: Vec<u64>,
}

/// The figures of a row that ran.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Measurement {
    /// Frames in the measured window (after the warm-up).
    pub frames: u64,
    /// Seconds of the measured window.
    pub seconds: f64,
    /// Frames per second, as the producer saw them (for the bandwidth floor: the implied rate, see `note`).
    pub fps: f64,
    /// `fps` over the single-process limit's, filled in once both are known.
    pub ratio_to_single_process: Option<f64>,
    /// Latency publish -> consumer done; `None` for the references.
    pub latency: Option<LatencySummary>,
    /// The producer's (or the single process's) CPU time per frame, in microseconds.
    pub producer_cpu_us_per_frame: f64,
    /// Each consumer's CPU time per frame, in microseconds.
    pub consumer_cpu_us_per_frame: Vec<f64>,
    /// Mismatched words over every consumer (must be 0).
    pub mismatches: u64,
    /// Bytes read plus bytes written per second by a device-to-device copy row (the bandwidth floor, the copies
    /// within one allocation and with an imported buffer), in GB/s.
    pub bandwidth_gb_s: Option<f64>,
    /// Frame bytes times `fps`, in GB/s (10^9 bytes): what the row moves through the pipeline; filled in with the
    /// ratio ([`PipelineResults::fill_derived`]). Absent in results recorded before it existed.
    #[serde(default)]
    pub frame_gb_s: Option<f64>,
    /// What a reader must know about how this row was measured.
    pub note: Option<String>,
}

/// How a row ended.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "status", rename_all = "kebab-case")]
pub enum RowOutcome {
    /// It ran; the figures.
    Measured(Measurement),
    /// It failed or hung; why.
    Failed {
        /// The reason, in words.
        reason: String,
    },
    /// It cannot run on this machine as it is (e.g. `gpu-poll` without MPS); why.
    Unavailable {
        /// The reason, in words.
        reason: String,
    },
}

/// One row's result.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RowResult {
    /// [`RowSpec::name`].
    pub row: String,
    /// What it was.
    pub spec: RowSpec,
    /// How it ended.
    pub outcome: RowOutcome,
}

impl RowResult {
    /// The measurement, if it ran.
    pub fn measured(&self) -> Option<&Measurement> {
        match &self.outcome {
            RowOutcome::Measured(m) => Some(m),
            RowOutcome::Failed { .. } | RowOutcome::Unavailable { .. } => None,
        }
    }
}

/// The results of `gpu-ipc bench pipeline`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PipelineResults {
    /// Bytes of one frame (24,883,200 for 4K RGB).
    pub frame_bytes: u64,
    /// Frame width, height, bytes per pixel.
    pub frame_shape: [u32; 3],
    /// Frames measured per row.
    pub frames: u64,
    /// Frames run before the measured window of each row.
    pub warmup: u64,
    /// How the latency is timed, in words.
    pub latency_method: String,
    /// Every row, in the order run.
    pub rows: Vec<RowResult>,
}

impl PipelineResults {
    /// The single-process limit's FPS, if that row ran.
    pub fn single_process_fps(&self) -> Option<f64> {
        self.rows.iter().find(|r| r.spec == RowSpec::SingleProcess).and_then(RowResult::measured).map(|m| m.fps)
    }

    /// The FPS of the same kernels pipelined in one process through `slots` buffers
    /// (`single-process-pipelined-sN`), if that row ran cleanly: the fair reference of a ring of `slots` slots.
    pub fn pipelined_fps(&self, slots: u32) -> Option<f64> {
        self.rows
            .iter()
            .find(|r| r.spec == RowSpec::SingleProcessPipelined { slots })
            .and_then(RowResult::measured)
            .filter(|m| m.mismatches == 0)
            .map(|m| m.fps)
            .filter(|fps| *fps > 0.0)
    }

    /// Fills in every measured row's ratio to the single-process limit.
    pub fn fill_ratios(&mut self) {
        let reference = self.single_process_fps();
        for row in &mut self.rows {
            if let RowOutcome::Measured(m) = &mut row.outcome {
                m.ratio_to_single_process = reference.and_then(|r| ratio(m.fps, r));
            }
        }
    }

    /// Fills in what every measured row's figures imply: its ratio to the single-process limit
    /// ([`PipelineResults::fill_ratios`]) and its frame GB/s ([`frame_gb_s`]).
    pub fn fill_derived(&mut self) {
        self.fill_ratios();
        let bytes = self.frame_bytes;
        for row in &mut self.rows {
            if let RowOutcome::Measured(m) = &mut row.outcome {
                m.frame_gb_s = Some(frame_gb_s(bytes, m.fps));
            }
        }
    }
}

/// `value / reference`, `None` when the reference is not a positive number.
pub fn ratio(value: f64, reference: f64) -> Option<f64> {
    (reference > 0.0 && reference.is_finite()).then(|| value / reference)
}

/// GB/s (10^9 bytes per second) of `fps` frames of `frame_bytes` each.
pub fn frame_gb_s(frame_bytes: u64, fps: f64) -> f64 {
    frame_bytes as f64 * fps / 1e9
}

/// Frames per second: `frames` over `seconds` (0 for an empty window).
pub fn fps(frames: u64, seconds: f64) -> f64 {
    if seconds > 0.0 { frames as f64 / seconds } else { 0.0 }
}

/// CPU microseconds per frame: `cpu_ns` over `frames` (0 when no frame ran).
pub fn cpu_us_per_frame(cpu_ns: u64, frames: u64) -> f64 {
    if frames == 0 { 0.0 } else { cpu_ns as f64 / 1e3 / frames as f64 }
}

/// Merges the consumers' reports into the row's latency histogram, mismatch total and CPU per frame.
///
/// # Errors
/// The histogram could not be made.
pub fn merge_consumers(reports: &[ConsumerReport]) -> Result<(LatencyHistogram, u64, Vec<f64>, u64), CreationError> {
    let mut histogram = LatencyHistogram::new()?;
    let mut mismatches = 0;
    let mut missing = 0;
    let mut cpu = Vec::with_capacity(reports.len());
    for report in reports {
        for &ns in &report.latencies_ns {
            histogram.record(ns);
        }
        mismatches += report.mismatches;
        missing += report.missing_stamps;
        cpu.push(cpu_us_per_frame(report.cpu_ns, report.measured_frames));
    }
    Ok((histogram, mismatches, cpu, missing))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn close(a: f64, b: f64, tolerance: f64) -> bool {
        (a - b).abs() <= tolerance * b.abs().max(1e-12)
    }

    #[test]
    fn percentiles_from_the_histogram() {
        let mut h = LatencyHistogram::new().unwrap();
        assert!(h.summary().is_none());
        // 1 .. 1000 us, once each.
        for us in 1..=1000u64 {
            h.record(us * 1000);
        }
        let s = h.summary().unwrap();
        assert_eq!(s.count, 1000);
        // Three significant digits: within 0.1%.
        assert!(close(s.p50_us, 500.0, 2e-3), "{}", s.p50_us);
        assert!(close(s.p99_us, 990.0, 2e-3), "{}", s.p99_us);
        assert!(close(s.p999_us, 999.0, 2e-3), "{}", s.p999_us);
        assert!(close(s.max_us, 1000.0, 2e-3), "{}", s.max_us);
        assert!(close(s.mean_us, 500.5, 2e-3), "{}", s.mean_us);
        assert_eq!(s.cdf.len(), CDF_QUANTILES.len());
        assert!(s.cdf.windows(2).all(|w| w[0].0 <= w[1].0 && w[0].1 < w[1].1));
    }

    #[test]
    fn out_of_range_latencies_are_clamped() {
        let mut h = LatencyHistogram::new().unwrap();
        h.record(0);
        h.record(u64::MAX);
        let s = h.summary().unwrap();
        assert_eq!(s.count, 2);
        assert!(s.max_us <= MAX_LATENCY_NS as f64 / 1e3 * 1.001);
    }

    #[test]
    fn rates_and_ratios() {
        assert_eq!(fps(2000, 0.5), 4000.0);
        assert_eq!(fps(10, 0.0), 0.0);
        assert_eq!(ratio(32_000.0, 64_000.0), Some(0.5));
        assert_eq!(ratio(1.0, 0.0), None);
        assert_eq!(ratio(1.0, f64::NAN), None);
        assert_eq!(cpu_us_per_frame(3_000_000, 1000), 3.0);
        assert_eq!(cpu_us_per_frame(5, 0), 0.0);
        // 2,700 frames per second of 24,883,200 bytes each.
        assert!(close(frame_gb_s(24_883_200, 2_700.0), 67.184_64, 1e-9));
        assert_eq!(frame_gb_s(1_000, 0.0), 0.0);
    }

    #[test]
    fn consumers_merge() {
        let a = ConsumerReport {
            frames: 110,
            measured_frames: 100,
            cpu_ns: 1_000_000,
            mismatches: 0,
            latencies_ns: vec![10_000; 100],
            missing_stamps: 0,
            gpu_done_ns: Vec::new(),
        };
        let b = ConsumerReport { cpu_ns: 4_000_000, mismatches: 3, latencies_ns: vec![30_000; 100], ..a.clone() };
        let (h, mismatches, cpu, missing) = merge_consumers(&[a, b]).unwrap();
        assert_eq!(h.summary().unwrap().count, 200);
        assert_eq!(mismatches, 3);
        assert_eq!(cpu, vec![10.0, 40.0]);
        assert_eq!(missing, 0);
        let s = h.summary().unwrap();
        assert!(close(s.p50_us, 10.0, 2e-3) && close(s.p99_us, 30.0, 2e-3));
    }
}
