//! Little-endian field writers and the bounds-checked [`Reader`] every payload decoder uses.

use crate::wire::error::WireError;

/// `InvalidField` when `text` is longer than `max` bytes.
pub fn check_text(text: &str, max: usize, field: &'static str) -> Result<(), WireError> {
    if text.len() > max {
        return Err(WireError::InvalidField { field, reason: format!("{} bytes, at most {max}", text.len()) });
    }
    Ok(())
}

/// Saturating length conversions: callers have already bounded the values, and a saturated
/// value is caught by the cap checks rather than silently wrapping.
pub fn len_u32(len: usize) -> u32 {
    u32::try_from(len).unwrap_or(u32::MAX)
}

/// As [`len_u32`], for 16-bit length fields.
pub fn len_u16(len: usize) -> u16 {
    u16::try_from(len).unwrap_or(u16::MAX)
}

/// Appends `value`, little-endian.
pub fn put_u16(out: &mut Vec<u8>, value: u16) {
    out.extend_from_slice(&value.to_le_bytes());
}

/// Appends `value`, little-endian.
pub fn put_u32(out: &mut Vec<u8>, value: u32) {
    out.extend_from_slice(&value.to_le_bytes());
}

/// Appends `value`, little-endian.
pub fn put_u64(out: &mut Vec<u8>, value: u64) {
    out.extend_from_slice(&value.to_le_bytes());
}

/// Bounds-checked little-endian cursor; every read that runs past the end is `Truncated`.
pub struct Reader<'a> {
    bytes: &'a [u8],
    pos: usize,
    what: &'static str,
}

impl<'a> Reader<'a> {
    /// A reader over `bytes`; `what` names the message in errors.
    pub fn new(bytes: &'a [u8], what: &'static str) -> Self {
        Self { bytes, pos: 0, what }
    }

    /// Bytes not read yet.
    pub fn remaining(&self) -> usize {
        self.bytes.len() - self.pos
    }

    /// The next `n` bytes.
    pub fn take(&mut self, n: usize) -> Result<&'a [u8], WireError> {
        let slice =
            self.pos.checked_add(n).and_then(|end| self.bytes.get(self.pos..end)).ok_or(WireError::Truncated {
                what: self.what,
                needed: self.pos.saturating_add(n),
                available: self.bytes.len(),
            })?;
        self.pos += n;
        Ok(slice)
    }

    /// The next `N` bytes as an array.
    pub fn array<const N: usize>(&mut self) -> Result<[u8; N], WireError> {
        let mut out = [0u8; N];
        out.copy_from_slice(self.take(N)?);
        Ok(out)
    }

    /// The next little-endian u16.
    pub fn u16(&mut self) -> Result<u16, WireError> {
        Ok(u16::from_le_bytes(self.array()?))
    }

    /// The next little-endian u32.
    pub fn u32(&mut self) -> Result<u32, WireError> {
        Ok(u32::from_le_bytes(self.array()?))
    }

    /// The next little-endian u64.
    pub fn u64(&mut self) -> Result<u64, WireError> {
        Ok(u64::from_le_bytes(self.array()?))
    }

    /// A reserved u16 that must be zero.
    pub fn reserved_u16(&mut self, field: &'static str) -> Result<(), WireError> {
        match self.u16()? {
            0 => Ok(()),
            _ => Err(WireError::ReservedNotZero { field }),
        }
    }

    /// A reserved u32 that must be zero.
    pub fn reserved_u32(&mut self, field: &'static str) -> Result<(), WireError> {
        match self.u32()? {
            0 => Ok(()),
            _ => Err(WireError::ReservedNotZero { field }),
        }
    }

    /// The next `len` bytes as UTF-8.
    pub fn text(&mut self, len: usize, field: &'static str) -> Result<String, WireError> {
        let bytes = self.take(len)?;
        std::str::from_utf8(bytes).map(str::to_owned).map_err(|_| WireError::InvalidUtf8 { field })
    }

    /// `TrailingBytes` unless everything was read.
    pub fn finish(&self) -> Result<(), WireError> {
        match self.remaining() {
            0 => Ok(()),
            extra => Err(WireError::TrailingBytes { message: self.what, extra }),
        }
    }
}
