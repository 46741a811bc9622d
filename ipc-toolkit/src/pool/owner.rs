//! The owner's side: [`SharedPool`], its configuration, and the state its door and block channel thread share.

use std::path::Path;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use super::book::{Book, Fence, Limits, check_name};
use super::directory::DirectoryWriter;
use super::error::PoolError;
use super::handle::{BufferHandle, PoolStats};
use super::host::{PartsHost, PoolHost};
use super::inbox::inbox;
use super::layout::{Geometry, MAX_BLOCKS, MAX_ENTRY_SLOTS};
use super::server::BlockServer;
use super::shared::PoolShared;
use crate::door::{DoorConfig, ObjectDoor, PeerInfo};
use gpu_ipc_driver::DeviceUuid;
use gpu_ipc_driver::{DevicePtr, Event, EventFlags, Stream};
use ipc_core::backend::{Backend, GpuBackend};
use ipc_core::wire::TensorDesc;

/// How a pool is made: its first block, how it may grow, how many buffers, allocations and importers it serves.
#[derive(Debug, Clone)]
pub struct PoolConfig {
    /// Bytes of the block made at creation (rounded up as the backend requires: 2 MiB for vmm); 0 makes no block
    /// until the first [`SharedPool::alloc`] (a pool that only shares existing allocations never makes one).
    pub capacity: u64,
    /// Blocks of its own memory the pool may have at most, each its own export (1: it never grows beyond the
    /// first; 0: it never allocates, only shares existing allocations).
    pub max_blocks: u32,
    /// Bytes of each block made when the pool grows (at least the buffer that made it grow).
    pub grow_bytes: u64,
    /// Named buffers at most, live or freed but still held by importers (the directory has a third more slots).
    pub max_buffers: u32,
    /// Existing allocations ([`SharedPool::share_existing`]) shared at once at most.
    pub max_shared_allocations: u32,
    /// Importers attached at once at most; one more is refused (`RingFull`, "the pool serves at most ...").
    pub max_importers: u32,
    /// The front door: handshake bound, pending connections, who may connect.
    pub door: DoorConfig,
}

impl PoolConfig {
    /// One block of `capacity` bytes that never grows, 4096 buffers, 256 shared allocations, 64 importers.
    pub fn new(capacity: u64) -> Self {
        Self {
            capacity,
            max_blocks: 1,
            grow_bytes: capacity,
            max_buffers: 4096,
            max_shared_allocations: 256,
            max_importers: 64,
            door: DoorConfig::default(),
        }
    }

    /// A pool that allocates nothing and only shares existing allocations in place.
    pub fn sharing_only() -> Self {
        Self { max_blocks: 0, ..Self::new(0) }
    }

    /// The directory's sizes for this configuration: a third more entry slots than buffers (a power of two), a
    /// record per block and per shared allocation.
    fn geometry(&self) -> Result<Geometry, PoolError> {
        let invalid = |what: String| PoolError::Config(what);
        if self.max_buffers == 0 || self.max_buffers > MAX_ENTRY_SLOTS / 4 * 3 {
            return Err(invalid(format!("max_buffers {}: 1 to {}", self.max_buffers, MAX_ENTRY_SLOTS / 4 * 3)));
        }
        if self.capacity > 0 && self.max_blocks == 0 {
            return Err(invalid("a capacity needs max_blocks of at least 1".into()));
        }
        if self.max_blocks > 0 && self.grow_bytes == 0 && self.capacity == 0 {
            return Err(invalid("a pool that may allocate needs a capacity or grow_bytes".into()));
        }
        if self.max_importers == 0 {
            return Err(invalid("max_importers must be at least 1".into()));
        }
        let block_slots = self.max_blocks.saturating_add(self.max_shared_allocations);
        if block_slots == 0 || block_slots > MAX_BLOCKS {
            return Err(invalid(format!("max_blocks + max_shared_allocations is {block_slots}: 1 to {MAX_BLOCKS}")));
        }
        let entry_slots = (self.max_buffers + self.max_buffers / 3 + 1).next_power_of_two();
        Geometry { entry_slots, block_slots }.check().map_err(invalid)
    }
}

