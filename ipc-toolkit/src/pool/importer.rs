//! The importer's side: [`PoolImporter`] attaches once and then finds buffers by name in the directory, with no
//! round trip to the owner (but the first time a buffer lies in a block it has not mapped yet).
//!
//! A lookup reads the entry under its sequence lock, pins the entry's slot in this importer's pin table, fences,
//! and reads the entry's `seq` again: unchanged means the owner had not retired the entry when the pin became
//! visible, so the owner will see the pin before it reuses the bytes ([`super::book`] has the other half).

use std::os::fd::OwnedFd;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering, fence};
use std::time::{Duration, Instant};

use super::attachment::ImporterInner;
use super::blocks::{BlockCache, BlockMiss};
use super::directory::{block_record, check_header, entry_seq, find, live_entries, note, owner_state};
use super::error::PoolError;
use super::handle::BufferInfo;
use super::layout::{BlockId, BlockKind, LAYOUT_VERSION, OwnerState, PINS_MAGIC};
use super::owner::device_uuid;
use super::view::BufferView;
use super::wire::{CHANNEL_FD_INDEX, DIRECTORY_FD_INDEX, PINS_FD_INDEX, POOL_OFFER_FDS, PoolOffer};
use crate::door::{ObjectKind, ObjectOffer, attach_part};
use gpu_ipc_driver::DeviceUuid;
use ipc_core::backend::Backend;
use ipc_core::ring::monotonic_ns;
use ipc_core::shm::{ReadOnlyMemory, SharedMemory};

/// Times a lookup starts over because the entry changed under it before it gives up.
const LOOKUP_TRIES: u32 = 64;

/// How an importer attaches.
#[derive(Debug, Clone)]
pub struct AttachOptions {
    /// A name for the owner's logs and `gpu-ipc ps` (at most 64 bytes).
    pub name: String,
    /// Bound on the handshake, and on each block request afterwards.
    pub timeout: Duration,
}

impl Default for AttachOptions {
    fn default() -> Self {
        Self { name: format!("pool-importer-{}", std::process::id()), timeout: Duration::from_secs(5) }
    }
}

/// An importer of a [`SharedPool`](super::SharedPool): attached once, it finds buffers by name.
///
/// ```no_run
/// use ipc_core::backend::GpuBackend;
/// use gpu_ipc_driver::Context;
/// use ipc_toolkit::pool::{AttachOptions, PoolImporter};
///
/// fn read_weights<B: GpuBackend>(ctx: &Context) -> Result<(), Box<dyn std::error::Error>> {
///     let pool = PoolImporter::<B>::attach(ctx, "/tmp/weights.sock", &AttachOptions::default())?;
///     let layer0 = pool.lookup("weights/layer0")?; // pinned: its bytes are not reused while `layer0` lives
///     let mut first = [0u16; 16];
///     layer0.span()?.read(0, &mut first)?; // the shared memory itself, in place
///     Ok(())
/// }
/// ```
pub struct PoolImporter<B: Backend> {
    inner: Arc<ImporterInner<B>>,
}

impl<B: Backend> std::fmt::Debug for PoolImporter<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PoolImporter")
            .field("path", &self.inner.path)
            .field("pool_id", &self.inner.offer.pool_id)
            .field("peer_id", &self.inner.link.peer_id())
            .finish_non_exhaustive()
    }
}

impl<B: Backend> PoolImporter<B> {
    /// Attaches to the pool whose socket is `socket`: the handshake, the directory and pin table mapped, and every
    /// block of the pool's own memory imported, so that lookups of buffers in them never wait for the owner.
    ///
    /// # Errors
    /// [`PoolError::Door`] (nothing listens: start the owner first; refused: another kind of object, another
    /// backend, another user, too many importers); [`PoolError::Protocol`] for an offer that does not add up;
    /// the backend's import error.
    pub fn attach(ctx: &B::Context, socket: impl AsRef<Path>, options: &AttachOptions) -> Result<Self, PoolError> {
        Self::attach_part(ctx, socket, options, 0)
    }

    /// [`attach`](Self::attach) to part `part` of a pool made of parts (a weight set on several devices: one part
    /// per device, served through one socket); part 0 is what `attach` asks for. Every part is an ordinary pool
    /// once attached: its own directory, note word and blocks.
    ///
    /// # Errors
    /// As [`attach`](Self::attach); [`PoolError::Door`] with the owner's refusal when it has no part `part` (code
    /// 7) or is of a release before parts (code 6, a malformed hello: it never serves part 0 instead).
    pub fn attach_part(
        ctx: &B::Context,
        socket: impl AsRef<Path>,
        options: &AttachOptions,
        part: u32,
    ) -> Result<Self, PoolError> {
        Self::attach_part_on(socket, options, part, |_| Ok(ctx.clone()))
    }

