//! Message encoding and decoding, by hand and byte for byte as `docs/protocol.md` specifies.
//!
//! No serde or bincode on the wire: the layout is fixed, little-endian, with explicit offsets,
//! so a client in another language can implement it from the spec. Decoding is total: any
//! input yields either a message or a specific [`WireError`], never a panic.

use std::fmt;

use super::error::WireError;
use super::types::{BackendKind, DeviceUuid, FrameGeometry, HandleType, PixelFormat, SyncStrategy};

/// The first 8 bytes of every message. `\r\n` catches a peer or proxy that mangles line endings.
pub const MAGIC: [u8; 8] = *b"GPUIPC\r\n";
/// The protocol version this build speaks (header offset 8).
pub const PROTOCOL_VERSION: u16 = 1;
/// Size of the fixed header that precedes every payload.
pub const HEADER_BYTES: usize = 24;
/// Largest payload accepted; a header announcing more is rejected before anything is allocated.
pub const MAX_PAYLOAD_BYTES: u32 = 64 * 1024;
/// Most file descriptors any message carries ([`RingOffer`]: control memfd + data fd).
pub const MAX_FDS_PER_MESSAGE: usize = 2;
/// Longest consumer name in a [`ClientHello`], in UTF-8 bytes.
pub const MAX_CONSUMER_NAME_BYTES: usize = 64;
/// Longest human-readable text in a [`Refused`], in UTF-8 bytes.
pub const MAX_REFUSAL_MESSAGE_BYTES: usize = 1024;
/// Size of a CUDA IPC handle (`CUipcMemHandle`, `CUipcEventHandle`).
pub const IPC_HANDLE_BYTES: usize = 64;
/// Fixed part of a [`RingOffer`] payload; event handles follow it.
pub const RING_OFFER_FIXED_BYTES: usize = 168;

/// A 64-byte CUDA IPC handle, opaque to the protocol.
pub type IpcHandleBytes = [u8; IPC_HANDLE_BYTES];

/// Message type codes (header offset 10).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum MessageType {
    /// Consumer -> producer, first message.
    ClientHello,
    /// Producer -> consumer, with fds: the ring description.
    RingOffer,
    /// Consumer -> producer: the ring is imported and the consumer is live.
    Attached,
    /// Consumer -> producer: leaving (advisory; see [`Detach`]).
    Detach,
    /// Producer -> consumer: not admitted.
    Refused,
}

impl MessageType {
    /// Stable wire code.
    pub const fn code(self) -> u16 {
        match self {
            Self::ClientHello => 1,
            Self::RingOffer => 2,
            Self::Attached => 3,
            Self::Detach => 4,
            Self::Refused => 5,
        }
    }

    /// Decodes a wire code.
    pub fn from_code(code: u16) -> Result<Self, WireError> {
        match code {
            1 => Ok(Self::ClientHello),
            2 => Ok(Self::RingOffer),
            3 => Ok(Self::Attached),
            4 => Ok(Self::Detach),
            5 => Ok(Self::Refused),
            _ => Err(WireError::UnknownMessageType { code }),
        }
    }

    /// Name used in errors and logs.
    pub const fn name(self) -> &'static str {
        match self {
            Self::ClientHello => "ClientHello",
            Self::RingOffer => "RingOffer",
            Self::Attached => "Attached",
            Self::Detach => "Detach",
            Self::Refused => "Refused",
        }
    }
}

/// Why a consumer or producer leaves (`Detach.reason`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum DetachReason {
    /// The consumer has read what it wanted.
    ConsumerDone,
    /// The producer is shutting the ring down (never sent by the reference producer, which marks the control
    /// block CLOSED and closes the connection instead; receivers accept it).
    ProducerShutdown,
    /// The consumer could not import the offered ring.
    ImportFailed,
    /// The producer evicts a consumer that held slots too long (no eviction in version 1: never sent).
    TooSlow,
    /// The peer violated the protocol (reserved: never sent by the reference implementation).
    ProtocolError,
}

impl DetachReason {
    /// Stable wire code.
    pub const fn code(self) -> u16 {
        match self {
            Self::ConsumerDone => 1,
            Self::ProducerShutdown => 2,
            Self::ImportFailed => 3,
            Self::TooSlow => 4,
            Self::ProtocolError => 5,
        }
    }

    /// Decodes a wire code.
    pub fn from_code(code: u16) -> Result<Self, WireError> {
        match code {
            1 => Ok(Self::ConsumerDone),
            2 => Ok(Self::ProducerShutdown),
            3 => Ok(Self::ImportFailed),
            4 => Ok(Self::TooSlow),
            5 => Ok(Self::ProtocolError),
            _ => Err(WireError::UnknownCode { field: "Detach.reason", code: u32::from(code) }),
        }
    }
}

