//! What every row's producer side stands on, written once: the row's configuration ([`RunConfig`]), bounded waits
//! for the GPU and for a row's deadline, a reference row timed in this process (`in_process`), starting a row's
//! consumer processes and collecting their reports, and the row's measurement from them. Below every kind of row.

use std::os::fd::OwnedFd;
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use gpu_ipc::core::backend::Backend;
use gpu_ipc::core::frames::{FrameError, Producer};
use gpu_ipc::driver::{Context, DeviceBuffer, Event, EventFlags, Stream};

use super::results::{ConsumerReport, Measurement, cpu_us_per_frame, fps, merge_consumers};
use super::rows::RowSpec;
use super::shared::{PublishStamps, cpu_ns};
use super::tasks::{BenchTask, ConsumerMessage, ConsumerPlan, Setup};
use harness::MeasurementError;
use harness::child::{ChildProcess, ChildTask};

/// How long a consumer process has to start, set up CUDA and attach or say it is ready.
pub(crate) const SETUP_TIMEOUT: Duration = Duration::from_secs(60);

/// What every row runs with.
#[derive(Debug, Clone)]
pub struct RunConfig {
    /// The device.
    pub device: i32,
    /// Frame width, height and bytes per pixel.
    pub shape: [u32; 3],
    /// Frames measured.
    pub frames: u64,
    /// Frames before the measured window.
    pub warmup: u64,
    /// Bound of every wait for one frame.
    pub frame_timeout: Duration,
    /// Bound of the whole row.
    pub row_timeout: Duration,
}

impl RunConfig {
    /// Bytes of one frame.
    pub fn frame_bytes(&self) -> u64 {
        self.shape.iter().map(|&x| u64::from(x)).product()
    }

    pub(crate) fn total(&self) -> u64 {
        self.warmup + self.frames
    }

    /// This configuration with the frames and warm-up of `spec` ([`RowSpec::budget`]).
    pub fn for_row(&self, spec: RowSpec) -> Self {
        let (frames, warmup) = spec.budget(self.frames, self.warmup);
        Self { frames, warmup, ..self.clone() }
    }
}

/// Waits for the work queued on `stream`, at most `timeout` (an event polled, never an unbounded synchronise).
pub(crate) fn wait_stream(ctx: &Context, stream: &Stream, timeout: Duration) -> Result<(), MeasurementError> {
    let event = Event::new(ctx, EventFlags::default())?;
    event.record(stream)?;
    let deadline = Instant::now() + timeout;
    while !event.is_complete()? {
        if Instant::now() >= deadline {
            return Err(MeasurementError::Wait(format!("queued GPU work not done within {timeout:?}")));
        }
        std::thread::yield_now();
    }
    Ok(())
}

fn read_counter(counter: &DeviceBuffer) -> Result<u64, MeasurementError> {
    let mut count = [0u64];
    counter.read(0, &mut count)?;
    Ok(count[0])
}

/// A reference row run in this process: `run(from, to)` queues frames `from..to` and waits for them; the warm-up
/// first, then the measured window, timed on the wall clock and this process's CPU clock; `counter` holds the
/// verify kernels' mismatches.
pub(crate) fn in_process(
    cfg: &RunConfig,
    run: impl Fn(u64, u64) -> Result<(), MeasurementError>,
    counter: &DeviceBuffer,
    note: String,
) -> Result<Measurement, MeasurementError> {
    run(0, cfg.warmup)?;
    let (t0, cpu0) = (Instant::now(), cpu_ns());
    run(cfg.warmup, cfg.total())?;
    let seconds = t0.elapsed().as_secs_f64();
    let cpu = cpu_ns().saturating_sub(cpu0);
    Ok(Measurement {
        frames: cfg.frames,
        seconds,
        fps: fps(cfg.frames, seconds),
        ratio_to_single_process: None,
        latency: None,
        producer_cpu_us_per_frame: cpu_us_per_frame(cpu, cfg.frames),
        consumer_cpu_us_per_frame: Vec::new(),
        mismatches: read_counter(counter)?,
        bandwidth_gb_s: None,
        frame_gb_s: None,
        note: Some(note),
    })
}

