//! The owner's bookkeeping, behind the pool's one mutex: blocks and their allocators, entry slots and names, the
//! freed buffers that importers still pin, the importers' pin tables; and every write to the directory.
//!
//! A freed buffer's entry is first marked retired (not found by name any more), then, once no live importer pins
//! its slot, the owner's handle on it is gone and the GPU work queued on it at free time has finished (its
//! [`Fence`]), its bytes go back to the allocator (or its existing allocation loses a user) and the slot becomes
//! vacant. Whether a retired buffer can go back is checked lazily: on every alloc, free, stats and reclaim. The mark and the pin check are a store-then-load pair against the importer's pin-then-recheck, with a
//! `SeqCst` fence on each side, so at least one side sees the other: either the owner sees the pin and waits, or the
//! importer sees the entry change and lets go ([`super::importer`]).

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{Ordering, fence};

use super::alloc::RangeAllocator;
use super::directory::{DirectoryWriter, EntryRecord};
use super::error::PoolError;
use super::handle::{BufferHandle, BufferLife, PoolStats};
use super::layout::{BlockId, BlockKind, EntryState, PINS_HEADER_WORDS, name_hash};
use super::wire::{BlockPieces, BlockReply, PIECES_PER_MESSAGE};
use gpu_ipc_driver::{DevicePtr, Event};
use ipc_core::backend::{Backend, BackendError, ExistingExport, SharedRegion, SpanPiece};
use ipc_core::shm::SharedMemory;
use ipc_core::wire::TensorDesc;

/// Every buffer's bytes start on this boundary and take a multiple of it (CUDA's own allocation alignment).
pub(crate) const MIN_ALIGN: u64 = 256;

/// What a block holds.
enum Origin<B: Backend> {
    /// The pool's own memory, sub-allocated.
    Pool { region: Arc<B::Exported>, allocator: RangeAllocator },
    /// An existing allocation shared in place; `users` buffers (live or pinned) lie in it.
    Existing { _keep_alive: Option<Box<dyn std::any::Any + Send + Sync>>, users: u32 },
}

/// One block: its export (made once; fds are duplicated per grant) and what it holds.
struct Block<B: Backend> {
    serial: u32,
    base: DevicePtr,
    /// The allocations it is made of, side by side: one, except for memory shared in place over several.
    pieces: Vec<SpanPiece>,
    origin: Origin<B>,
}

impl<B: Backend> Block<B> {
    /// Bytes an importer maps.
    fn size(&self) -> u64 {
        self.pieces.iter().map(|piece| piece.handle.size).sum()
    }
}

/// The answer to a block request: the reply, the fd that travels with it, and for a block of several allocations
/// the messages that follow it, each with its fds (duplicates, closed once sent).
pub(crate) struct BlockGrant {
    pub(crate) reply: BlockReply,
    pub(crate) fd: Option<std::os::fd::OwnedFd>,
    pub(crate) pieces: Vec<(BlockPieces, Vec<std::os::fd::OwnedFd>)>,
}

impl BlockGrant {
    fn gone(block: BlockId) -> Self {
        Self { reply: BlockReply::Gone { block }, fd: None, pieces: Vec::new() }
    }
}

/// A buffer's place in the directory, as the owner knows it.
struct Used {
    name: String,
    generation: u64,
    block: u32,
    offset: u64,
    /// Bytes taken from the block's allocator (0 for an existing allocation).
    reserved: u64,
    /// Shared with the owner's handle: freed, handle alive, reclaimed.
    life: Arc<BufferLife>,
    /// The GPU work a freed buffer waits for before its bytes go back ([`Fence::Done`] while live).
    fence: Fence,
}

/// What a freed buffer's bytes wait for on the GPU before they go back.
pub(crate) enum Fence {
    /// Nothing (the host backend; or the work is known finished).
    Done,
    /// The owner is waiting for its context's queued work (`cuCtxSynchronize`) outside the pool's lock.
    Syncing,
    /// An event recorded at free time on the stream the owner named.
    Event(Event),
    /// Waiting for the GPU failed (a broken context): the bytes are kept for the pool's life rather than reused.
    Failed,
}

