//! The owner's side: [`WeightsOwner`] lays the set's tensors out in an arena, stages each generation in an arena
//! no reader holds, and publishes it.

use std::collections::{HashMap, VecDeque};
use std::path::Path;
use std::sync::Arc;

use super::arena::{NameIndex, Tensors};
use super::checksum::checksum_in_chunks;
use super::copy::{BoundCopies, CopyDirection, TensorCopier};
use super::error::WeightsError;
use super::io::ArenaBytes;
use super::manifest::{
    MAX_SET_NAME_BYTES, MAX_TENSOR_NAME_BYTES, MAX_TENSORS, Manifest, SetParts, TENSOR_ALIGN, TensorEntry,
};
use super::runs::group_alike;
use super::{arena_name, generation_of};
use crate::door::DoorConfig;
use crate::pool::{BufferHandle, PoolConfig, PoolError, SharedPool};
use gpu_ipc_driver::{DeviceSpan, DeviceUuid, Stream};
use ipc_core::backend::GpuBackend;
use ipc_core::wire::TensorDesc;

/// How a weight set is served.
#[derive(Debug, Clone)]
pub struct WeightsOptions {
    /// Arenas the owner keeps when no reader holds older ones: the newest published generation, the one being
    /// staged, and older ones up to this number (at least 1; 2 lets a reader that is one generation behind
    /// refresh without waiting). Older generations are retired when a new one is staged; a retired arena's memory
    /// is reused once no reader holds it.
    pub keep: usize,
    /// Arenas at most, held by readers or not (bounds the memory: each is one export); staging one more while
    /// readers hold this many fails with [`WeightsError::ArenasHeld`].
    pub max_arenas: u32,
    /// Whether each generation's manifest carries a checksum of every tensor (computed at commit from the
    /// arena's bytes: a read-back of the whole arena on a GPU).
    pub checksums: bool,
    /// Readers attached at once at most.
    pub max_readers: u32,
    /// The front door: handshake bound, pending connections, who may connect.
    pub door: DoorConfig,
}

impl Default for WeightsOptions {
    fn default() -> Self {
        Self { keep: 2, max_arenas: 8, checksums: false, max_readers: 64, door: DoorConfig::default() }
    }
}

/// A reader of the set, and the generations it holds now (what `gpu-ipc ps` and `readers()` show).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReaderHold {
    /// Its peer number (unique for the set's life).
    pub peer: u32,
    /// Its pid in the owner's PID namespace (`None` in a namespace the owner cannot see).
    pub pid: Option<u32>,
    /// The name it gave.
    pub name: String,
    /// The generations it holds (usually one; more while it still has views of an older one).
    pub generations: Vec<u64>,
}

/// The next generation's arena, writable, before [`WeightsOwner::commit`] publishes it.
///
/// Its bytes are what the arena held before (an older generation's, or zeros): write every tensor.
pub struct StagedGeneration<B: ArenaBytes> {
    tensors: Tensors,
    handle: BufferHandle<B>,
}

impl<B: ArenaBytes> std::fmt::Debug for StagedGeneration<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StagedGeneration").field("generation", &self.generation()).finish_non_exhaustive()
    }
}

impl<B: ArenaBytes> StagedGeneration<B> {
    /// The generation it will be.
    pub fn generation(&self) -> u64 {
        self.tensors.manifest.generation
    }

    /// Its manifest (checksums are filled in at commit).
    pub fn manifest(&self) -> &Manifest {
        &self.tensors.manifest
    }

    /// The entry named `name`.
    ///
    /// # Errors
    /// [`WeightsError::UnknownTensor`].
    pub fn entry(&self, name: &str) -> Result<&TensorEntry, WeightsError> {
        self.tensors.entry(name)
    }

    /// The arena's pool buffer (on a GPU, its span is the whole arena, manifest included).
    pub fn handle(&self) -> &BufferHandle<B> {
        &self.handle
    }

