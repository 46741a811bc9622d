//! The doctor's end-to-end self-test of one backend, across two processes, over the real rendezvous protocol.
//!
//! The parent allocates exportable memory, fills it with the pattern of one sequence number (a kernel), listens on
//! a fresh rendezvous socket (mode 0600, peer credentials checked) and starts a copy of this binary as the child
//! (`gpu-ipc doctor --self-test-child BACKEND --socket PATH`). The child connects and says hello; the parent sends a
//! one-slot `RingOffer` with the handle (legacy: 64 bytes in the message; VMM: the file descriptor, with
//! `SCM_RIGHTS`) and a control memfd; the child imports, counts mismatched words with a kernel, overwrites the
//! memory with the pattern of the next sequence number, answers `Attached`, prints its result as one JSON line and
//! exits; the parent then checks the child's pattern. Every step has a deadline: a child that hangs is killed and
//! reported, never waited for forever.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use gpu_ipc::core::backend::{Backend, ExportedHandle, SharedRegion};
use gpu_ipc::core::driver::{Context, Stream};
use gpu_ipc::core::wire::{
    Attached, ClientHello, FrameGeometry, Message, PROTOCOL_VERSION, PeerConnection, PixelFormat, RendezvousListener,
    RingOffer, SyncStrategy,
};
use gpu_ipc::kernels::launch::PatternKernels;
use gpu_ipc::{BackendChoice, BackendVisitor};

/// Bytes shared by the self-test: two 2 MiB VMM granules (a 2048 x 2048 gray frame).
const SIDE: u32 = 2048;
/// The sequence number whose pattern the parent writes.
const SEQ_PARENT: u64 = 0x5eed_0001;
/// The sequence number whose pattern the child writes.
const SEQ_CHILD: u64 = 0x5eed_0002;
/// Size of the (unused) control memfd the offer carries.
const CONTROL_BYTES: u64 = 4096;

