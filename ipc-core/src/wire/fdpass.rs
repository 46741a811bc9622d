//! One message plus its file descriptors over a Unix stream socket, with `SCM_RIGHTS`.
//!
//! Framing: the fixed header is read first, then exactly `payload_len` bytes, so a read never
//! runs into the next message. Partial reads and writes loop; `EINTR` and `EAGAIN` retry; every
//! wait goes through `poll` with one deadline per call, so a whole message, not each syscall,
//! is bounded by the caller's timeout. The fds ride on the first byte of the message; the
//! kernel never merges data carrying fds with earlier data in one `recvmsg`, so they arrive
//! with the header.
//!
//! After any error the stream position is unknown: close the connection.
//!
//! See [unix(7)](https://man7.org/linux/man-pages/man7/unix.7.html) and
//! [recvmsg(2)](https://man7.org/linux/man-pages/man2/recvmsg.2.html).

use std::io::{IoSlice, IoSliceMut};
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::time::{Duration, Instant};

use rustix::event::{PollFd, PollFlags, Timespec, poll};
use rustix::fs::{FileType, SealFlags, fcntl_get_seals, fstat};
use rustix::io::Errno;
use rustix::net::{
    RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, ReturnFlags, SendAncillaryBuffer, SendAncillaryMessage,
    SendFlags, recvmsg, sendmsg,
};

use super::error::WireError;
use super::message::{HEADER_BYTES, Header, MAX_FDS_PER_MESSAGE, Message, RingOffer};
use super::types::HandleType;

/// A decoded message and the fds that came with it, in protocol order, close-on-exec.
#[derive(Debug)]
pub struct ReceivedMessage {
    /// The message.
    pub message: Message,
    /// The protocol version it was encoded in (its header's): a consumer answers an offer in the offer's version.
    pub version: u16,
    /// Its fds (already checked: count, and type where the protocol knows it).
    pub fds: Vec<OwnedFd>,
}

/// The fds of a [`RingOffer`], by role.
#[derive(Debug)]
pub struct OfferFds {
    /// The control block memfd (fd index 0).
    pub control: OwnedFd,
    /// The data allocation fd (fd index 1), when the handle type carries one.
    pub data: Option<OwnedFd>,
}

impl OfferFds {
    /// The fds in protocol order, ready for [`send_message`].
    pub fn into_vec(self) -> Vec<OwnedFd> {
        let mut fds = vec![self.control];
        fds.extend(self.data);
        fds
    }
}

impl ReceivedMessage {
    /// The offer and its fds by role; a `Refused` becomes [`WireError::Refused`], anything else
    /// [`WireError::UnexpectedMessage`].
    pub fn into_ring_offer(self) -> Result<(RingOffer, OfferFds), WireError> {
        match self.message {
            Message::RingOffer(offer) => {
                let received = self.fds.len();
                let mut fds = self.fds.into_iter();
                let control = fds.next();
                let data = fds.next();
                match control {
                    Some(control) if received == offer.fd_count() => Ok((offer, OfferFds { control, data })),
                    _ => Err(WireError::FdCountMismatch { message: "RingOffer", expected: offer.fd_count(), received }),
                }
            }
            Message::Refused(refused) => Err(refused.into_error()),
            other => Err(WireError::UnexpectedMessage { expected: "RingOffer", received: other.message_type().name() }),
        }
    }
}

/// Encodes `message` in the oldest version that carries it ([`Message::encode`]) and sends it with `fds` attached;
/// see [`send_message_in`].
pub fn send_message(
    socket: BorrowedFd<'_>,
    message: &Message,
    fds: Vec<OwnedFd>,
    timeout: Duration,
) -> Result<(), WireError> {
    send_message_in(socket, message.oldest_version(), message, fds, timeout)
}

/// Encodes `message` in protocol `version` and sends it with `fds` attached.
///
/// `fds` must be exactly `message.fd_count()` long, in protocol order. They are taken by value
/// and closed when this returns, whether the send succeeded or not: once the kernel has queued
/// them the receiver holds its own references, and the exporter must not keep copies (a kept
/// copy pins the GPU allocation after every importer has gone, and leaks into children). To
/// send again, export again. NCCL's IPC socket does the same.
pub fn send_message_in(
    socket: BorrowedFd<'_>,
    version: u16,
    message: &Message,
    fds: Vec<OwnedFd>,
    timeout: Duration,
) -> Result<(), WireError> {
    if fds.len() != message.fd_count() {
        return Err(WireError::FdCountMismatch {
            message: message.message_type().name(),
            expected: message.fd_count(),
            received: fds.len(),
        });
    }
    let bytes = message.encode_in(version)?;
    tracing::debug!(message = message.message_type().name(), version, bytes = bytes.len(), fds = fds.len(), "sending");
    send_bytes(socket, &bytes, fds, timeout)
}

