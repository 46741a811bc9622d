//! The body of a semaphore's `ObjectOffer` (kind 2), byte for byte as `docs/protocol.md` specifies: 32 bytes,
//! little-endian, with one fd (the shared block's memfd).

use ipc_core::wire::WireError;
use ipc_core::wire::codec::{Reader, put_u32, put_u64};

/// Bytes of the body.
pub const SEMAPHORE_OFFER_BYTES: usize = 32;

/// File descriptors that travel with the offer: the shared block's memfd.
pub const SEMAPHORE_OFFER_FDS: usize = 1;

/// What the owner tells a connecting peer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SemaphoreOffer {
    /// Layout version of the shared block ([`super::layout::LAYOUT_VERSION`]).
    pub layout_version: u32,
    /// The peer record the owner claimed for this peer.
    pub record: u32,
    /// The claim's epoch (the record's state word holds it).
    pub epoch: u32,
    /// Peer records in use (the header's `max_peers`).
    pub max_peers: u32,
    /// Size of the memfd in bytes ([`super::layout::SHARED_BYTES`]).
    pub shared_bytes: u64,
    /// The owner's generation (the header's).
    pub generation: u64,
}

impl SemaphoreOffer {
    /// The body's bytes.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(SEMAPHORE_OFFER_BYTES);
        put_u32(&mut out, self.layout_version);
        put_u32(&mut out, self.record);
        put_u32(&mut out, self.epoch);
        put_u32(&mut out, self.max_peers);
        put_u64(&mut out, self.shared_bytes);
        put_u64(&mut out, self.generation);
        out
    }

    /// Decodes a body; any input gives a value or a [`WireError`] (the values are checked against the shared
    /// block when it is attached).
    ///
    /// # Errors
    /// [`WireError::Truncated`] or [`WireError::TrailingBytes`] for a body of another length than 32 bytes.
    pub fn decode(body: &[u8]) -> Result<Self, WireError> {
        let mut r = Reader::new(body, "semaphore offer body");
        let offer = Self {
            layout_version: r.u32()?,
            record: r.u32()?,
            epoch: r.u32()?,
            max_peers: r.u32()?,
            shared_bytes: r.u64()?,
            generation: r.u64()?,
        };
        r.finish()?;
        Ok(offer)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use ipc_core::wire::{HEADER_BYTES, Message, ObjectKind};

    /// The `object-offer-semaphore` example of `docs/protocol.md`: a whole message, whose body is this type's.
    fn golden_message() -> Vec<u8> {
        let doc = include_str!("../../../docs/protocol.md");
        let start = doc.find("```golden-hex object-offer-semaphore").unwrap();
        let block = &doc[start..];
        let block = &block[block.find('\n').unwrap()..block.find("\n```\n").unwrap()];
        block
            .lines()
            .flat_map(|line| {
                line.split_whitespace().take_while(|t| t.len() == 2 && t.chars().all(|c| c.is_ascii_hexdigit()))
            })
            .map(|t| u8::from_str_radix(t, 16).unwrap())
            .collect()
    }

    const GOLDEN: SemaphoreOffer = SemaphoreOffer {
        layout_version: 2,
        record: 3,
        epoch: 7,
        max_peers: 32,
        shared_bytes: 65536,
        generation: 0x0001_8765_4321,
    };

    #[test]
    fn the_golden_body_of_the_protocol_page_is_what_this_type_encodes_and_decodes() {
        let bytes = golden_message();
        let Message::ObjectOffer(offer) = Message::decode(&bytes).unwrap() else { panic!("not an ObjectOffer") };
        assert_eq!((offer.kind, offer.peer_id, offer.fd_count), (ObjectKind::Semaphore, 3, 1));
        assert_eq!(bytes.len(), HEADER_BYTES + 12 + SEMAPHORE_OFFER_BYTES);
        assert_eq!(SemaphoreOffer::decode(&offer.body).unwrap(), GOLDEN);
        assert_eq!(GOLDEN.encode(), offer.body);
    }

    #[test]
    fn a_body_of_another_length_is_refused() {
        let body = GOLDEN.encode();
        assert!(matches!(SemaphoreOffer::decode(&body[..31]), Err(WireError::Truncated { needed: 32, .. })));
        let mut long = body.clone();
        long.push(0);
        assert!(matches!(SemaphoreOffer::decode(&long), Err(WireError::TrailingBytes { extra: 1, .. })));
        assert!(matches!(SemaphoreOffer::decode(&[]), Err(WireError::Truncated { .. })));
    }
}