    /// Copies `bytes` (the tensor's whole byte span, as its description lays it out) into tensor `name`.
    ///
    /// # Errors
    /// [`WeightsError::UnknownTensor`]; [`WeightsError::Mismatch`] for another byte count; the copy's error.
    pub fn write(&self, name: &str, bytes: &[u8]) -> Result<(), WeightsError> {
        let entry = self.entry(name)?;
        if bytes.len() as u64 != entry.span_bytes() {
            let problem = format!("{} bytes given, {} expected", bytes.len(), entry.span_bytes());
            return Err(WeightsError::mismatch(name, &entry.desc, problem));
        }
        Ok(B::write_owned(&self.handle, entry.offset, bytes)?)
    }
}

impl<B: ArenaBytes + GpuBackend> StagedGeneration<B> {
    /// Tensor `name`'s bytes in the arena, for kernels and copies (`cuMemcpyAsync` from the trainer's tensor).
    /// Finish the work queued on it before [`WeightsOwner::commit`].
    ///
    /// # Errors
    /// [`WeightsError::UnknownTensor`]; a freed arena (never, while staged).
    pub fn span_of(&self, name: &str) -> Result<DeviceSpan<'_>, WeightsError> {
        Tensors::slice(&self.handle.span()?, self.entry(name)?)
    }

    /// Queues on `stream` the copy of each `(index, source)`: the device span `source` (the tensor's whole byte
    /// span, as its description lays it out) into tensor `index` (manifest order), with `copier` (a few kernel
    /// launches for any number of tensors). Finish the work queued on `stream` before
    /// [`WeightsOwner::commit`].
    ///
    /// # Errors
    /// An index past the last tensor, a source of another length (nothing queued); a failing launch.
    pub fn copy_in(
        &self,
        copier: &mut TensorCopier,
        sources: &[(usize, DeviceSpan<'_>)],
        stream: &Stream,
    ) -> Result<(), WeightsError> {
        let arena = self.handle.span()?;
        let copies = sources
            .iter()
            .map(|(i, src)| Ok((Tensors::slice(&arena, self.tensors.entry_at(*i)?)?, *src)))
            .collect::<Result<Vec<_>, WeightsError>>()?;
        copier.copy(&copies, stream)
    }
}

impl<B: ArenaBytes + GpuBackend> StagedGeneration<B> {
    /// Queues on `stream` the copies `bound` names (made [`CopyDirection::IntoArena`]) into this arena, with one
    /// launch: the gather's table prepared once per arena and kept (see [`BoundCopies`]). Finish the work queued on
    /// `stream` before [`WeightsOwner::commit`].
    ///
    /// # Errors
    /// Copies bound the other way; an index past the last tensor, a source of another length (nothing queued);
    /// a failing launch.
    pub fn copy_in_bound(
        &self,
        copier: &mut TensorCopier,
        bound: &mut BoundCopies<'_>,
        stream: &Stream,
    ) -> Result<(), WeightsError> {
        bound.run(copier, CopyDirection::IntoArena, &self.handle.span()?, &self.tensors, stream)
    }
}

/// A weight set's owner: it serves the set at a socket, stages and publishes generations.
///
/// Every generation lies in one arena (one pool buffer, exported once with its block), with its [`Manifest`] in
/// front of the tensors; readers ([`WeightsReader`](super::WeightsReader)) import it once. The tensors' names and
/// descriptions are fixed when the set is made; each generation holds new bytes for all of them.
///
/// ```
/// use ipc_core::host::{HostContext, Host};
/// use ipc_toolkit::weights::{DType, TensorDesc, WeightsOptions, WeightsOwner, WeightsReader};
///
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let socket = std::env::temp_dir().join(format!("weights-doc-{}.sock", std::process::id()));
/// let tensors = vec![
///     ("layer0.weight".to_owned(), TensorDesc::contiguous(DType::F32, [4, 4])?),
///     ("layer0.bias".to_owned(), TensorDesc::contiguous(DType::F32, [4])?),
/// ];
/// let mut owner = WeightsOwner::<Host>::create(&HostContext, &socket, "model", tensors, WeightsOptions::default())?;
/// owner.update(&[("layer0.weight", &[1u8; 64][..]), ("layer0.bias", &[2u8; 16][..])])?; // generation 1
///
/// let mut reader = WeightsReader::<Host>::open(&HostContext, &socket, "model", std::time::Duration::from_secs(5))?;
/// let held = reader.held();
/// let mut bias = [0u8; 16];
/// held.read("layer0.bias", &mut bias)?;
/// assert_eq!((held.generation(), bias), (1, [2u8; 16]));
///
/// owner.update(&[("layer0.weight", &[3u8; 64][..]), ("layer0.bias", &[4u8; 16][..])])?; // generation 2
/// assert_eq!(reader.latest()?, 2);
/// held.read("layer0.bias", &mut bias)?; // what the reader holds has not changed
/// assert_eq!(bias, [2u8; 16]);
/// assert_eq!(reader.refresh()?, 2);
/// reader.held().read("layer0.bias", &mut bias)?;
/// assert_eq!(bias, [4u8; 16]);
/// # Ok(()) }
/// ```
pub struct WeightsOwner<B: ArenaBytes> {
    set: String,
    options: WeightsOptions,
    /// Generation 0's manifest: the layout every generation shares.
    layout: Manifest,
    /// `layout` encoded, stamped with the number of the generation staged last: each generation's manifest.
    encoded_layout: Vec<u8>,
    /// The tensors by name, shared by every generation's manifest.
    index: Arc<NameIndex>,
    /// Published generations (their arenas and manifests), oldest first.
    published: VecDeque<StagedGeneration<B>>,
    /// The manifest of the last generation retired, reused for the next one staged (a copy of the layout costs
    /// an allocation per tensor name and shape: milliseconds for 19,000 tensors, before the first copy starts).
    spare: Option<Manifest>,
    staged: Option<StagedGeneration<B>>,
    generation: u64,
    pool: SharedPool<B>,
}

impl<B: ArenaBytes> std::fmt::Debug for WeightsOwner<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WeightsOwner")
            .field("set", &self.set)
            .field("generation", &self.generation)
            .field("path", &self.pool.path())
            .finish_non_exhaustive()
    }
}

