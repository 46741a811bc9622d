//! A weight set on several devices: [`WeightsPartsOwner`], one ordinary single-device set per device (a *part*:
//! its own pool, arenas, manifests and note word), all served through one socket, published together.

use std::path::Path;

use super::error::WeightsError;
use super::io::ArenaBytes;
use super::manifest::{MAX_PARTS, SetParts};
use super::owner::{Plan, ReaderHold, StagedGeneration, WeightsOptions, WeightsOwner};
use crate::pool::SharedPool;
use gpu_ipc_driver::DeviceUuid;
use ipc_core::wire::TensorDesc;

/// The owner of a weight set whose tensors lie on several devices (a model loaded with a device map): one part per
/// device, each an ordinary single-device set ([`WeightsOwner`]) with its own arenas on its own device, served
/// through one socket. Readers ([`WeightsPartsReader`](super::WeightsPartsReader)) get the whole set, each tensor on
/// its device, and never a mix of two generations: [`commit`](Self::commit) publishes parts 1 and up first and
/// part 0 last, and part 0's note word is the set's published generation.
///
/// Each part's manifest says "part k of n", every part's device UUID and each tensor's place in the whole set
/// (manifest format version 2, which readers of a release before parts refuse).
///
/// ```
/// use ipc_core::host::{Host, HostContext};
/// use ipc_toolkit::weights::{DType, TensorDesc, WeightsOptions, WeightsPartsOwner, WeightsPartsReader};
///
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let socket = std::env::temp_dir().join(format!("weights-parts-doc-{}.sock", std::process::id()));
/// let desc = TensorDesc::contiguous(DType::F32, [4])?;
/// // Each tensor with the part (device) it lies on: on a GPU, one context per device; here, two host parts.
/// let tensors = vec![("a".to_owned(), desc.clone(), 0), ("b".to_owned(), desc.clone(), 1), ("c".to_owned(), desc, 0)];
/// let mut owner = WeightsPartsOwner::<Host>::create(vec![HostContext, HostContext], &socket, "model", tensors, WeightsOptions::default())?;
/// owner.update(&[("a", &[1u8; 16][..]), ("b", &[2u8; 16][..]), ("c", &[3u8; 16][..])])?; // generation 1
///
/// let reader = WeightsPartsReader::<Host>::open(&socket, "model", |_uuid| Ok(HostContext), std::time::Duration::from_secs(5))?;
/// let held = reader.held();
/// let names: Vec<&str> = held.tensors().map(|(_, entry)| entry.name.as_str()).collect();
/// assert_eq!((held.generation(), names), (1, vec!["a", "b", "c"])); // the publisher's order
/// let mut b = [0u8; 16];
/// held.read("b", &mut b)?;
/// assert_eq!(b, [2u8; 16]);
/// # Ok(()) }
/// ```
pub struct WeightsPartsOwner<B: ArenaBytes> {
    /// The parts, in part order (part 0's pool holds the socket's door, which closes with the last part).
    parts: Vec<WeightsOwner<B>>,
    /// Where each of the set's tensors lies: (part, index in the part), in the publisher's order.
    places: Vec<(usize, usize)>,
    /// The tensors by name: their place in the set.
    names: std::collections::HashMap<String, usize>,
}

impl<B: ArenaBytes> std::fmt::Debug for WeightsPartsOwner<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WeightsPartsOwner")
            .field("set", &self.set_name())
            .field("parts", &self.parts.len())
            .field("generation", &self.generation())
            .finish_non_exhaustive()
    }
}

impl<B: ArenaBytes> WeightsPartsOwner<B> {
    /// Serves the weight set `set` at `socket`, one part per context in `contexts` (one per device, in part
    /// order): `tensors` are the set's tensors in the publisher's order, each with the part it lies on (the index
    /// of its device's context). Every part must hold at least one tensor. Nothing is published until the first
    /// [`commit`](Self::commit) or [`update`](Self::update).
    ///
    /// # Errors
    /// [`WeightsError::Invalid`] for fewer than 2 or more than 256 parts, a part of no tensors, a tensor on a part
    /// that does not exist; as [`WeightsOwner::create`].
    pub fn create(
        contexts: Vec<B::Context>,
        socket: impl AsRef<Path>,
        set: &str,
        tensors: Vec<(String, TensorDesc, usize)>,
        options: WeightsOptions,
    ) -> Result<Self, WeightsError> {
        let devices =
            contexts.iter().map(|ctx| crate::pool::device_uuid_of::<B>(ctx)).collect::<Result<Vec<_>, _>>()?;
        Self::create_on(contexts, devices.clone(), devices, socket.as_ref(), set, tensors, options)
    }

