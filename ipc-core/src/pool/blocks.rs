//! An importer's mapped blocks, and the block channel it asks the owner for a block's handle on (once per block).

use std::collections::HashMap;
use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use super::directory::{Words, block_record};
use super::error::PoolError;
use super::layout::{BlockId, BlockKind, Geometry, header};
use super::wire::{BLOCK_PIECES_BYTES, BLOCK_REPLY_BYTES, BlockPieces, BlockReply, BlockRequest};
use crate::backend::{Backend, ExportedHandle, SharedRegion, SpanPiece};
use crate::driver::DevicePtr;
use crate::wire::{WireError, recv_bytes, send_bytes};

/// One block as this importer mapped it.
pub(crate) struct ImportedBlock<B: Backend> {
    pub(crate) id: BlockId,
    pub(crate) region: B::Imported,
}

impl<B: Backend> ImportedBlock<B> {
    /// Where the block starts in this process.
    pub(crate) fn base(&self) -> DevicePtr {
        self.region.ptr()
    }

    /// Its mapped length.
    pub(crate) fn len(&self) -> u64 {
        self.region.len()
    }
}

/// Whether the directory still lists block `id` (same serial, in use).
fn still_listed<W: Words + ?Sized>(directory: &W, geometry: Geometry, id: BlockId) -> bool {
    block_record(directory, geometry, id.index)
        .is_some_and(|(kind, serial, _)| kind != BlockKind::None && serial == id.serial)
}

/// Why a block could not be had.
pub(crate) enum BlockMiss {
    /// The owner no longer has that block (it was retired): look the name up again.
    Gone,
    /// Anything else.
    Failed(PoolError),
}

impl From<PoolError> for BlockMiss {
    fn from(e: PoolError) -> Self {
        Self::Failed(e)
    }
}

/// The blocks this importer mapped, by index, and the channel to ask for more.
pub(crate) struct BlockCache<B: Backend> {
    ctx: B::Context,
    path: PathBuf,
    timeout: Duration,
    channel: OwnedFd,
    blocks: Mutex<HashMap<u32, Arc<ImportedBlock<B>>>>,
    /// The directory's `CHANGES` word when the mappings were last compared with its block records.
    seen_changes: AtomicU64,
}

impl<B: Backend> BlockCache<B> {
    pub(crate) fn new(ctx: B::Context, path: &Path, timeout: Duration, channel: OwnedFd) -> Self {
        Self {
            ctx,
            path: path.to_path_buf(),
            timeout,
            channel,
            blocks: Mutex::new(HashMap::new()),
            seen_changes: AtomicU64::new(u64::MAX),
        }
    }

    /// Blocks mapped now.
    pub(crate) fn mapped(&self) -> usize {
        self.blocks.lock().unwrap_or_else(PoisonError::into_inner).len()
    }

    /// Lets go of the mappings of blocks the owner retired (an existing allocation no longer shared), once the
    /// directory changed since the last look: one load when it did not. Views that hold such a block keep it.
    pub(crate) fn forget_retired<W: Words + ?Sized>(&self, directory: &W, geometry: Geometry) {
        let changes = directory.word(header::CHANGES).unwrap_or(0);
        if self.seen_changes.load(Ordering::Relaxed) == changes {
            return;
        }
        self.seen_changes.store(changes, Ordering::Relaxed);
        let mut blocks = self.blocks.lock().unwrap_or_else(PoisonError::into_inner);
        blocks.retain(|_, block| still_listed(directory, geometry, block.id));
    }

    /// Block `id`, mapped: from the cache, or asked for on the channel and imported (the only round trip to the
    /// owner after attaching, once per block). Mappings of blocks the directory no longer lists are let go on the
    /// way (views that hold them keep them until they drop).
    pub(crate) fn get<W: Words + ?Sized>(
        &self,
        id: BlockId,
        directory: &W,
        geometry: Geometry,
    ) -> Result<Arc<ImportedBlock<B>>, BlockMiss> {
        let mut blocks = self.blocks.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(block) = blocks.get(&id.index).filter(|b| b.id == id) {
            return Ok(block.clone());
        }
        blocks.retain(|_, block| still_listed(directory, geometry, block.id));
        let block = Arc::new(self.import(id)?);
        blocks.insert(id.index, block.clone());
        Ok(block)
    }

