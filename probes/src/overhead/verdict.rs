//! The overhead probe's comparisons and verdict: local against imported memory, metric by metric.

use super::model::{Comparison, KindResults, MIB, Measured, MemoryKind, Results, human};

use harness::Verdict;
use harness::stats::relative_difference;

/// Local against imported, per metric: bandwidth at the largest size, latency at each working set, stores.
pub fn compare(kinds: &[KindResults]) -> Vec<Comparison> {
    let mut out = Vec::new();
    for imported in kinds {
        let Some(base_kind) = imported.kind.baseline() else { continue };
        let Some(local) = kinds.iter().find(|k| k.kind == base_kind) else { continue };
        let mut push = |metric: String, l: &Measured, i: &Measured| {
            let noise = l.summary.relative_spread().max(i.summary.relative_spread());
            let difference = relative_difference(l.summary.p50, i.summary.p50);
            out.push(Comparison {
                metric,
                local: local.kind,
                imported: imported.kind,
                local_value: l.summary.p50,
                imported_value: i.summary.p50,
                difference,
                noise,
                measurable: is_finding(difference, noise),
            });
        };
        for (l, i) in local.bandwidth.iter().zip(&imported.bandwidth) {
            if l.bytes == i.bytes && l.bytes >= 64 * MIB {
                push(format!("read GB/s at {}", human(l.bytes)), &l.read_gbps, &i.read_gbps);
                push(format!("write GB/s at {}", human(l.bytes)), &l.write_gbps, &i.write_gbps);
            }
        }
        for (l, i) in local.latency.iter().zip(&imported.latency) {
            if l.bytes == i.bytes {
                push(format!("load ns, {} ({})", human(l.bytes), l.level), &l.load_ns, &i.load_ns);
            }
        }
        push("store+fence ns".to_owned(), &local.store_ns, &imported.store_ns);
    }
    out
}

/// How many times the run-to-run spread a difference must exceed to count.
pub const NOISE_MULTIPLE: f64 = 2.0;
/// The smallest relative difference that counts, however quiet the runs: below it a difference is too small to
/// matter to anyone choosing between own and imported memory, and a quick pass's few runs understate the spread.
pub const MIN_EFFECT: f64 = 0.02;
/// The rule of [`is_finding`], in the words the report uses.
pub const FINDING_RULE: &str = "a difference counts only when it is beyond twice the run-to-run spread and at least 2% (the same rule for \
     every metric and pass)";

/// Whether a relative `difference` with run-to-run spread `noise` is a finding: beyond [`NOISE_MULTIPLE`] times the
/// spread AND at least [`MIN_EFFECT`]. A difference just above the spread is what two equal memories give in one run
/// of many metrics (the quick report once called +0.4% with a 0.4% spread "measurably slower").
pub fn is_finding(difference: f64, noise: f64) -> bool {
    let size = difference.abs();
    size > NOISE_MULTIPLE * noise && size >= MIN_EFFECT
}

impl Comparison {
    /// Whether this comparison is a finding by [`is_finding`], judged afresh (recorded results carry the
    /// `measurable` of the version that wrote them).
    pub fn is_finding(&self) -> bool {
        is_finding(self.difference, self.noise)
    }

    /// Whether the imported memory did worse: less bandwidth, or more latency.
    pub fn imported_is_worse(&self) -> bool {
        if self.metric.contains("GB/s") { self.difference < 0.0 } else { self.difference > 0.0 }
    }
}

/// The answer: for same-GPU imports, whether any metric was measurably worse than on local memory (a finding by
/// [`is_finding`]: beyond twice the run-to-run spread and at least 2%), in which direction the measurable differences went, and the largest difference with its
/// noise band. Peer-GPU memory is left out (it is another GPU's memory, not an IPC cost).
pub fn verdict(results: &Results) -> Verdict {
    let same_gpu: Vec<&Comparison> =
        results.comparisons.iter().filter(|c| c.imported != MemoryKind::PeerImported).collect();
    let largest = same_gpu.iter().max_by(|a, b| a.difference.abs().total_cmp(&b.difference.abs()));
    let mut worse: Vec<&&Comparison> = same_gpu.iter().filter(|c| c.is_finding() && c.imported_is_worse()).collect();
    worse.sort_by(|a, b| b.difference.abs().total_cmp(&a.difference.abs()));
    let better: Vec<&&Comparison> = same_gpu.iter().filter(|c| c.is_finding() && !c.imported_is_worse()).collect();
    let describe = |c: &Comparison| {
        format!("{} {} {:+.1}% (noise {:.1}%)", c.imported.label(), c.metric, 100.0 * c.difference, 100.0 * c.noise)
    };
    let answer = if largest.is_none() {
        "Not measured: no imported memory kind ran.".to_owned()
    } else if !worse.is_empty() {
        let list: Vec<String> = worse.iter().take(3).map(|c| describe(c)).collect();
        format!(
            "Imported memory was measurably slower on {} of {} metrics: {} ({FINDING_RULE}).",
            worse.len(),
            same_gpu.len(),
            list.join("; ")
        )
    } else if better.is_empty() {
        format!(
            "No: over {} metrics (bandwidth 64 MiB-1 GiB, load latency in L1, L2 and DRAM, store latency), kernels on \
             memory imported from another process (legacy and VMM) ran within the run-to-run spread of the same \
             kernels on the process's own memory ({FINDING_RULE}).",
            same_gpu.len()
        )
    } else {
        let list: Vec<String> = better.iter().take(2).map(|c| describe(c)).collect();
        format!(
            "No: over {} metrics (bandwidth 64 MiB-1 GiB, load latency in L1, L2 and DRAM, store latency) imported \
             memory (legacy and VMM) was never measurably slower than the process's own; the {} difference(s) that \
             count favoured imported memory and are small ({}; {FINDING_RULE}).",
            same_gpu.len(),
            better.len(),
            list.join("; ")
        )
    };
    let key_figure = largest.map_or_else(
        || "-".to_owned(),
        |c| {
            format!(
                "largest difference: {} {} {:+.2}% ({:.4} vs {:.4}), noise band {:.2}%",
                c.imported.label(),
                c.metric,
                100.0 * c.difference,
                c.imported_value,
                c.local_value,
                100.0 * c.noise
            )
        },
    );
    Verdict { answer, key_figure }
}
