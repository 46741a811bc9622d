//! What can go wrong with a pool, on the owner's side and on an importer's, with what to do about it.

use std::path::PathBuf;
use std::time::Duration;

use crate::door::DoorError;
use gpu_ipc_driver::DeviceUuid;
use ipc_core::backend::BackendError;
use ipc_core::shm::ShmError;
use ipc_core::wire::WireError;

/// Why a pool operation failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PoolError {
    /// The buffer a handle or view stands for was freed (and maybe its name given to a new buffer).
    #[error(
        "buffer `{name}` is stale: it was generation {held_generation}, {}; look the name up again",
        match current { Some(g) => format!("the name now holds generation {g}"), None => "the name is free now".to_owned() }
    )]
    StaleBuffer {
        /// The buffer's name.
        name: String,
        /// The generation the handle or view holds.
        held_generation: u64,
        /// The generation the name holds now, if any.
        current: Option<u64>,
    },
    /// No live buffer has that name.
    #[error("no buffer named `{name}` in the pool")]
    NotFound {
        /// The name looked up.
        name: String,
    },
    /// A live buffer has that name already.
    #[error("a buffer named `{name}` exists already: free it first, or choose another name")]
    NameTaken {
        /// The name.
        name: String,
    },
    /// The name cannot be used.
    #[error("invalid buffer name {name:?}: {reason}")]
    InvalidName {
        /// The name.
        name: String,
        /// What is wrong with it.
        reason: String,
    },
    /// A request the pool cannot serve as asked (alignment, size, tensor description).
    #[error("buffer `{name}`: {reason}")]
    InvalidRequest {
        /// The buffer's name.
        name: String,
        /// What is wrong.
        reason: String,
    },
    /// No block has a free range that holds the buffer, and the pool may not grow.
    #[error(
        "no room for {bytes} bytes aligned to {align} (buffer `{name}`): the largest free range is {largest_free} \
         bytes, {pending_reuse} bytes of freed buffers wait for importers' views, the owner's handles or GPU work to end, {blocks} of at most \
         {max_blocks} blocks exist; raise PoolConfig::capacity or PoolConfig::max_blocks, or free buffers"
    )]
    OutOfMemory {
        /// The buffer asked for.
        name: String,
        /// Its size.
        bytes: u64,
        /// Its alignment.
        align: u64,
        /// The longest free range of any block.
        largest_free: u64,
        /// Bytes freed but still held (importers' views, the owner's handles, GPU work).
        pending_reuse: u64,
        /// Blocks the pool has.
        blocks: u32,
        /// Blocks it may have.
        max_blocks: u32,
    },
    /// Every directory entry is taken (live buffers, and freed ones importers still pin).
    #[error("the pool's directory holds {limit} buffers at most and is full; raise PoolConfig::max_buffers")]
    DirectoryFull {
        /// The limit.
        limit: u32,
    },
    /// Every block record is taken (blocks of the pool and existing allocations shared in place).
    #[error(
        "the pool lists {limit} existing allocations at most and they are all shared; raise \
         PoolConfig::max_shared_allocations or free some"
    )]
    TooManyAllocations {
        /// The limit.
        limit: u32,
    },
    /// The backend could not allocate, export or import memory.
    #[error(transparent)]
    Backend(#[from] BackendError),
    /// Shared memory (directory, pin table) could not be made or mapped.
    #[error("pool shared memory: {0}")]
    Shm(#[from] ShmError),
    /// The front door: nothing listens, the owner refused, the handshake failed.
    #[error(transparent)]
    Door(#[from] DoorError),
    /// A message on the block channel could not be sent, received or decoded.
    #[error("pool block channel: {0}")]
    Wire(#[from] WireError),
    /// The owner is gone: views already held stay usable, nothing new can be looked up.
    #[error(
        "the pool's owner at {} is gone (it {how}); views you hold stay valid until you drop them, but nothing \
         new can be looked up: attach to a new owner",
        path.display()
    )]
    OwnerGone {
        /// The pool's socket.
        path: PathBuf,
        /// How it left: "closed the pool" or "hung up".
        how: &'static str,
    },
    /// The pool's memory is on another GPU than the importer's context.
    #[error(
        "the pool at {} is on device {offered}, this importer's context is on device {here}: attach from a context \
         on the pool's GPU (the ordinal `nvidia-smi -L` lists with {offered}, counted as CUDA_VISIBLE_DEVICES orders \
         them)",
        path.display()
    )]
    WrongDevice {
        /// The pool's socket.
        path: PathBuf,
        /// The device UUID the owner's offer names.
        offered: DeviceUuid,
        /// The device UUID of the importer's context.
        here: DeviceUuid,
    },
    /// The owner sent something no owner of this layout sends.
    #[error("the pool at {} sent a malformed {what}: {problem}", path.display())]
    Protocol {
        /// The pool's socket.
        path: PathBuf,
        /// What was malformed.
        what: &'static str,
        /// How.
        problem: String,
    },
    /// A bounded wait ran out.
    #[error("timed out after {waited:?} waiting for {what}")]
    Timeout {
        /// What was waited for.
        what: &'static str,
        /// How long.
        waited: Duration,
    },
    /// The pool's configuration is not valid.
    #[error("invalid pool configuration: {0}")]
    Config(String),
    /// An operation needs something this pool or backend does not have.
    #[error("{0}")]
    Unsupported(String),
}