impl Fence {
    /// Whether the GPU work it stands for has finished; an event whose query fails becomes [`Fence::Failed`].
    fn passed(&mut self, name: &str) -> bool {
        match self {
            Self::Done => true,
            Self::Syncing | Self::Failed => false,
            Self::Event(event) => match event.is_complete() {
                Ok(done) => done,
                Err(error) => {
                    tracing::error!(%error, buffer = name, "a freed buffer's event failed: its bytes are kept, never reused");
                    *self = Self::Failed;
                    false
                }
            },
        }
    }
}

enum Slot {
    Empty,
    Vacant,
    Used(Used),
}

/// Limits the owner was configured with.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Limits {
    pub(crate) max_pool_blocks: u32,
    pub(crate) grow_bytes: u64,
    pub(crate) max_buffers: u32,
    pub(crate) max_existing: u32,
}

/// The owner's state; see the module documentation.
pub(crate) struct Book<B: Backend> {
    directory: Arc<DirectoryWriter>,
    limits: Limits,
    blocks: Vec<Option<Block<B>>>,
    next_serial: u32,
    slots: Vec<Slot>,
    names: HashMap<String, u32>,
    pending: Vec<u32>,
    importers: HashMap<u32, SharedMemory>,
    next_generation: u64,
    high_water: u64,
    tally: Tally,
}

/// Buffers and their bytes (of the pool's own blocks), live and freed-but-pinned, kept as they change.
#[derive(Debug, Default, Clone, Copy)]
struct Tally {
    live_buffers: u32,
    pending_buffers: u32,
    live_bytes: u64,
    pending_bytes: u64,
}

impl<B: Backend> Book<B> {
    /// A book over a fresh directory, with no block yet.
    pub(crate) fn new(directory: DirectoryWriter, limits: Limits) -> Self {
        let geometry = directory.geometry();
        Self {
            blocks: (0..geometry.block_slots).map(|_| None).collect(),
            slots: (0..geometry.entry_slots).map(|_| Slot::Empty).collect(),
            directory: Arc::new(directory),
            limits,
            next_serial: 1,
            names: HashMap::new(),
            pending: Vec::new(),
            importers: HashMap::new(),
            next_generation: 1,
            high_water: 0,
            tally: Tally::default(),
        }
    }

    /// The directory, for offers.
    pub(crate) fn directory(&self) -> &DirectoryWriter {
        &self.directory
    }

    /// Lists a new block; returns its index.
    fn add_block(&mut self, base: DevicePtr, pieces: Vec<SpanPiece>, origin: Origin<B>) -> Option<u32> {
        let index = self.blocks.iter().position(Option::is_none)?;
        let serial = self.next_serial;
        self.next_serial = self.next_serial.checked_add(1).unwrap_or(1);
        let kind = match origin {
            Origin::Pool { .. } => BlockKind::Pool,
            Origin::Existing { .. } => BlockKind::Existing,
        };
        let index32 = u32::try_from(index).ok()?;
        let block = Block { serial, base, pieces, origin };
        self.directory.set_block(index32, serial, kind, block.size());
        if let Some(place) = self.blocks.get_mut(index) {
            *place = Some(block);
        }
        Some(index32)
    }

    /// Adds a block of the pool's own memory.
    ///
    /// # Errors
    /// The backend's export error; [`PoolError::TooManyAllocations`] when every block record is taken.
    pub(crate) fn add_pool_block(&mut self, region: B::Exported) -> Result<u32, PoolError> {
        let export = B::export(&region)?;
        let (base, len) = (region.ptr(), region.len());
        let origin = Origin::Pool { region: Arc::new(region), allocator: RangeAllocator::new(len) };
        let pieces = vec![SpanPiece { offset: 0, handle: export }];
        self.add_block(base, pieces, origin).ok_or(PoolError::TooManyAllocations { limit: self.limits.max_existing })
    }

    fn pool_blocks(&self) -> u32 {
        self.blocks.iter().flatten().filter(|b| matches!(b.origin, Origin::Pool { .. })).count() as u32
    }

