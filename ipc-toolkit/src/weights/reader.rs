//! The reader's side: [`WeightsReader`] holds one generation at a time ([`HeldGeneration`], which keeps its arena
//! pinned while it lives) and moves to the newest when asked.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::arena::Tensors;
use super::arena_name;
use super::checksum::checksum_in_chunks;
use super::copy::{BoundCopies, CopyDirection, TensorCopier};
use super::error::WeightsError;
use super::gate::GateSlot;
use super::io::ArenaBytes;
use super::manifest::{MANIFEST_HEADER_BYTES, Manifest, ManifestError, TensorEntry};
use crate::pool::{AttachOptions, BufferView, PoolError, PoolImporter};
use gpu_ipc_driver::{Context, DevicePtr, DeviceSpan, Stream};
use ipc_core::backend::GpuBackend;

/// How often [`WeightsReader::wait_for`] looks at the published word.
const POLL: Duration = Duration::from_micros(500);
/// Times a reader tries to find the newest arena while the owner keeps publishing past it.
const FIND_TRIES: u32 = 64;

/// One generation of a weight set, as a reader holds it: the arena's view (pinned: its bytes are not reused while
/// this lives, whatever the owner publishes) and its checked manifest. Shared by `Arc`: tensors made from it keep
/// it alive.
pub struct HeldGeneration<B: ArenaBytes> {
    tensors: Tensors,
    view: BufferView<B>,
}

impl<B: ArenaBytes> std::fmt::Debug for HeldGeneration<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HeldGeneration")
            .field("manifest", &format_args!("{}", self.tensors.manifest))
            .finish_non_exhaustive()
    }
}

impl<B: ArenaBytes> HeldGeneration<B> {
    /// Whether `other` took this one's checked entries and index (a later generation of the same layout).
    #[cfg(test)]
    pub(super) fn shares_layout_with(&self, other: &Self) -> bool {
        Arc::ptr_eq(self.tensors.index(), other.tensors.index())
    }

    /// Its generation.
    pub fn generation(&self) -> u64 {
        self.tensors.manifest.generation
    }

    /// Its checked entries and index, for a later generation of the same layout.
    pub(super) fn tensors(&self) -> &Tensors {
        &self.tensors
    }

    /// Its manifest, checked against the mapped arena.
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

    /// The arena's view (its address in this process, its length).
    pub fn view(&self) -> &BufferView<B> {
        &self.view
    }

    /// The address of tensor `name`'s first element in this process (device memory on a GPU backend, host memory
    /// on the host backend); its bytes are [`TensorEntry::span_bytes`] long and stay valid while `self` lives.
    ///
    /// # Errors
    /// [`WeightsError::UnknownTensor`].
    pub fn tensor_ptr(&self, name: &str) -> Result<DevicePtr, WeightsError> {
        Ok(self.view.ptr().offset(self.entry(name)?.offset))
    }

    /// Copies tensor `name`'s whole byte span into `dst` (its length must be the span's).
    ///
    /// # Errors
    /// [`WeightsError::UnknownTensor`]; [`WeightsError::Mismatch`] for another length; the copy's error.
    pub fn read(&self, name: &str, dst: &mut [u8]) -> Result<(), WeightsError> {
        let entry = self.entry(name)?;
        if dst.len() as u64 != entry.span_bytes() {
            let problem = format!("a {}-byte destination for {} bytes", dst.len(), entry.span_bytes());
            return Err(WeightsError::mismatch(name, &entry.desc, problem));
        }
        Ok(B::read_viewed(&self.view, entry.offset, dst)?)
    }

    /// Checks every tensor's bytes against the checksums in the manifest; returns how many were checked (0 when
    /// the owner published no checksums).
    ///
    /// # Errors
    /// [`WeightsError::ChecksumMismatch`] for the first tensor that differs; a copy error.
    pub fn verify(&self) -> Result<usize, WeightsError> {
        let mut chunk = Vec::new();
        let mut checked = 0;
        let manifest = &self.tensors.manifest;
        for entry in &manifest.entries {
            let Some(expected) = entry.checksum else { continue };
            let found = checksum_in_chunks(entry.offset, entry.span_bytes(), &mut chunk, |at, dst| {
                B::read_viewed(&self.view, at, dst)
            })?;
            if found != expected {
                return Err(WeightsError::ChecksumMismatch {
                    set: manifest.set_name.clone(),
                    generation: manifest.generation,
                    name: entry.name.clone(),
                    expected,
                    found,
                });
            }
            checked += 1;
        }
        Ok(checked)
    }
}

