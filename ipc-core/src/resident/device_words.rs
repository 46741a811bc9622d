//! The ring's device words: a copy of `published` and of every consumer's `released` in device memory, at the end
//! of the frame allocation, for kernels on the ring (the device API of `kernels/cuda/gpu_ipc_ring.cuh`).
//!
//! A kernel polling a counter in the control block (host memory registered for the device) sees another process's
//! store about 2.4 us later; in device memory, about 0.9 us (H200, MPS, two persistent kernels ping-ponging:
//! 4.88 us against 1.80 us per round trip, `tools/scripts/signal-paths.sh OUT 3000 rtk`). So a producer whose strategy
//! runs on the GPU (`gpu-stream-ops`, `gpu-poll`) reserves [`BYTES`] after its slots, zeroes them, and names their
//! offset in the control block's header (`header.device_words`). The device API's stores write both copies; its
//! waits poll the device copy and look at the host copy every few dozen polls (peers that write only the host
//! copy, poison). Host code never reads the device copy: the control block stays the ring's truth.
//!
//! Layout (docs/ring.md, "Device words"): `published[i]` at `8 i`, consumer `c`'s `released[i]` at
//! `RELEASED + c * RECORD + 8 i`; `i < 256`, `c < 16`. The constants here are the definition: kernels get them from
//! `kernels/cuda/gpu_ipc_ring_layout.cuh`, generated from them ([`super::cuda_header`]).

use std::ffi::OsStr;

use crate::ring::layout::{MAX_CONSUMERS, MAX_SLOTS};

/// `GPU_IPC_DEVICE_WORDS=0`: this process's kernels on a ring use its control block only, as a peer on another GPU
/// does (the producer still reserves and names the device words for its peers). For diagnosis and same-binary
/// comparisons; anything else, or unset, uses them.
pub const ENV: &str = "GPU_IPC_DEVICE_WORDS";

/// Whether this process's kernels use the device words ([`ENV`]), read from the environment.
pub fn enabled() -> bool {
    let on = enabled_by(std::env::var_os(ENV).as_deref());
    if !on {
        tracing::info!("{ENV}=0: this process's kernels on the ring use its control block only");
    }
    on
}

fn enabled_by(value: Option<&OsStr>) -> bool {
    value.is_none_or(|v| v != "0")
}

/// Byte offset of consumer 0's `released[0]` in the device words.
pub const RELEASED: u64 = 8 * MAX_SLOTS as u64;
/// Bytes from consumer `c`'s `released[0]` to consumer `c + 1`'s.
pub const RECORD: u64 = 8 * MAX_SLOTS as u64;
/// Size of the device words.
pub const BYTES: u64 = RELEASED + RECORD * MAX_CONSUMERS as u64;
/// Alignment of the device words in the allocation.
pub const ALIGN: u64 = 256;

/// Where a producer puts the device words: after `slots_end`, the end of its last slot, aligned.
pub const fn place(slots_end: u64) -> u64 {
    slots_end.next_multiple_of(ALIGN)
}

/// Checks the header's `device_words` offset (non-zero) against the offer: aligned, after the slots, and inside the
/// allocation. A consumer refuses a ring whose offset fails this, since its kernels would write outside the words.
pub fn check(offset: u64, slots_end: u64, allocation_bytes: u64) -> Result<(), String> {
    if !offset.is_multiple_of(ALIGN) {
        return Err(format!("device words at byte {offset}: not a multiple of {ALIGN}"));
    }
    if offset < slots_end {
        return Err(format!("device words at byte {offset} overlap the slots, which end at byte {slots_end}"));
    }
    if offset.checked_add(BYTES).is_none_or(|end| end > allocation_bytes) {
        return Err(format!(
            "device words at byte {offset} ({BYTES} bytes) end past the allocation of {allocation_bytes} bytes"
        ));
    }
    Ok(())
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn the_layout_is_what_the_cuda_header_computes() {
        let header = include_str!("../../../kernels/cuda/gpu_ipc_ring_layout.cuh");
        assert!(header.contains(&format!("#define GPU_IPC_RING_DEVICE_RELEASED {RELEASED}ull")));
        assert!(header.contains(&format!("#define GPU_IPC_RING_DEVICE_RECORD {RECORD}ull")));
        assert_eq!(BYTES, 34_816);
    }

    #[test]
    fn only_zero_turns_them_off() {
        assert!(enabled_by(None));
        assert!(enabled_by(Some(OsStr::new("1"))));
        assert!(enabled_by(Some(OsStr::new(""))));
        assert!(!enabled_by(Some(OsStr::new("0"))));
    }

    #[test]
    fn a_consumer_refuses_device_words_that_are_misplaced() {
        assert_eq!(place(1000), 1024);
        assert!(check(1024, 1000, 1024 + BYTES).is_ok());
        assert!(check(1000, 1000, 1000 + BYTES).unwrap_err().contains("multiple of 256"));
        assert!(check(768, 1000, 1024 + BYTES).unwrap_err().contains("overlap the slots"));
        assert!(check(1024, 1000, 1024 + BYTES - 8).unwrap_err().contains("past the allocation"));
        assert!(check(u64::MAX - 255, 0, u64::MAX).is_err());
    }
}
