//! The owner's block channel server: one thread that answers every importer's block requests (the handle of a
//! block an importer has not mapped yet), notices importers that hang up or misbehave, and reuses freed buffers as
//! soon as no importer pins them.
//!
//! Nothing an importer sends can stop it: requests are read without waiting (a half request costs its 16-byte
//! buffer), a reply that does not fit the importer's socket buffer at once means the importer does not read its
//! replies, and any malformed request or failed send ends that importer (its pins stop counting), never the thread.

use std::os::fd::AsFd;
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, mpsc};
use std::thread::JoinHandle;
use std::time::Duration;

use rustix::event::{PollFd, PollFlags, Timespec, poll};
use rustix::io::Errno;
use rustix::net::RecvFlags;

use super::inbox::{ServerEnd, wake};
use super::shared::PoolShared;
use super::wire::{BLOCK_REQUEST_BYTES, BlockRequest};
use ipc_core::backend::Backend;
use ipc_core::wire::send_bytes;

/// How often the thread looks for freed buffers to reuse while some wait for importers to unpin them.
pub(crate) const RECLAIM_INTERVAL: Duration = Duration::from_millis(5);
/// How long the thread sleeps in `poll` when nothing waits.
const IDLE_POLL: Duration = Duration::from_millis(100);

/// One importer's end of the block channel, as the thread holds it.
struct Channel {
    peer: u32,
    stream: UnixStream,
    inbox: [u8; BLOCK_REQUEST_BYTES],
    filled: usize,
}

/// The thread's handle: stopping it, and handing it new importers' channels.
pub(crate) struct BlockServer {
    stop: Arc<AtomicBool>,
    wake: UnixStream,
    thread: Option<JoinHandle<()>>,
}

impl BlockServer {
    /// Starts the thread over `shared`'s book.
    pub(crate) fn start<B: Backend>(
        shared: Arc<PoolShared<B>>,
        (received, wake_rx, wake_tx): ServerEnd,
    ) -> std::io::Result<Self> {
        let stop = Arc::new(AtomicBool::new(false));
        let thread = {
            let stop = stop.clone();
            std::thread::Builder::new()
                .name("gpu-ipc-pool-blocks".into())
                .spawn(move || run(&shared, &received, &wake_rx, &stop))?
        };
        Ok(Self { stop, wake: wake_tx, thread: Some(thread) })
    }

    /// Stops the thread and waits for it.
    pub(crate) fn stop(&mut self) {
        self.stop.store(true, Ordering::Release);
        wake(&self.wake);
        if let Some(thread) = self.thread.take()
            && thread.join().is_err()
        {
            tracing::error!("the pool's block channel thread panicked");
        }
    }
}

impl Drop for BlockServer {
    fn drop(&mut self) {
        self.stop();
    }
}

fn run<B: Backend>(
    shared: &PoolShared<B>,
    received: &mpsc::Receiver<(u32, UnixStream)>,
    wake: &UnixStream,
    stop: &AtomicBool,
) {
    let mut channels: Vec<Channel> = Vec::new();
    while !stop.load(Ordering::Acquire) {
        while let Ok((peer, stream)) = received.try_recv() {
            channels.push(Channel { peer, stream, inbox: [0; BLOCK_REQUEST_BYTES], filled: 0 });
        }
        let pending = {
            let mut book = shared.book();
            // The door reported these importers gone: their channels go too.
            channels.retain(|c| book.has_importer(c.peer));
            book.reclaim();
            book.pending() > 0
        };
        let ready = wait(wake, &channels, if pending { RECLAIM_INTERVAL } else { IDLE_POLL });
        for index in ready.into_iter().rev() {
            let Some(channel) = channels.get_mut(index) else { continue };
            if let Err(why) = serve(shared, channel) {
                let channel = channels.swap_remove(index);
                let known = shared.book().remove_importer(channel.peer);
                if known {
                    tracing::info!(peer = channel.peer, %why, "a pool importer's block channel ended; its pins are dropped");
                }
            }
        }
    }
}

/// Polls the wake-up socket and every channel for up to `timeout`; returns the indices of the channels that
/// stirred (the wake-up socket is drained here).
fn wait(wake: &UnixStream, channels: &[Channel], timeout: Duration) -> Vec<usize> {
    let mut fds = Vec::with_capacity(channels.len() + 1);
    fds.push(PollFd::from_borrowed_fd(wake.as_fd(), PollFlags::IN));
    fds.extend(channels.iter().map(|c| PollFd::from_borrowed_fd(c.stream.as_fd(), PollFlags::IN | PollFlags::RDHUP)));
    let timeout = Timespec::try_from(timeout).unwrap_or(Timespec { tv_sec: 0, tv_nsec: 100_000_000 });
    match poll(&mut fds, Some(&timeout)) {
        Ok(_) | Err(Errno::INTR) => {}
        Err(error) => {
            tracing::error!(%error, "the pool's block channel poll failed; retrying");
            std::thread::sleep(RECLAIM_INTERVAL);
            return Vec::new();
        }
    }
    if fds.first().is_some_and(|fd| !fd.revents().is_empty()) {
        let mut sink = [0u8; 64];
        while matches!(rustix::net::recv(wake, &mut sink, RecvFlags::DONTWAIT), Ok((n, _)) if n > 0) {}
    }
    fds.iter().skip(1).enumerate().filter(|(_, fd)| !fd.revents().is_empty()).map(|(i, _)| i).collect()
}

/// Reads what a channel sent and answers every whole request; an error ends the importer.
fn serve<B: Backend>(shared: &PoolShared<B>, channel: &mut Channel) -> Result<(), String> {
    loop {
        let rest = channel.inbox.get_mut(channel.filled..).unwrap_or_default();
        match rustix::net::recv(&channel.stream, rest, RecvFlags::DONTWAIT) {
            Ok((0, _)) => return Err("the importer hung up".into()),
            Ok((n, _)) => channel.filled += n,
            Err(Errno::AGAIN | Errno::INTR) => return Ok(()),
            Err(Errno::CONNRESET) => return Err("the importer hung up".into()),
            Err(error) => return Err(format!("recv failed: {error}")),
        }
        if channel.filled < BLOCK_REQUEST_BYTES {
            continue;
        }
        channel.filled = 0;
        let request = BlockRequest::decode(&channel.inbox).map_err(|e| format!("malformed block request: {e}"))?;
        let grant = shared.book().grant(request.block);
        // Non-blocking: an importer that does not read its replies is not waited for.
        send_bytes(channel.stream.as_fd(), &grant.reply.encode(), grant.fd.into_iter().collect(), Duration::ZERO)
            .map_err(|e| format!("could not send a block reply: {e}"))?;
        for (pieces, fds) in grant.pieces {
            let bytes = pieces.encode().map_err(|e| format!("could not encode a block's allocations: {e}"))?;
            send_bytes(channel.stream.as_fd(), &bytes, fds, Duration::ZERO)
                .map_err(|e| format!("could not send a block's allocations: {e}"))?;
        }
    }
}
