//! What a staged generation (the owner's) and a held one (a reader's) share: the manifest, its name index, and a
//! tensor's bytes as a slice of the arena's span.

use std::collections::HashMap;
use std::sync::{Arc, OnceLock};

use super::error::WeightsError;
use super::manifest::{Manifest, TensorEntry};
use gpu_ipc_driver::DeviceSpan;

/// A generation's manifest and the index of its tensors by name (shared by every generation of an owner's set:
/// their layout is the same).
pub(super) struct Tensors {
    pub(super) manifest: Manifest,
    index: Arc<NameIndex>,
}

/// A layout's tensor names and their places in manifest order. A reader's is built at its first lookup by name, so
/// a reader that only cuts every tensor (`arena()`) never pays for it (1-5 ms for 19,000 names, at every cold
/// open before); an owner's when it plans the layout. One per layout, shared by every generation of it: its `Arc`
/// also says "the same layout" (`Arc::ptr_eq`).
#[derive(Debug, Default)]
pub(super) struct NameIndex(OnceLock<HashMap<String, usize>>);

impl NameIndex {
    /// An index built already.
    pub(super) fn built(map: HashMap<String, usize>) -> Self {
        Self(OnceLock::from(map))
    }

    /// The index, built from `entries` (the layout's, in manifest order) on first use; names are unique (the owner
    /// and the decoder check).
    pub(super) fn of(&self, entries: &[TensorEntry]) -> &HashMap<String, usize> {
        self.0.get_or_init(|| entries.iter().enumerate().map(|(i, e)| (e.name.clone(), i)).collect())
    }
}

impl Tensors {
    /// `manifest`, its index by name to be built on the first lookup.
    pub(super) fn new(manifest: Manifest) -> Self {
        Self { manifest, index: Arc::default() }
    }

    /// `manifest` with `index`, the index of a manifest of the same layout: the same names, descriptions and
    /// offsets in the same order (an owner's generations: [`BoundCopies`](super::BoundCopies) takes a shared index
    /// for a layout unchanged, without comparing the entries).
    pub(super) fn with_index(manifest: Manifest, index: Arc<NameIndex>) -> Self {
        Self { manifest, index }
    }

    /// The index of its names (shared by every generation of one owner's layout).
    pub(super) fn index(&self) -> &Arc<NameIndex> {
        &self.index
    }

    /// The entry named `name`.
    pub(super) fn entry(&self, name: &str) -> Result<&TensorEntry, WeightsError> {
        self.index
            .of(&self.manifest.entries)
            .get(name)
            .and_then(|i| self.manifest.entries.get(*i))
            .ok_or_else(|| WeightsError::UnknownTensor { set: self.manifest.set_name.clone(), name: name.to_owned() })
    }

    /// Entry `index` (in manifest order).
    pub(super) fn entry_at(&self, index: usize) -> Result<&TensorEntry, WeightsError> {
        self.manifest.entries.get(index).ok_or_else(|| {
            WeightsError::Invalid(format!(
                "weight set `{}` has {} tensors: there is no tensor {index}",
                self.manifest.set_name,
                self.manifest.entries.len()
            ))
        })
    }

    /// `entry`'s bytes inside `arena`, the span of the whole arena.
    pub(super) fn slice<'a>(arena: &DeviceSpan<'a>, entry: &TensorEntry) -> Result<DeviceSpan<'a>, WeightsError> {
        arena.slice(entry.offset, entry.span_bytes()).map_err(WeightsError::driver)
    }
}
