//! Core of gpu-ipc: the CUDA driver layer, the backend trait, the wire protocol, the front door's admission, the
//! frame ring and its sync strategies. The toolkit's other shared objects (pool, semaphore, work queue) stand on it in
//! `ipc-toolkit`. See `docs/layout.md` for the layering; only [`driver`] and [`sys`] (the OS shared-memory owner) contain `unsafe` code.

pub mod backend;
pub mod door;
#[allow(unsafe_code)]
pub mod driver;
pub mod fake;
pub mod frames;
pub mod ring;
#[allow(unsafe_code)]
pub mod sys;
pub mod wire;
