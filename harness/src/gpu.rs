//! The GPU set-up every measuring process makes, written once: a context on one device, the pattern kernels
//! (fill, verify, xor) loaded in it, and a stream to queue them on. The benchmark's producer and consumers, its
//! three-stage rows' middle stage, and the doctor's self-test (both sides) all start from one.

use gpu_ipc::driver::{Context, Stream};
use gpu_ipc::kernels::launch::{KernelError, PatternKernels};

/// A context on one device, the pattern kernels loaded in it, and a stream.
pub struct GpuSetup {
    ctx: Context,
    kernels: PatternKernels,
    stream: Stream,
}

impl GpuSetup {
    /// Opens device `ordinal` (its primary context), loads the pattern kernels, makes a stream.
    ///
    /// # Errors
    /// No such device or a driver error ([`KernelError::Driver`]), or no kernel image the device can run.
    pub fn open(ordinal: i32) -> Result<Self, KernelError> {
        Self::in_context(Context::for_ordinal(ordinal)?)
    }

    /// As [`GpuSetup::open`], in a context the caller has already opened (and checked, e.g. for a backend's
    /// support, before the kernels are loaded).
    ///
    /// # Errors
    /// As [`GpuSetup::open`].
    pub fn in_context(ctx: Context) -> Result<Self, KernelError> {
        let kernels = PatternKernels::load(&ctx)?;
        let stream = Stream::new(&ctx)?;
        Ok(Self { ctx, kernels, stream })
    }

    /// The context.
    pub fn context(&self) -> &Context {
        &self.ctx
    }

    /// The pattern kernels, loaded in [`GpuSetup::context`].
    pub fn kernels(&self) -> &PatternKernels {
        &self.kernels
    }

    /// The stream.
    pub fn stream(&self) -> &Stream {
        &self.stream
    }
}
