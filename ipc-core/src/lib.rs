//! Core of gpu-ipc: the CUDA driver layer, the backend trait, the wire protocol, the frame ring and its sync
//! strategies. See `docs/` and ARCHITECTURE for the layering; only [`driver`] contains `unsafe` code.

pub mod backend;
#[allow(unsafe_code)]
pub mod driver;
