//! What each slot of a ring holds ([`SlotLayout`]): a size in bytes and, optionally, the tensor in it. A pixel
//! frame is one such tensor (`[height, width, channels]` with its rows a pitch apart), so one type describes every
//! ring; [`FrameGeometry`] stays the convenient way to say "frames of pixels".

use std::fmt;

use super::dtype::DType;
use super::error::{LayoutError, WireError};
use super::geometry::FrameGeometry;
use super::tensor::TensorDesc;
use super::types::PixelFormat;

/// The oldest protocol version that can describe every slot layout: version 1 describes pixel frames only.
const TENSOR_VERSION: u16 = 2;

impl PixelFormat {
    /// The element type and channel count of a pixel: what a frame of this format is as a tensor.
    pub const fn element(self) -> (DType, u32) {
        match self {
            Self::Rgb8 => (DType::U8, 3),
            Self::Rgba8 | Self::Bgra8 => (DType::U8, 4),
            Self::Gray8 => (DType::U8, 1),
            Self::Gray16 => (DType::U16, 1),
            Self::RgbaF16 => (DType::F16, 4),
            Self::RgbaF32 => (DType::F32, 4),
        }
    }
}

impl FrameGeometry {
    /// The frame as a tensor: shape `[height, width, channels]` of the pixel's element type; strides `None` when the
    /// rows are packed (`pitch_bytes == width * bytes_per_pixel`), else `[pitch / element size, channels, 1]`.
    pub fn tensor(&self) -> TensorDesc {
        let (dtype, channels) = self.pixel_format().element();
        let shape = vec![u64::from(self.height()), u64::from(self.width()), u64::from(channels)];
        let row = u64::from(self.width()) * u64::from(self.pixel_format().bytes_per_pixel());
        let strides = (u64::from(self.pitch_bytes()) != row)
            .then(|| vec![u64::from(self.pitch_bytes()) / dtype.size_bytes(), u64::from(channels), 1]);
        // Valid by the geometry's invariants: extents of at most 2^32, a pitch that is a multiple of 4 and so of the
        // element size (1, 2 or 4), and a span of at most the frame size, which is below 2^63.
        TensorDesc::trusted(dtype, shape, strides)
    }
}

/// What each slot of a ring holds: `bytes` (the slot's size, what a frame's or lease's `bytes()` says), and
/// optionally the tensor stored from the slot's first byte. Valid once constructed: `bytes` is more than 0 and a
/// multiple of 4, and the tensor fits in it.
///
/// A ring of pixel frames ([`SlotLayout::frames`]) is described by protocol version 1 exactly as before; anything
/// else (tensors, bare bytes) needs version 2 ([`SlotLayout::oldest_version`]), and a consumer that speaks only
/// version 1 is refused, with words that say so.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct SlotLayout {
    bytes: u64,
    tensor: Option<TensorDesc>,
    /// Set for a pixel frame; then `tensor` is `frame.tensor()` and `bytes` is `frame.frame_bytes()`.
    frame: Option<FrameGeometry>,
}

impl SlotLayout {
    /// Slots of pixel frames.
    pub fn frames(geometry: FrameGeometry) -> Self {
        Self { bytes: geometry.frame_bytes(), tensor: Some(geometry.tensor()), frame: Some(geometry) }
    }

    /// Slots holding `tensor`, as large as its span rounded up to a multiple of 4.
    pub fn tensors(tensor: TensorDesc) -> Self {
        // The span is at most 2^63 - 1, so rounding up cannot overflow.
        Self { bytes: tensor.span_bytes().div_ceil(4) * 4, tensor: Some(tensor), frame: None }
    }

    /// Slots of `bytes` bytes holding `tensor` from their first byte (e.g. room for the largest of several shapes).
    ///
    /// # Errors
    /// [`WireError::InvalidLayout`]: `bytes` is 0 or not a multiple of 4 ([`LayoutError::SlotBytes`]), or the tensor
    /// spans more ([`LayoutError::ExceedsSlot`]).
    pub fn tensors_in(bytes: u64, tensor: TensorDesc) -> Result<Self, WireError> {
        let layout = Self::raw(bytes)?;
        if tensor.span_bytes() > bytes {
            let source = LayoutError::ExceedsSlot { tensor: tensor.to_string(), span: tensor.span_bytes(), bytes };
            return Err(WireError::InvalidLayout { field: "slot", source });
        }
        Ok(Self { tensor: Some(tensor), ..layout })
    }

