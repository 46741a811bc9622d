//! Rendezvous and wire protocol (layer 3): how a consumer process finds a producer, learns the
//! ring's layout and receives the handles and fds to import it.
//!
//! The producer listens on a Unix stream socket ([`RendezvousListener`], mode 0600, peers
//! checked with `SO_PEERCRED`); a consumer connects ([`PeerConnection::connect`]), sends a
//! [`ClientHello`], receives a [`RingOffer`] with its fds, imports, answers [`Attached`], and
//! stays connected: a hang-up means the peer is gone. The bytes are specified in
//! `docs/protocol.md`.

mod codes;
mod dtype;
mod error;
mod fdpass;
mod geometry;
mod message;
// The one socket option rustix cannot read soundly: the only `unsafe` of the wire layer.
#[allow(unsafe_code)]
mod peercred;
mod rendezvous;
mod slot;
mod tensor;
mod types;

pub use codes::{DetachReason, MessageType, RefusalCode};
pub use dtype::{DType, DlpackDtype};
pub use error::{LayoutError, WireError};
pub use fdpass::{
    MessageReader, OfferFds, ReceivedMessage, recv_bytes, recv_message, send_bytes, send_message, send_message_in,
};
pub use geometry::FrameGeometry;
pub use message::codec;
pub use message::{
    Attached, ClientHello, DEEP_RING_VERSION, Detach, HEADER_BYTES, Header, IPC_HANDLE_BYTES, IpcHandleBytes, MAGIC,
    MAX_CONSUMER_NAME_BYTES, MAX_FDS_PER_MESSAGE, MAX_PAYLOAD_BYTES, MAX_REFUSAL_MESSAGE_BYTES,
    MAX_STATUS_DETAIL_BYTES, Message, OBJECT_OFFER_FIXED_BYTES, OLDEST_PROTOCOL_VERSION, ObjectOffer, PROTOCOL_VERSION,
    PeerState, PeerStatus, RING_OFFER_FIXED_BYTES, RING_OFFER_V2_FIXED_BYTES, Refused, RingOffer,
    SHALLOW_RING_MAX_SLOTS, STATUS_PEER_FIXED_BYTES, STATUS_REPORT_FIXED_BYTES, StatusReport, StatusRequest,
    WITHOUT_EVENTS_VERSION,
};
pub use rendezvous::{PeerConnection, PeerCredentials, PeerPolicy, RendezvousListener, SocketAccess};
pub use slot::SlotLayout;
pub use tensor::{MAX_TENSOR_DIMS, MAX_TENSOR_EXTENT, TensorDesc};
pub use types::{
    BackendKind, HandleType, ObjectKind, PixelFormat, StrategyTraits, SyncSide, SyncStrategy, UnknownCode, UnknownName,
};
