//! The numeric codes on the wire: message types, detach reasons, refusal codes.

use std::fmt;

use super::types::UnknownCode;

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
    /// Consumer -> producer: leaving (advisory; see `Detach`).
    Detach,
    /// Producer -> consumer: not admitted.
    Refused,
    /// Owner -> client, with fds: the offer of a toolkit object other than a ring (pool, semaphore, work queue).
    ObjectOffer,
    /// Client -> owner, first message instead of a hello: who is attached?
    StatusRequest,
    /// Owner -> client: what the socket serves and who is attached.
    StatusReport,
    /// Consumer -> producer, instead of `Attached` (protocol version 4 and later): the ring is imported and the
    /// consumer is live, but it could not open the ring's IPC events (another IPC namespace) and runs the ring
    /// without them.
    AttachedWithoutEvents,
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
            Self::ObjectOffer => 6,
            Self::StatusRequest => 7,
            Self::StatusReport => 8,
            Self::AttachedWithoutEvents => 9,
        }
    }

    /// Decodes a wire code.
    pub fn from_code(code: u16) -> Result<Self, UnknownCode> {
        match code {
            1 => Ok(Self::ClientHello),
            2 => Ok(Self::RingOffer),
            3 => Ok(Self::Attached),
            4 => Ok(Self::Detach),
            5 => Ok(Self::Refused),
            6 => Ok(Self::ObjectOffer),
            7 => Ok(Self::StatusRequest),
            8 => Ok(Self::StatusReport),
            9 => Ok(Self::AttachedWithoutEvents),
            _ => Err(UnknownCode { field: "header.message_type", code: u32::from(code) }),
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
            Self::ObjectOffer => "ObjectOffer",
            Self::StatusRequest => "StatusRequest",
            Self::StatusReport => "StatusReport",
            Self::AttachedWithoutEvents => "AttachedWithoutEvents",
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
    pub fn from_code(code: u16) -> Result<Self, UnknownCode> {
        match code {
            1 => Ok(Self::ConsumerDone),
            2 => Ok(Self::ProducerShutdown),
            3 => Ok(Self::ImportFailed),
            4 => Ok(Self::TooSlow),
            5 => Ok(Self::ProtocolError),
            _ => Err(UnknownCode { field: "Detach.reason", code: u32::from(code) }),
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
    /// The hello named another kind of object than the socket serves (e.g. a ring consumer at a pool's socket).
    WrongObject,
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
            Self::WrongObject => 7,
        }
    }

    /// Decodes a wire code.
    pub fn from_code(code: u16) -> Result<Self, UnknownCode> {
        match code {
            1 => Ok(Self::UnsupportedVersion),
            2 => Ok(Self::BackendMismatch),
            3 => Ok(Self::RingFull),
            4 => Ok(Self::PeerNotAllowed),
            5 => Ok(Self::ShuttingDown),
            6 => Ok(Self::MalformedHello),
            7 => Ok(Self::WrongObject),
            _ => Err(UnknownCode { field: "Refused.code", code: u32::from(code) }),
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
            Self::WrongObject => "wrong object",
        })
    }
}
