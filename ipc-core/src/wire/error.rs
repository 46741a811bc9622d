//! Errors of the rendezvous and wire layer: [`WireError`], and [`LayoutError`], the rule a tensor or slot
//! description breaks.

use std::path::PathBuf;
use std::time::Duration;

use rustix::io::Errno;

use super::codes::RefusalCode;
use super::dtype::DType;
use super::types::UnknownCode;

/// Everything that can go wrong while encoding, decoding, sending or receiving a message, or
/// while setting up the rendezvous socket. Each variant carries what a user needs to act on it.
///
/// Decoding is total: every malformed input maps to one of these variants, never to a panic.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum WireError {
    // ---- decoding -------------------------------------------------------------------------
    /// The first 8 bytes are not the protocol magic: the peer does not speak this protocol.
    #[error("bad magic {found:02x?}: the peer does not speak the gpu-ipc wire protocol")]
    BadMagic {
        /// The 8 bytes received.
        found: [u8; 8],
    },
    /// The header names a protocol version this build does not implement.
    #[error(
        "peer speaks wire protocol version {found}, this build speaks versions {oldest} to {newest}: \
         use a gpu-ipc release that speaks a version in common with the peer"
    )]
    UnsupportedVersion {
        /// Version in the received header.
        found: u16,
        /// The oldest version this build implements.
        oldest: u16,
        /// The newest version this build implements.
        newest: u16,
    },
    /// The header names a message type this version does not define.
    #[error("unknown message type code {code}")]
    UnknownMessageType {
        /// The type code received.
        code: u16,
    },
    /// The header announces a payload above the protocol cap; nothing was allocated for it.
    #[error("payload of {len} bytes announced, the protocol allows at most {max}")]
    PayloadTooLarge {
        /// Announced payload length.
        len: u32,
        /// The cap (`MAX_PAYLOAD_BYTES`).
        max: u32,
    },
    /// Fewer bytes than the layout needs.
    #[error("{what} truncated: needs {needed} bytes, got {available}")]
    Truncated {
        /// What was being decoded.
        what: &'static str,
        /// Bytes the layout needs.
        needed: usize,
        /// Bytes present.
        available: usize,
    },
    /// Bytes left over after the layout of the message was fully decoded.
    #[error("{message} has {extra} trailing bytes after its payload")]
    TrailingBytes {
        /// Message type name.
        message: &'static str,
        /// Number of unexpected bytes.
        extra: usize,
    },
    /// A reserved field is not zero (a newer peer using it must bump the protocol version).
    #[error("reserved field {field} is not zero")]
    ReservedNotZero {
        /// Which field.
        field: &'static str,
    },
    /// An enum field holds a code this version does not define.
    #[error("field {field} holds unknown code {code}")]
    UnknownCode {
        /// Which field.
        field: &'static str,
        /// The code received.
        code: u32,
    },
    /// A field holds a value that is out of range or inconsistent with another field.
    #[error("invalid {field}: {reason}")]
    InvalidField {
        /// Which field.
        field: &'static str,
        /// What is wrong with it.
        reason: String,
    },
    /// A slot layout or tensor description breaks one of its rules (too many dimensions, an extent of 0, a
    /// tensor reaching past its slot, ...).
    #[error("invalid {field}: {source}")]
    InvalidLayout {
        /// Which field or value.
        field: &'static str,
        /// The rule it breaks.
        #[source]
        source: LayoutError,
    },
    /// A message cannot be encoded in the protocol version asked for: a ring whose slots are not pixel frames
    /// cannot be described in version 1.
    #[error("{what} cannot be encoded in wire protocol version {version}: it needs version {needs} or later")]
    NeedsVersion {
        /// What was being encoded.
        what: String,
        /// The version asked for.
        version: u16,
        /// The oldest version that can carry it.
        needs: u16,
    },
    /// A text field is not valid UTF-8.
    #[error("field {field} is not valid UTF-8")]
    InvalidUtf8 {
        /// Which field.
        field: &'static str,
    },
    /// Text that should be a GPU UUID in `nvidia-smi` form is not.
    #[error("{text:?} is not a GPU UUID of the form GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx")]
    InvalidUuid {
        /// The text given.
        text: String,
    },
    /// The number of file descriptors is not what the message type requires, or not what the
    /// header announced.
    #[error("{message}: expected {expected} file descriptors, got {received}")]
    FdCountMismatch {
        /// Message type name.
        message: &'static str,
        /// Count required.
        expected: usize,
        /// Count present.
        received: usize,
    },

    // ---- transfer -------------------------------------------------------------------------
    /// The kernel dropped file descriptors because the receive buffer had no room for them
    /// (`MSG_CTRUNC`); those that did arrive have been closed.
    #[error(
        "file descriptors truncated on receive (room for {room}): the peer sent more than the \
         protocol allows"
    )]
    FdsTruncated {
        /// How many fds the receiver made room for.
        room: usize,
    },
    /// The kernel truncated the data of a datagram (`MSG_TRUNC`); not expected on stream sockets.
    #[error("message data truncated on receive")]
    DataTruncated,
    /// A received file descriptor is not of the kind the protocol specifies at that position.
    #[error("file descriptor #{index} should be {expected}, but is {found}")]
    WrongFdType {
        /// Position in the message's fd list.
        index: usize,
        /// What the protocol specifies.
        expected: &'static str,
        /// What it is.
        found: String,
    },
    /// A received memfd is not exactly the size the message announces for it.
    #[error("file descriptor #{index} is {size} bytes, the message announces exactly {expected}")]
    FdWrongSize {
        /// Position in the message's fd list.
        index: usize,
        /// Its size (`fstat`).
        size: u64,
        /// The size announced.
        expected: u64,
    },
    /// A received memfd is not sealed against resizing (`F_SEAL_SHRINK | F_SEAL_GROW`): a peer could shrink it
    /// under our mapping.
    #[error(
        "file descriptor #{index} is a memfd without F_SEAL_SHRINK | F_SEAL_GROW (seals {seals:#x}): the \
         sender must seal it before sending"
    )]
    FdNotSealed {
        /// Position in the message's fd list.
        index: usize,
        /// The seals it has (`F_GET_SEALS`).
        seals: u32,
    },
    /// The peer closed the connection. `transferred` bytes of the current message had gone
    /// through; 0 on receive means it hung up between messages (the normal way a peer leaves).
    #[error("peer hung up during {op} ({transferred} bytes of the message had gone through)")]
    PeerHungUp {
        /// The operation that saw the hang-up.
        op: &'static str,
        /// Bytes of the current message sent or received before the hang-up.
        transferred: usize,
    },
    /// A blocking operation did not finish in time.
    #[error("{op} timed out after {after:?}")]
    Timeout {
        /// The operation.
        op: &'static str,
        /// The time limit that ran out.
        after: Duration,
    },
    /// A system call failed.
    #[error("{op} failed: {source}")]
    Os {
        /// The operation, e.g. `"sendmsg"`.
        op: &'static str,
        /// The error code.
        #[source]
        source: Errno,
    },
    /// A message arrived that the protocol does not allow at this point.
    #[error("expected {expected}, received {received}")]
    UnexpectedMessage {
        /// What the protocol expects now.
        expected: &'static str,
        /// What arrived.
        received: &'static str,
    },
    /// The producer refused the consumer's protocol version (`Refused` code 1): it speaks none of the versions
    /// this build speaks, or its ring needs a newer one than the consumer announced.
    #[error(
        "the producer refused this consumer's wire protocol (this build speaks versions {oldest} to {newest}): \
         {message}. Producer and consumer need a protocol version in common: use the same gpu-ipc release on \
         both sides, or a release that speaks the version the producer names"
    )]
    VersionRefused {
        /// Why, in words from the producer.
        message: String,
        /// The oldest version this build speaks.
        oldest: u16,
        /// The newest version this build speaks (what the consumer announced).
        newest: u16,
    },
    /// The producer refused the consumer.
    #[error("producer refused: {code}: {message}")]
    Refused {
        /// Why, as a code.
        code: RefusalCode,
        /// Why, in words from the producer.
        message: String,
    },

    // ---- rendezvous -----------------------------------------------------------------------
    /// Nothing listens at the socket path.
    #[error("no producer is listening at {}: start the producer first", path.display())]
    NoProducer {
        /// The socket path.
        path: PathBuf,
    },
    /// The socket file or its directory does not let us in.
    #[error(
        "permission denied for {op} on {}: the socket lets in only the users its producer allows (by default \
         its own user, mode 0600); run as that user, or start the producer with --allow-uid or --socket-group \
         (ProducerConfig::access); `gpu-ipc doctor --check-socket {}` says which",
        path.display(),
        path.display()
    )]
    PermissionDenied {
        /// The operation.
        op: &'static str,
        /// The socket path.
        path: PathBuf,
    },
    /// The path exists and is not a socket; it is left alone.
    #[error("{} exists and is not a socket; refusing to replace it: choose another path", path.display())]
    PathNotSocket {
        /// The path.
        path: PathBuf,
    },
    /// A live producer already listens at the path.
    #[error("a producer is already listening at {}: stop it or choose another path", path.display())]
    PathInUse {
        /// The path.
        path: PathBuf,
    },
    /// The path does not fit in `sockaddr_un` (107 bytes).
    #[error("socket path {} is too long for a Unix socket (at most 107 bytes)", path.display())]
    PathTooLong {
        /// The path.
        path: PathBuf,
    },
    /// The socket file could not be given to the group its access asks for.
    #[error(
        "cannot give the socket {} to group {gid}: {source}; the producer's user must be a member of that group \
         (or run as root)",
        path.display()
    )]
    SocketGroup {
        /// The group asked for.
        gid: u32,
        /// The socket path.
        path: PathBuf,
        /// The error code of `chown`.
        #[source]
        source: Errno,
    },
    /// The socket file was replaced right after it was bound (by whoever can write its directory).
    #[error(
        "{} was replaced by something else right after the producer created it: its directory is writable by \
         others; put the socket in a directory only its owner (or its group) can write",
        path.display()
    )]
    PathReplaced {
        /// The socket path.
        path: PathBuf,
    },
    /// A socket file mode that is not a permission mask including the owner's read and write.
    #[error("socket file mode {mode:#o} is not a mode between 0o600 and 0o777 that lets the owner read and write")]
    BadSocketMode {
        /// The mode asked for.
        mode: u32,
    },
    /// A socket operation on a path failed for another reason.
    #[error("{op} on {} failed: {source}", path.display())]
    PathOs {
        /// The operation.
        op: &'static str,
        /// The socket path.
        path: PathBuf,
        /// The error code.
        #[source]
        source: Errno,
    },
    /// The peer runs as a user the peer policy does not allow.
    #[error(
        "peer ({}) runs as uid {peer_uid}, we run as uid {our_uid}, and the peer policy does not allow it: run both \
         as one user (across user namespaces: map both to one uid), or allow the uid (producer: \
         `ProducerConfig::access`, e.g. `SocketAccess::users([{peer_uid}])`; consumer: `AttachOptions::producer`, \
         e.g. `PeerPolicy::Users(vec![{peer_uid}])`; `gpu-ipc doctor --check-socket PATH` checks a socket)",
        describe_pid(*pid)
    )]
    PeerUidMismatch {
        /// Peer's pid (`SO_PEERCRED`); `None` when it is in a PID namespace we cannot see.
        pid: Option<u32>,
        /// Peer's uid.
        peer_uid: u32,
        /// Our effective uid.
        our_uid: u32,
    },
}

