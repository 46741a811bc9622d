//! The semaphore's count on a GPU backend: word 0 of a small device allocation the owner exports beside the shared
//! block ([`DeviceCount`]), changed only by the semaphore's kernels (`kernels/cuda/semaphore_count.cu`): GPU
//! atomics on device memory, atomic with every other process's. A stream post is the post kernel queued on the
//! caller's stream; a CPU post, a refund, the poison and the owner's reset are the same kernels on a private
//! stream, waited for. Each kernel then copies the count into the block's `posted` word (the mirror CPU waiters
//! read); stream waits wait on the count itself (`cuStreamWaitValue64`, which works on imported memory).
//!
//! Why not the block's host word, as before: a GPU atomic on host memory is atomic with the CPU's atomics only
//! where the device reports `CU_DEVICE_ATTRIBUTE_HOST_NATIVE_ATOMIC_SUPPORTED` (0 on a PCIe GPU in an x86
//! machine, e.g. the H200 this project measures on), and CUDA 13.0 has no atomic-add stream memory operation. So
//! every change of the count is a GPU atomic, on device memory. The host backend models the same operations with
//! CPU atomics on a word of the block ([`super::layout::COUNT_WORD`]; see `block.rs`).

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::error::SemaphoreError;
use super::layout::{POSTED_OFFSET, RESET_FENCE_OFFSET, SharedWords};
use crate::backend::{BackendError, ExportedHandle};
use crate::driver::image::{self, ComputeCapability, KernelImage};
use crate::driver::{
    Context, DeviceMemory, DeviceSpan, Function, HostRegistration, KernelArg, LaunchConfig, Module, Stream,
    WaitCondition,
};
use crate::queue::{MemoryAccess, QueueMemory};
use crate::ring::{WaitMode, bounded_wait};
use crate::sys::shm::SharedObject;

/// The semaphore's kernels, from `ipc-core/semaphore-kernels/` (`scripts/gen-kernels.sh`): the cubins in ascending
/// architecture order, then the PTX (the last resort).
static IMAGES: [KernelImage; 8] = [
    KernelImage::cubin(7, 5, "sm_75.cubin", include_bytes!("../../semaphore-kernels/sm_75.cubin")),
    KernelImage::cubin(8, 0, "sm_80.cubin", include_bytes!("../../semaphore-kernels/sm_80.cubin")),
    KernelImage::cubin(8, 6, "sm_86.cubin", include_bytes!("../../semaphore-kernels/sm_86.cubin")),
    KernelImage::cubin(8, 9, "sm_89.cubin", include_bytes!("../../semaphore-kernels/sm_89.cubin")),
    KernelImage::cubin(9, 0, "sm_90.cubin", include_bytes!("../../semaphore-kernels/sm_90.cubin")),
    KernelImage::cubin(10, 0, "sm_100.cubin", include_bytes!("../../semaphore-kernels/sm_100.cubin")),
    KernelImage::cubin(12, 0, "sm_120.cubin", include_bytes!("../../semaphore-kernels/sm_120.cubin")),
    KernelImage::ptx(
        7,
        5,
        "compute_75.ptx",
        concat!(include_str!("../../semaphore-kernels/compute_75.ptx"), "\0").as_bytes(),
    ),
];

/// Bytes the owner asks its backend for: vmm's granularity, and for legacy a whole allocation of its own rather
/// than a small one the driver may place beside others (legacy IPC maps whole allocations). The count is word 0.
pub(super) const COUNT_ALLOCATION_BYTES: u64 = 2 << 20;

/// How long a CPU-side change of the count (a kernel on the private stream) may take before it is an error.
const OP_TIMEOUT: Duration = Duration::from_secs(5);

/// Makes what an importer needs for the count's allocation (the owner's; one call per offer).
pub(super) type CountExporter = Box<dyn Fn() -> Result<ExportedHandle, BackendError> + Send + Sync>;

