//! What a staged generation (the owner's) and a held one (a reader's) share: the manifest, its name index, and a
//! tensor's bytes as a slice of the arena's span.

use std::collections::HashMap;
use std::sync::Arc;

use super::error::WeightsError;
use super::manifest::{Manifest, TensorEntry};
use gpu_ipc_driver::DeviceSpan;

/// A generation's manifest and the index of its tensors by name (shared by every generation of an owner's set:
/// their layout is the same).
pub(super) struct Tensors {
    pub(super) manifest: Manifest,
    index: Arc<HashMap<String, usize>>,
}

impl Tensors {
    /// Indexes `manifest` (its names are unique: the owner and the decoder check).
    pub(super) fn new(manifest: Manifest) -> Self {
        let index = manifest.entries.iter().enumerate().map(|(i, e)| (e.name.clone(), i)).collect();
        Self { manifest, index: Arc::new(index) }
    }

    /// `manifest` with `index`, the index of a manifest of the same layout: the same names, descriptions and
    /// offsets in the same order (an owner's generations: [`BoundCopies`](super::BoundCopies) takes a shared index
    /// for a layout unchanged, without comparing the entries).
    pub(super) fn with_index(manifest: Manifest, index: Arc<HashMap<String, usize>>) -> Self {
        Self { manifest, index }
    }

    /// The index of its names (shared by every generation of one owner's layout).
    pub(super) fn index(&self) -> &Arc<HashMap<String, usize>> {
        &self.index
    }

    /// The entry named `name`.
    pub(super) fn entry(&self, name: &str) -> Result<&TensorEntry, WeightsError> {
        self.index
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
