//! The ring's own kernels (`kernels/cuda/ring_*.cu`: the gpu-poll strategy's wait and release, the frame graphs'
//! steps), compiled ahead of time by `scripts/gen-kernels.sh` into `ipc-core/ring-kernels/` and embedded here.

use crate::frames::FrameError;
use gpu_ipc_driver::image::{self, ComputeCapability, KernelImage};
use gpu_ipc_driver::{Context, Module};

/// The ring's kernels, from `ipc-core/ring-kernels/` (`scripts/gen-kernels.sh`): the cubins in ascending
/// architecture order, then the PTX (the last resort).
pub(crate) static IMAGES: [KernelImage; 8] = [
    KernelImage::cubin(7, 5, "sm_75.cubin", include_bytes!("../../ring-kernels/sm_75.cubin")),
    KernelImage::cubin(8, 0, "sm_80.cubin", include_bytes!("../../ring-kernels/sm_80.cubin")),
    KernelImage::cubin(8, 6, "sm_86.cubin", include_bytes!("../../ring-kernels/sm_86.cubin")),
    KernelImage::cubin(8, 9, "sm_89.cubin", include_bytes!("../../ring-kernels/sm_89.cubin")),
    KernelImage::cubin(9, 0, "sm_90.cubin", include_bytes!("../../ring-kernels/sm_90.cubin")),
    KernelImage::cubin(10, 0, "sm_100.cubin", include_bytes!("../../ring-kernels/sm_100.cubin")),
    KernelImage::cubin(12, 0, "sm_120.cubin", include_bytes!("../../ring-kernels/sm_120.cubin")),
    KernelImage::ptx(
        7,
        5,
        "compute_75.ptx",
        concat!(include_str!("../../ring-kernels/compute_75.ptx"), "\0").as_bytes(),
    ),
];

/// The image for a device of compute capability `device`, by the one rule ([`image::select_image`], as for the
/// kernels crate); `None` below 7.5.
pub(crate) fn select_image(device: (u32, u32), force_ptx: bool) -> Option<&'static KernelImage> {
    image::select_image(&IMAGES, ComputeCapability::new(device.0, device.1), force_ptx).ok()
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
