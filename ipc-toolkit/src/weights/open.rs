//! Opening a weight set by name without knowing whether it lies on one device or several: [`OpenedSet::open`]
//! attaches once to part 0 (the only part of a set on one device) and goes on from what its manifest says.

use std::path::Path;
use std::time::Duration;

use super::error::WeightsError;
use super::io::ArenaBytes;
use super::parts_reader::WeightsPartsReader;
use super::reader::{WeightsReader, load, wait_first};
use crate::door::DoorError;
use crate::pool::{AttachOptions, PoolError, PoolImporter};
use gpu_ipc_driver::DeviceUuid;
use ipc_core::wire::RefusalCode;

/// How long a reader refused by a full pool waits before it asks again.
const FULL_RETRY: Duration = Duration::from_millis(20);

/// A weight set opened by [`OpenedSet::open`]: a reader of a set on one device, or of a set on several.
#[derive(Debug)]
pub enum OpenedSet<B: ArenaBytes> {
    /// The set lies on one device.
    Whole(WeightsReader<B>),
    /// The set lies on several devices, one part each.
    Parts(WeightsPartsReader<B>),
}

impl<B: ArenaBytes> OpenedSet<B> {
    /// Opens the weight set `set` served at `socket`, whichever kind it is, and takes its newest generation:
    /// one attachment to part 0 (on the context `context_for` gives for the device its offer names), then, for a
    /// set of parts, one to each other part, as [`WeightsPartsReader::open`] does. What the set's first manifest
    /// says decides; nothing is attached twice. `timeout` bounds the attachments (asked again while the set is full
    /// of readers) and the wait for the first generation together; each block request after the handshake has the
    /// whole `timeout` of its own.
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
        let started = std::time::Instant::now();
        // A pool full of readers (attached, or handshakes not finished yet) refuses with RingFull: tried again until
        // `timeout`, as a reader that waits its turn, since a place frees as soon as one leaves or times out.
        let first = loop {
            let attached = PoolImporter::<B>::attach_part_on(&path, &options, 0, |uuid| {
                let ctx = context_for(uuid)?;
                part0_context = Some(ctx.clone());
                Ok(ctx)
            });
            match attached {
                Err(PoolError::Door(DoorError::Refused { code: RefusalCode::RingFull, .. }))
                    if started.elapsed() + FULL_RETRY < timeout =>
                {
                    std::thread::sleep(FULL_RETRY);
                }
                other => break other.map_err(|e| WeightsError::from_pool(set, e))?,
            }
        };
        let attached = started.elapsed();
        let generation = wait_first(&first, set, &path, timeout.saturating_sub(attached))?;
        let waited = started.elapsed();
        let loaded = load(&first, set, &path, generation, None)?;
        tracing::debug!(
            set,
            generation,
            attach_us = attached.as_micros(),
            first_generation_us = (waited - attached).as_micros(),
            load_us = (started.elapsed() - waited).as_micros(),
            "weight set's part 0 attached and loaded"
        );
        let cuda = part0_context.as_ref().and_then(B::cuda_context).cloned();
        if loaded.0.manifest().parts.is_none() {
            return WeightsReader::opened(cuda, first, path, set, loaded).map(Self::Whole);
        }
        // One bound for the whole open: the other parts get what part 0 left of it.
        let left = timeout.saturating_sub(started.elapsed());
        WeightsPartsReader::open_from((first, cuda), loaded, path, set, context_for, left).map(Self::Parts)
    }
}

/// Here beside [`OpenedSet::open`], which it goes through.
impl<B: ArenaBytes> WeightsPartsReader<B> {
    /// Attaches to every part of the set `set` served at `socket` and takes the newest generation (waiting up to
    /// `timeout` for the first). `context_for` gives the context of the device with a UUID (part 0's device as its
    /// offer names it, then each other part's as part 0's manifest names it): on a GPU, the device of this process
    /// with that UUID (`CUDA_VISIBLE_DEVICES` may number devices otherwise here; `Device::with_uuid` finds it); on
    /// the host backend, the host context.
    ///
    /// # Errors
    /// The pool's attach errors; [`WeightsError::Parts`] for a set on one device (open it with
    /// [`WeightsReader`](super::WeightsReader)) or parts that disagree; [`WeightsError::NoSuchSet`];
    /// [`WeightsError::Timeout`]; [`WeightsError::Manifest`]; whatever `context_for` returns.
    pub fn open(
        socket: impl AsRef<Path>,
        set: &str,
        context_for: impl FnMut(DeviceUuid) -> Result<B::Context, PoolError>,
        timeout: Duration,
    ) -> Result<Self, WeightsError> {
        // One way in for both kinds: part 0 attached once, its manifest says which (`OpenedSet::open`).
        match OpenedSet::open(socket.as_ref(), set, context_for, timeout)? {
            OpenedSet::Parts(reader) => Ok(reader),
            OpenedSet::Whole(_) => Err(WeightsError::Parts {
                set: set.to_owned(),
                path: socket.as_ref().to_path_buf(),
                detail: "the set lies on one device: open it with WeightsReader".into(),
            }),
        }
    }
}
