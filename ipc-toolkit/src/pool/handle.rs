//! What the owner holds for a buffer ([`BufferHandle`]), what anyone may know about one ([`BufferInfo`]), and the
//! pool's numbers ([`PoolStats`]).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use serde::Serialize;

use super::directory::{DirectoryWriter, find};
use super::error::PoolError;
use gpu_ipc_driver::{Context, DeviceMemory, DevicePtr, DeviceSpan, Entered};
use ipc_core::backend::{Backend, GpuBackend, MemoryAccess, ReachableRegion};
use ipc_core::host::Host;
use ipc_core::wire::TensorDesc;

/// Where one buffer is in its life, shared by its [`BufferHandle`], the owner's book and any [`ReclaimWatch`].
#[derive(Debug, Default)]
pub(crate) struct BufferLife {
    /// Set when the buffer is freed (by handle or by name): the handle refuses from then on.
    freed: AtomicBool,
    /// Cleared when the handle drops: while it lives, the freed buffer's bytes are not reused (a span borrowed
    /// from it may still be in use). Never set for an existing allocation shared in place (its handle gives no
    /// access to the bytes).
    handle_alive: AtomicBool,
    /// Set when the bytes went back to the pool (or the existing allocation stopped being shared).
    reclaimed: AtomicBool,
}

impl BufferLife {
    /// The life of a buffer whose handle gives access to its bytes (`holds_bytes`: the pool's own memory) or not
    /// (an existing allocation shared in place: its owner reaches it through its own allocator's handle).
    fn new(holds_bytes: bool) -> Self {
        Self {
            freed: AtomicBool::new(false),
            handle_alive: AtomicBool::new(holds_bytes),
            reclaimed: AtomicBool::new(false),
        }
    }

    pub(crate) fn mark_freed(&self) {
        self.freed.store(true, Ordering::Release);
    }

    pub(crate) fn handle_alive(&self) -> bool {
        self.handle_alive.load(Ordering::Acquire)
    }

    pub(crate) fn mark_reclaimed(&self) {
        self.reclaimed.store(true, Ordering::Release);
    }
}

/// Tells whether a buffer's bytes went back to the pool: freed, no importer pinning it, its handle dropped and
/// the GPU work queued on it at free time finished. Made by [`BufferHandle::reclaim_watch`]; outlives the handle.
/// What holds memory another allocator made (a Python front end's tensor) lets go of it when this says so.
#[derive(Debug, Clone)]
pub struct ReclaimWatch {
    life: Arc<BufferLife>,
    generation: u64,
}

impl ReclaimWatch {
    /// True once the buffer's bytes were given back (checked when the owner calls
    /// [`SharedPool::reclaim`](super::SharedPool::reclaim), `alloc`, `free` or `stats`).
    pub fn is_reclaimed(&self) -> bool {
        self.life.reclaimed.load(Ordering::Acquire)
    }

    /// True once the buffer was freed.
    pub fn is_freed(&self) -> bool {
        self.life.freed.load(Ordering::Acquire)
    }

    /// The generation of the buffer it watches.
    pub fn generation(&self) -> u64 {
        self.generation
    }
}

/// The owner's handle on a buffer it allocated or shared: its name, generation and memory. Moved into
/// [`SharedPool::free`](super::SharedPool::free), so one handle frees one buffer once.
///
/// Once its buffer is freed (by name, [`SharedPool::free_name`](super::SharedPool::free_name)), the handle refuses
/// every use ([`span`](Self::span), `read`, `write`, [`free`](super::SharedPool::free)) with
/// [`PoolError::StaleBuffer`], and a buffer of the pool's own memory is not reused while it lives: a span borrowed
/// from it before the free never points into another buffer. Drop it to let the bytes go back.
///
/// A handle of the pool's own memory keeps that memory mapped while it lives (even past the pool's drop), so its
/// [`span`](BufferHandle::span) stays valid.
#[must_use = "a buffer stays allocated until it is freed"]
pub struct BufferHandle<B: Backend> {
    name: String,
    generation: u64,
    slot: u32,
    ptr: DevicePtr,
    len: u64,
    desc: Option<TensorDesc>,
    /// The block of the pool's own memory it lies in; `None` for an existing allocation shared in place.
    region: Option<Arc<B::Exported>>,
    life: Arc<BufferLife>,
    /// The pool's directory, to say which generation the name holds once this one is stale.
    directory: Arc<DirectoryWriter>,
    /// The pool's CUDA context (`None` on the host backend), entered around copies from and to the host: the
    /// device's memory may not be reachable from the context current on the calling thread (VMM memory is mapped
    /// for its own device only).
    ctx: Option<Context>,
}

