//! Core of gpu-ipc: the CUDA driver layer, the backend trait, the wire protocol, the object door, the frame ring and
//! its sync strategies, and the toolkit's other shared objects ([`semaphore`], [`pool`], [`queue`], [`weights`]). See `docs/` for
//! the layering; only [`driver`] and [`sys`] (the OS shared-memory owner) contain `unsafe` code.

pub mod backend;
pub mod door;
#[allow(unsafe_code)]
pub mod driver;
pub mod fake;
pub mod frames;
#[cfg(feature = "fuzzing")]
pub mod fuzzing;
pub mod pool;
pub mod queue;
pub mod ring;
pub mod semaphore;
#[allow(unsafe_code)]
pub mod sys;
pub mod weights;
pub mod wire;