    /// [`attach_part`](Self::attach_part) on the context `context_for` gives for the device the offer names (its
    /// UUID): a reader of a set on several devices learns each part's device from the owner. The context's device
    /// must be that device (it is checked, as `attach` checks).
    ///
    /// # Errors
    /// As [`attach_part`](Self::attach_part); whatever `context_for` returns.
    pub fn attach_part_on(
        socket: impl AsRef<Path>,
        options: &AttachOptions,
        part: u32,
        context_for: impl FnOnce(DeviceUuid) -> Result<B::Context, PoolError>,
    ) -> Result<Self, PoolError> {
        let path = socket.as_ref();
        let import =
            |offer: &ObjectOffer, fds: Vec<OwnedFd>| import::<B>(context_for, path, options.timeout, offer, fds);
        let ((offer, directory, pins, blocks), link) =
            attach_part(path, ObjectKind::Pool, Some(B::KIND), &options.name, part, options.timeout, import)?;
        let inner = ImporterInner {
            path: path.to_path_buf(),
            offer,
            directory,
            pins,
            blocks,
            link,
            last_owner_check_ns: AtomicU64::new(monotonic_ns()),
            owner_hung_up: AtomicBool::new(false),
        };
        // An error here drops the importer, whose connection's hang-up tells the owner.
        import_pool_blocks(&inner)?;
        tracing::info!(path = %path.display(), peer = inner.link.peer_id(), blocks = inner.blocks.mapped(), "attached to a pool");
        Ok(Self { inner: Arc::new(inner) })
    }

    /// The live buffer named `name`, pinned: its bytes are not reused while the view (or a clone of it) lives,
    /// even if the owner frees it meanwhile ([`BufferView::check_current`] then says so). Reads the directory in
    /// shared memory: no round trip to the owner, unless the buffer lies in a block this importer has not mapped.
    ///
    /// # Errors
    /// [`PoolError::NotFound`]; [`PoolError::OwnerGone`]; the backend's error importing a new block.
    pub fn lookup(&self, name: &str) -> Result<BufferView<B>, PoolError> {
        let inner = &self.inner;
        inner.check_owner()?;
        let geometry = inner.offer.geometry;
        inner.blocks.forget_retired(&inner.directory, geometry);
        let started = Instant::now();
        for _ in 0..LOOKUP_TRIES {
            let found = find(&inner.directory, geometry, name).map_err(|e| inner.directory_error(e))?;
            let Some((slot, seq, record)) = found else {
                return Err(PoolError::NotFound { name: name.to_owned() });
            };
            inner.pin(slot);
            // Pairs with the owner's fence between retiring an entry and reading the pins.
            fence(Ordering::SeqCst);
            if entry_seq(&inner.directory, geometry, slot) != Some(seq) {
                inner.unpin(slot);
                continue;
            }
            let block = match inner.blocks.get(record.block, &inner.directory, geometry) {
                Ok(block) => block,
                Err(miss) => {
                    inner.unpin(slot);
                    match miss {
                        BlockMiss::Gone => continue,
                        BlockMiss::Failed(PoolError::OwnerGone { .. }) => {
                            inner.owner_hung_up.store(true, Ordering::Relaxed);
                            return Err(PoolError::OwnerGone { path: inner.path.clone(), how: "hung up" });
                        }
                        BlockMiss::Failed(e) => return Err(e),
                    }
                }
            };
            if record.offset.checked_add(record.len).is_none_or(|end| end > block.len()) {
                inner.unpin(slot);
                let problem = format!(
                    "buffer `{name}` ({} bytes at {}) lies outside its {} of {} bytes",
                    record.len,
                    record.offset,
                    record.block,
                    block.len()
                );
                return Err(PoolError::Protocol { path: inner.path.clone(), what: "directory", problem });
            }
            return Ok(BufferView::new(inner.clone(), block, slot, record));
        }
        Err(PoolError::Timeout { what: "a directory entry that stays put", waited: started.elapsed() })
    }

    /// Every live buffer, as the directory lists it now.
    ///
    /// # Errors
    /// [`PoolError::OwnerGone`]; a malformed directory.
    pub fn list(&self) -> Result<Vec<BufferInfo>, PoolError> {
        self.inner.check_owner()?;
        let entries = live_entries(&self.inner.directory, self.inner.offer.geometry)
            .map_err(|e| self.inner.directory_error(e))?;
        Ok(entries
            .into_iter()
            .map(|(_, r)| BufferInfo { name: r.name, generation: r.generation, len: r.len, desc: r.desc })
            .collect())
    }

    /// Whether the owner has closed the pool or gone away (its process ended). Views already held stay valid.
    pub fn owner_gone(&self) -> bool {
        owner_state(&self.inner.directory) == Some(OwnerState::Closed) || self.inner.link.owner_gone()
    }

    /// The directory's note word, as the owner last set it ([`SharedPool::set_note`](super::SharedPool::set_note));
    /// 0 until then. A shared-memory read: no round trip.
    pub fn note(&self) -> u64 {
        note(&self.inner.directory)
    }