    /// [`create`](Self::create) with the device UUIDs the manifests name apart from those the pools' offers name:
    /// for tests only (this crate's, and the Python package's host tests), which give the host backend's parts
    /// distinct made-up UUIDs, since its pools all say the host's. A set served this way on a GPU would send readers
    /// to the wrong devices: use [`create`](Self::create).
    ///
    /// # Errors
    /// As [`create`](Self::create).
    #[doc(hidden)]
    pub fn create_on(
        contexts: Vec<B::Context>,
        pool_devices: Vec<DeviceUuid>,
        devices: Vec<DeviceUuid>,
        socket: &Path,
        set: &str,
        tensors: Vec<(String, TensorDesc, usize)>,
        options: WeightsOptions,
    ) -> Result<Self, WeightsError> {
        let invalid = |what: String| WeightsError::Invalid(format!("weight set `{set}`: {what}"));
        let n = contexts.len();
        if !(2..=MAX_PARTS).contains(&n) || pool_devices.len() != n || devices.len() != n {
            return Err(invalid(format!("{n} parts: 2 to {MAX_PARTS} (a set on one device is a WeightsOwner)")));
        }
        let set_tensors = u32::try_from(tensors.len()).map_err(|_| invalid("too many tensors".into()))?;
        let mut grouped: Vec<Vec<(String, TensorDesc)>> = vec![Vec::new(); n];
        let mut positions: Vec<Vec<u32>> = vec![Vec::new(); n];
        let mut places = Vec::with_capacity(tensors.len());
        let mut names = std::collections::HashMap::with_capacity(tensors.len());
        for (place, (name, desc, part)) in (0u32..).zip(tensors) {
            let Some(group) = grouped.get_mut(part) else {
                return Err(invalid(format!("tensor {name:?} on part {part} of {n}")));
            };
            if names.insert(name.clone(), place as usize).is_some() {
                return Err(invalid(format!("tensor name {name:?} given twice")));
            }
            places.push((part, group.len()));
            group.push((name, desc));
            positions[part].push(place);
        }
        if let Some(empty) = grouped.iter().position(Vec::is_empty) {
            return Err(invalid(format!("part {empty} holds no tensor: give every part at least one")));
        }
        let mut plans = Vec::with_capacity(n);
        for (part, (group, positions)) in grouped.into_iter().zip(positions).enumerate() {
            let parts = SetParts { part: part as u16, devices: devices.clone(), set_tensors, positions };
            let mut plan = Plan::new(set, group, &options, Some(parts))?;
            plan.layout.device_uuid = devices[part];
            plans.push(plan);
        }
        let pools = SharedPool::<B>::create_parts_on(
            socket,
            contexts
                .into_iter()
                .zip(pool_devices)
                .zip(&plans)
                .map(|((ctx, uuid), plan)| (ctx, plan.pool_config(&options), uuid))
                .collect(),
        )?;
        let parts =
            plans.into_iter().zip(pools).map(|(plan, pool)| WeightsOwner::serve(set, plan, pool, options.clone()));
        Ok(Self { parts: parts.collect(), places, names })
    }

    /// The set's name.
    pub fn set_name(&self) -> &str {
        self.parts.first().map_or("", WeightsOwner::set_name)
    }

    /// The newest published generation (0 before the first): part 0's.
    pub fn generation(&self) -> u64 {
        self.parts.first().map_or(0, WeightsOwner::generation)
    }

    /// The socket readers open.
    pub fn path(&self) -> &Path {
        self.parts.first().map_or(Path::new(""), WeightsOwner::path)
    }

    /// The parts, in part order: each an ordinary single-device set (its layout, its staged arena).
    pub fn parts(&self) -> &[WeightsOwner<B>] {
        &self.parts
    }

    /// Part `part`, to move one part alone (tests of a reader caught between parts).
    #[cfg(test)]
    pub(super) fn part_mut(&mut self, part: usize) -> &mut WeightsOwner<B> {
        &mut self.parts[part]
    }

