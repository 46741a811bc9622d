//! The block channel thread's inbox: how the door side hands the thread a new importer's channel
//! ([`ChannelSender`]) and wakes it, and the thread's end of it ([`ServerEnd`]).

use std::os::unix::net::UnixStream;
use std::sync::mpsc;

use rustix::net::SendFlags;

/// What the owner's door side uses to hand the thread a channel.
pub(crate) struct ChannelSender {
    channels: mpsc::Sender<(u32, UnixStream)>,
    wake: UnixStream,
}

impl ChannelSender {
    /// Hands the thread importer `peer`'s channel (our end, non-blocking).
    pub(crate) fn send(&self, peer: u32, stream: UnixStream) {
        if self.channels.send((peer, stream)).is_ok() {
            wake(&self.wake);
        }
    }
}

pub(super) fn wake(socket: &UnixStream) {
    // A full buffer means a wake-up is pending already; NOSIGNAL: the thread may have ended.
    let _ = rustix::net::send(socket, &[1], SendFlags::NOSIGNAL | SendFlags::DONTWAIT);
}

/// The thread's end of its inbox: new channels, its wake-up socket, and the stopper's copy of the other end.
pub(crate) type ServerEnd = (mpsc::Receiver<(u32, UnixStream)>, UnixStream, UnixStream);

/// The two ends of the thread's inbox: the sender for the door side, the rest for [`BlockServer::start`](super::server::BlockServer::start).
pub(crate) fn inbox() -> std::io::Result<(ChannelSender, ServerEnd)> {
    let (channels, received) = mpsc::channel();
    let (wake_tx, wake_rx) = UnixStream::pair()?;
    wake_tx.set_nonblocking(true)?;
    wake_rx.set_nonblocking(true)?;
    let stop_wake = wake_tx.try_clone()?;
    Ok((ChannelSender { channels, wake: wake_tx }, (received, wake_rx, stop_wake)))
}
