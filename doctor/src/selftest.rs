//! The doctor's end-to-end self-test of one backend, across two processes, through the real frame API: the same
//! `Producer`, `Consumer`, ring, watchdog and sync strategies an application uses.
//!
//! The parent creates a `Producer` (a 2048 x 2048 gray frame, two slots) on a fresh rendezvous socket in a private
//! directory and starts a copy of this binary as the consumer (`gpu-ipc doctor --self-test-child BACKEND --socket
//! PATH`). The child attaches with `Consumer::attach` (legacy: the 64-byte handle; VMM: the fd with `SCM_RIGHTS`),
//! then checks every word of each of [`FRAMES`] frames with a kernel against the pattern of its sequence number and
//! releases it; the parent fills each frame with a kernel and publishes it. This runs once with a CPU-side strategy
//! (`cpu-spin`) and, where the device has 64-bit stream memory operations, once with the GPU-side one
//! (`gpu-stream-ops`). The child prints one JSON line: frames, mismatched words, attach time, or its error with the
//! fix, decided from the typed error (never from its text). Every step has a deadline: a child that hangs is killed
//! and reported.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use gpu_ipc::core::backend::{BackendError, GpuBackend};
use gpu_ipc::core::frames::{AttachOptions, Consumer, FrameError, Producer, ProducerConfig};
use gpu_ipc::core::wire::{FrameGeometry, PixelFormat, SyncStrategy, WireError};
use gpu_ipc::driver::{Context, DeviceBuffer, DeviceFeature, DeviceMemory, DriverError, Stream};
use gpu_ipc::kernels::launch::{KernelError, PatternKernels};
use gpu_ipc::{BackendKind, GpuBackendVisitor};

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