/// Why a tensor or slot description is not valid: [`WireError::InvalidLayout`] carries one, with the field.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum LayoutError {
    /// More dimensions than `MAX_TENSOR_DIMS`.
    #[error("{ndim} dimensions, at most {max}")]
    TooManyDims {
        /// Dimensions given.
        ndim: usize,
        /// The most allowed.
        max: usize,
    },
    /// An extent of 0 (a ring of empty tensors carries nothing) or above `MAX_TENSOR_EXTENT`.
    #[error("extent {extent} of dimension {dim} is not between 1 and 2^63 - 1")]
    BadExtent {
        /// Which dimension (0 = outermost).
        dim: usize,
        /// Its extent.
        extent: u64,
    },
    /// Strides given for another number of dimensions than the shape has.
    #[error("{strides} strides for {ndim} dimensions")]
    StrideCount {
        /// Strides given.
        strides: usize,
        /// Dimensions of the shape.
        ndim: usize,
    },
    /// A stride above `MAX_TENSOR_EXTENT`.
    #[error("stride {stride} of dimension {dim} is above 2^63 - 1")]
    StrideTooLarge {
        /// Which dimension.
        dim: usize,
        /// Its stride, in elements.
        stride: u64,
    },
    /// The element count or the byte span overflows `MAX_TENSOR_EXTENT`.
    #[error("a {dtype} tensor of shape {shape:?} spans more than 2^63 - 1 bytes")]
    TooLarge {
        /// Element type.
        dtype: DType,
        /// The shape.
        shape: Vec<u64>,
    },
    /// A slot size of 0 or not a multiple of 4 (a slot is a whole number of 32-bit words, as a frame is).
    #[error("a slot of {bytes} bytes: it must be more than 0 and a multiple of 4")]
    SlotBytes {
        /// The size given.
        bytes: u64,
    },
    /// The tensor reaches past the end of the slot.
    #[error("the tensor {tensor} spans {span} bytes, more than the slot's {bytes}")]
    ExceedsSlot {
        /// The tensor, as text.
        tensor: String,
        /// Bytes from its first element to the end of its last.
        span: u64,
        /// The slot's size.
        bytes: u64,
    },
    /// A pixel-frame slot whose size or tensor differs from what its geometry says.
    #[error("{what} differs from the pixel frame's ({found} where the geometry says {expected})")]
    NotTheFrame {
        /// Which part (`bytes`, `tensor`).
        what: &'static str,
        /// What the description says.
        found: String,
        /// What the geometry says.
        expected: String,
    },
    /// Text that is not a tensor description (`DTYPE:D0xD1x...`, e.g. `f32:4x1024x1024`).
    #[error("{text:?} is not a tensor description of the form DTYPE:SHAPE, e.g. f32:4x1024x1024 ({reason})")]
    Syntax {
        /// The text given.
        text: String,
        /// What is wrong with it.
        reason: String,
    },
}

