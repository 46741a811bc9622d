//! The front door every shared object is reached through: a Unix socket whose owner admits peers with a bounded,
//! hardened handshake ([`admission`]: hello, offer with fds, `Attached`), used by a frame ring's producer and by the
//! toolkit's object door (`ipc_toolkit::door`). A peer's liveness follows its connection: a hang-up after
//! `Attached` means it is gone.

pub mod admission;

pub use crate::wire::{ObjectKind, ObjectOffer, PeerState, PeerStatus, StatusReport};
