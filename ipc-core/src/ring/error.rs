//! Errors of the frame ring's control block.

use std::fmt;
use std::time::Duration;

use super::layout::{ConsumerId, ConsumerState, Sequence};
use crate::shm::ShmError;

/// Why a peer is considered gone.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GoneReason {
    /// The producer closed the ring cleanly.
    Closed,
    /// `kill(pid, 0)` says the process no longer exists.
    ProcessExited,
    /// Its heartbeat is older than the configured bound.
    HeartbeatStale {
        /// Age of the last heartbeat.
        age: Duration,
    },
    /// A survivor wrote [`POISON`](super::layout::POISON) into the ring's counters.
    Poisoned,
}

impl fmt::Display for GoneReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Closed => f.write_str("it closed the ring"),
            Self::ProcessExited => f.write_str("its process no longer exists"),
            Self::HeartbeatStale { age } => write!(f, "its heartbeat is {age:?} old"),
            Self::Poisoned => f.write_str("a peer declared it dead and poisoned the ring's counters"),
        }
    }
}

/// What a bounded wait was waiting for, for the timeout message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WaitTarget {
    /// A consumer waiting for frame `seq` to be published.
    Published(Sequence),
    /// The producer waiting for the slot of frame `seq` to be released by every counted consumer.
    Reusable(Sequence),
    /// A caller-supplied condition.
    Condition(&'static str),
}

impl fmt::Display for WaitTarget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Published(seq) => write!(f, "frame {seq} to be published"),
            Self::Reusable(seq) => write!(f, "the slot of frame {seq} to be released by every live consumer"),
            Self::Condition(what) => f.write_str(what),
        }
    }
}

/// Everything that can go wrong in the ring's control block.
#[derive(Debug, thiserror::Error)]
pub enum RingError {
    /// Creating, sealing or mapping the shared memory failed.
    #[error(transparent)]
    Shm(#[from] ShmError),
    /// A ring parameter is out of range.
    #[error("ring {what} = {value} is out of range 1..={max}")]
    InvalidConfig {
        /// Which parameter.
        what: &'static str,
        /// Value given.
        value: u64,
        /// Largest allowed value.
        max: u64,
    },
    /// The received memfd is not a ring control block.
    #[error("control block magic is {found:#018x}, not a gpu-ipc ring; was the right fd passed?")]
    BadMagic {
        /// Value found.
        found: u64,
    },
    /// The producer uses another layout version.
    #[error(
        "control block layout version {found}, this build reads versions 1 to {newest}; use a gpu-ipc release on this \
         side that reads layout {found}, or give the ring a slot count this build's layouts hold"
    )]
    LayoutVersion {
        /// Version found.
        found: u64,
        /// Newest version this build reads.
        newest: u64,
    },
    /// A header or state word holds a value no version of this layout writes.
    #[error("control block {what} holds invalid value {value:#x}; the shared memory is corrupt")]
    Corrupt {
        /// Which word.
        what: &'static str,
        /// Value found.
        value: u64,
    },
    /// The control block is not the ring the offer describes.
    #[error(
        "the control block (slot_count {found_slots}, generation {found_generation}) is not the ring the offer \
         describes (slot_count {offered_slots}, generation {offered_generation})"
    )]
    NotTheOfferedRing {
        /// The block's slot count.
        found_slots: u32,
        /// The block's generation.
        found_generation: u64,
        /// The offer's slot count.
        offered_slots: u32,
        /// The offer's generation.
        offered_generation: u64,
    },
    /// Every consumer record is taken.
    #[error(
        "ring is full: all {max_consumers} consumer records are taken ({reclaimable} detached or dead ones can be \
         freed with reclaim_consumer)"
    )]
    RingFull {
        /// Number of records.
        max_consumers: u32,
        /// Records in state `Detached` or `Dead`.
        reclaimable: u32,
    },
    /// A consumer id whose index is outside the ring.
    #[error("{consumer} does not exist: the ring has {max_consumers} consumer records")]
    UnknownConsumer {
        /// The id.
        consumer: ConsumerId,
        /// Number of records.
        max_consumers: u32,
    },
    /// The record of a consumer id is no longer (or not yet) in the expected state for this registration.
    #[error(
        "{consumer} is not live: its record is {} in epoch {found_epoch} (detached, declared dead, or \
         reclaimed); re-attach through the producer",
        record_state(*found)
    )]
    NotLive {
        /// The id.
        consumer: ConsumerId,
        /// State found in the record.
        found: Option<ConsumerState>,
        /// Epoch found in the record.
        found_epoch: u32,
    },
    /// A consumer is registering right now; its join sequence is not decided yet.
    #[error("consumer record {index} is joining; retry in a few microseconds")]
    JoinInProgress {
        /// Record index.
        index: u32,
    },
    /// The producer published out of order.
    #[error("publish of frame {got} out of order: the next frame is {expected}")]
    OutOfOrder {
        /// The next sequence.
        expected: Sequence,
        /// The sequence given.
        got: Sequence,
    },
    /// A consumer asked about a frame before its join sequence.
    #[error("{consumer} joined at frame {join} and cannot read or release frame {seq}")]
    BeforeJoin {
        /// The consumer.
        consumer: ConsumerId,
        /// Frame asked about.
        seq: Sequence,
        /// First frame of this consumer.
        join: Sequence,
    },
    /// The slot of a frame already holds a later frame: this consumer was not counted for back-pressure.
    #[error("{consumer} lost frame {seq}: its slot already holds published value {found} (consumer not counted?)")]
    Overrun {
        /// The consumer.
        consumer: ConsumerId,
        /// Frame it wanted.
        seq: Sequence,
        /// Value of `published` found.
        found: u64,
    },
    /// A bounded wait ran out.
    #[error("timed out after {waited:?} waiting for {waiting_for}")]
    Timeout {
        /// What was awaited.
        waiting_for: WaitTarget,
        /// How long.
        waited: Duration,
    },
    /// The producer is gone.
    #[error("producer pid {pid} is gone: {reason}; reconnect to a new producer")]
    ProducerGone {
        /// Producer pid from the header.
        pid: u64,
        /// Why.
        reason: GoneReason,
    },
    /// A consumer is gone; the producer should call `mark_consumer_dead` and go on.
    #[error("{consumer} (pid {pid}) is gone: {reason}; call mark_consumer_dead to stop waiting for it")]
    ConsumerGone {
        /// The consumer.
        consumer: ConsumerId,
        /// Its pid.
        pid: u64,
        /// Why.
        reason: GoneReason,
    },
}

/// A consumer record's state in words, for messages (never the variant's name).
fn record_state(found: Option<ConsumerState>) -> &'static str {
    match found {
        Some(ConsumerState::Free) => "free",
        Some(ConsumerState::Joining) => "joining",
        Some(ConsumerState::Live) => "live",
        Some(ConsumerState::Detached) => "detached",
        Some(ConsumerState::Dead) => "declared dead",
        None => "unreadable",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_that_is_not_live_is_described_in_words() {
        let e =
            RingError::NotLive { consumer: ConsumerId::new(3, 7), found: Some(ConsumerState::Dead), found_epoch: 8 };
        let message = e.to_string();
        assert!(message.contains("its record is declared dead in epoch 8"), "{message}");
        let e = RingError::NotLive { consumer: ConsumerId::new(3, 7), found: None, found_epoch: 8 };
        assert!(e.to_string().contains("its record is unreadable in epoch 8"));
    }
}