impl WireError {
    /// Wraps a bare OS error with the name of the call.
    pub(crate) fn os(op: &'static str) -> impl FnOnce(Errno) -> Self {
        move |source| Self::Os { op, source }
    }
}

impl From<UnknownCode> for WireError {
    fn from(e: UnknownCode) -> Self {
        Self::UnknownCode { field: e.field, code: e.code }
    }
}

/// A peer pid for messages: the number, or why there is none.
pub(crate) fn describe_pid(pid: Option<u32>) -> String {
    match pid {
        Some(pid) => format!("pid {pid}"),
        None => "pid unknown (in another PID namespace)".to_owned(),
    }
}

impl From<gpu_ipc_driver::InvalidDeviceUuid> for WireError {
    fn from(e: gpu_ipc_driver::InvalidDeviceUuid) -> Self {
        Self::InvalidUuid { text: e.text }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_gpu_uuid_that_does_not_parse_is_the_wires_own_error() {
        // Where the wire layer parses one, `?` turns the driver's error into the wire's own.
        for bad in ["5d1a2b3c-4d5e-6f70-8192-a3b4c5d6e7f8", "GPU-5d1a"] {
            let error = bad.parse::<gpu_ipc_driver::DeviceUuid>().map_err(WireError::from);
            assert!(matches!(&error, Err(WireError::InvalidUuid { text }) if text == bad), "{error:?}");
        }
    }
}
