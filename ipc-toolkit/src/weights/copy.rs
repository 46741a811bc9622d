//! Copying many tensors at once on a GPU: [`TensorCopier`] loads the gather kernel (`kernels/cuda/weights_gather.cu`,
//! images in `kernels/images/weights/`, `scripts/gen-kernels.sh`) and copies a whole state_dict into a staged
//! arena ([`StagedGeneration::copy_in`](super::StagedGeneration::copy_in)) or out of a held one
//! ([`HeldGeneration::copy_out`](super::HeldGeneration::copy_out)) with a few launches, at the bandwidth of one
//! memcpy, instead of one `cuMemcpyAsync` per tensor.

use super::error::WeightsError;
use crate::pool::PoolError;
use gpu_ipc_driver::image::{self, ComputeCapability, KernelImages};
use gpu_ipc_driver::{Context, DeviceSpan, GATHER_KERNEL, GatherCopy, Module, Stream};

/// The gather kernel, from `kernels/images/weights/` (`scripts/gen-kernels.sh`).
static IMAGES: KernelImages = gpu_ipc_driver::kernel_images!("../kernels/images/weights");

/// Copies many tensors between device spans in one process: one per owner or reader, reused for every update
/// (it owns a small device table and the loaded kernel).
#[derive(Debug)]
pub struct TensorCopier {
    gather: GatherCopy,
}

impl TensorCopier {
    /// Loads the gather kernel in `ctx` (the image for the device's architecture) and allocates its table.
    ///
    /// # Errors
    /// A `Backend` pool error naming the image when no image loads (a driver too old for the PTX, say).
    pub fn new(ctx: &Context) -> Result<Self, WeightsError> {
        let failed = |e: gpu_ipc_driver::DriverError| WeightsError::Pool(PoolError::Backend(e.into()));
        let (major, minor) = ctx.device().compute_capability().map_err(failed)?;
        let chosen = IMAGES
            .select(ComputeCapability::new(major, minor), image::force_ptx_from_env())
            .map_err(|e| WeightsError::Invalid(format!("the weights' gather kernel: {e}")))?;
        let loaded = Module::load(ctx, chosen.bytes)
            .and_then(|module| module.function(GATHER_KERNEL))
            .map_err(|e| WeightsError::Invalid(format!("the weights' gather kernel ({}): {e}", chosen.file)))?;
        tracing::debug!(image = chosen.file, "weights gather kernel loaded");
        Ok(Self { gather: GatherCopy::new(ctx, loaded).map_err(failed)? })
    }

    /// Queues every `(destination, source)` copy on `stream` (equal lengths, distinct destinations).
    ///
    /// # Errors
    /// Unequal lengths (nothing queued); a failing launch.
    pub fn copy(&mut self, copies: &[(DeviceSpan<'_>, DeviceSpan<'_>)], stream: &Stream) -> Result<(), WeightsError> {
        self.gather.copy(copies, stream).map_err(|e| WeightsError::Pool(PoolError::Backend(e.into())))
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use gpu_ipc_driver::{DeviceBuffer, DeviceMemory, GATHER_PIECE_BYTES, GATHER_TABLE_PIECES};

    #[test]
    fn the_embedded_images_are_what_the_manifest_lists() {
        assert_eq!(IMAGES.check_manifest(), Ok(()));
        assert!(IMAGES.lists_kernel(GATHER_KERNEL), "the manifest lists {GATHER_KERNEL}");
        assert!(IMAGES.manifest.contains("\"kernels/cuda/weights_gather.cu\""));
    }

    #[test]
    fn the_ptx_copies_in_16_byte_units_with_streaming_hints() {
        let ptx = IMAGES.ptx_text();
        assert!(ptx.contains("ld.global.cs.v4.u32") && ptx.contains("st.global.cs.v4.u32"), "16-byte loads and stores");
    }

    /// Copies of every alignment (16, 8, 4, 2 and 1 byte), sizes from 1 byte to several pieces, and more pieces
    /// than one launch takes, checked byte for byte; then the same table region is reused by later calls.
    #[test]
    #[ignore = "needs a CUDA GPU"]
    fn the_gather_copy_moves_every_byte_of_every_alignment() {
        let ctx = Context::for_ordinal(0).unwrap();
        let stream = Stream::new(&ctx).unwrap();
        let mut copier = TensorCopier::new(&ctx).unwrap();
        let size: u64 = 64 << 20;
        let (src, dst) = (DeviceBuffer::alloc(&ctx, size).unwrap(), DeviceBuffer::alloc(&ctx, size).unwrap());
        let pattern: Vec<u8> = (0..size).map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8).collect();
        src.span().write(0, &pattern).unwrap();
        for round in 0..3u64 {
            dst.span().write(0, &vec![0u8; size as usize]).unwrap();
            // (source offset, destination offset, bytes): each source range copied to the same range of dst
            // shifted by `round`, so later rounds put other bytes where earlier ones did.
            let m = 5 << 20;
            let mut ranges = vec![(0, 0, 2 * GATHER_PIECE_BYTES + 4096), (m + 8, m + 8, 40), (m + 68, m + 68, 12)];
            ranges.extend([(m + 102, m + 102, 6), (m + 131, m + 131, 1), (3 << 20, (3 << 20) + 1, 777)]);
            // Then many small copies: more pieces than one launch takes.
            let small = GATHER_TABLE_PIECES as u64 + 100;
            for k in 0..small {
                ranges.push(((8 << 20) + 256 * k, (8 << 20) + 256 * k + 16 * round, 96));
            }
            let spans: Vec<_> = ranges
                .iter()
                .map(|&(s, d, n)| (dst.span().slice(d, n).unwrap(), src.span().slice(s, n).unwrap()))
                .collect();
            copier.copy(&spans, &stream).unwrap();
            stream.synchronize().unwrap();
            let mut back = vec![0u8; size as usize];
            dst.span().read(0, &mut back).unwrap();
            for &(s, d, n) in &ranges {
                let (s, d, n) = (s as usize, d as usize, n as usize);
                assert_eq!(back[d..d + n], pattern[s..s + n], "round {round}: {n} bytes from {s} to {d}");
            }
        }
    }
}
