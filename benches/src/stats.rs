//! Order statistics of timed samples: what the benches report besides criterion's own estimates (per-operation
//! percentiles of round trips timed one by one).

use serde::{Deserialize, Serialize};

/// Summary of a set of samples (nanoseconds, or whatever unit the samples are in).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Distribution {
    /// Number of samples.
    pub count: usize,
    /// Smallest sample.
    pub min: f64,
    /// Median (nearest rank).
    pub p50: f64,
    /// 99th percentile (nearest rank).
    pub p99: f64,
    /// 99.9th percentile (nearest rank).
    pub p999: f64,
    /// Largest sample.
    pub max: f64,
    /// Arithmetic mean.
    pub mean: f64,
}

impl Distribution {
    /// Summarises `samples`, ignoring NaNs; `None` when no sample is left. Sorts `samples` in place.
    pub fn from_samples(samples: &mut Vec<f64>) -> Option<Self> {
        samples.retain(|s| !s.is_nan());
        if samples.is_empty() {
            return None;
        }
        samples.sort_by(f64::total_cmp);
        let count = samples.len();
        Some(Self {
            count,
            min: samples[0],
            p50: nearest_rank(samples, 0.50),
            p99: nearest_rank(samples, 0.99),
            p999: nearest_rank(samples, 0.999),
            max: samples[count - 1],
            mean: samples.iter().sum::<f64>() / count as f64,
        })
    }
}

/// The nearest-rank `q` quantile (0 < q <= 1) of `sorted` (ascending, not empty): the smallest sample with at
/// least `q` of the samples at or below it.
pub fn nearest_rank(sorted: &[f64], q: f64) -> f64 {
    let n = sorted.len();
    let rank = (q * n as f64).ceil() as usize;
    sorted[rank.clamp(1, n) - 1]
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_of_one_to_a_thousand() {
        let mut samples: Vec<f64> = (1..=1000).rev().map(f64::from).collect();
        let d = Distribution::from_samples(&mut samples).unwrap();
        assert_eq!(d.count, 1000);
        assert_eq!((d.min, d.p50, d.p99, d.p999, d.max), (1.0, 500.0, 990.0, 999.0, 1000.0));
        assert!((d.mean - 500.5).abs() < 1e-9);
    }

    #[test]
    fn one_slow_sample_in_a_hundred_shows_at_p99_only_when_there_are_more() {
        let mut samples = vec![1.0; 99];
        samples.push(50.0);
        let d = Distribution::from_samples(&mut samples).unwrap();
        assert_eq!((d.p50, d.p99, d.p999, d.max), (1.0, 1.0, 50.0, 50.0));
        let mut samples = vec![1.0; 98];
        samples.extend([50.0, 60.0]);
        assert_eq!(Distribution::from_samples(&mut samples).unwrap().p99, 50.0);
    }

    #[test]
    fn nans_are_dropped_and_nothing_gives_none() {
        let mut samples = vec![f64::NAN, 3.0, f64::NAN];
        let d = Distribution::from_samples(&mut samples).unwrap();
        assert_eq!((d.count, d.p50, d.max), (1, 3.0, 3.0));
        assert!(Distribution::from_samples(&mut vec![f64::NAN]).is_none());
        assert!(Distribution::from_samples(&mut Vec::new()).is_none());
    }
}