    fn existing_blocks(&self) -> u32 {
        self.blocks.iter().flatten().filter(|b| matches!(b.origin, Origin::Existing { .. })).count() as u32
    }

    /// Checks a new buffer's name and description; the slot it will take.
    fn admit(&self, name: &str, len: u64, desc: Option<&TensorDesc>) -> Result<u32, PoolError> {
        check_name(name)?;
        if self.names.contains_key(name) {
            return Err(PoolError::NameTaken { name: name.to_owned() });
        }
        if let Some(desc) = desc
            && desc.span_bytes() > len
        {
            let reason = format!("the tensor {desc} spans {} bytes, more than the buffer's {len}", desc.span_bytes());
            return Err(PoolError::InvalidRequest { name: name.to_owned(), reason });
        }
        let used = self.tally.live_buffers + self.tally.pending_buffers;
        if used >= self.limits.max_buffers {
            return Err(PoolError::DirectoryFull { limit: self.limits.max_buffers });
        }
        let geometry = self.directory.geometry();
        let mut slot = geometry.home_slot(name_hash(name.as_bytes()));
        for _ in 0..geometry.entry_slots {
            if matches!(self.slots.get(slot as usize), Some(Slot::Empty | Slot::Vacant)) {
                return Ok(slot);
            }
            slot = geometry.next_slot(slot);
        }
        Err(PoolError::DirectoryFull { limit: self.limits.max_buffers })
    }

    /// Finds room for `reserved` bytes aligned to `align` in a block of the pool's own; `None` if none has it.
    fn place(&mut self, reserved: u64, align: u64) -> Option<(u32, u64)> {
        self.blocks.iter_mut().enumerate().find_map(|(index, block)| match block {
            Some(Block { origin: Origin::Pool { allocator, .. }, .. }) => {
                Some((index as u32, allocator.allocate(reserved, align)?))
            }
            _ => None,
        })
    }

    /// Allocates a named buffer in the pool's memory, growing it by a block made with `grow` when no block has
    /// room (up to the limit), after reclaiming what importers no longer pin.
    pub(crate) fn alloc(
        &mut self,
        name: &str,
        bytes: u64,
        align: u64,
        desc: Option<TensorDesc>,
        grow: impl FnOnce(u64) -> Result<B::Exported, BackendError>,
    ) -> Result<BufferHandle<B>, PoolError> {
        let invalid = |reason: String| PoolError::InvalidRequest { name: name.to_owned(), reason };
        if bytes == 0 {
            return Err(invalid("a buffer has at least one byte".into()));
        }
        if !align.is_power_of_two() {
            return Err(invalid(format!("alignment {align} is not a power of two")));
        }
        let mut slot = self.admit(name, bytes, desc.as_ref())?;
        let align = align.max(MIN_ALIGN);
        let reserved = bytes.checked_next_multiple_of(MIN_ALIGN).ok_or_else(|| invalid("too large".into()))?;
        let mut placed = self.place(reserved, align);
        if placed.is_none() && self.reclaim() > 0 {
            // The reclaim may have emptied slots before the one chosen (a retired buffer's, now a tombstone followed
            // by an empty slot): chosen again, or the entry would lie past an empty slot, where no probe reaches it.
            slot = self.admit(name, bytes, desc.as_ref())?;
            placed = self.place(reserved, align);
        }
        if placed.is_none() && self.pool_blocks() < self.limits.max_pool_blocks {
            let size = self.limits.grow_bytes.max(reserved.saturating_add(align));
            let index = self.add_pool_block(grow(size)?)?;
            tracing::info!(block = index, bytes = size, "the pool grew by a block");
            placed = self.place(reserved, align);
        }
        let Some((block, offset)) = placed else {
            let stats = self.stats();
            return Err(PoolError::OutOfMemory {
                name: name.to_owned(),
                bytes,
                align,
                largest_free: stats.largest_free,
                pending_reuse: stats.pending_bytes,
                blocks: stats.blocks,
                max_blocks: self.limits.max_pool_blocks,
            });
        };
        Ok(self.publish(slot, name, block, offset, bytes, reserved, desc))
    }

