//! The doctor's end-to-end self-test of one backend, across two processes, through the real frame API: the same
//! `Producer`, `Consumer`, ring, watchdog and sync strategies an application uses.
//!
//! The parent creates a `Producer` (a 2048 x 2048 gray frame, two slots) on a fresh rendezvous socket in a private
//! directory and starts a copy of this binary as the consumer, a helper process (`gpu-ipc helper`, role
//! `doctor-self-test`, started by `harness::child` as every helper of the measurement tooling is). The child attaches with `Consumer::attach` (legacy: the 64-byte handle; VMM: the fd with `SCM_RIGHTS`),
//! then checks every word of each of [`FRAMES`] frames with a kernel against the pattern of its sequence number and
//! releases it; the parent fills each frame with a kernel and publishes it. This runs once with a CPU-side strategy
//! (`cpu-spin`) and, where the device has 64-bit stream memory operations, once with the GPU-side one
//! (`gpu-stream-ops`). The child answers over the helper channel: frames, mismatched words, attach time, or its
//! error with the fix, decided from the typed error (never from its text). Every step has a deadline: a child that
//! hangs is killed and reported.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use gpu_ipc::core::backend::{BackendError, GpuBackend};
use gpu_ipc::core::frames::{AttachOptions, Consumer, FrameError, Producer, ProducerConfig};
use gpu_ipc::core::wire::{FrameGeometry, PixelFormat, SyncStrategy, WireError};
use gpu_ipc::driver::{Context, DeviceBuffer, DeviceMemory, DriverError, Stream};
use gpu_ipc::kernels::launch::{KernelError, PatternKernels};
use gpu_ipc::{BackendKind, GpuBackendVisitor};
use harness::MeasurementError;
use harness::child::{Channel, ChannelError, ChildProcess, ChildTask};
use harness::gpu::GpuSetup;
use harness::process::PrivateDir;
use serde::{Deserialize, Serialize};

/// The frame: 2048 x 2048 bytes, two 2 MiB VMM granules.
const SIDE: u32 = 2048;
/// Frames each run moves.
pub const FRAMES: u64 = 8;
/// Slots of the self-test's ring.
const SLOTS: u32 = 2;

/// What one self-test found.
#[derive(Debug, Clone)]
pub struct SelfTestOutcome {
    /// True when every run moved every frame to the child with no mismatched word.
    pub passed: bool,
    /// What happened, in one line.
    pub detail: String,
    /// Why it failed.
    pub reason: Option<String>,
    /// What to do about it.
    pub fix: Option<String>,
    /// Wall time of the whole test.
    pub duration: Duration,
}

/// A failure with its fix.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
struct Failure {
    reason: String,
    fix: String,
}

impl Failure {
    fn new(reason: impl Into<String>, fix: impl Into<String>) -> Self {
        Self { reason: reason.into(), fix: fix.into() }
    }
}

impl From<FrameError> for Failure {
    fn from(e: FrameError) -> Self {
        Self { fix: fix_for(&e).to_owned(), reason: e.to_string() }
    }
}

impl From<KernelError> for Failure {
    fn from(e: KernelError) -> Self {
        let fix = match &e {
            KernelError::Driver(driver) => fix_for_driver(driver),
            _ => "rebuild the kernels for this GPU (scripts/gen-kernels.sh) or update the NVIDIA driver",
        };
        Self { reason: e.to_string(), fix: fix.to_owned() }
    }
}

impl From<DriverError> for Failure {
    fn from(e: DriverError) -> Self {
        Self { fix: fix_for_driver(&e).to_owned(), reason: e.to_string() }
    }
}

impl From<ChannelError> for Failure {
    fn from(e: ChannelError) -> Self {
        Self::new(
            format!("the self-test's child process: {e}"),
            "a process of the self-test could not be started or stalled: check the temporary directory and \
             `nvidia-smi` for stuck processes, and try again",
        )
    }
}

impl From<std::io::Error> for Failure {
    fn from(e: std::io::Error) -> Self {
        Self::new(
            e.to_string(),
            "the self-test's socket directory or child process could not be made: check the temporary directory",
        )
    }
}

/// The advice for a frame-API error, by its type.
fn fix_for(e: &FrameError) -> &'static str {
    match e {
        FrameError::Backend(BackendError::Unsupported { .. }) => {
            "use the other backend (the device table above says what this GPU supports)"
        }
        FrameError::Backend(BackendError::Driver(driver)) | FrameError::Driver(driver) => fix_for_driver(driver),
        FrameError::Backend(_) => "the two processes disagree on the handle: run the same gpu-ipc build on both sides",
        FrameError::StrategyUnavailable { .. } => "use another --sync strategy on this GPU",
        FrameError::Timeout { .. } | FrameError::PeerGone | FrameError::ProducerGone { .. } => {
            "a process of the self-test stalled or died: check `nvidia-smi` for stuck processes and try again"
        }
        FrameError::Refused(_) | FrameError::Wire(_) => {
            "the rendezvous socket could not be used: check that the temporary directory is writable and local"
        }
        _ => "run with -v for details and report the output of `gpu-ipc doctor --json`",
    }
}

