//! The optional tensor description of a named buffer: element type, shape and strides (in elements, as DLPack
//! and PyTorch count them), checked against the buffer's length.

use std::fmt;
use std::str::FromStr;

use crate::wire::UnknownName;

/// Most dimensions a tensor description has (the directory keeps eight shape and eight stride words per entry).
pub const MAX_DIMS: usize = 8;

/// Element type of a tensor description, with the names NumPy and PyTorch use.
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
}

impl DType {
    /// Every element type, in code order.
    pub const ALL: [Self; 15] = [
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
    ];

    /// Stable code in the directory (0 means "no tensor description").
    pub const fn code(self) -> u64 {
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
        }
    }

    /// Decodes [`DType::code`]; `None` for 0 and for codes this build does not know.
    pub fn from_code(code: u64) -> Option<Self> {
        Self::ALL.into_iter().find(|d| d.code() == code)
    }

    /// Bytes per element.
    pub const fn size_bytes(self) -> u64 {
        match self {
            Self::U8 | Self::I8 | Self::Bool | Self::F8E4M3 | Self::F8E5M2 => 1,
            Self::U16 | Self::I16 | Self::F16 | Self::BF16 => 2,
            Self::U32 | Self::I32 | Self::F32 => 4,
            Self::U64 | Self::I64 | Self::F64 => 8,
        }
    }

    /// The NumPy/PyTorch name (`float32`, `bfloat16`, ...).
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
        }
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for DType {
    type Err = UnknownName;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::ALL.into_iter().find(|d| d.name() == s).ok_or_else(|| UnknownName {
            what: "element type",
            given: s.to_owned(),
            known: Self::ALL.iter().map(|d| d.name()).collect(),
        })
    }
}

/// What a buffer holds, for consumers that make a tensor of it: element type, shape, and strides in elements
/// (`None`: contiguous, row-major). Offsets start at the buffer's first byte; strides are not negative.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct TensorDesc {
    /// Element type.
    pub dtype: DType,
    /// Extent of each dimension, outermost first (at most [`MAX_DIMS`]; empty for a scalar).
    pub shape: Vec<u64>,
    /// Elements to step for one index of each dimension; `None` for the contiguous row-major layout.
    pub strides: Option<Vec<u64>>,
}

impl TensorDesc {
    /// A contiguous, row-major tensor.
    pub fn contiguous(dtype: DType, shape: impl Into<Vec<u64>>) -> Self {
        Self { dtype, shape: shape.into(), strides: None }
    }

    /// A tensor with explicit strides (in elements).
    pub fn strided(dtype: DType, shape: impl Into<Vec<u64>>, strides: impl Into<Vec<u64>>) -> Self {
        Self { dtype, shape: shape.into(), strides: Some(strides.into()) }
    }

    /// The strides, explicit or those of the contiguous layout.
    pub fn strides_or_contiguous(&self) -> Vec<u64> {
        if let Some(strides) = &self.strides {
            return strides.clone();
        }
        let mut strides = vec![1u64; self.shape.len()];
        for i in (0..self.shape.len().saturating_sub(1)).rev() {
            strides[i] = strides[i + 1].saturating_mul(self.shape[i + 1]);
        }
        strides
    }

    /// Number of elements (the product of the shape; 1 for a scalar).
    pub fn element_count(&self) -> Option<u64> {
        self.shape.iter().try_fold(1u64, |n, &d| n.checked_mul(d))
    }

    /// Bytes from the buffer's start to the end of the last element (0 when the shape has a zero).
    pub fn extent_bytes(&self) -> Option<u64> {
        if self.shape.contains(&0) {
            return Some(0);
        }
        let last = self
            .shape
            .iter()
            .zip(self.strides_or_contiguous())
            .try_fold(0u64, |offset, (&d, s)| offset.checked_add((d - 1).checked_mul(s)?))?;
        last.checked_add(1)?.checked_mul(self.dtype.size_bytes())
    }

    /// Checks the description against a buffer of `len` bytes; the error says what is wrong.
    ///
    /// # Errors
    /// Too many dimensions, strides of another rank, or elements past the buffer's end.
    pub fn check(&self, len: u64) -> Result<(), String> {
        if self.shape.len() > MAX_DIMS {
            return Err(format!("{} dimensions, at most {MAX_DIMS}", self.shape.len()));
        }
        if let Some(strides) = &self.strides
            && strides.len() != self.shape.len()
        {
            return Err(format!("{} strides for {} dimensions", strides.len(), self.shape.len()));
        }
        match self.extent_bytes() {
            Some(extent) if extent <= len => Ok(()),
            Some(extent) => Err(format!(
                "a {} tensor of shape {:?} spans {extent} bytes, more than the buffer's {len}",
                self.dtype, self.shape
            )),
            None => Err(format!("the extent of shape {:?} overflows 64 bits", self.shape)),
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn codes_and_names_round_trip() {
        for d in DType::ALL {
            assert_eq!(DType::from_code(d.code()), Some(d));
            assert_eq!(d.name().parse::<DType>().unwrap(), d);
        }
        assert_eq!(DType::from_code(0), None);
        assert_eq!(DType::from_code(99), None);
        let err = "float128".parse::<DType>().unwrap_err();
        assert!(err.to_string().contains("bfloat16"), "{err}");
    }

    #[test]
    fn extents_follow_shape_strides_and_element_size() {
        let t = TensorDesc::contiguous(DType::F32, [2, 3, 4]);
        assert_eq!(t.strides_or_contiguous(), vec![12, 4, 1]);
        assert_eq!((t.element_count(), t.extent_bytes()), (Some(24), Some(96)));
        assert!(t.check(96).is_ok());
        assert!(t.check(95).unwrap_err().contains("spans 96 bytes"));
        // A transposed view of a 4 x 3 matrix, and a broadcast (stride 0) row.
        let transposed = TensorDesc::strided(DType::F16, [3, 4], [1, 3]);
        assert_eq!(transposed.extent_bytes(), Some(24));
        assert_eq!(TensorDesc::strided(DType::U8, [5, 7], [0, 1]).extent_bytes(), Some(7));
        assert_eq!(TensorDesc::contiguous(DType::I64, []).extent_bytes(), Some(8), "a scalar");
        assert_eq!(TensorDesc::contiguous(DType::I64, [3, 0]).extent_bytes(), Some(0));
        assert!(TensorDesc::contiguous(DType::U8, [1; 9]).check(1).unwrap_err().contains("at most 8"));
        assert!(TensorDesc::strided(DType::U8, [2, 2], [1]).check(4).unwrap_err().contains("1 strides"));
        assert!(TensorDesc::contiguous(DType::F64, [u64::MAX, 2]).check(8).unwrap_err().contains("overflows"));
    }
}