impl<B: ArenaBytes> WeightsOwner<B> {
    /// Serves the weight set `set` (its tensors' names and descriptions, in order) at `socket`; nothing is
    /// published until the first [`commit`](Self::commit) or [`update`](Self::update).
    ///
    /// # Errors
    /// [`WeightsError::Invalid`] for a bad set name, no tensors, a tensor name empty, too long or given twice;
    /// the pool's error (socket in use, memory).
    pub fn create(
        ctx: &B::Context,
        socket: impl AsRef<Path>,
        set: &str,
        tensors: Vec<(String, TensorDesc)>,
        options: WeightsOptions,
    ) -> Result<Self, WeightsError> {
        let mut plan = Plan::new(set, tensors, &options, None)?;
        let pool = SharedPool::<B>::create(ctx, socket, plan.pool_config(&options))?;
        plan.layout.device_uuid = pool_device(&pool);
        Ok(Self::serve(set, plan, pool, options))
    }

    /// The owner of one part of a set on several devices: `plan` made for it, `pool` its part of the pool made of
    /// parts (see [`WeightsPartsOwner`](super::WeightsPartsOwner)).
    pub(super) fn serve(set: &str, plan: Plan, pool: SharedPool<B>, options: WeightsOptions) -> Self {
        let Plan { layout, index } = plan;
        let encoded_layout = layout.encode();
        tracing::info!(set, tensors = layout.entries.len(), arena_bytes = layout.arena_bytes, part = pool.part(), path = %pool.path().display(), "weight set open");
        Self {
            set: set.to_owned(),
            options,
            layout,
            encoded_layout,
            index: Arc::new(NameIndex::built(index)),
            published: VecDeque::new(),
            spare: None,
            staged: None,
            generation: 0,
            pool,
        }
    }

    /// The set's name.
    pub fn set_name(&self) -> &str {
        &self.set
    }

