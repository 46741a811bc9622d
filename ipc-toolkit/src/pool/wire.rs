//! The pool's bytes on the wire: the body of its `ObjectOffer` ([`PoolOffer`]) and the two fixed-size messages of
//! the block channel ([`BlockRequest`], [`BlockReply`]), little-endian, as `docs/protocol.md` specifies them.
//!
//! The offer travels with three fds: the directory memfd (sealed, to map read-only), this importer's pin table
//! memfd (to map read-write) and the importer's end of the block channel, a connected `SOCK_STREAM` Unix socket
//! on which the importer asks for the handle of a block the first time an entry it looks up lies in it.

use super::layout::{BlockId, Geometry, LAYOUT_VERSION};
use gpu_ipc_driver::DeviceUuid;
use ipc_core::backend::MAX_SPAN_ALLOCATIONS;
use ipc_core::wire::codec::{Reader, put_u16, put_u32, put_u64};
use ipc_core::wire::{BackendKind, IPC_HANDLE_BYTES, IpcHandleBytes, MAX_FDS_PER_MESSAGE, WireError};

/// Bytes of a [`PoolOffer`] body.
pub const POOL_OFFER_BYTES: usize = 64;
/// Fds that travel with a pool's offer.
pub const POOL_OFFER_FDS: usize = 3;
/// Position of the directory memfd in the offer's fds.
pub const DIRECTORY_FD_INDEX: usize = 0;
/// Position of the pin table memfd.
pub const PINS_FD_INDEX: usize = 1;
/// Position of the block channel socket.
pub const CHANNEL_FD_INDEX: usize = 2;
/// Bytes of a [`BlockRequest`].
pub const BLOCK_REQUEST_BYTES: usize = 16;
/// Bytes of a [`BlockReply`].
pub const BLOCK_REPLY_BYTES: usize = 96;
/// Allocations one [`BlockPieces`] message describes at most (one fd each): [`MAX_FDS_PER_MESSAGE`].
pub const PIECES_PER_MESSAGE: usize = MAX_FDS_PER_MESSAGE;
/// Bytes of a [`BlockPieces`] message: a 16-byte head and 16 bytes per allocation it can describe.
pub const BLOCK_PIECES_BYTES: usize = 16 + 16 * PIECES_PER_MESSAGE;

/// The `ObjectOffer` body of a pool: what an importer needs to map its directory and pin table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PoolOffer {
    /// The pool's backend.
    pub backend: BackendKind,
    /// The owner's pid, as it sees itself (for logs).
    pub owner_pid: u32,
    /// Tells this pool instance from an earlier one at the same path; equals the directory's `POOL_ID`.
    pub pool_id: u64,
    /// Entry slots and block records of the directory.
    pub geometry: Geometry,
    /// Size of the directory memfd (must equal what the geometry gives).
    pub directory_bytes: u64,
    /// Size of the pin table memfd (must equal what the geometry gives).
    pub pins_bytes: u64,
    /// The GPU holding the pool's memory (all zero on the host backend).
    pub device_uuid: DeviceUuid,
}

impl PoolOffer {
    /// The body's bytes.
    ///
    /// # Errors
    /// [`WireError::InvalidField`] for an offer that breaks the rules [`PoolOffer::decode`] checks.
    pub fn encode(&self) -> Result<Vec<u8>, WireError> {
        self.validate()?;
        let mut out = Vec::with_capacity(POOL_OFFER_BYTES);
        put_u16(&mut out, LAYOUT_VERSION as u16);
        put_u16(&mut out, self.backend.code());
        put_u32(&mut out, self.owner_pid);
        put_u64(&mut out, self.pool_id);
        put_u32(&mut out, self.geometry.entry_slots);
        put_u32(&mut out, self.geometry.block_slots);
        put_u64(&mut out, self.directory_bytes);
        put_u64(&mut out, self.pins_bytes);
        out.extend_from_slice(&self.device_uuid.0);
        put_u32(&mut out, 0);
        put_u32(&mut out, 0);
        Ok(out)
    }

