//! The roles of the `pipeline` example program, three processes in a row: `generate` (A) publishes pattern frames
//! into a ring; `transform` (B), a [`Stage`](gpu_ipc::core::frames::Stage), reads that ring and publishes each
//! frame XORed with a mask (every bit inverted by default) into a second ring; `verify` (C) reads the second ring
//! and checks every word of every frame against the transform of A's frame of that number. Each role has its own
//! `--backend` and `--sync`; `--backend host` runs without a GPU. See docs/pipelines.md.

use gpu_ipc::BackendKind;
use gpu_ipc::core::frames::FrameError;
use gpu_ipc::core::wire::{FrameGeometry, PixelFormat, SyncStrategy};

use crate::parse_pixel_format;

pub mod generate;
pub mod transform;
pub mod verify;

/// Exit status of `transform` when no downstream consumer is left (and it was not told to wait for one).
pub const EXIT_NO_CONSUMER: u8 = crate::exit::EXIT_NO_CONSUMER;

/// Parses a 32-bit mask: decimal, or hexadecimal with `0x`.
///
/// # Errors
/// What is wrong with it.
pub fn parse_mask(s: &str) -> Result<u32, String> {
    let parsed = match s.strip_prefix("0x").or_else(|| s.strip_prefix("0X")) {
        Some(hex) => u32::from_str_radix(hex, 16),
        None => s.parse(),
    };
    parsed.map_err(|e| format!("`{s}` is not a 32-bit mask (decimal, or hexadecimal with 0x): {e}"))
}

/// A mask as the summaries write it: `0xffffffff`.
pub fn mask_name(mask: u32) -> String {
    format!("{mask:#010x}")
}

/// The ring a role creates: its sync strategy, slots and frames (`generate` and `transform` give the same frame
/// size: the transform keeps it).
#[derive(Debug, Clone, clap::Args)]
pub struct RingArgs {
    /// Sync strategy of the ring this role creates: cpu-spin, cpu-sleep, ipc-event, gpu-stream-ops or gpu-poll
    /// (needs MPS); by default gpu-stream-ops on a GPU backend, cpu-spin on the host backend
    /// (`SyncStrategy::default_for`).
    #[arg(long)]
    pub sync: Option<SyncStrategy>,
    /// Ring slots, 1 to 256.
    #[arg(long, default_value_t = 2)]
    pub slots: u32,
    /// Frame width in pixels (default 3840; 640 with `--backend host`).
    #[arg(long)]
    pub width: Option<u32>,
    /// Frame height in pixels (default 2160; 480 with `--backend host`).
    #[arg(long)]
    pub height: Option<u32>,
    /// Pixel format: rgb8, rgba8 or gray8.
    #[arg(long, default_value = "rgb8", value_parser = parse_pixel_format)]
    pub format: PixelFormat,
}

impl RingArgs {
    /// The frame geometry: 4K unless told otherwise on a GPU, 640 x 480 on the host backend.
    ///
    /// # Errors
    /// A geometry the ring refuses.
    pub fn geometry(&self, backend: BackendKind) -> Result<FrameGeometry, FrameError> {
        let host = !backend.is_gpu();
        let width = self.width.unwrap_or(if host { 640 } else { 3840 });
        let height = self.height.unwrap_or(if host { 480 } else { 2160 });
        Ok(FrameGeometry::new(width, height, self.format)?)
    }

    /// The ring's sync strategy: `--sync`, else the default for `backend` (`SyncStrategy::default_for`).
    pub fn sync(&self, backend: BackendKind) -> SyncStrategy {
        self.sync.unwrap_or_else(|| SyncStrategy::default_for(backend))
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn masks_parse_in_decimal_and_hex() {
        assert_eq!(parse_mask("0xffffffff").unwrap(), u32::MAX);
        assert_eq!(parse_mask("0XF0").unwrap(), 0xF0);
        assert_eq!(parse_mask("255").unwrap(), 255);
        assert!(parse_mask("0x1ffffffff").unwrap_err().contains("not a 32-bit mask"));
        assert!(parse_mask("-1").is_err());
        assert_eq!(mask_name(0xF0), "0x000000f0");
    }
}