    /// The newest published generation (0 before the first).
    pub fn generation(&self) -> u64 {
        self.generation
    }

    /// The layout every generation shares (generation 0's manifest: names, descriptions, offsets, arena bytes).
    pub fn layout(&self) -> &Manifest {
        &self.layout
    }

    /// The socket readers open.
    pub fn path(&self) -> &Path {
        self.pool.path()
    }

    /// The arena of the next generation, writable (made now, or the one staged already): an arena no reader
    /// holds (a retired generation's, once no reader holds it), or a new one. Generations older than
    /// [`WeightsOptions::keep`] are retired first (the newest published never is).
    ///
    /// # Errors
    /// [`WeightsError::ArenasHeld`] when readers hold [`WeightsOptions::max_arenas`] arenas (its words say who holds
    /// which); a backend error.
    pub fn stage(&mut self) -> Result<&StagedGeneration<B>, WeightsError> {
        if self.staged.is_none() {
            while self.published.len() >= self.options.keep && self.published.len() > 1 {
                if let Some(retired) = self.published.pop_front() {
                    tracing::debug!(set = %self.set, generation = retired.generation(), "generation retired");
                    let StagedGeneration { tensors, handle } = retired;
                    self.spare = Some(tensors.manifest);
                    self.pool.free(handle)?;
                }
            }
            let generation = self.generation + 1;
            let mut manifest = self.spare.take().unwrap_or_else(|| self.layout.clone());
            manifest.generation = generation;
            let layout_checksum = self.options.checksums.then_some(0);
            manifest.entries.iter_mut().for_each(|e| e.checksum = layout_checksum);
            let handle =
                match self.pool.alloc(&arena_name(&self.set, generation), manifest.arena_bytes, TENSOR_ALIGN, None) {
                    Ok(handle) => handle,
                    Err(source @ PoolError::OutOfMemory { .. }) => {
                        self.spare = Some(manifest);
                        return Err(self.arenas_held(source));
                    }
                    Err(e) => {
                        self.spare = Some(manifest);
                        return Err(e.into());
                    }
                };
            // The whole manifest, every time: a reader maps the arena writable (a GPU mapping cannot be made
            // read-only for it), so bytes left from an earlier generation in this arena are not trusted, or one
            // reader's write would reach every later generation staged there. 1.5 MB for 19,000 tensors.
            Manifest::set_encoded_generation(&mut self.encoded_layout, generation)
                .map_err(|e| WeightsError::Invalid(format!("the layout's encoded manifest: {e}")))?;
            B::write_owned(&handle, 0, &self.encoded_layout)?;
            self.staged = Some(StagedGeneration { tensors: Tensors::with_index(manifest, self.index.clone()), handle });
        }
        self.staged.as_ref().ok_or_else(|| WeightsError::Invalid("no staged generation".into()))
    }

    /// The staged generation, if [`stage`](Self::stage) made one that is not committed yet.
    pub fn staged(&self) -> Option<&StagedGeneration<B>> {
        self.staged.as_ref()
    }

    /// Publishes the staged generation: computes its checksums if the set has them, then makes it the newest
    /// (one store readers see at once). On a GPU, the work that wrote the arena must be finished.
    ///
    /// # Errors
    /// [`WeightsError::Invalid`] when nothing is staged; a copy error while computing checksums.
    pub fn commit(&mut self) -> Result<u64, WeightsError> {
        let Some(mut staged) = self.staged.take() else {
            return Err(WeightsError::Invalid(format!("weight set `{}`: nothing staged to commit", self.set)));
        };
        if self.options.checksums {
            let mut chunk = Vec::new();
            for entry in &mut staged.tensors.manifest.entries {
                let sum = checksum_in_chunks(entry.offset, entry.span_bytes(), &mut chunk, |at, dst| {
                    B::read_owned(&staged.handle, at, dst)
                })?;
                entry.checksum = Some(sum);
            }
            B::write_owned(&staged.handle, 0, &staged.tensors.manifest.encode())?;
        }
        let generation = staged.generation();
        self.pool.set_note(generation);
        self.generation = generation;
        self.published.push_back(staged);
        tracing::debug!(set = %self.set, generation, "generation published");
        Ok(generation)
    }

