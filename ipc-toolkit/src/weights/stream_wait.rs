//! The stream-ordered wait for a generation: [`WeightsReader::wait_on`] (a CUDA stream holds until a generation is
//! published or the owner is gone), [`WeightsReader::watch`] (the same word, no stream wait: for kernels and CUDA
//! graphs that read it), [`WeightsReader::wait_status`] and [`WeightsReader::copy_status_on`]; and the code they
//! share with a set of parts' (`parts_wait.rs`): [`arm`], [`queue_wait`], and `wait_status` and `copy_status_on`
//! themselves (one macro for both readers).
//!
//! Why a word of the reader's own, not the owner's note word: importers map the pool directory read-only (a reader
//! must never write what other readers read), and a stream wait cannot time out, so something must release it when
//! the owner dies, and a dead owner writes nothing. The reader's gate ([`super::gate`]) is written by this process
//! only: its thread copies the note into it while a wait is pending and marks it gone when the owner hangs up or the
//! reader closes.

use std::sync::Arc;

use super::error::WeightsError;
use super::gate::{GONE_BIT, Gate, GateSource, MAX_GENERATION, StatusWord, StreamGate, released};
use super::io::ArenaBytes;
use super::reader::WeightsReader;
use crate::pool::PoolImporter;
use crate::stream_marks::StreamMarks;
use gpu_ipc_driver::{Context, DeviceFeature, DeviceMemory, DevicePtr, DeviceSpan, Stream, WaitCondition};
use ipc_core::backend::Backend;

/// A wait for a generation ([`WeightsReader::wait_on`] queued on a stream, or [`WeightsReader::watch`]): the
/// generation and the reader's status word, which it keeps allocated (and registered) while it lives.
///
/// The word holds the newest generation the reader's gate has seen, with [`GONE_BIT`] set once the owner is gone
/// (it closed the set or its process ended) or the reader closed. It only grows. Kernels queued after the wait read
/// it once (`ld.acquire.sys.u64`, or a `volatile` load) and apply [`status_of`](Self::status_of)'s rule:
/// `(word & ~GONE_BIT) >= generation`: the generation is published (load it: the CPU calls `refresh` and
/// `load_into`); otherwise the gone mark released the wait and no new generation is coming from this owner.
#[derive(Debug, Clone)]
#[must_use = "give the kernels queued after the wait its status_word and generation, or ask wait_status, to know \
              whether the generation or the owner's end released it"]
pub struct GenerationWait {
    generation: u64,
    word: Arc<StatusWord>,
}

/// How a [`GenerationWait`] stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GenerationWaitStatus {
    /// Not released yet: the stream still waits.
    Waiting,
    /// Released by a publication: `newest` (at least the generation waited for) is published.
    Published {
        /// The newest generation the reader's gate has seen.
        newest: u64,
    },
    /// Released by the end: the owner closed the set or died (or the reader closed) before the generation came.
    OwnerGone {
        /// The newest generation the reader's gate saw.
        newest: u64,
    },
}

impl GenerationWait {
    /// The generation waited for.
    pub fn generation(&self) -> u64 {
        self.generation
    }

    /// The address of the reader's status word, for the kernels queued after the wait (read-only for them): a
    /// device address on a GPU backend (host memory registered for the device), the host address on the host
    /// backend. Valid while this wait or its reader lives.
    pub fn status_word(&self) -> DevicePtr {
        self.word.ptr()
    }

    /// The status word itself (its address, its value as the CPU reads it); a clone of the `Arc` keeps it
    /// allocated, and registered on a GPU backend, like the wait (e.g. for an array that views it).
    pub fn word(&self) -> &Arc<StatusWord> {
        &self.word
    }

    /// The rule, applied to a value of the status word (read on the device, or copied by
    /// [`WeightsReader::copy_status_on`] and read back): published if `(word & ~GONE_BIT) >= generation`, else
    /// gone if [`GONE_BIT`] is set, else still waiting.
    pub fn status_of(&self, word: u64) -> GenerationWaitStatus {
        let newest = word & !GONE_BIT;
        if newest >= self.generation {
            GenerationWaitStatus::Published { newest }
        } else if word & GONE_BIT != 0 {
            GenerationWaitStatus::OwnerGone { newest }
        } else {
            GenerationWaitStatus::Waiting
        }
    }
}

/// The gate thread's view of the owner: the importer's note word and its connection.
impl<B: Backend> GateSource for PoolImporter<B> {
    fn newest(&self) -> u64 {
        self.note()
    }
    fn owner_gone(&self) -> bool {
        PoolImporter::owner_gone(self)
    }
}

