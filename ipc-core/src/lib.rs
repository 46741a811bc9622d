//! Core of gpu-ipc: the backend trait, the wire protocol, the front door's admission, the frame ring and its sync
//! strategies, and the GPU-resident path on that ring ([`resident`]: kernels launched on the ring, frame graphs), on
//! the CUDA driver layer of `gpu-ipc-driver`. The toolkit's other shared objects (pool, semaphore,
//! work queue, weights) stand on it in `ipc-toolkit`. See `docs/layout.md` for the layering; only [`shm`] (the OS
//! shared-memory owner) and the wire layer's `SO_PEERCRED` read contain `unsafe` code here.

pub mod backend;
pub mod door;
pub mod host;
/// The host backend's module before it was [`host`].
#[doc(hidden)]
pub use host as fake;
pub mod frames;
pub mod resident;
pub mod ring;
#[allow(unsafe_code)]
pub mod shm;
pub mod wire;