    fn protocol(&self, problem: String) -> PoolError {
        PoolError::Protocol { path: self.path.clone(), what: "block reply", problem }
    }

    fn import(&self, id: BlockId) -> Result<ImportedBlock<B>, BlockMiss> {
        let gone = |e: WireError| match e {
            WireError::PeerHungUp { .. } => PoolError::OwnerGone { path: self.path.clone(), how: "hung up" },
            WireError::Timeout { after, .. } => PoolError::Timeout { what: "the owner's block reply", waited: after },
            other => PoolError::Wire(other),
        };
        send_bytes(self.channel.as_fd(), &BlockRequest { block: id }.encode(), Vec::new(), self.timeout)
            .map_err(gone)?;
        let mut reply = [0u8; BLOCK_REPLY_BYTES];
        let mut fds = recv_bytes(self.channel.as_fd(), &mut reply, self.timeout).map_err(gone)?;
        let reply = BlockReply::decode(&reply, fds.len()).map_err(|e| self.protocol(e.to_string()))?;
        match reply {
            BlockReply::Gone { block } if block == id => Err(BlockMiss::Gone),
            BlockReply::Grant { block, bytes, pieces, .. } if block == id && pieces > 1 => {
                let span = self.receive_pieces(id, pieces, bytes)?;
                let region = B::import_span(&self.ctx, span).map_err(PoolError::Backend)?;
                tracing::debug!(block = id.index, serial = id.serial, bytes, pieces, "imported a pool block");
                Ok(ImportedBlock { id, region })
            }
            BlockReply::Grant { block, bytes, legacy_handle, .. } if block == id => {
                let handle = ExportedHandle {
                    bytes: legacy_handle.map(|h| h.to_vec()).unwrap_or_default(),
                    fd: fds.pop(),
                    size: bytes,
                };
                let region = B::import(&self.ctx, handle).map_err(PoolError::Backend)?;
                tracing::debug!(block = id.index, serial = id.serial, bytes, "imported a pool block");
                Ok(ImportedBlock { id, region })
            }
            other => Err(self.protocol(format!("asked for {id}, got an answer about {other:?}")).into()),
        }
    }

    /// The `count` allocations of block `id` (`bytes` in all), from the messages that follow its grant, with their
    /// fds: checked to follow one another from offset 0 and to add up to `bytes` before anything is imported.
    fn receive_pieces(&self, id: BlockId, count: u32, bytes: u64) -> Result<Vec<SpanPiece>, BlockMiss> {
        let gone = |e: WireError| match e {
            WireError::PeerHungUp { .. } => PoolError::OwnerGone { path: self.path.clone(), how: "hung up" },
            WireError::Timeout { after, .. } => PoolError::Timeout { what: "the owner's block allocations", waited: after },
            other => PoolError::Wire(other),
        };
        let mut span = Vec::with_capacity(count as usize);
        while span.len() < count as usize {
            let mut message = [0u8; BLOCK_PIECES_BYTES];
            let fds = recv_bytes(self.channel.as_fd(), &mut message, self.timeout).map_err(gone)?;
            let pieces = BlockPieces::decode(&message, fds.len()).map_err(|e| self.protocol(e.to_string()))?;
            if pieces.block != id || pieces.first as usize != span.len() {
                let problem = format!(
                    "allocations {}.. of {} after the grant of allocations {}.. of {id}",
                    pieces.first,
                    pieces.block,
                    span.len()
                );
                return Err(self.protocol(problem).into());
            }
            if span.len() + pieces.pieces.len() > count as usize {
                let problem = format!("more allocations than the {count} the grant of {id} announced");
                return Err(self.protocol(problem).into());
            }
            for ((offset, size), fd) in pieces.pieces.into_iter().zip(fds) {
                span.push(SpanPiece { offset, handle: ExportedHandle { bytes: Vec::new(), fd: Some(fd), size } });
            }
        }
        let total = crate::backend::check_span(B::KIND.name(), &span).map_err(PoolError::Backend)?;
        if total != bytes {
            let problem = format!("the {count} allocations of {id} add up to {total} bytes, the grant says {bytes}");
            return Err(self.protocol(problem).into());
        }
        Ok(span)
    }
}
