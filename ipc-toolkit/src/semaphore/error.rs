//! Errors of the cross-process semaphore.

use std::fmt;
use std::time::Duration;

use gpu_ipc_driver::DriverError;
use ipc_core::shm::ShmError;
use ipc_core::wire::WireError;

/// A pid as the owner saw it, for messages: "pid 1234", or "a pid in another PID namespace" when unknown.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PeerPid(pub Option<u32>);

impl fmt::Display for PeerPid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            Some(pid) => write!(f, "pid {pid}"),
            None => f.write_str("a pid in another PID namespace"),
        }
    }
}

/// Everything that can go wrong with a [`Semaphore`](super::Semaphore) or its owner.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SemaphoreError {
    /// A peer that had posted died without detaching: the posts it owed may never come. The semaphore is
    /// poisoned; every GPU-side wait was released by the poison, and work queued after one ran without a post
    /// (kernels that check [`StreamWait::status_word`](super::StreamWait::status_word) saw it).
    #[error(
        "the semaphore is poisoned by a dead poster: a peer that posted to it (record {record}, {pid}) died \
         without detaching, so posts it owed may never come; GPU-side waits were released without a post: discard \
         work queued after them; its owner can reset() it (or create the semaphore again)"
    )]
    PosterDied {
        /// Its pid as the owner saw it.
        pid: PeerPid,
        /// Its record in the shared block.
        record: u32,
    },
    /// The owner's process is gone. GPU-side waits were released by the poison.
    #[error(
        "the semaphore's owner (pid {owner_pid} in its PID namespace) is gone; GPU-side waits were released \
         without a post: discard work queued after them, and attach to a new owner"
    )]
    OwnerGone {
        /// The owner's pid from the shared header.
        owner_pid: u64,
    },
    /// The owner closed the semaphore. GPU-side waits were released by the poison.
    #[error(
        "the semaphore was closed by its owner; GPU-side waits still queued were released without a post: discard \
         work queued after them"
    )]
    Closed,
    /// A bounded CPU wait ran out.
    #[error("no post came within {waited:?}; the semaphore is still usable (wait again, or post more)")]
    Timeout {
        /// How long the call waited.
        waited: Duration,
    },
    /// This handle was attached with `posts = false` (a promise not to post; no longer needed for anything).
    #[error(
        "this handle was attached with posts = false, a promise not to post; attach with the default \
         AttachOptions (posts = true) to post: a peer that never posts breaks nothing by dying either way"
    )]
    NotAPoster,
    /// A post count outside `1..=MAX_POST`.
    #[error("cannot post {count}: a post adds 1 to {max}")]
    InvalidPost {
        /// The count given.
        count: u64,
        /// The most one post may add.
        max: u64,
    },
    /// This process already has as many GPU-side waits outstanding as its record can hold.
    #[error(
        "{limit} GPU-side waits of this process are still waiting for posts; post, or let the streams catch up, \
         before queuing more"
    )]
    TooManyStreamWaits {
        /// Ticket slots per peer.
        limit: usize,
    },
    /// A stream operation on a handle made without a CUDA context.
    #[error(
        "stream operations need a CUDA context: create or attach the semaphore with a GPU backend's context (the \
         host backend has none)"
    )]
    NoCudaContext,
    /// A stream of another context than the one the semaphore registered its memory in.
    #[error(
        "this stream belongs to another CUDA context than the one the semaphore was created or attached with; use a \
         stream of that context"
    )]
    WrongContext,
    /// The device cannot queue 64-bit stream waits.
    #[error(
        "this device or driver does not offer 64-bit stream memory operations \
         (CU_DEVICE_ATTRIBUTE_CAN_USE_64_BIT_STREAM_MEM_OPS is 0): use the CPU-side wait, or a newer driver"
    )]
    NoStreamMemOps,
    /// The memfd received is not a semaphore block.
    #[error("shared block magic is {found:#018x}, not a gpu-ipc semaphore; is the socket a semaphore's?")]
    BadMagic {
        /// Value found.
        found: u64,
    },
    /// The owner uses another layout version.
    #[error("semaphore layout version {found}, this build speaks {expected}; build both sides from one release")]
    LayoutVersion {
        /// Version found.
        found: u64,
        /// Version of this build.
        expected: u32,
    },
    /// A shared word or offer field holds a value no owner writes.
    #[error("semaphore {what} holds invalid value {value:#x}; the owner is corrupt or hostile")]
    Corrupt {
        /// Which word or field.
        what: &'static str,
        /// Value found.
        value: u64,
    },
    /// Every peer record is taken (the owner's side; a connecting peer is refused with this message).
    #[error("the semaphore has all {max} peer records in use; detach a peer first")]
    Full {
        /// Records.
        max: u32,
    },
    /// Creating, sealing or mapping the shared block failed.
    #[error(transparent)]
    Shm(#[from] ShmError),
    /// A CUDA driver call failed.
    #[error(transparent)]
    Driver(#[from] DriverError),
    /// The offer could not be decoded.
    #[error(transparent)]
    Wire(#[from] WireError),
    /// Attaching through the socket failed.
    #[error(transparent)]
    Door(#[from] crate::door::DoorError),
    /// A thread could not be started.
    #[error("starting the semaphore's {what} thread failed: {source}")]
    Thread {
        /// Which thread.
        what: &'static str,
        /// The OS error.
        source: std::io::Error,
    },
}
