//! The pool as its door sees it ([`ObjectHost`]): an offer per importer (the directory, a fresh pin table, a
//! block channel), and the importer's end.

use std::os::fd::OwnedFd;
use std::os::unix::net::UnixStream;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use super::layout::{LAYOUT_VERSION, PINS_MAGIC};
use super::shared::PoolShared;
use super::wire::PoolOffer;
use crate::door::{ObjectHost, PeerInfo};
use ipc_core::backend::Backend;
use ipc_core::shm::SharedMemory;
use ipc_core::wire::{BackendKind, ObjectKind, RefusalCode};

/// The door's view of a pool.
pub(crate) struct PoolHost<B: Backend> {
    shared: Arc<PoolShared<B>>,
}

impl<B: Backend> PoolHost<B> {
    pub(crate) fn new(shared: Arc<PoolShared<B>>) -> Self {
        Self { shared }
    }

    /// A pin table for importer `peer`: sealed memfd, header written, counters zero.
    fn pin_table(&self, peer: u32, bytes: usize, entry_slots: u32) -> Result<SharedMemory, String> {
        let pins = SharedMemory::create("gpu-ipc-pool-pins", bytes).map_err(|e| e.to_string())?;
        let header = pins.words(0, 4).map_err(|e| e.to_string())?;
        for (word, value) in header.iter().zip([PINS_MAGIC, LAYOUT_VERSION, u64::from(entry_slots), u64::from(peer)]) {
            word.store(value, Ordering::Relaxed);
        }
        Ok(pins)
    }
}

impl<B: Backend> ObjectHost for PoolHost<B> {
    fn kind(&self) -> ObjectKind {
        ObjectKind::Pool
    }

    fn backend(&self) -> BackendKind {
        B::KIND
    }

    fn offer(&self, peer: &PeerInfo) -> Result<(Vec<u8>, Vec<OwnedFd>), (RefusalCode, String)> {
        if self.shared.closing.load(Ordering::Acquire) {
            return Err((RefusalCode::ShuttingDown, "the pool is closing".into()));
        }
        if peer.part != 0 {
            let message = format!(
                "part {} asked of a pool served whole (it is not made of parts): attach without a part",
                peer.part
            );
            return Err((RefusalCode::WrongObject, message));
        }
        self.offer_part(peer)
    }

    fn describe(&self, peer: &PeerInfo) -> String {
        self.describe_part(peer)
    }

    fn gone(&self, peer: &PeerInfo) {
        self.gone_part(peer);
    }
}

impl<B: Backend> PoolHost<B> {
    /// The offer for `peer`, whatever part it asked for: what a pool served whole offers, and what the host of a
    /// pool made of parts offers for this part.
    pub(crate) fn offer_part(&self, peer: &PeerInfo) -> Result<(Vec<u8>, Vec<OwnedFd>), (RefusalCode, String)> {
        let failed = |what: &str, e: String| (RefusalCode::ShuttingDown, format!("the pool could not {what}: {e}"));
        if self.shared.closing.load(Ordering::Acquire) {
            return Err((RefusalCode::ShuttingDown, "the pool is closing".into()));
        }
        let mut book = self.shared.book();
        if book.importer_count() >= self.shared.max_importers {
            let message = format!(
                "the pool serves at most {} importers at once, attached or being attached (PoolConfig::max_importers; \
                 a weight set's max_readers): try again once one leaves",
                self.shared.max_importers
            );
            return Err((RefusalCode::RingFull, message));
        }
        let geometry = book.directory().geometry();
        let pins = self
            .pin_table(peer.id, geometry.pins_bytes(), geometry.entry_slots)
            .map_err(|e| failed("make a pin table", e))?;
        let (ours, theirs) = UnixStream::pair().map_err(|e| failed("make a block channel", e.to_string()))?;
        ours.set_nonblocking(true).map_err(|e| failed("make a block channel", e.to_string()))?;
        let directory_fd =
            book.directory().memory().try_clone_fd().map_err(|e| failed("share its directory", e.to_string()))?;
        let pins_fd = pins.try_clone_fd().map_err(|e| failed("share a pin table", e.to_string()))?;
        let offer = PoolOffer {
            backend: B::KIND,
            owner_pid: std::process::id(),
            pool_id: self.shared.pool_id,
            geometry,
            directory_bytes: geometry.directory_bytes() as u64,
            pins_bytes: geometry.pins_bytes() as u64,
            device_uuid: self.shared.device_uuid,
        };
        let body = offer.encode().map_err(|e| failed("describe itself", e.to_string()))?;
        // The importer counts from the offer on: it may pin as soon as it has the pin table.
        book.add_importer(peer.id, pins);
        drop(book);
        self.shared.channels.send(peer.id, ours);
        tracing::debug!(peer = peer.id, pid = peer.pid, name = %peer.name, "pool offer made");
        Ok((body, vec![directory_fd, pins_fd, OwnedFd::from(theirs)]))
    }