impl<B: Backend> std::fmt::Debug for BufferHandle<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BufferHandle")
            .field("name", &self.name)
            .field("generation", &self.generation)
            .field("ptr", &self.ptr)
            .field("len", &self.len)
            .finish_non_exhaustive()
    }
}

impl<B: Backend> BufferHandle<B> {
    /// A handle on a buffer just published, and the life the book keeps of it.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new(
        name: String,
        generation: u64,
        slot: u32,
        ptr: DevicePtr,
        len: u64,
        desc: Option<TensorDesc>,
        region: Option<Arc<B::Exported>>,
        directory: Arc<DirectoryWriter>,
    ) -> (Self, Arc<BufferLife>) {
        let life = Arc::new(BufferLife::new(region.is_some()));
        (Self { name, generation, slot, ptr, len, desc, region, life: life.clone(), directory, ctx: None }, life)
    }

    /// The handle, its copies from and to the host made in `ctx` (the pool's CUDA context).
    pub(crate) fn in_context(mut self, ctx: Option<&Context>) -> Self {
        self.ctx = ctx.cloned();
        self
    }

    /// `Ok` while the buffer is live; [`PoolError::StaleBuffer`] (with the generation its name holds now, if
    /// any) once it was freed.
    ///
    /// # Errors
    /// [`PoolError::StaleBuffer`].
    pub fn check_current(&self) -> Result<(), PoolError> {
        if !self.life.freed.load(Ordering::Acquire) {
            return Ok(());
        }
        let current = find(self.directory.words(), self.directory.geometry(), &self.name)
            .ok()
            .flatten()
            .map(|(_, _, record)| record.generation)
            .filter(|g| *g != self.generation);
        Err(PoolError::StaleBuffer { name: self.name.clone(), held_generation: self.generation, current })
    }

    /// True once the buffer was freed (the handle refuses every use then).
    pub fn is_freed(&self) -> bool {
        self.life.freed.load(Ordering::Acquire)
    }

    /// A watch that says when the buffer's bytes went back to the pool, after it is freed.
    pub fn reclaim_watch(&self) -> ReclaimWatch {
        ReclaimWatch { life: self.life.clone(), generation: self.generation }
    }

    /// The buffer's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Its generation: unique for the pool's life.
    pub fn generation(&self) -> u64 {
        self.generation
    }

    /// Its directory slot (importers pin by slot).
    pub fn slot(&self) -> u32 {
        self.slot
    }

    /// Its address in the owner's process.
    pub fn ptr(&self) -> DevicePtr {
        self.ptr
    }

    /// Its length in bytes, as asked for.
    pub fn len(&self) -> u64 {
        self.len
    }

    /// Always false: buffers have at least one byte.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Its tensor description, if it was given one.
    pub fn desc(&self) -> Option<&TensorDesc> {
        self.desc.as_ref()
    }

    /// Everything an importer could learn about it.
    pub fn info(&self) -> BufferInfo {
        BufferInfo { name: self.name.clone(), generation: self.generation, len: self.len, desc: self.desc.clone() }
    }

    /// The block it lies in, once the buffer is checked to be live.
    fn pool_region(&self) -> Result<&B::Exported, PoolError> {
        self.check_current()?;
        self.region.as_deref().ok_or_else(|| {
            PoolError::Unsupported(format!(
                "buffer `{}` is an existing allocation shared in place: write it through your own handle on it",
                self.name
            ))
        })
    }
}

