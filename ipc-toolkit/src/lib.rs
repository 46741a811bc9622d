//! The toolkit of gpu-ipc: the shared objects beside the frame ring, on the same backends, wire conventions and
//! front door as the ring in `ipc-core`: an IPC memory pool with named buffers ([`pool`]), a cross-process semaphore
//! ([`semaphore`]), a work queue in device memory ([`queue`]) and the door each of them is reached through
//! ([`door`]). It stands on `ipc-core`; nothing in `ipc-core` knows it.

pub mod door;
#[cfg(feature = "fuzzing")]
pub mod fuzzing;
pub mod pool;
pub mod queue;
pub mod semaphore;
mod stream_marks;
#[cfg(test)]
mod test_random;
pub mod weights;