    /// Decodes and checks a body.
    ///
    /// # Errors
    /// A body of another length or layout version, an unknown backend, sizes that do not follow from the
    /// geometry, reserved fields that are not zero.
    pub fn decode(body: &[u8]) -> Result<Self, WireError> {
        let mut r = Reader::new(body, "pool offer");
        let version = r.u16()?;
        if u64::from(version) != LAYOUT_VERSION {
            return Err(WireError::InvalidField {
                field: "PoolOffer.layout_version",
                reason: format!(
                    "{version}; this build reads pool layout {LAYOUT_VERSION}: use the same gpu-ipc version"
                ),
            });
        }
        let backend = BackendKind::from_code(r.u16()?, "PoolOffer.backend")?;
        let owner_pid = r.u32()?;
        let pool_id = r.u64()?;
        let geometry = Geometry { entry_slots: r.u32()?, block_slots: r.u32()? };
        let directory_bytes = r.u64()?;
        let pins_bytes = r.u64()?;
        let device_uuid = DeviceUuid(r.array()?);
        r.reserved_u32("PoolOffer.reserved")?;
        r.reserved_u32("PoolOffer.reserved")?;
        r.finish()?;
        let offer = Self { backend, owner_pid, pool_id, geometry, directory_bytes, pins_bytes, device_uuid };
        offer.validate()?;
        Ok(offer)
    }

    fn validate(&self) -> Result<(), WireError> {
        let invalid = |field, reason| WireError::InvalidField { field, reason };
        self.geometry.check().map_err(|reason| invalid("PoolOffer.entry_slots", reason))?;
        if self.directory_bytes != self.geometry.directory_bytes() as u64 {
            let reason = format!("{}, the geometry gives {}", self.directory_bytes, self.geometry.directory_bytes());
            return Err(invalid("PoolOffer.directory_bytes", reason));
        }
        if self.pins_bytes != self.geometry.pins_bytes() as u64 {
            let reason = format!("{}, the geometry gives {}", self.pins_bytes, self.geometry.pins_bytes());
            return Err(invalid("PoolOffer.pins_bytes", reason));
        }
        Ok(())
    }
}

/// Importer -> owner on the block channel: "send me the handle of this block".
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BlockRequest {
    /// The block, as the directory entry names it.
    pub block: BlockId,
}

/// Type code of a [`BlockRequest`].
const REQUEST_TYPE: u16 = 1;
/// Type codes of a [`BlockReply`].
const GRANT_TYPE: u16 = 2;
const GONE_TYPE: u16 = 3;
/// Type code of a [`BlockPieces`] message.
const PIECES_TYPE: u16 = 4;

impl BlockRequest {
    /// The request's bytes.
    pub fn encode(&self) -> [u8; BLOCK_REQUEST_BYTES] {
        let mut out = Vec::with_capacity(BLOCK_REQUEST_BYTES);
        put_u16(&mut out, REQUEST_TYPE);
        put_u16(&mut out, 0);
        put_u32(&mut out, self.block.index);
        put_u32(&mut out, self.block.serial);
        put_u32(&mut out, 0);
        let mut bytes = [0u8; BLOCK_REQUEST_BYTES];
        bytes.copy_from_slice(&out);
        bytes
    }

    /// Decodes a request.
    ///
    /// # Errors
    /// Another type code, or reserved bytes that are not zero.
    pub fn decode(bytes: &[u8; BLOCK_REQUEST_BYTES]) -> Result<Self, WireError> {
        let mut r = Reader::new(bytes, "block request");
        let kind = r.u16()?;
        if kind != REQUEST_TYPE {
            return Err(WireError::InvalidField { field: "BlockRequest.type", reason: format!("{kind}, expected 1") });
        }
        r.reserved_u16("BlockRequest.reserved")?;
        let block = BlockId { index: r.u32()?, serial: r.u32()? };
        r.reserved_u32("BlockRequest.reserved")?;
        Ok(Self { block })
    }
}

