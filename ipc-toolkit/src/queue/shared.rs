//! What the queue's owner threads share ([`Owner`]): the application's (through [`WorkQueue`](super::WorkQueue)),
//! the door's (the [`ObjectHost`] it serves) and the reaper's (`reaper.rs`). The handle and the reaper both stand
//! on it; it calls neither.

use std::collections::VecDeque;
use std::os::fd::OwnedFd;
use std::sync::atomic::AtomicBool;
use std::sync::{Condvar, Mutex, PoisonError};
use std::time::Instant;

use super::body::QueueOffer;
use super::local::Local;
use super::ops::TaskData;
use super::task::LostTask;
use super::{QueueBackend, QueueConfig};
use crate::door::{ObjectHost, ObjectKind, PeerInfo};
use ipc_core::wire::{BackendKind, RefusalCode};

/// What a worker slot is doing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Slot {
    /// Free to offer.
    Free,
    /// Offered to, or held by, the door's peer with this number.
    Peer(u32),
    /// Its peer is gone; the reaper has not finished with its cells.
    Reclaiming,
}

/// The owner's bookkeeping, shared by the application's thread, the door's and the reaper's.
pub(super) struct OwnerState {
    /// Index: slot number; slot 0 is the owner's and never offered.
    pub(super) slots: Vec<Slot>,
    /// Slots whose peer is gone, and when the reaper may take their cells back.
    pub(super) gone: Vec<(u16, Instant)>,
    /// Tasks taken back, to push again (attempt already counted).
    pub(super) backlog: VecDeque<TaskData>,
    /// Tasks taken back and not handed out again, until the application takes the list.
    pub(super) lost: Vec<LostTask>,
}

/// What the owner's threads share.
pub(super) struct Owner<B: QueueBackend> {
    pub(super) local: Local<B::Exported>,
    pub(super) config: QueueConfig,
    /// The offer with worker slot 0, and the allocation's fd (fd-based backends), made once at creation.
    pub(super) template: QueueOffer,
    pub(super) fd: Option<OwnedFd>,
    pub(super) state: Mutex<OwnerState>,
    pub(super) wake: Condvar,
    pub(super) stop: AtomicBool,
    /// Whether the header's `RECLAIMING` word is held up (moved under `taking`, then by `Drop`).
    pub(super) seal_held: AtomicBool,
    /// Whether [`WorkQueue::close`] was called.
    pub(super) closed: AtomicBool,
    /// Held while the owner moves tasks between cells and its backlog (the reaper's steps) and while it looks at
    /// whether every task is done, so that the look sees every task in one place or the other.
    pub(super) taking: Mutex<()>,
}

impl<B: QueueBackend> Owner<B> {
    pub(super) fn lock(&self) -> std::sync::MutexGuard<'_, OwnerState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    pub(super) fn taking(&self) -> std::sync::MutexGuard<'_, ()> {
        self.taking.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl<B: QueueBackend> ObjectHost for Owner<B> {
    fn kind(&self) -> ObjectKind {
        ObjectKind::WorkQueue
    }

    fn backend(&self) -> BackendKind {
        B::KIND
    }

    fn offer(&self, peer: &PeerInfo) -> Result<(Vec<u8>, Vec<OwnedFd>), (RefusalCode, String)> {
        let mut state = self.lock();
        let Some(slot) = state.slots.iter().position(|s| *s == Slot::Free) else {
            let taken = state.slots.len() - 1;
            return Err((
                RefusalCode::RingFull,
                format!("all {taken} worker slots of this queue are taken; create it with more max_workers"),
            ));
        };
        let fds = match &self.fd {
            Some(fd) => match fd.try_clone() {
                Ok(fd) => vec![fd],
                Err(e) => return Err((RefusalCode::ShuttingDown, format!("duplicating the queue's fd: {e}"))),
            },
            None => Vec::new(),
        };
        state.slots[slot] = Slot::Peer(peer.id);
        let offer = QueueOffer { worker: slot as u16, ..self.template.clone() };
        tracing::debug!(peer = peer.id, slot, name = %peer.name, "work queue: offered a worker slot");
        Ok((offer.encode(), fds))
    }

    fn describe(&self, peer: &PeerInfo) -> String {
        let state = self.lock();
        match state.slots.iter().position(|s| *s == Slot::Peer(peer.id)) {
            Some(slot) => format!("worker slot {slot}"),
            None => String::new(),
        }
    }

    fn gone(&self, peer: &PeerInfo) {
        let mut state = self.lock();
        if let Some(slot) = state.slots.iter().position(|s| *s == Slot::Peer(peer.id)) {
            state.slots[slot] = Slot::Reclaiming;
            state.gone.push((slot as u16, Instant::now() + self.config.reclaim_after));
            tracing::info!(
                peer = peer.id,
                slot,
                pid = peer.pid,
                "work queue: a worker is gone; its tasks will be taken back"
            );
            self.wake.notify_all();
        }
    }
}