/// Sends `bytes` as they are, with `fds` attached to the first byte; the raw layer under
/// [`send_message`], public for conformance tests and tools. Closes `fds` on return like
/// [`send_message`].
pub fn send_bytes(socket: BorrowedFd<'_>, bytes: &[u8], fds: Vec<OwnedFd>, timeout: Duration) -> Result<(), WireError> {
    let deadline = Deadline::after(timeout);
    let borrowed: Vec<BorrowedFd<'_>> = fds.iter().map(AsFd::as_fd).collect();
    let mut space = vec![MaybeUninit::<u8>::uninit(); rustix::cmsg_space!(ScmRights(borrowed.len()))];
    let mut sent = 0;
    // NOSIGNAL: a vanished peer must be an error here, not a SIGPIPE that kills the process.
    let flags = SendFlags::DONTWAIT | SendFlags::NOSIGNAL;
    while sent < bytes.len() {
        deadline.wait(socket, PollFlags::OUT, "send")?;
        let rest = bytes.get(sent..).unwrap_or_default();
        let result = if sent == 0 && !borrowed.is_empty() {
            let mut control = SendAncillaryBuffer::new(&mut space);
            if !control.push(SendAncillaryMessage::ScmRights(&borrowed)) {
                return Err(WireError::InvalidField {
                    field: "fds",
                    reason: format!("{} fds do not fit in the control buffer", borrowed.len()),
                });
            }
            sendmsg(socket, &[IoSlice::new(rest)], &mut control, flags)
        } else {
            sendmsg(socket, &[IoSlice::new(rest)], &mut SendAncillaryBuffer::default(), flags)
        };
        match result {
            Ok(n) => sent += n,
            Err(Errno::INTR | Errno::AGAIN) => {}
            Err(Errno::PIPE | Errno::CONNRESET) => {
                return Err(WireError::PeerHungUp { op: "send", transferred: sent });
            }
            Err(source) => {
                return Err(WireError::Os { op: "sendmsg", source });
            }
        }
    }
    // The receiver has its own references now; ours go (see `send_message`).
    drop(borrowed);
    drop(fds);
    Ok(())
}

/// Receives one message and its fds, waiting at most `timeout` for the whole of it.
///
/// Checks, beyond [`Message::decode_payload`]: the fds received are exactly the number the
/// header announces (fds beyond [`MAX_FDS_PER_MESSAGE`] are cut off by the kernel and reported
/// as [`WireError::FdsTruncated`]); fds arrive close-on-exec (`MSG_CMSG_CLOEXEC`); for a
/// [`RingOffer`], the control fd (and the data fd of the host backend) is a memfd exactly as large
/// as the offer says, sealed against resizing. On any error, every fd that did arrive is closed.
pub fn recv_message(socket: BorrowedFd<'_>, timeout: Duration) -> Result<ReceivedMessage, WireError> {
    let deadline = Deadline::after(timeout);
    let mut fds = Vec::new();
    let mut header_bytes = [0u8; HEADER_BYTES];
    read_exact(socket, &mut header_bytes, 0, &mut fds, &deadline)?;
    let header = Header::decode(&header_bytes)?;
    let mut payload = vec![0u8; header.payload_len as usize];
    read_exact(socket, &mut payload, HEADER_BYTES, &mut fds, &deadline)?;
    finish_message(&header, &payload, fds)
}

/// Fills `buf` with exactly `buf.len()` bytes, waiting at most `timeout`, and returns the fds that came with them
/// (close-on-exec); the raw layer under [`recv_message`], public for tools that frame their own messages (the
/// probes' parent-child channel). A hang-up before the last byte is [`WireError::PeerHungUp`].
pub fn recv_bytes(socket: BorrowedFd<'_>, buf: &mut [u8], timeout: Duration) -> Result<Vec<OwnedFd>, WireError> {
    let deadline = Deadline::after(timeout);
    let mut fds = Vec::new();
    read_exact(socket, buf, 0, &mut fds, &deadline)?;
    Ok(fds)
}