/// The geometry of the row's frames (RGB, 8 bits a channel) from `[width, height, bytes per pixel]`.
pub(crate) fn frame_geometry(shape: [u32; 3]) -> Result<gpu_ipc::core::wire::FrameGeometry, MeasurementError> {
    use gpu_ipc::core::wire::{FrameGeometry, PixelFormat};
    let [width, height, _] = shape;
    FrameGeometry::new(width, height, PixelFormat::Rgb8)
        .map_err(|e| MeasurementError::Other(format!("frame geometry: {e}")))
}

/// A fresh rendezvous socket path for one row.
pub(crate) fn socket_path() -> PathBuf {
    use std::sync::atomic::AtomicU64;
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    std::env::temp_dir().join(format!("gpu-ipc-bench-{}-{n}.sock", std::process::id()))
}

/// Starts `count` consumers with `plan` (numbered) and sends each its setup: the stamps' fd, then `extra` fds.
pub(crate) fn spawn_consumers(
    plan: &ConsumerPlan,
    count: u32,
    stamps: &PublishStamps,
    setup: &Setup,
    extra: &dyn Fn() -> Result<Vec<OwnedFd>, MeasurementError>,
) -> Result<Vec<ChildProcess>, MeasurementError> {
    let shm = MeasurementError::SharedMemory;
    let mut children = Vec::with_capacity(count as usize);
    for index in 0..count {
        let plan = ConsumerPlan { index, ..plan.clone() };
        let task = ChildTask::of(&BenchTask::Consumer(plan))
            .map_err(|source| MeasurementError::Malformed { what: "bench task".to_owned(), source })?;
        let child = ChildProcess::spawn(&task, &[], Duration::from_secs(30))?;
        let mut fds = vec![stamps.fd().map_err(shm)?];
        fds.extend(extra()?);
        child.channel().send(setup, fds)?;
        children.push(child);
    }
    Ok(children)
}

/// Receives a consumer's next message; a child that reported a failure becomes [`MeasurementError::Child`].
pub(crate) fn recv_message(child: &ChildProcess, timeout: Duration) -> Result<ConsumerMessage, MeasurementError> {
    let value: serde_json::Value = child.channel().recv_plain(timeout)?;
    if let Some(error) = value.get("error").and_then(serde_json::Value::as_str) {
        return Err(MeasurementError::Child { role: "bench-consumer".to_owned(), reason: error.to_owned() });
    }
    serde_json::from_value(value)
        .map_err(|source| MeasurementError::Malformed { what: "consumer message".to_owned(), source })
}

fn recv_report(child: &ChildProcess, timeout: Duration) -> Result<ConsumerReport, MeasurementError> {
    match recv_message(child, timeout)? {
        ConsumerMessage::Report(report) => Ok(report),
        ConsumerMessage::Ready => {
            Err(MeasurementError::Unexpected { peer: "consumer", expected: "its report", got: "ready".to_owned() })
        }
    }
}

/// A row whose producer side failed: `e` with what its consumers said; the children are killed (dropped) and the
/// row's stream given `timeout` to drain (killed consumers are noticed by the producer's watchdog, which releases
/// the stream's waits).
pub(crate) fn failed_row(
    e: MeasurementError,
    children: Vec<ChildProcess>,
    ctx: &Context,
    stream: &Stream,
    timeout: Duration,
) -> MeasurementError {
    let e = with_consumer_failures(e, &children);
    drop(children);
    if let Err(stuck) = wait_stream(ctx, stream, timeout) {
        tracing::warn!(%stuck, "the failed row's stream did not drain");
    }
    e
}

/// After the producer side failed: what the consumers said, if any said something within a moment.
fn with_consumer_failures(error: MeasurementError, children: &[ChildProcess]) -> MeasurementError {
    let said: Vec<String> = children
        .iter()
        .enumerate()
        .filter_map(|(i, child)| match recv_message(child, Duration::from_millis(300)) {
            Err(MeasurementError::Child { reason, .. }) => Some(format!("consumer {i}: {reason}")),
            _ => None,
        })
        .collect();
    if said.is_empty() { error } else { MeasurementError::Other(format!("{error} ({})", said.join("; "))) }
}

/// Collects every consumer's report and waits for it to exit.
pub(crate) fn collect_reports(children: &mut [ChildProcess]) -> Result<Vec<ConsumerReport>, MeasurementError> {
    let mut reports = Vec::with_capacity(children.len());
    for child in children.iter_mut() {
        reports.push(recv_report(child, SETUP_TIMEOUT)?);
        let status = child.wait(Duration::from_secs(10))?;
        if !status.success() {
            return Err(MeasurementError::Other(format!("a consumer exited with {status} after reporting")));
        }
    }
    Ok(reports)
}

