//! The front door of a toolkit object ([`ObjectDoor`]: pool, semaphore, work queue) on the ring's hardened
//! admission (`ipc_core::door`), and the client side of that handshake ([`attach`], [`status`]). A peer's liveness
//! follows its connection: a hang-up after `Attached` means it is gone.

mod object;

pub use ipc_core::wire::{ObjectKind, ObjectOffer, PeerState, PeerStatus, StatusReport};
pub use object::{
    DoorConfig, DoorError, ObjectDoor, ObjectHost, OwnerLink, PeerInfo, WATCH_INTERVAL, attach, attach_part, status,
};
