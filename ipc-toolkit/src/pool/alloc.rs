//! The owner's sub-allocator for one block: best fit over the free ranges, with alignment, coalescing on free.
//!
//! The free ranges are kept twice, by start (to coalesce a freed range with its neighbours) and by (length, start)
//! (to find the smallest range that fits): both `O(log n)`. The search for a fitting range with alignment looks at
//! ranges from the request's length upwards and stops at the first one that holds the aligned request; any range at
//! least `len + align - 1` long holds it, so the search never passes more ranges than lie between those two lengths.

use std::collections::{BTreeMap, BTreeSet};

/// One block's free and used bytes, as [`RangeAllocator::usage`] reports them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct RangeUsage {
    /// Bytes the block has.
    pub(crate) capacity: u64,
    /// Bytes handed out and not given back.
    pub(crate) in_use: u64,
    /// Most bytes ever in use at once.
    pub(crate) peak_in_use: u64,
    /// Free bytes (`capacity - in_use`).
    pub(crate) free: u64,
    /// The longest free range.
    pub(crate) largest_free: u64,
    /// How many free ranges there are.
    pub(crate) free_ranges: u64,
}

/// Best-fit allocator of ranges of `0..capacity`.
#[derive(Debug)]
pub(crate) struct RangeAllocator {
    capacity: u64,
    by_start: BTreeMap<u64, u64>,
    by_size: BTreeSet<(u64, u64)>,
    in_use: u64,
    peak_in_use: u64,
}

impl RangeAllocator {
    /// All of `0..capacity` free.
    pub(crate) fn new(capacity: u64) -> Self {
        let mut allocator =
            Self { capacity, by_start: BTreeMap::new(), by_size: BTreeSet::new(), in_use: 0, peak_in_use: 0 };
        if capacity > 0 {
            allocator.insert_free(0, capacity);
        }
        allocator
    }

    /// The start of a free range of `len` bytes (`len > 0`) aligned to `align` (a power of two), now in use; `None`
    /// when no free range holds it.
    pub(crate) fn allocate(&mut self, len: u64, align: u64) -> Option<u64> {
        if len == 0 || !align.is_power_of_two() {
            return None;
        }
        let (size, start, aligned) = self.by_size.range((len, 0)..).find_map(|&(size, start)| {
            let aligned = start.checked_next_multiple_of(align)?;
            let end = aligned.checked_add(len)?;
            (end <= start + size).then_some((size, start, aligned))
        })?;
        self.remove_free(start, size);
        if aligned > start {
            self.insert_free(start, aligned - start);
        }
        let tail = start + size - (aligned + len);
        if tail > 0 {
            self.insert_free(aligned + len, tail);
        }
        self.in_use += len;
        self.peak_in_use = self.peak_in_use.max(self.in_use);
        Some(aligned)
    }

    /// Gives back `len` bytes at `start`, which [`allocate`](Self::allocate) handed out, merging them with free
    /// neighbours. Returns false (and changes nothing) for a range that is out of bounds or overlaps free bytes:
    /// a double free, which the pool's bookkeeping never makes.
    pub(crate) fn free(&mut self, start: u64, len: u64) -> bool {
        let Some(end) = start.checked_add(len).filter(|end| len > 0 && *end <= self.capacity) else {
            return false;
        };
        let before = self.by_start.range(..end).next_back().map(|(&s, &l)| (s, l));
        if before.is_some_and(|(s, l)| s + l > start) {
            return false;
        }
        let (mut merged_start, mut merged_len) = (start, len);
        if let Some((s, l)) = before.filter(|(s, l)| s + l == start) {
            self.remove_free(s, l);
            merged_start = s;
            merged_len += l;
        }
        if let Some(l) = self.by_start.get(&end).copied() {
            self.remove_free(end, l);
            merged_len += l;
        }
        self.insert_free(merged_start, merged_len);
        self.in_use -= len;
        true
    }

    /// Free and used bytes now.
    pub(crate) fn usage(&self) -> RangeUsage {
        RangeUsage {
            capacity: self.capacity,
            in_use: self.in_use,
            peak_in_use: self.peak_in_use,
            free: self.capacity - self.in_use,
            largest_free: self.by_size.last().map_or(0, |&(size, _)| size),
            free_ranges: self.by_start.len() as u64,
        }
    }

    /// The free ranges, by start (for tests and for the stats' invariants).
    #[cfg(test)]
    pub(crate) fn free_ranges(&self) -> Vec<(u64, u64)> {
        self.by_start.iter().map(|(&s, &l)| (s, l)).collect()
    }

    fn insert_free(&mut self, start: u64, len: u64) {
        self.by_start.insert(start, len);
        self.by_size.insert((len, start));
    }

