//! The front door every shared object is reached through: a Unix socket whose owner admits peers with a bounded,
//! hardened handshake (`admission`: hello, offer with fds, `Attached`), the same for a frame ring and for the
//! toolkit's other objects ([`ObjectDoor`]: pool, semaphore, work queue), and the client side of that handshake
//! ([`attach`]). A peer's liveness follows its connection: a hang-up after `Attached` means it is gone.

pub(crate) mod admission;
mod object;

pub use crate::wire::{ObjectKind, ObjectOffer, PeerState, PeerStatus, StatusReport};
pub use object::{DoorConfig, DoorError, ObjectDoor, ObjectHost, OwnerLink, PeerInfo, WATCH_INTERVAL, attach, status};
