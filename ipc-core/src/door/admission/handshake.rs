//! One handshake in flight: where it stands, and why it failed (what the peer is told).

use std::time::Instant;

use crate::wire::{MessageReader, OLDEST_PROTOCOL_VERSION, PeerConnection, RefusalCode, WireError};

/// Where a handshake stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Stage<I> {
    /// Waiting for the consumer's `ClientHello`.
    Hello,
    /// Hello valid; waiting for the producer to take a record and make the offer (the handshake's number).
    Offer(u64),
    /// Offer sent for record `id`, which the handshake now holds; waiting for `Attached`.
    Attached(I),
}

impl<I: Copy> Stage<I> {
    pub(super) fn record(self) -> Option<I> {
        match self {
            Self::Hello | Self::Offer(_) => None,
            Self::Attached(id) => Some(id),
        }
    }
}

pub(super) struct Handshake<I> {
    pub(super) conn: PeerConnection,
    pub(super) reader: MessageReader,
    pub(super) accepted: Instant,
    pub(super) deadline: Instant,
    pub(super) stage: Stage<I>,
    /// The protocol version the answers go out in: the oldest until a valid hello, then the one agreed with it.
    pub(super) version: u16,
    /// The consumer said `AttachedWithoutEvents`: it could not open the ring's IPC events.
    pub(super) without_events: bool,
}

impl<I> Handshake<I> {
    /// A handshake at its start: waiting for the hello, until `deadline`.
    pub(super) fn new(conn: PeerConnection, accepted: Instant, deadline: Instant) -> Self {
        Self {
            conn,
            reader: MessageReader::new(),
            accepted,
            deadline,
            stage: Stage::Hello,
            version: OLDEST_PROTOCOL_VERSION,
            without_events: false,
        }
    }
}

/// Why a handshake ended without a consumer, and what to tell the peer.
pub(super) struct Failure {
    pub(super) refusal: Option<RefusalCode>,
    pub(super) reason: String,
}

impl Failure {
    pub(super) fn refuse(code: RefusalCode, reason: String) -> Self {
        Self { refusal: Some(code), reason }
    }

    pub(super) fn silent(reason: String) -> Self {
        Self { refusal: None, reason }
    }
}

impl From<WireError> for Failure {
    fn from(e: WireError) -> Self {
        Self::silent(e.to_string())
    }
}

/// What ends a handshake whose connection could not be read: before a valid hello the peer is told why (a
/// version this build does not speak: `Refused` code 1; anything else malformed: code 6), unless it is gone or
/// the socket failed; after the hello the connection is just closed.
pub(super) fn read_failure<I>(stage: Stage<I>, error: WireError) -> Failure {
    match (stage, error) {
        (Stage::Hello, WireError::UnsupportedVersion { found, oldest, newest }) => Failure::refuse(
            RefusalCode::UnsupportedVersion,
            format!(
                "this producer speaks wire protocol versions {oldest} to {newest}, the message was version \
                 {found}: send the hello in version 1, announcing the newest version you speak in its \
                 protocol_version field"
            ),
        ),
        (Stage::Hello, error @ (WireError::PeerHungUp { .. } | WireError::Os { .. })) => Failure::from(error),
        (Stage::Hello, error) => Failure::refuse(RefusalCode::MalformedHello, format!("malformed hello: {error}")),
        (_, error) => Failure::from(error),
    }
}

/// At most `max` bytes of `text`, cut at a character boundary.
pub(super) fn truncate(text: &str, max: usize) -> String {
    let mut end = text.len().min(max);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    text.get(..end).unwrap_or_default().to_owned()
}
