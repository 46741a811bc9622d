//! What the producer answers: [`RingOffer`] (with its validation and payload codec) or [`Refused`].

use super::codec::{Reader, len_u32, put_u16, put_u32, put_u64};
use super::constants::{
    IPC_HANDLE_BYTES, IpcHandleBytes, OLDEST_PROTOCOL_VERSION, PROTOCOL_VERSION, RING_OFFER_FIXED_BYTES,
};
use crate::wire::codes::RefusalCode;
use crate::wire::dtype::DType;
use crate::wire::error::LayoutError;
use crate::wire::error::WireError;
use crate::wire::geometry::FrameGeometry;
use crate::wire::slot::SlotLayout;
use crate::wire::tensor::{MAX_TENSOR_DIMS, TensorDesc};
use crate::wire::types::{BackendKind, HandleType, PixelFormat, SyncStrategy};
use gpu_ipc_driver::DeviceUuid;

/// Producer -> consumer: everything needed to import and use the ring.
///
/// Sent with file descriptors, in this order: index 0 the control block's memfd (always),
/// index 1 the data allocation's fd when [`HandleType::carries_data_fd`] (VMM: the
/// `cuMemExportToShareableHandle` fd; host backend: a memfd). Legacy sends only the control memfd
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
    /// What each slot holds: pixel frames (protocol version 1 and later), or any tensor or bare bytes (version 2).
    pub slot_layout: SlotLayout,
    /// Number of frame slots (at least 1).
    pub slot_count: u32,
    /// Bytes from one slot's start to the next (at least `slot_layout.bytes()`, multiple of 4).
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
    /// growing (131072 bytes in control-block layout 1, 65536 in layout 2: rings of more than 32 slots).
    pub control_bytes: u64,
    /// The `CUipcMemHandle` of the data: present exactly when `handle_type` is `LegacyIpc`.
    pub legacy_mem_handle: Option<IpcHandleBytes>,
    /// `CUipcEventHandle`s: empty unless `sync` is `IpcEvent`, then exactly `2 * slot_count`: index `i < N`
    /// is the producer's "published" event of slot `i` (the consumer polls it), index `N + i` this consumer's
    /// "released" event of slot `i` (the consumer records it before storing `released`).
    pub event_handles: Vec<IpcHandleBytes>,
}

/// Most slots a ring offered in protocol version 1 or 2 can have: what control-block layout 1 holds.
pub const SHALLOW_RING_MAX_SLOTS: u32 = 32;

/// The protocol version that adds rings of more than [`SHALLOW_RING_MAX_SLOTS`] slots, whose control block uses
/// layout 2 (`docs/ring.md`); its messages are encoded as in version 2.
pub const DEEP_RING_VERSION: u16 = 3;

impl RingOffer {
    /// Position of the control block memfd in the message's fd list.
    pub const CONTROL_FD_INDEX: usize = 0;
    /// Position of the data allocation fd in the message's fd list, when there is one.
    pub const DATA_FD_INDEX: usize = 1;

    /// Number of fds this offer travels with: 1, or 2 when the data travels as an fd.
    pub const fn fd_count(&self) -> usize {
        if self.handle_type.carries_data_fd() { 2 } else { 1 }
    }

    /// The oldest protocol version that can carry this offer: 1 for a ring of pixel frames, 2 for other slots, and
    /// [`DEEP_RING_VERSION`] for a ring of more than [`SHALLOW_RING_MAX_SLOTS`] slots (whatever its slots hold).
    pub const fn oldest_version(&self) -> u16 {
        let for_slots = self.slot_layout.oldest_version();
        if self.slot_count > SHALLOW_RING_MAX_SLOTS && for_slots < DEEP_RING_VERSION {
            DEEP_RING_VERSION
        } else {
            for_slots
        }
    }