/// The count in device memory, in one process: the allocation (the owner's or an import), the block registered
/// for the device (the kernels write the mirror and the reset's fence words there), the kernels and a private
/// stream for the CPU side's changes.
pub(crate) struct DeviceCount {
    // Field order is drop order: the functions and the stream before the module and the memory they use.
    post: Function,
    poison: Function,
    reset: Function,
    stream: Stream,
    registration: Arc<HostRegistration<SharedObject<SharedWords>>>,
    region: Arc<dyn QueueMemory>,
    ctx: Context,
}

impl std::fmt::Debug for DeviceCount {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeviceCount").field("count", &self.region.ptr()).finish_non_exhaustive()
    }
}

impl DeviceCount {
    /// Loads the kernels in `ctx`, registers `block` there and keeps `region` (whose first word is the count).
    ///
    /// # Errors
    /// A region that is not device memory, no image for the device, or the driver's error.
    pub(super) fn new(
        ctx: &Context,
        region: Arc<dyn QueueMemory>,
        block: &Arc<SharedObject<SharedWords>>,
    ) -> Result<Self, SemaphoreError> {
        if !matches!(region.access(), MemoryAccess::Device(_)) || region.len() < 8 {
            return Err(SemaphoreError::Corrupt { what: "count allocation", value: region.len() });
        }
        let (major, minor) = ctx.device().compute_capability()?;
        let chosen = image::select_image(&IMAGES, ComputeCapability::new(major, minor), image::force_ptx_from_env())
            .map_err(|e| SemaphoreError::Kernels { image: "none", reason: e.to_string() })?;
        let module = Module::load(ctx, chosen.bytes)
            .map_err(|e| SemaphoreError::Kernels { image: chosen.file, reason: e.to_string() })?;
        let function = |name: &str| {
            module.function(name).map_err(|e| SemaphoreError::Kernels { image: chosen.file, reason: e.to_string() })
        };
        let registration = Arc::new(HostRegistration::new(ctx, Arc::clone(block))?);
        tracing::debug!(image = chosen.file, "semaphore: count kernels loaded");
        Ok(Self {
            post: function("gpu_ipc_semaphore_post")?,
            poison: function("gpu_ipc_semaphore_poison")?,
            reset: function("gpu_ipc_semaphore_reset")?,
            stream: Stream::new(ctx)?,
            registration,
            region,
            ctx: ctx.clone(),
        })
    }