    /// Lists a buffer in existing memory, exported in place (one block per allocation, or per run of allocations
    /// side by side that a range spans: a second buffer in the same allocations uses the block the first one made).
    pub(crate) fn share_existing(
        &mut self,
        name: &str,
        ptr: DevicePtr,
        bytes: u64,
        desc: Option<TensorDesc>,
        export: ExistingExport,
    ) -> Result<BufferHandle<B>, PoolError> {
        let slot = self.admit(name, bytes, desc.as_ref())?;
        let same = |b: &Block<B>| {
            matches!(b.origin, Origin::Existing { .. })
                && b.base == export.base
                && b.pieces.len() == export.pieces.len()
                && b.size() == export.span_bytes()
        };
        let known = self.blocks.iter().position(|b| b.as_ref().is_some_and(same));
        let block = match known {
            Some(index) => index as u32,
            None => {
                if self.existing_blocks() >= self.limits.max_existing {
                    return Err(PoolError::TooManyAllocations { limit: self.limits.max_existing });
                }
                let origin = Origin::Existing { _keep_alive: export.keep_alive, users: 0 };
                self.add_block(export.base, export.pieces, origin)
                    .ok_or(PoolError::TooManyAllocations { limit: self.limits.max_existing })?
            }
        };
        if let Some(Some(Block { origin: Origin::Existing { users, .. }, .. })) = self.blocks.get_mut(block as usize) {
            *users += 1;
        }
        debug_assert_eq!(self.block_base(block).map(|b| b.offset(export.offset)), Some(ptr));
        Ok(self.publish(slot, name, block, export.offset, bytes, 0, desc))
    }

    fn block_base(&self, index: u32) -> Option<DevicePtr> {
        self.blocks.get(index as usize)?.as_ref().map(|b| b.base)
    }

    /// Writes a new live entry and returns its handle.
    #[allow(clippy::too_many_arguments)]
    fn publish(
        &mut self,
        slot: u32,
        name: &str,
        block: u32,
        offset: u64,
        len: u64,
        reserved: u64,
        desc: Option<TensorDesc>,
    ) -> BufferHandle<B> {
        let generation = self.next_generation;
        self.next_generation += 1;
        let (serial, base, region) = match self.blocks.get(block as usize).and_then(Option::as_ref) {
            Some(b) => (
                b.serial,
                b.base,
                match &b.origin {
                    Origin::Pool { region, .. } => Some(region.clone()),
                    Origin::Existing { .. } => None,
                },
            ),
            None => (0, DevicePtr(0), None),
        };
        let record = EntryRecord {
            state: EntryState::Live,
            generation,
            block: BlockId { index: block, serial },
            offset,
            len,
            name: name.to_owned(),
            desc: desc.clone(),
        };
        self.directory.write_entry(slot, &record);
        let (handle, life) = BufferHandle::new(
            name.to_owned(),
            generation,
            slot,
            base.offset(offset),
            len,
            desc,
            region,
            self.directory.clone(),
        );
        if let Some(place) = self.slots.get_mut(slot as usize) {
            let used = Used { name: name.to_owned(), generation, block, offset, reserved, life, fence: Fence::Done };
            *place = Slot::Used(used);
        }
        self.tally.live_buffers += 1;
        self.tally.live_bytes += reserved;
        self.high_water = self.high_water.max(self.tally.live_bytes + self.tally.pending_bytes);
        self.names.insert(name.to_owned(), slot);
        handle
    }

