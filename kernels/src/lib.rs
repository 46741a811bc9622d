//! The CUDA kernels of gpu-ipc, compiled ahead of time and embedded in the crate.
//!
//! `cargo build` needs no CUDA toolkit: `scripts/gen-kernels.sh` compiles `kernels/cuda/*.cu` with a pinned
//! NVRTC into `kernels/generated/` (one cubin per architecture and one PTX), the outputs are committed, and
//! [`image`] embeds them and picks the one to load for a device. [`pattern`] is the host reference of the frame
//! check pattern the kernels write and verify. See `docs/kernels.md`.
//!
//! The kernels, by the names to pass to `cuModuleGetFunction`:
//! - [`FILL_PATTERN`]`(unsigned int* dst, unsigned long long n_words, unsigned long long seq)`
//! - [`VERIFY_PATTERN`]`(const unsigned int* src, unsigned long long n_words, unsigned long long seq,
//!   unsigned long long* mismatches)`
//! - [`XOR_WORDS`]`(unsigned int* dst, const unsigned int* src, unsigned long long n_words, unsigned int mask)`

#![forbid(unsafe_code)] // Only ipc-core's driver and sys layers may contain `unsafe`.

pub mod image;
pub mod launch;
pub mod pattern;
pub mod probe;

/// `gpu_ipc_fill_pattern(unsigned int* dst, unsigned long long n_words, unsigned long long seq)`: writes
/// [`pattern::pattern_word`]`(seq, i)` into word `i` of `dst` for every `i < n_words`.
pub const FILL_PATTERN: &str = "gpu_ipc_fill_pattern";

/// `gpu_ipc_verify_pattern(const unsigned int* src, unsigned long long n_words, unsigned long long seq,
/// unsigned long long* mismatches)`: adds to `*mismatches` the number of words `i < n_words` of `src` that differ
/// from [`pattern::pattern_word`]`(seq, i)`; the caller zeroes `*mismatches` first.
pub const VERIFY_PATTERN: &str = "gpu_ipc_verify_pattern";

/// `gpu_ipc_xor_words(unsigned int* dst, const unsigned int* src, unsigned long long n_words, unsigned int mask)`:
/// `dst[i] = src[i] ^ mask` for every `i < n_words` (two buffers that do not overlap): the pipeline example's
/// transform. A pattern frame so transformed is the pattern frame of [`pattern::xor_sequence`]`(seq, mask)`.
pub const XOR_WORDS: &str = "gpu_ipc_xor_words";

/// The frame-pattern kernels; [`probe::kernel_names`] lists the probes' kernels.
pub const KERNELS: [&str; 3] = [FILL_PATTERN, VERIFY_PATTERN, XOR_WORDS];

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    #[test]
    fn kernel_names_match_the_manifest() {
        let manifest: serde_json::Value = serde_json::from_str(image::MANIFEST).unwrap();
        let listed: Vec<&str> =
            manifest["kernels"].as_array().unwrap().iter().map(|name| name.as_str().unwrap()).collect();
        let mut known: Vec<String> = KERNELS.iter().map(|s| (*s).to_owned()).chain(probe::kernel_names()).collect();
        known.sort();
        assert_eq!(listed, known);
    }
}
