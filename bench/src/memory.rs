//! The memory benchmarks the research listed (pinned host-to-device and device-to-host copies, kernels on host
//! memory mapped for the device; the device-to-device bandwidth is the `bandwidth-floor` reference), the course
//! chapter's bandwidth tests against an imported buffer (copies to, from and within a buffer that a helper process,
//! role `bench-exporter`, allocated and exported through a backend, imported here, beside the same copy within a
//! local allocation), and each pattern kernel alone (generation only, processing only) beside the single-process
//! limit. One frame per operation, operations back to back on one stream, timed as the references are; every
//! destination is checked with the verify kernel afterwards (the row's mismatches).

use std::sync::Arc;
use std::time::Duration;

use gpu_ipc::BackendKind;
use gpu_ipc::core::shm::SharedMemory;
use gpu_ipc::driver::{Context, DeviceBuffer, DeviceMemory, DeviceSpan, HostRegistration};

use super::results::Measurement;
use super::rig::{RunConfig, SETUP_TIMEOUT, in_process, wait_stream};
use super::rows::{ImportedCopy, KernelAlone, MemoryTest};
use super::tasks::{BenchTask, ExporterMessage, ExporterPlan};
use harness::MeasurementError;
use harness::child::{Channel, ChildProcess, ChildTask};
use harness::gpu::GpuSetup;
use harness::regions::{ExportedRegion, ImportedRegion};

/// The sequence whose pattern the copied frames hold.
const SOURCE_SEQ: u64 = 1;

/// Host memory page-locked and mapped for the device: a memfd registered with `cuMemHostRegister` (`DEVICEMAP`),
/// the same kind of memory the study's pinned and mapped designs use.
fn pinned_host(ctx: &Context, bytes: u64) -> Result<HostRegistration<SharedMemory>, MeasurementError> {
    let len = usize::try_from(bytes).map_err(|_| MeasurementError::Other("frame too large".into()))?;
    let memory = Arc::new(SharedMemory::create("gpu-ipc-bench-pinned", len).map_err(MeasurementError::SharedMemory)?);
    Ok(HostRegistration::new(ctx, memory)?)
}

/// Times `count` back-to-back `copy`s of one frame from `src` to `dst` (warm-up first), then checks `dst` holds the
/// source pattern.
fn copies(
    gpu: &GpuSetup,
    cfg: &RunConfig,
    dst: DeviceSpan<'_>,
    src: DeviceSpan<'_>,
    note: String,
) -> Result<Measurement, MeasurementError> {
    let counter = DeviceBuffer::alloc(gpu.context(), 8)?;
    counter.write(0, &[0u64])?;
    let stream = gpu.stream();
    gpu.kernels().fill(stream, src, SOURCE_SEQ)?;
    let run = |from: u64, to: u64| -> Result<(), MeasurementError> {
        for _ in from..to {
            dst.copy_from_async(&src, stream)?;
        }
        wait_stream(gpu.context(), stream, cfg.row_timeout)
    };
    let mut m = in_process(cfg, run, &counter, note)?;
    gpu.kernels().verify(stream, dst, SOURCE_SEQ, counter.span())?;
    wait_stream(gpu.context(), stream, cfg.frame_timeout)?;
    let mut count = [0u64];
    counter.read(0, &mut count)?;
    m.mismatches = count[0];
    Ok(m)
}

/// Bytes read plus bytes written per second by `m`'s device-to-device copies of `bytes`, in GB/s.
fn read_and_written(m: &Measurement, bytes: u64) -> Option<f64> {
    (m.seconds > 0.0).then(|| 2.0 * bytes as f64 * m.frames as f64 / m.seconds / 1e9)
}

