//! Compiled kernel images and the one rule that picks the image a device loads (docs/kernels.md).
//!
//! `scripts/gen-kernels.sh` compiles the project's CUDA sources with the pinned NVRTC into one cubin per
//! architecture and one PTX for `compute_75`; each crate that ships kernels embeds its set as a `static` array of
//! [`KernelImage`] (the kernels crate: `kernels/generated/`; the ring's `GpuPoll` kernels: `ipc-core/ring-kernels/`).
//! At run time [`select_image`] takes the exact cubin for the device, else the closest cubin of the same major
//! version with a lower minor, else the PTX, which the driver compiles for the device when the module is loaded.
//! [`force_ptx_from_env`] reads the one switch (`GPU_IPC_FORCE_PTX=1`) that skips the cubins for every image set.

use std::ffi::OsStr;
use std::fmt;

/// The compute capability of a device (`CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR` / `_MINOR`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ComputeCapability {
    /// Major version, e.g. 9 for an H100.
    pub major: u32,
    /// Minor version, e.g. 0 for an H100.
    pub minor: u32,
}

impl ComputeCapability {
    /// The capability `major.minor`.
    pub const fn new(major: u32, minor: u32) -> Self {
        Self { major, minor }
    }
}

impl fmt::Display for ComputeCapability {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}", self.major, self.minor)
    }
}

/// What an image holds, which decides how the driver loads it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ImageKind {
    /// Machine code for one architecture (`sm_XY`); runs on devices of the same major version and a minor >= Y.
    Cubin,
    /// PTX for a virtual architecture (`compute_XY`); the driver compiles it when loading, for any device of
    /// capability >= X.Y, provided the driver knows the PTX ISA version it declares.
    Ptx,
}

/// One embedded image, ready to pass to `cuModuleLoadData` / `cuModuleLoadDataEx` ([`Module::load`]).
///
/// [`Module::load`]: super::Module::load
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct KernelImage {
    /// The architecture it was compiled for (`sm_86` is 8.6; `compute_75` is 7.5).
    pub arch: ComputeCapability,
    /// Cubin or PTX.
    pub kind: ImageKind,
    /// Its file name in the folder it was generated into and in that folder's manifest, e.g. `sm_86.cubin`.
    pub file: &'static str,
    /// The image itself. A PTX image ends with a NUL byte (not in the file) because the driver reads PTX as a
    /// C string; a cubin is the file unchanged.
    pub bytes: &'static [u8],
}

impl KernelImage {
    /// A cubin for `sm_<major><minor>`, the file's bytes unchanged.
    pub const fn cubin(major: u32, minor: u32, file: &'static str, bytes: &'static [u8]) -> Self {
        Self { arch: ComputeCapability::new(major, minor), kind: ImageKind::Cubin, file, bytes }
    }

    /// A PTX for `compute_<major><minor>`; `bytes` must end with the NUL the driver needs (embed it with
    /// `concat!(include_str!(...), "\0").as_bytes()`).
    pub const fn ptx(major: u32, minor: u32, file: &'static str, bytes: &'static [u8]) -> Self {
        Self { arch: ComputeCapability::new(major, minor), kind: ImageKind::Ptx, file, bytes }
    }

    /// The architecture in compiler spelling: `sm_86` for a cubin, `compute_75` for PTX.
    pub fn arch_name(&self) -> String {
        let prefix = match self.kind {
            ImageKind::Cubin => "sm",
            ImageKind::Ptx => "compute",
        };
        format!("{prefix}_{}{}", self.arch.major, self.arch.minor)
    }

    /// The size of the file it was embedded from: a PTX image carries one NUL byte more than its file.
    pub fn file_len(&self) -> usize {
        match self.kind {
            ImageKind::Cubin => self.bytes.len(),
            ImageKind::Ptx => self.bytes.len().saturating_sub(1),
        }
    }
}

impl fmt::Display for KernelImage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.file)
    }
}

// The bytes are left out on purpose: an error or a log line that prints an image wants its name, not 10 KiB.
impl fmt::Debug for KernelImage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KernelImage")
            .field("arch", &self.arch)
            .field("kind", &self.kind)
            .field("file", &self.file)
            .field("len", &self.bytes.len())
            .finish()
    }
}

/// No image of a set can run on the device.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "no gpu-ipc kernel image runs on a device of compute capability {device}{forced}: the crate ships {}; \
     the PTX needs compute capability 7.5 or newer, so use such a GPU{hint}",
    shipped_list(shipped),
    forced = if *ptx_forced { " with the PTX forced (GPU_IPC_FORCE_PTX=1)" } else { "" },
    hint = if *ptx_forced { ", or unset GPU_IPC_FORCE_PTX" } else { "" }
)]
pub struct NoImageForDevice {
    /// The capability of the device that was asked for.
    pub device: ComputeCapability,
    /// Whether the cubins were skipped because the PTX was forced.
    pub ptx_forced: bool,
    /// The images the set holds (all of them).
    pub shipped: &'static [KernelImage],
}

fn shipped_list(images: &[KernelImage]) -> String {
    let names: Vec<&str> = images.iter().map(|image| image.file).collect();
    names.join(", ")
}