    fn remove_free(&mut self, start: u64, len: u64) {
        self.by_start.remove(&start);
        self.by_size.remove(&(len, start));
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn best_fit_takes_the_smallest_hole_and_free_coalesces_both_sides() {
        let mut a = RangeAllocator::new(1000);
        let x = a.allocate(100, 1).unwrap();
        let y = a.allocate(50, 1).unwrap();
        let z = a.allocate(200, 1).unwrap();
        let w = a.allocate(30, 1).unwrap();
        assert_eq!((x, y, z, w), (0, 100, 150, 350));
        assert!(a.free(x, 100) && a.free(z, 200));
        // Holes of 100 at 0 and 200 at 150, and the 620-byte tail at 380: 90 bytes go to the 100-byte hole.
        assert_eq!(a.allocate(90, 1), Some(0));
        assert_eq!(a.allocate(150, 1), Some(150));
        assert!(a.free(0, 90) && a.free(100, 50) && a.free(150, 150) && a.free(350, 30));
        assert_eq!(a.free_ranges(), vec![(0, 1000)], "everything merged back");
        assert_eq!(a.usage().peak_in_use, 380);
    }

    #[test]
    fn alignment_pads_and_the_padding_stays_free() {
        let mut a = RangeAllocator::new(4096);
        assert_eq!(a.allocate(10, 1), Some(0));
        assert_eq!(a.allocate(100, 256), Some(256));
        assert_eq!(a.free_ranges(), vec![(10, 246), (356, 3740)]);
        assert_eq!(a.allocate(200, 8), Some(16), "the 246-byte gap holds 200 bytes at 16");
        assert_eq!(a.allocate(4000, 1), None);
        assert_eq!(a.allocate(0, 1), None);
        assert_eq!(a.allocate(8, 3), None, "alignment must be a power of two");
    }

    #[test]
    fn a_double_free_or_a_range_out_of_bounds_is_refused_and_changes_nothing() {
        let mut a = RangeAllocator::new(100);
        let x = a.allocate(40, 1).unwrap();
        assert!(a.free(x, 40));
        let before = a.free_ranges();
        assert!(!a.free(x, 40));
        assert!(!a.free(90, 20));
        assert!(!a.free(u64::MAX, 2));
        assert_eq!(a.free_ranges(), before);
        assert_eq!(a.usage().in_use, 0);
    }

    #[derive(Debug, Clone)]
    enum Op {
        Alloc { len: u64, align_log2: u32 },
        Free { pick: usize },
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            3 => (1u64..5000, 0u32..12).prop_map(|(len, align_log2)| Op::Alloc { len, align_log2 }),
            2 => any::<usize>().prop_map(|pick| Op::Free { pick }),
        ]
    }

    /// Everything the allocator promises, checked against the live set kept beside it.
    fn check(a: &RangeAllocator, live: &[(u64, u64, u64)]) -> Result<(), TestCaseError> {
        let usage = a.usage();
        let mut sorted: Vec<_> = live.to_vec();
        sorted.sort_unstable();
        for pair in sorted.windows(2) {
            prop_assert!(pair[0].0 + pair[0].1 <= pair[1].0, "live ranges overlap: {pair:?}");
        }
        for &(start, len, align) in live {
            prop_assert!(start + len <= usage.capacity, "out of bounds: {start}+{len}");
            prop_assert_eq!(start % align, 0, "misaligned");
        }
        let free = a.free_ranges();
        for pair in free.windows(2) {
            prop_assert!(pair[0].0 + pair[0].1 < pair[1].0, "free ranges overlap or touch (not coalesced): {:?}", pair);
        }
        for &(fs, fl) in &free {
            for &(ls, ll, _) in live {
                prop_assert!(fs + fl <= ls || ls + ll <= fs, "free {fs}+{fl} overlaps live {ls}+{ll}");
            }
        }
        let live_bytes: u64 = live.iter().map(|l| l.1).sum();
        let free_bytes: u64 = free.iter().map(|f| f.1).sum();
        prop_assert_eq!(usage.in_use, live_bytes);
        prop_assert_eq!(usage.free, free_bytes);
        prop_assert_eq!(live_bytes + free_bytes, usage.capacity, "bytes lost or counted twice");
        prop_assert_eq!(usage.largest_free, free.iter().map(|f| f.1).max().unwrap_or(0));
        prop_assert_eq!(usage.free_ranges, free.len() as u64);
        prop_assert!(usage.peak_in_use >= usage.in_use);
        Ok(())
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

        #[test]
        fn no_overlap_in_bounds_aligned_coalesced_and_consistent(
            capacity in 1u64..200_000,
            ops in proptest::collection::vec(op(), 1..400),
        ) {
            let mut a = RangeAllocator::new(capacity);
            let mut live: Vec<(u64, u64, u64)> = Vec::new();
            let mut peak = 0;
            for op in ops {
                match op {
                    Op::Alloc { len, align_log2 } => {
                        let align = 1u64 << align_log2;
                        let free_before = a.free_ranges();
                        match a.allocate(len, align) {
                            Some(start) => live.push((start, len, align)),
                            None => {
                                // Refused only when no free range holds it.
                                for (s, l) in free_before {
                                    let aligned = s.next_multiple_of(align);
                                    prop_assert!(aligned + len > s + l, "refused {len}@{align} though {s}+{l} holds it");
                                }
                            }
                        }
                    }
                    Op::Free { pick } if !live.is_empty() => {
                        let (start, len, _) = live.swap_remove(pick % live.len());
                        prop_assert!(a.free(start, len));
                    }
                    Op::Free { .. } => {}
                }
                peak = peak.max(live.iter().map(|l| l.1).sum::<u64>());
                check(&a, &live)?;
            }
            prop_assert_eq!(a.usage().peak_in_use, peak);
            for (start, len, _) in live.drain(..) {
                prop_assert!(a.free(start, len));
            }
            prop_assert_eq!(a.free_ranges(), vec![(0, capacity)]);
        }
    }
}