impl<B: ArenaBytes> WeightsReader<B> {
    /// Makes the status word follow the published generation until `generation` (or a newer one) is published or
    /// the owner goes, without queueing a stream wait, and returns the wait to read it by. For kernels that read the
    /// word themselves (a persistent kernel, a CUDA graph that must not block: see `docs/weights.md`) and for the
    /// host backend, whose status word is host memory. A wait already released costs nothing.
    ///
    /// # Errors
    /// A generation outside `1..=MAX_GENERATION`; [`WeightsError::OwnerGone`]; [`WeightsError::StreamGate`] (the
    /// word or its thread could not be made).
    pub fn watch(&self, generation: u64) -> Result<GenerationWait, WeightsError> {
        arm(self, &mut self.gate_slot().lock(), self.cuda(), generation)
    }

    /// Queues on `stream` a wait for generation `generation` (or a newer one) to be published: the stream's later
    /// work runs once it is, **or once the owner is gone** (it closed the set or its process ended: a stream wait
    /// cannot time out, so the end releases it), or this reader closes. Returns at once. The work queued after it
    /// tells which happened from the wait's [`status_word`](GenerationWait::status_word) (or a copy:
    /// [`copy_status_on`](Self::copy_status_on)); the CPU asks [`wait_status`](Self::wait_status). The wait does not
    /// move the reader: the CPU calls [`refresh`](Self::refresh) (and copies the weights in) once it sees the
    /// generation.
    ///
    /// How: `cuStreamWaitValue64(word, generation, GEQ)` on the reader's own status word, a page of host memory
    /// registered for the device, which a thread of this process keeps equal to the owner's published generation
    /// while a wait is pending (a look every 20 us; it sleeps when none is) and marks gone when the owner hangs up
    /// (seen at the next look). The owner's pool directory is never written: importers map it read-only. Cost: the
    /// thread's CPU time while a wait is pending, and a release up to about one look (plus the OS's sleep slack)
    /// after the publication.
    ///
    /// ```no_run
    /// use gpu_ipc_driver::{Context, Stream};
    /// use ipc_core::backend::GpuBackend;
    /// use ipc_toolkit::weights::{GenerationWaitStatus, WeightsReader};
    ///
    /// fn next<B: GpuBackend>(ctx: &Context, mut reader: WeightsReader<B>) -> Result<(), Box<dyn std::error::Error>> {
    ///     let stream = Stream::new(ctx)?;
    ///     let wait = reader.wait_on(reader.generation() + 1, &stream)?;
    ///     // ... kernels queued on `stream` read wait.status_word() ...
    ///     stream.synchronize()?;
    ///     match reader.wait_status(&wait) {
    ///         GenerationWaitStatus::Published { .. } => { reader.refresh()?; }
    ///         GenerationWaitStatus::OwnerGone { .. } => return Err("the owner is gone".into()),
    ///         GenerationWaitStatus::Waiting => unreachable!("the stream passed the wait"),
    ///     }
    ///     Ok(())
    /// }
    /// ```
    ///
    /// # Errors
    /// [`WeightsError::NoCudaContext`] (the host backend: use [`watch`](Self::watch) or
    /// [`wait_for`](Self::wait_for)); a stream of another context; [`WeightsError::NoStreamMemOps`]; a generation
    /// outside `1..=MAX_GENERATION`; [`WeightsError::OwnerGone`]; [`WeightsError::StreamGate`]; the driver's error.
    pub fn wait_on(&self, generation: u64, stream: &Stream) -> Result<GenerationWait, WeightsError> {
        let Some(ctx) = self.cuda() else {
            return Err(WeightsError::NoCudaContext { set: self.set_name().to_owned() });
        };
        if stream.context().as_raw() != ctx.as_raw() {
            return Err(WeightsError::Invalid(format!(
                "weight set `{}`: the stream belongs to another CUDA context than the reader's (device {}): queue the \
                 wait on a stream of the reader's device",
                self.set_name(),
                ctx.device().ordinal()
            )));
        }
        queue_wait(self, &mut self.gate_slot().lock(), ctx, generation, stream)
    }
}

/// A reader's `wait_status` and `copy_status_on`, written once for both readers: what they do depends on the wait
/// alone (its word, registered for the context of the gate it was armed on).
macro_rules! wait_status_methods {
    ($reader:ident) => {
        impl<B: ArenaBytes> $reader<B> {
            /// How `wait` stands now: released by the generation, by the end, or still waiting (the word as the CPU
            /// reads it; once the stream has passed the wait it says what released it).
            pub fn wait_status(&self, wait: &GenerationWait) -> GenerationWaitStatus {
                wait.status_of(wait.word().load())
            }

            /// Queues on `stream` a copy of `wait`'s status word into `dst` (8 bytes of device memory in the context
            /// the wait's word is registered for: the reader's, or for a set of parts the part's the wait is on): a
            /// snapshot taken once the stream's earlier work (the wait) is done, for kernels queued after it, which
            /// then read ordinary device memory. Queue it right after [`wait_on`](Self::wait_on) on the same stream.
            ///
            /// # Errors
            /// [`WeightsError::NoCudaContext`] (the host backend); `dst` not 8 bytes; the driver's error.
            pub fn copy_status_on(
                &self,
                stream: &Stream,
                wait: &GenerationWait,
                dst: &DeviceSpan<'_>,
            ) -> Result<(), WeightsError> {
                let Some(registration) = wait.word().registration() else {
                    return Err(WeightsError::NoCudaContext { set: self.set_name().to_owned() });
                };
                let word = registration.span().slice(0, 8).map_err(WeightsError::driver)?;
                dst.copy_from_async(&word, stream).map_err(WeightsError::driver)
            }
        }
    };
}

