//! The owner's side: [`SemaphoreOwner`] creates the shared block and serves it through an object door; its
//! [`ObjectHost`] claims a peer record per offer and decides what a departed peer's hang-up means.

use std::collections::HashMap;
use std::os::fd::OwnedFd;
use std::path::Path;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use super::block::{Departure, PeerRecord, SemaphoreBlock};
use super::body::SemaphoreOffer;
use super::error::SemaphoreError;
use super::handle::{PeerSide, Semaphore, WaitPolicy};
use super::layout::{DeadPoster, LAYOUT_VERSION, RecordState, SHARED_BYTES, SemaphoreState};
use crate::door::{DoorConfig, ObjectDoor, ObjectHost, ObjectKind, PeerInfo};
use ipc_core::backend::Backend;
use ipc_core::wire::{BackendKind, RefusalCode};

/// How an owner creates its semaphore ([`SemaphoreOwner::create_with`]).
#[derive(Debug, Clone, Default)]
pub struct OwnerOptions {
    /// Posts it starts with.
    pub initial: u64,
    /// What the death of a peer that has posted does: break the semaphore ([`DeadPoster::Poison`], the
    /// default) or go on ([`DeadPoster::Ignore`]). Kept in the shared block, so every peer sees it.
    pub dead_poster: DeadPoster,
    /// How the owner's own CPU-side waits pass time.
    pub wait: WaitPolicy,
    /// The door's settings (handshake bound, pending connections, who may connect).
    pub door: DoorConfig,
}

/// What the door asks of the semaphore: offers (a record per peer) and departures.
struct SemaphoreHost {
    block: SemaphoreBlock,
    backend: BackendKind,
    /// The record offered to each peer number, until the peer is gone.
    records: Mutex<HashMap<u32, PeerRecord>>,
}

impl SemaphoreHost {
    fn take_record(&self, peer: &PeerInfo) -> Option<PeerRecord> {
        self.records.lock().unwrap_or_else(PoisonError::into_inner).remove(&peer.id)
    }
}

impl ObjectHost for SemaphoreHost {
    fn kind(&self) -> ObjectKind {
        ObjectKind::Semaphore
    }

    fn backend(&self) -> BackendKind {
        self.backend
    }

    fn offer(&self, peer: &PeerInfo) -> Result<(Vec<u8>, Vec<OwnedFd>), (RefusalCode, String)> {
        match self.block.check() {
            // Broken by a dead poster: still offered, so that a newcomer's attach reads why from the block (and
            // says so in the semaphore's words); the owner may reset it.
            Ok(()) | Err(SemaphoreError::PosterDied { .. }) => {}
            Err(ended) => return Err((RefusalCode::ShuttingDown, ended.to_string())),
        }
        let fd = self.block.shared().memory().try_clone_fd().map_err(|e| (RefusalCode::ShuttingDown, e.to_string()))?;
        let record = self.block.claim_record(peer.pid).map_err(|e| (RefusalCode::RingFull, e.to_string()))?;
        self.records.lock().unwrap_or_else(PoisonError::into_inner).insert(peer.id, record);
        let body = SemaphoreOffer {
            layout_version: LAYOUT_VERSION,
            record: record.index,
            epoch: record.epoch,
            max_peers: self.block.max_peers(),
            shared_bytes: SHARED_BYTES as u64,
            generation: self.block.generation(),
        };
        Ok((body.encode(), vec![fd]))
    }

    fn attached(&self, peer: &PeerInfo) {
        let record = self.records.lock().unwrap_or_else(PoisonError::into_inner).get(&peer.id).copied();
        if let Some(record) = record {
            // Fails only if the peer already detached (then `gone` frees the record).
            self.block.move_record(record, RecordState::Offered, RecordState::Attached);
        }
    }

    fn describe(&self, peer: &PeerInfo) -> String {
        let record = self.records.lock().unwrap_or_else(PoisonError::into_inner).get(&peer.id).copied();
        let Some(record) = record else { return String::new() };
        let (posts, queued) = self.block.peer_summary(record);
        let role = if posts { "posts" } else { "waits only" };
        // "posts": it has posted (its death without detaching counts as a dead poster's).
        format!("record {}, {role}, {queued} stream waits queued", record.index)
    }

    fn gone(&self, peer: &PeerInfo) {
        let Some(record) = self.take_record(peer) else { return };
        match self.block.peer_gone(record) {
            Departure::PosterDied => tracing::error!(
                peer = peer.id,
                pid = peer.pid,
                name = %peer.name,
                record = record.index,
                "a peer that posted died without detaching: semaphore poisoned, GPU waits released"
            ),
            Departure::PosterDiedIgnored { refunded } => tracing::warn!(
                peer = peer.id,
                pid = peer.pid,
                name = %peer.name,
                refunded,
                "a peer that posted died without detaching; this semaphore ignores dead posters: it goes on"
            ),
            Departure::WaiterDied { refunded } => tracing::warn!(
                peer = peer.id,
                pid = peer.pid,
                name = %peer.name,
                refunded,
                "a waiting peer died; its unreached tickets were made good"
            ),
            departure => tracing::debug!(peer = peer.id, ?departure, "semaphore peer left"),
        }
    }
}

