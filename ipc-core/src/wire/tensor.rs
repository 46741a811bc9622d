//! Tensor descriptions: an element type ([`DType`], with its DLPack code), a shape and optional strides in
//! elements, as DLPack and PyTorch count them. Always valid once constructed: at most [`MAX_TENSOR_DIMS`]
//! dimensions, every extent at least 1, and every extent, stride and span at most [`MAX_TENSOR_EXTENT`] (DLPack's
//! signed 64-bit counts), computed without overflow.

use std::fmt;
use std::str::FromStr;

use super::error::WireError;
use super::types::UnknownName;

/// Most dimensions a tensor description has (the wire carries at most eight shape and eight stride words).
pub const MAX_TENSOR_DIMS: usize = 8;

/// Largest extent, stride, element count or byte span of a tensor description: `i64::MAX`, since DLPack and
/// PyTorch count in signed 64-bit integers, so every value converts without loss.
pub const MAX_TENSOR_EXTENT: u64 = i64::MAX as u64;

/// Element type of a tensor, named as NumPy and PyTorch name it (`float32`, `bfloat16`; [`DType::short_name`] gives
/// `f32`, `bf16`), with the DLPack type it is ([`DType::dlpack`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum DType {
    /// `uint8`
    U8,
    /// `int8`
    I8,
    /// `uint16`
    U16,
    /// `int16`
    I16,
    /// `uint32`
    U32,
    /// `int32`
    I32,
    /// `uint64`
    U64,
    /// `int64`
    I64,
    /// `float16` (IEEE half)
    F16,
    /// `bfloat16`
    BF16,
    /// `float32`
    F32,
    /// `float64`
    F64,
    /// `bool` (one byte)
    Bool,
    /// `float8_e4m3fn`
    F8E4M3,
    /// `float8_e5m2`
    F8E5M2,
    /// `complex64` (two `float32`)
    C64,
    /// `complex128` (two `float64`)
    C128,
}

/// A DLPack `DLDataType`: type code (`kDLInt` 0, `kDLUInt` 1, `kDLFloat` 2, `kDLBfloat` 4, `kDLComplex` 5,
/// `kDLBool` 6, `kDLFloat8_e4m3fn` 10, `kDLFloat8_e5m2` 12), bits per element, lanes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct DlpackDtype {
    /// `DLDataType.code`.
    pub code: u8,
    /// `DLDataType.bits`.
    pub bits: u8,
    /// `DLDataType.lanes` (always 1 here).
    pub lanes: u16,
}

impl DType {
    /// Every element type, in wire-code order.
    pub const ALL: [Self; 17] = [
        Self::U8,
        Self::I8,
        Self::U16,
        Self::I16,
        Self::U32,
        Self::I32,
        Self::U64,
        Self::I64,
        Self::F16,
        Self::BF16,
        Self::F32,
        Self::F64,
        Self::Bool,
        Self::F8E4M3,
        Self::F8E5M2,
        Self::C64,
        Self::C128,
    ];

    /// Stable wire code (0 is never assigned: on the wire it means "no tensor description").
    pub const fn code(self) -> u16 {
        match self {
            Self::U8 => 1,
            Self::I8 => 2,
            Self::U16 => 3,
            Self::I16 => 4,
            Self::U32 => 5,
            Self::I32 => 6,
            Self::U64 => 7,
            Self::I64 => 8,
            Self::F16 => 9,
            Self::BF16 => 10,
            Self::F32 => 11,
            Self::F64 => 12,
            Self::Bool => 13,
            Self::F8E4M3 => 14,
            Self::F8E5M2 => 15,
            Self::C64 => 16,
            Self::C128 => 17,
        }
    }

    /// Decodes a wire code; `field` names the message field for the error.
    pub fn from_code(code: u16, field: &'static str) -> Result<Self, WireError> {
        Self::ALL.into_iter().find(|d| d.code() == code).ok_or(WireError::UnknownCode { field, code: u32::from(code) })
    }

    /// Bytes per element.
    pub const fn size_bytes(self) -> u64 {
        match self {
            Self::U8 | Self::I8 | Self::Bool | Self::F8E4M3 | Self::F8E5M2 => 1,
            Self::U16 | Self::I16 | Self::F16 | Self::BF16 => 2,
            Self::U32 | Self::I32 | Self::F32 => 4,
            Self::U64 | Self::I64 | Self::F64 | Self::C64 => 8,
            Self::C128 => 16,
        }
    }