/// Fills `buf` exactly, collecting any fds that come along into `fds`; `already` is how much of
/// the message earlier calls read (for the hang-up report).
fn read_exact(
    socket: BorrowedFd<'_>,
    buf: &mut [u8],
    already: usize,
    fds: &mut Vec<OwnedFd>,
    deadline: &Deadline,
) -> Result<(), WireError> {
    let mut got = 0;
    while got < buf.len() {
        deadline.wait(socket, PollFlags::IN, "recv")?;
        let rest = buf.get_mut(got..).unwrap_or_default();
        got += recv_available(socket, rest, already + got, fds)?.unwrap_or(0);
    }
    Ok(())
}

/// One non-blocking `recvmsg` into `buf` (which must not be empty): `Some(n)` bytes arrived, `None` when nothing
/// is waiting. Fds that came along are owned (pushed to `fds`) before any error is looked at; `already` is how
/// much of the message earlier calls read (for the hang-up report).
fn recv_available(
    socket: BorrowedFd<'_>,
    buf: &mut [u8],
    already: usize,
    fds: &mut Vec<OwnedFd>,
) -> Result<Option<usize>, WireError> {
    let mut space = [MaybeUninit::<u8>::uninit(); rustix::cmsg_space!(ScmRights(MAX_FDS_PER_MESSAGE))];
    let mut control = RecvAncillaryBuffer::new(&mut space);
    let result =
        recvmsg(socket, &mut [IoSliceMut::new(buf)], &mut control, RecvFlags::CMSG_CLOEXEC | RecvFlags::DONTWAIT);
    // Take ownership of whatever fds arrived before looking at anything else, so that every
    // error path below closes them (by dropping `fds` in the caller).
    for message in control.drain() {
        if let RecvAncillaryMessage::ScmRights(received) = message {
            fds.extend(received);
        }
    }
    match result {
        Ok(msg) => {
            if msg.flags.contains(ReturnFlags::CTRUNC) {
                return Err(WireError::FdsTruncated { room: MAX_FDS_PER_MESSAGE });
            }
            if msg.flags.contains(ReturnFlags::TRUNC) {
                return Err(WireError::DataTruncated);
            }
            if msg.bytes == 0 {
                return Err(WireError::PeerHungUp { op: "recv", transferred: already });
            }
            if fds.len() > MAX_FDS_PER_MESSAGE {
                return Err(WireError::FdsTruncated { room: MAX_FDS_PER_MESSAGE });
            }
            Ok(Some(msg.bytes))
        }
        Err(Errno::INTR | Errno::AGAIN) => Ok(None),
        Err(Errno::CONNRESET) => Err(WireError::PeerHungUp { op: "recv", transferred: already }),
        Err(source) => Err(WireError::Os { op: "recvmsg", source }),
    }
}

/// Reads one message from a socket a piece at a time, never waiting: for an event loop that serves many peers
/// from one thread (the producer's admission thread), where a peer that sends half a message must cost nothing
/// but its buffer. Applies exactly the checks of [`recv_message`]; the payload buffer is allocated only after the
/// header passed them (so at most [`MAX_PAYLOAD_BYTES`](super::MAX_PAYLOAD_BYTES)).
#[derive(Debug, Default)]
pub struct MessageReader {
    header: [u8; HEADER_BYTES],
    decoded: Option<Header>,
    payload: Vec<u8>,
    /// Bytes of the message read so far, header included.
    got: usize,
    fds: Vec<OwnedFd>,
}

impl MessageReader {
    /// A reader at the start of a message.
    pub fn new() -> Self {
        Self::default()
    }

    /// Reads what `socket` has without waiting: `Ok(Some(message))` once a whole message is in (the reader then
    /// starts on the next one), `Ok(None)` while more bytes are needed. After an error the stream position is
    /// unknown: close the connection.
    pub fn read_available(&mut self, socket: BorrowedFd<'_>) -> Result<Option<ReceivedMessage>, WireError> {
        loop {
            let buf = match &self.decoded {
                None => self.header.get_mut(self.got..).unwrap_or_default(),
                Some(_) => self.payload.get_mut(self.got.saturating_sub(HEADER_BYTES)..).unwrap_or_default(),
            };
            if !buf.is_empty() {
                match recv_available(socket, buf, self.got, &mut self.fds)? {
                    Some(n) => self.got += n,
                    None => return Ok(None),
                }
            }
            match &self.decoded {
                None if self.got == HEADER_BYTES => {
                    let header = Header::decode(&self.header)?;
                    self.payload = vec![0u8; header.payload_len as usize];
                    self.decoded = Some(header);
                }
                Some(header) if self.got == HEADER_BYTES + header.payload_len as usize => {
                    let header = *header;
                    let payload = std::mem::take(&mut self.payload);
                    let fds = std::mem::take(&mut self.fds);
                    *self = Self::default();
                    return finish_message(&header, &payload, fds).map(Some);
                }
                _ => {}
            }
        }
    }
}