/// The advice for a driver error, by the call that failed.
fn fix_for_driver(e: &DriverError) -> &'static str {
    match e {
        DriverError::LibraryNotFound { .. } => "install the NVIDIA driver",
        DriverError::Call { function, .. } => match *function {
            "cuIpcOpenMemHandle" => {
                "legacy IPC needs both processes on the same machine and PID namespace, and a GPU in Default compute \
                 mode; or use the vmm backend"
            }
            "cuIpcGetMemHandle" => "this memory cannot be exported as a legacy handle: use the vmm backend",
            "cuMemImportFromShareableHandle" | "cuMemExportToShareableHandle" | "cuMemCreate" => {
                "the fd was not accepted: check that both processes see the same GPU and driver, or use the legacy \
                 backend"
            }
            "cuDevicePrimaryCtxRetain" | "cuInit" | "cuCtxSetCurrent" => {
                "a second process could not create a CUDA context: check the compute mode (Exclusive Process allows \
                 one)"
            }
            "cuMemHostRegister" => "page-locking the control block was refused: raise the memlock limit (ulimit -l)",
            "cuStreamWaitValue64" | "cuStreamWriteValue64" => {
                "this GPU or driver lacks 64-bit stream memory operations: use a CPU-side --sync strategy"
            }
            _ => "run with -v for details and report the output of `gpu-ipc doctor --json`",
        },
        _ => "run with -v for details and report the output of `gpu-ipc doctor --json`",
    }
}

/// Runs the self-test of `backend` on device `ordinal`, giving the whole test `timeout`.
pub fn run(backend: BackendKind, ordinal: i32, timeout: Duration) -> SelfTestOutcome {
    let start = Instant::now();
    let result = gpu_ipc::dispatch_gpu(backend, Parent { backend, ordinal, deadline: start + timeout })
        .unwrap_or_else(|e| Err(Failure::new(e.to_string(), "choose a GPU backend compiled into this build")));
    let duration = start.elapsed();
    match result {
        Ok(detail) => SelfTestOutcome { passed: true, detail, reason: None, fix: None, duration },
        Err(f) => SelfTestOutcome {
            passed: false,
            detail: format!("{backend} self-test failed"),
            reason: Some(f.reason),
            fix: Some(f.fix),
            duration,
        },
    }
}

struct Parent {
    backend: BackendKind,
    ordinal: i32,
    deadline: Instant,
}

fn remaining(deadline: Instant) -> Duration {
    deadline.saturating_duration_since(Instant::now()).max(Duration::from_millis(1))
}

/// The self-test's first strategy, deliberately not [`SyncStrategy::DEFAULT`]: the first one whose waits the CPU
/// does and that needs no CUDA feature (so no MPS, no stream memory operations), so it runs on every device and
/// tells a broken ring from a missing feature.
fn cpu_strategy() -> SyncStrategy {
    SyncStrategy::ALL.into_iter().find(|s| !s.is_gpu_side() && !s.needs_cuda()).unwrap_or(SyncStrategy::CpuSpin)
}

/// The strategies the self-test runs on this device: one CPU-side, and the GPU-side one where the strategy itself
/// says it is available ([`SyncStrategy::check_available`]).
fn strategies(ctx: &Context) -> Vec<SyncStrategy> {
    let mut list = vec![cpu_strategy()];
    if SyncStrategy::GpuStreamOps.check_available(Some(ctx)).is_ok() {
        list.push(SyncStrategy::GpuStreamOps);
    }
    list
}