/// Owner -> importer on the block channel: the block's handle, or that the block is gone.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BlockReply {
    /// The handle; the block's fd (vmm, host) travels with the message.
    Grant {
        /// The block.
        block: BlockId,
        /// Bytes to map.
        bytes: u64,
        /// The `CUipcMemHandle` (legacy), or `None` when an fd travels instead.
        legacy_handle: Option<IpcHandleBytes>,
        /// Whether an fd travels with the message.
        with_fd: bool,
        /// Allocations the block is made of, side by side (memory shared in place over several, PyTorch's
        /// expandable segments): 1, or more, in which case no fd or handle travels with the grant and
        /// `pieces.div_ceil(8)` [`BlockPieces`] messages follow it with the allocations' fds.
        pieces: u32,
    },
    /// No block has that index and serial any more (it was retired): look the name up again.
    Gone {
        /// The block asked for.
        block: BlockId,
    },
}

impl BlockReply {
    /// Fds that travel with the reply.
    pub const fn fd_count(&self) -> usize {
        match self {
            Self::Grant { with_fd: true, .. } => 1,
            _ => 0,
        }
    }

    /// The reply's bytes.
    pub fn encode(&self) -> [u8; BLOCK_REPLY_BYTES] {
        let (kind, block, bytes, legacy, pieces) = match *self {
            Self::Grant { block, bytes, legacy_handle, pieces, .. } => {
                (GRANT_TYPE, block, bytes, legacy_handle, pieces)
            }
            Self::Gone { block } => (GONE_TYPE, block, 0, None, 0),
        };
        let mut out = Vec::with_capacity(BLOCK_REPLY_BYTES);
        put_u16(&mut out, kind);
        put_u16(&mut out, self.fd_count() as u16);
        put_u32(&mut out, block.index);
        put_u32(&mut out, block.serial);
        put_u32(&mut out, u32::from(legacy.is_some()));
        put_u64(&mut out, bytes);
        put_u32(&mut out, pieces);
        put_u32(&mut out, 0);
        out.extend_from_slice(&legacy.unwrap_or([0; IPC_HANDLE_BYTES]));
        let mut encoded = [0u8; BLOCK_REPLY_BYTES];
        encoded.copy_from_slice(&out);
        encoded
    }

    /// Decodes a reply; `fds` is how many fds came with it.
    ///
    /// # Errors
    /// An unknown type, flags or fd count that do not match, reserved bytes that are not zero.
    pub fn decode(bytes: &[u8; BLOCK_REPLY_BYTES], fds: usize) -> Result<Self, WireError> {
        let mut r = Reader::new(bytes, "block reply");
        let kind = r.u16()?;
        let fd_count = usize::from(r.u16()?);
        let block = BlockId { index: r.u32()?, serial: r.u32()? };
        let flags = r.u32()?;
        let size = r.u64()?;
        let pieces = r.u32()?;
        r.reserved_u32("BlockReply.reserved")?;
        let handle: IpcHandleBytes = r.array()?;
        if fd_count > 1 {
            // A reply carries one fd at most: the count field itself is what is wrong, whatever arrived.
            return Err(WireError::FdCountMismatch {
                message: "BlockReply (its fd_count field)",
                expected: 1,
                received: fd_count,
            });
        }
        if fd_count != fds {
            return Err(WireError::FdCountMismatch { message: "BlockReply", expected: fd_count, received: fds });
        }
        if flags & !1 != 0 || (flags == 0 && handle != [0; IPC_HANDLE_BYTES]) {
            return Err(WireError::ReservedNotZero { field: "BlockReply.flags" });
        }
        match kind {
            GRANT_TYPE if pieces > 1 => {
                if pieces as usize > MAX_SPAN_ALLOCATIONS {
                    let reason = format!("{pieces}, at most {MAX_SPAN_ALLOCATIONS}");
                    return Err(WireError::InvalidField { field: "BlockReply.pieces", reason });
                }
                if fd_count != 0 || flags != 0 {
                    return Err(WireError::InvalidField {
                        field: "BlockReply.flags",
                        reason: "a grant of several allocations carries no fd or handle: they follow it".into(),
                    });
                }
                Ok(Self::Grant { block, bytes: size, legacy_handle: None, with_fd: false, pieces })
            }
            GRANT_TYPE => {
                if pieces != 1 {
                    return Err(WireError::InvalidField {
                        field: "BlockReply.pieces",
                        reason: format!("{pieces}; a grant maps at least one allocation"),
                    });
                }
                let legacy_handle = (flags & 1 != 0).then_some(handle);
                if legacy_handle.is_some() == (fd_count == 1) {
                    return Err(WireError::InvalidField {
                        field: "BlockReply.flags",
                        reason: "a grant carries either a legacy handle or an fd".into(),
                    });
                }
                Ok(Self::Grant { block, bytes: size, legacy_handle, with_fd: fd_count == 1, pieces })
            }
            GONE_TYPE if fd_count == 0 && flags == 0 && size == 0 && pieces == 0 => Ok(Self::Gone { block }),
            GONE_TYPE => Err(WireError::ReservedNotZero { field: "BlockReply (gone)" }),
            other => {
                Err(WireError::InvalidField { field: "BlockReply.type", reason: format!("{other}, expected 2 or 3") })
            }
        }
    }
}

