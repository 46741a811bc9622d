//! The compiled kernel images embedded in the crate.
//!
//! `scripts/gen-kernels.sh` compiles `kernels/cuda/*.cu` with the pinned NVRTC into one tree, `kernels/images/`, a
//! folder per program; this crate's program (every source but the ring's `ring_*.cu` and the work queue's
//! `queue_*.cu`) is `kernels/images/kernels/`: one cubin per architecture and one PTX for `compute_75`, described by
//! [`MANIFEST`], embedded by the one table ([`gpu_ipc_driver::kernel_images!`]) as [`PROGRAM`]. The image types and
//! the rule that picks one for a device live in the driver layer ([`gpu_ipc_driver::image`], shared with the ring's
//! and the work queue's kernels) and are re-exported here; [`select_image`] applies that rule to [`IMAGES`].

pub use gpu_ipc_driver::image::{
    ComputeCapability, FORCE_PTX_ENV, ImageKind, KernelImage, KernelImages, NoImageForDevice, force_ptx_from_env,
};

/// This crate's program, from `kernels/images/kernels/`.
pub static PROGRAM: KernelImages = gpu_ipc_driver::kernel_images!("images/kernels");

/// Every embedded image: the cubins in ascending architecture order, then the PTX (the last resort).
pub static IMAGES: &[KernelImage; gpu_ipc_driver::image::IMAGES_PER_PROGRAM] = &PROGRAM.images;

/// The manifest written next to the images: toolchain, exact flags, and sha256 of every source and image.
pub static MANIFEST: &str = PROGRAM.manifest;

/// Picks the embedded image to load on a device of capability `device`: [`KernelImages::select`] over [`PROGRAM`] (exact cubin, else the closest lower minor of the same major, else the PTX; only the PTX with
/// `force_ptx`, see [`force_ptx_from_env`]).
///
/// # Errors
/// [`NoImageForDevice`] when the device is older than 7.5, for which nothing is compiled.
pub fn select_image(device: ComputeCapability, force_ptx: bool) -> Result<&'static KernelImage, NoImageForDevice> {
    PROGRAM.select(device, force_ptx)
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
    fn arch_names_follow_compiler_spelling() {
        let names: Vec<String> = IMAGES.iter().map(KernelImage::arch_name).collect();
        assert_eq!(names, ["sm_75", "sm_80", "sm_86", "sm_89", "sm_90", "sm_100", "sm_120", "compute_75"]);
        for image in IMAGES.iter() {
            let stem = image.file.split('.').next().unwrap();
            assert_eq!(stem, image.arch_name());
        }
    }

    #[test]
    fn manifest_lists_exactly_the_embedded_images() {
        assert_eq!(PROGRAM.check_manifest(), Ok(()));
        let manifest: serde_json::Value = serde_json::from_str(MANIFEST).unwrap();
        let listed = manifest["images"].as_array().unwrap();
        assert_eq!(listed.len(), IMAGES.len());
        for (entry, image) in listed.iter().zip(IMAGES.iter()) {
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
    fn ptx_declares_its_target_and_every_frame_kernel() {
        let image = IMAGES.iter().find(|i| i.kind == ImageKind::Ptx).unwrap();
        assert_eq!(image.bytes.last(), Some(&0));
        let text = std::str::from_utf8(&image.bytes[..image.bytes.len() - 1]).unwrap();
        assert!(text.contains("\n.version 8.8\n"), "NVRTC 12.9 writes PTX ISA 8.8");
        assert!(text.contains("\n.target sm_75\n"));
        for kernel in crate::KERNELS {
            assert!(text.contains(&format!(".entry {kernel}(")), "{kernel}");
        }
    }
}