impl GpuBackendVisitor for Parent {
    type Output = Result<String, Failure>;
    fn visit<B: GpuBackend>(self) -> Self::Output {
        let Parent { backend, ordinal, deadline } = self;
        let ctx = Context::for_ordinal(ordinal)?;
        B::check_support(&ctx).map_err(FrameError::from)?;
        let gpu = GpuSetup::in_context(ctx)?;
        let geometry = FrameGeometry::new(SIDE, SIDE, PixelFormat::Gray8).map_err(FrameError::from)?;
        let dir = PrivateDir::new("doctor")?;
        let mut lines = Vec::new();
        for (i, sync) in strategies(gpu.context()).into_iter().enumerate() {
            let socket = dir.path().join(format!("self-test-{i}.sock"));
            let config = ProducerConfig::new(&socket, geometry, SLOTS, sync);
            let mut producer = Producer::<B>::create(gpu.context(), config)?;
            let task = DoctorTask::SelfTest { backend, sync, device: ordinal, socket };
            let mut child = ChildProcess::spawn(&task.envelope()?, &[], remaining(deadline))?;
            let moved = publish_frames(&mut producer, gpu.kernels(), gpu.stream(), deadline);
            let report = finish_child(&mut child, deadline);
            let report = match (moved, report) {
                (_, Err(child_failure)) => return Err(child_failure),
                (Err(parent_failure), Ok(_)) => return Err(parent_failure),
                (Ok(()), Ok(report)) => report,
            };
            if report.frames != FRAMES || report.mismatches != 0 {
                return Err(Failure::new(
                    format!(
                        "{}: the child checked {} of {FRAMES} frames and found {} mismatched words: the import maps \
                         other memory than was exported, or frames were overwritten while it read them",
                        sync.name(),
                        report.frames,
                        report.mismatches
                    ),
                    "report this with the output of `gpu-ipc doctor --json`",
                ));
            }
            lines.push(format!(
                "{}: pid {} attached in {:.2} ms and verified {FRAMES} frames ({} MiB each)",
                sync.name(),
                child.id(),
                report.attach_ms,
                geometry.frame_bytes() >> 20
            ));
        }
        Ok(lines.join("; "))
    }
}

/// Waits for the child to attach, then fills and publishes [`FRAMES`] frames and waits until it released them.
fn publish_frames<B: GpuBackend>(
    producer: &mut Producer<B>,
    kernels: &PatternKernels,
    stream: &Stream,
    deadline: Instant,
) -> Result<(), Failure> {
    producer.wait_for_consumers(1, remaining(deadline))?;
    for _ in 0..FRAMES {
        let lease = producer.acquire(Some(stream), remaining(deadline))?;
        let span = producer.slot_span(&lease)?;
        kernels.fill(stream, span, lease.seq().0)?;
        producer.publish(lease, Some(stream))?;
    }
    producer.drain(Some(stream), remaining(deadline))?;
    Ok(())
}

/// The child's answer, as its one line of JSON.
#[derive(Debug, serde::Serialize, serde::Deserialize)]
#[serde(untagged)]
enum ChildLine {
    Done(ChildReport),
    Failed(Failure),
}

#[derive(Debug, serde::Serialize, serde::Deserialize)]
struct ChildReport {
    frames: u64,
    mismatches: u64,
    attach_ms: f64,
}

fn finish_child(child: &mut ChildProcess, deadline: Instant) -> Result<ChildReport, Failure> {
    let answer = child.channel().recv_plain::<ChildLine>(remaining(deadline));
    let status = child.wait(remaining(deadline).max(Duration::from_secs(1)));
    match (answer, status) {
        (Ok(ChildLine::Done(report)), Ok(status)) if status.success() => Ok(report),
        (Ok(ChildLine::Failed(f)), _) => Err(Failure::new(format!("in the child process: {}", f.reason), f.fix)),
        (Ok(ChildLine::Done(_)), Ok(status)) => Err(Failure::new(
            format!("the child process reported, then ended with {status}"),
            "run with -v for details and report the output of `gpu-ipc doctor --json`",
        )),
        (Err(ChannelError::Wire(WireError::Timeout { .. })), _) | (_, Err(ChannelError::Timeout { .. })) => {
            Err(Failure::new(
                "the self-test timed out waiting for the child process",
                "a process of the self-test stalled: check `nvidia-smi` for stuck processes and try again",
            ))
        }
        (Err(e), _) | (Ok(ChildLine::Done(_)), Err(e)) => Err(Failure::new(
            format!("the child process ended without a readable report: {e}"),
            "the child is another version of gpu-ipc: rebuild and run again",
        )),
    }
}

/// What the doctor asks of a helper process (the envelope is [`ChildTask`]).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "role", content = "params")]
enum DoctorTask {
    /// The consumer of one self-test run.
    #[serde(rename = "doctor-self-test")]
    SelfTest {
        /// The backend under test.
        backend: BackendKind,
        /// The run's strategy.
        sync: SyncStrategy,
        /// The device.
        device: i32,
        /// The producer's rendezvous socket.
        socket: PathBuf,
    },
}

impl DoctorTask {
    fn envelope(&self) -> Result<ChildTask, Failure> {
        ChildTask::of(self).map_err(|e| {
            Failure::new(format!("the self-test's task: {e}"), "report this with the output of `gpu-ipc doctor --json`")
        })
    }
}

/// The prefix of the doctor's helper roles (`doctor-self-test`).
pub const ROLE_PREFIX: &str = "doctor-";

