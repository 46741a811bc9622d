//! An IPC memory pool with named buffers (layer 7, beside the ring): one owner exports a block of memory (or a
//! few), sub-allocates buffers in it and names them; importers attach once and find every buffer by name, including
//! those allocated after they attached, with no new attach and no round trip to the owner.
//!
//! - [`SharedPool`] (owner): [`alloc`](SharedPool::alloc), [`share_existing`](SharedPool::share_existing) (memory
//!   another allocator made, exported in place), [`free`](SharedPool::free) (names go at once, bytes once no
//!   importer pins them and the GPU work on them is done), [`reclaim`](SharedPool::reclaim),
//!   [`stats`](SharedPool::stats).
//! - [`PoolImporter`]: [`attach`](PoolImporter::attach), [`lookup`](PoolImporter::lookup) (a pinned
//!   [`BufferView`]), [`list`](PoolImporter::list).
//!
//! How it works: the directory of names is a hash table in a sealed memfd that importers map read-only; each entry
//! is written under a sequence lock and carries a generation; importers pin what they look up in a pin table of
//! their own that the owner reads before it reuses freed bytes; a block an importer has not mapped is fetched once
//! on a block channel the offer hands it; the pool's socket is an [`ObjectDoor`](crate::door::ObjectDoor). The
//! layout and messages: `docs/pool.md` and `docs/protocol.md`.

mod alloc;
mod attachment;
mod blocks;
mod book;
mod directory;
mod error;
#[cfg(feature = "fuzzing")]
pub(crate) mod fuzzing;
mod handle;
mod host;
mod importer;
mod inbox;
pub mod layout;
mod owner;
mod server;
mod shared;
mod view;
mod wire;

pub use error::PoolError;
pub use handle::{BufferHandle, BufferInfo, PoolStats, ReclaimWatch};
pub use importer::{AttachOptions, PoolImporter};
pub use ipc_core::wire::{DType, TensorDesc};
pub(crate) use owner::device_uuid_of;
pub use owner::{PoolConfig, SharedPool};
pub use view::BufferView;
pub use wire::{
    BLOCK_PIECES_BYTES, BLOCK_REPLY_BYTES, BLOCK_REQUEST_BYTES, BlockPieces, BlockReply, BlockRequest,
    PIECES_PER_MESSAGE, POOL_OFFER_BYTES, POOL_OFFER_FDS, PoolOffer,
};

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod parts_tests;
#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests;