/// What one self-test found.
#[derive(Debug, Clone)]
pub struct SelfTestOutcome {
    /// True when the child read the parent's pattern and the parent read the child's, both without a mismatch.
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
struct Failure {
    reason: String,
    fix: String,
}

impl<E: std::fmt::Display> From<E> for Failure {
    fn from(e: E) -> Self {
        let reason = e.to_string();
        let fix = fix_for(&reason);
        Self { reason, fix }
    }
}

/// The advice for a failure message; the specific causes first.
fn fix_for(reason: &str) -> String {
    let advice = if reason.contains("no CUDA driver") {
        "install the NVIDIA driver"
    } else if reason.contains("VMM (cuMemCreate) allocation") || reason.contains("use the vmm backend") {
        "use the vmm backend"
    } else if reason.contains("CUDA_ERROR_NOT_SUPPORTED") || reason.contains(" backend: ") {
        "use the other backend (the device table above says what this GPU supports)"
    } else if reason.contains("cuIpcOpenMemHandle") {
        "legacy IPC needs both processes on the same machine and PID namespace, and a GPU in Default compute mode; \
         or use the vmm backend"
    } else if reason.contains("cuMemImportFromShareableHandle") {
        "the fd was not accepted: check that both processes see the same GPU and driver"
    } else if reason.contains("cuDevicePrimaryCtxRetain") || reason.contains("cuInit") {
        "a second process could not create a CUDA context: check the compute mode (Exclusive Process allows one)"
    } else if reason.contains("timed out") || reason.contains("Timeout") {
        "the child process hung: check `nvidia-smi` for a stuck process and try again"
    } else if reason.contains("permission") || reason.contains("Permission") {
        "the rendezvous socket could not be created or reached: check that the temporary directory is writable"
    } else {
        "run with -v for details and report the output of `gpu-ipc doctor --json`"
    };
    advice.to_owned()
}

/// Runs the self-test of `backend` on device `ordinal`, giving the whole test `timeout`.
pub fn run(backend: BackendChoice, ordinal: i32, timeout: Duration) -> SelfTestOutcome {
    let start = Instant::now();
    let result = backend.dispatch(Parent { backend, ordinal, deadline: start + timeout });
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
    backend: BackendChoice,
    ordinal: i32,
    deadline: Instant,
}

fn remaining(deadline: Instant) -> Duration {
    deadline.saturating_duration_since(Instant::now()).max(Duration::from_millis(1))
}

impl BackendVisitor for Parent {
    type Output = Result<String, Failure>;
    fn visit<B: Backend<Context = Context>>(self) -> Self::Output {
        let Parent { backend, ordinal, deadline } = self;
        let ctx = Context::for_ordinal(ordinal)?;
        B::check_support(&ctx)?;
        let kernels = PatternKernels::load(&ctx)?;
        let stream = Stream::new(&ctx)?;
        let geometry = FrameGeometry::new(SIDE, SIDE, PixelFormat::Gray8)?;
        let region = B::allocate(&ctx, geometry.frame_bytes())?;
        kernels.fill(&stream, region.ptr(), region.len(), SEQ_PARENT)?;
        stream.synchronize()?;

        let dir = PrivateDir::create()?;
        let socket = dir.path().join("self-test.sock");
        let listener = RendezvousListener::bind(&socket)?;
        let mut child = spawn_child(backend, ordinal, &socket)?;
        let exchanged = handshake::<B>(&listener, &ctx, &region, geometry, deadline);
        let report = finish_child(&mut child, deadline);
        exchanged?;
        let report = report?;
        if report.mismatches != 0 {
            return Err(Failure {
                reason: format!(
                    "the child read {} of {} words wrong: the import maps other memory than was exported",
                    report.mismatches,
                    region.len() / 4
                ),
                fix: "report this with the output of `gpu-ipc doctor --json`".into(),
            });
        }
        let wrong = kernels.count_mismatches(&stream, region.ptr(), region.len(), SEQ_CHILD)?;
        if wrong != 0 {
            return Err(Failure {
                reason: format!("{wrong} words the child wrote were not visible to the exporter"),
                fix: "report this with the output of `gpu-ipc doctor --json`".into(),
            });
        }
        Ok(format!(
            "pid {} imported {} MiB in {:.2} ms, read the exporter's pattern and wrote its own; both verified",
            child.id(),
            region.len() >> 20,
            report.import_ms
        ))
    }
}

fn handshake<B: Backend<Context = Context>>(
    listener: &RendezvousListener,
    ctx: &Context,
    region: &B::Exported,
    geometry: FrameGeometry,
    deadline: Instant,
) -> Result<(), Failure> {
    let conn = listener.accept(remaining(deadline))?;
    match conn.recv(remaining(deadline))?.message {
        Message::ClientHello(_) => {}
        other => return Err(format!("expected the child's hello, got {other:?}").into()),
    }
    let exported = B::export(region)?;
    let control = rustix::fs::memfd_create("gpu-ipc-self-test", rustix::fs::MemfdFlags::CLOEXEC)?;
    rustix::fs::ftruncate(&control, CONTROL_BYTES)?;
    let legacy_mem_handle = match exported.bytes.len() {
        0 => None,
        64 => Some(<[u8; 64]>::try_from(exported.bytes.as_slice()).map_err(|_| "64-byte handle")?),
        n => return Err(format!("a legacy handle of {n} bytes").into()),
    };
    let uuid = ctx.device().uuid()?;
    let offer = RingOffer {
        backend: B::KIND,
        handle_type: B::KIND.handle_type(),
        sync: SyncStrategy::CpuSpin,
        device_uuid: uuid,
        producer_pid: std::process::id(),
        generation: 1,
        consumer_id: 0,
        geometry,
        slot_count: 1,
        slot_stride_bytes: geometry.frame_bytes(),
        data_offset: 0,
        allocation_bytes: exported.size,
        granularity: 1 << exported.size.trailing_zeros().min(21),
        control_bytes: CONTROL_BYTES,
        legacy_mem_handle,
        event_handles: Vec::new(),
    };
    let mut fds = vec![control];
    fds.extend(exported.fd);
    // `send` closes our copies of the fds once they are sent: the exporter keeps none.
    conn.send(&Message::RingOffer(offer), fds, remaining(deadline))?;
    match conn.recv(remaining(deadline))?.message {
        Message::Attached(Attached { consumer_id: 0 }) => Ok(()),
        other => Err(format!("expected Attached from the child, got {other:?}").into()),
    }
}

fn spawn_child(backend: BackendChoice, ordinal: i32, socket: &Path) -> Result<Child, Failure> {
    let exe = std::env::current_exe()?;
    let child = Command::new(exe)
        .arg("doctor")
        .arg("--self-test-child")
        .arg(backend.name())
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
struct ChildReport {
    mismatches: u64,
    import_ms: f64,
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
            if !status.success() {
                let text = stderr.trim().trim_start_matches("gpu-ipc: ").to_owned();
                let fix = fix_for(&text);
                return Err(Failure { reason: format!("in the child process ({status}): {text}"), fix });
            }
            return serde_json::from_str(stdout.trim()).map_err(|e| Failure {
                reason: format!("the child's report was not readable ({e}): {stdout:?}"),
                fix: "the child is another version of gpu-ipc: rebuild and run again".into(),
            });
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            return Err(Failure {
                reason: "the self-test timed out waiting for the child process".into(),
                fix: fix_for("timed out"),
            });
        }
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// The child side: `gpu-ipc doctor --self-test-child BACKEND --socket PATH`. Returns the process exit status.
pub fn child_main(backend: BackendChoice, ordinal: i32, socket: Option<&Path>) -> u8 {
    let Some(socket) = socket else {
        eprintln!("gpu-ipc: --self-test-child is internal to `gpu-ipc doctor` and needs --socket");
        return 2;
    };
    match backend.dispatch(ChildSide { ordinal, socket: socket.to_path_buf() }) {
        Ok(report) => match serde_json::to_string(&report) {
            Ok(line) => {
                println!("{line}");
                0
            }
            Err(e) => {
                eprintln!("gpu-ipc: {e}");
                1
            }
        },
        Err(f) => {
            eprintln!("gpu-ipc: {}", f.reason);
            1
        }
    }
}

struct ChildSide {
    ordinal: i32,
    socket: PathBuf,
}

impl BackendVisitor for ChildSide {
    type Output = Result<ChildReport, Failure>;
    fn visit<B: Backend<Context = Context>>(self) -> Self::Output {
        let deadline = Instant::now() + Duration::from_secs(30);
        let ctx = Context::for_ordinal(self.ordinal)?;
        let kernels = PatternKernels::load(&ctx)?;
        let stream = Stream::new(&ctx)?;
        let conn = PeerConnection::connect(&self.socket, remaining(deadline))?;
        let hello = ClientHello {
            protocol_version: PROTOCOL_VERSION,
            client_pid: std::process::id(),
            wanted_backend: Some(B::KIND),
            consumer_name: "gpu-ipc doctor self-test".into(),
        };
        conn.send(&Message::ClientHello(hello), Vec::new(), remaining(deadline))?;
        let (offer, fds) = conn.recv(remaining(deadline))?.into_ring_offer()?;
        let handle = ExportedHandle {
            bytes: offer.legacy_mem_handle.map(|h| h.to_vec()).unwrap_or_default(),
            fd: fds.data,
            size: offer.allocation_bytes,
        };
        let started = Instant::now();
        let region = B::import(&ctx, handle)?;
        let import_ms = started.elapsed().as_secs_f64() * 1e3;
        let bytes = offer.geometry.frame_bytes();
        let mismatches = kernels.count_mismatches(&stream, region.ptr(), bytes, SEQ_PARENT)?;
        kernels.fill(&stream, region.ptr(), bytes, SEQ_CHILD)?;
        stream.synchronize()?;
        conn.send(&Message::Attached(Attached { consumer_id: offer.consumer_id }), Vec::new(), remaining(deadline))?;
        Ok(ChildReport { mismatches, import_ms })
    }
}

/// A directory only this user can enter, removed on drop: where the self-test's socket lives.
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
