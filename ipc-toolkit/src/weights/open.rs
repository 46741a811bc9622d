//! Opening a weight set by name without knowing whether it lies on one device or several: [`OpenedSet::open`]
//! attaches once to part 0 (the only part of a set on one device) and goes on from what its manifest says.

use std::path::Path;
use std::time::Duration;

use super::error::WeightsError;
use super::io::ArenaBytes;
use super::parts_reader::WeightsPartsReader;
use super::reader::{WeightsReader, load, wait_first};
use crate::pool::{AttachOptions, PoolError, PoolImporter};
use gpu_ipc_driver::DeviceUuid;

/// A weight set opened by [`OpenedSet::open`]: a reader of a set on one device, or of a set on several.
#[derive(Debug)]
pub enum OpenedSet<B: ArenaBytes> {
    /// The set lies on one device.
    Whole(WeightsReader<B>),
    /// The set lies on several devices, one part each.
    Parts(WeightsPartsReader<B>),
}

impl<B: ArenaBytes> OpenedSet<B> {
    /// Opens the weight set `set` served at `socket`, whichever kind it is, and takes its newest generation
    /// (waiting up to `timeout` for the first): one attachment to part 0 (on the context `context_for` gives for
    /// the device its offer names), then, for a set of parts, one to each other part, as
    /// [`WeightsPartsReader::open`] does. What the set's first manifest says decides; nothing is attached twice.
    ///
    /// # Errors
    /// As [`WeightsReader::open`] and [`WeightsPartsReader::open`]; whatever `context_for` returns.
    pub fn open(
        socket: impl AsRef<Path>,
        set: &str,
        mut context_for: impl FnMut(DeviceUuid) -> Result<B::Context, PoolError>,
        timeout: Duration,
    ) -> Result<Self, WeightsError> {
        let path = socket.as_ref().to_path_buf();
        let options = AttachOptions { name: format!("weights reader of {set}"), timeout };
        let mut part0_context = None;
        let first = PoolImporter::<B>::attach_part_on(&path, &options, 0, |uuid| {
            let ctx = context_for(uuid)?;
            part0_context = Some(ctx.clone());
            Ok(ctx)
        })
        .map_err(|e| WeightsError::from_pool(set, e))?;
        let generation = wait_first(&first, set, &path, timeout)?;
        let loaded = load(&first, set, &path, generation, None)?;
        let cuda = part0_context.as_ref().and_then(B::cuda_context).cloned();
        if loaded.0.manifest().parts.is_none() {
            return WeightsReader::opened(cuda, first, path, set, loaded).map(Self::Whole);
        }
        WeightsPartsReader::open_from((first, cuda), loaded, path, set, context_for, timeout).map(Self::Parts)
    }
}