/// The checks after the last byte of a message arrived, shared by [`recv_message`] and [`MessageReader`].
fn finish_message(header: &Header, payload: &[u8], fds: Vec<OwnedFd>) -> Result<ReceivedMessage, WireError> {
    let name = header.message_type.name();
    if fds.len() != header.fd_count as usize {
        return Err(WireError::FdCountMismatch {
            message: name,
            expected: header.fd_count as usize,
            received: fds.len(),
        });
    }
    let message = Message::decode_payload(header, payload)?;
    check_fd_types(&message, &fds)?;
    tracing::debug!(message = name, fds = fds.len(), "received");
    Ok(ReceivedMessage { message, version: header.version, fds })
}

fn check_fd_types(message: &Message, fds: &[OwnedFd]) -> Result<(), WireError> {
    let Message::RingOffer(offer) = message else {
        return Ok(());
    };
    if let Some(control) = fds.get(RingOffer::CONTROL_FD_INDEX) {
        check_memfd(control.as_fd(), RingOffer::CONTROL_FD_INDEX, "a memfd (control block)", offer.control_bytes)?;
    }
    // A VMM fd is the driver's own kind of file and a legacy offer has no data fd: only the host
    // fake's data fd has a type the protocol can check.
    let host_data = fds.get(RingOffer::DATA_FD_INDEX).filter(|_| offer.handle_type == HandleType::HostMemfd);
    if let Some(data) = host_data {
        check_memfd(data.as_fd(), RingOffer::DATA_FD_INDEX, "a memfd (host frame data)", offer.allocation_bytes)?;
    }
    Ok(())
}

/// A memfd is a regular file on which `F_GET_SEALS` works (it fails with `EINVAL` on any other
/// file). It must be exactly `bytes` long and sealed against shrinking and growing
/// (`F_SEAL_SHRINK | F_SEAL_GROW`): mapped shared with a peer that could resize it, any access
/// past a shrunk end would be a `SIGBUS`.
fn check_memfd(fd: BorrowedFd<'_>, index: usize, expected: &'static str, bytes: u64) -> Result<(), WireError> {
    let stat = fstat(fd).map_err(WireError::os("fstat"))?;
    let file_type = FileType::from_raw_mode(stat.st_mode);
    let wrong = |found: String| WireError::WrongFdType { index, expected, found };
    if file_type != FileType::RegularFile {
        return Err(wrong(format!("a {file_type:?}")));
    }
    let Ok(seals) = fcntl_get_seals(fd) else {
        return Err(wrong("a regular file that is not a memfd".to_owned()));
    };
    let size = u64::try_from(stat.st_size).unwrap_or(0);
    if size != bytes {
        return Err(WireError::FdWrongSize { index, size, expected: bytes });
    }
    if !seals.contains(SealFlags::SHRINK | SealFlags::GROW) {
        return Err(WireError::FdNotSealed { index, seals: seals.bits() });
    }
    Ok(())
}

/// One time limit for a whole operation, spent across its syscalls.
pub(crate) struct Deadline {
    at: Instant,
    timeout: Duration,
}

impl Deadline {
    pub(crate) fn after(timeout: Duration) -> Self {
        // A timeout too large for `Instant` is treated as a day: nothing here should wait longer.
        let timeout = timeout.min(Duration::from_secs(86_400));
        Self { at: Instant::now() + timeout, timeout }
    }

    /// Waits until `fd` is ready for `events` (or has an error or hang-up pending, which the
    /// next syscall reports), or fails with `Timeout { op }` once the deadline passes.
    pub(crate) fn wait(&self, fd: BorrowedFd<'_>, events: PollFlags, op: &'static str) -> Result<(), WireError> {
        loop {
            let remaining = self.at.saturating_duration_since(Instant::now());
            let limit = Timespec::try_from(remaining).unwrap_or(Timespec { tv_sec: 86_400, tv_nsec: 0 });
            let mut poll_fds = [PollFd::from_borrowed_fd(fd, events)];
            match poll(&mut poll_fds, Some(&limit)) {
                Ok(0) => {
                    return Err(WireError::Timeout { op, after: self.timeout });
                }
                Ok(_) => return Ok(()),
                Err(Errno::INTR) => {}
                Err(source) => return Err(WireError::Os { op: "poll", source }),
            }
        }
    }
}
