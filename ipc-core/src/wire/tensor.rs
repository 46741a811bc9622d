//! Tensor descriptions: an element type ([`DType`], with its DLPack code: `dtype.rs`), a shape and optional strides in
//! elements, as DLPack and PyTorch count them. Always valid once constructed: at most [`MAX_TENSOR_DIMS`]
//! dimensions, every extent at least 1, and every extent, stride and span at most [`MAX_TENSOR_EXTENT`] (DLPack's
//! signed 64-bit counts), computed without overflow.

use std::fmt;
use std::str::FromStr;

use super::dtype::DType;
use super::error::{LayoutError, WireError};
use super::types::UnknownName;

/// Most dimensions a tensor description has (the wire carries at most eight shape and eight stride words).
pub const MAX_TENSOR_DIMS: usize = 8;

/// Largest extent, stride, element count or byte span of a tensor description: `i64::MAX`, since DLPack and
/// PyTorch count in signed 64-bit integers, so every value converts without loss.
pub const MAX_TENSOR_EXTENT: u64 = i64::MAX as u64;

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
        // No allocation: a weight set's switch asks this of 19,000 tensors (strides_or_contiguous made a Vec each).
        let last = match self.strides() {
            Some(strides) => self
                .shape()
                .iter()
                .zip(strides)
                .try_fold(0u64, |offset, (&d, &s)| offset.checked_add(d.checked_sub(1)?.checked_mul(s)?))?,
            // Contiguous: the last element is at the element count less one (none for an extent of 0, as above).
            None => self
                .shape()
                .iter()
                .try_fold(1u64, |n, &d| n.checked_mul(d.checked_sub(1).map(|_| d)?))?
                .checked_sub(1)?,
        };
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

    /// A contiguous description's span (computed without its strides) equals that of the same shape given its
    /// contiguous strides, for every shape of rank 0 to 3 with extents 0, 1, 2, 3 and 7.
    #[test]
    fn a_contiguous_span_equals_the_span_of_its_strides_written_out() {
        let extents = [0u64, 1, 2, 3, 7];
        let mut shapes: Vec<Vec<u64>> = vec![vec![]];
        let mut last: Vec<Vec<u64>> = vec![vec![]];
        for _ in 0..3 {
            last = last.iter().flat_map(|s| extents.iter().map(move |&e| [s.clone(), vec![e]].concat())).collect();
            shapes.extend(last.iter().cloned());
        }
        assert_eq!(shapes.len(), 1 + 5 + 25 + 125);
        for shape in &shapes {
            let (Ok(c), Ok(d)) =
                (TensorDesc::contiguous(DType::F16, shape.clone()), TensorDesc::contiguous(DType::F16, shape.clone()))
            else {
                continue;
            };
            let strided = TensorDesc::strided(DType::F16, shape.clone(), d.strides_or_contiguous());
            if let Ok(strided) = strided {
                assert_eq!(c.span_bytes(), strided.span_bytes(), "shape {shape:?}");
            }
        }
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
