//! The reader of a weight set on several devices: [`WeightsPartsReader`] attaches to every part through the one
//! socket and holds one generation of all of them at once ([`HeldParts`]), never a mix of two.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::error::WeightsError;
use super::gate::{GateSlot, GateSlots};
use super::io::ArenaBytes;
use super::manifest::{SetParts, TensorEntry};
use super::reader::{HeldGeneration, Loaded, load_exact, no_such_set, wait_until};
use crate::pool::{AttachOptions, PoolError, PoolImporter};
use gpu_ipc_driver::{Context, DeviceUuid};

/// Times a reader tries to load one generation on every part while the owner keeps publishing past it.
const LOAD_TRIES: u32 = 64;

/// One generation of a set on several devices, as a reader holds it: every part's arena of that generation
/// (pinned while this lives) and the set's order of the tensors.
pub struct HeldParts<B: ArenaBytes> {
    parts: Vec<Arc<HeldGeneration<B>>>,
    /// The set's tensors in the publisher's order: (part, index in the part's manifest).
    order: Vec<(usize, usize)>,
}

impl<B: ArenaBytes> std::fmt::Debug for HeldParts<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HeldParts")
            .field("generation", &self.generation())
            .field("parts", &self.parts.len())
            .finish_non_exhaustive()
    }
}

impl<B: ArenaBytes> HeldParts<B> {
    /// The generation held (the same on every part).
    pub fn generation(&self) -> u64 {
        self.parts.first().map_or(0, |p| p.generation())
    }

    /// The parts, in part order: each one device's tensors of this generation (its manifest names its device).
    pub fn parts(&self) -> &[Arc<HeldGeneration<B>>] {
        &self.parts
    }

    /// Every tensor in the publisher's order, with the part it lies on.
    pub fn tensors(&self) -> impl Iterator<Item = (usize, &TensorEntry)> + '_ {
        self.order.iter().filter_map(|&(part, i)| Some((part, self.parts.get(part)?.manifest().entries.get(i)?)))
    }

    /// The set's order: (part, index in that part's manifest) of each tensor, in the publisher's order.
    pub fn order(&self) -> &[(usize, usize)] {
        &self.order
    }

    /// Tensor `name`'s part and entry.
    ///
    /// # Errors
    /// [`WeightsError::UnknownTensor`].
    pub fn entry(&self, name: &str) -> Result<(usize, &TensorEntry), WeightsError> {
        for (i, part) in self.parts.iter().enumerate() {
            if let Ok(entry) = part.entry(name) {
                return Ok((i, entry));
            }
        }
        let set = self.parts.first().map(|p| p.manifest().set_name.clone()).unwrap_or_default();
        Err(WeightsError::UnknownTensor { set, name: name.to_owned() })
    }

    /// Copies tensor `name`'s whole byte span into `dst` (see [`HeldGeneration::read`]).
    ///
    /// # Errors
    /// As [`HeldGeneration::read`].
    pub fn read(&self, name: &str, dst: &mut [u8]) -> Result<(), WeightsError> {
        let (part, _) = self.entry(name)?;
        self.parts.get(part).map_or(Ok(()), |p| p.read(name, dst))
    }

    /// Checks every part's tensors against their checksums; returns how many were checked.
    ///
    /// # Errors
    /// As [`HeldGeneration::verify`].
    pub fn verify(&self) -> Result<usize, WeightsError> {
        self.parts.iter().map(|p| p.verify()).sum()
    }
}

/// Every part of one generation loaded, with their manifests' bytes, in part order.
pub(super) type LoadedParts<B> = (Vec<HeldGeneration<B>>, Vec<Vec<u8>>);

/// A part being read: its connection, the CUDA context it is attached on (`None` on the host backend), and the
/// manifest bytes of the generation held (a later generation's manifest equal to them but for the generation is not
/// decoded again).
struct PartLink<B: ArenaBytes> {
    importer: PoolImporter<B>,
    cuda: Option<Context>,
    encoded: Vec<u8>,
}

/// A reader of a weight set on several devices ([`WeightsPartsOwner`](super::WeightsPartsOwner)): attached to
/// every part through the one socket, each on a context of that part's device, it holds one generation of every
/// part at once and moves when it chooses. The set's published generation is part 0's note word; a reader loads
/// exactly that generation on every part (if a part has retired it meanwhile, the newer one), so what it holds is
/// never a mix of two generations. The owner's end is seen on any part's connection. A CUDA stream on a part's
/// device can wait for a generation of the set ([`wait_on`](Self::wait_on), [`watch`](Self::watch)).
pub struct WeightsPartsReader<B: ArenaBytes> {
    /// The stream gates, one a part, each made at the first wait on that part; closed first (every gate marked gone,
    /// then each settled).
    gates: GateSlots,
    set: String,
    path: PathBuf,
    links: Vec<PartLink<B>>,
    held: Arc<HeldParts<B>>,
}

