//! The protocol's fixed numbers: the magic, the versions, the header's size and the caps on what a message
//! carries. Everything else of the message layer stands on them.

/// The first 8 bytes of every message. `\r\n` catches a peer or proxy that mangles line endings.
pub const MAGIC: [u8; 8] = *b"GPUIPC\r\n";
/// The newest protocol version this build speaks (header offset 8): what its consumers announce in their hello
/// (`ClientHello::protocol_version`). Version 4 adds `Message::AttachedWithoutEvents` (a consumer that cannot
/// open the ring's IPC events runs the ring without them; the other messages are version 3's); version 3 adds rings
/// of more than 32 slots (control-block layout 2, the messages are version 2's); version 2 describes slots of any
/// tensor; version 1, pixel frames only.
pub const PROTOCOL_VERSION: u16 = 4;
/// The protocol version that adds `Message::AttachedWithoutEvents`: a consumer may run an `IpcEvent` ring without
/// IPC events only with a producer that speaks it.
pub const WITHOUT_EVENTS_VERSION: u16 = 4;
/// The oldest protocol version this build speaks: it serves, and attaches to, peers of version 1 too.
pub const OLDEST_PROTOCOL_VERSION: u16 = 1;
/// Size of the fixed header that precedes every payload.
pub const HEADER_BYTES: usize = 24;
/// Largest payload accepted; a header announcing more is rejected before anything is allocated.
pub const MAX_PAYLOAD_BYTES: u32 = 64 * 1024;
/// Most file descriptors any message carries (`RingOffer`: control memfd + data fd; an `ObjectOffer` up to
/// this many, e.g. a pool's directory and its blocks).
pub const MAX_FDS_PER_MESSAGE: usize = 8;
/// Longest consumer name in a `ClientHello`, in UTF-8 bytes.
pub const MAX_CONSUMER_NAME_BYTES: usize = 64;
/// Longest human-readable text in a `Refused`, in UTF-8 bytes.
pub const MAX_REFUSAL_MESSAGE_BYTES: usize = 1024;
/// Size of a CUDA IPC handle (`CUipcMemHandle`, `CUipcEventHandle`).
pub const IPC_HANDLE_BYTES: usize = 64;
/// Fixed part of a version-1 `RingOffer` payload; event handles follow it (version 2: see
/// [`RING_OFFER_V2_FIXED_BYTES`](super::RING_OFFER_V2_FIXED_BYTES)).
pub const RING_OFFER_FIXED_BYTES: usize = 168;

/// A 64-byte CUDA IPC handle, opaque to the protocol.
pub type IpcHandleBytes = [u8; IPC_HANDLE_BYTES];
