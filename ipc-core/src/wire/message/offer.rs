//! What the producer answers: [`RingOffer`] (with its validation and payload codec) or [`Refused`].

use super::codec::{Reader, len_u32, put_u16, put_u32, put_u64};
use super::{IPC_HANDLE_BYTES, IpcHandleBytes, RefusalCode};
use crate::wire::DeviceUuid;
use crate::wire::error::WireError;
use crate::wire::types::{BackendKind, FrameGeometry, HandleType, PixelFormat, SyncStrategy};

/// Producer -> consumer: everything needed to import and use the ring.
///
/// Sent with file descriptors, in this order: index 0 the control block's memfd (always),
/// index 1 the data allocation's fd when [`HandleType::carries_data_fd`] (VMM: the
/// `cuMemExportToShareableHandle` fd; host fake: a memfd). Legacy sends only the control memfd
/// and puts the data handle in [`RingOffer::legacy_mem_handle`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RingOffer {
    /// Backend of the ring.
    pub backend: BackendKind,
    /// How the data allocation travels; must be `backend.handle_type()`.
    pub handle_type: HandleType,
    /// How producer and consumers wait for each other.
    pub sync: SyncStrategy,
    /// The GPU holding the allocation; a consumer on another GPU maps it as a peer.
    pub device_uuid: DeviceUuid,
    /// The producer's pid (its own view).
    pub producer_pid: u32,
    /// Changes every time the producer (re)creates the ring, so a consumer can tell a restarted
    /// producer from the one it attached to.
    pub generation: u64,
    /// The place in the control block assigned to this consumer.
    pub consumer_id: u32,
    /// Frame layout inside each slot.
    pub geometry: FrameGeometry,
    /// Number of frame slots (at least 1).
    pub slot_count: u32,
    /// Bytes from one slot's start to the next (at least `geometry.frame_bytes()`, multiple of 4).
    pub slot_stride_bytes: u64,
    /// Offset of slot 0 inside the allocation (multiple of 4).
    pub data_offset: u64,
    /// Size of the exported allocation (a multiple of `granularity`).
    pub allocation_bytes: u64,
    /// A power of two dividing `allocation_bytes`. The reference producer reports the largest such power up to
    /// 2 MiB (VMM: 2 MiB, its allocations are rounded to that; legacy and host-fake: whatever divides the size,
    /// e.g. 8192). Used only to validate the offer; a VMM consumer maps with its own
    /// `cuMemGetAllocationGranularity`.
    pub granularity: u64,
    /// Size of the control block memfd: the memfd must be exactly this big and sealed against shrinking and
    /// growing (131072 bytes in control-block layout version 1).
    pub control_bytes: u64,
    /// The `CUipcMemHandle` of the data: present exactly when `handle_type` is `LegacyIpc`.
    pub legacy_mem_handle: Option<IpcHandleBytes>,
    /// `CUipcEventHandle`s: empty unless `sync` is `IpcEvent`, then exactly `2 * slot_count`: index `i < N`
    /// is the producer's "published" event of slot `i` (the consumer polls it), index `N + i` this consumer's
    /// "released" event of slot `i` (the consumer records it before storing `released`).
    pub event_handles: Vec<IpcHandleBytes>,
}

impl RingOffer {
    /// Position of the control block memfd in the message's fd list.
    pub const CONTROL_FD_INDEX: usize = 0;
    /// Position of the data allocation fd in the message's fd list, when there is one.
    pub const DATA_FD_INDEX: usize = 1;

    /// Number of fds this offer travels with: 1, or 2 when the data travels as an fd.
    pub const fn fd_count(&self) -> usize {
        if self.handle_type.carries_data_fd() { 2 } else { 1 }
    }

    /// Checks the fields against each other (called by both encode and decode).
    pub fn validate(&self) -> Result<(), WireError> {
        let invalid = |field: &'static str, reason: String| WireError::InvalidField { field, reason };
        if self.handle_type != self.backend.handle_type() {
            return Err(invalid(
                "RingOffer.handle_type",
                format!(
                    "{} does not match backend {} (which uses {})",
                    self.handle_type,
                    self.backend,
                    self.backend.handle_type()
                ),
            ));
        }
        if self.legacy_mem_handle.is_some() != (self.handle_type == HandleType::LegacyIpc) {
            return Err(invalid(
                "RingOffer.legacy_mem_handle",
                "present exactly when the handle type is legacy-ipc".to_owned(),
            ));
        }
        if self.slot_count == 0 {
            return Err(invalid("RingOffer.slot_count", "must be at least 1".to_owned()));
        }
        let events = self.event_handles.len() as u64;
        if self.sync != SyncStrategy::IpcEvent && events != 0 {
            return Err(invalid("RingOffer.event_handles", format!("must be empty with sync {}", self.sync)));
        }
        if self.sync == SyncStrategy::IpcEvent && events != 2 * u64::from(self.slot_count) {
            return Err(invalid(
                "RingOffer.event_handles",
                format!(
                    "{events} handles for {} slots: ipc-event needs exactly 2 per slot (the producer's \
                     published events, then this consumer's released events)",
                    self.slot_count
                ),
            ));
        }
        if self.slot_stride_bytes < self.geometry.frame_bytes() || !self.slot_stride_bytes.is_multiple_of(4) {
            return Err(invalid(
                "RingOffer.slot_stride_bytes",
                format!(
                    "{} must be a multiple of 4 and at least the frame size {}",
                    self.slot_stride_bytes,
                    self.geometry.frame_bytes()
                ),
            ));
        }
        if !self.data_offset.is_multiple_of(4) {
            return Err(invalid("RingOffer.data_offset", format!("{} is not a multiple of 4", self.data_offset)));
        }
        if !self.granularity.is_power_of_two() {
            return Err(invalid("RingOffer.granularity", format!("{} is not a power of two", self.granularity)));
        }
        if !self.allocation_bytes.is_multiple_of(self.granularity) {
            return Err(invalid(
                "RingOffer.allocation_bytes",
                format!("{} is not a multiple of the granularity {}", self.allocation_bytes, self.granularity),
            ));
        }
        let end = self
            .slot_stride_bytes
            .checked_mul(u64::from(self.slot_count))
            .and_then(|slots| slots.checked_add(self.data_offset));
        match end {
            Some(end) if end <= self.allocation_bytes => {}
            _ => {
                return Err(invalid(
                    "RingOffer.allocation_bytes",
                    format!(
                        "{} cannot hold {} slots of {} bytes from offset {}",
                        self.allocation_bytes, self.slot_count, self.slot_stride_bytes, self.data_offset
                    ),
                ));
            }
        }
        if self.control_bytes == 0 {
            return Err(invalid("RingOffer.control_bytes", "must be non-zero".to_owned()));
        }
        Ok(())
    }
}