    /// Frees the live buffer `name` (of generation `generation`, when given): it is no longer found by name at
    /// once, and its handle refuses; its bytes are reused once no importer pins it, its handle is dropped and
    /// `fence` has passed. Returns its slot and generation (for [`Book::fence_passed`]).
    ///
    /// # Errors
    /// [`PoolError::NotFound`]; [`PoolError::StaleBuffer`] when the name now holds another generation.
    pub(crate) fn free(
        &mut self,
        name: &str,
        generation: Option<u64>,
        gpu_fence: Fence,
    ) -> Result<(u32, u64), PoolError> {
        self.reclaim();
        let Some(&slot) = self.names.get(name) else {
            return match generation {
                Some(held) => {
                    Err(PoolError::StaleBuffer { name: name.to_owned(), held_generation: held, current: None })
                }
                None => Err(PoolError::NotFound { name: name.to_owned() }),
            };
        };
        let current = match self.slots.get(slot as usize) {
            Some(Slot::Used(used)) => used.generation,
            _ => return Err(PoolError::NotFound { name: name.to_owned() }),
        };
        if let Some(held) = generation.filter(|g| *g != current) {
            return Err(PoolError::StaleBuffer {
                name: name.to_owned(),
                held_generation: held,
                current: Some(current),
            });
        }
        self.names.remove(name);
        if let Some(Slot::Used(used)) = self.slots.get_mut(slot as usize) {
            used.life.mark_freed();
            used.fence = gpu_fence;
            self.tally.live_buffers -= 1;
            self.tally.live_bytes -= used.reserved;
            self.tally.pending_buffers += 1;
            self.tally.pending_bytes += used.reserved;
        }
        self.directory.set_entry_state(slot, EntryState::Retired);
        // Pairs with the importer's fence between its pin and its recheck of the entry.
        fence(Ordering::SeqCst);
        if self.reusable(slot) {
            self.vacate(slot);
        } else {
            self.pending.push(slot);
        }
        Ok((slot, current))
    }

    /// Records that the GPU work a freed buffer waited for has finished (`passed`), or that waiting failed (its
    /// bytes are then kept for the pool's life); reclaims what can go back.
    pub(crate) fn fence_passed(&mut self, slot: u32, generation: u64, passed: bool) {
        if let Some(Slot::Used(used)) = self.slots.get_mut(slot as usize)
            && used.generation == generation
        {
            used.fence = if passed { Fence::Done } else { Fence::Failed };
        }
        self.reclaim();
    }

    /// Whether a retired buffer's bytes can go back now: no live importer pins it, its handle is gone, and the GPU
    /// work queued on it at free time has finished.
    fn reusable(&mut self, slot: u32) -> bool {
        if self.pinned(slot) {
            return false;
        }
        match self.slots.get_mut(slot as usize) {
            Some(Slot::Used(used)) => !used.life.handle_alive() && used.fence.passed(&used.name),
            _ => true,
        }
    }

    /// Whether any live importer pins `slot` (a counter a hostile importer wrote counts too: it only delays reuse
    /// while that importer lives).
    fn pinned(&self, slot: u32) -> bool {
        let word = PINS_HEADER_WORDS + slot as usize;
        self.importers.values().any(|pins| {
            pins.words(word, 1).ok().and_then(|w| w.first()).is_some_and(|w| w.load(Ordering::Relaxed) != 0)
        })
    }

    /// Freed buffers waiting for importers to unpin them.
    pub(crate) fn pending(&self) -> usize {
        self.pending.len()
    }

    /// Reuses the bytes of every retired buffer no importer pins any more; returns how many.
    pub(crate) fn reclaim(&mut self) -> usize {
        if self.pending.is_empty() {
            return 0;
        }
        fence(Ordering::SeqCst);
        let (free, still): (Vec<u32>, Vec<u32>) =
            std::mem::take(&mut self.pending).into_iter().partition(|s| self.reusable(*s));
        self.pending = still;
        for &slot in &free {
            self.vacate(slot);
        }
        free.len()
    }