/// The doctor's helper processes: the consumer of a self-test run. It answers over `channel` with its report, or
/// with its failure and the fix (and then still exits 0: the answer is the outcome, not the exit status).
///
/// # Errors
/// A task that is not the doctor's, or an answer that could not be sent.
pub fn child(task: ChildTask, channel: &Channel) -> Result<(), MeasurementError> {
    let DoctorTask::SelfTest { backend, sync, device, socket } =
        task.decode().map_err(|source| MeasurementError::Malformed { what: "doctor task".to_owned(), source })?;
    let side = ChildSide { ordinal: device, sync, socket };
    let result = gpu_ipc::dispatch_gpu(backend, side)
        .unwrap_or_else(|e| Err(Failure::new(e.to_string(), "choose a GPU backend compiled into this build")));
    let line = match result {
        Ok(report) => ChildLine::Done(report),
        Err(f) => ChildLine::Failed(f),
    };
    channel.send(&line, Vec::new())?;
    Ok(())
}

struct ChildSide {
    ordinal: i32,
    sync: SyncStrategy,
    socket: PathBuf,
}

impl GpuBackendVisitor for ChildSide {
    type Output = Result<ChildReport, Failure>;
    fn visit<B: GpuBackend>(self) -> Self::Output {
        let deadline = Instant::now() + Duration::from_secs(30);
        let gpu = GpuSetup::open(self.ordinal)?;
        let (ctx, kernels, stream) = (gpu.context(), gpu.kernels(), gpu.stream());
        let counter = DeviceBuffer::alloc(ctx, 8)?;
        counter.write(0, &[0u64])?;
        let options = AttachOptions { name: "gpu-ipc doctor self-test".into(), ..AttachOptions::default() };
        let started = Instant::now();
        let mut consumer = loop {
            match Consumer::<B>::attach(ctx, &self.socket, &options) {
                Ok(consumer) => break consumer,
                Err(FrameError::Wire(WireError::NoProducer { .. })) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(5));
                }
                Err(e) => return Err(e.into()),
            }
        };
        let attach_ms = started.elapsed().as_secs_f64() * 1e3;
        if consumer.offer().sync != self.sync {
            return Err(Failure::new(
                format!("the producer offered {:?}, the self-test asked for {:?}", consumer.offer().sync, self.sync),
                "the child is another version of gpu-ipc: rebuild and run again",
            ));
        }
        let mut frames = 0;
        while frames < FRAMES {
            let frame = consumer.next_frame(Some(stream), remaining(deadline))?;
            let span = consumer.frame_span(&frame)?;
            kernels.verify(stream, span, frame.seq().0, counter.span())?;
            consumer.release(frame, Some(stream))?;
            frames += 1;
        }
        stream.synchronize()?;
        let mut mismatches = [0u64];
        counter.read(0, &mut mismatches)?;
        consumer.detach();
        Ok(ChildReport { frames, mismatches: mismatches[0], attach_ms })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fixes_come_from_the_error_type() {
        let missing = FrameError::Driver(DriverError::LibraryNotFound {
            library: "libcuda.so.1".into(),
            reason: "not found".into(),
        });
        assert_eq!(fix_for(&missing), "install the NVIDIA driver");
        let unavailable = FrameError::StrategyUnavailable { strategy: "gpu-stream-ops".into(), reason: "no".into() };
        assert!(fix_for(&unavailable).contains("--sync"));
        let timeout = FrameError::Timeout { what: "a frame".into(), waited: Duration::from_secs(1) };
        assert!(fix_for(&timeout).contains("nvidia-smi"));
    }

    #[test]
    fn the_task_travels_as_the_doctors_role() {
        for sync in SyncStrategy::ALL {
            let task = DoctorTask::SelfTest { backend: BackendKind::Vmm, sync, device: 1, socket: "/tmp/s".into() };
            let envelope = task.envelope().unwrap_or_else(|f| panic!("{}", f.reason));
            assert_eq!(envelope.role, "doctor-self-test");
            assert!(envelope.role.starts_with(ROLE_PREFIX));
            let DoctorTask::SelfTest { sync: back, device, .. } = envelope.decode().unwrap_or_else(|e| panic!("{e}"));
            assert_eq!((back, device), (sync, 1));
        }
    }

    #[test]
    fn the_childs_line_is_a_report_or_a_failure() {
        let done: ChildLine =
            serde_json::from_str(r#"{"frames":8,"mismatches":0,"attach_ms":1.5}"#).unwrap_or_else(|e| panic!("{e}"));
        assert!(matches!(done, ChildLine::Done(ChildReport { frames: 8, mismatches: 0, .. })));
        let failed: ChildLine =
            serde_json::from_str(r#"{"reason":"cuIpcOpenMemHandle failed","fix":"use the vmm backend"}"#)
                .unwrap_or_else(|e| panic!("{e}"));
        assert!(matches!(failed, ChildLine::Failed(_)));
    }
}