/// Why the producer refuses a consumer (`Refused.code`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum RefusalCode {
    /// The consumer speaks another protocol version.
    UnsupportedVersion,
    /// The consumer asked for a backend this ring does not use.
    BackendMismatch,
    /// Every consumer place of the ring is taken.
    RingFull,
    /// The peer's credentials (`SO_PEERCRED`) are not allowed, e.g. another user.
    PeerNotAllowed,
    /// The producer is shutting down.
    ShuttingDown,
    /// The hello was malformed.
    MalformedHello,
}

impl RefusalCode {
    /// Stable wire code.
    pub const fn code(self) -> u16 {
        match self {
            Self::UnsupportedVersion => 1,
            Self::BackendMismatch => 2,
            Self::RingFull => 3,
            Self::PeerNotAllowed => 4,
            Self::ShuttingDown => 5,
            Self::MalformedHello => 6,
        }
    }

    /// Decodes a wire code.
    pub fn from_code(code: u16) -> Result<Self, WireError> {
        match code {
            1 => Ok(Self::UnsupportedVersion),
            2 => Ok(Self::BackendMismatch),
            3 => Ok(Self::RingFull),
            4 => Ok(Self::PeerNotAllowed),
            5 => Ok(Self::ShuttingDown),
            6 => Ok(Self::MalformedHello),
            _ => Err(WireError::UnknownCode { field: "Refused.code", code: u32::from(code) }),
        }
    }
}

impl fmt::Display for RefusalCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::UnsupportedVersion => "unsupported protocol version",
            Self::BackendMismatch => "backend mismatch",
            Self::RingFull => "ring full",
            Self::PeerNotAllowed => "peer not allowed",
            Self::ShuttingDown => "producer shutting down",
            Self::MalformedHello => "malformed hello",
        })
    }
}

/// The fixed 24-byte header in front of every payload.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    /// Version the message is encoded in.
    pub version: u16,
    /// What the payload is.
    pub message_type: MessageType,
    /// Payload bytes following the header (at most [`MAX_PAYLOAD_BYTES`]).
    pub payload_len: u32,
    /// File descriptors attached to the message with `SCM_RIGHTS`.
    pub fd_count: u32,
}

impl Header {
    /// Decodes and checks the first [`HEADER_BYTES`] of `bytes` (more may follow).
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
        if version != PROTOCOL_VERSION {
            return Err(WireError::UnsupportedVersion { found: version, supported: PROTOCOL_VERSION });
        }
        if reserved != 0 {
            return Err(WireError::ReservedNotZero { field: "header.reserved" });
        }
        let message_type = MessageType::from_code(type_code)?;
        if payload_len > MAX_PAYLOAD_BYTES {
            return Err(WireError::PayloadTooLarge { len: payload_len, max: MAX_PAYLOAD_BYTES });
        }
        Ok(Self { version, message_type, payload_len, fd_count })
    }

    fn encode_into(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&MAGIC);
        put_u16(out, self.version);
        put_u16(out, self.message_type.code());
        put_u32(out, self.payload_len);
        put_u32(out, self.fd_count);
        put_u32(out, 0);
    }
}

/// Consumer -> producer: who is asking and what it wants.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientHello {
    /// Highest protocol version the consumer speaks (at least 1).
    pub protocol_version: u16,
    /// The consumer's pid, as it sees itself (the producer trusts `SO_PEERCRED` instead; this
    /// one is for logs and for spotting a PID-namespace boundary).
    pub client_pid: u32,
    /// The backend the consumer was built or configured for; `None` accepts any.
    pub wanted_backend: Option<BackendKind>,
    /// A name for logs, at most [`MAX_CONSUMER_NAME_BYTES`] bytes of UTF-8.
    pub consumer_name: String,
}

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

/// Producer -> consumer: not admitted; the producer closes the connection after sending it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refused {
    /// Why, as a code.
    pub code: RefusalCode,
    /// Why, in words (at most [`MAX_REFUSAL_MESSAGE_BYTES`] bytes of UTF-8).
    pub message: String,
}

/// Any protocol message.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Message {
    /// See [`ClientHello`].
    ClientHello(ClientHello),
    /// See [`RingOffer`].
    RingOffer(RingOffer),
    /// See [`Attached`].
    Attached(Attached),
    /// See [`Detach`].
    Detach(Detach),
    /// See [`Refused`].
    Refused(Refused),
}

