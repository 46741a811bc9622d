//! OS-level code that needs `unsafe`: shared-memory mappings.
//!
//! Everything above this module is safe Rust. The only pointer casts the ring needs (a mapping viewed as a
//! `#[repr(C)]` struct of atomics) are made here, once, behind [`shm::AtomicPlainData`].

pub mod shm;
