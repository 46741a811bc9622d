//! The compiled kernel images embedded in the crate, and the rule that picks one for a device.
//!
//! `scripts/gen-kernels.sh` compiles `kernels/cuda/*.cu` with the pinned NVRTC into `kernels/generated/`: one
//! cubin per architecture in [`IMAGES`] and one PTX for `compute_75`, described by [`MANIFEST`]. At run time
//! [`select_image`] takes the exact cubin for the device, else the closest cubin of the same major version with a
//! lower minor, else the PTX, which the driver compiles for the device when the module is loaded.

use std::fmt;

/// The manifest written next to the images: toolchain, exact flags, and sha256 of every source and image.
pub const MANIFEST: &str = include_str!("../generated/manifest.json");

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

/// One embedded image, ready to pass to `cuModuleLoadData` / `cuModuleLoadDataEx`.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct KernelImage {
    /// The architecture it was compiled for (`sm_86` is 8.6; `compute_75` is 7.5).
    pub arch: ComputeCapability,
    /// Cubin or PTX.
    pub kind: ImageKind,
    /// Its file name in `kernels/generated/` and in the manifest, e.g. `sm_86.cubin`.
    pub file: &'static str,
    /// The image itself. A PTX image ends with a NUL byte (not in the file) because the driver reads PTX as a
    /// C string; a cubin is the file unchanged.
    pub bytes: &'static [u8],
}

impl KernelImage {
    /// The architecture in compiler spelling: `sm_86` for a cubin, `compute_75` for PTX.
    pub fn arch_name(&self) -> String {
        let prefix = match self.kind {
            ImageKind::Cubin => "sm",
            ImageKind::Ptx => "compute",
        };
        format!("{prefix}_{}{}", self.arch.major, self.arch.minor)
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

const fn cubin(major: u32, minor: u32, file: &'static str, bytes: &'static [u8]) -> KernelImage {
    KernelImage { arch: ComputeCapability::new(major, minor), kind: ImageKind::Cubin, file, bytes }
}

/// Every embedded image: the cubins in ascending architecture order, then the PTX (the last resort).
pub static IMAGES: [KernelImage; 8] = [
    cubin(7, 5, "sm_75.cubin", include_bytes!("../generated/sm_75.cubin")),
    cubin(8, 0, "sm_80.cubin", include_bytes!("../generated/sm_80.cubin")),
    cubin(8, 6, "sm_86.cubin", include_bytes!("../generated/sm_86.cubin")),
    cubin(8, 9, "sm_89.cubin", include_bytes!("../generated/sm_89.cubin")),
    cubin(9, 0, "sm_90.cubin", include_bytes!("../generated/sm_90.cubin")),
    cubin(10, 0, "sm_100.cubin", include_bytes!("../generated/sm_100.cubin")),
    cubin(12, 0, "sm_120.cubin", include_bytes!("../generated/sm_120.cubin")),
    KernelImage {
        arch: ComputeCapability::new(7, 5),
        kind: ImageKind::Ptx,
        file: "compute_75.ptx",
        bytes: concat!(include_str!("../generated/compute_75.ptx"), "\0").as_bytes(),
    },
];

/// No embedded image can run on the device.
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
    /// The images the crate ships (all of [`IMAGES`]).
    pub shipped: &'static [KernelImage],
}

fn shipped_list(images: &[KernelImage]) -> String {
    let names: Vec<&str> = images.iter().map(|image| image.file).collect();
    names.join(", ")
}

/// Picks the embedded image to load on a device of capability `device`.
///
/// The rule, in order: the cubin compiled for exactly `device`; else the cubin of the same major version with the
/// highest minor not above the device's (8.7 takes `sm_86`, 10.3 takes `sm_100`, 12.1 takes `sm_120`); else the
/// PTX, if the device is at least 7.5 (a newer major, e.g. 11.0 or 13.0). With `force_ptx` the cubins are skipped,
/// so a test can exercise the driver's PTX compilation on any device (see [`force_ptx_from_env`]).
///
/// # Errors
/// [`NoImageForDevice`] when the device is older than 7.5, for which nothing is compiled.
pub fn select_image(device: ComputeCapability, force_ptx: bool) -> Result<&'static KernelImage, NoImageForDevice> {
    let describe = |image: &KernelImage| ((image.arch.major, image.arch.minor), image.kind == ImageKind::Cubin);
    ipc_core::driver::pick_image(&IMAGES, (device.major, device.minor), force_ptx, describe).ok_or(NoImageForDevice {
        device,
        ptx_forced: force_ptx,
        shipped: &IMAGES,
    })
}