/// An IPC memory pool with named buffers: the owner's side.
///
/// The owner exports one block of memory (or a few, growing up to [`PoolConfig::max_blocks`], each its own export),
/// sub-allocates named buffers in it with [`alloc`](Self::alloc), and shares existing allocations in place with
/// [`share_existing`](Self::share_existing). Importers ([`PoolImporter`](super::PoolImporter)) attach once through
/// the pool's socket and then find every buffer by name, including those allocated after they attached, with no
/// new attach. A buffer freed while importers hold views of it is reused only once they drop them. See
/// `docs/pool.md`.
///
/// ```no_run
/// use ipc_core::backend::GpuBackend;
/// use gpu_ipc_driver::Context;
/// use ipc_toolkit::pool::{DType, PoolConfig, SharedPool, TensorDesc};
///
/// // `B` is `ipc_vmm::Vmm` or `ipc_legacy::Legacy` (`gpu_ipc::vmm::Vmm`, `gpu_ipc::legacy::Legacy`).
/// fn share_weights<B: GpuBackend>(ctx: &Context) -> Result<SharedPool<B>, Box<dyn std::error::Error>> {
///     let pool = SharedPool::<B>::create(ctx, "/tmp/weights.sock", PoolConfig::new(1 << 30))?;
///     let desc = TensorDesc::contiguous(DType::BF16, [4096, 4096])?;
///     let layer0 = pool.alloc("weights/layer0", 4096 * 4096 * 2, 256, Some(desc))?;
///     layer0.span()?.write(0, &[0u16; 16])?;
///     std::mem::forget(layer0); // keep it allocated for the pool's life (or keep the handle to free it later)
///     Ok(pool)
/// }
/// ```
pub struct SharedPool<B: Backend> {
    shared: Arc<PoolShared<B>>,
    /// The socket's door: this pool's own, or (a pool made of parts) the one every part shares, opened with part
    /// 0 and closed with the last part dropped.
    door: Option<Arc<ObjectDoor>>,
    /// Which part of a pool made of parts this is (0 for a pool served whole): its peers are the door's peers
    /// that asked for it.
    part: u32,
    server: BlockServer,
}

impl<B: Backend> std::fmt::Debug for SharedPool<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SharedPool")
            .field("backend", &B::KIND)
            .field("path", &self.door.as_deref().map(ObjectDoor::path))
            .field("pool_id", &self.shared.pool_id)
            .finish_non_exhaustive()
    }
}

impl<B: Backend> SharedPool<B> {
    /// Makes the pool (its directory and first block) and opens its socket at `socket`.
    ///
    /// # Errors
    /// An invalid configuration; the backend's support check or allocation error; shared memory; the socket
    /// (a live owner already listens there, a path too long, ...).
    pub fn create(ctx: &B::Context, socket: impl AsRef<Path>, config: PoolConfig) -> Result<Self, PoolError> {
        B::check_support(ctx)?;
        Self::create_on(ctx, socket.as_ref(), config, device_uuid::<B>(ctx)?)
    }

    /// [`create`](Self::create) with the device UUID the offer names (tests give the host backend another one).
    pub(super) fn create_on(
        ctx: &B::Context,
        socket: &Path,
        config: PoolConfig,
        device_uuid: DeviceUuid,
    ) -> Result<Self, PoolError> {
        let door_config = config.door.clone();
        let (shared, server) = Self::build(ctx, config, device_uuid)?;
        let door = ObjectDoor::open(socket, Arc::new(PoolHost::new(shared.clone())), door_config)?;
        tracing::info!(path = %door.path().display(), backend = %B::KIND, "pool open");
        Ok(Self { shared, door: Some(Arc::new(door)), part: 0, server })
    }

    /// A pool made of parts served through one socket at `socket`: one pool per `(context, configuration)` (each
    /// on its context's device, with its own memory, directory and note word), and one door (the first part's door
    /// settings) that serves each peer the part its hello names
    /// ([`PoolImporter::attach_part`](super::PoolImporter::attach_part)). A weight set on several devices is one,
    /// one part per device. Returns the parts in order; the socket closes when the last of them is dropped.
    ///
    /// # Errors
    /// No parts, or more than `u16::MAX`; as [`create`](Self::create) for each part.
    pub fn create_parts(
        socket: impl AsRef<Path>,
        parts: Vec<(B::Context, PoolConfig)>,
    ) -> Result<Vec<Self>, PoolError> {
        let mut described = Vec::with_capacity(parts.len());
        for (ctx, config) in parts {
            B::check_support(&ctx)?;
            let uuid = device_uuid::<B>(&ctx)?;
            described.push((ctx, config, uuid));
        }
        Self::create_parts_on(socket.as_ref(), described)
    }