/// The owner of a cross-process semaphore: the shared block, the door peers attach through, and the owner's own
/// [`Semaphore`] handle. Dropping it closes the semaphore (every waiter, CPU or GPU, is released with
/// [`SemaphoreError::Closed`]) and removes the socket.
pub struct SemaphoreOwner {
    door: Option<ObjectDoor>,
    semaphore: Semaphore,
}

impl std::fmt::Debug for SemaphoreOwner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SemaphoreOwner").field("door", &self.door).field("semaphore", &self.semaphore).finish()
    }
}

impl SemaphoreOwner {
    /// Creates a semaphore holding `initial` posts and serves it at `socket`. `ctx` is the CUDA context the owner's
    /// stream waits use (a GPU backend's; the host backend's owner does CPU posts and waits, and stream posts).
    ///
    /// # Errors
    /// `initial` above [`MAX_POST`](super::MAX_POST); the shared memory could not be made; the socket could not be
    /// bound (another live owner there: [`SemaphoreError::Door`]).
    pub fn create<B: Backend>(ctx: &B::Context, socket: &Path, initial: u64) -> Result<Self, SemaphoreError> {
        Self::create_with::<B>(ctx, socket, &OwnerOptions { initial, ..OwnerOptions::default() })
    }

    /// As [`create`](Self::create), with every option.
    ///
    /// # Errors
    /// As [`create`](Self::create).
    pub fn create_with<B: Backend>(
        ctx: &B::Context,
        socket: &Path,
        options: &OwnerOptions,
    ) -> Result<Self, SemaphoreError> {
        let generation = SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or(Duration::ZERO).as_nanos() as u64;
        let block = SemaphoreBlock::create(options.initial, generation, options.dead_poster)?;
        let host = Arc::new(SemaphoreHost { block: block.clone(), backend: B::KIND, records: Mutex::default() });
        let door = ObjectDoor::open(socket, host, options.door.clone())?;
        let side = PeerSide { block, record: SemaphoreBlock::OWNER_RECORD, posts: true, link: None };
        let semaphore = Semaphore::new(side, B::cuda_context(ctx).cloned(), options.wait)?;
        tracing::info!(
            socket = %door.path().display(),
            initial = options.initial,
            dead_poster = ?options.dead_poster,
            "semaphore created"
        );
        Ok(Self { door: Some(door), semaphore })
    }

    /// The owner's own handle: post, wait, on the CPU or a stream.
    pub fn semaphore(&self) -> &Semaphore {
        &self.semaphore
    }

    /// The socket peers attach through.
    pub fn path(&self) -> &Path {
        self.door.as_ref().map_or(Path::new(""), ObjectDoor::path)
    }

    /// The peers attached now (what `gpu-ipc ps` lists).
    pub fn peers(&self) -> Vec<PeerInfo> {
        self.door.as_ref().map_or_else(Vec::new, ObjectDoor::peers)
    }

    /// Makes a semaphore that a dead poster broke work again, for every peer; returns its value afterwards.
    ///
    /// What it resets to: posts made before the break and not taken are kept; every ticket handed out before the
    /// reset counts as served (the stream waits the poison released do not wait again, and a stream wait queued
    /// but not yet reached by its stream passes at once). So `posted` becomes `max(posted, taken)` without the
    /// poison, and the value `max(0, posted - taken)`. [`Semaphore::wait_status`] still reports the waits the
    /// poison released (the last reset's). Peers attached before the reset go on with their handles. A semaphore
    /// that is open is left as it is.
    ///
    /// # Errors
    /// None today for a broken or open semaphore; [`SemaphoreError::Corrupt`] if a peer wrote garbage in the
    /// state word.
    pub fn reset(&self) -> Result<i64, SemaphoreError> {
        let broken = self.semaphore.block().check().err().map(|e| e.to_string());
        let value = self.semaphore.block().reset()?;
        if let Some(why) = broken {
            tracing::warn!(value, %why, "semaphore reset by its owner");
        }
        Ok(value)
    }

    /// Closes the semaphore now (as dropping the owner does).
    pub fn close(self) {}
}

impl Drop for SemaphoreOwner {
    fn drop(&mut self) {
        // Closed first, so that importers read `Closed` rather than taking the door's hang-up for a death.
        if self.semaphore.block().end(SemaphoreState::Closed) {
            tracing::info!("semaphore closed");
        }
        self.door = None;
    }
}