    /// The NumPy / PyTorch name (`uint8`, `float32`, `bfloat16`, `float8_e4m3fn`, ...).
    pub const fn name(self) -> &'static str {
        match self {
            Self::U8 => "uint8",
            Self::I8 => "int8",
            Self::U16 => "uint16",
            Self::I16 => "int16",
            Self::U32 => "uint32",
            Self::I32 => "int32",
            Self::U64 => "uint64",
            Self::I64 => "int64",
            Self::F16 => "float16",
            Self::BF16 => "bfloat16",
            Self::F32 => "float32",
            Self::F64 => "float64",
            Self::Bool => "bool",
            Self::F8E4M3 => "float8_e4m3fn",
            Self::F8E5M2 => "float8_e5m2",
            Self::C64 => "complex64",
            Self::C128 => "complex128",
        }
    }

    /// The short name the command line takes (`u8`, `f32`, `bf16`, `f8e4m3fn`, `c64`, ...).
    pub const fn short_name(self) -> &'static str {
        match self {
            Self::U8 => "u8",
            Self::I8 => "i8",
            Self::U16 => "u16",
            Self::I16 => "i16",
            Self::U32 => "u32",
            Self::I32 => "i32",
            Self::U64 => "u64",
            Self::I64 => "i64",
            Self::F16 => "f16",
            Self::BF16 => "bf16",
            Self::F32 => "f32",
            Self::F64 => "f64",
            Self::Bool => "bool",
            Self::F8E4M3 => "f8e4m3fn",
            Self::F8E5M2 => "f8e5m2",
            Self::C64 => "c64",
            Self::C128 => "c128",
        }
    }

    /// The DLPack type of an element.
    pub const fn dlpack(self) -> DlpackDtype {
        let code = match self {
            Self::I8 | Self::I16 | Self::I32 | Self::I64 => 0,
            Self::U8 | Self::U16 | Self::U32 | Self::U64 => 1,
            Self::F16 | Self::F32 | Self::F64 => 2,
            Self::BF16 => 4,
            Self::C64 | Self::C128 => 5,
            Self::Bool => 6,
            Self::F8E4M3 => 10,
            Self::F8E5M2 => 12,
        };
        // At most 16 bytes, so at most 128 bits.
        DlpackDtype { code, bits: (self.size_bytes() * 8) as u8, lanes: 1 }
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for DType {
    type Err = UnknownName;

    /// Parses [`DType::name`] or [`DType::short_name`].
    fn from_str(text: &str) -> Result<Self, Self::Err> {
        Self::ALL.into_iter().find(|d| d.name() == text || d.short_name() == text).ok_or_else(|| UnknownName {
            what: "element type",
            given: text.to_owned(),
            known: Self::ALL.iter().map(|d| d.short_name()).collect(),
        })
    }
}

/// Why a tensor or slot description is not valid: [`WireError::InvalidLayout`] carries one, with the field.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum LayoutError {
    /// More dimensions than [`MAX_TENSOR_DIMS`].
    #[error("{ndim} dimensions, at most {max}")]
    TooManyDims {
        /// Dimensions given.
        ndim: usize,
        /// The most allowed.
        max: usize,
    },
    /// An extent of 0 (a ring of empty tensors carries nothing) or above [`MAX_TENSOR_EXTENT`].
    #[error("extent {extent} of dimension {dim} is not between 1 and 2^63 - 1")]
    BadExtent {
        /// Which dimension (0 = outermost).
        dim: usize,
        /// Its extent.
        extent: u64,
    },
    /// Strides given for another number of dimensions than the shape has.
    #[error("{strides} strides for {ndim} dimensions")]
    StrideCount {
        /// Strides given.
        strides: usize,
        /// Dimensions of the shape.
        ndim: usize,
    },
    /// A stride above [`MAX_TENSOR_EXTENT`].
    #[error("stride {stride} of dimension {dim} is above 2^63 - 1")]
    StrideTooLarge {
        /// Which dimension.
        dim: usize,
        /// Its stride, in elements.
        stride: u64,
    },
    /// The element count or the byte span overflows [`MAX_TENSOR_EXTENT`].
    #[error("a {dtype} tensor of shape {shape:?} spans more than 2^63 - 1 bytes")]
    TooLarge {
        /// Element type.
        dtype: DType,
        /// The shape.
        shape: Vec<u64>,
    },
    /// A slot size of 0 or not a multiple of 4 (a slot is a whole number of 32-bit words, as a frame is).
    #[error("a slot of {bytes} bytes: it must be more than 0 and a multiple of 4")]
    SlotBytes {
        /// The size given.
        bytes: u64,
    },
    /// The tensor reaches past the end of the slot.
    #[error("the tensor {tensor} spans {span} bytes, more than the slot's {bytes}")]
    ExceedsSlot {
        /// The tensor, as text.
        tensor: String,
        /// Bytes from its first element to the end of its last.
        span: u64,
        /// The slot's size.
        bytes: u64,
    },
    /// A pixel-frame slot whose size or tensor differs from what its geometry says.
    #[error("{what} differs from the pixel frame's ({found} where the geometry says {expected})")]
    NotTheFrame {
        /// Which part (`bytes`, `tensor`).
        what: &'static str,
        /// What the description says.
        found: String,
        /// What the geometry says.
        expected: String,
    },
    /// Text that is not a tensor description (`DTYPE:D0xD1x...`, e.g. `f32:4x1024x1024`).
    #[error("{text:?} is not a tensor description of the form DTYPE:SHAPE, e.g. f32:4x1024x1024 ({reason})")]
    Syntax {
        /// The text given.
        text: String,
        /// What is wrong with it.
        reason: String,
    },
}