/// Picks the image of `images` to load on a device of capability `device`: the project's one rule.
///
/// In order: the cubin compiled for exactly `device`; else the cubin of the same major version with the highest
/// minor not above the device's (8.7 takes `sm_86`, 10.3 takes `sm_100`, 12.1 takes `sm_120`); else the first PTX
/// whose architecture is not above the device's (a newer major, e.g. 11.0 or 13.0, takes `compute_75`). With
/// `force_ptx` the cubins are skipped, so a test can exercise the driver's PTX compilation on any device (see
/// [`force_ptx_from_env`]).
///
/// # Errors
/// [`NoImageForDevice`] when no image fits: the device is older than every PTX (7.5 for the shipped sets).
pub fn select_image(
    images: &'static [KernelImage],
    device: ComputeCapability,
    force_ptx: bool,
) -> Result<&'static KernelImage, NoImageForDevice> {
    let cubin = images
        .iter()
        .filter(|image| !force_ptx && image.kind == ImageKind::Cubin)
        .filter(|image| image.arch.major == device.major && image.arch.minor <= device.minor)
        .max_by_key(|image| image.arch.minor);
    cubin
        .or_else(|| images.iter().find(|image| image.kind == ImageKind::Ptx && image.arch <= device))
        .ok_or(NoImageForDevice { device, ptx_forced: force_ptx, shipped: images })
}

/// The environment variable that forces the PTX image of every image set: set to `1` to skip the cubins.
pub const FORCE_PTX_ENV: &str = "GPU_IPC_FORCE_PTX";

/// Whether [`FORCE_PTX_ENV`] asks for the PTX image: true only when it is exactly `1`.
pub fn force_ptx_from_env() -> bool {
    let forced = forces_ptx(std::env::var_os(FORCE_PTX_ENV).as_deref());
    if forced {
        tracing::info!("{FORCE_PTX_ENV}=1: loading the PTX kernel image instead of a cubin");
    }
    forced
}

fn forces_ptx(value: Option<&OsStr>) -> bool {
    value.is_some_and(|value| value == "1")
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    /// A set shaped like the shipped ones (the bytes do not matter to the rule).
    static SET: [KernelImage; 8] = [
        KernelImage::cubin(7, 5, "sm_75.cubin", b""),
        KernelImage::cubin(8, 0, "sm_80.cubin", b""),
        KernelImage::cubin(8, 6, "sm_86.cubin", b""),
        KernelImage::cubin(8, 9, "sm_89.cubin", b""),
        KernelImage::cubin(9, 0, "sm_90.cubin", b""),
        KernelImage::cubin(10, 0, "sm_100.cubin", b""),
        KernelImage::cubin(12, 0, "sm_120.cubin", b""),
        KernelImage::ptx(7, 5, "compute_75.ptx", b"\0"),
    ];

    fn pick(major: u32, minor: u32) -> &'static str {
        select_image(&SET, ComputeCapability::new(major, minor), false).unwrap().file
    }

    #[test]
    fn exact_cubin_wins_else_the_closest_lower_minor_else_the_ptx() {
        for image in SET.iter().filter(|image| image.kind == ImageKind::Cubin) {
            assert_eq!(pick(image.arch.major, image.arch.minor), image.file);
        }
        assert_eq!(pick(7, 7), "sm_75.cubin");
        assert_eq!(pick(8, 7), "sm_86.cubin");
        assert_eq!(pick(8, 8), "sm_86.cubin");
        assert_eq!(pick(10, 3), "sm_100.cubin");
        assert_eq!(pick(12, 1), "sm_120.cubin");
        assert_eq!(pick(11, 0), "compute_75.ptx");
        assert_eq!(pick(99, 9), "compute_75.ptx");
        let forced = select_image(&SET, ComputeCapability::new(9, 0), true).unwrap();
        assert_eq!((forced.kind, forced.file), (ImageKind::Ptx, "compute_75.ptx"));
    }

    #[test]
    fn older_than_the_ptx_is_a_typed_error_naming_the_set() {
        let err = select_image(&SET, ComputeCapability::new(7, 0), false).unwrap_err();
        assert_eq!((err.device, err.ptx_forced, err.shipped.len()), (ComputeCapability::new(7, 0), false, 8));
        assert!(err.to_string().contains("compute capability 7.0: the crate ships sm_75.cubin, sm_80.cubin"), "{err}");
        let err = select_image(&SET, ComputeCapability::new(7, 0), true).unwrap_err();
        assert!(err.ptx_forced && err.to_string().contains("unset GPU_IPC_FORCE_PTX"), "{err}");
    }

    #[test]
    fn only_exactly_1_forces_ptx() {
        assert!(forces_ptx(Some(OsStr::new("1"))));
        for value in ["", "0", "true", "yes", " 1", "11"] {
            assert!(!forces_ptx(Some(OsStr::new(value))), "{value:?}");
        }
        assert!(!forces_ptx(None));
    }

    #[test]
    fn names_and_file_sizes() {
        assert_eq!(SET[2].arch_name(), "sm_86");
        assert_eq!(SET[7].arch_name(), "compute_75");
        assert_eq!((SET[7].file_len(), SET[0].file_len()), (0, 0));
        assert_eq!(SET[2].to_string(), "sm_86.cubin");
    }
}
