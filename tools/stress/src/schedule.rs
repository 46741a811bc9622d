//! What runs when: the kill matrix's cells and each trial's random kill point, from a seed (so a failing trial
//! can be replayed with `--seed`), and the sizes of a full and a `--quick` run.

use gpu_ipc::core::wire::SyncStrategy;
use serde::Serialize;

/// Backends the harness drives, as the example programs spell them.
pub const BACKENDS: [&str; 2] = ["legacy", "vmm"];
/// Sync strategies, as the example programs spell them: those that run without MPS (`mps: false`) or only under it
/// (`mps: true`), as the strategy's descriptor says.
pub fn strategies(mps: bool) -> impl Iterator<Item = &'static str> {
    SyncStrategy::ALL.into_iter().filter(move |s| s.traits().needs_mps == mps).map(SyncStrategy::name)
}

/// A small, seedable generator (SplitMix64): reproducible kill points without a dependency.
#[derive(Debug, Clone)]
pub struct SplitMix(u64);

impl SplitMix {
    /// A generator starting at `seed`.
    pub fn new(seed: u64) -> Self {
        Self(seed)
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in `lo..=hi` (`lo` when `hi < lo`).
    pub fn range(&mut self, lo: u64, hi: u64) -> u64 {
        if hi <= lo { lo } else { lo + self.next_u64() % (hi - lo + 1) }
    }
}

/// Which process of a trial is killed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Victim {
    /// The producer: every consumer must end with `ProducerGone` within the bound.
    Producer,
    /// The first consumer: the producer must serve the other one to the end, intact.
    Consumer,
}

impl Victim {
    /// Its name in tables.
    pub fn name(self) -> &'static str {
        match self {
            Self::Producer => "producer",
            Self::Consumer => "consumer",
        }
    }
}

/// One cell of the kill matrix.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Cell {
    /// `legacy` or `vmm`.
    pub backend: &'static str,
    /// A sync strategy's flag name.
    pub sync: &'static str,
    /// Who dies.
    pub victim: Victim,
}

impl Cell {
    /// `backend/sync/victim`.
    pub fn name(&self) -> String {
        format!("{}/{}/{}", self.backend, self.sync, self.victim.name())
    }
}

/// One kill: when it happens, as the victim's progress (frames it reported) plus a random delay after that
/// report, so the signal lands at any point of the frame loop (CPU wait, kernel in flight, release).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct KillPoint {
    /// The victim reports this many frames done, then ...
    pub after_frames: u64,
    /// ... this many microseconds later it is killed.
    pub extra_delay_us: u64,
}

/// Sizes of a run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Sizes {
    /// Kills per matrix cell.
    pub kills_per_cell: u32,
    /// Frames per kill trial (the producer's `--frames`).
    pub kill_frames: u64,
    /// The victims report progress every this many frames.
    pub progress_every: u64,
    /// Attach-read-detach cycles per cycles run.
    pub cycles: u64,
    /// Frames read per cycle.
    pub frames_per_cycle: u64,
    /// Rapid connect/close clients of the hostile run.
    pub rapid_connects: u32,
    /// Idle connections held open at once.
    pub idle_connections: u32,
    /// Abandoned handshakes (hello, offer received, hang-up): more than the 16 consumer records.
    pub abandoned_handshakes: u32,
    /// Frames of the eviction run.
    pub evict_frames: u64,
}

impl Sizes {
    /// The issues' sizes: 10 kills per cell, 1,000 cycles, 1,000 rapid connects, 200 idle, 20 abandoned.
    pub const FULL: Sizes = Sizes {
        kills_per_cell: 10,
        kill_frames: 2_000,
        progress_every: 50,
        cycles: 1_000,
        frames_per_cycle: 4,
        rapid_connects: 1_000,
        idle_connections: 200,
        abandoned_handshakes: 20,
        evict_frames: 3_000,
    };
    /// `--quick`: a few kills per cell and fewer cycles; the hostile run keeps the counts (it is short).
    pub const QUICK: Sizes = Sizes { kills_per_cell: 3, cycles: 200, ..Sizes::FULL };
}

