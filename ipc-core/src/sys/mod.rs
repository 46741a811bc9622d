//! OS-level code that needs `unsafe`: shared-memory mappings, and the one socket option rustix cannot read
//! soundly (`SO_PEERCRED` of a peer in another PID namespace).
//!
//! Everything above this module is safe Rust. The only pointer casts the ring needs (a mapping viewed as a
//! `#[repr(C)]` struct of atomics) are made here, once, behind [`shm::AtomicPlainData`].

pub mod peercred;
pub mod shm;