/// Producer -> consumer: not admitted; the producer closes the connection after sending it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refused {
    /// Why, as a code.
    pub code: RefusalCode,
    /// Why, in words (at most [`MAX_REFUSAL_MESSAGE_BYTES`](super::MAX_REFUSAL_MESSAGE_BYTES) bytes of UTF-8).
    pub message: String,
}

pub(super) fn encode_offer(offer: &RingOffer, out: &mut Vec<u8>) -> Result<(), WireError> {
    offer.validate()?;
    put_u16(out, offer.backend.code());
    put_u16(out, offer.handle_type.code());
    put_u16(out, offer.sync.code());
    put_u16(out, offer.geometry.pixel_format().code());
    out.extend_from_slice(&offer.device_uuid.0);
    put_u32(out, offer.producer_pid);
    put_u32(out, offer.consumer_id);
    put_u64(out, offer.generation);
    put_u32(out, offer.geometry.width());
    put_u32(out, offer.geometry.height());
    put_u32(out, offer.geometry.pitch_bytes());
    put_u32(out, offer.slot_count);
    put_u64(out, offer.slot_stride_bytes);
    put_u64(out, offer.data_offset);
    put_u64(out, offer.allocation_bytes);
    put_u64(out, offer.granularity);
    put_u64(out, offer.control_bytes);
    put_u32(out, u32::from(offer.legacy_mem_handle.is_some()));
    put_u32(out, len_u32(offer.event_handles.len()));
    out.extend_from_slice(&offer.legacy_mem_handle.unwrap_or([0; IPC_HANDLE_BYTES]));
    for handle in &offer.event_handles {
        out.extend_from_slice(handle);
    }
    Ok(())
}

pub(super) fn decode_offer(r: &mut Reader<'_>) -> Result<RingOffer, WireError> {
    let backend = BackendKind::from_code(r.u16()?, "RingOffer.backend")?;
    let handle_type = HandleType::from_code(r.u16()?, "RingOffer.handle_type")?;
    let sync = SyncStrategy::from_code(r.u16()?, "RingOffer.sync")?;
    let pixel_format = PixelFormat::from_code(r.u16()?, "RingOffer.pixel_format")?;
    let device_uuid = DeviceUuid(r.array::<16>()?);
    let producer_pid = r.u32()?;
    let consumer_id = r.u32()?;
    let generation = r.u64()?;
    let width = r.u32()?;
    let height = r.u32()?;
    let pitch_bytes = r.u32()?;
    let geometry = FrameGeometry::with_pitch(width, height, pitch_bytes, pixel_format)?;
    let slot_count = r.u32()?;
    let slot_stride_bytes = r.u64()?;
    let data_offset = r.u64()?;
    let allocation_bytes = r.u64()?;
    let granularity = r.u64()?;
    let control_bytes = r.u64()?;
    let flags = r.u32()?;
    if flags & !1 != 0 {
        return Err(WireError::ReservedNotZero { field: "RingOffer.flags" });
    }
    let event_count = r.u32()? as usize;
    let legacy = r.array::<IPC_HANDLE_BYTES>()?;
    if flags & 1 == 0 && legacy != [0; IPC_HANDLE_BYTES] {
        return Err(WireError::ReservedNotZero { field: "RingOffer.legacy_mem_handle" });
    }
    let legacy_mem_handle = (flags & 1 != 0).then_some(legacy);
    // Bound the count by the bytes actually present before allocating for it.
    let needed = event_count.saturating_mul(IPC_HANDLE_BYTES);
    if needed > r.remaining() {
        return Err(WireError::Truncated { what: "RingOffer.event_handles", needed, available: r.remaining() });
    }
    let mut event_handles = Vec::with_capacity(event_count);
    for _ in 0..event_count {
        event_handles.push(r.array::<IPC_HANDLE_BYTES>()?);
    }
    let offer = RingOffer {
        backend,
        handle_type,
        sync,
        device_uuid,
        producer_pid,
        generation,
        consumer_id,
        geometry,
        slot_count,
        slot_stride_bytes,
        data_offset,
        allocation_bytes,
        granularity,
        control_bytes,
        legacy_mem_handle,
        event_handles,
    };
    offer.validate()?;
    Ok(offer)
}
