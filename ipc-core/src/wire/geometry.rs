//! The size and layout of a frame of pixels ([`FrameGeometry`]), valid once constructed.

use serde::{Deserialize, Serialize};

use super::error::WireError;
use super::types::PixelFormat;

/// Size and layout of one frame; always valid once constructed.
///
/// Invariants (checked by [`FrameGeometry::with_pitch`] and on deserialisation): width and height
/// are non-zero, `pitch_bytes >= width * bytes_per_pixel`, and `pitch_bytes` is a multiple of 4,
/// so a frame (`pitch_bytes * height`) is a whole number of 32-bit words, which the verify
/// kernels read; a frame is below 2^63 bytes (what DLPack's signed sizes count). A frame is also a
/// tensor ([`FrameGeometry::tensor`]); [`SlotLayout`](super::SlotLayout) describes any slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(try_from = "RawFrameGeometry")]
pub struct FrameGeometry {
    width: u32,
    height: u32,
    pitch_bytes: u32,
    pixel_format: PixelFormat,
}

/// Unvalidated mirror of [`FrameGeometry`] so that deserialisation goes through validation.
#[derive(Deserialize)]
struct RawFrameGeometry {
    width: u32,
    height: u32,
    pitch_bytes: u32,
    pixel_format: PixelFormat,
}

impl TryFrom<RawFrameGeometry> for FrameGeometry {
    type Error = WireError;

    fn try_from(raw: RawFrameGeometry) -> Result<Self, Self::Error> {
        Self::with_pitch(raw.width, raw.height, raw.pitch_bytes, raw.pixel_format)
    }
}

impl FrameGeometry {
    /// A tightly packed frame: the pitch is the row size rounded up to a multiple of 4.
    pub fn new(width: u32, height: u32, pixel_format: PixelFormat) -> Result<Self, WireError> {
        let row = u64::from(width) * u64::from(pixel_format.bytes_per_pixel());
        let pitch = row.div_ceil(4) * 4;
        let pitch = u32::try_from(pitch).map_err(|_| invalid_geometry("row of more than 4 GiB"))?;
        Self::with_pitch(width, height, pitch, pixel_format)
    }

    /// A frame whose rows are `pitch_bytes` apart (e.g. a pitch from `cuMemAllocPitch`).
    pub fn with_pitch(width: u32, height: u32, pitch_bytes: u32, pixel_format: PixelFormat) -> Result<Self, WireError> {
        if width == 0 || height == 0 {
            return Err(invalid_geometry("width and height must be non-zero"));
        }
        let row = u64::from(width) * u64::from(pixel_format.bytes_per_pixel());
        if u64::from(pitch_bytes) < row {
            return Err(WireError::InvalidField {
                field: "geometry.pitch_bytes",
                reason: format!("pitch {pitch_bytes} is less than width * bytes per pixel = {row}"),
            });
        }
        if !pitch_bytes.is_multiple_of(4) {
            return Err(WireError::InvalidField {
                field: "geometry.pitch_bytes",
                reason: format!("pitch {pitch_bytes} is not a multiple of 4"),
            });
        }
        let frame_bytes = u64::from(pitch_bytes) * u64::from(height);
        if frame_bytes > i64::MAX as u64 {
            return Err(invalid_geometry("a frame of 2^63 bytes or more"));
        }
        Ok(Self { width, height, pitch_bytes, pixel_format })
    }

    /// Rows of `width` gray8 pixels, packed: the caller guarantees a width that is a multiple of 4 (at least 4), a
    /// height of at least 1, and `width * height` below 2^63 (see `SlotLayout::pixel_view`).
    pub(super) const fn gray8_rows(width: u32, height: u32) -> Self {
        Self { width, height, pitch_bytes: width, pixel_format: PixelFormat::Gray8 }
    }

    /// Pixels per row.
    pub const fn width(&self) -> u32 {
        self.width
    }

    /// Rows per frame.
    pub const fn height(&self) -> u32 {
        self.height
    }

    /// Bytes from the start of one row to the start of the next.
    pub const fn pitch_bytes(&self) -> u32 {
        self.pitch_bytes
    }

    /// Layout of one pixel.
    pub const fn pixel_format(&self) -> PixelFormat {
        self.pixel_format
    }

    /// Bytes one frame occupies: `pitch_bytes * height`, a multiple of 4.
    pub const fn frame_bytes(&self) -> u64 {
        self.pitch_bytes as u64 * self.height as u64
    }
}

fn invalid_geometry(reason: &str) -> WireError {
    WireError::InvalidField { field: "geometry", reason: reason.to_owned() }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn geometry_packs_pitch_and_validates() {
        let g = FrameGeometry::new(3, 2, PixelFormat::Rgb8).unwrap();
        assert_eq!(g.pitch_bytes(), 12);
        assert_eq!(g.frame_bytes(), 24);
        let g = FrameGeometry::new(3840, 2160, PixelFormat::Rgba8).unwrap();
        assert_eq!(g.frame_bytes(), 3840 * 4 * 2160);
        assert!(FrameGeometry::with_pitch(4, 4, 15, PixelFormat::Rgba8).is_err());
        assert!(FrameGeometry::with_pitch(4, 4, 18, PixelFormat::Rgba8).is_err());
        assert!(FrameGeometry::with_pitch(0, 4, 16, PixelFormat::Rgba8).is_err());
        assert_eq!(FrameGeometry::with_pitch(4, 4, 32, PixelFormat::Rgba8).unwrap().frame_bytes(), 128);
    }
}
