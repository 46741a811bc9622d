//! Compiled kernel images and the one rule that picks the image a device loads (docs/kernels.md).
//!
//! `scripts/gen-kernels.sh` compiles the project's CUDA sources with the pinned NVRTC into one tree,
//! `kernels/images/`, a folder per program (`kernels/`: the gpu-ipc-kernels crate's; `ring/`: the ring's own,
//! which ipc-core embeds; `queue/`: the work queue's, which ipc-toolkit embeds), each holding one cubin per
//! architecture of [`ARCHITECTURES`], one PTX for `compute_75` and a `manifest.json`. A crate embeds its program's
//! folder with the one table, [`kernel_images!`](crate::kernel_images), as a `static` [`KernelImages`].
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

/// The architectures every program is compiled for, in the order of [`KernelImages::images`]: one cubin for each
/// `sm_XY` (major, minor), then one PTX for the first, the last resort (`scripts/gen_kernels.py`'s `CUBIN_ARCHS` and
/// `PTX_ARCH`, which [`KernelImages::check_manifest`] holds them to).
pub const ARCHITECTURES: [(u32, u32); 7] = [(7, 5), (8, 0), (8, 6), (8, 9), (9, 0), (10, 0), (12, 0)];

/// Images of one program: a cubin per entry of [`ARCHITECTURES`], then the PTX.
pub const IMAGES_PER_PROGRAM: usize = ARCHITECTURES.len() + 1;

/// One program's compiled images as a crate embeds them, from its folder of `kernels/images/`
/// ([`kernel_images!`](crate::kernel_images)).
#[derive(Debug)]
pub struct KernelImages {
    /// The folder it was embedded from, relative to the embedding crate (for messages).
    pub folder: &'static str,
    /// The cubins in the order of [`ARCHITECTURES`], then the PTX.
    pub images: [KernelImage; IMAGES_PER_PROGRAM],
    /// The folder's `manifest.json`: toolchain, flags, the sha256 of every source and image, the kernels.
    pub manifest: &'static str,
}

impl KernelImages {
    /// Picks the image to load on a device of capability `device`: [`select_image`] over [`KernelImages::images`].
    ///
    /// # Errors
    /// [`NoImageForDevice`] when the device is older than 7.5, for which nothing is compiled.
    pub fn select(
        &'static self,
        device: ComputeCapability,
        force_ptx: bool,
    ) -> Result<&'static KernelImage, NoImageForDevice> {
        select_image(&self.images, device, force_ptx)
    }

    /// The PTX image (the last one), as text without its NUL.
    pub fn ptx_text(&self) -> &'static str {
        let bytes = self.images[IMAGES_PER_PROGRAM - 1].bytes;
        std::str::from_utf8(&bytes[..bytes.len().saturating_sub(1)]).unwrap_or("")
    }

    /// Whether the manifest lists the program's kernel `name` (read from the PTX when it was generated).
    pub fn lists_kernel(&self, name: &str) -> bool {
        self.manifest.contains(&format!("\"{name}\""))
    }

    /// Checks the embedded images against the manifest generated beside them (each crate's tests call it): every
    /// image listed under its file name with its size and architecture, in the order of [`ARCHITECTURES`], the PTX
    /// last and NUL-terminated, every cubin a CUDA ELF file.
    ///
    /// # Errors
    /// What differs, in words.
    pub fn check_manifest(&self) -> Result<(), String> {
        let folder = self.folder;
        for (i, image) in self.images.iter().enumerate() {
            let (kind, (major, minor)) = match ARCHITECTURES.get(i) {
                Some(&arch) => (ImageKind::Cubin, arch),
                None => (ImageKind::Ptx, ARCHITECTURES[0]),
            };
            if image.kind != kind || image.arch != ComputeCapability::new(major, minor) {
                return Err(format!(
                    "{folder}: image {i} is {} ({:?}), not {kind:?} {major}.{minor}",
                    image.file, image.kind
                ));
            }
            let entry = format!("\"file\": \"{}\",", image.file);
            let at =
                self.manifest.find(&entry).ok_or_else(|| format!("{folder}: {} is not in the manifest", image.file))?;
            let rest = &self.manifest[at..];
            let size = image.file_len();
            if !rest.contains(&format!("\"size\": {size},"))
                || !rest.contains(&format!("\"arch\": \"{}\",", image.arch_name()))
            {
                return Err(format!(
                    "{folder}: {} is not listed with its size {size} and arch {}",
                    image.file,
                    image.arch_name()
                ));
            }
            let well_formed = match image.kind {
                ImageKind::Cubin => image.bytes.starts_with(b"\x7fELF"),
                ImageKind::Ptx => image.bytes.last() == Some(&0),
            };
            if !well_formed {
                return Err(format!("{folder}: {} is not a CUDA ELF cubin or a NUL-terminated PTX", image.file));
            }
        }
        Ok(())
    }
}

/// The one table of a program's images: `kernel_images!("../kernels/images/ring")` embeds the folder (relative to
/// the calling crate's `Cargo.toml`) as a [`KernelImages`], a cubin per entry of [`ARCHITECTURES`] then the PTX
/// (NUL-terminated, as the driver reads PTX).
///
/// ```ignore
/// static RING: gpu_ipc_driver::image::KernelImages = gpu_ipc_driver::kernel_images!("../kernels/images/ring");
/// ```
#[macro_export]
macro_rules! kernel_images {
    ($folder:literal) => {
        $crate::image::KernelImages {
            folder: $folder,
            images: [
                $crate::kernel_images!(@cubin $folder, 7, 5, "sm_75.cubin"),
                $crate::kernel_images!(@cubin $folder, 8, 0, "sm_80.cubin"),
                $crate::kernel_images!(@cubin $folder, 8, 6, "sm_86.cubin"),
                $crate::kernel_images!(@cubin $folder, 8, 9, "sm_89.cubin"),
                $crate::kernel_images!(@cubin $folder, 9, 0, "sm_90.cubin"),
                $crate::kernel_images!(@cubin $folder, 10, 0, "sm_100.cubin"),
                $crate::kernel_images!(@cubin $folder, 12, 0, "sm_120.cubin"),
                $crate::image::KernelImage::ptx(
                    7,
                    5,
                    "compute_75.ptx",
                    concat!(include_str!(concat!(env!("CARGO_MANIFEST_DIR"), "/", $folder, "/compute_75.ptx")), "\0")
                        .as_bytes(),
                ),
            ],
            manifest: include_str!(concat!(env!("CARGO_MANIFEST_DIR"), "/", $folder, "/manifest.json")),
        }
    };
    (@cubin $folder:literal, $major:literal, $minor:literal, $file:literal) => {
        $crate::image::KernelImage::cubin(
            $major,
            $minor,
            $file,
            include_bytes!(concat!(env!("CARGO_MANIFEST_DIR"), "/", $folder, "/", $file)),
        )
    };
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn the_table_names_every_architecture_in_order() {
        // The macro's rows are written out (include_bytes! needs literals): they must be ARCHITECTURES, in order.
        let source = include_str!("image.rs");
        let rows: Vec<(u32, u32)> = source
            .lines()
            .filter_map(|line| line.trim().strip_prefix("$crate::kernel_images!(@cubin $folder, "))
            .map(|rest| {
                let mut parts = rest.split(',').map(|p| p.trim().parse::<u32>());
                (parts.next().unwrap().unwrap(), parts.next().unwrap().unwrap())
            })
            .collect();
        assert_eq!(rows, ARCHITECTURES);
        assert!(source.contains("$crate::kernel_images!(@cubin $folder, 12, 0, \"sm_120.cubin\")"));
    }

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
