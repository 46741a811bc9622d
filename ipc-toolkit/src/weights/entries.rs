//! A manifest's entries decoded on several threads: a reader's cold open of an 18,771-tensor set spent 7.2-8.8 ms
//! of its 8.5-10.4 ms reading and checking the manifest on the H200's host (docs/weights.md, "Where a cold read
//! goes"), nearly all of it here. One quick pass finds where each entry starts (its length follows from its name
//! length, dimensions, flags and the header's checksum bit); then chunks of entries are decoded and checked by
//! [`read_entry`] at once, each from its own start, with every check and error exactly as one pass in order makes:
//! the first entry that is wrong is the one reported.

use super::manifest::{
    ENTRY_FIXED_BYTES, ENTRY_FLAG_STRIDES, MAX_TENSOR_NAME_BYTES, ManifestError, Reader, TensorEntry, read_entry,
};
use ipc_core::wire::MAX_TENSOR_DIMS;

/// Fewer entries than this are decoded on the calling thread alone (threads cost tens of microseconds to start).
const PARALLEL_FROM: u32 = 4096;
/// Threads at most.
const MAX_THREADS: usize = 8;

/// The `count` entries from `r`'s position, each checked as [`read_entry`] does; `r` ends after the last.
///
/// # Errors
/// The first entry's error, in entry order, as a decode in order reports it.
pub(super) fn read_entries(
    r: &mut Reader<'_>,
    count: u32,
    checksums: bool,
    start: u64,
    end: u64,
) -> Result<Vec<TensorEntry>, ManifestError> {
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get()).min(MAX_THREADS);
    if count < PARALLEL_FROM || threads < 2 {
        return (0..count).map(|index| read_entry(r, index, checksums, start, end)).collect();
    }
    let starts = entry_starts(r.bytes, r.at, count, checksums);
    let known = starts.len() - 1; // entries whose bounds are known; the last start is where entry `known` begins
    let per = known.div_ceil(threads).max(1);
    let chunks: Vec<Result<Vec<TensorEntry>, ManifestError>> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..known)
            .step_by(per)
            .map(|first| {
                let last = (first + per).min(known);
                let (bytes, at, to) = (r.bytes, starts[first], starts[last]);
                scope.spawn(move || {
                    let mut chunk = Reader { bytes, at };
                    let entries = (first..last)
                        .map(|i| read_entry(&mut chunk, i as u32, checksums, start, end))
                        .collect::<Result<Vec<_>, _>>()?;
                    // The lengths found by the first pass are read_entry's own; a difference would be a bug here,
                    // which the caller answers by decoding in order.
                    Ok(if chunk.at == to { entries } else { Vec::new() })
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap_or_else(|_| Ok(Vec::new()))).collect()
    });
    let mut entries = Vec::with_capacity(count as usize);
    for chunk in chunks {
        entries.extend(chunk?);
    }
    if entries.len() != known {
        // Not expected (see above): every entry again, in order, on this thread.
        return (0..count).map(|index| read_entry(r, index, checksums, start, end)).collect();
    }
    // The entries past the first whose shape the quick pass could not follow (a hostile or truncated manifest):
    // in order, so that the error is the one a decode in order reports.
    r.at = starts[known];
    for index in known as u32..count {
        entries.push(read_entry(r, index, checksums, start, end)?);
    }
    Ok(entries)
}