/// Owner -> importer on the block channel, after a [`BlockReply::Grant`] of several allocations: up to
/// [`PIECES_PER_MESSAGE`] of them, each an fd that travels with the message and its place in the block.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BlockPieces {
    /// The block granted.
    pub block: BlockId,
    /// Index (in the block) of the first allocation this message describes.
    pub first: u32,
    /// (offset in the block, bytes) of each allocation, in order; one fd each, in the same order.
    pub pieces: Vec<(u64, u64)>,
}

impl BlockPieces {
    /// The message's bytes.
    ///
    /// # Errors
    /// [`WireError::InvalidField`] for no allocation or more than [`PIECES_PER_MESSAGE`].
    pub fn encode(&self) -> Result<[u8; BLOCK_PIECES_BYTES], WireError> {
        if self.pieces.is_empty() || self.pieces.len() > PIECES_PER_MESSAGE {
            let reason = format!("{} allocations, 1 to {PIECES_PER_MESSAGE}", self.pieces.len());
            return Err(WireError::InvalidField { field: "BlockPieces.fd_count", reason });
        }
        let mut out = Vec::with_capacity(BLOCK_PIECES_BYTES);
        put_u16(&mut out, PIECES_TYPE);
        put_u16(&mut out, self.pieces.len() as u16);
        put_u32(&mut out, self.block.index);
        put_u32(&mut out, self.block.serial);
        put_u32(&mut out, self.first);
        for &(offset, bytes) in &self.pieces {
            put_u64(&mut out, offset);
            put_u64(&mut out, bytes);
        }
        let mut encoded = [0u8; BLOCK_PIECES_BYTES];
        encoded.get_mut(..out.len()).unwrap_or_default().copy_from_slice(&out);
        Ok(encoded)
    }

