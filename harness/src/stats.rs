//! Distributions of measured samples: the numbers every probe cell reports (count, p50, p99, max).

use serde::{Deserialize, Serialize};

/// A summary of samples: how many, and where they lie. Percentiles use the nearest-rank method on the sorted
/// samples (p50 of `[1, 2, 3, 4]` is 2), so every reported value is a value that was measured.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Distribution {
    /// Number of samples.
    pub count: u64,
    /// Smallest sample.
    pub min: f64,
    /// Median (nearest rank).
    pub p50: f64,
    /// 99th percentile (nearest rank).
    pub p99: f64,
    /// Largest sample.
    pub max: f64,
    /// Arithmetic mean.
    pub mean: f64,
}

impl Distribution {
    /// Summarises `samples` (sorted in place; NaNs are dropped). `None` when no sample is left.
    pub fn from_samples(samples: &mut Vec<f64>) -> Option<Self> {
        samples.retain(|x| !x.is_nan());
        if samples.is_empty() {
            return None;
        }
        samples.sort_by(f64::total_cmp);
        let count = samples.len();
        let mean = samples.iter().sum::<f64>() / count as f64;
        Some(Self {
            count: count as u64,
            min: samples[0],
            p50: percentile_sorted(samples, 50.0),
            p99: percentile_sorted(samples, 99.0),
            max: samples[count - 1],
            mean,
        })
    }

    /// The relative spread of the samples around their median, `(max - min) / p50`: the run-to-run noise band a
    /// difference must exceed to count as measurable. 0 for a single sample or a zero median.
    pub fn relative_spread(&self) -> f64 {
        if self.count < 2 || self.p50 == 0.0 { 0.0 } else { (self.max - self.min) / self.p50.abs() }
    }
}

/// The nearest-rank percentile `p` (0 to 100) of sorted, non-empty `sorted`.
pub fn percentile_sorted(sorted: &[f64], p: f64) -> f64 {
    debug_assert!(!sorted.is_empty());
    let n = sorted.len();
    let rank = ((p / 100.0) * n as f64).ceil() as usize;
    sorted[rank.clamp(1, n) - 1]
}

/// `(imported - local) / local`: how much larger the imported figure is, as a fraction (0.05 = 5% larger).
pub fn relative_difference(local: f64, imported: f64) -> f64 {
    if local == 0.0 { 0.0 } else { (imported - local) / local }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank_percentiles() {
        let mut samples: Vec<f64> = (1..=100).rev().map(f64::from).collect();
        let d = Distribution::from_samples(&mut samples).unwrap();
        assert_eq!((d.count, d.min, d.p50, d.p99, d.max), (100, 1.0, 50.0, 99.0, 100.0));
        assert!((d.mean - 50.5).abs() < 1e-12);
        let mut four = vec![4.0, 1.0, 3.0, 2.0];
        assert_eq!(Distribution::from_samples(&mut four).unwrap().p50, 2.0);
    }

    #[test]
    fn empty_and_nan_samples() {
        assert!(Distribution::from_samples(&mut Vec::new()).is_none());
        assert!(Distribution::from_samples(&mut vec![f64::NAN]).is_none());
        let d = Distribution::from_samples(&mut vec![f64::NAN, 7.0]).unwrap();
        assert_eq!((d.count, d.p99), (1, 7.0));
        assert_eq!(d.relative_spread(), 0.0);
    }

    #[test]
    fn spread_and_difference() {
        let d = Distribution::from_samples(&mut vec![9.0, 10.0, 11.0]).unwrap();
        assert!((d.relative_spread() - 0.2).abs() < 1e-12);
        assert!((relative_difference(10.0, 11.0) - 0.1).abs() < 1e-12);
        assert_eq!(relative_difference(0.0, 5.0), 0.0);
    }
}
