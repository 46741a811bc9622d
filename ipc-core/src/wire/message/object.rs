//! [`ObjectOffer`]: what the owner of a toolkit object other than a ring (pool, semaphore, work queue) answers a
//! valid hello with. The body is the object's own encoding, specified beside it in `docs/protocol.md`.

use super::codec::{Reader, len_u32, put_u16, put_u32};
use super::constants::{MAX_FDS_PER_MESSAGE, MAX_PAYLOAD_BYTES};
use crate::wire::error::WireError;
use crate::wire::types::ObjectKind;

/// Bytes of an [`ObjectOffer`] payload before its body.
pub const OBJECT_OFFER_FIXED_BYTES: usize = 12;

/// Owner -> client: the peer number assigned, the object's description and how many fds travel with it.
///
/// Payload: `kind` u16, `fd_count` u16, `peer_id` u32, `body_len` u32, then `body_len` bytes of body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ObjectOffer {
    /// What the socket serves; never [`ObjectKind::Ring`] (a ring answers with a `RingOffer`).
    pub kind: ObjectKind,
    /// The peer number the owner assigned; the client answers `Attached` with it.
    pub peer_id: u32,
    /// File descriptors sent with the message, at most [`MAX_FDS_PER_MESSAGE`].
    pub fd_count: u16,
    /// The object's own description.
    pub body: Vec<u8>,
}

pub(super) fn encode_object_offer(offer: &ObjectOffer, out: &mut Vec<u8>) -> Result<(), WireError> {
    check(offer.kind, offer.fd_count, offer.body.len())?;
    put_u16(out, offer.kind.code());
    put_u16(out, offer.fd_count);
    put_u32(out, offer.peer_id);
    put_u32(out, len_u32(offer.body.len()));
    out.extend_from_slice(&offer.body);
    Ok(())
}

pub(super) fn decode_object_offer(r: &mut Reader<'_>) -> Result<ObjectOffer, WireError> {
    let kind = ObjectKind::from_code(r.u16()?, "ObjectOffer.kind")?;
    let fd_count = r.u16()?;
    let peer_id = r.u32()?;
    let body_len = r.u32()? as usize;
    check(kind, fd_count, body_len)?;
    let body = r.take(body_len)?.to_vec();
    Ok(ObjectOffer { kind, peer_id, fd_count, body })
}

fn check(kind: ObjectKind, fd_count: u16, body_len: usize) -> Result<(), WireError> {
    if kind == ObjectKind::Ring {
        return Err(WireError::InvalidField {
            field: "ObjectOffer.kind",
            reason: "a ring is offered with a RingOffer, never an ObjectOffer".to_owned(),
        });
    }
    if usize::from(fd_count) > MAX_FDS_PER_MESSAGE {
        return Err(WireError::InvalidField {
            field: "ObjectOffer.fd_count",
            reason: format!("{fd_count}, at most {MAX_FDS_PER_MESSAGE}"),
        });
    }
    let max = MAX_PAYLOAD_BYTES as usize - OBJECT_OFFER_FIXED_BYTES;
    if body_len > max {
        return Err(WireError::InvalidField {
            field: "ObjectOffer.body_len",
            reason: format!("{body_len} bytes, at most {max}"),
        });
    }
    Ok(())
}
