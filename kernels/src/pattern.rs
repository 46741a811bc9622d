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
    mix((index as u32).wrapping_mul(INDEX_MUL) ^ (seq as u32).wrapping_mul(SEQ_MUL) ^ SALT)
}

/// The inverse of `SEQ_MUL` modulo 2^32 (an odd number has one), by Newton's iteration: each step doubles the
/// correct low bits, and 3 are right to begin with.
const SEQ_MUL_INV: u32 = {
    let mut inverse = SEQ_MUL;
    let mut step = 0;
    while step < 5 {
        inverse = inverse.wrapping_mul(2u32.wrapping_sub(SEQ_MUL.wrapping_mul(inverse)));
        step += 1;
    }
    inverse
};

/// `x ^ (x >> 16)`: linear over the bits of `x`, and its own inverse (`mix(mix(x)) == x`).
const fn mix(x: u32) -> u32 {
    x ^ (x >> 16)
}

/// The sequence whose pattern frame is the frame of `seq` with every word XORed with `mask`:
/// `pattern_word(xor_sequence(seq, mask), i) == pattern_word(seq, i) ^ mask` for every word `i`. So a frame
/// transformed by `gpu_ipc_xor_words` is checked by the verify kernel as it is, against this sequence.
///
/// Why it exists: `pattern = mix(s ^ t)` with `mix` linear and its own inverse, so `pattern ^ mask = mix(s ^
/// mix(mask) ^ t)`, the pattern of the sequence whose term is `s ^ mix(mask)`. Like the pattern, it works on the
/// low 32 bits of `seq` (the result is below 2^32), and it is its own inverse for a given `mask`.
///
/// ```
/// use gpu_ipc_kernels::pattern::{pattern_word, xor_sequence};
/// let inverted = xor_sequence(7, 0xFFFF_FFFF);
/// assert_eq!(pattern_word(inverted, 100), !pattern_word(7, 100));
/// assert_eq!(xor_sequence(inverted, 0xFFFF_FFFF), 7);
/// ```
#[inline]
pub const fn xor_sequence(seq: u64, mask: u32) -> u64 {
    // Truncation is the definition, as in `pattern_word`.
    let term = (seq as u32).wrapping_mul(SEQ_MUL) ^ mix(mask);
    term.wrapping_mul(SEQ_MUL_INV) as u64
}

/// The sequence (its low 32 bits) of the pattern frame whose first word is `word`: word 0 of a frame depends on
/// the sequence alone, one to one, so a reader that does not know which frame it holds learns it here and then
/// checks every word against that sequence. `sequence_of_first_word(pattern_word(seq, 0)) == seq % 2^32`.
///
/// ```
/// use gpu_ipc_kernels::pattern::{pattern_word, sequence_of_first_word};
/// assert_eq!(sequence_of_first_word(pattern_word(12_345, 0)), 12_345);
/// ```
#[inline]
pub const fn sequence_of_first_word(word: u32) -> u64 {
    (mix(word) ^ SALT).wrapping_mul(SEQ_MUL_INV) as u64
}

/// Fills `words` as `gpu_ipc_fill_pattern` fills a frame: `words[i] = pattern_word(seq, i)`.
pub fn fill_pattern_host(words: &mut [u32], seq: u64) {
    for (index, word) in (0u64..).zip(words.iter_mut()) {
        *word = pattern_word(seq, index);
    }
}

/// XORs every word of `src` with `mask` into `dst`, as `gpu_ipc_xor_words` does (`dst` and `src` the same length;
/// extra words of the longer one are left alone).
pub fn xor_words_host(dst: &mut [u32], src: &[u32], mask: u32) {
    for (out, word) in dst.iter_mut().zip(src) {
        *out = word ^ mask;
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
        assert_eq!(SEQ_MUL_INV.wrapping_mul(SEQ_MUL), 1);
        let (a, b) = (u64::from(SEQ_MUL_INV), 1u64 << 32);
        assert!(b - a < 1 << 32);
        let mixes_high_bits = |seq: u64| (seq as u32).wrapping_mul(SEQ_MUL) ^ (seq >> 32) as u32;
        assert_eq!(mixes_high_bits(a), mixes_high_bits(b));
        for index in 0..1024 {
            assert_ne!(pattern_word(a, index), pattern_word(b, index));
        }
    }

    #[test]
    fn a_frame_xored_with_a_mask_is_the_pattern_frame_of_xor_sequence() {
        let seqs = [0u64, 1, 2, 41, 0xFFFF_FFFF, 1 << 32, 0x1234_5678_9ABC_DEF0, u64::MAX];
        let masks = [0u32, 0xFFFF_FFFF, 1, 0x8000_0000, 0xFFFF_0000, 0x0000_FFFF, 0xDEAD_BEEF];
        for &seq in &seqs {
            for &mask in &masks {
                let other = xor_sequence(seq, mask);
                assert!(other < 1 << 32);
                for index in (0..64u64).chain([1 << 20, (1 << 32) - 1, 1 << 32, u64::MAX]) {
                    assert_eq!(pattern_word(other, index), pattern_word(seq, index) ^ mask, "{seq:#x} {mask:#x}");
                }
                // Its own inverse, on the low 32 bits the pattern uses.
                assert_eq!(xor_sequence(other, mask), seq & 0xFFFF_FFFF);
            }
            assert_eq!(xor_sequence(seq, 0), seq & 0xFFFF_FFFF);
        }
        // A transformed frame is checked against `xor_sequence`, and a frame that was not transformed fails in every
        // word; so does the transform of a neighbouring frame.
        let mut frame = vec![0u32; 1000];
        fill_pattern_host(&mut frame, 77);
        let inverted: Vec<u32> = frame.iter().map(|w| !w).collect();
        assert_eq!(count_mismatches_host(&inverted, xor_sequence(77, u32::MAX)), 0);
        assert_eq!(count_mismatches_host(&frame, xor_sequence(77, u32::MAX)), 1000);
        assert_eq!(count_mismatches_host(&inverted, xor_sequence(76, u32::MAX)), 1000);
        assert_eq!(count_mismatches_host(&inverted, xor_sequence(77, 0xFFFF_FFFE)), 1000);
    }

    #[test]
    fn the_first_word_names_the_frame() {
        for seq in [0u64, 1, 2, 999, 0xFFFF_FFFF, 0x1234_5678] {
            assert_eq!(sequence_of_first_word(pattern_word(seq, 0)), seq);
        }
        assert_eq!(sequence_of_first_word(pattern_word((1 << 32) + 5, 0)), 5);
        // Every word value is the first word of exactly one sequence: sample a stretch of them.
        for word in (0..1 << 16).map(|w: u32| w.wrapping_mul(0x9E37_79B9)) {
            assert_eq!(pattern_word(sequence_of_first_word(word), 0), word);
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
