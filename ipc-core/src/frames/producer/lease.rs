//! [`SlotLease`]: the right to write one slot and publish it once.

use crate::ring::{Sequence, SlotIndex};
use gpu_ipc_driver::DevicePtr;

/// The right to write one slot and publish it once: frame [`seq`](Self::seq) goes to [`slot`](Self::slot), at
/// [`ptr`](Self::ptr), [`bytes`](Self::bytes) long. [`Producer::publish`](super::Producer::publish) takes it by value, so a lease cannot be
/// published twice:
///
/// ```compile_fail,E0382
/// # use std::time::Duration;
/// # use ipc_core::host::Host;
/// # use ipc_core::frames::{FrameError, Producer};
/// # fn twice(producer: &mut Producer<Host>) -> Result<(), FrameError> {
/// let lease = producer.acquire(None, Duration::from_secs(1))?;
/// producer.publish(lease, None)?;
/// producer.publish(lease, None)?; // error[E0382]: use of moved value: `lease`
/// # Ok(())
/// # }
/// ```
///
/// A lease of another producer (or of an earlier ring at the same path) is refused by `publish` before anything is
/// queued.
#[derive(Debug, PartialEq, Eq)]
#[must_use = "publish the slot, or the ring stalls"]
pub struct SlotLease {
    pub(super) seq: Sequence,
    pub(super) slot: SlotIndex,
    pub(super) ptr: DevicePtr,
    pub(super) bytes: u64,
    /// The producer that made it ([`crate::frames::owner_token`]).
    pub(super) owner: u64,
}

impl SlotLease {
    /// The frame's sequence number (0, 1, 2, ...).
    pub fn seq(&self) -> Sequence {
        self.seq
    }

    /// The slot the frame occupies.
    pub fn slot(&self) -> SlotIndex {
        self.slot
    }

    /// Where to write the frame, in this process's device address space (host address with the host backend).
    /// [`Producer::slot_span`](super::Producer::slot_span) gives the same memory as a bounds-checked span.
    pub fn ptr(&self) -> DevicePtr {
        self.ptr
    }

    /// The frame's size in bytes.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }
}
