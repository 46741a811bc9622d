//! The frame check pattern on the host: the reference the kernels `gpu_ipc_fill_pattern` and
//! `gpu_ipc_verify_pattern` (`kernels/cuda/pattern.cu`) must match bit for bit.
//!
//! Word `index` of the frame with sequence `seq` holds [`pattern_word`]`(seq, index)`:
//!
//! ```text
//! x = (index as u32) * 0x9E3779B1 ^ (seq as u32) * 0x85EBCA6B ^ 0xA5A5A5A5   (wrapping u32 products)
//! pattern = x ^ (x >> 16)
//! ```
//!
//! Each step is a bijection of `u32`, which gives the two properties the checks rely on: within a frame of fewer
//! than 2^32 words no two words are equal (so neighbours differ, and a shifted copy is caught), and for one
//! index two sequences closer than 2^32 give different words (so every word of a stale or torn frame is caught).
//! Only the low 32 bits of `seq` take part: a 32-bit word cannot tell more than 2^32 sequences apart, and mixing
//! in `seq >> 32` would make some pair of sequences across a 2^32 boundary equal in every word.

const INDEX_MUL: u32 = 0x9E37_79B1;
const SEQ_MUL: u32 = 0x85EB_CA6B;
const SALT: u32 = 0xA5A5_A5A5;

/// The value word `index` of the frame with sequence `seq` holds.
///
/// ```
/// use gpu_ipc_kernels::pattern::pattern_word;
/// assert_eq!(pattern_word(0, 0), 0xA5A5_0000);
/// assert_ne!(pattern_word(7, 100), pattern_word(8, 100));
/// ```
#[inline]
pub const fn pattern_word(seq: u64, index: u64) -> u32 {
    // Truncation is the definition: both operands enter the hash modulo 2^32.
    let x = (index as u32).wrapping_mul(INDEX_MUL) ^ (seq as u32).wrapping_mul(SEQ_MUL) ^ SALT;
    x ^ (x >> 16)
}

/// Fills `words` as `gpu_ipc_fill_pattern` fills a frame: `words[i] = pattern_word(seq, i)`.
pub fn fill_pattern_host(words: &mut [u32], seq: u64) {
    for (index, word) in (0u64..).zip(words.iter_mut()) {
        *word = pattern_word(seq, index);
    }
}

/// Counts the words of `words` that differ from the pattern of `seq`, as `gpu_ipc_verify_pattern` does.
pub fn count_mismatches_host(words: &[u32], seq: u64) -> u64 {
    (0u64..).zip(words).map(|(index, &word)| u64::from(word != pattern_word(seq, index))).sum()
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    /// The same vectors as the comment at the top of `kernels/cuda/pattern.cu`.
    #[test]
    fn known_vectors() {
        let vectors: [(u64, u64, u32); 9] = [
            (0, 0, 0xA5A5_0000),
            (0, 1, 0x3B92_E786),
            (1, 0, 0x204E_4F80),
            (1, 1, 0xBE79_A806),
            (0xFFFF_FFFF, 7, 0x8C35_4FD2),
            (0x1_0000_0000, 7, 0xF621_0053),
            (0x1234_5678_9ABC_DEF0, 0xBC_614E, 0x3970_366B),
            (0x2A, 0xFFFF_FFFF, 0x3CC2_2AA6),
            (0x2A, 0x1_0000_0000, 0x5D0A_CD21),
        ];
        for (seq, index, expected) in vectors {
            assert_eq!(pattern_word(seq, index), expected, "pattern({seq:#x}, {index:#x})");
        }
    }

    /// Sequences around 0, 2^32 and 2^64: every pair closer than 2^32 differs in every word of a frame.
    #[test]
    fn different_sequences_differ_in_every_word() {
        let bases = [0u64, 1 << 32, (1 << 33) - 3, u64::MAX - 40, 0x1234_5678_9ABC_DEF0];
        let seqs: Vec<u64> =
            bases.iter().flat_map(|&base| (0..24u64).map(move |k| base.wrapping_sub(12).wrapping_add(k))).collect();
        let indices: Vec<u64> =
            (0..512u64).chain((1 << 32) - 256..(1 << 32) + 256).chain([u64::MAX - 1, u64::MAX]).collect();
        for &a in &seqs {
            for &b in &seqs {
                let distance = a.wrapping_sub(b).min(b.wrapping_sub(a));
                if a == b || distance >= 1 << 32 {
                    continue;
                }
                for &index in &indices {
                    assert_ne!(
                        pattern_word(a, index),
                        pattern_word(b, index),
                        "seq {a:#x} vs {b:#x} at word {index:#x}"
                    );
                }
            }
        }
    }

    /// The pair that breaks the formula which also mixes in `seq >> 32`: K^-1 (mod 2^32) and 2^32 are closer
    /// than 2^32, and `(K^-1 * K) ^ 0 == (0 * K) ^ 1`. Ours tells them apart.
    #[test]
    fn sequences_across_a_2_pow_32_boundary_differ() {
        // The inverse of SEQ_MUL modulo 2^32, by Newton's iteration.
        let mut inverse: u32 = SEQ_MUL;
        for _ in 0..5 {
            inverse = inverse.wrapping_mul(2u32.wrapping_sub(SEQ_MUL.wrapping_mul(inverse)));
        }
        assert_eq!(inverse.wrapping_mul(SEQ_MUL), 1);
        let (a, b) = (u64::from(inverse), 1u64 << 32);
        assert!(b - a < 1 << 32);
        let mixes_high_bits = |seq: u64| (seq as u32).wrapping_mul(SEQ_MUL) ^ (seq >> 32) as u32;
        assert_eq!(mixes_high_bits(a), mixes_high_bits(b));
        for index in 0..1024 {
            assert_ne!(pattern_word(a, index), pattern_word(b, index));
        }
    }

    #[test]
    fn words_of_one_frame_are_distinct() {
        let mut frame = vec![0u32; 1 << 16];
        fill_pattern_host(&mut frame, 0xDEAD_BEEF);
        assert!(frame.windows(2).all(|pair| pair[0] != pair[1]));
        let mut sorted = frame.clone();
        sorted.sort_unstable();
        sorted.dedup();
        assert_eq!(sorted.len(), frame.len());
    }

    #[test]
    fn fill_then_count() {
        let mut frame = vec![0u32; 1000];
        fill_pattern_host(&mut frame, 41);
        assert_eq!(frame[3], pattern_word(41, 3));
        assert_eq!(count_mismatches_host(&frame, 41), 0);
        assert_eq!(count_mismatches_host(&frame, 42), 1000);
        assert_eq!(count_mismatches_host(&frame, 40), 1000);
        frame[0] ^= 1;
        frame[999] = 0;
        assert_eq!(count_mismatches_host(&frame, 41), 2);
        // A torn frame: the first half written for seq 42, the rest still holding seq 41.
        let mut torn = frame.clone();
        fill_pattern_host(&mut torn[..500], 42);
        assert_eq!(count_mismatches_host(&torn, 42), 500);
        assert_eq!(count_mismatches_host(&[], 42), 0);
    }
}
