//! Host shared memory: a sealed `memfd` mapped `MAP_SHARED` into every process that holds its fd.
//!
//! The ring's control block lives in such a mapping so that producer and consumers (and later, through
//! `cuMemHostRegister`, their GPU streams) read and write the very same 64-bit counters. The fd travels to peers
//! over the rendezvous socket with `SCM_RIGHTS`; each peer rebuilds a [`SharedMemory`] with
//! [`SharedMemory::from_fd`].
//!
//! With the wire layer's `SO_PEERCRED` read, this is the only code of ipc-core that needs `unsafe`: the only pointer
//! casts the ring needs (a mapping viewed as a `#[repr(C)]` struct of atomics) are made here, once, behind
//! [`AtomicPlainData`].
//!
//! One file a part: [`SharedMemory`] (one memfd, mapped read-write; `memory.rs`), memfds side by side in one range
//! (`side_by_side.rs`), [`ReadOnlyMemory`] (`read_only.rs`), the typed view [`SharedObject`] (`object.rs`), and
//! [`ShmError`] (`error.rs`).

mod error;
mod memory;
mod object;
mod read_only;
mod side_by_side;
#[cfg(test)]
mod tests;

pub use error::ShmError;
pub use memory::SharedMemory;
pub use object::{AtomicPlainData, SharedObject};
pub use read_only::ReadOnlyMemory;
