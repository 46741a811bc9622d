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
use gpu_ipc_driver::DevicePtr;
use ipc_core::backend::{Backend, ExportedHandle, SharedRegion, SpanPiece};
use ipc_core::wire::{WireError, recv_bytes, send_bytes};

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
    /// The importer's context, which its blocks are mapped in.
    pub(crate) fn context(&self) -> &B::Context {
        &self.ctx
    }

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
                let started = std::time::Instant::now();
                let region = B::import(&self.ctx, handle).map_err(PoolError::Backend)?;
                let import_us = started.elapsed().as_micros();
                tracing::debug!(block = id.index, serial = id.serial, bytes, import_us, "imported a pool block");
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
            WireError::Timeout { after, .. } => {
                PoolError::Timeout { what: "the owner's block allocations", waited: after }
            }
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
        let total = ipc_core::backend::check_span(B::KIND.name(), &span).map_err(PoolError::Backend)?;
        if total != bytes {
            let problem = format!("the {count} allocations of {id} add up to {total} bytes, the grant says {bytes}");
            return Err(self.protocol(problem).into());
        }
        Ok(span)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    //! An owner that answers a block request with a hostile grant of several allocations: the importer refuses it
    //! before it maps anything, with the reason.

    use std::os::unix::net::UnixStream;

    use super::*;
    use crate::pool::wire::{BLOCK_REQUEST_BYTES, BlockPieces};
    use ipc_core::host::{Host, HostContext};
    use ipc_core::shm::SharedMemory;

    const ID: BlockId = BlockId { index: 1, serial: 5 };

    /// One `BlockPieces` message as the hostile owner sends it: block, first, (offset, bytes) pairs, fds sent.
    type Sent = (BlockId, u32, Vec<(u64, u64)>, usize);

    /// What the hostile owner sends after the request: the grant (`pieces` allocations, `bytes` in all), then
    /// messages of (offset, bytes) pairs, each sent with as many fds as `fds_with` says for it.
    struct Answer {
        pieces: u32,
        bytes: u64,
        messages: Vec<Sent>,
    }

    /// Asks a hostile owner that sends `answer` (memfds of one page each) for block [`ID`]; the import's outcome.
    fn import_from(answer: Answer) -> Result<u64, String> {
        let page = rustix::param::page_size() as u64;
        let (ours, theirs) = UnixStream::pair().unwrap();
        let owner = std::thread::spawn(move || {
            let mut request = [0u8; BLOCK_REQUEST_BYTES];
            recv_bytes(theirs.as_fd(), &mut request, Duration::from_secs(5)).unwrap();
            let grant = BlockReply::Grant {
                block: ID,
                bytes: answer.bytes,
                legacy_handle: None,
                with_fd: false,
                pieces: answer.pieces,
            };
            send_bytes(theirs.as_fd(), &grant.encode(), Vec::new(), Duration::from_secs(5)).unwrap();
            let memory = SharedMemory::create_side_by_side("hostile", &[page as usize; 4]).unwrap();
            for (block, first, pieces, fds) in answer.messages {
                let bytes = BlockPieces { block, first, pieces }.encode().unwrap();
                let fds = (0..fds).map(|i| memory.try_clone_piece_fd(i % 4).unwrap()).collect();
                if send_bytes(theirs.as_fd(), &bytes, fds, Duration::from_secs(5)).is_err() {
                    break; // the importer gave up
                }
            }
            theirs // kept open until the importer is done
        });
        let cache =
            BlockCache::<Host>::new(HostContext, Path::new("hostile.sock"), Duration::from_secs(2), ours.into());
        let outcome = match cache.import(ID) {
            Ok(block) => Ok(block.len()),
            Err(BlockMiss::Gone) => Err("gone".to_owned()),
            Err(BlockMiss::Failed(error)) => Err(error.to_string()),
        };
        drop(cache);
        drop(owner.join().unwrap());
        outcome
    }

    #[test]
    fn a_grant_of_several_allocations_is_imported_only_when_its_pieces_add_up() {
        let page = rustix::param::page_size() as u64;
        let p = |n: u64| n * page;
        // Right: 3 allocations side by side, in two messages (2 + 1).
        let good = Answer {
            pieces: 3,
            bytes: p(3),
            messages: vec![(ID, 0, vec![(0, p(1)), (p(1), p(1))], 2), (ID, 2, vec![(p(2), p(1))], 1)],
        };
        assert_eq!(import_from(good), Ok(p(3)));

        let refused = |answer: Answer, expected: &str| {
            let err = import_from(answer).unwrap_err();
            assert!(err.contains(expected), "expected {expected:?} in: {err}");
        };
        // Overlapping pieces.
        refused(
            Answer { pieces: 2, bytes: p(2), messages: vec![(ID, 0, vec![(0, p(1)), (p(1) / 2, p(1))], 2)] },
            "overlaps",
        );
        // A gap between them.
        refused(Answer { pieces: 2, bytes: p(3), messages: vec![(ID, 0, vec![(0, p(1)), (p(2), p(1))], 2)] }, "gap");
        // Sizes that do not add up to the grant's.
        refused(
            Answer { pieces: 2, bytes: p(3), messages: vec![(ID, 0, vec![(0, p(1)), (p(1), p(1))], 2)] },
            "add up to",
        );
        // More allocations than announced; a message for another block; one out of order.
        refused(
            Answer { pieces: 2, bytes: p(3), messages: vec![(ID, 0, vec![(0, p(1)), (p(1), p(1)), (p(2), p(1))], 3)] },
            "more allocations than the 2",
        );
        let other = BlockId { index: 2, serial: 5 };
        refused(
            Answer { pieces: 2, bytes: p(2), messages: vec![(other, 0, vec![(0, p(1)), (p(1), p(1))], 2)] },
            "after the grant",
        );
        refused(
            Answer { pieces: 2, bytes: p(2), messages: vec![(ID, 1, vec![(0, p(1)), (p(1), p(1))], 2)] },
            "after the grant",
        );
        // Fewer fds than the message says (and more, which a message of 8 cannot carry): refused as a mismatch.
        refused(
            Answer { pieces: 2, bytes: p(2), messages: vec![(ID, 0, vec![(0, p(1)), (p(1), p(1))], 1)] },
            "expected 2 file descriptors, got 1",
        );
        refused(
            Answer { pieces: 2, bytes: p(2), messages: vec![(ID, 0, vec![(0, p(1)), (p(1), p(1))], 3)] },
            "expected 2 file descriptors, got 3",
        );
        // A size that is not the memfd's.
        refused(
            Answer { pieces: 2, bytes: p(3), messages: vec![(ID, 0, vec![(0, p(1)), (p(1), p(2))], 2)] },
            "expected",
        );
        // Too many allocations announced: refused before any is read.
        let many = ipc_core::backend::MAX_SPAN_ALLOCATIONS as u32 + 1;
        refused(Answer { pieces: many, bytes: p(1) * u64::from(many), messages: Vec::new() }, "BlockReply.pieces");
        // Nothing follows the grant: the importer waits its timeout, no longer.
        refused(Answer { pieces: 2, bytes: p(2), messages: Vec::new() }, "timed out");
    }
}
