//! What can go wrong with a weight set, with what to do about it.

use std::path::PathBuf;
use std::time::Duration;

use super::manifest::ManifestError;
use crate::pool::PoolError;
use ipc_core::wire::TensorDesc;

/// Why a weights operation failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum WeightsError {
    /// The pool underneath (socket, memory, import, a peer's protocol error).
    #[error(transparent)]
    Pool(PoolError),
    /// The owner closed the set or its process ended. Generations already held stay readable until dropped.
    #[error("the owner of weight set `{set}` at {} {how}: generations already held stay readable; open the set again once an owner publishes it", path.display())]
    OwnerGone {
        /// The set's name.
        set: String,
        /// The socket.
        path: PathBuf,
        /// How it left: "closed the set" or "hung up".
        how: &'static str,
    },
    /// The owner at the socket publishes no set of that name (or no generation yet).
    #[error("no weight set `{set}` at {}: {detail}", path.display())]
    NoSuchSet {
        /// The set asked for.
        set: String,
        /// The socket.
        path: PathBuf,
        /// What was found instead.
        detail: String,
    },
    /// An arena's manifest failed its checks: nothing of that generation was described.
    #[error("weight set `{set}` generation {generation}: the manifest was refused: {source}")]
    Manifest {
        /// The set.
        set: String,
        /// The generation whose arena held it.
        generation: u64,
        /// The check that failed.
        #[source]
        source: ManifestError,
    },
    /// A reader of one part opened a set on several devices (or the parts disagree with each other): nothing of
    /// it was described.
    #[error("weight set `{set}` at {}: {detail}", path.display())]
    Parts {
        /// The set.
        set: String,
        /// The socket.
        path: PathBuf,
        /// What is wrong and what to do.
        detail: String,
    },
    /// A wait ran out of time.
    #[error("weight set `{set}`: generation {wanted} not published after {waited:?} (newest is {latest})")]
    Timeout {
        /// The set.
        set: String,
        /// The generation waited for.
        wanted: u64,
        /// The newest published when the wait ended.
        latest: u64,
        /// How long it waited.
        waited: Duration,
    },
    /// No tensor of that name in the generation.
    #[error("weight set `{set}` has no tensor named {name:?}")]
    UnknownTensor {
        /// The set.
        set: String,
        /// The name asked for.
        name: String,
    },
    /// Data given for a tensor does not match its description (shape, element type or byte count).
    #[error("tensor {name:?}: {problem}")]
    Mismatch {
        /// The tensor.
        name: String,
        /// What differs.
        problem: String,
    },
    /// A tensor's bytes do not match the checksum its manifest carries.
    #[error(
        "weight set `{set}` generation {generation}, tensor {name:?}: checksum {found:#018x}, manifest says {expected:#018x}"
    )]
    ChecksumMismatch {
        /// The set.
        set: String,
        /// The generation.
        generation: u64,
        /// The tensor.
        name: String,
        /// The manifest's checksum.
        expected: u64,
        /// The checksum of the bytes.
        found: u64,
    },
    /// A stream wait was asked of a reader without a CUDA context (the host backend).
    #[error(
        "weight set `{set}`: stream waits need a GPU backend (legacy or vmm): this reader has no CUDA context; wait on the CPU (wait_for), or watch the status word"
    )]
    NoCudaContext {
        /// The set.
        set: String,
    },
    /// The device cannot queue 64-bit stream waits (`CU_DEVICE_ATTRIBUTE_CAN_USE_64_BIT_STREAM_MEM_OPS` is 0).
    #[error(
        "weight set `{set}`: this device cannot queue 64-bit stream waits (CU_DEVICE_ATTRIBUTE_CAN_USE_64_BIT_STREAM_MEM_OPS is 0): wait on the CPU (wait_for), or let kernels read the status word of watch()"
    )]
    NoStreamMemOps {
        /// The set.
        set: String,
    },
    /// The reader's stream gate (its status word, its registration, its thread) could not be made.
    #[error("weight set `{set}`: the reader's stream gate: {problem}")]
    StreamGate {
        /// The set.
        set: String,
        /// What failed.
        problem: String,
    },
    /// Every arena the owner may have is held (by readers, or published and kept): the next generation has no
    /// room until a reader lets go.
    #[error(
        "weight set `{set}`: no arena free for the next generation: {arenas} arenas of at most {max_arenas} (max_arenas) are published, kept or held ({holds}); a generation's arena is reused once no reader holds it: readers let go when they refresh past it or close and drop its tensors (or die); raise max_arenas for more room"
    )]
    ArenasHeld {
        /// The set.
        set: String,
        /// Arenas made and not reused.
        arenas: usize,
        /// [`WeightsOptions::max_arenas`](super::WeightsOptions::max_arenas).
        max_arenas: u32,
        /// Who holds which generation, in words.
        holds: String,
        /// The pool's refusal.
        source: Box<crate::pool::PoolError>,
    },
    /// A call out of order or an invalid argument (no staged generation to commit, a bad set name, ...).
    #[error("{0}")]
    Invalid(String),
}

impl WeightsError {
    /// `OwnerGone` for the pool's `OwnerGone`, the pool's error otherwise.
    pub(crate) fn from_pool(set: &str, error: PoolError) -> Self {
        match error {
            PoolError::OwnerGone { path, how } => {
                let how = if how == "closed the pool" { "closed the set" } else { how };
                Self::OwnerGone { set: set.to_owned(), path, how }
            }
            other => Self::Pool(other),
        }
    }

    /// A driver error of a copy or a span, as the pool's `Backend` error.
    pub(crate) fn driver(error: gpu_ipc_driver::DriverError) -> Self {
        Self::Pool(PoolError::Backend(error.into()))
    }

    /// A `Mismatch` between a tensor's description and data given for it.
    pub(crate) fn mismatch(name: &str, desc: &TensorDesc, problem: impl std::fmt::Display) -> Self {
        Self::Mismatch { name: name.to_owned(), problem: format!("{problem} (the set has it as {desc})") }
    }
}

impl From<PoolError> for WeightsError {
    fn from(error: PoolError) -> Self {
        Self::Pool(error)
    }
}