    /// Slots of `bytes` bytes with no tensor description: the application knows what is in them.
    ///
    /// # Errors
    /// [`WireError::InvalidLayout`] with [`LayoutError::SlotBytes`] when `bytes` is 0 or not a multiple of 4.
    pub fn raw(bytes: u64) -> Result<Self, WireError> {
        if bytes == 0 || !bytes.is_multiple_of(4) {
            return Err(WireError::InvalidLayout { field: "slot", source: LayoutError::SlotBytes { bytes } });
        }
        Ok(Self { bytes, tensor: None, frame: None })
    }

    /// The size of each slot's content, in bytes (a multiple of 4).
    pub const fn bytes(&self) -> u64 {
        self.bytes
    }

    /// The tensor in each slot (a pixel frame's too), if the layout names one.
    pub fn tensor(&self) -> Option<&TensorDesc> {
        self.tensor.as_ref()
    }

    /// The pixel geometry, for slots of pixel frames.
    pub const fn frame_geometry(&self) -> Option<FrameGeometry> {
        self.frame
    }

    /// The slot as a pixel frame, for code written for pixel rings: the geometry of a pixel frame; otherwise the
    /// slot's bytes as `gray8` rows (one row when the slot is below 4 GiB; else rows of the largest power of two up
    /// to 2 GiB that divides the size, as many rows as fit in 32 bits).
    pub fn pixel_view(&self) -> FrameGeometry {
        if let Some(frame) = self.frame {
            return frame;
        }
        let width =
            if self.bytes <= u64::from(u32::MAX) { self.bytes } else { 1u64 << self.bytes.trailing_zeros().min(31) };
        let height = (self.bytes / width).min(u64::from(u32::MAX));
        // The size is a multiple of 4, so the width is one too, from 4 to below 2^32; the height is at least 1; the
        // frame, at most 2^31 * (2^32 - 1) bytes, is below 2^63: a valid gray8 frame.
        FrameGeometry::gray8_rows(u32::try_from(width).unwrap_or(4), u32::try_from(height).unwrap_or(1))
    }

    /// The oldest wire protocol version that can describe this layout: 1 for pixel frames, 2 for anything else.
    pub const fn oldest_version(&self) -> u16 {
        if self.frame.is_some() { 1 } else { TENSOR_VERSION }
    }

    /// Checks that a layout decoded beside a pixel geometry is that frame's (protocol version 2 sends both).
    pub(super) fn check_is_frame(&self, geometry: FrameGeometry) -> Result<(), LayoutError> {
        let expected = Self::frames(geometry);
        if self.bytes != expected.bytes {
            let (found, expected) = (self.bytes.to_string(), expected.bytes.to_string());
            return Err(LayoutError::NotTheFrame { what: "bytes", found, expected });
        }
        if self.tensor != expected.tensor {
            let show = |t: &Option<TensorDesc>| t.as_ref().map_or_else(|| "none".to_owned(), TensorDesc::to_string);
            let (found, expected) = (show(&self.tensor), show(&expected.tensor));
            return Err(LayoutError::NotTheFrame { what: "tensor", found, expected });
        }
        Ok(())
    }
}

impl From<FrameGeometry> for SlotLayout {
    fn from(geometry: FrameGeometry) -> Self {
        Self::frames(geometry)
    }
}

impl From<TensorDesc> for SlotLayout {
    fn from(tensor: TensorDesc) -> Self {
        Self::tensors(tensor)
    }
}