    /// [`create_parts`](Self::create_parts) with the device UUID each part's offers name (tests give the host
    /// backend's parts distinct ones): one pool per `(context, configuration, device UUID)`, each with its own memory, directory and note word, and one door (the first part's door
    /// settings) that serves each peer the part its hello names ([`PoolImporter::attach_part`](super::PoolImporter::attach_part)).
    /// A weight set on several devices is one (one part per device). Returns the parts in order; the door closes
    /// when the last of them is dropped.
    ///
    /// # Errors
    /// No parts, or more than `u16::MAX`; as [`create`](Self::create) for each part.
    pub(crate) fn create_parts_on(
        socket: &Path,
        parts: Vec<(B::Context, PoolConfig, DeviceUuid)>,
    ) -> Result<Vec<Self>, PoolError> {
        if parts.is_empty() || parts.len() > usize::from(u16::MAX) {
            return Err(PoolError::Config(format!("{} parts: 1 to {}", parts.len(), u16::MAX)));
        }
        let door_config = parts.first().map(|(_, config, _)| config.door.clone()).unwrap_or_default();
        let mut built = Vec::with_capacity(parts.len());
        for (ctx, config, uuid) in parts {
            built.push(Self::build(&ctx, config, uuid)?);
        }
        let hosts = built.iter().map(|(shared, _)| PoolHost::new(shared.clone())).collect();
        let door = Arc::new(ObjectDoor::open(socket, Arc::new(PartsHost::new(hosts)), door_config)?);
        tracing::info!(path = %door.path().display(), backend = %B::KIND, parts = built.len(), "pool of parts open");
        Ok(built
            .into_iter()
            .zip(0u32..)
            .map(|((shared, server), part)| Self { shared, door: Some(door.clone()), part, server })
            .collect())
    }

    /// The pool's state and its block channel thread, without a door.
    fn build(
        ctx: &B::Context,
        config: PoolConfig,
        device_uuid: DeviceUuid,
    ) -> Result<(Arc<PoolShared<B>>, BlockServer), PoolError> {
        let geometry = config.geometry()?;
        let pool_id = pool_id();
        let limits = Limits {
            max_pool_blocks: config.max_blocks,
            grow_bytes: config.grow_bytes.max(1),
            max_buffers: config.max_buffers,
            max_existing: config.max_shared_allocations,
        };
        let mut book = Book::new(DirectoryWriter::create(geometry, pool_id)?, limits);
        if config.capacity > 0 {
            book.add_pool_block(B::allocate(ctx, config.capacity)?)?;
        }
        let (channels, server_end) = inbox().map_err(|e| PoolError::Unsupported(format!("starting the pool: {e}")))?;
        let shared = Arc::new(PoolShared {
            ctx: ctx.clone(),
            pool_id,
            device_uuid,
            max_importers: config.max_importers as usize,
            closing: AtomicBool::new(false),
            channels,
            book: Mutex::new(book),
        });
        let server = BlockServer::start(shared.clone(), server_end)
            .map_err(|e| PoolError::Unsupported(format!("starting the pool's block channel thread: {e}")))?;
        tracing::debug!(backend = %B::KIND, capacity = config.capacity, "pool made");
        Ok((shared, server))
    }

    /// Allocates a buffer of `bytes` bytes aligned to `align` (a power of two; every buffer is aligned to at least
    /// 256) in the pool's memory, named `name`, with an optional tensor description. Importers find it by name
    /// from now on. Grows the pool by a block when none has room and [`PoolConfig::max_blocks`] allows.
    ///
    /// # Errors
    /// [`PoolError::NameTaken`], [`PoolError::InvalidName`], [`PoolError::InvalidRequest`] (zero bytes, an
    /// alignment that is not a power of two, a tensor description that does not fit), [`PoolError::OutOfMemory`],
    /// [`PoolError::DirectoryFull`], or the backend's error while growing.
    pub fn alloc(
        &self,
        name: &str,
        bytes: u64,
        align: u64,
        desc: Option<TensorDesc>,
    ) -> Result<BufferHandle<B>, PoolError> {
        let ctx = &self.shared.ctx;
        let handle = self.shared.book().alloc(name, bytes, align, desc, |size| B::allocate(ctx, size))?;
        Ok(handle.in_context(B::cuda_context(ctx)))
    }