    /// What `gpu-ipc ps` says of `peer` (its note, the buffers it pins).
    pub(crate) fn describe_part(&self, peer: &PeerInfo) -> String {
        let book = self.shared.book();
        // The note word when the owner set one (a weight set's newest generation), first: the names may be cut.
        let note = match super::directory::note(book.directory().words()) {
            0 => String::new(),
            n => format!("note {n}; "),
        };
        match book.pins_of(peer.id) {
            // The names too (a weight set's arenas are `SET/GENERATION`: who holds which generation), as many as
            // fit the status line.
            Some((views, buffers)) if buffers > 0 => {
                let names: Vec<String> = book.pinned_by(peer.id).into_iter().map(|(name, _)| name).collect();
                format!("{note}holds {views} views of {buffers} buffers: {}", names.join(", "))
            }
            Some((views, buffers)) => format!("{note}holds {views} views of {buffers} buffers"),
            None => String::new(),
        }
    }

    /// `peer` is gone: its pins are dropped.
    pub(crate) fn gone_part(&self, peer: &PeerInfo) {
        if self.shared.book().remove_importer(peer.id) {
            tracing::info!(peer = peer.id, pid = peer.pid, name = %peer.name, "pool importer gone; its pins are dropped");
        }
    }
}

/// The door's view of a pool made of parts (a weight set on several devices, one part per device): one socket,
/// each peer served by the part its hello names; a part that does not exist is refused, never replaced by another.
pub(crate) struct PartsHost<B: Backend> {
    parts: Vec<PoolHost<B>>,
}

impl<B: Backend> PartsHost<B> {
    pub(crate) fn new(parts: Vec<PoolHost<B>>) -> Self {
        Self { parts }
    }

    fn part(&self, peer: &PeerInfo) -> Option<&PoolHost<B>> {
        self.parts.get(usize::try_from(peer.part).ok()?)
    }
}

impl<B: Backend> ObjectHost for PartsHost<B> {
    fn kind(&self) -> ObjectKind {
        ObjectKind::Pool
    }

    fn backend(&self) -> BackendKind {
        B::KIND
    }

    fn offer(&self, peer: &PeerInfo) -> Result<(Vec<u8>, Vec<OwnedFd>), (RefusalCode, String)> {
        match self.part(peer) {
            Some(part) => part.offer_part(peer),
            None => Err((
                RefusalCode::WrongObject,
                format!(
                    "part {} asked of a pool of {} parts (0 to {}): the reader and the set disagree, or the hello is \
                     not a weights reader's",
                    peer.part,
                    self.parts.len(),
                    self.parts.len().saturating_sub(1)
                ),
            )),
        }
    }

    fn describe(&self, peer: &PeerInfo) -> String {
        self.part(peer).map(|part| format!("part {}: {}", peer.part, part.describe_part(peer))).unwrap_or_default()
    }

    fn gone(&self, peer: &PeerInfo) {
        if let Some(part) = self.part(peer) {
            part.gone_part(peer);
        }
    }
}