/// A memory benchmark of the research in this process.
pub(crate) fn memory(gpu: &GpuSetup, cfg: &RunConfig, test: MemoryTest) -> Result<Measurement, MeasurementError> {
    let bytes = cfg.frame_bytes();
    let ctx = gpu.context();
    match test {
        MemoryTest::PinnedHtoD
        | MemoryTest::PinnedDtoH
        | MemoryTest::MappedKernelWrite
        | MemoryTest::MappedKernelRead => {
            let host = pinned_host(ctx, bytes)?;
            let host_span = host.span().slice(0, bytes)?;
            let measured = match test {
                MemoryTest::PinnedHtoD => {
                    let device = DeviceBuffer::alloc(ctx, bytes)?;
                    let note = "cuMemcpyDtoDAsync from page-locked host memory (a registered memfd, by its mapped \
                                address) into a device buffer; FPS = copies per second";
                    copies(gpu, cfg, device.span(), host_span, note.into())
                }
                MemoryTest::PinnedDtoH => {
                    let device = DeviceBuffer::alloc(ctx, bytes)?;
                    let note = "cuMemcpyDtoDAsync from a device buffer into page-locked host memory (a registered \
                                memfd, by its mapped address); FPS = copies per second";
                    copies(gpu, cfg, host_span, device.span(), note.into())
                }
                _ => {
                    let (kernel, what) = if test == MemoryTest::MappedKernelWrite {
                        (KernelAlone::Fill, "the fill kernel writing a frame into")
                    } else {
                        (KernelAlone::Verify, "the verify kernel reading a frame from")
                    };
                    let note = format!(
                        "{what} host memory mapped for the device (a memfd registered with DEVICEMAP), over PCIe; FPS \
                         = kernels per second"
                    );
                    kernel_rows(gpu, cfg, host_span, kernel, note)
                }
            };
            // Unregistered only once nothing queued may still touch it (after a failure too); else leaked.
            if let Err(stuck) = wait_stream(ctx, gpu.stream(), cfg.frame_timeout) {
                tracing::warn!(%stuck, "work on registered host memory did not drain; leaking its registration");
                std::mem::forget(host);
                return Err(stuck);
            }
            drop(host);
            measured
        }
        MemoryTest::LocalWithin => {
            let local = DeviceBuffer::alloc(ctx, 2 * bytes)?;
            let note = "cuMemcpyDtoDAsync of a frame within one local cuMemAlloc allocation of two frames (first to \
                        second): the reference of the imported 'within' rows; FPS = copies per second";
            let mut m =
                copies(gpu, cfg, local.span().slice(bytes, bytes)?, local.span().slice(0, bytes)?, note.into())?;
            m.bandwidth_gb_s = read_and_written(&m, bytes);
            Ok(m)
        }
    }
}

/// One pattern kernel alone on a device buffer: generation only or processing only.
pub(crate) fn kernel_alone(
    gpu: &GpuSetup,
    cfg: &RunConfig,
    kernel: KernelAlone,
) -> Result<Measurement, MeasurementError> {
    let frame = DeviceBuffer::alloc(gpu.context(), cfg.frame_bytes())?;
    let note = match kernel {
        KernelAlone::Fill => "generation only: the fill kernel on one frame buffer, back to back",
        KernelAlone::Verify => "processing only: the verify kernel over one filled frame buffer, back to back",
    };
    kernel_rows(gpu, cfg, frame.span(), kernel, format!("{note}; kernel time = 1 / FPS"))
}

/// Times `kernel` over `frame` back to back (the fill with each sequence, the verify of one filled frame), then
/// checks the frame (after the fills: the last sequence's pattern).
fn kernel_rows(
    gpu: &GpuSetup,
    cfg: &RunConfig,
    frame: DeviceSpan<'_>,
    kernel: KernelAlone,
    note: String,
) -> Result<Measurement, MeasurementError> {
    let counter = DeviceBuffer::alloc(gpu.context(), 8)?;
    counter.write(0, &[0u64])?;
    let (kernels, stream) = (gpu.kernels(), gpu.stream());
    if kernel == KernelAlone::Verify {
        kernels.fill(stream, frame, SOURCE_SEQ)?;
    }
    let run = |from: u64, to: u64| -> Result<(), MeasurementError> {
        for seq in from..to {
            match kernel {
                KernelAlone::Fill => kernels.fill(stream, frame, seq)?,
                KernelAlone::Verify => kernels.verify(stream, frame, SOURCE_SEQ, counter.span())?,
            }
        }
        wait_stream(gpu.context(), stream, cfg.row_timeout)
    };
    let mut m = in_process(cfg, run, &counter, note)?;
    if kernel == KernelAlone::Fill {
        kernels.verify(stream, frame, cfg.total().saturating_sub(1), counter.span())?;
        wait_stream(gpu.context(), stream, cfg.frame_timeout)?;
        let mut count = [0u64];
        counter.read(0, &mut count)?;
        m.mismatches = count[0];
    }
    Ok(m)
}