pub(super) use wait_status_methods;

wait_status_methods!(WeightsReader);

/// Its one gate follows its importer's note word and connection.
impl<B: ArenaBytes> GatedReader for WeightsReader<B> {
    type Source = PoolImporter<B>;
    fn set_name(&self) -> &str {
        WeightsReader::set_name(self)
    }
    fn latest(&self) -> Result<u64, WeightsError> {
        WeightsReader::latest(self)
    }
    fn gate_source(&self) -> PoolImporter<B> {
        self.importer().share()
    }
}

/// What the shared code of `watch` and `wait_on` asks of a reader: [`WeightsReader`] (one gate) and
/// [`WeightsPartsReader`](super::WeightsPartsReader) (a gate a part, each following the set's generation; its methods in `parts_wait.rs`).
pub(super) trait GatedReader {
    /// What a gate's thread follows.
    type Source: GateSource;
    /// The set's name, for errors.
    fn set_name(&self) -> &str;
    /// The newest published generation: [`WeightsError::OwnerGone`] once the owner is gone.
    fn latest(&self) -> Result<u64, WeightsError>;
    /// A handle of its own on what the gates follow (for a gate's thread, or one look).
    fn gate_source(&self) -> Self::Source;
}

/// `watch`, on the gate in `slot` (made first if there is none, its word registered for `cuda` when given): arms
/// it for `generation` and returns the wait.
pub(super) fn arm<R: GatedReader>(
    reader: &R,
    slot: &mut Option<StreamGate>,
    cuda: Option<&Context>,
    generation: u64,
) -> Result<GenerationWait, WeightsError> {
    if generation == 0 || generation > MAX_GENERATION {
        return Err(WeightsError::Invalid(format!(
            "weight set `{}`: cannot wait for generation {generation}: generations run from 1 to {MAX_GENERATION}",
            reader.set_name()
        )));
    }
    reader.latest()?;
    let gate = match slot {
        Some(gate) => gate,
        None => {
            let gate = Gate::new(cuda, reader.gate_source()).map_err(|p| gate_error(reader, p))?;
            slot.insert(StreamGate::new(gate))
        }
    };
    gate.gate.arm(generation, &reader.gate_source());
    Ok(GenerationWait { generation, word: Arc::clone(gate.gate.word()) })
}

/// `wait_on`, once the caller has checked that `stream` is of `ctx`, the context of the gate in `slot`: arms the
/// gate ([`arm`]), checks (once per gate) that the device can queue 64-bit stream waits, queues
/// `cuStreamWaitValue64` unless the wait is released already, and records the mark teardown settles by.
pub(super) fn queue_wait<R: GatedReader>(
    reader: &R,
    slot: &mut Option<StreamGate>,
    ctx: &Context,
    generation: u64,
    stream: &Stream,
) -> Result<GenerationWait, WeightsError> {
    let wait = arm(reader, slot, Some(ctx), generation)?;
    let Some(gate) = slot.as_mut() else { return Err(gate_error(reader, "it was not made".into())) };
    let mem_ops = match gate.mem_ops {
        Some(known) => known,
        None => {
            *gate.mem_ops.insert(ctx.device().supports(DeviceFeature::StreamMemOps64).map_err(WeightsError::driver)?)
        }
    };
    if !mem_ops {
        return Err(WeightsError::NoStreamMemOps { set: reader.set_name().to_owned() });
    }
    if released(wait.word.load(), generation) {
        // Published already (or the end came): the stream needs no wait; the word says which.
        return Ok(wait);
    }
    let Some(registration) = wait.word.registration() else {
        return Err(gate_error(reader, "no registration".into()));
    };
    registration.wait_value_u64(stream, 0, generation, WaitCondition::AtLeast).map_err(WeightsError::driver)?;
    let marks = gate.marks.get_or_insert_with(|| StreamMarks::new(ctx));
    // A mark that could not be made: the wait is queued all the same; teardown then keeps the word for good.
    if let Err(e) = marks.record(stream, generation, "weights reader") {
        tracing::warn!(error = %e, "weights reader: no mark after a stream wait: its word will not be unregistered");
        std::mem::forget(Arc::clone(&wait.word));
    }
    Ok(wait)
}

fn gate_error<R: GatedReader>(reader: &R, problem: String) -> WeightsError {
    WeightsError::StreamGate { set: reader.set_name().to_owned(), problem }
}