impl<B: ArenaBytes> std::fmt::Debug for WeightsPartsReader<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WeightsPartsReader")
            .field("set", &self.set)
            .field("path", &self.path)
            .field("parts", &self.links.len())
            .field("generation", &self.held.generation())
            .finish_non_exhaustive()
    }
}

impl<B: ArenaBytes> WeightsPartsReader<B> {
    /// The rest of [`open`](Self::open), once part 0 is attached (`first`, with its CUDA context: `None` on the host
    /// backend) and a generation of it loaded (`part0`, whose manifest names the other parts' devices).
    pub(super) fn open_from(
        (first, cuda0): (PoolImporter<B>, Option<Context>),
        part0: Loaded<B>,
        path: PathBuf,
        set: &str,
        mut context_for: impl FnMut(DeviceUuid) -> Result<B::Context, PoolError>,
        timeout: Duration,
    ) -> Result<Self, WeightsError> {
        // `timeout` bounds every part's attachment together: a slow owner of many parts cannot stretch it.
        let deadline = Instant::now() + timeout;
        let options = |part: usize| -> Result<AttachOptions, WeightsError> {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                let waited = timeout;
                return Err(WeightsError::Pool(PoolError::Timeout {
                    what: "attaching to every part of a weight set",
                    waited,
                }));
            }
            Ok(AttachOptions { name: format!("weights reader of {set} part {part}"), timeout: left })
        };
        let mut reader = Self {
            gates: GateSlots::new(0),
            set: set.to_owned(),
            path,
            links: vec![PartLink { importer: first, cuda: cuda0, encoded: Vec::new() }],
            held: Arc::new(HeldParts { parts: Vec::new(), order: Vec::new() }),
        };
        let Some(set_parts) = part0.0.manifest().parts.clone() else {
            return Err(reader.disagree("the set lies on one device: open it with WeightsReader".into()));
        };
        drop(part0);
        // Attach to every other part on its device, then load the set: all parts at one generation.
        for (part, device) in set_parts.devices.iter().enumerate().skip(1) {
            let ctx = context_for(*device).map_err(|e| WeightsError::from_pool(set, e))?;
            let importer = PoolImporter::<B>::attach_part(&ctx, &reader.path, &options(part)?, part as u32)
                .map_err(|e| WeightsError::from_pool(set, e))?;
            reader.links.push(PartLink { importer, cuda: B::cuda_context(&ctx).cloned(), encoded: Vec::new() });
        }
        reader.gates = GateSlots::new(reader.links.len());
        let generation = reader.links[0].importer.note();
        let (parts, encoded) = reader.load(generation, false)?;
        reader.take(parts, encoded)?;
        tracing::info!(set, parts = reader.links.len(), generation = reader.generation(), path = %reader.path.display(), "weight set of parts opened");
        Ok(reader)
    }

    /// The set's name.
    pub fn set_name(&self) -> &str {
        &self.set
    }

    /// The number of parts (devices).
    pub fn part_count(&self) -> usize {
        self.links.len()
    }

    /// The generation held now.
    pub fn generation(&self) -> u64 {
        self.held.generation()
    }

    /// The generation held now, every part of it (a clone of the `Arc`: it stays valid after a refresh).
    pub fn held(&self) -> Arc<HeldParts<B>> {
        self.held.clone()
    }

    /// The newest published generation: part 0's note word, no round trip.
    ///
    /// # Errors
    /// [`WeightsError::OwnerGone`] once the owner closed the set or its process ended (any part's connection).
    pub fn latest(&self) -> Result<u64, WeightsError> {
        if self.owner_gone() {
            return Err(WeightsError::OwnerGone { set: self.set.clone(), path: self.path.clone(), how: "hung up" });
        }
        Ok(self.links.first().map_or(0, |l| l.importer.note()))
    }

    /// Moves to the newest generation, on every part (nothing to do when it is held already), and returns it.
    ///
    /// # Errors
    /// As [`latest`](Self::latest); [`WeightsError::Manifest`], [`WeightsError::Parts`] (the reader keeps what it
    /// held).
    pub fn refresh(&mut self) -> Result<u64, WeightsError> {
        let newest = self.latest()?;
        if newest != self.held.generation() {
            let (parts, encoded) = self.load(newest, true)?;
            self.take(parts, encoded)?;
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

    /// Whether the owner has closed the set or gone away (seen on any part).
    pub fn owner_gone(&self) -> bool {
        self.links.iter().any(|l| l.importer.owner_gone())
    }

    /// Part `part`'s stream-gate slot and the CUDA context its word is registered for (`None` on the host
    /// backend), or `None` for a part the set does not have.
    pub(super) fn part_gate(&self, part: usize) -> Option<(&GateSlot, Option<&Context>)> {
        Some((self.gates.get(part)?, self.links.get(part)?.cuda.as_ref()))
    }

    /// Every part's CUDA context, in part order (`None` on the host backend).
    pub(super) fn part_contexts(&self) -> impl Iterator<Item = Option<&Context>> + '_ {
        self.links.iter().map(|l| l.cuda.as_ref())
    }

    /// A handle of its own on every part's connection, in part order: what the stream gates follow.
    pub(super) fn share_importers(&self) -> Vec<PoolImporter<B>> {
        self.links.iter().map(|l| l.importer.share()).collect()
    }

    /// Loads `generation` on every part attached, or, when a part no longer has it (the owner retired it), the
    /// newest published, again on every part; at most [`LOAD_TRIES`] times. `known`: the held generation's checked
    /// entries may be taken for a manifest equal but for the generation.
    pub(super) fn load(&self, mut generation: u64, known: bool) -> Result<LoadedParts<B>, WeightsError> {
        let part0 = &self.links[0].importer;
        for _ in 0..LOAD_TRIES {
            let mut parts = Vec::with_capacity(self.links.len());
            let mut encoded = Vec::with_capacity(self.links.len());
            for (i, link) in self.links.iter().enumerate() {
                let held = self.held.parts.get(i).filter(|_| known);
                let known = held.map(|h| (link.encoded.as_slice(), h.tensors()));
                match load_exact(&link.importer, &self.set, generation, known)? {
                    Some((part, bytes)) => {
                        parts.push(part);
                        encoded.push(bytes);
                    }
                    None => break,
                }
            }
            if parts.len() == self.links.len() {
                return Ok((parts, encoded));
            }
            // A part no longer has it: the owner moved on. What was loaded goes (unpinned), the newest is tried.
            let newest = part0.note();
            if newest == generation {
                return Err(no_such_set(part0, &self.set, &self.path, generation));
            }
            tracing::debug!(set = %self.set, generation, newest, "a part retired the generation: loading the newer one");
            generation = newest;
        }
        let detail = format!("the owner kept publishing past every generation tried ({LOAD_TRIES} tries)");
        Err(WeightsError::NoSuchSet { set: self.set.clone(), path: self.path.clone(), detail })
    }

    /// Checks that the loaded parts are the parts of one set (each says its part, the same devices and count) and
    /// makes them the held generation.
    fn take(&mut self, parts: Vec<HeldGeneration<B>>, encoded: Vec<Vec<u8>>) -> Result<(), WeightsError> {
        let n = self.links.len();
        let mut first: Option<SetParts> = None;
        let mut order = Vec::new();
        for (k, part) in parts.iter().enumerate() {
            let Some(said) = &part.manifest().parts else {
                return Err(self.disagree(format!("part {k}'s manifest says the set lies on one device")));
            };
            let reference = first.get_or_insert_with(|| said.clone());
            if usize::from(said.part) != k || said.devices.len() != n || said.devices != reference.devices {
                return Err(self.disagree(format!(
                    "part {k}'s manifest says part {} of {} parts, on other devices than part 0's",
                    said.part,
                    said.devices.len()
                )));
            }
            if said.set_tensors != reference.set_tensors {
                return Err(self.disagree(format!("part {k} counts {} tensors in the set", said.set_tensors)));
            }
            order.resize(said.set_tensors as usize, None);
            for (i, &place) in said.positions.iter().enumerate() {
                match order.get_mut(place as usize) {
                    Some(slot @ None) => *slot = Some((k, i)),
                    _ => return Err(self.disagree(format!("tensor place {place} is given twice or is out of range"))),
                }
            }
        }
        let order: Option<Vec<(usize, usize)>> = order.into_iter().collect();
        let Some(order) = order else {
            return Err(self.disagree("some of the set's tensors are on no part".into()));
        };
        for (link, bytes) in self.links.iter_mut().zip(encoded) {
            link.encoded = bytes;
        }
        self.held = Arc::new(HeldParts { parts: parts.into_iter().map(Arc::new).collect(), order });
        Ok(())
    }

    fn disagree(&self, detail: String) -> WeightsError {
        WeightsError::Parts { set: self.set.clone(), path: self.path.clone(), detail }
    }
}
