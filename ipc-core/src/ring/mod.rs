//! The frame ring's host-shared control block (layer 4): layout, state machine and bounded waits.
//!
//! A producer publishes frames into N slots of one exported GPU allocation; consumers read them in place. The
//! synchronisation state lives in a control block in host shared memory (see `docs/ring.md`), whose counters both
//! CPU waits ([`ProducerControl::wait_reusable`], [`ConsumerControl::wait_published`]) and, through their byte
//! offsets, GPU stream memory operations use.

pub mod control;
pub mod error;
pub mod layout;

pub use control::{
    ConsumerActivity, ConsumerControl, ConsumerRecord, ControlBlock, LivenessPolicy, ProducerControl,
    ReleaseRequirement, RingConfig, WaitMode, bounded_wait, is_poisoned, monotonic_ns, wait_until,
};
pub use error::{GoneReason, RingError, WaitTarget};
pub use layout::{ConsumerId, POISON, RingLayout, Sequence, SlotIndex};
