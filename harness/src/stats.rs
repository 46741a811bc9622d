//! Distributions of measured samples, the one statistics type of the measurement tooling: what every probe cell
//! reports (count, p50, p99, max) and what the criterion benches report per operation (with p99.9).

use serde::{Deserialize, Serialize};

/// A summary of samples: how many, and where they lie. Percentiles use the nearest-rank method on the sorted
/// samples (p50 of `[1, 2, 3, 4]` is 2), so every reported value is a value that was measured.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(from = "RecordedDistribution")]
pub struct Distribution {
    /// Number of samples.
    pub count: u64,
    /// Smallest sample.
    pub min: f64,
    /// Median (nearest rank).
    pub p50: f64,
    /// 99th percentile (nearest rank).
    pub p99: f64,
    /// 99.9th percentile (nearest rank). `None` only for a record written before it was kept that summarises 1,000
    /// samples or more (below 1,000 samples the nearest-rank p99.9 is the largest sample, so it is read as that).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub p999: Option<f64>,
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
            p50: quantile_sorted(samples, 0.50),
            p99: quantile_sorted(samples, 0.99),
            p999: Some(quantile_sorted(samples, 0.999)),
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

/// A [`Distribution`] as recorded, perhaps without `p999`.
#[derive(Deserialize)]
struct RecordedDistribution {
    count: u64,
    min: f64,
    p50: f64,
    p99: f64,
    #[serde(default)]
    p999: Option<f64>,
    max: f64,
    mean: f64,
}

impl From<RecordedDistribution> for Distribution {
    fn from(r: RecordedDistribution) -> Self {
        // Nearest rank: ceil(0.999 n) = n below 1,000 samples, so the p99.9 of such a record is its largest sample.
        let p999 = r.p999.or((r.count < 1000).then_some(r.max));
        Self { count: r.count, min: r.min, p50: r.p50, p99: r.p99, p999, max: r.max, mean: r.mean }
    }
}

/// The nearest-rank `q` quantile (0 < q <= 1) of sorted, non-empty `sorted`: the smallest sample with at least
/// `q` of the samples at or below it.
pub fn quantile_sorted(sorted: &[f64], q: f64) -> f64 {
    debug_assert!(!sorted.is_empty());
    let n = sorted.len();
    let rank = (q * n as f64).ceil() as usize;
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
    fn percentiles_of_one_to_a_thousand() {
        let mut samples: Vec<f64> = (1..=1000).rev().map(f64::from).collect();
        let d = Distribution::from_samples(&mut samples).unwrap();
        assert_eq!(d.count, 1000);
        assert_eq!((d.min, d.p50, d.p99, d.p999, d.max), (1.0, 500.0, 990.0, Some(999.0), 1000.0));
        assert!((d.mean - 500.5).abs() < 1e-9);
    }

    #[test]
    fn one_slow_sample_in_a_hundred_shows_at_p99_only_when_there_are_more() {
        let mut samples = vec![1.0; 99];
        samples.push(50.0);
        let d = Distribution::from_samples(&mut samples).unwrap();
        assert_eq!((d.p50, d.p99, d.p999, d.max), (1.0, 1.0, Some(50.0), 50.0));
        let mut samples = vec![1.0; 98];
        samples.extend([50.0, 60.0]);
        assert_eq!(Distribution::from_samples(&mut samples).unwrap().p99, 50.0);
    }

    #[test]
    fn a_record_without_p999_loads_with_the_value_its_samples_had() {
        let old = r#"{"count":3,"min":1.0,"p50":2.0,"p99":3.0,"max":3.0,"mean":2.0}"#;
        let d: Distribution = serde_json::from_str(old).unwrap();
        assert_eq!(d, Distribution::from_samples(&mut vec![2.0, 1.0, 3.0]).unwrap());
        let many = r#"{"count":1000,"min":1.0,"p50":500.0,"p99":990.0,"max":1000.0,"mean":500.5}"#;
        let d: Distribution = serde_json::from_str(many).unwrap();
        assert_eq!(d.p999, None);
        assert!(!serde_json::to_string(&d).unwrap().contains("p999"));
        let fresh = Distribution::from_samples(&mut (1..=1000).map(f64::from).collect()).unwrap();
        let back: Distribution = serde_json::from_str(&serde_json::to_string(&fresh).unwrap()).unwrap();
        assert_eq!(back, fresh);
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
