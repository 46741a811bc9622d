//! Runs: tensors of one element type, shape and strides whose first bytes lie a constant step apart in an arena.
//! One strided view of `(count, *shape)` with strides `(step, *strides)` holds a whole run, so a reader makes every
//! tensor of a run at once (the Python package: one `as_strided` and an `unbind(0)` in torch, `list()` of a NumPy
//! array), with no call per tensor: what makes reading a 19,000-tensor mixture of experts cheap.
//!
//! The owner lays an arena out so that an ordinary state_dict is a few dozen runs ([`group_alike`]: tensors grouped
//! by element type, shape and strides, in first-appearance order, each padded alike); [`find_runs`] finds the runs
//! of any manifest, other layouts included, which only make more, shorter runs.

use std::collections::HashMap;

use super::manifest::TensorEntry;
use ipc_core::wire::DType;

/// What makes tensors alike: element type, shape, explicit strides.
type Kind<'a> = (DType, &'a [u64], Option<&'a [u64]>);

/// The indices of `entries` grouped by element type, shape and strides: the groups in the order of their first
/// entry, each group's indices in increasing order.
pub(super) fn group_alike(entries: &[TensorEntry]) -> Vec<Vec<usize>> {
    let mut groups: Vec<Vec<usize>> = Vec::new();
    let mut group_of: HashMap<Kind<'_>, usize> = HashMap::new();
    for (i, e) in entries.iter().enumerate() {
        let g = *group_of.entry((e.desc.dtype(), e.desc.shape(), e.desc.strides())).or_insert_with(|| {
            groups.push(Vec::new());
            groups.len() - 1
        });
        groups[g].push(i);
    }
    groups
}

/// Tensors of one element type, shape and strides, `step` bytes apart: one strided view cuts them all.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Run {
    /// The element type.
    pub dtype: DType,
    /// The shape of each tensor.
    pub shape: Vec<u64>,
    /// The strides of each tensor, in elements.
    pub strides: Vec<u64>,
    /// The byte offset of the first tensor's first element from the arena's first byte.
    pub offset: u64,
    /// Bytes from one tensor's first element to the next one's (0 for a run of one tensor).
    pub step: u64,
    /// How many tensors.
    pub count: usize,
}