impl fmt::Display for SlotLayout {
    /// `1920x1080 rgba8 frames (8294400 bytes)`, `float32 [4, 1024] tensors (16384 bytes)`, `4096 bytes`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (&self.frame, &self.tensor) {
            (Some(g), _) => {
                write!(f, "{}x{} {} frames ({} bytes)", g.width(), g.height(), g.pixel_format().name(), self.bytes)
            }
            (None, Some(t)) => write!(f, "{t} tensors ({} bytes)", self.bytes),
            (None, None) => write!(f, "{} bytes", self.bytes),
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn a_pixel_frame_is_a_tensor() {
        let packed = FrameGeometry::new(1920, 1080, PixelFormat::Rgba8).unwrap();
        let t = packed.tensor();
        assert_eq!((t.dtype(), t.shape(), t.strides()), (DType::U8, &[1080, 1920, 4][..], None));
        assert_eq!(t.span_bytes(), packed.frame_bytes());
        // Rows padded to a pitch: strides in elements.
        let padded = FrameGeometry::with_pitch(3, 2, 12, PixelFormat::Rgb8).unwrap();
        assert_eq!(padded.tensor().strides(), Some(&[12, 3, 1][..]));
        assert_eq!(padded.tensor().span_bytes(), 12 + 9);
        let half = FrameGeometry::with_pitch(4, 2, 64, PixelFormat::RgbaF16).unwrap();
        assert_eq!((half.tensor().dtype(), half.tensor().strides()), (DType::F16, Some(&[32, 4, 1][..])));
        let gray16 = FrameGeometry::new(3, 3, PixelFormat::Gray16).unwrap();
        assert_eq!(gray16.tensor().strides(), Some(&[4, 1, 1][..]), "rows of 6 bytes padded to 8");
        let layout = SlotLayout::from(padded);
        assert_eq!((layout.bytes(), layout.frame_geometry(), layout.oldest_version()), (24, Some(padded), 1));
        assert_eq!(layout.pixel_view(), padded);
        assert!(layout.check_is_frame(padded).is_ok());
    }

    #[test]
    fn tensor_and_byte_slots() {
        let t = TensorDesc::contiguous(DType::F16, [3]).unwrap();
        let layout = SlotLayout::tensors(t.clone());
        assert_eq!((layout.bytes(), layout.oldest_version(), layout.frame_geometry()), (8, 2, None));
        assert_eq!(layout.to_string(), "float16 [3] tensors (8 bytes)");
        assert!(SlotLayout::tensors_in(8, t.clone()).is_ok());
        assert!(matches!(
            SlotLayout::tensors_in(4, t.clone()),
            Err(WireError::InvalidLayout { source: LayoutError::ExceedsSlot { span: 6, bytes: 4, .. }, .. })
        ));
        for bytes in [0, 6] {
            assert!(matches!(
                SlotLayout::raw(bytes),
                Err(WireError::InvalidLayout { source: LayoutError::SlotBytes { .. }, .. })
            ));
        }
        // A 2 x 2 gray8 frame (rows padded to 4 bytes) is 8 bytes too, but another tensor; a 4 x 4 one is 16 bytes.
        let frame = FrameGeometry::new(2, 2, PixelFormat::Gray8).unwrap();
        let err = SlotLayout::tensors(t.clone()).check_is_frame(frame).unwrap_err();
        assert!(matches!(err, LayoutError::NotTheFrame { what: "tensor", .. }), "{err}");
        let frame = FrameGeometry::new(4, 4, PixelFormat::Gray8).unwrap();
        let err = SlotLayout::tensors(t).check_is_frame(frame).unwrap_err();
        assert!(matches!(err, LayoutError::NotTheFrame { what: "bytes", .. }), "{err}");
    }

    #[test]
    fn the_pixel_view_of_a_tensor_slot_covers_its_bytes() {
        let view = SlotLayout::raw(4096).unwrap().pixel_view();
        assert_eq!((view.width(), view.height(), view.frame_bytes()), (4096, 1, 4096));
        let big = SlotLayout::raw(6 << 30).unwrap().pixel_view();
        assert_eq!((big.width(), big.height(), big.frame_bytes()), (1 << 31, 3, 6 << 30));
        let odd = SlotLayout::raw(4 * 1_000_000_007).unwrap().pixel_view();
        assert_eq!(odd.frame_bytes(), 4 * 1_000_000_007);
    }
}