/// What a slot's tensor is: element type, shape (outermost first) and strides in elements (`None`: contiguous,
/// row-major), offsets counted from the slot's first byte. Valid once constructed (see the module docs).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct TensorDesc {
    dtype: DType,
    /// Whether strides follow the shape in `dims`.
    strided: bool,
    /// The shape, then the strides when given: one allocation, so that an offer stays small.
    dims: Box<[u64]>,
}

impl TensorDesc {
    /// A contiguous, row-major tensor.
    ///
    /// # Errors
    /// [`WireError::InvalidLayout`] naming the rule broken (see the module docs).
    pub fn contiguous(dtype: DType, shape: impl Into<Vec<u64>>) -> Result<Self, WireError> {
        Self::new(dtype, shape.into(), None)
    }

    /// A tensor with explicit strides, in elements (e.g. a transposed view, or rows padded to a pitch).
    ///
    /// # Errors
    /// As [`TensorDesc::contiguous`], and strides of another rank or too large.
    pub fn strided(dtype: DType, shape: impl Into<Vec<u64>>, strides: impl Into<Vec<u64>>) -> Result<Self, WireError> {
        Self::new(dtype, shape.into(), Some(strides.into()))
    }

    /// A tensor with optional strides; what the two constructors above and the decoder share.
    ///
    /// # Errors
    /// As [`TensorDesc::strided`].
    pub fn new(dtype: DType, shape: Vec<u64>, strides: Option<Vec<u64>>) -> Result<Self, WireError> {
        let invalid = |source| WireError::InvalidLayout { field: "tensor", source };
        if shape.len() > MAX_TENSOR_DIMS {
            return Err(invalid(LayoutError::TooManyDims { ndim: shape.len(), max: MAX_TENSOR_DIMS }));
        }
        if let Some((dim, &extent)) = shape.iter().enumerate().find(|(_, e)| !(1..=MAX_TENSOR_EXTENT).contains(*e)) {
            return Err(invalid(LayoutError::BadExtent { dim, extent }));
        }
        if let Some(strides) = &strides {
            if strides.len() != shape.len() {
                return Err(invalid(LayoutError::StrideCount { strides: strides.len(), ndim: shape.len() }));
            }
            if let Some((dim, &stride)) = strides.iter().enumerate().find(|(_, s)| **s > MAX_TENSOR_EXTENT) {
                return Err(invalid(LayoutError::StrideTooLarge { dim, stride }));
            }
        }
        let tensor = Self::trusted(dtype, shape, strides);
        match (tensor.checked_element_count(), tensor.checked_span_bytes()) {
            (Some(_), Some(_)) => Ok(tensor),
            _ => Err(invalid(LayoutError::TooLarge { dtype, shape: tensor.shape().to_vec() })),
        }
    }

    /// A description whose validity its caller has proven (a pixel frame's, see `FrameGeometry::tensor`; and
    /// [`TensorDesc::new`] before it checks the sizes).
    pub(super) fn trusted(dtype: DType, mut shape: Vec<u64>, strides: Option<Vec<u64>>) -> Self {
        let strided = strides.is_some();
        shape.extend(strides.unwrap_or_default());
        Self { dtype, strided, dims: shape.into_boxed_slice() }
    }

