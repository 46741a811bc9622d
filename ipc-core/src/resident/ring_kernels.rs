//! The ring's own kernels (`kernels/cuda/ring_*.cu`: the gpu-poll strategy's wait and release, the frame graphs'
//! steps), compiled ahead of time by `scripts/gen-kernels.sh` into `kernels/images/ring/` and embedded here.

use crate::frames::FrameError;
use gpu_ipc_driver::image::{self, ComputeCapability, KernelImage, KernelImages};
use gpu_ipc_driver::{Context, Module};

/// The ring's kernels, from `kernels/images/ring/` (`scripts/gen-kernels.sh`).
pub(crate) static IMAGES: KernelImages = gpu_ipc_driver::kernel_images!("../kernels/images/ring");

/// The image for a device of compute capability `device`, by the one rule ([`image::select_image`], as for the
/// kernels crate); `None` below 7.5.
pub(crate) fn select_image(device: (u32, u32), force_ptx: bool) -> Option<&'static KernelImage> {
    IMAGES.select(ComputeCapability::new(device.0, device.1), force_ptx).ok()
}

/// Loads the ring's kernels in `cuda`: the gpu-poll strategy's and the frame graphs' steps. `what` names the user
/// in the error (`"gpu-poll"`, `"frame graphs"`).
///
/// # Errors
/// [`FrameError::Config`] when no image suits the device or the driver refuses it.
pub(crate) fn ring_module(cuda: &Context, what: &str) -> Result<Module, FrameError> {
    let (major, minor) = cuda.device().compute_capability()?;
    let image = select_image((major, minor), image::force_ptx_from_env()).ok_or_else(|| {
        FrameError::Config(format!(
            "{what}: no kernel image for compute capability {major}.{minor} (the ring's kernels need 7.5 or newer)"
        ))
    })?;
    Module::load(cuda, image.bytes).map_err(|e| {
        FrameError::Config(format!(
            "{what}: loading the ring's kernels ({}) failed: {e}; update the driver",
            image.file
        ))
    })
}