    /// Gives a retired buffer's bytes back and makes its slot vacant (empty, where no probe needs it).
    fn vacate(&mut self, slot: u32) {
        // Only a used slot becomes vacant (an empty one stays empty: tombstones are only where entries were).
        let Some(place) = self.slots.get_mut(slot as usize).filter(|s| matches!(s, Slot::Used(_))) else { return };
        let Slot::Used(used) = std::mem::replace(place, Slot::Vacant) else { return };
        self.tally.pending_buffers -= 1;
        self.tally.pending_bytes -= used.reserved;
        used.life.mark_reclaimed();
        let mut retire_block = false;
        match self.blocks.get_mut(used.block as usize).and_then(Option::as_mut) {
            Some(Block { origin: Origin::Pool { allocator, .. }, .. }) => {
                let freed = allocator.free(used.offset, used.reserved);
                if !freed {
                    tracing::error!(name = %used.name, "the pool's allocator refused a free (a bookkeeping bug)");
                }
            }
            Some(Block { origin: Origin::Existing { users, .. }, .. }) => {
                *users = users.saturating_sub(1);
                retire_block = *users == 0;
            }
            None => {}
        }
        if retire_block && let Some(block) = self.blocks.get_mut(used.block as usize).and_then(Option::take) {
            self.directory.set_block(used.block, block.serial, BlockKind::None, 0);
            tracing::debug!(block = used.block, "an existing allocation is no longer shared");
        }
        self.directory.set_entry_state(slot, EntryState::Vacant);
        self.clear_tombstones(slot);
    }

    /// Turns vacant slots back into empty ones where no probe passes them: a vacant slot followed by an empty one
    /// ends every probe that reaches it, so it can be empty itself, and so can the vacant slots before it.
    fn clear_tombstones(&mut self, from: u32) {
        let geometry = self.directory.geometry();
        let mut slot = from;
        for _ in 0..geometry.entry_slots {
            let next_empty = matches!(self.slots.get(geometry.next_slot(slot) as usize), Some(Slot::Empty));
            if !next_empty || !matches!(self.slots.get(slot as usize), Some(Slot::Vacant)) {
                return;
            }
            if let Some(place) = self.slots.get_mut(slot as usize) {
                *place = Slot::Empty;
            }
            self.directory.set_entry_state(slot, EntryState::Empty);
            slot = slot.checked_sub(1).unwrap_or(geometry.entry_slots - 1);
        }
    }

    /// Registers an importer's pin table.
    pub(crate) fn add_importer(&mut self, peer: u32, pins: SharedMemory) {
        self.importers.insert(peer, pins);
    }

    /// Forgets an importer (it is gone: its pins no longer count) and reclaims what only it pinned. True if it
    /// was known.
    pub(crate) fn remove_importer(&mut self, peer: u32) -> bool {
        let known = self.importers.remove(&peer).is_some();
        if known {
            self.reclaim();
        }
        known
    }

    /// Whether `peer` is a live importer.
    pub(crate) fn has_importer(&self, peer: u32) -> bool {
        self.importers.contains_key(&peer)
    }

    /// What importer `peer` pins now: (views, buffers), as its pin table says.
    pub(crate) fn pins_of(&self, peer: u32) -> Option<(u64, u64)> {
        let pins = self.importers.get(&peer)?;
        let counts = pins.words(PINS_HEADER_WORDS, self.slots.len()).ok()?;
        let held = counts.iter().map(|w| w.load(Ordering::Relaxed)).filter(|n| *n != 0);
        Some(held.fold((0u64, 0u64), |(views, buffers), n| (views.saturating_add(n), buffers + 1)))
    }

    /// The names and generations of the buffers importer `peer` pins now, as its pin table says.
    pub(crate) fn pinned_by(&self, peer: u32) -> Vec<(String, u64)> {
        let Some(counts) = self.importers.get(&peer).and_then(|p| p.words(PINS_HEADER_WORDS, self.slots.len()).ok())
        else {
            return Vec::new();
        };
        counts
            .iter()
            .zip(&self.slots)
            .filter(|(count, _)| count.load(Ordering::Relaxed) != 0)
            .filter_map(|(_, slot)| match slot {
                Slot::Used(used) => Some((used.name.clone(), used.generation)),
                Slot::Empty | Slot::Vacant => None,
            })
            .collect()
    }

    /// Importers now.
    pub(crate) fn importer_count(&self) -> usize {
        self.importers.len()
    }