impl<B: ArenaBytes + GpuBackend> HeldGeneration<B> {
    /// Tensor `name`'s bytes in the arena, for kernels and copies (e.g. `cuMemcpyAsync` into a module's
    /// parameter: what `load_into` does). Finish the work queued on it before `self` goes.
    ///
    /// # Errors
    /// [`WeightsError::UnknownTensor`].
    pub fn span_of(&self, name: &str) -> Result<DeviceSpan<'_>, WeightsError> {
        Tensors::slice(&self.view.span()?, self.entry(name)?)
    }

    /// Queues on `stream` the copy of each `(index, destination)`: tensor `index` (manifest order) into the device
    /// span `destination` (of the tensor's byte span's length: e.g. a module's parameter, in place), with `copier`
    /// (a few kernel launches for any number of tensors: what `load_into` does). Finish the work queued on
    /// `stream` before `self` goes.
    ///
    /// # Errors
    /// An index past the last tensor, a destination of another length (nothing queued); a failing launch.
    pub fn copy_out(
        &self,
        copier: &mut TensorCopier,
        destinations: &[(usize, DeviceSpan<'_>)],
        stream: &Stream,
    ) -> Result<(), WeightsError> {
        let arena = self.view.span()?;
        let copies = destinations
            .iter()
            .map(|(i, dst)| Ok((*dst, Tensors::slice(&arena, self.tensors.entry_at(*i)?)?)))
            .collect::<Result<Vec<_>, WeightsError>>()?;
        copier.copy(&copies, stream)
    }
}

impl<B: ArenaBytes + GpuBackend> HeldGeneration<B> {
    /// Queues on `stream` the copies `bound` names (made [`CopyDirection::OutOfArena`]) out of this arena into the
    /// caller's memory, with one launch: the gather's table prepared once per arena and kept (see
    /// [`BoundCopies`]); what `load_into` of targets bound once does. Finish the work queued on `stream` before
    /// `self` goes.
    ///
    /// # Errors
    /// Copies bound the other way; an index past the last tensor, a destination of another length (nothing
    /// queued); a failing launch.
    pub fn copy_out_bound(
        &self,
        copier: &mut TensorCopier,
        bound: &mut BoundCopies<'_>,
        stream: &Stream,
    ) -> Result<(), WeightsError> {
        bound.run(copier, CopyDirection::OutOfArena, &self.view.span()?, &self.tensors, stream)
    }
}

/// A reader of a weight set: attached once to the owner's socket, it holds one generation at a time and moves to
/// the newest when it chooses ([`latest`](Self::latest), [`wait_for`](Self::wait_for) on the CPU,
/// [`wait_on`](Self::wait_on) a CUDA stream). Old [`HeldGeneration`]s stay valid while something holds them.
pub struct WeightsReader<B: ArenaBytes> {
    /// The stream gate, made at the first `watch` or `wait_on`; closed first (it stops its thread and waits for
    /// the streams to pass what it released).
    gate: GateSlot,
    /// The CUDA context stream waits use (`None` on the host backend).
    cuda: Option<Context>,
    set: String,
    path: PathBuf,
    held: Arc<HeldGeneration<B>>,
    /// The held generation's manifest as its arena holds it: a later generation whose manifest is the same but for
    /// its generation (an owner's layout is fixed) shares the held one's checked entries and index, undecoded.
    encoded: Vec<u8>,
    importer: PoolImporter<B>,
}

impl<B: ArenaBytes> std::fmt::Debug for WeightsReader<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WeightsReader")
            .field("set", &self.set)
            .field("path", &self.path)
            .field("generation", &self.held.generation())
            .finish_non_exhaustive()
    }
}

