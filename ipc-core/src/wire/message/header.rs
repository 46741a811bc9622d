//! The fixed 24-byte header in front of every payload.

use super::codec::{Reader, put_u16, put_u32};
use super::constants::{MAGIC, MAX_PAYLOAD_BYTES, OLDEST_PROTOCOL_VERSION, PROTOCOL_VERSION};
use crate::wire::codes::MessageType;
use crate::wire::error::WireError;

/// The fixed 24-byte header in front of every payload.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    /// Version the message is encoded in ([`OLDEST_PROTOCOL_VERSION`] to [`PROTOCOL_VERSION`]).
    pub version: u16,
    /// What the payload is.
    pub message_type: MessageType,
    /// Payload bytes following the header (at most [`MAX_PAYLOAD_BYTES`]).
    pub payload_len: u32,
    /// File descriptors attached to the message with `SCM_RIGHTS`.
    pub fd_count: u32,
}

impl Header {
    /// Decodes and checks the first [`HEADER_BYTES`](super::constants::HEADER_BYTES) of `bytes` (more may follow).
    ///
    /// Checks, in this order: length, magic, version, reserved bytes, message type, payload cap.
    pub fn decode(bytes: &[u8]) -> Result<Self, WireError> {
        let mut r = Reader::new(bytes, "header");
        let magic = r.array::<8>()?;
        if magic != MAGIC {
            return Err(WireError::BadMagic { found: magic });
        }
        let version = r.u16()?;
        let type_code = r.u16()?;
        let payload_len = r.u32()?;
        let fd_count = r.u32()?;
        let reserved = r.u32()?;
        if !(OLDEST_PROTOCOL_VERSION..=PROTOCOL_VERSION).contains(&version) {
            return Err(WireError::UnsupportedVersion {
                found: version,
                oldest: OLDEST_PROTOCOL_VERSION,
                newest: PROTOCOL_VERSION,
            });
        }
        if reserved != 0 {
            return Err(WireError::ReservedNotZero { field: "header.reserved" });
        }
        let message_type =
            MessageType::from_code(type_code).map_err(|_| WireError::UnknownMessageType { code: type_code })?;
        if payload_len > MAX_PAYLOAD_BYTES {
            return Err(WireError::PayloadTooLarge { len: payload_len, max: MAX_PAYLOAD_BYTES });
        }
        Ok(Self { version, message_type, payload_len, fd_count })
    }

    pub(super) fn encode_into(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&MAGIC);
        put_u16(out, self.version);
        put_u16(out, self.message_type.code());
        put_u32(out, self.payload_len);
        put_u32(out, self.fd_count);
        put_u32(out, 0);
    }
}