    /// Shares, in place and without a copy, `bytes` bytes at `ptr` of memory another allocator made (e.g. a
    /// PyTorch tensor), under `name`. What importers map is the whole allocation that holds them (one export per
    /// allocation, however many buffers lie in it); it stays alive for them after your allocator frees it, until
    /// the buffer is freed here and no importer holds a view of it. Which memory each backend can share this way:
    /// [`Backend::export_existing`].
    ///
    /// # Errors
    /// [`PoolError::Backend`] with [`BackendError::Unsupported`](ipc_core::backend::BackendError::Unsupported) naming
    /// why this memory cannot be shared by this backend and what to do instead; the name and description errors of
    /// [`alloc`](Self::alloc); [`PoolError::TooManyAllocations`].
    pub fn share_existing(
        &self,
        name: &str,
        ptr: DevicePtr,
        bytes: u64,
        desc: Option<TensorDesc>,
    ) -> Result<BufferHandle<B>, PoolError> {
        check_name(name)?;
        // Driver calls outside the lock: the door and the block channel never wait for them.
        let export = B::export_existing(&self.shared.ctx, ptr, bytes)?;
        self.shared.book().share_existing(name, ptr, bytes, desc, export)
    }

    /// Frees the buffer `handle` stands for. Importers no longer find it by name, at once; its bytes go back to the
    /// pool (an existing allocation stops being shared) only when no importer pins it any more and the GPU work
    /// queued in the owner's process has finished: on a GPU, `free` waits for the context's queued work
    /// (`cuCtxSynchronize`, every stream) before it returns; [`free_after`](Self::free_after) waits for one stream's
    /// instead, without blocking. Pins are checked lazily, on later `alloc`, `free`, `stats` and
    /// [`reclaim`](Self::reclaim) calls; an importer that dies stops pinning.
    ///
    /// # Errors
    /// [`PoolError::StaleBuffer`] when the buffer was freed by name meanwhile (and the name maybe reused); on a GPU,
    /// [`PoolError::Backend`] when waiting for the context's work failed (the buffer is freed, its bytes kept for
    /// the pool's life rather than reused).
    pub fn free(&self, handle: BufferHandle<B>) -> Result<(), PoolError> {
        let (name, generation) = (handle.name().to_owned(), handle.generation());
        // The handle goes first: while it lives, its buffer's bytes are held.
        drop(handle);
        self.free_synced(&name, Some(generation))
    }

    /// Frees the live buffer named `name`, as [`free`](Self::free) does. A [`BufferHandle`] of it still held refuses
    /// every use from now on ([`PoolError::StaleBuffer`]) and keeps the bytes from reuse until it is dropped.
    ///
    /// # Errors
    /// [`PoolError::NotFound`]; as [`free`](Self::free).
    pub fn free_name(&self, name: &str) -> Result<(), PoolError> {
        self.free_synced(name, None)
    }

    /// Retires the buffer at once, then (on a GPU) waits for the context's queued work outside the lock.
    fn free_synced(&self, name: &str, generation: Option<u64>) -> Result<(), PoolError> {
        let Some(cuda) = B::cuda_context(&self.shared.ctx) else {
            self.shared.book().free(name, generation, Fence::Done)?;
            return Ok(());
        };
        let (slot, generation) = self.shared.book().free(name, generation, Fence::Syncing)?;
        let synced = cuda.synchronize();
        if let Err(error) = &synced {
            tracing::error!(%error, buffer = name, "waiting for the GPU failed: the freed buffer's bytes are kept");
        }
        self.shared.book().fence_passed(slot, generation, synced.is_ok());
        synced.map_err(|e| PoolError::Backend(e.into()))
    }

    /// Gives back the bytes of every freed buffer that no importer pins any more, whose handle is gone and whose
    /// GPU fence has passed; returns how many. `alloc`, `free` and `stats` do this too; call it to let go sooner
    /// (a front end that holds memory another allocator made lets go of it then: [`BufferHandle::reclaim_watch`]).
    pub fn reclaim(&self) -> usize {
        self.shared.book().reclaim()
    }