impl<B: ArenaBytes> WeightsReader<B> {
    /// Attaches to the owner at `socket` and takes the newest generation of `set` (waiting up to `timeout` for
    /// the first to be published).
    ///
    /// # Errors
    /// The pool's attach errors (no owner, refused, another device); [`WeightsError::NoSuchSet`];
    /// [`WeightsError::Timeout`]; [`WeightsError::Manifest`] for an arena whose manifest fails its checks.
    pub fn open(
        ctx: &B::Context,
        socket: impl AsRef<Path>,
        set: &str,
        timeout: Duration,
    ) -> Result<Self, WeightsError> {
        let path = socket.as_ref().to_path_buf();
        let options = AttachOptions { name: format!("weights reader of {set}"), timeout };
        let importer = PoolImporter::<B>::attach(ctx, &path, &options).map_err(|e| WeightsError::from_pool(set, e))?;
        let generation = wait_first(&importer, set, &path, timeout)?;
        let (held, encoded) = load(&importer, set, &path, generation, None)?;
        Self::opened(B::cuda_context(ctx).cloned(), importer, path, set, (held, encoded))
    }

    /// The reader of a set whose first generation `importer` (attached to part 0) has loaded: refuses a part of a
    /// set on several devices.
    pub(super) fn opened(
        cuda: Option<Context>,
        importer: PoolImporter<B>,
        path: PathBuf,
        set: &str,
        (held, encoded): Loaded<B>,
    ) -> Result<Self, WeightsError> {
        refuse_parts(&held, &path)?;
        let held = Arc::new(held);
        tracing::info!(set, generation = held.generation(), path = %path.display(), "weight set opened");
        Ok(Self { gate: GateSlot::default(), cuda, set: set.to_owned(), path, held, encoded, importer })
    }

    /// The set's name.
    pub fn set_name(&self) -> &str {
        &self.set
    }

    /// The generation held now.
    pub fn generation(&self) -> u64 {
        self.held.generation()
    }

    /// The generation held now, to read tensors from (a clone of the `Arc`: it stays valid after a refresh).
    pub fn held(&self) -> Arc<HeldGeneration<B>> {
        self.held.clone()
    }

    /// The newest published generation: a word in shared memory, no round trip.
    ///
    /// # Errors
    /// [`WeightsError::OwnerGone`] once the owner closed the set or its process ended (seen at once: its
    /// connection hangs up).
    pub fn latest(&self) -> Result<u64, WeightsError> {
        if self.importer.owner_gone() {
            return Err(WeightsError::OwnerGone { set: self.set.clone(), path: self.path.clone(), how: "hung up" });
        }
        Ok(self.importer.note())
    }

    /// Moves to the newest generation (nothing to do when it is held already) and returns it. What was held
    /// before stays valid while something holds it.
    ///
    /// # Errors
    /// As [`latest`](Self::latest); [`WeightsError::Manifest`] for a generation whose manifest fails its checks
    /// (the reader keeps the one it held).
    pub fn refresh(&mut self) -> Result<u64, WeightsError> {
        let newest = self.latest()?;
        if newest != self.held.generation() {
            let known = (self.encoded.as_slice(), &self.held.tensors);
            let (held, encoded) = load(&self.importer, &self.set, &self.path, newest, Some(known))?;
            refuse_parts(&held, &self.path)?;
            self.held = Arc::new(held);
            self.encoded = encoded;
        }
        Ok(self.held.generation())
    }

    /// Waits until generation `generation` or a newer one is published (at most `timeout`; `None`: no bound) and
    /// returns the newest. Does not move: call [`refresh`](Self::refresh).
    ///
    /// # Errors
    /// [`WeightsError::Timeout`]; [`WeightsError::OwnerGone`].
    pub fn wait_for(&self, generation: u64, timeout: Option<Duration>) -> Result<u64, WeightsError> {
        wait_until(&self.set, generation, timeout, || self.latest())
    }

    /// Whether the owner has closed the set or gone away.
    pub fn owner_gone(&self) -> bool {
        self.importer.owner_gone()
    }

    pub(super) fn cuda(&self) -> Option<&Context> {
        self.cuda.as_ref()
    }

    pub(super) fn gate_slot(&self) -> &GateSlot {
        &self.gate
    }

    /// Its attachment to the owner (what its gate follows).
    pub(super) fn importer(&self) -> &PoolImporter<B> {
        &self.importer
    }
}

