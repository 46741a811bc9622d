//! Errors of the frame-sharing API.

use std::time::Duration;

use crate::backend::BackendError;
use crate::ring::RingError;
use crate::wire::WireError;
use gpu_ipc_driver::DriverError;

/// What went wrong producing or consuming frames.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum FrameError {
    /// The producer died: its connection hung up (the process exited or was killed) without closing the ring,
    /// or it gave the ring up with [`Producer::abandon`](super::Producer::abandon). A producer that closed the
    /// ring (dropped once its work was done) gives [`FrameError::EndOfStream`] instead. With a GPU-side strategy,
    /// what was computed from frames at or above
    /// [`Consumer::published_below_at_hang_up`](super::Consumer::published_below_at_hang_up) may hold partial
    /// data: discard it.
    #[error("the producer (pid {pid}) is gone: {how}")]
    ProducerGone {
        /// The producer's pid.
        pid: u32,
        /// How it was noticed.
        how: String,
    },
    /// The peer awaited died during the wait (a consumer, seen from the producer: it no longer counts).
    #[error("the peer died during the wait")]
    PeerGone,
    /// The producer evicted this consumer (it held a frame too long, or the application evicted it): it no
    /// longer counts, and its frames may be overwritten. Attach again to go on.
    #[error("the producer evicted this consumer (record {consumer}): it held up the ring too long; attach again")]
    Evicted {
        /// The consumer's record index.
        consumer: u32,
    },
    /// A bounded wait ran out.
    #[error("timed out after {waited:?} waiting for {what}")]
    Timeout {
        /// What was awaited.
        what: String,
        /// How long.
        waited: Duration,
    },
    /// A GPU-side wait of the `gpu-poll` strategy gave up at its deadline (`%globaltimer`), so the stream went on
    /// without what it waited for: the work queued after it is not valid, and this side fails from then on. Attach
    /// (or create the producer) again, with a longer timeout.
    #[error("the GPU gave up after {waited:?} waiting for {what}")]
    GpuWaitGaveUp {
        /// What was awaited, what it means, and what to do.
        what: String,
        /// How long the GPU waited (its budget).
        waited: Duration,
    },
    /// The producer's admission thread stopped accepting consumers (it kept panicking: a bug, logged with what each
    /// panic said): the consumers attached are served on, no other can attach. Create the producer again.
    #[error("the producer's admission thread stopped accepting consumers ({0}); create the producer again")]
    Admission(String),
    /// The producer closed the ring (a clean end of stream, not a death): it published frames `0..published`, and
    /// every one of them was delivered. With a GPU-side strategy, a wait queued ahead for a frame at or past the
    /// end (`past_end`, from [`Consumer::release`](super::Consumer::release)) was released by the end, not by a
    /// frame: discard what was computed from that frame.
    #[error("end of stream: the producer closed the ring after {published} frames{}", past_end_words(*.past_end))]
    EndOfStream {
        /// Frames the producer published (sequences `0..published`).
        published: u64,
        /// A frame this consumer had queued work for that the producer never published.
        past_end: Option<u64>,
    },
    /// A lease or frame that is not this producer's or consumer's to use (another's, an earlier ring's, or a frame
    /// published already): refused before anything is queued.
    #[error("this {token} cannot be used here: {problem}")]
    ForeignToken {
        /// `slot lease` or `frame`.
        token: &'static str,
        /// What is wrong with it.
        problem: String,
    },
    /// The ring's configuration is not usable.
    #[error("invalid ring configuration: {0}")]
    Config(String),
    /// The strategy needs what the backend or device cannot give.
    #[error("sync strategy {strategy} is not available: {reason}")]
    StrategyUnavailable {
        /// The strategy.
        strategy: String,
        /// Why.
        reason: String,
    },
    /// The producer refused this consumer.
    #[error("the producer refused to attach: {0}")]
    Refused(String),
    /// Backend error (allocation, export, import).
    #[error(transparent)]
    Backend(#[from] BackendError),
    /// Driver error (streams, events, registration).
    #[error(transparent)]
    Driver(#[from] DriverError),
    /// Control-block error.
    #[error(transparent)]
    Ring(#[from] RingError),
    /// Protocol or socket error.
    #[error(transparent)]
    Wire(#[from] WireError),
}

fn past_end_words(past_end: Option<u64>) -> String {
    past_end.map_or_else(String::new, |seq| {
        format!("; frame {seq} was queued past the end and never written: discard what was computed from it")
    })
}

impl FrameError {
    /// Whether this is the clean end of a stream ([`FrameError::EndOfStream`]): the loop that reads frames ends here
    /// with success.
    pub fn is_end_of_stream(&self) -> bool {
        matches!(self, Self::EndOfStream { .. })
    }
}
