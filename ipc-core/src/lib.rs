//! Core of gpu-ipc: the CUDA driver layer, the backend trait, the wire protocol, the frame ring and its sync
//! strategies. See `docs/` for the layering; only [`driver`] (and the OS shared-memory owner) contain `unsafe`.

pub mod backend;
#[allow(unsafe_code)]
pub mod driver;
pub mod wire;
