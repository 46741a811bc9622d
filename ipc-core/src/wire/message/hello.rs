//! What a consumer says: [`ClientHello`], [`Attached`], [`Detach`], and the hello's payload codec.

use super::codec::{Reader, check_text, len_u16, put_u16, put_u32};
use super::constants::{MAX_CONSUMER_NAME_BYTES, PROTOCOL_VERSION};
use crate::wire::codes::DetachReason;
use crate::wire::error::WireError;
use crate::wire::types::{BackendKind, ObjectKind};

/// Consumer -> producer: who is asking and what it wants.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientHello {
    /// Highest protocol version the client speaks (at least 1, and at least the version the hello is encoded in);
    /// the answer comes in [`ClientHello::agreed_version`].
    pub protocol_version: u16,
    /// The consumer's pid, as it sees itself (the producer trusts `SO_PEERCRED` instead; this
    /// one is for logs and for spotting a PID-namespace boundary).
    pub client_pid: u32,
    /// The backend the consumer was built or configured for; `None` accepts any.
    pub wanted_backend: Option<BackendKind>,
    /// A name for logs, at most [`MAX_CONSUMER_NAME_BYTES`] bytes of UTF-8.
    pub consumer_name: String,
    /// What the client expects the socket to serve (a ring unless it says otherwise; the field was a reserved
    /// zero before the toolkit's other objects existed, so every older ring consumer says "ring").
    pub object: ObjectKind,
    /// Which part of a pool made of parts the client asks for (a weight set on several devices serves one part per
    /// device through one socket); 0 for a pool of one part and for every other object. Encoded only when it is
    /// not 0, as 4 bytes after the name, so a hello of part 0 is byte for byte what older releases send; an owner
    /// of an older release refuses a hello that names a part (its bytes after the name are a malformed hello,
    /// code 6) rather than serve part 0 in its place.
    pub part: u32,
}

impl ClientHello {
    /// The version both sides speak from the answer to this hello on: the older of the one it announces and this
    /// build's newest ([`PROTOCOL_VERSION`]).
    pub fn agreed_version(&self) -> u16 {
        self.protocol_version.clamp(1, PROTOCOL_VERSION)
    }
}

/// Consumer -> producer: the ring is imported; count this consumer in back-pressure from now on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Attached {
    /// The id the offer assigned.
    pub consumer_id: u32,
}

/// Consumer -> producer: the consumer leaves (reason 1, after its ring-level detach) or could not import the
/// offer (reason 3, instead of [`Attached`]); it closes the connection next.
///
/// Advisory after `Attached`: the producer reads nothing from an attached consumer's connection, and goes by the
/// consumer's record in the control block when the connection hangs up (DETACHED: it left; still LIVE: it is
/// lost). During the handshake it ends the handshake and frees the record. See `docs/protocol.md`, "Leaving".
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Detach {
    /// The consumer leaving or being removed.
    pub consumer_id: u32,
    /// Why.
    pub reason: DetachReason,
}

pub(super) fn encode_hello(hello: &ClientHello, out: &mut Vec<u8>) -> Result<(), WireError> {
    if hello.protocol_version == 0 {
        return Err(WireError::InvalidField {
            field: "ClientHello.protocol_version",
            reason: "must be at least 1".to_owned(),
        });
    }
    check_text(&hello.consumer_name, MAX_CONSUMER_NAME_BYTES, "ClientHello.consumer_name")?;
    put_u16(out, hello.protocol_version);
    put_u16(out, hello.wanted_backend.map_or(0, BackendKind::code));
    put_u32(out, hello.client_pid);
    put_u16(out, len_u16(hello.consumer_name.len()));
    put_u16(out, hello.object.code());
    out.extend_from_slice(hello.consumer_name.as_bytes());
    if hello.part != 0 {
        if hello.object != ObjectKind::Pool {
            return Err(WireError::InvalidField {
                field: "ClientHello.part",
                reason: format!("part {} of a {}: only a pool is made of parts", hello.part, hello.object),
            });
        }
        put_u32(out, hello.part);
    }
    Ok(())
}

pub(super) fn decode_hello(r: &mut Reader<'_>) -> Result<ClientHello, WireError> {
    let protocol_version = r.u16()?;
    if protocol_version == 0 {
        return Err(WireError::InvalidField {
            field: "ClientHello.protocol_version",
            reason: "must be at least 1".to_owned(),
        });
    }
    let wanted_backend = match r.u16()? {
        0 => None,
        code => Some(BackendKind::from_code(code, "ClientHello.wanted_backend")?),
    };
    let client_pid = r.u32()?;
    let name_len = usize::from(r.u16()?);
    let object = ObjectKind::from_code(r.u16()?, "ClientHello.object")?;
    if name_len > MAX_CONSUMER_NAME_BYTES {
        return Err(WireError::InvalidField {
            field: "ClientHello.name_len",
            reason: format!("{name_len} bytes, at most {MAX_CONSUMER_NAME_BYTES}"),
        });
    }
    let consumer_name = r.text(name_len, "ClientHello.consumer_name")?;
    // The part, when 4 bytes follow the name (other lengths are trailing bytes, refused by the caller's finish).
    let part = if r.remaining() == 4 {
        match r.u32()? {
            // One encoding per hello: part 0 is said by no bytes at all.
            0 => {
                return Err(WireError::InvalidField {
                    field: "ClientHello.part",
                    reason: "0 written out (part 0 is sent as no bytes)".to_owned(),
                });
            }
            part => part,
        }
    } else {
        0
    };
    if part != 0 && object != ObjectKind::Pool {
        return Err(WireError::InvalidField {
            field: "ClientHello.part",
            reason: format!("part {part} of a {object}: only a pool is made of parts"),
        });
    }
    Ok(ClientHello { protocol_version, client_pid, wanted_backend, consumer_name, object, part })
}
