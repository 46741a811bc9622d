//! The body of a semaphore's `ObjectOffer` (kind 2), byte for byte as `docs/protocol.md` specifies: 112 bytes,
//! little-endian, with the shared block's memfd and, on the vmm backend, the fd of the count's device allocation.

use crate::wire::codec::{Reader, put_u16, put_u32, put_u64};
use crate::wire::{BackendKind, HandleType, IPC_HANDLE_BYTES, IpcHandleBytes, WireError};

use super::layout::CountPlace;

/// Bytes of the body.
pub const SEMAPHORE_OFFER_BYTES: usize = 112;

/// File descriptors that travel with the offer at least: the shared block's memfd (then the count's, if any).
pub const SEMAPHORE_OFFER_FDS: usize = 1;

/// Where the count lives and how an importer maps it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OfferedCount {
    /// In the shared block (the host backend).
    Block,
    /// In a device allocation of `backend`'s, `bytes` long: its `CUipcMemHandle` in the body (legacy), or the
    /// offer's second fd (vmm).
    Device {
        /// The owner's backend, which exported the allocation.
        backend: BackendKind,
        /// Size of the allocation to import.
        bytes: u64,
        /// The legacy backend's handle.
        legacy_mem_handle: Option<IpcHandleBytes>,
    },
}

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
    /// Where the count lives.
    pub count: OfferedCount,
}

impl SemaphoreOffer {
    /// The fds that travel with the offer: the block's memfd, and the count's allocation on an fd backend.
    pub fn fd_count(&self) -> usize {
        match self.count {
            OfferedCount::Device { backend, .. } if backend.handle_type() != HandleType::LegacyIpc => 2,
            _ => 1,
        }
    }