    /// Element type.
    pub const fn dtype(&self) -> DType {
        self.dtype
    }

    /// Extent of each dimension, outermost first (empty for a scalar).
    pub fn shape(&self) -> &[u64] {
        self.dims.get(..self.ndim()).unwrap_or_default()
    }

    /// The strides given, in elements; `None` for the contiguous row-major layout.
    pub fn strides(&self) -> Option<&[u64]> {
        self.strided.then(|| self.dims.get(self.ndim()..).unwrap_or_default())
    }

    /// Number of dimensions (0 to [`MAX_TENSOR_DIMS`]).
    pub fn ndim(&self) -> usize {
        if self.strided { self.dims.len() / 2 } else { self.dims.len() }
    }

    /// The strides, given or those of the contiguous row-major layout, in elements.
    pub fn strides_or_contiguous(&self) -> Vec<u64> {
        if let Some(strides) = self.strides() {
            return strides.to_vec();
        }
        let shape = self.shape();
        let mut strides = vec![1u64; shape.len()];
        for i in (0..shape.len().saturating_sub(1)).rev() {
            // Each suffix product is at most the element count, which construction bounded.
            strides[i] = strides[i + 1].saturating_mul(shape[i + 1]);
        }
        strides
    }

    /// Number of elements (the product of the shape; 1 for a scalar).
    pub fn element_count(&self) -> u64 {
        self.checked_element_count().unwrap_or(u64::MAX)
    }

    /// Bytes from the first element to the end of the last: what the tensor needs of its slot.
    pub fn span_bytes(&self) -> u64 {
        self.checked_span_bytes().unwrap_or(u64::MAX)
    }

    fn checked_element_count(&self) -> Option<u64> {
        self.shape().iter().try_fold(1u64, |n, &d| n.checked_mul(d)).filter(|n| *n <= MAX_TENSOR_EXTENT)
    }

    fn checked_span_bytes(&self) -> Option<u64> {
        let last = self
            .shape()
            .iter()
            .zip(self.strides_or_contiguous())
            .try_fold(0u64, |offset, (&d, s)| offset.checked_add(d.checked_sub(1)?.checked_mul(s)?))?;
        last.checked_add(1)?.checked_mul(self.dtype.size_bytes()).filter(|n| *n <= MAX_TENSOR_EXTENT)
    }
}

impl fmt::Display for TensorDesc {
    /// `float32 [4, 1024, 1024]`, with `strides [..]` when they are given.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {:?}", self.dtype, self.shape())?;
        if let Some(strides) = self.strides() {
            write!(f, " strides {strides:?}")?;
        }
        Ok(())
    }
}

impl FromStr for TensorDesc {
    type Err = WireError;

    /// Parses `DTYPE:SHAPE`, the command line's form: an element type ([`DType`]'s names), a colon, and the extents
    /// joined by `x` (`f32:4x1024x1024`, `u8:1080x1920x3`); a contiguous tensor.
    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let syntax = |reason: String| WireError::InvalidLayout {
            field: "tensor",
            source: LayoutError::Syntax { text: text.to_owned(), reason },
        };
        let (dtype, shape) = text.split_once(':').ok_or_else(|| syntax("no ':' after the element type".into()))?;
        let dtype: DType = dtype.parse().map_err(|e: UnknownName| syntax(e.to_string()))?;
        let shape = shape
            .split('x')
            .map(|extent| extent.trim().parse::<u64>().map_err(|e| syntax(format!("extent {extent:?}: {e}"))))
            .collect::<Result<Vec<u64>, _>>()?;
        Self::contiguous(dtype, shape)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn layout_error(result: Result<TensorDesc, WireError>) -> LayoutError {
        match result {
            Err(WireError::InvalidLayout { source, .. }) => source,
            other => panic!("expected InvalidLayout, got {other:?}"),
        }
    }