    /// Where tensor `name` lies: its part and its index in that part's manifest.
    pub fn place_of(&self, name: &str) -> Option<(usize, usize)> {
        self.names.get(name).and_then(|&i| self.places.get(i).copied())
    }

    /// The tensors' places (part, index in the part), in the publisher's order.
    pub fn places(&self) -> &[(usize, usize)] {
        &self.places
    }

    /// Stages the next generation on every part (see [`WeightsOwner::stage`]) and returns the staged arenas in
    /// part order.
    ///
    /// # Errors
    /// As [`WeightsOwner::stage`] of any part (parts staged before stay staged, and are used by the next call).
    pub fn stage(&mut self) -> Result<Vec<&StagedGeneration<B>>, WeightsError> {
        for part in &mut self.parts {
            part.stage()?;
        }
        Ok(self.parts.iter().filter_map(WeightsOwner::staged).collect())
    }

    /// Publishes the staged generation of every part: parts 1 and up first, part 0 last (its note word is the
    /// set's published generation, so a reader that sees it finds the generation on every part). On a GPU, the
    /// work that wrote the arenas must be finished.
    ///
    /// # Errors
    /// [`WeightsError::Invalid`] when a part has nothing staged, or the parts staged different generations
    /// (nothing is published then); as [`WeightsOwner::commit`].
    pub fn commit(&mut self) -> Result<u64, WeightsError> {
        let staged: Vec<Option<u64>> =
            self.parts.iter().map(|p| p.staged().map(StagedGeneration::generation)).collect();
        let first = staged.first().copied().flatten();
        if first.is_none() || staged.iter().any(|g| *g != first) {
            return Err(WeightsError::Invalid(format!(
                "weight set `{}`: the parts' staged generations are {staged:?}: stage every part before commit",
                self.set_name()
            )));
        }
        for part in self.parts.iter_mut().skip(1) {
            part.commit()?;
        }
        match self.parts.first_mut() {
            Some(part0) => part0.commit(),
            None => Err(WeightsError::Invalid("a set of no parts".into())),
        }
    }

    /// Stages the next generation, copies every tensor's bytes in from `tensors` (name, the tensor's whole byte
    /// span, wherever its part lies), and commits it.
    ///
    /// # Errors
    /// [`WeightsError::UnknownTensor`], [`WeightsError::Mismatch`] (a byte count, a tensor missing or given
    /// twice); as [`stage`](Self::stage) and [`commit`](Self::commit).
    pub fn update(&mut self, tensors: &[(&str, &[u8])]) -> Result<u64, WeightsError> {
        let mut given = vec![false; self.places.len()];
        for (name, _) in tensors {
            let Some(&i) = self.names.get(*name) else {
                return Err(WeightsError::UnknownTensor { set: self.set_name().to_owned(), name: (*name).to_owned() });
            };
            if std::mem::replace(&mut given[i], true) {
                return Err(WeightsError::Mismatch { name: (*name).to_owned(), problem: "given twice".into() });
            }
        }
        if let Some(i) = given.iter().position(|g| !g) {
            let name = self.names.iter().find(|(_, p)| **p == i).map(|(n, _)| n.clone()).unwrap_or_default();
            return Err(WeightsError::Mismatch { name, problem: "not given: an update writes every tensor".into() });
        }
        self.stage()?;
        for (name, bytes) in tensors {
            let part = self.place_of(name).map_or(0, |(part, _)| part);
            let staged = self.parts.get(part).and_then(WeightsOwner::staged);
            staged.ok_or_else(|| WeightsError::Invalid("no staged generation".into()))?.write(name, bytes)?;
        }
        self.commit()
    }

    /// The readers attached now and the generations each holds, per part (in part order).
    pub fn readers(&self) -> Vec<Vec<ReaderHold>> {
        self.parts.iter().map(WeightsOwner::readers).collect()
    }
}

impl<B: ArenaBytes> Drop for WeightsPartsOwner<B> {
    fn drop(&mut self) {
        // The last part first and part 0 last: every part's directory says "closed" before the socket (part 0's
        // door, shared) closes, so readers see a clean close, not a crash.
        while self.parts.pop().is_some() {}
    }
}
