//! Message encoding and decoding, by hand and byte for byte as `docs/protocol.md` specifies.
//!
//! No serde or bincode on the wire: the layout is fixed, little-endian, with explicit offsets,
//! so a client in another language can implement it from the spec. Decoding is total: any
//! input yields either a message or a specific [`WireError`], never a panic.

pub mod codec;
mod constants;
mod header;
mod hello;
mod object;
mod offer;
mod status;

pub use constants::{
    HEADER_BYTES, IPC_HANDLE_BYTES, IpcHandleBytes, MAGIC, MAX_CONSUMER_NAME_BYTES, MAX_FDS_PER_MESSAGE,
    MAX_PAYLOAD_BYTES, MAX_REFUSAL_MESSAGE_BYTES, OLDEST_PROTOCOL_VERSION, PROTOCOL_VERSION, RING_OFFER_FIXED_BYTES,
    WITHOUT_EVENTS_VERSION,
};
pub use header::Header;
pub use hello::{Attached, ClientHello, Detach};
pub use object::{OBJECT_OFFER_FIXED_BYTES, ObjectOffer};
pub use offer::{DEEP_RING_VERSION, RING_OFFER_V2_FIXED_BYTES, Refused, RingOffer, SHALLOW_RING_MAX_SLOTS};
pub use status::{
    MAX_STATUS_DETAIL_BYTES, PeerState, PeerStatus, STATUS_PEER_FIXED_BYTES, STATUS_REPORT_FIXED_BYTES, StatusReport,
    StatusRequest,
};

use codec::{Reader, check_text, len_u32, put_u16, put_u32};
use hello::{decode_hello, encode_hello};
use object::{decode_object_offer, encode_object_offer};
use offer::{decode_offer, encode_offer};
use status::{decode_status_report, encode_status_report};

use super::codes::{DetachReason, MessageType, RefusalCode};
use super::error::WireError;

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
    /// Consumer -> producer, instead of [`Message::Attached`], protocol version [`WITHOUT_EVENTS_VERSION`] and
    /// later: the consumer is attached, but could not open the ring's IPC events (`cuIpcOpenEventHandle` fails
    /// with `CUDA_ERROR_MAP_FAILED` in another IPC namespace, a container's default) and runs the `IpcEvent` ring
    /// without them: it waits for frames on the published counters, and stores `released` only once its own reads
    /// are done. The producer, while such a consumer is attached, stores `published` only once the frame's work is
    /// done. Same payload as `Attached`.
    AttachedWithoutEvents(Attached),
    /// See [`Detach`].
    Detach(Detach),
    /// See [`Refused`].
    Refused(Refused),
    /// Owner -> client, with fds: a toolkit object other than a ring.
    ObjectOffer(ObjectOffer),
    /// Client -> owner, first message instead of a hello: who is attached?
    StatusRequest(StatusRequest),
    /// Owner -> client: the answer; the owner hangs up after it.
    StatusReport(StatusReport),
}

impl Message {
    /// The type code of this message.
    pub const fn message_type(&self) -> MessageType {
        match self {
            Self::ClientHello(_) => MessageType::ClientHello,
            Self::RingOffer(_) => MessageType::RingOffer,
            Self::Attached(_) => MessageType::Attached,
            Self::AttachedWithoutEvents(_) => MessageType::AttachedWithoutEvents,
            Self::Detach(_) => MessageType::Detach,
            Self::Refused(_) => MessageType::Refused,
            Self::ObjectOffer(_) => MessageType::ObjectOffer,
            Self::StatusRequest(_) => MessageType::StatusRequest,
            Self::StatusReport(_) => MessageType::StatusReport,
        }
    }

    /// How many fds must travel with this message.
    pub const fn fd_count(&self) -> usize {
        match self {
            Self::RingOffer(offer) => offer.fd_count(),
            Self::ObjectOffer(offer) => offer.fd_count as usize,
            _ => 0,
        }
    }

