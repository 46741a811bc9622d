//! The CUDA kernels of gpu-ipc, compiled ahead of time and embedded in the crate.
//!
//! `cargo build` needs no CUDA toolkit: `scripts/gen-kernels.sh` compiles `kernels/cuda/*.cu` with a pinned
//! NVRTC into `kernels/images/kernels/` (one cubin per architecture and one PTX), the outputs are committed, and
//! [`image`] embeds them and picks the one to load for a device. [`pattern`] is the host reference of the frame
//! check pattern the kernels write and verify. See `docs/kernels.md`.
//!
//! The kernels, by the names to pass to `cuModuleGetFunction`:
//! - [`FILL_PATTERN`]`(unsigned int* dst, unsigned long long n_words, unsigned long long seq)`
//! - [`VERIFY_PATTERN`]`(const unsigned int* src, unsigned long long n_words, unsigned long long seq,
//!   unsigned long long* mismatches)`
//! - [`XOR_WORDS`]`(unsigned int* dst, const unsigned int* src, unsigned long long n_words, unsigned int mask)`
//! - [`VERIFY_STAMPED`]`(const unsigned int* src, unsigned long long n_words, unsigned long long seq,
//!   unsigned long long* mismatches, const unsigned long long* stamp, unsigned long long stamp_expected,
//!   unsigned long long* skipped)`
//! - [`PERSISTENT_VERIFY`]`(const gpu_ipc_ring_descriptor* ring, unsigned long long frames,
//!   unsigned long long timeout_ns, unsigned long long* result)`, the example of the ring's device API
//!   (`kernels/cuda/gpu_ipc_ring.cuh`; launched by [`persistent`])
//! - [`PERSISTENT_FILL`]`(const gpu_ipc_ring_producer_descriptor* ring, unsigned long long frames,
//!   unsigned long long timeout_ns, unsigned long long* result)`, its producer's side
//! - [`PERSISTENT_VERIFY_GRID`] and [`PERSISTENT_FILL_GRID`], the same two spread over the whole GPU (frames of
//!   megabytes: one block moves a small share of the memory bandwidth)
//! - [`FILL_PATTERN_AT`] and [`VERIFY_PATTERN_AT`], the fill and the check inside frame graphs
//! - the work queue's demo worker and producer, [`work_queue::KERNELS`] (their device functions are in
//!   `kernels/cuda/work_queue.cuh`, for your own kernels).

#![forbid(unsafe_code)] // Only ipc-core's driver and sys layers may contain `unsafe`.

pub mod image;
pub mod launch;
pub mod pattern;
pub mod persistent;
pub mod probe;
pub mod work_queue;

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

/// `gpu_ipc_check_stamp(const unsigned long long* stamp, unsigned long long stamp_expected, unsigned long long* valid,
/// unsigned long long* skipped)`: one thread reads the frame's stamp (`ipc_core::frames::Frame::stamp`) once and
/// stores into `*valid` (device memory) whether `(*stamp & (POISON - 1)) == stamp_expected` (the stamp rule of
/// docs/ring.md), adding 1 to `*skipped` when not.
pub const CHECK_STAMP: &str = "gpu_ipc_check_stamp";

/// `gpu_ipc_verify_stamped(const unsigned int* src, unsigned long long n_words, unsigned long long seq,
/// unsigned long long* mismatches, const unsigned long long* valid)`: as [`VERIFY_PATTERN`] when `*valid` (written by
/// [`CHECK_STAMP`] earlier on the same stream) is non-zero; no word of the frame is read otherwise.
pub const VERIFY_STAMPED: &str = "gpu_ipc_verify_stamped";

/// `gpu_ipc_persistent_verify(const gpu_ipc_ring_descriptor* ring, unsigned long long frames,
/// unsigned long long timeout_ns, unsigned long long* result)`: a persistent consumer that waits for, checks and
/// releases `frames` frames on the ring's device API; see [`persistent`].
pub const PERSISTENT_VERIFY: &str = "gpu_ipc_persistent_verify";

/// `gpu_ipc_persistent_fill(const gpu_ipc_ring_producer_descriptor* ring, unsigned long long frames,
/// unsigned long long timeout_ns, unsigned long long* result)`: a persistent producer that waits for each slot to be
/// free, writes the frame's pattern and publishes `frames` frames on the ring's device API; see [`persistent`].
pub const PERSISTENT_FILL: &str = "gpu_ipc_persistent_fill";

/// `gpu_ipc_persistent_verify_grid(const gpu_ipc_ring_descriptor* ring, unsigned long long frames,
/// unsigned long long timeout_ns, unsigned long long* result, gpu_ipc_grid_scratch* scratch,
/// unsigned long long* times)`: [`PERSISTENT_VERIFY`] spread over the whole GPU (a leader block and worker blocks);
/// see [`persistent::PersistentVerifyGrid`].
pub const PERSISTENT_VERIFY_GRID: &str = "gpu_ipc_persistent_verify_grid";

/// `gpu_ipc_persistent_fill_grid(const gpu_ipc_ring_producer_descriptor* ring, unsigned long long frames,
/// unsigned long long timeout_ns, unsigned long long* result, gpu_ipc_grid_scratch* scratch,
/// unsigned long long* times)`: [`PERSISTENT_FILL`] spread over the whole GPU; see [`persistent::PersistentFillGrid`].
pub const PERSISTENT_FILL_GRID: &str = "gpu_ipc_persistent_fill_grid";

/// `gpu_ipc_fill_pattern_at(unsigned int* dst, unsigned long long n_words, const gpu_ipc_graph_frame* state)`: as
/// [`FILL_PATTERN`] for the frame `state->sequence`, nothing when `state->valid` is 0: the fill inside a frame graph
/// (`ipc_core::frames::GraphSlot`), whose arguments are fixed when it is captured.
pub const FILL_PATTERN_AT: &str = "gpu_ipc_fill_pattern_at";

/// `gpu_ipc_verify_pattern_at(const unsigned int* src, unsigned long long n_words, const gpu_ipc_graph_frame* state,
/// unsigned long long* mismatches)`: as [`VERIFY_PATTERN`] for the frame `state->sequence`, nothing when
/// `state->valid` is 0 (the frame's stamp was not the producer's, or the wait gave up): the check inside a frame graph.
pub const VERIFY_PATTERN_AT: &str = "gpu_ipc_verify_pattern_at";

/// The frame-pattern kernels; [`probe::kernel_names`] lists the probes' kernels.
pub const KERNELS: [&str; 11] = [
    FILL_PATTERN,
    VERIFY_PATTERN,
    XOR_WORDS,
    CHECK_STAMP,
    VERIFY_STAMPED,
    PERSISTENT_VERIFY,
    PERSISTENT_FILL,
    PERSISTENT_VERIFY_GRID,
    PERSISTENT_FILL_GRID,
    FILL_PATTERN_AT,
    VERIFY_PATTERN_AT,
];

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    #[test]
    fn kernel_names_match_the_manifest() {
        let manifest: serde_json::Value = serde_json::from_str(image::MANIFEST).unwrap();
        let listed: Vec<&str> =
            manifest["kernels"].as_array().unwrap().iter().map(|name| name.as_str().unwrap()).collect();
        let mut known: Vec<String> = KERNELS
            .iter()
            .map(|s| (*s).to_owned())
            .chain(probe::kernel_names())
            .chain(work_queue::KERNELS.iter().map(|s| (*s).to_owned()))
            .collect();
        known.sort();
        assert_eq!(listed, known);
    }
}
