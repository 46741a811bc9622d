//! The study's designs, producer side (the bench process): one consumer process, one frame buffer, CPU flags in a
//! memfd. The frame travels through host memory (copied in and out, designs a and b), stays in host memory mapped
//! for both devices' kernels (the mapped zero-copy design), or lives in one device buffer shared by a legacy IPC
//! handle (c and d). The consumer side is [`super::consumer`]'s `study_consumer`.

use std::os::fd::OwnedFd;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Instant;

use gpu_ipc::BackendKind;
use gpu_ipc::core::shm::SharedMemory;
use gpu_ipc::driver::{DeviceBuffer, DeviceMemory, DeviceSpan, HostRegistration, Stream};

use super::results::Measurement;
use super::rig::{
    RunConfig, SETUP_TIMEOUT, base_plan, check_deadline, collect_reports, failed_row, measurement, recv_message,
    spawn_consumers,
};
use super::rows::{RowSpec, StudyDesign};
use super::shared::{PublishStamps, StudyFlags, cpu_ns, flag, monotonic_ns};
use super::tasks::{ConsumerMessage, Setup};
use harness::MeasurementError;
use harness::gpu::GpuSetup;
use harness::regions::ExportedRegion;

/// How the design moves the frame, in the row's note.
fn how(design: StudyDesign) -> &'static str {
    match design {
        StudyDesign::PageableShm | StudyDesign::PageableShm16ms => {
            "pageable cuMemcpyDtoH into a memfd, pageable cuMemcpyHtoD out of it"
        }
        StudyDesign::PinnedStaging => "memfd page-locked in both processes, cuMemcpyAsync in and out, then sync",
        StudyDesign::MappedZeroCopy => {
            "memfd page-locked and mapped for the device in both processes (cuMemHostRegister DEVICEMAP, \
             cuMemHostGetDevicePointer): the fill kernel writes host memory, the verify kernel reads it, over PCIe; \
             one buffer, the next fill waits for the verify"
        }
        StudyDesign::LegacyIpcSleep | StudyDesign::LegacyIpcSpin => {
            "one cuMemAlloc buffer shared by a legacy IPC handle; stream synchronised per frame on both sides"
        }
    }
}