impl Message {
    /// The type code of this message.
    pub const fn message_type(&self) -> MessageType {
        match self {
            Self::ClientHello(_) => MessageType::ClientHello,
            Self::RingOffer(_) => MessageType::RingOffer,
            Self::Attached(_) => MessageType::Attached,
            Self::Detach(_) => MessageType::Detach,
            Self::Refused(_) => MessageType::Refused,
        }
    }

    /// How many fds must travel with this message.
    pub const fn fd_count(&self) -> usize {
        match self {
            Self::RingOffer(offer) => offer.fd_count(),
            _ => 0,
        }
    }

    /// Encodes header and payload; fails if a field is out of range (the same checks decoding
    /// applies, so whatever encodes also decodes).
    pub fn encode(&self) -> Result<Vec<u8>, WireError> {
        let mut payload = Vec::new();
        match self {
            Self::ClientHello(hello) => encode_hello(hello, &mut payload)?,
            Self::RingOffer(offer) => encode_offer(offer, &mut payload)?,
            Self::Attached(attached) => {
                put_u32(&mut payload, attached.consumer_id);
                put_u32(&mut payload, 0);
            }
            Self::Detach(detach) => {
                put_u32(&mut payload, detach.consumer_id);
                put_u16(&mut payload, detach.reason.code());
                put_u16(&mut payload, 0);
            }
            Self::Refused(refused) => {
                check_text(&refused.message, MAX_REFUSAL_MESSAGE_BYTES, "Refused.message")?;
                put_u16(&mut payload, refused.code.code());
                put_u16(&mut payload, 0);
                put_u32(&mut payload, len_u32(refused.message.len()));
                payload.extend_from_slice(refused.message.as_bytes());
            }
        }
        let payload_len = u32::try_from(payload.len())
            .ok()
            .filter(|len| *len <= MAX_PAYLOAD_BYTES)
            .ok_or(WireError::PayloadTooLarge { len: len_u32(payload.len()), max: MAX_PAYLOAD_BYTES })?;
        let header = Header {
            version: PROTOCOL_VERSION,
            message_type: self.message_type(),
            payload_len,
            fd_count: len_u32(self.fd_count()),
        };
        let mut out = Vec::with_capacity(HEADER_BYTES + payload.len());
        header.encode_into(&mut out);
        out.extend_from_slice(&payload);
        Ok(out)
    }

    /// Decodes one complete message (header + payload, nothing after it).
    pub fn decode(bytes: &[u8]) -> Result<Self, WireError> {
        let header = Header::decode(bytes)?;
        let payload = bytes.get(HEADER_BYTES..).unwrap_or_default();
        let len = header.payload_len as usize;
        if payload.len() < len {
            return Err(WireError::Truncated { what: "payload", needed: len, available: payload.len() });
        }
        if payload.len() > len {
            return Err(WireError::TrailingBytes { message: header.message_type.name(), extra: payload.len() - len });
        }
        Self::decode_payload(&header, payload)
    }

    /// Decodes a payload whose header has already been decoded; checks that the header's fd
    /// count is the one the message requires.
    pub fn decode_payload(header: &Header, payload: &[u8]) -> Result<Self, WireError> {
        let name = header.message_type.name();
        if payload.len() != header.payload_len as usize {
            return Err(WireError::InvalidField {
                field: "header.payload_len",
                reason: format!("says {}, payload has {}", header.payload_len, payload.len()),
            });
        }
        let mut r = Reader::new(payload, name);
        let message = match header.message_type {
            MessageType::ClientHello => Self::ClientHello(decode_hello(&mut r)?),
            MessageType::RingOffer => Self::RingOffer(decode_offer(&mut r)?),
            MessageType::Attached => {
                let consumer_id = r.u32()?;
                r.reserved_u32("Attached.reserved")?;
                Self::Attached(Attached { consumer_id })
            }
            MessageType::Detach => {
                let consumer_id = r.u32()?;
                let reason = DetachReason::from_code(r.u16()?)?;
                r.reserved_u16("Detach.reserved")?;
                Self::Detach(Detach { consumer_id, reason })
            }
            MessageType::Refused => {
                let code = RefusalCode::from_code(r.u16()?)?;
                r.reserved_u16("Refused.reserved")?;
                let len = r.u32()? as usize;
                if len > MAX_REFUSAL_MESSAGE_BYTES {
                    return Err(WireError::InvalidField {
                        field: "Refused.message_len",
                        reason: format!("{len} bytes, at most {MAX_REFUSAL_MESSAGE_BYTES}"),
                    });
                }
                let message = r.text(len, "Refused.message")?;
                Self::Refused(Refused { code, message })
            }
        };
        r.finish()?;
        let expected = message.fd_count();
        if header.fd_count as usize != expected {
            return Err(WireError::FdCountMismatch { message: name, expected, received: header.fd_count as usize });
        }
        Ok(message)
    }
}