    /// Stages the next generation, copies every tensor's bytes in from `tensors` (name, the tensor's whole byte
    /// span), and commits it.
    ///
    /// # Errors
    /// [`WeightsError::UnknownTensor`], [`WeightsError::Mismatch`] (a byte count, a tensor missing or given
    /// twice); as [`stage`](Self::stage) and [`commit`](Self::commit).
    pub fn update(&mut self, tensors: &[(&str, &[u8])]) -> Result<u64, WeightsError> {
        let mut given = vec![false; self.layout.entries.len()];
        for (name, _) in tensors {
            let Some(&i) = self.index.of(&self.layout.entries).get(*name) else {
                return Err(WeightsError::UnknownTensor { set: self.set.clone(), name: (*name).to_owned() });
            };
            if std::mem::replace(&mut given[i], true) {
                return Err(WeightsError::Mismatch { name: (*name).to_owned(), problem: "given twice".into() });
            }
        }
        if let Some(i) = given.iter().position(|g| !g) {
            let name = self.layout.entries.get(i).map(|e| e.name.clone()).unwrap_or_default();
            return Err(WeightsError::Mismatch { name, problem: "not given: an update writes every tensor".into() });
        }
        let staged = self.stage()?;
        for (name, bytes) in tensors {
            staged.write(name, bytes)?;
        }
        self.commit()
    }

    /// The readers attached now and the generations each holds.
    pub fn readers(&self) -> Vec<ReaderHold> {
        self.pool
            .peers()
            .into_iter()
            .map(|peer| {
                let mut generations: Vec<u64> = self
                    .pool
                    .pinned_by(peer.id)
                    .iter()
                    .filter_map(|(buffer, _)| generation_of(&self.set, buffer))
                    .collect();
                generations.sort_unstable();
                ReaderHold { peer: peer.id, pid: peer.pid, name: peer.name, generations }
            })
            .collect()
    }

    /// The error of a stage that found every arena held: who holds which generation.
    fn arenas_held(&self, source: PoolError) -> WeightsError {
        let holds: Vec<String> = self
            .readers()
            .into_iter()
            .filter(|r| !r.generations.is_empty())
            .map(|r| {
                let pid = r.pid.map_or_else(|| "pid unknown".to_owned(), |p| format!("pid {p}"));
                format!("reader {} `{}` ({pid}) holds {:?}", r.peer, r.name, r.generations)
            })
            .collect();
        let published: Vec<u64> = self.published.iter().map(StagedGeneration::generation).collect();
        let holds = format!(
            "published and kept: {published:?}; {}",
            if holds.is_empty() { "no reader holds any".to_owned() } else { holds.join(", ") }
        );
        WeightsError::ArenasHeld {
            set: self.set.clone(),
            arenas: self.arenas(),
            max_arenas: self.options.max_arenas,
            holds,
            source: Box::new(source),
        }
    }

    /// Arenas made and not reused yet: published, staged, and retired ones readers still hold.
    pub fn arenas(&self) -> usize {
        let stats = self.pool.stats();
        (stats.live_buffers + stats.pending_buffers) as usize
    }
}

impl<B: ArenaBytes + GpuBackend> WeightsOwner<B> {
    /// The published generation `generation`'s arena (on a GPU, its span), if the owner still keeps it.
    pub fn published_arena(&self, generation: u64) -> Option<&BufferHandle<B>> {
        self.published.iter().find(|g| g.generation() == generation).map(|g| &g.handle)
    }
}

/// A set's (or a part's) layout, checked, before its pool is made.
pub(super) struct Plan {
    /// Generation 0's manifest (its device UUID is filled in once the device is known).
    pub(super) layout: Manifest,
    index: HashMap<String, usize>,
}