    /// The oldest protocol version that can carry this message: 1, except for a [`RingOffer`] whose slots are not
    /// pixel frames (2) or that has more than 32 slots (3), and [`Message::AttachedWithoutEvents`] (4).
    pub const fn oldest_version(&self) -> u16 {
        match self {
            Self::RingOffer(offer) => offer.oldest_version(),
            Self::AttachedWithoutEvents(_) => WITHOUT_EVENTS_VERSION,
            _ => OLDEST_PROTOCOL_VERSION,
        }
    }

    /// Encodes header and payload in [`Message::oldest_version`], which every peer that can read the message
    /// reads (a consumer's hello goes out so: version 1, announcing [`PROTOCOL_VERSION`] in its field); fails if a
    /// field is out of range (the same checks decoding applies, so whatever encodes also decodes).
    pub fn encode(&self) -> Result<Vec<u8>, WireError> {
        self.encode_in(self.oldest_version())
    }

    /// Encodes header and payload in protocol `version`: what a peer sends once both agreed on a version.
    ///
    /// # Errors
    /// [`WireError::UnsupportedVersion`] for a version this build does not speak, [`WireError::NeedsVersion`] for
    /// a message the version cannot carry (an offer of tensor slots in version 1), and the field checks of
    /// [`Message::encode`].
    pub fn encode_in(&self, version: u16) -> Result<Vec<u8>, WireError> {
        if !(OLDEST_PROTOCOL_VERSION..=PROTOCOL_VERSION).contains(&version) {
            return Err(WireError::UnsupportedVersion {
                found: version,
                oldest: OLDEST_PROTOCOL_VERSION,
                newest: PROTOCOL_VERSION,
            });
        }
        if version < self.oldest_version() && !matches!(self, Self::RingOffer(_)) {
            return Err(WireError::NeedsVersion {
                what: self.message_type().name().to_owned(),
                version,
                needs: self.oldest_version(),
            });
        }
        let mut payload = Vec::new();
        match self {
            Self::ClientHello(hello) => encode_hello(hello, &mut payload)?,
            Self::RingOffer(offer) => encode_offer(offer, version, &mut payload)?,
            Self::ObjectOffer(offer) => encode_object_offer(offer, &mut payload)?,
            Self::StatusRequest(StatusRequest) => put_u32(&mut payload, 0),
            Self::StatusReport(report) => encode_status_report(report, &mut payload)?,
            Self::Attached(attached) | Self::AttachedWithoutEvents(attached) => {
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
        let header =
            Header { version, message_type: self.message_type(), payload_len, fd_count: len_u32(self.fd_count()) };
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

    /// Decodes a payload whose header has already been decoded, in the header's version; checks that the
    /// header's fd count is the one the message requires, and that a hello is encoded in a version it announces.
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
            MessageType::ClientHello => {
                let hello = decode_hello(&mut r)?;
                if hello.protocol_version < header.version {
                    return Err(WireError::InvalidField {
                        field: "ClientHello.protocol_version",
                        reason: format!(
                            "announces version {}, older than the version {} the hello is encoded in",
                            hello.protocol_version, header.version
                        ),
                    });
                }
                Self::ClientHello(hello)
            }
            MessageType::RingOffer => Self::RingOffer(decode_offer(&mut r, header.version)?),
            MessageType::ObjectOffer => Self::ObjectOffer(decode_object_offer(&mut r)?),
            MessageType::StatusRequest => {
                r.reserved_u32("StatusRequest.reserved")?;
                Self::StatusRequest(StatusRequest)
            }
            MessageType::StatusReport => Self::StatusReport(decode_status_report(&mut r)?),
            MessageType::Attached => {
                let consumer_id = r.u32()?;
                r.reserved_u32("Attached.reserved")?;
                Self::Attached(Attached { consumer_id })
            }
            MessageType::AttachedWithoutEvents => {
                if header.version < WITHOUT_EVENTS_VERSION {
                    return Err(WireError::NeedsVersion {
                        what: name.to_owned(),
                        version: header.version,
                        needs: WITHOUT_EVENTS_VERSION,
                    });
                }
                let consumer_id = r.u32()?;
                r.reserved_u32("AttachedWithoutEvents.reserved")?;
                Self::AttachedWithoutEvents(Attached { consumer_id })
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