/// The row's measurement from the producer's window and the consumers' reports.
pub(crate) fn measurement(
    cfg: &RunConfig,
    seconds: f64,
    producer_cpu_ns: u64,
    reports: &[ConsumerReport],
    mut notes: Vec<String>,
) -> Result<Measurement, MeasurementError> {
    let (histogram, mismatches, consumer_cpu, missing) =
        merge_consumers(reports).map_err(|e| MeasurementError::Other(format!("latency histogram: {e}")))?;
    if missing > 0 {
        notes.push(format!("{missing} frames had no publish time"));
    }
    for (i, r) in reports.iter().enumerate() {
        if r.measured_frames != cfg.frames {
            notes.push(format!("consumer {i} measured {} frames, not {}", r.measured_frames, cfg.frames));
        }
    }
    Ok(Measurement {
        frames: cfg.frames,
        seconds,
        fps: fps(cfg.frames, seconds),
        ratio_to_single_process: None,
        latency: histogram.summary(),
        producer_cpu_us_per_frame: cpu_us_per_frame(producer_cpu_ns, cfg.frames),
        consumer_cpu_us_per_frame: consumer_cpu,
        mismatches,
        bandwidth_gb_s: None,
        frame_gb_s: None,
        note: (!notes.is_empty()).then(|| notes.join("; ")),
    })
}

pub(crate) fn check_deadline(deadline: Instant, cfg: &RunConfig, seq: u64) -> Result<(), MeasurementError> {
    if Instant::now() >= deadline {
        return Err(MeasurementError::Wait(format!(
            "the row took longer than {:?} (stopped at frame {seq} of {})",
            cfg.row_timeout,
            cfg.total()
        )));
    }
    Ok(())
}

pub(crate) fn frame_error(e: FrameError) -> MeasurementError {
    match e {
        e @ FrameError::StrategyUnavailable { .. } => MeasurementError::Unavailable(e.to_string()),
        e => MeasurementError::Frames(e),
    }
}

pub(crate) fn base_plan(cfg: &RunConfig, spec: RowSpec, socket: Option<PathBuf>) -> ConsumerPlan {
    ConsumerPlan {
        spec,
        device: cfg.device,
        frame_bytes: cfg.frame_bytes(),
        frames_total: cfg.total(),
        warmup: cfg.warmup,
        socket,
        index: 0,
        frame_timeout_ms: frame_timeout_ms(cfg),
        expect_xor: None,
    }
}

pub(crate) fn frame_timeout_ms(cfg: &RunConfig) -> u64 {
    u64::try_from(cfg.frame_timeout.as_millis()).unwrap_or(u64::MAX)
}

/// Admits `count` consumers, in short bounded waits between which it looks for a child that failed to start (it
/// says why over its channel, or hangs up), so such a row fails at once instead of after the limit.
pub(crate) fn wait_for_consumers<B: Backend>(
    producer: &mut Producer<B>,
    count: usize,
    children: &[ChildProcess],
) -> Result<(), MeasurementError> {
    use gpu_ipc::core::wire::WireError;
    use harness::child::ChannelError;
    let deadline = Instant::now() + SETUP_TIMEOUT;
    loop {
        match producer.wait_for_consumers(count, Duration::from_millis(200)) {
            Ok(()) => return Ok(()),
            Err(FrameError::Timeout { what, .. }) => {
                for (i, child) in children.iter().enumerate() {
                    // Before it attached, a consumer sends nothing but a failure.
                    match recv_message(child, Duration::from_millis(1)) {
                        Err(MeasurementError::Channel(ChannelError::Wire(WireError::Timeout { .. }))) => {}
                        Err(e) => return Err(MeasurementError::Other(format!("consumer {i} did not attach: {e}"))),
                        Ok(other) => {
                            return Err(MeasurementError::Unexpected {
                                peer: "consumer",
                                expected: "attached",
                                got: format!("{other:?}"),
                            });
                        }
                    }
                }
                if Instant::now() >= deadline {
                    return Err(MeasurementError::Wait(format!("waited {SETUP_TIMEOUT:?} for {what}")));
                }
            }
            Err(e) => return Err(frame_error(e)),
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests;