    #[test]
    fn codes_names_and_dlpack_types() {
        for d in DType::ALL {
            assert_eq!(DType::from_code(d.code(), "d").unwrap(), d);
            assert_eq!(d.name().parse::<DType>().unwrap(), d);
            assert_eq!(d.short_name().parse::<DType>().unwrap(), d);
            assert_eq!(u64::from(d.dlpack().bits), d.size_bytes() * 8);
        }
        assert!(matches!(DType::from_code(0, "d"), Err(WireError::UnknownCode { code: 0, .. })));
        assert!(matches!(DType::from_code(18, "d"), Err(WireError::UnknownCode { code: 18, .. })));
        assert_eq!(DType::BF16.dlpack(), DlpackDtype { code: 4, bits: 16, lanes: 1 });
        assert_eq!(DType::F8E4M3.dlpack(), DlpackDtype { code: 10, bits: 8, lanes: 1 });
        assert_eq!(DType::C64.dlpack(), DlpackDtype { code: 5, bits: 64, lanes: 1 });
        assert_eq!(DType::Bool.dlpack(), DlpackDtype { code: 6, bits: 8, lanes: 1 });
        let err = "float128".parse::<DType>().unwrap_err();
        assert!(err.to_string().contains("bf16"), "{err}");
    }

    #[test]
    fn spans_follow_shape_strides_and_element_size() {
        let t = TensorDesc::contiguous(DType::F32, [2, 3, 4]).unwrap();
        assert_eq!(t.strides_or_contiguous(), vec![12, 4, 1]);
        assert_eq!((t.element_count(), t.span_bytes()), (24, 96));
        // A transposed view of a 4 x 3 matrix, a broadcast (stride 0) row, a scalar, rows padded to a pitch.
        assert_eq!(TensorDesc::strided(DType::F16, [3, 4], [1, 3]).unwrap().span_bytes(), 24);
        assert_eq!(TensorDesc::strided(DType::U8, [5, 7], [0, 1]).unwrap().span_bytes(), 7);
        assert_eq!(TensorDesc::contiguous(DType::I64, []).unwrap().span_bytes(), 8);
        assert_eq!(TensorDesc::strided(DType::U8, [2, 3], [8, 1]).unwrap().span_bytes(), 11);
        assert_eq!(t.to_string(), "float32 [2, 3, 4]");
    }

    #[test]
    fn invalid_descriptions_say_which_rule_they_break() {
        assert_eq!(
            layout_error(TensorDesc::contiguous(DType::U8, [1; 9])),
            LayoutError::TooManyDims { ndim: 9, max: 8 }
        );
        assert_eq!(
            layout_error(TensorDesc::contiguous(DType::U8, [3, 0])),
            LayoutError::BadExtent { dim: 1, extent: 0 }
        );
        assert_eq!(
            layout_error(TensorDesc::contiguous(DType::U8, [u64::MAX])),
            LayoutError::BadExtent { dim: 0, extent: u64::MAX }
        );
        assert_eq!(
            layout_error(TensorDesc::strided(DType::U8, [3, 4], [4])),
            LayoutError::StrideCount { strides: 1, ndim: 2 }
        );
        assert_eq!(
            layout_error(TensorDesc::strided(DType::U8, [3, 4], [1 << 63, 1])),
            LayoutError::StrideTooLarge { dim: 0, stride: 1 << 63 }
        );
        assert!(matches!(
            layout_error(TensorDesc::contiguous(DType::F32, [1 << 32, 1 << 32])),
            LayoutError::TooLarge { dtype: DType::F32, .. }
        ));
        assert!(matches!(
            layout_error(TensorDesc::strided(DType::U8, [1 << 40, 2], [1 << 40, 1])),
            LayoutError::TooLarge { .. }
        ));
        // The span, not only the count: 2^61 eight-byte elements.
        assert!(matches!(layout_error(TensorDesc::contiguous(DType::F64, [1 << 61])), LayoutError::TooLarge { .. }));
    }

    #[test]
    fn the_command_line_form_parses() {
        let t: TensorDesc = "f32:4x1024x1024".parse().unwrap();
        assert_eq!((t.dtype(), t.shape(), t.strides()), (DType::F32, &[4, 1024, 1024][..], None));
        assert_eq!("bfloat16:7".parse::<TensorDesc>().unwrap().shape(), &[7]);
        for bad in ["f32", "f33:4", "f32:4xx2", "f32:0", "u8:-1"] {
            assert!(
                matches!(
                    bad.parse::<TensorDesc>(),
                    Err(WireError::InvalidLayout {
                        source: LayoutError::Syntax { .. } | LayoutError::BadExtent { .. },
                        ..
                    })
                ),
                "{bad}"
            );
        }
    }
}