/// A reader of one device refuses a part of a set on several devices: it would read one part for the whole set.
fn refuse_parts<B: ArenaBytes>(held: &HeldGeneration<B>, path: &Path) -> Result<(), WeightsError> {
    match &held.manifest().parts {
        None => Ok(()),
        Some(parts) => Err(WeightsError::Parts {
            set: held.manifest().set_name.clone(),
            path: path.to_path_buf(),
            detail: format!(
                "the set lies on {} devices, one part each; this reader reads a set on one device: open it with \
                 WeightsPartsReader (in Python, gpu_ipc.weights.open reads either kind)",
                parts.devices.len()
            ),
        }),
    }
}

/// Polls `latest` until it says `generation` or a newer one (at most `timeout`; `None`: no bound) and returns the
/// newest: a one-device reader's and a set of parts' `wait_for`.
pub(super) fn wait_until(
    set: &str,
    generation: u64,
    timeout: Option<Duration>,
    latest: impl Fn() -> Result<u64, WeightsError>,
) -> Result<u64, WeightsError> {
    let started = Instant::now();
    loop {
        let latest = latest()?;
        if latest >= generation {
            return Ok(latest);
        }
        let waited = started.elapsed();
        if timeout.is_some_and(|t| waited >= t) {
            return Err(WeightsError::Timeout { set: set.to_owned(), wanted: generation, latest, waited });
        }
        std::thread::sleep(timeout.map_or(POLL, |t| POLL.min(t.saturating_sub(waited))));
    }
}

/// Waits until the owner behind `importer` has published a first generation (at most `timeout`) and returns the
/// newest: what a reader of either kind does right after attaching.
pub(super) fn wait_first<B: ArenaBytes>(
    importer: &PoolImporter<B>,
    set: &str,
    path: &Path,
    timeout: Duration,
) -> Result<u64, WeightsError> {
    let started = Instant::now();
    loop {
        let published = importer.note();
        if published > 0 {
            return Ok(published);
        }
        if importer.owner_gone() {
            return Err(WeightsError::OwnerGone { set: set.to_owned(), path: path.to_path_buf(), how: "hung up" });
        }
        let waited = started.elapsed();
        if waited >= timeout {
            return Err(WeightsError::Timeout { set: set.to_owned(), wanted: 1, latest: 0, waited });
        }
        std::thread::sleep(POLL);
    }
}

/// Finds the arena of `generation` (or a newer one, if the owner retired it meanwhile), copies its manifest out
/// and checks it against the mapped extent; returns it with the manifest's bytes. `known`: a generation held
/// before and its bytes: a manifest equal to them but for the generation takes their checked entries and index
/// (the bytes are compared, so nothing unchecked is taken).
pub(super) fn load<B: ArenaBytes>(
    importer: &PoolImporter<B>,
    set: &str,
    path: &Path,
    mut generation: u64,
    known: Option<(&[u8], &Tensors)>,
) -> Result<(HeldGeneration<B>, Vec<u8>), WeightsError> {
    let mut tries = 0;
    let started = Instant::now();
    let view = loop {
        match importer.lookup(&arena_name(set, generation)) {
            Ok(view) => break view,
            Err(PoolError::NotFound { .. }) => {
                let newest = importer.note();
                tries += 1;
                if newest == generation || tries >= FIND_TRIES {
                    return Err(no_such_set(importer, set, path, generation));
                }
                generation = newest;
            }
            Err(e) => return Err(WeightsError::from_pool(set, e)),
        }
    };
    let found = started.elapsed();
    let held = held_of(view, set, generation, known);
    tracing::debug!(
        set,
        generation,
        lookup_us = found.as_micros(),
        manifest_us = (started.elapsed() - found).as_micros(),
        "weight set's arena found and its manifest read"
    );
    held
}

/// A generation loaded, with its manifest's bytes.
pub(super) type Loaded<B> = (HeldGeneration<B>, Vec<u8>);

/// The arena of exactly `generation`, its manifest checked (see [`load`]); `None` when the owner has retired it
/// (a part of a set on several devices, which a reader loads at one generation on every part).
pub(super) fn load_exact<B: ArenaBytes>(
    importer: &PoolImporter<B>,
    set: &str,
    generation: u64,
    known: Option<(&[u8], &Tensors)>,
) -> Result<Option<Loaded<B>>, WeightsError> {
    match importer.lookup(&arena_name(set, generation)) {
        Ok(view) => held_of(view, set, generation, known).map(Some),
        Err(PoolError::NotFound { .. }) => Ok(None),
        Err(e) => Err(WeightsError::from_pool(set, e)),
    }
}