    /// The count's word in this process: what stream waits wait on and kernels after a wait read.
    pub(super) fn span(&self) -> Result<DeviceSpan<'_>, SemaphoreError> {
        match self.region.access() {
            MemoryAccess::Device(span) => Ok(span.prefix(8)),
            // `new` refuses host memory.
            MemoryAccess::Host(_) => Err(SemaphoreError::Corrupt { what: "count allocation", value: 0 }),
        }
    }

    /// The context the count's word is mapped in.
    pub(super) fn context(&self) -> &Context {
        &self.ctx
    }

    fn mirror(&self) -> Result<DeviceSpan<'_>, SemaphoreError> {
        Ok(self.registration.span().slice(POSTED_OFFSET as u64, 8)?)
    }

    /// Writes the count's first value (the owner's, before anyone else sees the allocation).
    pub(super) fn initialise(&self, initial: u64) -> Result<(), SemaphoreError> {
        self.ctx.bind()?;
        self.span()?.write(0, &[initial])?;
        Ok(())
    }

    /// Queues on `stream` a post of `n` (0: only mirrors the count again).
    pub(super) fn post_on(&self, stream: &Stream, n: u64) -> Result<(), SemaphoreError> {
        // The caller's thread may have no context current (the owner's door thread, an importer's watchdog).
        self.ctx.bind()?;
        let args = [KernelArg::Span(self.span()?), KernelArg::Span(self.mirror()?), KernelArg::U64(n)];
        self.post.launch_typed(stream, LaunchConfig::linear(1, 1), &args)?;
        Ok(())
    }

    /// Adds `n` posts now (0: mirrors the count again), waiting for the kernel.
    pub(super) fn add(&self, n: u64) -> Result<(), SemaphoreError> {
        self.post_on(&self.stream, n)?;
        self.finish()
    }

    /// ORs the poison into the count now, waiting for the kernel.
    pub(super) fn poison(&self) -> Result<(), SemaphoreError> {
        self.ctx.bind()?;
        let args = [KernelArg::Span(self.span()?), KernelArg::Span(self.mirror()?)];
        self.poison.launch_typed(&self.stream, LaunchConfig::linear(1, 1), &args)?;
        self.finish()
    }

    /// The owner's reset: the count becomes `max(count, taken)` without the poison; the fence words say which
    /// tickets the poison released.
    pub(super) fn reset(&self, taken: u64) -> Result<(), SemaphoreError> {
        self.ctx.bind()?;
        let fence = self.registration.span().slice(RESET_FENCE_OFFSET as u64, 16)?;
        let args = [
            KernelArg::Span(self.span()?),
            KernelArg::Span(self.mirror()?),
            KernelArg::U64(taken),
            KernelArg::Span(fence),
        ];
        self.reset.launch_typed(&self.stream, LaunchConfig::linear(1, 1), &args)?;
        self.finish()
    }

    /// The count now, read from the device (the mirror may lag it by a kernel in flight).
    pub(super) fn exact(&self) -> Result<u64, SemaphoreError> {
        self.ctx.bind()?;
        let mut value = [0u64];
        self.span()?.read(0, &mut value)?;
        Ok(value[0])
    }

    /// Queues on `stream` a wait until the count reaches `value`.
    pub(super) fn wait_on(&self, stream: &Stream, value: u64) -> Result<(), SemaphoreError> {
        self.ctx.bind()?;
        self.span()?.wait_value_u64(stream, 0, value, WaitCondition::AtLeast)?;
        Ok(())
    }

    /// Queues on `stream` a copy of the count into `dst`.
    pub(super) fn copy_on(&self, stream: &Stream, dst: &DeviceSpan<'_>) -> Result<(), SemaphoreError> {
        self.ctx.bind()?;
        dst.copy_from_async(&self.span()?, stream)?;
        Ok(())
    }

    /// Waits, bounded, for the private stream.
    fn finish(&self) -> Result<(), SemaphoreError> {
        let stream = &self.stream;
        bounded_wait(
            Instant::now() + OP_TIMEOUT,
            WaitMode::Spin,
            Duration::from_millis(1),
            || stream.is_idle().map_err(SemaphoreError::from),
            || Ok(()),
            |waited| SemaphoreError::GpuBusy { waited },
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The kernels `DeviceCount::new` loads.
    const KERNELS: [&str; 3] = ["gpu_ipc_semaphore_post", "gpu_ipc_semaphore_poison", "gpu_ipc_semaphore_reset"];

    #[test]
    fn the_embedded_images_are_what_the_manifest_lists() {
        let manifest = include_str!("../../semaphore-kernels/manifest.json");
        for image in &IMAGES {
            let size = image.bytes.len() - usize::from(image.kind == image::ImageKind::Ptx);
            let entry = format!("\"file\": \"{}\"", image.file);
            let at = manifest.find(&entry).unwrap_or_else(|| panic!("{} is not in the manifest", image.file));
            assert!(manifest[at..].contains(&format!("\"size\": {size},")), "{}: size {size}", image.file);
        }
        for name in KERNELS {
            assert!(manifest.contains(&format!("\"{name}\"")), "{name} is not in the manifest");
        }
        assert!(manifest.contains("\"kernels/cuda/semaphore_count.cu\""));
        assert!(manifest.contains("\"kernels/cuda/gpu_ipc_semaphore.cuh\""));
    }

    #[test]
    fn the_ptx_changes_the_count_with_system_scope_atomics_and_mirrors_with_release_stores() {
        let ptx = include_str!("../../semaphore-kernels/compute_75.ptx");
        assert!(ptx.contains("atom.release.sys.global.add.u64"), "a post is a release add at system scope");
        assert!(ptx.contains("atom.release.sys.global.or.b64"), "the poison is an atomic OR");
        assert!(ptx.contains("atom.acq_rel.sys.global.cas.b64"), "the reset is a compare-and-swap");
        assert!(ptx.contains("st.release.sys.global.u64"), "the mirror is stored with release");
        assert!(ptx.contains("ld.acquire.sys.global.u64"), "the count is read back with acquire");
    }
}
