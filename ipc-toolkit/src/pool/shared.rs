//! What the pool's handle ([`SharedPool`](super::SharedPool)), its door host (`host.rs`) and its block channel
//! thread (`server.rs`) share: [`PoolShared`]. They all stand on it; it stands on the book and the inbox.

use std::sync::atomic::AtomicBool;
use std::sync::{Mutex, MutexGuard, PoisonError};

use super::book::Book;
use super::inbox::ChannelSender;
use gpu_ipc_driver::DeviceUuid;
use ipc_core::backend::Backend;

/// What the pool's handle, its door host and its block channel thread share.
pub(crate) struct PoolShared<B: Backend> {
    pub(crate) ctx: B::Context,
    pub(crate) pool_id: u64,
    pub(crate) device_uuid: DeviceUuid,
    pub(crate) max_importers: usize,
    pub(crate) closing: AtomicBool,
    pub(crate) channels: ChannelSender,
    pub(super) book: Mutex<Book<B>>,
}

impl<B: Backend> PoolShared<B> {
    /// The owner's bookkeeping, locked (a panic while it was held leaves it usable: every change is whole).
    pub(crate) fn book(&self) -> MutexGuard<'_, Book<B>> {
        self.book.lock().unwrap_or_else(PoisonError::into_inner)
    }
}