    /// The body's bytes.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(SEMAPHORE_OFFER_BYTES);
        put_u32(&mut out, self.layout_version);
        put_u32(&mut out, self.record);
        put_u32(&mut out, self.epoch);
        put_u32(&mut out, self.max_peers);
        put_u64(&mut out, self.shared_bytes);
        put_u64(&mut out, self.generation);
        let (place, backend, bytes, handle) = match self.count {
            OfferedCount::Block => (CountPlace::Block, 0, 0, None),
            OfferedCount::Device { backend, bytes, legacy_mem_handle } => {
                (CountPlace::Device, backend.code(), bytes, legacy_mem_handle)
            }
        };
        put_u16(&mut out, place as u16);
        put_u16(&mut out, backend);
        put_u32(&mut out, 0);
        put_u64(&mut out, bytes);
        out.extend_from_slice(&handle.unwrap_or([0; IPC_HANDLE_BYTES]));
        out
    }

    /// Decodes a body; the count's fields are checked here, the others against the shared block when it is
    /// attached.
    ///
    /// # Errors
    /// [`WireError::Truncated`] or [`WireError::TrailingBytes`] for a body of another length than 112 bytes; an
    /// unknown count place or backend, a count in the block with device fields set, a device count of zero bytes,
    /// or a legacy handle where the backend has none.
    pub fn decode(body: &[u8]) -> Result<Self, WireError> {
        let invalid = |field: &'static str, reason: String| WireError::InvalidField { field, reason };
        let mut r = Reader::new(body, "semaphore offer body");
        let (layout_version, record, epoch, max_peers) = (r.u32()?, r.u32()?, r.u32()?, r.u32()?);
        let (shared_bytes, generation) = (r.u64()?, r.u64()?);
        let place = r.u16()?;
        let backend = r.u16()?;
        r.reserved_u32("semaphore.reserved")?;
        let bytes = r.u64()?;
        let handle: IpcHandleBytes = r.array()?;
        r.finish()?;
        let count = match CountPlace::from_raw(u64::from(place)) {
            Some(CountPlace::Block) => {
                if backend != 0 || bytes != 0 || handle != [0; IPC_HANDLE_BYTES] {
                    return Err(WireError::ReservedNotZero { field: "semaphore.count (in the block)" });
                }
                OfferedCount::Block
            }
            Some(CountPlace::Device) => {
                let backend = BackendKind::from_code(backend, "semaphore.count_backend")?;
                if !backend.is_gpu() {
                    return Err(invalid("semaphore.count_backend", format!("{backend} has no device memory")));
                }
                if bytes < 8 {
                    return Err(invalid("semaphore.count_bytes", format!("{bytes}: the count needs 8 bytes")));
                }
                let legacy = backend.handle_type() == HandleType::LegacyIpc;
                if !legacy && handle != [0; IPC_HANDLE_BYTES] {
                    return Err(WireError::ReservedNotZero { field: "semaphore.legacy_mem_handle" });
                }
                OfferedCount::Device { backend, bytes, legacy_mem_handle: legacy.then_some(handle) }
            }
            None => return Err(WireError::UnknownCode { field: "semaphore.count_place", code: u32::from(place) }),
        };
        Ok(Self { layout_version, record, epoch, max_peers, shared_bytes, generation, count })
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::wire::{HEADER_BYTES, Message, ObjectKind};

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
        layout_version: 3,
        record: 3,
        epoch: 7,
        max_peers: 32,
        shared_bytes: 65536,
        generation: 0x0001_8765_4321,
        count: OfferedCount::Device { backend: BackendKind::Vmm, bytes: 2 << 20, legacy_mem_handle: None },
    };

    #[test]
    fn the_golden_body_of_the_protocol_page_is_what_this_type_encodes_and_decodes() {
        let bytes = golden_message();
        let Message::ObjectOffer(offer) = Message::decode(&bytes).unwrap() else { panic!("not an ObjectOffer") };
        assert_eq!((offer.kind, offer.peer_id, offer.fd_count), (ObjectKind::Semaphore, 3, 2));
        assert_eq!(GOLDEN.fd_count(), 2);
        assert_eq!(bytes.len(), HEADER_BYTES + 12 + SEMAPHORE_OFFER_BYTES);
        assert_eq!(SemaphoreOffer::decode(&offer.body).unwrap(), GOLDEN);
        assert_eq!(GOLDEN.encode(), offer.body);
    }

    #[test]
    fn a_body_of_another_length_is_refused() {
        let body = GOLDEN.encode();
        assert!(matches!(SemaphoreOffer::decode(&body[..111]), Err(WireError::Truncated { .. })));
        let mut long = body.clone();
        long.push(0);
        assert!(matches!(SemaphoreOffer::decode(&long), Err(WireError::TrailingBytes { extra: 1, .. })));
        assert!(matches!(SemaphoreOffer::decode(&[]), Err(WireError::Truncated { .. })));
    }

    #[test]
    fn every_count_place_round_trips_and_broken_count_fields_are_named() {
        let handle = [7u8; IPC_HANDLE_BYTES];
        for count in [
            OfferedCount::Block,
            OfferedCount::Device { backend: BackendKind::Vmm, bytes: 2 << 20, legacy_mem_handle: None },
            OfferedCount::Device { backend: BackendKind::Legacy, bytes: 512, legacy_mem_handle: Some(handle) },
        ] {
            let offer = SemaphoreOffer { count, ..GOLDEN };
            let body = offer.encode();
            assert_eq!(body.len(), SEMAPHORE_OFFER_BYTES);
            assert_eq!(SemaphoreOffer::decode(&body).unwrap(), offer);
        }
        let fds = |count| SemaphoreOffer { count, ..GOLDEN }.fd_count();
        assert_eq!(fds(OfferedCount::Block), 1);
        assert_eq!(
            fds(OfferedCount::Device { backend: BackendKind::Legacy, bytes: 8, legacy_mem_handle: Some(handle) }),
            1
        );
        let field = |body: &[u8]| match SemaphoreOffer::decode(body) {
            Err(WireError::InvalidField { field, .. } | WireError::ReservedNotZero { field }) => field.to_owned(),
            Err(WireError::UnknownCode { field, .. }) => field.to_owned(),
            other => format!("{other:?}"),
        };
        let body = GOLDEN.encode();
        let mut b = body.clone();
        b[32] = 9;
        assert_eq!(field(&b), "semaphore.count_place");
        let mut b = body.clone();
        b[34] = 3; // the host backend has no device memory
        assert_eq!(field(&b), "semaphore.count_backend");
        let mut b = body.clone();
        b[40..48].copy_from_slice(&4u64.to_le_bytes());
        assert_eq!(field(&b), "semaphore.count_bytes");
        let mut b = body.clone();
        b[60] = 1; // a legacy handle on vmm
        assert_eq!(field(&b), "semaphore.legacy_mem_handle");
        let mut b = SemaphoreOffer { count: OfferedCount::Block, ..GOLDEN }.encode();
        b[40] = 1;
        assert_eq!(field(&b), "semaphore.count (in the block)");
        let mut b = body;
        b[36] = 1;
        assert_eq!(field(&b), "semaphore.reserved");
    }
}