    /// What needs [`oldest_version`](Self::oldest_version), for errors: the slot count of a deep ring, else what
    /// the slots hold.
    fn needs_what(&self) -> String {
        if self.slot_count > SHALLOW_RING_MAX_SLOTS {
            format!("a RingOffer of {} slots (control-block layout 2)", self.slot_count)
        } else {
            format!("a RingOffer of {}", self.slot_layout)
        }
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
        if self.slot_stride_bytes < self.slot_layout.bytes() || !self.slot_stride_bytes.is_multiple_of(4) {
            return Err(invalid(
                "RingOffer.slot_stride_bytes",
                format!(
                    "{} must be a multiple of 4 and at least the slot size {}",
                    self.slot_stride_bytes,
                    self.slot_layout.bytes()
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
    /// Why, in words (at most [`MAX_REFUSAL_MESSAGE_BYTES`](super::constants::MAX_REFUSAL_MESSAGE_BYTES) bytes of UTF-8).
    pub message: String,
}

impl Refused {
    /// The error a client reports for this refusal: [`WireError::VersionRefused`] for code 1 (unsupported protocol
    /// version: it says what to do), [`WireError::Refused`] for the others.
    pub fn into_error(self) -> WireError {
        match self.code {
            RefusalCode::UnsupportedVersion => WireError::VersionRefused {
                message: self.message,
                oldest: OLDEST_PROTOCOL_VERSION,
                newest: PROTOCOL_VERSION,
            },
            code => WireError::Refused { code, message: self.message },
        }
    }
}

/// Fixed part of a version-2 [`RingOffer`] payload: the version-1 fields, then the slot layout's 16 fixed bytes;
/// the shape and strides (8 bytes each per dimension) and the event handles follow it.
pub const RING_OFFER_V2_FIXED_BYTES: usize = RING_OFFER_FIXED_BYTES + SLOT_LAYOUT_FIXED_BYTES;
/// The slot layout's fixed bytes in a version-2 offer: slot_bytes, dtype, ndim, tensor_flags, reserved.
const SLOT_LAYOUT_FIXED_BYTES: usize = 16;
/// `tensor_flags` bit 0: strides follow the shape.
const STRIDES_PRESENT: u8 = 1;

/// Encodes `offer` in `version` (1 to 4; the caller checked that the version can carry it).
pub(super) fn encode_offer(offer: &RingOffer, version: u16, out: &mut Vec<u8>) -> Result<(), WireError> {
    offer.validate()?;
    let frame = offer.slot_layout.frame_geometry();
    if version < offer.oldest_version() {
        return Err(WireError::NeedsVersion { what: offer.needs_what(), version, needs: offer.oldest_version() });
    }
    put_u16(out, offer.backend.code());
    put_u16(out, offer.handle_type.code());
    put_u16(out, offer.sync.code());
    put_u16(out, frame.map_or(0, |g| g.pixel_format().code()));
    out.extend_from_slice(&offer.device_uuid.0);
    put_u32(out, offer.producer_pid);
    put_u32(out, offer.consumer_id);
    put_u64(out, offer.generation);
    put_u32(out, frame.map_or(0, |g| g.width()));
    put_u32(out, frame.map_or(0, |g| g.height()));
    put_u32(out, frame.map_or(0, |g| g.pitch_bytes()));
    put_u32(out, offer.slot_count);
    put_u64(out, offer.slot_stride_bytes);
    put_u64(out, offer.data_offset);
    put_u64(out, offer.allocation_bytes);
    put_u64(out, offer.granularity);
    put_u64(out, offer.control_bytes);
    put_u32(out, u32::from(offer.legacy_mem_handle.is_some()));
    put_u32(out, len_u32(offer.event_handles.len()));
    out.extend_from_slice(&offer.legacy_mem_handle.unwrap_or([0; IPC_HANDLE_BYTES]));
    if version >= 2 {
        encode_slot_layout(&offer.slot_layout, out);
    }
    for handle in &offer.event_handles {
        out.extend_from_slice(handle);
    }
    Ok(())
}

/// The version-2 slot layout section: slot_bytes, dtype (0: none), ndim, tensor_flags, reserved, shape, strides.
fn encode_slot_layout(layout: &SlotLayout, out: &mut Vec<u8>) {
    put_u64(out, layout.bytes());
    let tensor = layout.tensor();
    put_u16(out, tensor.map_or(0, |t| t.dtype().code()));
    // At most MAX_TENSOR_DIMS (8) dimensions.
    out.push(tensor.map_or(0, |t| t.ndim() as u8));
    out.push(tensor.and_then(TensorDesc::strides).map_or(0, |_| STRIDES_PRESENT));
    put_u32(out, 0);
    if let Some(tensor) = tensor {
        for &extent in tensor.shape().iter().chain(tensor.strides().unwrap_or_default()) {
            put_u64(out, extent);
        }
    }
}

/// Decodes an offer of `version` (1 to 4; the header was checked).
pub(super) fn decode_offer(r: &mut Reader<'_>, version: u16) -> Result<RingOffer, WireError> {
    let backend = BackendKind::from_code(r.u16()?, "RingOffer.backend")?;
    let handle_type = HandleType::from_code(r.u16()?, "RingOffer.handle_type")?;
    let sync = SyncStrategy::from_code(r.u16()?, "RingOffer.sync")?;
    let pixel_code = r.u16()?;
    // Version 2 says 0 for slots that are not pixel frames.
    let pixel_format = match pixel_code {
        0 if version >= 2 => None,
        code => Some(PixelFormat::from_code(code, "RingOffer.pixel_format")?),
    };
    let device_uuid = DeviceUuid(r.array::<16>()?);
    let producer_pid = r.u32()?;
    let consumer_id = r.u32()?;
    let generation = r.u64()?;
    let (width, height, pitch_bytes) = (r.u32()?, r.u32()?, r.u32()?);
    let frame = match pixel_format {
        Some(format) => Some(FrameGeometry::with_pitch(width, height, pitch_bytes, format)?),
        None if (width, height, pitch_bytes) != (0, 0, 0) => {
            return Err(WireError::InvalidField {
                field: "RingOffer.width",
                reason: format!(
                    "width, height and pitch_bytes must be 0 when pixel_format is 0 (got {width}, {height}, \
                     {pitch_bytes})"
                ),
            });
        }
        None => None,
    };
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
    let slot_layout = match (version >= 2, frame) {
        (false, Some(frame)) => SlotLayout::frames(frame),
        (true, frame) => {
            let layout = decode_slot_layout(r)?;
            match frame {
                Some(frame) => {
                    layout
                        .check_is_frame(frame)
                        .map_err(|source| WireError::InvalidLayout { field: "RingOffer.slot_layout", source })?;
                    SlotLayout::frames(frame)
                }
                None => layout,
            }
        }
        // Version 1 always has a pixel format (checked above).
        (false, None) => return Err(WireError::UnknownCode { field: "RingOffer.pixel_format", code: 0 }),
    };
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
        slot_layout,
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
    if version < offer.oldest_version() {
        // A producer never sends it: a consumer of this version cannot map the control block of such a ring.
        return Err(WireError::NeedsVersion { what: offer.needs_what(), version, needs: offer.oldest_version() });
    }
    Ok(offer)
}

/// The version-2 slot layout section (see [`encode_slot_layout`]), every rule checked.
fn decode_slot_layout(r: &mut Reader<'_>) -> Result<SlotLayout, WireError> {
    let bytes = r.u64()?;
    let dtype_code = r.u16()?;
    let [ndim] = r.array::<1>()?;
    let [tensor_flags] = r.array::<1>()?;
    r.reserved_u32("RingOffer.slot_layout.reserved")?;
    if tensor_flags & !STRIDES_PRESENT != 0 {
        return Err(WireError::ReservedNotZero { field: "RingOffer.tensor_flags" });
    }
    let invalid = |source| WireError::InvalidLayout { field: "RingOffer.slot_layout", source };
    if dtype_code == 0 {
        if ndim != 0 || tensor_flags != 0 {
            return Err(WireError::InvalidField {
                field: "RingOffer.ndim",
                reason: format!("ndim {ndim} and tensor_flags {tensor_flags} must be 0 when dtype is 0 (no tensor)"),
            });
        }
        return SlotLayout::raw(bytes).map_err(|e| relabel(e, invalid));
    }
    let dtype = DType::from_code(dtype_code, "RingOffer.dtype")?;
    let ndim = usize::from(ndim);
    if ndim > MAX_TENSOR_DIMS {
        return Err(invalid(LayoutError::TooManyDims { ndim, max: MAX_TENSOR_DIMS }));
    }
    let shape = (0..ndim).map(|_| r.u64()).collect::<Result<Vec<u64>, _>>()?;
    let strides = match tensor_flags & STRIDES_PRESENT {
        0 => None,
        _ => Some((0..ndim).map(|_| r.u64()).collect::<Result<Vec<u64>, _>>()?),
    };
    let tensor = TensorDesc::new(dtype, shape, strides).map_err(|e| relabel(e, invalid))?;
    SlotLayout::tensors_in(bytes, tensor).map_err(|e| relabel(e, invalid))
}

/// An `InvalidLayout` from a constructor, renamed after the message field it came from.
fn relabel(error: WireError, invalid: impl Fn(LayoutError) -> WireError) -> WireError {
    match error {
        WireError::InvalidLayout { source, .. } => invalid(source),
        other => other,
    }
}