    /// The answer to a block request, with the fds to send (duplicates, closed once sent).
    pub(crate) fn grant(&self, id: BlockId) -> BlockGrant {
        let block = self.blocks.get(id.index as usize).and_then(Option::as_ref).filter(|b| b.serial == id.serial);
        let Some(block) = block else { return BlockGrant::gone(id) };
        let duplicate = |piece: &SpanPiece| piece.handle.fd.as_ref().map(|fd| rustix::io::fcntl_dupfd_cloexec(fd, 0));
        let out_of_fds = || {
            tracing::warn!(
                block = id.index,
                "could not duplicate a block's fd (out of fds?): telling the importer it is gone"
            );
            BlockGrant::gone(id)
        };
        match block.pieces.as_slice() {
            [piece] => {
                let fd = match duplicate(piece) {
                    Some(Ok(fd)) => Some(fd),
                    Some(Err(_)) => return out_of_fds(),
                    None => None,
                };
                let legacy_handle = <[u8; 64]>::try_from(piece.handle.bytes.as_slice()).ok();
                let with_fd = fd.is_some();
                let reply = BlockReply::Grant { block: id, bytes: block.size(), legacy_handle, with_fd, pieces: 1 };
                BlockGrant { reply, fd, pieces: Vec::new() }
            }
            several => {
                let mut messages = Vec::with_capacity(several.len().div_ceil(PIECES_PER_MESSAGE));
                for (n, chunk) in several.chunks(PIECES_PER_MESSAGE).enumerate() {
                    let mut fds = Vec::with_capacity(chunk.len());
                    for piece in chunk {
                        match duplicate(piece) {
                            Some(Ok(fd)) => fds.push(fd),
                            _ => return out_of_fds(),
                        }
                    }
                    let first = (n * PIECES_PER_MESSAGE) as u32;
                    let pieces = chunk.iter().map(|piece| (piece.offset, piece.handle.size)).collect();
                    messages.push((BlockPieces { block: id, first, pieces }, fds));
                }
                let pieces = several.len() as u32;
                let reply =
                    BlockReply::Grant { block: id, bytes: block.size(), legacy_handle: None, with_fd: false, pieces };
                BlockGrant { reply, fd: None, pieces: messages }
            }
        }
    }

    /// The pool's numbers now.
    pub(crate) fn stats(&self) -> PoolStats {
        let mut stats = PoolStats {
            high_water_bytes: self.high_water,
            importers: self.importers.len() as u32,
            ..PoolStats::default()
        };
        for block in self.blocks.iter().flatten() {
            match &block.origin {
                Origin::Pool { allocator, .. } => {
                    let usage = allocator.usage();
                    stats.blocks += 1;
                    stats.capacity_bytes += usage.capacity;
                    stats.free_bytes += usage.free;
                    stats.largest_free = stats.largest_free.max(usage.largest_free);
                    stats.free_ranges += usage.free_ranges;
                }
                Origin::Existing { .. } => stats.shared_allocations += 1,
            }
        }
        stats.live_buffers = self.tally.live_buffers;
        stats.pending_buffers = self.tally.pending_buffers;
        stats.live_bytes = self.tally.live_bytes;
        stats.pending_bytes = self.tally.pending_bytes;
        stats.fragmentation =
            if stats.free_bytes == 0 { 0.0 } else { 1.0 - stats.largest_free as f64 / stats.free_bytes as f64 };
        stats
    }

    /// Marks the directory closed (the owner is going away cleanly).
    pub(crate) fn close(&self) {
        self.directory.set_owner_state(super::layout::OwnerState::Closed);
    }
}

/// Checks a buffer name: 1 to [`MAX_NAME_BYTES`](super::layout::MAX_NAME_BYTES) bytes of UTF-8, no NUL.
///
/// # Errors
/// [`PoolError::InvalidName`] saying why.
pub(crate) fn check_name(name: &str) -> Result<(), PoolError> {
    let reason = if name.is_empty() {
        "a name has at least one byte".to_owned()
    } else if name.len() > super::layout::MAX_NAME_BYTES {
        format!("{} bytes, at most {}", name.len(), super::layout::MAX_NAME_BYTES)
    } else if name.contains('\0') {
        "a name has no NUL byte".to_owned()
    } else {
        return Ok(());
    };
    Err(PoolError::InvalidName { name: name.to_owned(), reason })
}

#[cfg(test)]
#[path = "book_tests.rs"]
mod tests;