impl Plan {
    /// Checks the names and options and lays the tensors out; `parts`: what the manifest of a part of a set on
    /// several devices says of the set.
    ///
    /// # Errors
    /// [`WeightsError::Invalid`] for a bad set name, no tensors, a tensor name empty, too long or given twice.
    pub(super) fn new(
        set: &str,
        tensors: Vec<(String, TensorDesc)>,
        options: &WeightsOptions,
        parts: Option<SetParts>,
    ) -> Result<Self, WeightsError> {
        let invalid = |what: String| WeightsError::Invalid(what);
        if set.is_empty() || set.len() > MAX_SET_NAME_BYTES {
            return Err(invalid(format!("set name {set:?}: 1 to {MAX_SET_NAME_BYTES} bytes")));
        }
        if tensors.is_empty() || tensors.len() > MAX_TENSORS as usize {
            return Err(invalid(format!("{} tensors: 1 to {MAX_TENSORS}", tensors.len())));
        }
        if options.keep == 0 || options.max_arenas < 2 || options.max_arenas as usize <= options.keep {
            return Err(invalid(format!(
                "keep {} and max_arenas {}: keep at least 1, max_arenas more than keep",
                options.keep, options.max_arenas
            )));
        }
        let mut index = HashMap::with_capacity(tensors.len());
        for (i, (name, _)) in tensors.iter().enumerate() {
            if name.is_empty() || name.len() > MAX_TENSOR_NAME_BYTES {
                return Err(invalid(format!("tensor name {name:?}: 1 to {MAX_TENSOR_NAME_BYTES} bytes")));
            }
            if index.insert(name.clone(), i).is_some() {
                return Err(invalid(format!("tensor name {name:?} given twice")));
            }
        }
        let layout = lay_out(set, tensors, options.checksums, parts)?;
        Ok(Self { layout, index })
    }

    /// The pool this layout's arenas need.
    pub(super) fn pool_config(&self, options: &WeightsOptions) -> PoolConfig {
        PoolConfig {
            capacity: self.layout.arena_bytes,
            max_blocks: options.max_arenas,
            grow_bytes: self.layout.arena_bytes,
            max_buffers: options.max_arenas.saturating_mul(2),
            max_shared_allocations: 0,
            max_importers: options.max_readers,
            door: options.door.clone(),
        }
    }
}

/// The device UUID the pool's offers name (zeros on the host backend).
fn pool_device<B: ArenaBytes>(pool: &SharedPool<B>) -> DeviceUuid {
    pool.device_uuid()
}

/// Generation 0's manifest: the tensors after the manifest, each on [`TENSOR_ALIGN`], grouped by element type,
/// shape and strides (the groups in the order of their first tensor, the tensors of a group in the given order),
/// so that the tensors of a group lie a constant step apart and a reader cuts them all with one strided view (a
/// mixture of experts' 19,000 tensors are then a few dozen runs). The entries keep the given order; each names
/// its own offset, so a reader that cuts tensor by tensor reads the same tensors.
fn lay_out(
    set: &str,
    tensors: Vec<(String, TensorDesc)>,
    checksums: bool,
    parts: Option<SetParts>,
) -> Result<Manifest, WeightsError> {
    let mut entries: Vec<TensorEntry> = tensors
        .into_iter()
        .map(|(name, desc)| TensorEntry { name, desc, offset: 0, checksum: checksums.then_some(0) })
        .collect();
    let header = Manifest::encoded_len_with(set, &entries, checksums, parts.as_ref()) as u64;
    let groups = group_alike(&entries);
    let mut at = header.next_multiple_of(TENSOR_ALIGN);
    for i in groups.into_iter().flatten() {
        let entry = &mut entries[i];
        entry.offset = at;
        at = at
            .checked_add(entry.span_bytes())
            .map(|end| end.next_multiple_of(TENSOR_ALIGN))
            .ok_or_else(|| WeightsError::Invalid("the tensors' bytes overflow 64 bits".into()))?;
    }
    Ok(Manifest {
        set_name: set.to_owned(),
        generation: 0,
        device_uuid: DeviceUuid::default(),
        arena_bytes: at,
        entries,
        parts,
    })
}
