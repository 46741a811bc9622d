//! Element types of tensors ([`DType`]), with their wire codes, names and DLPack types.

use std::fmt;
use std::str::FromStr;

use super::types::{UnknownCode, UnknownName};

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
    pub fn from_code(code: u16, field: &'static str) -> Result<Self, UnknownCode> {
        Self::ALL.into_iter().find(|d| d.code() == code).ok_or(UnknownCode { field, code: u32::from(code) })
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

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn codes_names_and_dlpack_types() {
        for d in DType::ALL {
            assert_eq!(DType::from_code(d.code(), "d").unwrap(), d);
            assert_eq!(d.name().parse::<DType>().unwrap(), d);
            assert_eq!(d.short_name().parse::<DType>().unwrap(), d);
            assert_eq!(u64::from(d.dlpack().bits), d.size_bytes() * 8);
        }
        assert!(matches!(DType::from_code(0, "d"), Err(UnknownCode { code: 0, .. })));
        assert!(matches!(DType::from_code(18, "d"), Err(UnknownCode { code: 18, .. })));
        assert_eq!(DType::BF16.dlpack(), DlpackDtype { code: 4, bits: 16, lanes: 1 });
        assert_eq!(DType::F8E4M3.dlpack(), DlpackDtype { code: 10, bits: 8, lanes: 1 });
        assert_eq!(DType::C64.dlpack(), DlpackDtype { code: 5, bits: 64, lanes: 1 });
        assert_eq!(DType::Bool.dlpack(), DlpackDtype { code: 6, bits: 8, lanes: 1 });
        let err = "float128".parse::<DType>().unwrap_err();
        assert!(err.to_string().contains("bf16"), "{err}");
    }
}
