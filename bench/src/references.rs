//! The reference rows, each in this process: the single-process limit (fill then verify in one buffer), the same
//! kernels pipelined through several buffers (handed over with events, or with stream memory operations as
//! `gpu-stream-ops` does), and the memory-bandwidth floor (a frame copy). Every ratio of the bench divides by them.

use std::time::Instant;

use gpu_ipc::driver::{DeviceBuffer, DeviceMemory, Event, EventFlags, Stream};
use harness::MeasurementError;
use harness::gpu::GpuSetup;

use super::results::{Measurement, cpu_us_per_frame, fps};
use super::rig::{RunConfig, in_process, wait_stream};
use super::shared::cpu_ns;

/// The single-process limit: fill then verify of each frame in one buffer on one stream, back to back.
pub(crate) fn single_process(gpu: &GpuSetup, cfg: &RunConfig) -> Result<Measurement, MeasurementError> {
    let bytes = cfg.frame_bytes();
    let frame = DeviceBuffer::alloc(gpu.context(), bytes)?;
    let counter = DeviceBuffer::alloc(gpu.context(), 8)?;
    counter.write(0, &[0u64])?;
    let run = |from: u64, to: u64| -> Result<(), MeasurementError> {
        for seq in from..to {
            gpu.kernels().fill(gpu.stream(), frame.span(), seq)?;
            gpu.kernels().verify(gpu.stream(), frame.span(), seq, counter.span())?;
        }
        wait_stream(gpu.context(), gpu.stream(), cfg.row_timeout)
    };
    in_process(
        cfg,
        run,
        &counter,
        "one process, one stream, one frame buffer: fill then verify, frames queued back to back".into(),
    )
}

/// The same kernels in one process, pipelined through `slots` frame buffers: fill on the bench stream, verify on a
/// second stream, frame `seq` in buffer `seq % slots`; the verify of a buffer waits for its fill (an event) and the
/// next fill of it waits for that verify (another event). No IPC and no CPU wait per frame: the ceiling of a design
/// in which the next frame's fill runs while the current one is verified, as in a ring of two or more slots.
pub(crate) fn single_process_pipelined(
    gpu: &GpuSetup,
    cfg: &RunConfig,
    slots: u32,
) -> Result<Measurement, MeasurementError> {
    let bytes = cfg.frame_bytes();
    let slots = slots.max(1) as usize;
    let frames = (0..slots).map(|_| DeviceBuffer::alloc(gpu.context(), bytes)).collect::<Result<Vec<_>, _>>()?;
    let events = || (0..slots).map(|_| Event::new(gpu.context(), EventFlags::default())).collect::<Result<Vec<_>, _>>();
    let (filled, verified) = (events()?, events()?);
    let counter = DeviceBuffer::alloc(gpu.context(), 8)?;
    counter.write(0, &[0u64])?;
    let verify_stream = Stream::new(gpu.context())?;
    let run = |from: u64, to: u64| -> Result<(), MeasurementError> {
        for seq in from..to {
            let i = (seq % slots as u64) as usize;
            // The buffer's previous verify (an event never recorded is complete).
            gpu.stream().wait_event(&verified[i])?;
            gpu.kernels().fill(gpu.stream(), frames[i].span(), seq)?;
            filled[i].record(gpu.stream())?;
            verify_stream.wait_event(&filled[i])?;
            gpu.kernels().verify(&verify_stream, frames[i].span(), seq, counter.span())?;
            verified[i].record(&verify_stream)?;
        }
        wait_stream(gpu.context(), gpu.stream(), cfg.row_timeout)?;
        wait_stream(gpu.context(), &verify_stream, cfg.row_timeout)
    };
    let note = format!(
        "one process, {slots} frame buffers, fill on one stream and verify on another, handed over with events: the \
         next fill overlaps the current verify"
    );
    in_process(cfg, run, &counter, note)
}