    /// Decodes a message; `fds` is how many fds came with it.
    ///
    /// # Errors
    /// Another type, an fd count of 0, more than [`PIECES_PER_MESSAGE`] or not what came, an allocation of 0
    /// bytes, unused entries that are not zero.
    pub fn decode(bytes: &[u8; BLOCK_PIECES_BYTES], fds: usize) -> Result<Self, WireError> {
        let mut r = Reader::new(bytes, "block pieces");
        let kind = r.u16()?;
        if kind != PIECES_TYPE {
            return Err(WireError::InvalidField { field: "BlockPieces.type", reason: format!("{kind}, expected 4") });
        }
        let count = usize::from(r.u16()?);
        if count != fds || count == 0 || count > PIECES_PER_MESSAGE {
            return Err(WireError::FdCountMismatch { message: "BlockPieces", expected: count, received: fds });
        }
        let block = BlockId { index: r.u32()?, serial: r.u32()? };
        let first = r.u32()?;
        let mut pieces = Vec::with_capacity(count);
        for index in 0..PIECES_PER_MESSAGE {
            let (offset, size) = (r.u64()?, r.u64()?);
            if index < count {
                if size == 0 {
                    let reason = format!("allocation {} has 0 bytes", u64::from(first) + index as u64);
                    return Err(WireError::InvalidField { field: "BlockPieces.bytes", reason });
                }
                pieces.push((offset, size));
            } else if offset != 0 || size != 0 {
                return Err(WireError::ReservedNotZero { field: "BlockPieces (unused entry)" });
            }
        }
        r.finish()?;
        Ok(Self { block, first, pieces })
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    /// A small host-backend offer (`docs/protocol.md` shows a vmm one, which the conformance test checks).
    fn host_offer() -> PoolOffer {
        let geometry = Geometry { entry_slots: 8, block_slots: 2 };
        PoolOffer {
            backend: BackendKind::Host,
            owner_pid: 7,
            pool_id: 0x0102_0304_0506_0708,
            geometry,
            directory_bytes: geometry.directory_bytes() as u64,
            pins_bytes: geometry.pins_bytes() as u64,
            device_uuid: DeviceUuid::default(),
        }
    }

    #[test]
    fn the_offer_body_has_pinned_bytes_and_round_trips() {
        let offer = host_offer();
        let bytes = offer.encode().unwrap();
        let mut expected = vec![0x02, 0x00, 0x03, 0x00, 0x07, 0x00, 0x00, 0x00];
        expected.extend_from_slice(&[0x08, 0x07, 0x06, 0x05, 0x04, 0x03, 0x02, 0x01]);
        expected.extend_from_slice(&[0x08, 0x00, 0x00, 0x00, 0x02, 0x00, 0x00, 0x00]);
        expected.extend_from_slice(&65_536u64.to_le_bytes());
        expected.extend_from_slice(&65_536u64.to_le_bytes());
        expected.extend_from_slice(&[0; 24]);
        assert_eq!(bytes, expected);
        assert_eq!(bytes.len(), POOL_OFFER_BYTES);
        assert_eq!(PoolOffer::decode(&bytes).unwrap(), offer);
    }

    #[test]
    fn a_body_that_breaks_a_rule_is_refused_with_the_field_named() {
        let good = host_offer().encode().unwrap();
        let field = |bytes: &[u8]| match PoolOffer::decode(bytes).unwrap_err() {
            WireError::InvalidField { field, .. } => field.to_owned(),
            other => other.to_string(),
        };
        let mut version = good.clone();
        version[0] = 1; // the layout before grants of several allocations
        assert_eq!(field(&version), "PoolOffer.layout_version");
        let mut slots = good.clone();
        slots[16] = 3; // 3 entry slots: not a power of two
        assert_eq!(field(&slots), "PoolOffer.entry_slots");
        let mut size = good.clone();
        size[24] ^= 1;
        assert_eq!(field(&size), "PoolOffer.directory_bytes");
        let mut reserved = good.clone();
        reserved[63] = 1;
        assert!(field(&reserved).contains("reserved"), "{}", field(&reserved));
        assert!(field(&good[..60]).contains("truncated"), "{}", field(&good[..60]));
    }

    #[test]
    fn channel_messages_round_trip_and_refuse_what_does_not_add_up() {
        let block = BlockId { index: 7, serial: 3 };
        let request = BlockRequest { block };
        let bytes = request.encode();
        assert_eq!(bytes, [1, 0, 0, 0, 7, 0, 0, 0, 3, 0, 0, 0, 0, 0, 0, 0]);
        assert_eq!(BlockRequest::decode(&bytes).unwrap(), request);
        let mut bad = bytes;
        bad[0] = 9;
        assert!(BlockRequest::decode(&bad).is_err());

        let replies = [
            BlockReply::Grant { block, bytes: 1 << 21, legacy_handle: None, with_fd: true, pieces: 1 },
            BlockReply::Grant { block, bytes: 4096, legacy_handle: Some([0x42; 64]), with_fd: false, pieces: 1 },
            BlockReply::Grant { block, bytes: 3 << 21, legacy_handle: None, with_fd: false, pieces: 3 },
            BlockReply::Gone { block },
        ];
        for reply in replies {
            let bytes = reply.encode();
            assert_eq!(BlockReply::decode(&bytes, reply.fd_count()).unwrap(), reply);
            assert!(BlockReply::decode(&bytes, reply.fd_count() + 1).is_err(), "an extra fd is refused");
        }
        // A grant with neither a handle nor an fd.
        let mut empty = replies[0].encode();
        empty[2] = 0;
        assert!(BlockReply::decode(&empty, 0).is_err());
    }

    #[test]
    fn a_grant_of_several_allocations_and_its_pieces_round_trip_and_refuse_what_does_not_add_up() {
        let block = BlockId { index: 2, serial: 9 };
        let several = BlockReply::Grant { block, bytes: 10 << 21, legacy_handle: None, with_fd: false, pieces: 10 };
        let bytes = several.encode();
        assert_eq!(&bytes[24..32], &[10, 0, 0, 0, 0, 0, 0, 0], "the pieces count follows the size");
        // With an fd, with a legacy handle, with too many pieces, or a single grant that claims none: refused.
        assert!(BlockReply::decode(&bytes, 1).is_err());
        let mut legacy = bytes;
        legacy[12] = 1;
        assert!(BlockReply::decode(&legacy, 0).is_err());
        let mut too_many = bytes;
        too_many[24..28].copy_from_slice(&(MAX_SPAN_ALLOCATIONS as u32 + 1).to_le_bytes());
        assert!(matches!(
            BlockReply::decode(&too_many, 0),
            Err(WireError::InvalidField { field: "BlockReply.pieces", .. })
        ));
        let mut none = BlockReply::Grant { block, bytes: 4096, legacy_handle: None, with_fd: true, pieces: 1 }.encode();
        none[24] = 0;
        assert!(BlockReply::decode(&none, 1).is_err());

        let message = BlockPieces { block, first: 8, pieces: vec![(16 << 21, 1 << 21), (17 << 21, 2 << 21)] };
        let bytes = message.encode().unwrap();
        assert_eq!(&bytes[..16], &[4, 0, 2, 0, 2, 0, 0, 0, 9, 0, 0, 0, 8, 0, 0, 0]);
        assert_eq!(BlockPieces::decode(&bytes, 2).unwrap(), message);
        assert!(matches!(BlockPieces::decode(&bytes, 1), Err(WireError::FdCountMismatch { .. })), "an fd missing");
        assert!(matches!(BlockPieces::decode(&bytes, 3), Err(WireError::FdCountMismatch { .. })), "an fd too many");
        let mut unused = bytes;
        unused[BLOCK_PIECES_BYTES - 1] = 1;
        assert!(matches!(BlockPieces::decode(&unused, 2), Err(WireError::ReservedNotZero { .. })));
        let mut empty = bytes;
        empty[24..32].copy_from_slice(&[0; 8]);
        assert!(matches!(
            BlockPieces::decode(&empty, 2),
            Err(WireError::InvalidField { field: "BlockPieces.bytes", .. })
        ));
        let mut nine = bytes;
        nine[2] = 9;
        assert!(BlockPieces::decode(&nine, 9).is_err(), "more fds than one message carries");
        assert!(BlockPieces { block, first: 0, pieces: vec![(0, 1); 9] }.encode().is_err());
        assert!(BlockPieces { block, first: 0, pieces: Vec::new() }.encode().is_err());
    }
}