/// The generation `view` (the arena of `generation`) holds, its manifest copied out and checked.
fn held_of<B: ArenaBytes>(
    view: BufferView<B>,
    set: &str,
    generation: u64,
    known: Option<(&[u8], &Tensors)>,
) -> Result<(HeldGeneration<B>, Vec<u8>), WeightsError> {
    let refused = |source| WeightsError::Manifest { set: set.to_owned(), generation, source };
    let mut header = [0u8; MANIFEST_HEADER_BYTES];
    if view.len() < header.len() as u64 {
        return Err(refused(ManifestError::ArenaTooSmall { claimed: header.len() as u64, mapped: view.len() }));
    }
    B::read_viewed(&view, 0, &mut header)?;
    let declared = Manifest::declared_len(&header).map_err(refused)?;
    if declared > view.len() {
        let problem = format!("{declared}, more than the {} bytes of the arena mapped", view.len());
        return Err(refused(ManifestError::BadField { field: "manifest bytes".into(), problem }));
    }
    let started = Instant::now();
    let mut bytes = host_bytes(declared).map_err(|problem| {
        refused(ManifestError::BadField { field: "manifest bytes".into(), problem: format!("{declared}: {problem}") })
    })?;
    B::read_viewed(&view, 0, &mut bytes)?;
    let copied = started.elapsed();
    let tensors = match known.and_then(|(k, t)| Some((Manifest::same_but_generation(k, &bytes)?, t))) {
        // What decode checks of the mapped extent: the arena inside it (the rest is in the bytes compared).
        Some((_, known)) if known.manifest.arena_bytes > view.len() => {
            let (claimed, mapped) = (known.manifest.arena_bytes, view.len());
            return Err(refused(ManifestError::ArenaTooSmall { claimed, mapped }));
        }
        Some((decoded, known)) => {
            let mut manifest = known.manifest.clone();
            manifest.generation = decoded;
            Tensors::with_index(manifest, known.index().clone())
        }
        None => Tensors::new(Manifest::decode(&bytes, view.len()).map_err(refused)?),
    };
    tracing::debug!(
        set,
        generation,
        bytes = declared,
        copy_us = copied.as_micros(),
        decode_us = (started.elapsed() - copied).as_micros(),
        "manifest copied to the host and checked"
    );
    let manifest = &tensors.manifest;
    if manifest.set_name != set || manifest.generation != generation {
        let problem = format!(
            "the arena of {set} generation {generation} holds the manifest of {} generation {}",
            manifest.set_name, manifest.generation
        );
        return Err(refused(ManifestError::BadField { field: "set name and generation".into(), problem }));
    }
    Ok((HeldGeneration { tensors, view }, bytes))
}

/// `len` zero bytes on the host, or why not (an allocation that fails is an error here, not an abort: the length
/// comes from another process's bytes).
fn host_bytes(len: u64) -> Result<Vec<u8>, String> {
    let len = usize::try_from(len).map_err(|_| "more than this process can address".to_owned())?;
    let mut bytes = Vec::new();
    bytes.try_reserve_exact(len).map_err(|e| format!("cannot allocate that much host memory ({e})"))?;
    bytes.resize(len, 0);
    Ok(bytes)
}

/// `NoSuchSet`, naming the sets the owner does publish.
pub(super) fn no_such_set<B: ArenaBytes>(
    importer: &PoolImporter<B>,
    set: &str,
    path: &Path,
    generation: u64,
) -> WeightsError {
    let mut sets: Vec<String> = importer
        .list()
        .unwrap_or_default()
        .into_iter()
        .filter_map(|info| {
            let (name, tail) = info.name.rsplit_once('/')?;
            tail.parse::<u64>().ok().map(|_| name.to_owned())
        })
        .collect();
    sets.sort();
    sets.dedup();
    let detail = if sets.is_empty() {
        format!("no arena of generation {generation}, and no weight set there (is it a weight set's socket?)")
    } else {
        format!("no arena of generation {generation}; the owner there publishes {}", sets.join(", "))
    };
    WeightsError::NoSuchSet { set: set.to_owned(), path: path.to_path_buf(), detail }
}