impl<B: Backend> Drop for BufferHandle<B> {
    fn drop(&mut self) {
        self.life.handle_alive.store(false, Ordering::Release);
    }
}

impl<B: GpuBackend> BufferHandle<B> {
    /// The buffer's memory, for kernels and copies in the owner's process. Work queued on it must be on the stream
    /// given to [`SharedPool::free_after`](super::SharedPool::free_after), or finished when
    /// [`SharedPool::free`](super::SharedPool::free) returns (it waits for the context's queued work).
    ///
    /// # Errors
    /// [`PoolError::StaleBuffer`] once the buffer was freed; [`PoolError::Unsupported`] for an existing allocation
    /// shared in place (it is yours already).
    pub fn span(&self) -> Result<DeviceSpan<'_>, PoolError> {
        let region = self.pool_region()?;
        region.span().sub_span_at(self.ptr, self.len).map_err(|e| PoolError::Backend(e.into()))
    }
}

impl BufferHandle<Host> {
    /// Writes `src` at byte `offset` of the buffer (the host backend's stand-in for a kernel).
    ///
    /// # Errors
    /// [`PoolError::StaleBuffer`] once the buffer was freed; a range past the buffer's end;
    /// [`PoolError::Unsupported`] for an existing allocation shared in place.
    pub fn write(&self, offset: u64, src: &[u8]) -> Result<(), PoolError> {
        let region = self.pool_region()?;
        check_range(&self.name, self.len, offset, src.len())?;
        Ok(region.write(self.ptr.offset(offset), src)?)
    }

    /// Reads `dst.len()` bytes at byte `offset` of the buffer.
    ///
    /// # Errors
    /// As [`BufferHandle::write`].
    pub fn read(&self, offset: u64, dst: &mut [u8]) -> Result<(), PoolError> {
        let region = self.pool_region()?;
        check_range(&self.name, self.len, offset, dst.len())?;
        Ok(region.read(self.ptr.offset(offset), dst)?)
    }
}

impl<B: Backend> BufferHandle<B>
where
    B::Exported: ReachableRegion,
{
    /// Copies `src` into the buffer at byte `offset` from the host, on any backend (what the weights owner writes
    /// tensors with).
    pub(crate) fn write_from_host(&self, offset: u64, src: &[u8]) -> Result<(), PoolError> {
        let region = self.pool_region()?;
        copy_into_region(region, self.ctx.as_ref(), &self.name, self.ptr, self.len, offset, src)
    }

    /// Copies the buffer's bytes at byte `offset` into `dst`, on any backend.
    pub(crate) fn read_to_host(&self, offset: u64, dst: &mut [u8]) -> Result<(), PoolError> {
        let region = self.pool_region()?;
        copy_from_region(region, self.ctx.as_ref(), &self.name, self.ptr, self.len, offset, dst)
    }
}

/// Writes `src` at byte `offset` of the buffer of `len` bytes at `ptr` in `region`: through its device span in GPU
/// memory (with `ctx`, the context the region's device is reached from, current meanwhile), through the shared
/// mapping in the host backend's.
pub(crate) fn copy_into_region<R: ReachableRegion>(
    region: &R,
    ctx: Option<&Context>,
    name: &str,
    ptr: DevicePtr,
    len: u64,
    offset: u64,
    src: &[u8],
) -> Result<(), PoolError> {
    check_range(name, len, offset, src.len())?;
    match region.access() {
        MemoryAccess::Device(span) => entered(ctx)
            .and_then(|_entered| span.sub_span_at(ptr, len).and_then(|buffer| buffer.write(offset, src)))
            .map_err(|e| PoolError::Backend(e.into())),
        MemoryAccess::Host(memory) => Ok(memory.write_bytes(host_offset(memory, name, ptr, offset)?, src)?),
    }
}

