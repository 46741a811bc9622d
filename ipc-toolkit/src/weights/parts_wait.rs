//! The stream-ordered wait for a generation of a set on several devices: [`WeightsPartsReader::wait_on`],
//! [`WeightsPartsReader::watch`], [`WeightsPartsReader::wait_status`] and [`WeightsPartsReader::copy_status_on`],
//! what [`WeightsReader`](super::WeightsReader)'s do (`stream_wait.rs`, whose code they share) for the set's
//! generation. A status word is registered for one context, so each part has a gate of its own, made at the first
//! wait on that part: a stream or kernel on part k's device waits on and reads part k's word. Every gate follows part
//! 0's note word (the set's generation: the owner commits part 0 last) and is marked gone when any part's connection
//! says the owner is gone.

use super::error::WeightsError;
use super::gate::GateSource;
use super::io::ArenaBytes;
use super::parts_reader::WeightsPartsReader;
use super::stream_wait::{GatedReader, GenerationWait, GenerationWaitStatus, arm, queue_wait, wait_status_methods};
use crate::pool::PoolImporter;
use gpu_ipc_driver::{DeviceMemory, DeviceSpan, Stream};
use ipc_core::backend::Backend;

/// What a set of parts' gates follow: part 0's note word and every part's connection (a handle of its own on each).
pub(super) struct PartsSource<B: Backend>(pub(super) Vec<PoolImporter<B>>);

impl<B: Backend> GateSource for PartsSource<B> {
    fn newest(&self) -> u64 {
        self.0.first().map_or(0, GateSource::newest)
    }
    fn owner_gone(&self) -> bool {
        self.0.iter().any(GateSource::owner_gone)
    }
}

impl<B: ArenaBytes> GatedReader for WeightsPartsReader<B> {
    type Source = PartsSource<B>;
    fn set_name(&self) -> &str {
        WeightsPartsReader::set_name(self)
    }
    fn latest(&self) -> Result<u64, WeightsError> {
        WeightsPartsReader::latest(self)
    }
    fn gate_source(&self) -> PartsSource<B> {
        PartsSource(self.share_importers())
    }
}

impl<B: ArenaBytes> WeightsPartsReader<B> {
    /// Makes part `part`'s status word follow the set's published generation until `generation` (or a newer one)
    /// is published or the owner goes, without queueing a stream wait, and returns the wait to read it by: for
    /// kernels on part `part`'s device that read the word themselves, and for the host backend. As
    /// [`WeightsReader::watch`](super::WeightsReader::watch); the word is registered for that part's device.
    ///
    /// # Errors
    /// [`WeightsError::Invalid`] for a part the set does not have or a generation outside `1..=MAX_GENERATION`;
    /// [`WeightsError::OwnerGone`]; [`WeightsError::StreamGate`].
    pub fn watch(&self, generation: u64, part: usize) -> Result<GenerationWait, WeightsError> {
        let Some((slot, cuda)) = self.part_gate(part) else {
            return Err(WeightsError::Invalid(format!(
                "weight set `{}` has {} parts: there is no part {part} to watch on",
                self.set_name(),
                self.part_count()
            )));
        };
        arm(self, &mut slot.lock(), cuda, generation)
    }

    /// Queues on `stream` a wait for the set's generation `generation` (or a newer one) to be published, released
    /// too once the owner is gone or this reader closes: as [`WeightsReader::wait_on`](super::WeightsReader::wait_on).
    /// `stream` must be of one of the set's devices: the wait uses the gate of the first part whose CUDA context is
    /// the stream's (parts may share a device), whose word the kernels queued after it read.
    ///
    /// ```no_run
    /// use gpu_ipc_driver::{Context, Stream};
    /// use ipc_core::backend::GpuBackend;
    /// use ipc_toolkit::weights::{GenerationWaitStatus, WeightsPartsReader};
    ///
    /// fn next<B: GpuBackend>(on: &Context, mut reader: WeightsPartsReader<B>) -> Result<(), Box<dyn std::error::Error>> {
    ///     let stream = Stream::new(on)?; // a context of one of the parts' devices
    ///     let wait = reader.wait_on(reader.generation() + 1, &stream)?;
    ///     stream.synchronize()?;
    ///     if let GenerationWaitStatus::Published { .. } = reader.wait_status(&wait) {
    ///         reader.refresh()?;
    ///     }
    ///     Ok(())
    /// }
    /// ```
    ///
    /// # Errors
    /// [`WeightsError::NoCudaContext`] (the host backend: use [`watch`](Self::watch) or
    /// [`wait_for`](Self::wait_for)); [`WeightsError::Invalid`] for a stream of none of the set's devices' contexts
    /// (it names them) or a generation outside `1..=MAX_GENERATION`; as
    /// [`WeightsReader::wait_on`](super::WeightsReader::wait_on).
    pub fn wait_on(&self, generation: u64, stream: &Stream) -> Result<GenerationWait, WeightsError> {
        let contexts: Vec<_> = self.part_contexts().collect();
        if contexts.iter().all(Option::is_none) {
            return Err(WeightsError::NoCudaContext { set: self.set_name().to_owned() });
        }
        let on = stream.context().as_raw();
        let found = contexts.iter().enumerate().find_map(|(k, c)| c.filter(|c| c.as_raw() == on).map(|c| (k, c)));
        let Some((slot, ctx)) = found.and_then(|(k, ctx)| Some((self.part_gate(k)?.0, ctx))) else {
            let devices: Vec<String> =
                contexts.iter().flatten().map(|c| format!("cuda:{}", c.device().ordinal())).collect();
            return Err(WeightsError::Invalid(format!(
                "weight set `{}`: the stream belongs to none of the set's devices (its parts lie on {}): queue the \
                 wait on a stream of one of them, in the context the reader opened that part on",
                self.set_name(),
                devices.join(", ")
            )));
        };
        queue_wait(self, &mut slot.lock(), ctx, generation, stream)
    }
}

wait_status_methods!(WeightsPartsReader);