/// Where each entry starts, from `at`, for as long as each looks whole (dimensions, flags and name length in range,
/// its bytes there); then where the first that does not starts. Entry `i` lies in `starts[i]..starts[i + 1]`.
fn entry_starts(bytes: &[u8], mut at: usize, count: u32, checksums: bool) -> Vec<usize> {
    let mut starts = Vec::with_capacity(count as usize + 1);
    starts.push(at);
    for _ in 0..count {
        let Some(head) = bytes.get(at..at + 6) else { break };
        let name_len = usize::from(u16::from_le_bytes([head[0], head[1]]));
        let (ndim, flags) = (usize::from(head[4]), head[5]);
        if ndim > MAX_TENSOR_DIMS
            || flags & !ENTRY_FLAG_STRIDES != 0
            || !(1..=MAX_TENSOR_NAME_BYTES).contains(&name_len)
        {
            break;
        }
        let dims = if flags & ENTRY_FLAG_STRIDES != 0 { 2 * ndim } else { ndim };
        let len = ENTRY_FIXED_BYTES + 8 * dims + if checksums { 8 } else { 0 } + name_len;
        if at + len > bytes.len() {
            break;
        }
        at += len;
        starts.push(at);
    }
    starts
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::weights::manifest::{MANIFEST_HEADER_BYTES, Manifest, TENSOR_ALIGN};
    use gpu_ipc_driver::DeviceUuid;
    use ipc_core::wire::{DType, TensorDesc};

    /// A manifest of `count` entries, some strided, all with checksums, and where its entries start.
    fn manifest(count: u64) -> (Manifest, Vec<u8>, usize) {
        let start = 4 << 20;
        let entries = (0..count)
            .map(|i| TensorEntry {
                name: format!("model.layers.{}.mlp.experts.{}.w{}", i / 384, i % 128, i % 3),
                desc: if i % 5 == 0 {
                    TensorDesc::strided(DType::F32, [4, 3], [1, 4]).unwrap()
                } else {
                    TensorDesc::contiguous(DType::BF16, vec![2; (i % 4) as usize]).unwrap()
                },
                offset: start + i * TENSOR_ALIGN,
                checksum: Some(i.wrapping_mul(0x9e37_79b9)),
            })
            .collect();
        let m = Manifest {
            set_name: "moe".into(),
            generation: 3,
            device_uuid: DeviceUuid::default(),
            arena_bytes: start + (count + 1) * TENSOR_ALIGN,
            entries,
            parts: None,
        };
        let bytes = m.encode();
        (m, bytes, MANIFEST_HEADER_BYTES + 3)
    }

    /// Both decodes of the entries of `bytes` from `at`: on threads, and one by one in order.
    #[allow(clippy::type_complexity)]
    fn both(
        bytes: &[u8],
        at: usize,
        count: u32,
        end: u64,
    ) -> (Result<Vec<TensorEntry>, ManifestError>, Result<Vec<TensorEntry>, ManifestError>) {
        let start = 4 << 20;
        let threaded = read_entries(&mut Reader { bytes, at }, count, true, start, end);
        let mut r = Reader { bytes, at };
        let in_order = (0..count).map(|i| read_entry(&mut r, i, true, start, end)).collect();
        (threaded, in_order)
    }

    #[test]
    fn entries_decoded_on_threads_are_those_decoded_in_order() {
        let (m, bytes, at) = manifest(10_000);
        let (threaded, in_order) = both(&bytes, at, 10_000, m.arena_bytes);
        assert_eq!(threaded.unwrap(), m.entries);
        assert_eq!(in_order.unwrap(), m.entries);
        assert_eq!(Manifest::decode(&bytes, u64::MAX).unwrap(), m);
    }

    #[test]
    fn the_first_wrong_entry_is_the_one_reported_however_the_entries_were_split() {
        let (m, good, at) = manifest(10_000);
        let starts = entry_starts(&good, at, 10_000, true);
        assert_eq!(starts.len(), 10_001);
        let count = 10_000;
        let corrupt = |edits: &[(usize, usize, &[u8])]| {
            let mut b = good.clone();
            for &(entry, field, value) in edits {
                let p = starts[entry] + field;
                b[p..p + value.len()].copy_from_slice(value);
            }
            b
        };
        let cases: Vec<Vec<u8>> = vec![
            // Unknown element types in two chunks: the earlier one.
            corrupt(&[(7_000, 2, &999u16.to_le_bytes()), (9_000, 2, &998u16.to_le_bytes())]),
            // An entry the quick pass cannot follow (9 dimensions) after a wrong one.
            corrupt(&[(2_000, 2, &999u16.to_le_bytes()), (6_000, 4, &[9])]),
            // Only the one it cannot follow: decoded in order from there.
            corrupt(&[(6_000, 4, &[9])]),
            // An offset past the arena, a name that is not UTF-8, unknown entry flags, reserved bytes.
            corrupt(&[(5_555, 8, &u64::MAX.to_le_bytes())]),
            corrupt(&[(4_321, starts[4_322] - starts[4_321] - 1, &[0xff])]),
            corrupt(&[(9_999, 5, &[2])]),
            corrupt(&[(1, 6, &[1])]),
            // Truncated in the last entry.
            good[..good.len() - 3].to_vec(),
        ];
        for (k, bytes) in cases.iter().enumerate() {
            let (threaded, in_order) = both(bytes, at, count, m.arena_bytes);
            assert!(in_order.is_err(), "case {k}");
            assert_eq!(threaded.unwrap_err(), in_order.unwrap_err(), "case {k}");
        }
    }
}