/// Reads `dst.len()` bytes at byte `offset` of the buffer of `len` bytes at `ptr` in `region`.
pub(crate) fn copy_from_region<R: ReachableRegion>(
    region: &R,
    ctx: Option<&Context>,
    name: &str,
    ptr: DevicePtr,
    len: u64,
    offset: u64,
    dst: &mut [u8],
) -> Result<(), PoolError> {
    check_range(name, len, offset, dst.len())?;
    match region.access() {
        MemoryAccess::Device(span) => entered(ctx)
            .and_then(|_entered| span.sub_span_at(ptr, len).and_then(|buffer| buffer.read(offset, dst)))
            .map_err(|e| PoolError::Backend(e.into())),
        MemoryAccess::Host(memory) => Ok(memory.read_bytes(host_offset(memory, name, ptr, offset)?, dst)?),
    }
}

/// `ctx` made current on the calling thread until the guard drops (nothing when `None`).
fn entered(ctx: Option<&Context>) -> gpu_ipc_driver::Result<Option<Entered>> {
    ctx.map(Context::enter).transpose()
}

/// Where byte `offset` of the buffer at `ptr` lies in the host backend's mapping (its "device addresses" are the
/// mapping's own); the mapping checks the end of the range.
fn host_offset(
    memory: &ipc_core::shm::SharedMemory,
    name: &str,
    ptr: DevicePtr,
    offset: u64,
) -> Result<usize, PoolError> {
    ptr.offset(offset).0.checked_sub(memory.as_ptr() as u64).and_then(|at| usize::try_from(at).ok()).ok_or_else(|| {
        PoolError::InvalidRequest { name: name.to_owned(), reason: format!("{ptr} is outside the pool's memory") }
    })
}

/// `InvalidRequest` unless `bytes` at `offset` lie inside a buffer of `len` bytes.
pub(crate) fn check_range(name: &str, len: u64, offset: u64, bytes: usize) -> Result<(), PoolError> {
    if offset.checked_add(bytes as u64).is_none_or(|end| end > len) {
        return Err(PoolError::InvalidRequest {
            name: name.to_owned(),
            reason: format!("{bytes} bytes at offset {offset} run past the buffer's {len} bytes"),
        });
    }
    Ok(())
}

/// What the directory says about a live buffer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct BufferInfo {
    /// Its name.
    pub name: String,
    /// Its generation.
    pub generation: u64,
    /// Its length in bytes.
    pub len: u64,
    /// Its tensor description, if any.
    #[serde(skip)]
    pub desc: Option<TensorDesc>,
}

/// The pool's numbers, from [`SharedPool::stats`](super::SharedPool::stats). Bytes of the pool's own blocks add up:
/// `live_bytes + pending_bytes + free_bytes == capacity_bytes` (buffers take whole multiples of 256 bytes).
#[derive(Debug, Clone, PartialEq, Default, Serialize)]
pub struct PoolStats {
    /// Blocks of the pool's own memory.
    pub blocks: u32,
    /// Their total size.
    pub capacity_bytes: u64,
    /// Bytes of live buffers in them.
    pub live_bytes: u64,
    /// Bytes of freed buffers that importers still hold views of: reused once they drop them.
    pub pending_bytes: u64,
    /// Bytes free for new buffers.
    pub free_bytes: u64,
    /// The longest free range of any block: the largest buffer that fits without growing.
    pub largest_free: u64,
    /// Free ranges across the blocks.
    pub free_ranges: u64,
    /// `1 - largest_free / free_bytes`: 0 when the free bytes are one range, near 1 when they are crumbs.
    pub fragmentation: f64,
    /// The most bytes ever taken at once (live and pending): the high-water mark.
    pub high_water_bytes: u64,
    /// Live buffers (in the pool's memory and shared in place).
    pub live_buffers: u32,
    /// Freed buffers that importers still hold views of.
    pub pending_buffers: u32,
    /// Existing allocations shared in place.
    pub shared_allocations: u32,
    /// Importers attached now.
    pub importers: u32,
}
