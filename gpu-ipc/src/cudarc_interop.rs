//! Use gpu-ipc from code built on [cudarc](https://docs.rs/cudarc) 0.19 (feature `cudarc`): the frame API queues
//! its waits and publishes on your cudarc stream, and your cudarc kernels read frames and write slots in place,
//! with no copy and no CPU synchronisation per frame. See `docs/interop.md`.
//!
//! ```no_run
//! use std::time::Duration;
//! use gpu_ipc::core::frames::{AttachOptions, Consumer, FrameError};
//! use gpu_ipc::cudarc_interop::{self as interop, cudarc};
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let cuda = cudarc::driver::CudaContext::new(0)?; // the device's primary context, as gpu-ipc's
//! let ctx = interop::context(&cuda)?;
//! let my_stream = cuda.new_stream()?;
//! let stream = interop::stream(&ctx, &my_stream)?; // the same CUstream, borrowed
//! let path = std::path::Path::new("/tmp/frames.sock");
//! let mut consumer = Consumer::<gpu_ipc::vmm::Vmm>::attach(&ctx, path, &AttachOptions::default())?;
//! loop {
//!     let frame = match consumer.next_frame(Some(&stream), Duration::from_secs(1)) {
//!         Ok(frame) => frame,
//!         Err(FrameError::EndOfStream { .. }) => break,
//!         Err(e) => return Err(e.into()),
//!     };
//!     {
//!         let pixels = interop::frame_slice::<_, u8>(&consumer, &frame, &my_stream)?;
//!         // my_stream.launch_builder(&my_kernel).arg(&pixels.view()).launch(cfg)?;
//!         # let _ = pixels.view();
//!     }
//!     consumer.release(frame, Some(&stream))?; // queued after the kernel, on the same stream
//! }
//! # Ok(())
//! # }
//! ```

use std::sync::Arc;

use cudarc::driver::{CudaStream, DeviceRepr};
use ipc_core::backend::GpuBackend;
use ipc_core::frames::{Consumer, Frame, FrameError, Producer, SlotLease};

/// The cudarc crate gpu-ipc was built against (0.19), so that versions match.
pub use gpu_ipc_driver::cudarc::cudarc;
pub use gpu_ipc_driver::cudarc::{SpanSlice, context, event, stream, to_cudarc_stream};

/// `frame` as a cudarc slice of `T` (for kernel arguments: `.view()`), without a copy. It borrows the consumer
/// and the frame, so it is gone before the frame can be released.
///
/// # Errors
/// A frame that is not of this consumer's ring; a frame size that is not a whole number of `T`s.
pub fn frame_slice<'f, B: GpuBackend, T: DeviceRepr>(
    consumer: &'f Consumer<B>,
    frame: &'f Frame,
    stream: &Arc<CudaStream>,
) -> Result<SpanSlice<'f, T>, FrameError> {
    Ok(SpanSlice::new(consumer.frame_span(frame)?, stream)?)
}

/// The slot of `lease` as a cudarc slice of `T` to write (`.view_mut()`), without a copy. It borrows the
/// producer and the lease, so it is gone before the lease can be published.
///
/// # Errors
/// A lease that is not of this producer's ring; a frame size that is not a whole number of `T`s.
pub fn slot_slice<'f, B: GpuBackend, T: DeviceRepr>(
    producer: &'f Producer<B>,
    lease: &'f SlotLease,
    stream: &Arc<CudaStream>,
) -> Result<SpanSlice<'f, T>, FrameError> {
    Ok(SpanSlice::new(producer.slot_span(lease)?, stream)?)
}