/// The runs of `entries` and, for each entry (manifest order), its place among the runs' tensors laid end to end
/// (the runs in order, each run's tensors in offset order).
///
/// Entries are grouped by element type, shape and strides (first appearance first); each group, in offset order,
/// is cut into maximal runs of a constant, non-zero step. Every entry is in exactly one run.
pub fn find_runs(entries: &[TensorEntry]) -> (Vec<Run>, Vec<usize>) {
    let mut runs = Vec::new();
    let mut order = vec![0; entries.len()];
    let mut placed = 0;
    for mut group in group_alike(entries) {
        // Already in offset order for the owner's layout (a stable sort of a sorted list is one pass).
        group.sort_by_key(|&i| entries[i].offset);
        let offset_at = |k: usize| entries[group[k]].offset;
        let mut k = 0;
        while k < group.len() {
            let offset = offset_at(k);
            let step = if k + 1 < group.len() { offset_at(k + 1) - offset } else { 0 };
            let mut end = k + 1;
            if step > 0 {
                while end < group.len() && offset_at(end) - offset_at(end - 1) == step {
                    end += 1;
                }
            }
            let first = &entries[group[k]].desc;
            runs.push(Run {
                dtype: first.dtype(),
                shape: first.shape().to_vec(),
                strides: first.strides_or_contiguous(),
                offset,
                step: if end - k > 1 { step } else { 0 },
                count: end - k,
            });
            for (n, &i) in group[k..end].iter().enumerate() {
                order[i] = placed + n;
            }
            placed += end - k;
            k = end;
        }
    }
    (runs, order)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use ipc_core::wire::TensorDesc;

    fn entry(name: &str, desc: TensorDesc, offset: u64) -> TensorEntry {
        TensorEntry { name: name.to_owned(), desc, offset, checksum: None }
    }

    fn f32s(shape: &[u64]) -> TensorDesc {
        TensorDesc::contiguous(DType::F32, shape.to_vec()).unwrap()
    }

    /// Where each entry's first element lies, as its run says: the run's offset plus its step times its place.
    fn offsets_from_runs(runs: &[Run], order: &[usize]) -> Vec<u64> {
        let mut laid = Vec::new();
        for run in runs {
            laid.extend((0..run.count as u64).map(|k| run.offset + k * run.step));
        }
        order.iter().map(|&p| laid[p]).collect()
    }

    #[test]
    fn interleaved_shapes_make_one_run_per_shape_and_keep_every_offset() {
        // Experts' gate, up and down, interleaved by name, laid out grouped (gate/up at 0.., down after them).
        let (gu, down) = (f32s(&[4, 8]), f32s(&[8, 4]));
        let mut entries = Vec::new();
        for e in 0..3u64 {
            entries.push(entry(&format!("e{e}.gate"), gu.clone(), 256 + 2 * e * 256));
            entries.push(entry(&format!("e{e}.up"), gu.clone(), 256 + (2 * e + 1) * 256));
            entries.push(entry(&format!("e{e}.down"), down.clone(), 256 + (6 + e) * 256));
        }
        let (runs, order) = find_runs(&entries);
        assert_eq!(runs.len(), 2);
        assert_eq!((runs[0].count, runs[0].step, runs[0].offset), (6, 256, 256));
        assert_eq!((runs[1].count, runs[1].step, runs[1].offset, runs[1].shape.clone()), (3, 256, 1792, vec![8, 4]));
        assert_eq!(runs[0].strides, vec![8, 1]);
        assert_eq!(offsets_from_runs(&runs, &order), entries.iter().map(|e| e.offset).collect::<Vec<_>>());
    }

    #[test]
    fn odd_entries_make_runs_of_one_and_every_entry_is_in_exactly_one_run() {
        let scalar = TensorDesc::contiguous(DType::I64, Vec::<u64>::new()).unwrap();
        let transposed = TensorDesc::strided(DType::F32, [3, 2], [1, 3]).unwrap();
        let half = TensorDesc::contiguous(DType::F16, [3]).unwrap();
        let entries = vec![
            entry("a", f32s(&[2]), 512),
            entry("scalar", scalar.clone(), 1024),
            entry("b", f32s(&[2]), 768),
            entry("t", transposed, 1280),
            entry("c", f32s(&[2]), 1536),   // breaks a's and b's step of 256
            entry("h", half.clone(), 1794), // an offset that is not a multiple of 256
            entry("scalar2", scalar, 2048),
            entry("h2", half, 2052),
        ];
        let (runs, order) = find_runs(&entries);
        let mut seen = order.clone();
        seen.sort_unstable();
        assert_eq!(seen, (0..entries.len()).collect::<Vec<_>>(), "a permutation");
        assert_eq!(runs.iter().map(|r| r.count).sum::<usize>(), entries.len());
        assert_eq!(offsets_from_runs(&runs, &order), entries.iter().map(|e| e.offset).collect::<Vec<_>>());
        let counts: Vec<usize> = runs.iter().map(|r| r.count).collect();
        assert_eq!(counts, [2, 1, 2, 1, 2], "a+b, c; the scalars; t; the halves");
        assert_eq!((runs[2].shape.clone(), runs[2].strides.clone(), runs[2].step), (vec![], vec![], 1024));
        assert_eq!((runs[3].strides.clone(), runs[4].step), (vec![1, 3], 258));
        assert!(runs.iter().filter(|r| r.count == 1).all(|r| r.step == 0));
    }

    #[test]
    fn entries_out_of_offset_order_and_shared_offsets_still_land_right() {
        let entries = vec![
            entry("z", f32s(&[4]), 1024),
            entry("y", f32s(&[4]), 512),
            entry("x", f32s(&[4]), 768),
            entry("alias", f32s(&[4]), 768), // another name for x's bytes: a step of 0 is no run
        ];
        let (runs, order) = find_runs(&entries);
        assert_eq!(offsets_from_runs(&runs, &order), vec![1024, 512, 768, 768]);
        assert!(runs.iter().all(|r| r.count == 1 || r.step > 0));
    }
}