/// Runs a `bench-exporter` child: allocates, exports, sends the handle, and keeps the allocation until the bench
/// process says it is done (or hangs up, or `hold_ms` passes).
///
/// # Errors
/// Allocation, export or channel errors.
pub fn exporter_child(plan: &ExporterPlan, channel: &Channel) -> Result<(), MeasurementError> {
    let ctx = Context::for_ordinal(plan.device)?;
    let region = ExportedRegion::allocate(plan.backend, &ctx, plan.bytes)?;
    let (handle, fd) = region.export()?;
    channel.send(&ExporterMessage::Exported { handle }, fd.into_iter().collect())?;
    // Whatever the answer (done, a hang-up, the bound), the importer no longer uses the memory, or is gone.
    let answer = channel.recv_plain::<ExporterMessage>(Duration::from_millis(plan.hold_ms));
    if let Err(e) = answer {
        tracing::debug!(%e, "the bench process did not say done");
    }
    drop(region);
    Ok(())
}

/// A course-chapter copy with a buffer a `bench-exporter` child allocated through `backend` (two frames), imported
/// here.
pub(crate) fn imported(
    gpu: &GpuSetup,
    cfg: &RunConfig,
    backend: BackendKind,
    copy: ImportedCopy,
) -> Result<Measurement, MeasurementError> {
    let bytes = cfg.frame_bytes();
    let plan = ExporterPlan {
        backend,
        device: cfg.device,
        bytes: 2 * bytes,
        hold_ms: u64::try_from(cfg.row_timeout.as_millis()).unwrap_or(u64::MAX),
    };
    let task = ChildTask::of(&BenchTask::Exporter(plan))
        .map_err(|source| MeasurementError::Malformed { what: "bench task".to_owned(), source })?;
    let mut child = ChildProcess::spawn(&task, &[], Duration::from_secs(30))?;
    let (value, mut fds): (serde_json::Value, _) = child.channel().recv(SETUP_TIMEOUT)?;
    if let Some(error) = value.get("error").and_then(serde_json::Value::as_str) {
        return Err(MeasurementError::Child { role: "bench-exporter".to_owned(), reason: error.to_owned() });
    }
    let handle = match serde_json::from_value(value)
        .map_err(|source| MeasurementError::Malformed { what: "exporter message".to_owned(), source })?
    {
        ExporterMessage::Exported { handle } => handle,
        ExporterMessage::Done => {
            return Err(MeasurementError::Unexpected {
                peer: "exporter",
                expected: "its handle",
                got: "done".to_owned(),
            });
        }
    };
    let region = ImportedRegion::import(gpu.context(), &handle, fds.pop())?;
    let local = DeviceBuffer::alloc(gpu.context(), bytes)?;
    let (first, second) = (region.span().slice(0, bytes)?, region.span().slice(bytes, bytes)?);
    let what = format!("a buffer another process allocated and exported through the {} backend", backend.name());
    let (dst, src, note) = match copy {
        ImportedCopy::To => {
            (first, local.span(), format!("cuMemcpyDtoDAsync of a frame from a local buffer into {what}"))
        }
        ImportedCopy::From => {
            (local.span(), first, format!("cuMemcpyDtoDAsync of a frame from {what} into a local buffer"))
        }
        ImportedCopy::Within => {
            (second, first, format!("cuMemcpyDtoDAsync of a frame within {what} (first to second)"))
        }
    };
    let measured = copies(gpu, cfg, dst, src, format!("{note}; FPS = copies per second"));
    // Nothing queued may still use the mapping when it goes (`copies` waited, or the row failed: wait again).
    if let Err(stuck) = wait_stream(gpu.context(), gpu.stream(), cfg.frame_timeout) {
        tracing::warn!(%stuck, "copies with the imported buffer did not drain; leaking its mapping");
        std::mem::forget(region);
        return Err(stuck);
    }
    drop(region);
    if let Err(e) = child.channel().send(&ExporterMessage::Done, Vec::new()) {
        tracing::debug!(%e, "the exporter is gone already");
    }
    let status = child.wait(Duration::from_secs(10))?;
    let mut m = measured?;
    if !status.success() {
        return Err(MeasurementError::Other(format!("the exporter exited with {status}")));
    }
    m.bandwidth_gb_s = read_and_written(&m, bytes);
    Ok(m)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn device_copies_count_bytes_read_and_written() {
        let m = Measurement {
            frames: 1000,
            seconds: 0.5,
            fps: 2000.0,
            ratio_to_single_process: None,
            latency: None,
            producer_cpu_us_per_frame: 0.0,
            consumer_cpu_us_per_frame: Vec::new(),
            mismatches: 0,
            bandwidth_gb_s: None,
            frame_gb_s: None,
            note: None,
        };
        assert_eq!(read_and_written(&m, 1_000_000), Some(4.0));
        assert_eq!(read_and_written(&Measurement { seconds: 0.0, ..m }, 1), None);
    }
}