/// As [`single_process_pipelined`], each buffer handed over by stream memory operations on two counters in
/// registered host memory, as `gpu-stream-ops` waits and publishes: the fill of frame `seq` waits until the verify
/// stream has released frame `seq - slots` (`released >= seq + 1 - slots`), then writes `published = seq + 1`;
/// the verify waits for `published >= seq + 1`, then writes `released = seq + 1`.
pub(crate) fn single_process_memops(
    gpu: &GpuSetup,
    cfg: &RunConfig,
    slots: u32,
) -> Result<Measurement, MeasurementError> {
    use gpu_ipc::core::shm::SharedMemory;
    use gpu_ipc::driver::{HostRegistration, WaitCondition};
    const PUBLISHED: usize = 0;
    const RELEASED: usize = 64;
    let bytes = cfg.frame_bytes();
    let depth = u64::from(slots.max(1));
    let frames = (0..depth).map(|_| DeviceBuffer::alloc(gpu.context(), bytes)).collect::<Result<Vec<_>, _>>()?;
    let words =
        std::sync::Arc::new(SharedMemory::create("gpu-ipc-bench-memops", 128).map_err(MeasurementError::SharedMemory)?);
    let counters = HostRegistration::new(gpu.context(), words)?;
    let counter = DeviceBuffer::alloc(gpu.context(), 8)?;
    counter.write(0, &[0u64])?;
    let verify_stream = Stream::new(gpu.context())?;
    let run = |from: u64, to: u64| -> Result<(), MeasurementError> {
        for seq in from..to {
            let frame = frames[(seq % depth) as usize].span();
            if seq >= depth {
                counters.wait_value_u64(gpu.stream(), RELEASED, seq + 1 - depth, WaitCondition::AtLeast)?;
            }
            gpu.kernels().fill(gpu.stream(), frame, seq)?;
            counters.write_value_u64(gpu.stream(), PUBLISHED, seq + 1)?;
            counters.wait_value_u64(&verify_stream, PUBLISHED, seq + 1, WaitCondition::AtLeast)?;
            gpu.kernels().verify(&verify_stream, frame, seq, counter.span())?;
            counters.write_value_u64(&verify_stream, RELEASED, seq + 1)?;
        }
        wait_stream(gpu.context(), gpu.stream(), cfg.row_timeout)?;
        wait_stream(gpu.context(), &verify_stream, cfg.row_timeout)
    };
    let note = format!(
        "one process, {depth} frame buffers, fill on one stream and verify on another, handed over by stream memory \
         operations on counters in registered host memory (as gpu-stream-ops): that handoff's own cost"
    );
    in_process(cfg, run, &counter, note)
}

/// The memory-bandwidth floor: device-to-device copies of a frame, back to back.
pub(crate) fn bandwidth(gpu: &GpuSetup, cfg: &RunConfig) -> Result<Measurement, MeasurementError> {
    let bytes = cfg.frame_bytes();
    let src = DeviceBuffer::alloc(gpu.context(), bytes)?;
    let dst = DeviceBuffer::alloc(gpu.context(), bytes)?;
    let run = |count: u64| -> Result<(), MeasurementError> {
        for _ in 0..count {
            dst.span().copy_from_async(&src.span(), gpu.stream())?;
        }
        wait_stream(gpu.context(), gpu.stream(), cfg.row_timeout)
    };
    run(cfg.warmup)?;
    let (t0, cpu0) = (Instant::now(), cpu_ns());
    run(cfg.frames)?;
    let seconds = t0.elapsed().as_secs_f64();
    let cpu = cpu_ns().saturating_sub(cpu0);
    let moved = 2.0 * bytes as f64 * cfg.frames as f64;
    Ok(Measurement {
        frames: cfg.frames,
        seconds,
        fps: fps(cfg.frames, seconds),
        ratio_to_single_process: None,
        latency: None,
        producer_cpu_us_per_frame: cpu_us_per_frame(cpu, cfg.frames),
        consumer_cpu_us_per_frame: Vec::new(),
        mismatches: 0,
        bandwidth_gb_s: Some(if seconds > 0.0 { moved / seconds / 1e9 } else { 0.0 }),
        frame_gb_s: None,
        note: Some(
            "cuMemcpyDtoDAsync of one frame between two buffers; a copy reads and writes one frame, as fill + \
             verify do, so the implied FPS is copies per second"
                .into(),
        ),
    })
}