    /// The pool's numbers now (after reusing what importers no longer hold).
    pub fn stats(&self) -> PoolStats {
        let mut book = self.shared.book();
        book.reclaim();
        book.stats()
    }

    /// The socket importers attach to.
    pub fn path(&self) -> &Path {
        self.door.as_deref().map_or(Path::new(""), ObjectDoor::path)
    }

    /// The importers attached now (what `gpu-ipc ps` lists); of a part of a pool made of parts, those attached to
    /// this part.
    pub fn peers(&self) -> Vec<PeerInfo> {
        let mut peers = self.door.as_deref().map(ObjectDoor::peers).unwrap_or_default();
        peers.retain(|p| p.part == self.part);
        peers
    }

    /// Which part of a pool made of parts this is (0 for a pool served whole).
    pub fn part(&self) -> u32 {
        self.part
    }

    /// The UUID of the device the pool's memory is on, as its offers name it (zeros on the host backend).
    pub fn device_uuid(&self) -> DeviceUuid {
        self.shared.device_uuid
    }

    /// Publishes `value` in the directory's note word, which every importer reads with
    /// [`PoolImporter::note`](super::PoolImporter::note) without a round trip (the weights' newest generation).
    pub fn set_note(&self, value: u64) {
        self.shared.book().directory().set_note(value);
    }

    /// The names and pool generations of the buffers importer `peer` (a [`PeerInfo::id`]) pins now.
    pub fn pinned_by(&self, peer: u32) -> Vec<(String, u64)> {
        self.shared.book().pinned_by(peer)
    }

    /// This pool instance's id (in its offers and directory): tells it from an earlier pool at the same path.
    pub fn pool_id(&self) -> u64 {
        self.shared.pool_id
    }
}

impl<B: GpuBackend> SharedPool<B> {
    /// Frees the buffer `handle` stands for, as [`free`](Self::free) does, but without blocking: the bytes wait for
    /// the work queued on `stream` so far (an event recorded on it now), besides the importers' pins. Use it when
    /// every kernel and copy on the buffer in this process was queued on `stream`.
    ///
    /// # Errors
    /// As [`free`](Self::free); when the event cannot be made or recorded, it waits as `free` does.
    pub fn free_after(&self, handle: BufferHandle<B>, stream: &Stream) -> Result<(), PoolError> {
        let (name, generation) = (handle.name().to_owned(), handle.generation());
        drop(handle);
        let Some(cuda) = B::cuda_context(&self.shared.ctx) else {
            self.shared.book().free(&name, Some(generation), Fence::Done)?;
            return Ok(());
        };
        let recorded = Event::new(cuda, EventFlags::default()).and_then(|event| event.record(stream).map(|()| event));
        match recorded {
            Ok(event) => self.shared.book().free(&name, Some(generation), Fence::Event(event)).map(|_| ()),
            Err(error) => {
                tracing::warn!(%error, buffer = %name, "no event on the stream: waiting for the context instead");
                self.free_synced(&name, Some(generation))
            }
        }
    }
}

/// The UUID of the device `ctx` is on, after the backend's support check on it: what a part of a pool made of
/// parts names (all zeros for the host backend).
pub(crate) fn device_uuid_of<B: Backend>(ctx: &B::Context) -> Result<DeviceUuid, PoolError> {
    B::check_support(ctx)?;
    device_uuid::<B>(ctx)
}

/// The UUID of the device `ctx` is on (all zeros for the host backend).
pub(super) fn device_uuid<B: Backend>(ctx: &B::Context) -> Result<DeviceUuid, PoolError> {
    match B::cuda_context(ctx) {
        Some(cuda) => cuda.device().uuid().map_err(|e| PoolError::Backend(e.into())),
        None => Ok(DeviceUuid::default()),
    }
}

impl<B: Backend> Drop for SharedPool<B> {
    fn drop(&mut self) {
        // In this order: importers read "closed" before their connections hang up, so they know it was no crash.
        self.shared.closing.store(true, std::sync::atomic::Ordering::Release);
        let mut book = self.shared.book();
        book.reclaim();
        book.close();
        drop(book);
        self.door = None;
        self.server.stop();
    }
}

/// A value that tells this pool instance from any earlier one: the wall clock in nanoseconds mixed with the pid.
fn pool_id() -> u64 {
    let nanos = SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64);
    nanos ^ u64::from(std::process::id()).rotate_left(40)
}