/// The environment variable that forces the PTX image: set to `1` to skip the cubins.
pub const FORCE_PTX_ENV: &str = "GPU_IPC_FORCE_PTX";

/// Whether [`FORCE_PTX_ENV`] asks for the PTX image: true only when it is exactly `1`.
pub fn force_ptx_from_env() -> bool {
    let forced = forces_ptx(std::env::var_os(FORCE_PTX_ENV).as_deref());
    if forced {
        tracing::info!("{FORCE_PTX_ENV}=1: loading the PTX kernel image instead of a cubin");
    }
    forced
}

fn forces_ptx(value: Option<&std::ffi::OsStr>) -> bool {
    value.is_some_and(|value| value == "1")
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    fn pick(major: u32, minor: u32) -> &'static str {
        select_image(ComputeCapability::new(major, minor), false).unwrap().file
    }

    #[test]
    fn exact_cubin_wins() {
        for (major, minor, file) in [
            (7, 5, "sm_75.cubin"),
            (8, 0, "sm_80.cubin"),
            (8, 6, "sm_86.cubin"),
            (8, 9, "sm_89.cubin"),
            (9, 0, "sm_90.cubin"),
            (10, 0, "sm_100.cubin"),
            (12, 0, "sm_120.cubin"),
        ] {
            assert_eq!(pick(major, minor), file, "device {major}.{minor}");
        }
    }

    #[test]
    fn closest_lower_minor_of_same_major() {
        assert_eq!(pick(7, 7), "sm_75.cubin");
        assert_eq!(pick(8, 7), "sm_86.cubin");
        assert_eq!(pick(8, 8), "sm_86.cubin");
        assert_eq!(pick(9, 9), "sm_90.cubin");
        assert_eq!(pick(10, 3), "sm_100.cubin");
        assert_eq!(pick(12, 1), "sm_120.cubin");
    }

    #[test]
    fn ptx_when_no_cubin_of_that_major_fits() {
        assert_eq!(pick(11, 0), "compute_75.ptx");
        assert_eq!(pick(13, 0), "compute_75.ptx");
        assert_eq!(pick(99, 9), "compute_75.ptx");
    }

    #[test]
    fn forced_ptx_skips_cubins() {
        for (major, minor) in [(7, 5), (8, 6), (9, 0), (12, 1)] {
            let image = select_image(ComputeCapability::new(major, minor), true).unwrap();
            assert_eq!(image.kind, ImageKind::Ptx);
            assert_eq!(image.file, "compute_75.ptx");
        }
    }

    #[test]
    fn older_than_7_5_is_a_typed_error() {
        for (major, minor) in [(7, 0), (7, 2), (7, 4), (6, 1), (5, 0), (0, 0)] {
            let device = ComputeCapability::new(major, minor);
            let err = select_image(device, false).unwrap_err();
            assert_eq!(err.device, device);
            assert!(!err.ptx_forced);
            assert_eq!(err.shipped.len(), IMAGES.len());
            let message = err.to_string();
            assert!(message.contains(&format!("compute capability {major}.{minor}:")), "{message}");
            assert!(message.contains("sm_75.cubin, sm_80.cubin"), "{message}");
            assert!(message.contains("compute_75.ptx"), "{message}");
        }
        let err = select_image(ComputeCapability::new(7, 0), true).unwrap_err();
        assert!(err.ptx_forced);
        assert!(err.to_string().contains("unset GPU_IPC_FORCE_PTX"), "{err}");
    }

    #[test]
    fn only_exactly_1_forces_ptx() {
        use std::ffi::OsStr;
        assert!(forces_ptx(Some(OsStr::new("1"))));
        for value in ["", "0", "true", "yes", " 1", "11"] {
            assert!(!forces_ptx(Some(OsStr::new(value))), "{value:?}");
        }
        assert!(!forces_ptx(None));
    }

    #[test]
    fn arch_names_follow_compiler_spelling() {
        let names: Vec<String> = IMAGES.iter().map(KernelImage::arch_name).collect();
        assert_eq!(names, ["sm_75", "sm_80", "sm_86", "sm_89", "sm_90", "sm_100", "sm_120", "compute_75"]);
        for image in &IMAGES {
            let stem = image.file.split('.').next().unwrap();
            assert_eq!(stem, image.arch_name());
        }
    }

    #[test]
    fn manifest_lists_exactly_the_embedded_images() {
        let manifest: serde_json::Value = serde_json::from_str(MANIFEST).unwrap();
        let listed = manifest["images"].as_array().unwrap();
        assert_eq!(listed.len(), IMAGES.len());
        for (entry, image) in listed.iter().zip(&IMAGES) {
            assert_eq!(entry["file"], image.file);
            assert_eq!(entry["arch"], image.arch_name());
            let kind = match image.kind {
                ImageKind::Cubin => "cubin",
                ImageKind::Ptx => "ptx",
            };
            assert_eq!(entry["kind"], kind);
            // The embedded PTX carries one NUL byte more than the file.
            let file_len = match image.kind {
                ImageKind::Cubin => image.bytes.len(),
                ImageKind::Ptx => image.bytes.len() - 1,
            };
            assert_eq!(entry["size"].as_u64().unwrap(), file_len as u64, "{image}");
            let flags = entry["flags"].as_array().unwrap();
            assert_eq!(flags[0], format!("--gpu-architecture={}", image.arch_name()));
        }
        assert_eq!(manifest["toolchain"]["package"], "nvidia-cuda-nvrtc-cu12==12.9.86");
    }

    /// The CUDA ELF header names the architecture in `e_flags`: in its low byte for ELF ABI version 7 (up to
    /// sm_90 here), in its second byte for version 8 (sm_100 and later), as NVRTC 12.9 writes them.
    #[test]
    fn cubins_are_cuda_elf_for_their_architecture() {
        for image in IMAGES.iter().filter(|image| image.kind == ImageKind::Cubin) {
            let b = image.bytes;
            assert_eq!(&b[..4], b"\x7fELF", "{image}");
            assert_eq!(u16::from_le_bytes([b[18], b[19]]), 190, "{image}: EM_CUDA");
            let flags = u32::from_le_bytes([b[48], b[49], b[50], b[51]]);
            let sm = match b[8] {
                7 => flags & 0xff,
                8 => (flags >> 8) & 0xff,
                other => panic!("{image}: unknown CUDA ELF ABI version {other}"),
            };
            assert_eq!(sm, image.arch.major * 10 + image.arch.minor, "{image}");
        }
    }

    #[test]
    fn ptx_declares_its_target_and_both_entries() {
        let image = IMAGES.iter().find(|i| i.kind == ImageKind::Ptx).unwrap();
        assert_eq!(image.bytes.last(), Some(&0));
        let text = std::str::from_utf8(&image.bytes[..image.bytes.len() - 1]).unwrap();
        assert!(text.contains("\n.version 8.8\n"), "NVRTC 12.9 writes PTX ISA 8.8");
        assert!(text.contains("\n.target sm_75\n"));
        for kernel in [crate::FILL_PATTERN, crate::VERIFY_PATTERN] {
            assert!(text.contains(&format!(".entry {kernel}(")), "{kernel}");
        }
    }
}
