//! The ring's state machine over the control block's atomics: producer side, consumer side, bounded waits.
//!
//! Memory ordering, in one place:
//! - `published[slot]` is written with `Release` after the frame's contents are complete and read with `Acquire`
//!   by consumers, so a consumer that sees `s + 1` also sees frame `s`.
//! - `released[c][slot]` is written with `Release` after the consumer's last read of the frame and read with
//!   `Acquire` by the producer, so the producer's overwrite happens after those reads.
//! - Registration and the producer's reuse check form a store-then-load pair on each side (`next_sequence` /
//!   record state), which needs `SeqCst` on all four operations (see [`ProducerControl::register_consumer`]).
//! - State words are read with `Acquire` (or `SeqCst`) before the fields their writer set before a `Release`
//!   store of the state (pid, join sequence, reset counters).
//! - Counters only grow, and host-side writers use `fetch_max`, so [`POISON`] is sticky.
//!
//! GPU strategies use the same counters through the offsets of the block's
//! [`RingLayout`](super::layout::RingLayout); the conditions are the ones
//! [`ProducerControl::pending_releases`] and [`ConsumerControl::is_published`] evaluate.

mod block;
mod consumer;
mod producer;
mod wait;

pub use block::{ConsumerActivity, ConsumerRecord, ControlBlock};
pub use consumer::ConsumerControl;
pub use producer::ProducerControl;
pub use wait::{bounded_wait, wait_until};

use std::time::Duration;

use rustix::io::Errno;
use rustix::process::Pid;

use super::error::GoneReason;
use super::layout::{ConsumerId, POISON, SlotIndex};

/// Geometry and identity of a ring, chosen by the producer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RingConfig {
    /// Number of slots N, `1..=MAX_SLOTS` (above 32 the block uses layout version 2). Frame `s` lives in slot `s % N`; the producer runs at most N frames
    /// ahead of the slowest live consumer.
    pub slot_count: u32,
    /// Consumer records in use, `1..=MAX_CONSUMERS`.
    pub max_consumers: u32,
    /// Any value that tells this ring instance from an earlier one (e.g. start time); carried in the header.
    pub generation: u64,
}

/// How peers are judged alive.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LivenessPolicy {
    /// A peer whose heartbeat is older than this is gone. `None` (the default) disables the check: an idle but
    /// healthy producer does not heartbeat. Set it when peers live in different PID namespaces.
    pub heartbeat_timeout: Option<Duration>,
    /// Check peer pids with `kill(pid, 0)`. Only meaningful in one PID namespace (default true).
    pub check_pid: bool,
    /// How often a waiting side checks liveness (and beats its own heartbeat). Default 1 ms.
    pub check_interval: Duration,
}

impl Default for LivenessPolicy {
    fn default() -> Self {
        Self { heartbeat_timeout: None, check_pid: true, check_interval: Duration::from_millis(1) }
    }
}

/// How a CPU-side wait passes time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WaitMode {
    /// Busy-wait with `std::hint::spin_loop`; yields the CPU once per liveness check (about every 1 ms) so an
    /// oversubscribed machine still makes progress.
    Spin,
    /// Sleep this long between checks.
    Sleep(Duration),
}

/// A counter the producer must see reach a value before it may rewrite a slot: exactly what a GPU strategy turns
/// into `cuStreamWaitValue64(stream, base + offset, at_least, CU_STREAM_WAIT_VALUE_GEQ)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReleaseRequirement {
    /// The consumer that has not released yet.
    pub consumer: ConsumerId,
    /// The slot.
    pub slot: SlotIndex,
    /// Byte offset of `released[consumer][slot]` in the control block.
    pub offset: usize,
    /// Value the counter must reach: `(seq - N) + 1`.
    pub at_least: u64,
}

/// Whether a counter holds the poison: bit 62 set (`published` counters keep their last value in the low bits, see
/// [`ConsumerControl::poison_published`]; `released` counters hold exactly [`POISON`]).
pub fn is_poisoned(value: u64) -> bool {
    value & POISON != 0
}

/// `CLOCK_MONOTONIC` in nanoseconds: one clock for every process on the machine, so heartbeats compare across them.
pub fn monotonic_ns() -> u64 {
    let now = rustix::time::clock_gettime(rustix::time::ClockId::Monotonic);
    (now.tv_sec as u64).saturating_mul(1_000_000_000).saturating_add(now.tv_nsec as u64)
}

/// `kill(pid, 0)`: false only when the process certainly does not exist (`ESRCH`). A zombie still counts as alive
/// until its parent reaps it.
pub(super) fn process_exists(raw_pid: u64) -> bool {
    let Some(pid) = i32::try_from(raw_pid).ok().and_then(Pid::from_raw) else {
        // Pid 0 or out of range: unknown, so it cannot be proven gone.
        return true;
    };
    !matches!(rustix::process::test_kill_process(pid), Err(Errno::SRCH))
}

/// Judges a peer from its pid and heartbeat under `policy`.
pub(super) fn peer_gone(policy: &LivenessPolicy, pid: u64, heartbeat_ns: u64) -> Option<GoneReason> {
    if policy.check_pid && !process_exists(pid) {
        return Some(GoneReason::ProcessExited);
    }
    let timeout = policy.heartbeat_timeout?;
    let age = Duration::from_nanos(monotonic_ns().saturating_sub(heartbeat_ns));
    (age > timeout).then_some(GoneReason::HeartbeatStale { age })
}