fn encode_hello(hello: &ClientHello, out: &mut Vec<u8>) -> Result<(), WireError> {
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
    put_u16(out, 0);
    out.extend_from_slice(hello.consumer_name.as_bytes());
    Ok(())
}

fn decode_hello(r: &mut Reader<'_>) -> Result<ClientHello, WireError> {
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
    r.reserved_u16("ClientHello.reserved")?;
    if name_len > MAX_CONSUMER_NAME_BYTES {
        return Err(WireError::InvalidField {
            field: "ClientHello.name_len",
            reason: format!("{name_len} bytes, at most {MAX_CONSUMER_NAME_BYTES}"),
        });
    }
    let consumer_name = r.text(name_len, "ClientHello.consumer_name")?;
    Ok(ClientHello { protocol_version, client_pid, wanted_backend, consumer_name })
}

fn encode_offer(offer: &RingOffer, out: &mut Vec<u8>) -> Result<(), WireError> {
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

fn decode_offer(r: &mut Reader<'_>) -> Result<RingOffer, WireError> {
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

fn check_text(text: &str, max: usize, field: &'static str) -> Result<(), WireError> {
    if text.len() > max {
        return Err(WireError::InvalidField { field, reason: format!("{} bytes, at most {max}", text.len()) });
    }
    Ok(())
}

/// Saturating length conversions: callers have already bounded the values, and a saturated
/// value is caught by the cap checks rather than silently wrapping.
fn len_u32(len: usize) -> u32 {
    u32::try_from(len).unwrap_or(u32::MAX)
}

fn len_u16(len: usize) -> u16 {
    u16::try_from(len).unwrap_or(u16::MAX)
}

fn put_u16(out: &mut Vec<u8>, value: u16) {
    out.extend_from_slice(&value.to_le_bytes());
}

fn put_u32(out: &mut Vec<u8>, value: u32) {
    out.extend_from_slice(&value.to_le_bytes());
}

fn put_u64(out: &mut Vec<u8>, value: u64) {
    out.extend_from_slice(&value.to_le_bytes());
}

/// Bounds-checked little-endian cursor; every read that runs past the end is `Truncated`.
struct Reader<'a> {
    bytes: &'a [u8],
    pos: usize,
    what: &'static str,
}

impl<'a> Reader<'a> {
    fn new(bytes: &'a [u8], what: &'static str) -> Self {
        Self { bytes, pos: 0, what }
    }

    fn remaining(&self) -> usize {
        self.bytes.len() - self.pos
    }

    fn take(&mut self, n: usize) -> Result<&'a [u8], WireError> {
        let slice =
            self.pos.checked_add(n).and_then(|end| self.bytes.get(self.pos..end)).ok_or(WireError::Truncated {
                what: self.what,
                needed: self.pos.saturating_add(n),
                available: self.bytes.len(),
            })?;
        self.pos += n;
        Ok(slice)
    }

    fn array<const N: usize>(&mut self) -> Result<[u8; N], WireError> {
        let mut out = [0u8; N];
        out.copy_from_slice(self.take(N)?);
        Ok(out)
    }

    fn u16(&mut self) -> Result<u16, WireError> {
        Ok(u16::from_le_bytes(self.array()?))
    }

    fn u32(&mut self) -> Result<u32, WireError> {
        Ok(u32::from_le_bytes(self.array()?))
    }

    fn u64(&mut self) -> Result<u64, WireError> {
        Ok(u64::from_le_bytes(self.array()?))
    }

    fn reserved_u16(&mut self, field: &'static str) -> Result<(), WireError> {
        match self.u16()? {
            0 => Ok(()),
            _ => Err(WireError::ReservedNotZero { field }),
        }
    }

    fn reserved_u32(&mut self, field: &'static str) -> Result<(), WireError> {
        match self.u32()? {
            0 => Ok(()),
            _ => Err(WireError::ReservedNotZero { field }),
        }
    }

    fn text(&mut self, len: usize, field: &'static str) -> Result<String, WireError> {
        let bytes = self.take(len)?;
        std::str::from_utf8(bytes).map(str::to_owned).map_err(|_| WireError::InvalidUtf8 { field })
    }

    fn finish(&self) -> Result<(), WireError> {
        match self.remaining() {
            0 => Ok(()),
            extra => Err(WireError::TrailingBytes { message: self.what, extra }),
        }
    }
}