/// The kill matrix: every backend x strategy x victim (filtered by `backends`), in that order; under MPS also
/// `gpu-poll`, last for each backend.
pub fn cells(backends: &[&'static str], mps: bool) -> Vec<Cell> {
    let mut cells = Vec::new();
    for backend in BACKENDS.iter().filter(|b| backends.contains(b)) {
        // The strategies that run only under MPS (a polling kernel) are in the kill matrix of the MPS pass only.
        for sync in strategies(false).chain(strategies(true).filter(|_| mps)) {
            for victim in [Victim::Producer, Victim::Consumer] {
                cells.push(Cell { backend, sync, victim });
            }
        }
    }
    cells
}

/// `count` kill points for a run of `frames` frames: a multiple of `progress_every` from the first report to
/// half the run (so the run is still going when the kill lands), plus 0 to 3 ms.
pub fn kill_points(rng: &mut SplitMix, count: u32, frames: u64, progress_every: u64) -> Vec<KillPoint> {
    let every = progress_every.max(1);
    let last = (frames / 2 / every).max(1);
    (0..count)
        .map(|_| KillPoint { after_frames: rng.range(1, last) * every, extra_delay_us: rng.range(0, 3_000) })
        .collect()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn the_matrix_is_backend_by_strategy_by_victim() {
        let all = cells(&BACKENDS, false);
        assert_eq!(all.len(), 16);
        assert_eq!(all[0].name(), "legacy/cpu-spin/producer");
        assert_eq!(all[15].name(), "vmm/gpu-stream-ops/consumer");
        assert!(cells(&["vmm"], false).iter().all(|c| c.backend == "vmm"));
        assert_eq!(cells(&["vmm"], false).len(), 8);
        // Under MPS the polling-kernel strategy too, after the others of each backend.
        let mps = cells(&BACKENDS, true);
        assert_eq!(mps.len(), 20);
        assert_eq!(mps[8].name(), "legacy/gpu-poll/producer");
        assert_eq!(mps[19].name(), "vmm/gpu-poll/consumer");
    }

    #[test]
    fn kill_points_land_in_the_first_half_on_progress_reports_and_replay_from_the_seed() {
        let points = kill_points(&mut SplitMix::new(7), 500, 2_000, 50);
        assert_eq!(points.len(), 500);
        for p in &points {
            assert!((50..=1_000).contains(&p.after_frames), "{p:?}");
            assert_eq!(p.after_frames % 50, 0);
            assert!(p.extra_delay_us <= 3_000);
        }
        // Random, not constant: many distinct points.
        let distinct: std::collections::BTreeSet<u64> = points.iter().map(|p| p.after_frames).collect();
        assert!(distinct.len() > 10);
        assert_eq!(points, kill_points(&mut SplitMix::new(7), 500, 2_000, 50));
        assert_ne!(points, kill_points(&mut SplitMix::new(8), 500, 2_000, 50));
    }

    #[test]
    fn a_tiny_run_still_gets_a_kill_point() {
        let p = kill_points(&mut SplitMix::new(1), 1, 10, 50);
        assert_eq!(p[0].after_frames, 50);
    }

    #[test]
    fn range_is_inclusive_and_degenerate_ranges_give_lo() {
        let mut rng = SplitMix::new(3);
        let seen: std::collections::BTreeSet<u64> = (0..200).map(|_| rng.range(2, 4)).collect();
        assert_eq!(seen.into_iter().collect::<Vec<_>>(), vec![2, 3, 4]);
        assert_eq!(rng.range(5, 5), 5);
        assert_eq!(rng.range(9, 1), 9);
    }

    #[test]
    fn quick_is_smaller_but_keeps_the_hostile_counts() {
        const {
            assert!(Sizes::QUICK.kills_per_cell < Sizes::FULL.kills_per_cell);
            assert!(Sizes::FULL.kills_per_cell >= 10);
            assert!(Sizes::FULL.abandoned_handshakes > 16);
        }
        assert_eq!(Sizes::FULL.cycles, 1_000);
        assert_eq!(Sizes::QUICK.rapid_connects, 1_000);
    }
}