    /// Another handle on this same attachment (one connection, one peer; it ends when the last handle goes): for a
    /// helper thread that reads the directory beside the handle's owner.
    pub(crate) fn share(&self) -> Self {
        Self { inner: Arc::clone(&self.inner) }
    }

    /// The pool instance's id (changes when the owner makes the pool anew).
    pub fn pool_id(&self) -> u64 {
        self.inner.offer.pool_id
    }

    /// The peer number the owner gave this importer.
    pub fn peer_id(&self) -> u32 {
        self.inner.link.peer_id()
    }

    /// Blocks this importer has mapped.
    pub fn mapped_blocks(&self) -> usize {
        self.inner.blocks.mapped()
    }
}

/// The import step of the handshake: checks the offer, maps the directory and the pin table, keeps the block
/// channel. Any error here is told to the owner (`Detach`, import failed), which then drops this importer.
fn import<B: Backend>(
    context_for: impl FnOnce(DeviceUuid) -> Result<B::Context, PoolError>,
    path: &Path,
    timeout: Duration,
    offer: &ObjectOffer,
    fds: Vec<OwnedFd>,
) -> Result<(PoolOffer, ReadOnlyMemory, SharedMemory, BlockCache<B>), PoolError> {
    let protocol =
        |what: &'static str, problem: String| PoolError::Protocol { path: path.to_path_buf(), what, problem };
    let body = PoolOffer::decode(&offer.body).map_err(|e| protocol("offer", e.to_string()))?;
    if body.backend != B::KIND {
        return Err(protocol("offer", format!("it offers a {} pool, this importer is {}", body.backend, B::KIND)));
    }
    let ctx = context_for(body.device_uuid)?;
    check_device(path, body.device_uuid, device_uuid::<B>(&ctx)?)?;
    let mut fds: Vec<Option<OwnedFd>> = fds.into_iter().map(Some).collect();
    if fds.len() != POOL_OFFER_FDS {
        return Err(protocol("offer", format!("{} fds came with it, a pool sends {POOL_OFFER_FDS}", fds.len())));
    }
    let mut take = |index: usize| fds.get_mut(index).and_then(Option::take);
    let (Some(directory_fd), Some(pins_fd), Some(channel)) =
        (take(DIRECTORY_FD_INDEX), take(PINS_FD_INDEX), take(CHANNEL_FD_INDEX))
    else {
        return Err(protocol("offer", "missing fds".into()));
    };
    let geometry = body.geometry;
    let directory = ReadOnlyMemory::from_fd(directory_fd, geometry.directory_bytes())?;
    check_header(&directory, geometry, body.pool_id).map_err(|e| protocol("directory", e))?;
    let pins = SharedMemory::from_fd(pins_fd, geometry.pins_bytes())?;
    let header = pins.words(0, 4)?;
    let expected = [PINS_MAGIC, LAYOUT_VERSION, u64::from(geometry.entry_slots), u64::from(offer.peer_id)];
    if header.iter().map(|w| w.load(Ordering::Acquire)).ne(expected) {
        return Err(protocol("pin table", "its header does not match the offer".into()));
    }
    let is_socket = rustix::fs::fstat(&channel)
        .is_ok_and(|s| rustix::fs::FileType::from_raw_mode(s.st_mode) == rustix::fs::FileType::Socket);
    if !is_socket {
        return Err(protocol("offer", "its block channel fd is not a socket".into()));
    }
    let blocks = BlockCache::new(ctx, path, timeout, channel);
    Ok((body, directory, pins, blocks))
}

/// Refuses an offer of memory on another device than the importer's (the host backend's device is all zeros).
///
/// # Errors
/// [`PoolError::WrongDevice`] naming both devices.
fn check_device(path: &Path, offered: DeviceUuid, here: DeviceUuid) -> Result<(), PoolError> {
    if offered != here {
        return Err(PoolError::WrongDevice { path: path.to_path_buf(), offered, here });
    }
    Ok(())
}

/// Imports every block of the pool's own memory the directory lists, so that lookups of buffers in them never wait
/// for the owner. Runs after the handshake: however long the imports take (large blocks, many of them), the door's
/// bound on a handshake does not cut the attach short.
fn import_pool_blocks<B: Backend>(inner: &ImporterInner<B>) -> Result<(), PoolError> {
    let geometry = inner.offer.geometry;
    for index in 0..geometry.block_slots {
        let Some((BlockKind::Pool, serial, _)) = block_record(&inner.directory, geometry, index) else {
            continue;
        };
        match inner.blocks.get(BlockId { index, serial }, &inner.directory, geometry) {
            Ok(_) | Err(BlockMiss::Gone) => {}
            Err(BlockMiss::Failed(e)) => return Err(e),
        }
    }
    Ok(())
}