/// A study design: the producer here, one consumer process, one frame buffer, CPU flags in a memfd.
pub(crate) fn study(
    gpu: &GpuSetup,
    cfg: &RunConfig,
    spec: RowSpec,
    design: StudyDesign,
) -> Result<Measurement, MeasurementError> {
    let shm_error = MeasurementError::SharedMemory;
    let bytes = cfg.frame_bytes();
    let host_bytes = usize::try_from(bytes).map_err(|_| MeasurementError::Other("frame too large".into()))?;
    let deadline = Instant::now() + cfg.row_timeout;
    let stream = Stream::new(gpu.context())?;
    let flags = StudyFlags::create().map_err(shm_error)?;
    let stamps = PublishStamps::create().map_err(shm_error)?;
    let mut setup = Setup { handle: None };
    // The frame: our own device buffer plus a host buffer (a, b), a host buffer mapped for the device (mapped
    // zero-copy), or a device buffer shared by handle (c, d).
    let mut own = None;
    let mut host = None;
    let mut registration = None;
    let mut shared = None;
    if design.through_host() {
        own = Some(DeviceBuffer::alloc(gpu.context(), bytes)?);
    }
    if design.in_host_memory() {
        let memory = Arc::new(SharedMemory::create("gpu-ipc-bench-frame", host_bytes).map_err(shm_error)?);
        if design.pinned() {
            registration = Some(HostRegistration::new(gpu.context(), Arc::clone(&memory))?);
        }
        host = Some(memory);
    } else {
        let legacy: BackendKind = "legacy"
            .parse()
            .map_err(|e| MeasurementError::Other(format!("the study's IPC designs need the legacy backend: {e}")))?;
        let region = ExportedRegion::allocate(legacy, gpu.context(), bytes)?;
        let (message, _no_fd) = region.export()?;
        setup.handle = Some(message);
        shared = Some(region);
    }
    let frame: DeviceSpan<'_> = match (&own, &registration, &shared) {
        (Some(buffer), _, _) => buffer.span(),
        (None, Some(mapped), _) => mapped.span(),
        (None, None, Some(region)) => region.span(),
        (None, None, None) => return Err(MeasurementError::Missing("no frame buffer")),
    }
    .slice(0, bytes)?;
    let extra = || -> Result<Vec<OwnedFd>, MeasurementError> {
        let mut fds = vec![flags.fd().map_err(shm_error)?];
        if let Some(memory) = &host {
            fds.push(memory.try_clone_fd().map_err(shm_error)?);
        }
        Ok(fds)
    };
    let mut children = spawn_consumers(&base_plan(cfg, spec, None), 1, &stamps, &setup, &extra)?;
    let nap = design.poll_interval();
    let produced = (|| -> Result<(f64, u64), MeasurementError> {
        match recv_message(&children[0], SETUP_TIMEOUT)? {
            ConsumerMessage::Ready => {}
            ConsumerMessage::Report(_) => {
                return Err(MeasurementError::Unexpected {
                    peer: "consumer",
                    expected: "ready",
                    got: "its report".to_owned(),
                });
            }
        }
        let (mut t0, mut cpu0) = (Instant::now(), cpu_ns());
        for seq in 0..cfg.total() {
            check_deadline(deadline, cfg, seq)?;
            if seq == cfg.warmup {
                (t0, cpu0) = (Instant::now(), cpu_ns());
            }
            if !design.through_host() {
                // One buffer both sides use: the next frame overwrites it only once the consumer is done with it.
                flags.wait(flag::CONSUMED, seq, false, nap, cfg.frame_timeout)?;
            }
            gpu.kernels().fill(&stream, frame, seq)?;
            if design.through_host() {
                // Our own device buffer is ours to fill; the host buffer is free once the consumer copied it out.
                flags.wait(flag::READY, 0, true, nap, cfg.frame_timeout)?;
                match (&host, &registration) {
                    (Some(_), Some(pinned)) => {
                        pinned.span().slice(0, bytes)?.copy_from_async(&frame, &stream)?;
                        stream.synchronize()?;
                    }
                    (Some(memory), None) => {
                        stream.synchronize()?;
                        frame.copy_to_host_memory(memory.as_ref(), 0)?;
                    }
                    (None, _) => return Err(MeasurementError::Missing("no host staging buffer")),
                }
            } else {
                stream.synchronize()?;
            }
            stamps.record(seq, monotonic_ns());
            flags.word(flag::PUBLISHED).store(seq + 1, Ordering::Release);
            if design.through_host() {
                flags.word(flag::READY).store(1, Ordering::Release);
            }
        }
        flags.wait(flag::CONSUMED, cfg.total(), false, nap, cfg.frame_timeout)?;
        Ok((t0.elapsed().as_secs_f64(), cpu_ns().saturating_sub(cpu0)))
    })();
    let (seconds, cpu) = match produced {
        Ok(done) => done,
        Err(e) => {
            flags.abort();
            return Err(failed_row(e, children, gpu.context(), &stream, cfg.frame_timeout));
        }
    };
    let reports = collect_reports(&mut children)?;
    let poll = match nap {
        Some(d) => format!("both sides poll the flag with {d:?} sleeps"),
        None => "both sides spin on the flag".to_owned(),
    };
    // Unregister before the memory goes (the registration holds its own reference).
    drop(registration);
    measurement(cfg, seconds, cpu, &reports, vec![format!("{}; {poll}", how(design))])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_design_says_how_it_moves_the_frame() {
        let notes: Vec<&str> = StudyDesign::ALL.iter().map(|&d| how(d)).collect();
        assert!(notes[0].starts_with("pageable") && notes[0] == notes[1], "{notes:?}");
        assert!(how(StudyDesign::MappedZeroCopy).contains("DEVICEMAP"));
        assert!(how(StudyDesign::LegacyIpcSpin).contains("legacy IPC handle"));
    }
}