/// The strategies the self-test runs on this device: one CPU-side, and the GPU-side one where it is available.
fn strategies(ctx: &Context) -> Vec<SyncStrategy> {
    let mut list = vec![cpu_strategy()];
    if ctx.device().supports(DeviceFeature::StreamMemOps64).unwrap_or(false) {
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
        let kernels = PatternKernels::load(&ctx)?;
        let stream = Stream::new(&ctx)?;
        let geometry = FrameGeometry::new(SIDE, SIDE, PixelFormat::Gray8).map_err(FrameError::from)?;
        let dir = PrivateDir::create()?;
        let mut lines = Vec::new();
        for (i, sync) in strategies(&ctx).into_iter().enumerate() {
            let socket = dir.path().join(format!("self-test-{i}.sock"));
            let config = ProducerConfig::new(&socket, geometry, SLOTS, sync);
            let mut producer = Producer::<B>::create(&ctx, config)?;
            let mut child = spawn_child(backend, ordinal, sync, &socket)?;
            let moved = publish_frames(&mut producer, &kernels, &stream, deadline);
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

fn spawn_child(backend: BackendKind, ordinal: i32, sync: SyncStrategy, socket: &Path) -> Result<Child, Failure> {
    let exe = std::env::current_exe()?;
    let child = Command::new(exe)
        .arg("doctor")
        .arg("--self-test-child")
        .arg(backend.name())
        .arg("--self-test-sync")
        .arg(sync.name())
        .arg("--device")
        .arg(ordinal.to_string())
        .arg("--socket")
        .arg(socket)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()?;
    Ok(child)
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

fn finish_child(child: &mut Child, deadline: Instant) -> Result<ChildReport, Failure> {
    loop {
        if let Some(status) = child.try_wait()? {
            let (mut stdout, mut stderr) = (String::new(), String::new());
            if let Some(mut pipe) = child.stdout.take() {
                let _ = pipe.read_to_string(&mut stdout);
            }
            if let Some(mut pipe) = child.stderr.take() {
                let _ = pipe.read_to_string(&mut stderr);
            }
            return match serde_json::from_str::<ChildLine>(stdout.trim()) {
                Ok(ChildLine::Done(report)) if status.success() => Ok(report),
                Ok(ChildLine::Failed(f)) => {
                    Err(Failure::new(format!("in the child process ({status}): {}", f.reason), f.fix))
                }
                _ => Err(Failure::new(
                    format!("the child process ended ({status}) without a readable report: {}", stderr.trim()),
                    "the child is another version of gpu-ipc: rebuild and run again",
                )),
            };
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            return Err(Failure::new(
                "the self-test timed out waiting for the child process",
                "a process of the self-test stalled: check `nvidia-smi` for stuck processes and try again",
            ));
        }
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// The child side: `gpu-ipc doctor --self-test-child BACKEND --self-test-sync SYNC --socket PATH`. Prints one JSON
/// line (its report, or its failure with the fix) and returns the process exit status.
pub fn child_main(backend: BackendKind, sync: Option<SyncStrategy>, ordinal: i32, socket: Option<&Path>) -> u8 {
    let Some(socket) = socket else {
        eprintln!("gpu-ipc: --self-test-child is internal to `gpu-ipc doctor` and needs --socket");
        return 2;
    };
    let sync = sync.unwrap_or_else(cpu_strategy);
    let child = ChildSide { ordinal, sync, socket: socket.to_path_buf() };
    let result = gpu_ipc::dispatch_gpu(backend, child)
        .unwrap_or_else(|e| Err(Failure::new(e.to_string(), "choose a GPU backend compiled into this build")));
    let (line, code) = match result {
        Ok(report) => (ChildLine::Done(report), 0),
        Err(f) => (ChildLine::Failed(f), 1),
    };
    match serde_json::to_string(&line) {
        Ok(text) => println!("{text}"),
        Err(e) => eprintln!("gpu-ipc: {e}"),
    }
    code
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
        let ctx = Context::for_ordinal(self.ordinal)?;
        let kernels = PatternKernels::load(&ctx)?;
        let stream = Stream::new(&ctx)?;
        let counter = DeviceBuffer::alloc(&ctx, 8)?;
        counter.write(0, &[0u64])?;
        let options = AttachOptions { name: "gpu-ipc doctor self-test".into(), ..AttachOptions::default() };
        let started = Instant::now();
        let mut consumer = loop {
            match Consumer::<B>::attach(&ctx, &self.socket, &options) {
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
            let frame = consumer.next_frame(Some(&stream), remaining(deadline))?;
            let span = consumer.frame_span(&frame)?;
            kernels.verify(&stream, span, frame.seq().0, counter.span())?;
            consumer.release(frame, Some(&stream))?;
            frames += 1;
        }
        stream.synchronize()?;
        let mut mismatches = [0u64];
        counter.read(0, &mut mismatches)?;
        consumer.detach();
        Ok(ChildReport { frames, mismatches: mismatches[0], attach_ms })
    }
}

/// A directory only this user can enter, removed on drop: where the self-test's sockets live.
struct PrivateDir(PathBuf);

impl PrivateDir {
    fn create() -> std::io::Result<Self> {
        let base = std::env::var_os("XDG_RUNTIME_DIR").map_or_else(std::env::temp_dir, PathBuf::from);
        let path = base.join(format!("gpu-ipc-doctor-{}-{}", std::process::id(), nanos()));
        std::fs::DirBuilder::new().mode(0o700).create(&path)?;
        Ok(Self(path))
    }

    fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for PrivateDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn nanos() -> u128 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos()).unwrap_or(0)
}

use std::os::unix::fs::DirBuilderExt;

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
    fn strategies_round_trip_through_their_names() {
        // The parent passes `sync.name()`; the child's `--self-test-sync` parses it back.
        for sync in SyncStrategy::ALL {
            assert_eq!(sync.name().parse::<SyncStrategy>().ok(), Some(sync));
        }
        assert!("nonsense".parse::<SyncStrategy>().is_err());
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
