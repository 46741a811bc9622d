//! The other process of a cross-process bench: the bench binary runs itself again with [`ROLE_ENV`] set to a
//! [`Role`] (as JSON), the way the repository's cross-process tests re-run their own binary. A helper says
//! `ready` on stdout once its socket exists, and leaves when its stdin closes (the bench ended or died).
//!
//! Legacy CUDA IPC needs this: `cuIpcOpenMemHandle` refuses a handle exported by the calling process, so imported
//! memory can only be measured against an allocation another process made. Both backends go through the same
//! path (a [`Producer`] in the helper, a [`Consumer`] in the bench), so imported memory is measured as consumers
//! see it.

use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, ExitCode, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use gpu_ipc::core::backend::{Backend, GpuBackend};
use gpu_ipc::core::frames::{AttachOptions, Consumer, FrameError, Producer, ProducerConfig};
use gpu_ipc::core::wire::{FrameGeometry, SyncStrategy, WireError};
use gpu_ipc::driver::{Context, Stream};
use gpu_ipc::{BackendKind, GpuBackendVisitor};
use gpu_ipc_kernels::persistent::PersistentVerify;
use serde::{Deserialize, Serialize};

/// The environment variable that makes a bench binary a helper process.
pub const ROLE_ENV: &str = "GPU_IPC_BENCH_ROLE";

/// Bound on each wait of a helper and of the bench's own calls against it.
pub const WAIT: Duration = Duration::from_secs(30);

/// What a helper process does.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "role", rename_all = "kebab-case")]
pub enum Role {
    /// A producer that only admits consumers, as fast as it can: its ring is the imported memory the memory bench
    /// measures, and what the attach bench attaches to.
    Exporter {
        /// The backend that allocates and exports the ring.
        backend: BackendKind,
        /// The strategy it offers.
        sync: SyncStrategy,
        /// Where it listens.
        socket: PathBuf,
        /// Each frame's layout.
        geometry: FrameGeometry,
        /// Ring slots.
        slots: u32,
        /// CUDA device ordinal.
        device: i32,
    },
    /// The far end of the signal ping-pong: consumes each frame of ring `ping` and answers it with a frame on its
    /// own ring `pong` (one slot each).
    Echo {
        /// The backend of both rings.
        backend: BackendKind,
        /// The strategy of both rings.
        sync: SyncStrategy,
        /// The bench's ring, which this helper consumes.
        ping: PathBuf,
        /// This helper's ring, which the bench consumes.
        pong: PathBuf,
        /// CUDA device ordinal.
        device: i32,
    },
    /// A persistent kernel on the ring's device API (`gpu_ipc_kernels::persistent`) that consumes every frame of
    /// ring `ping` (one slot) and releases it, with no launch and no CPU work per frame.
    PersistentSink {
        /// The backend of the ring.
        backend: BackendKind,
        /// The bench's ring, which this helper's kernel consumes.
        ping: PathBuf,
        /// CUDA device ordinal.
        device: i32,
    },
}

/// A frame of `bytes` bytes (a multiple of 4): one row of RGBA pixels.
///
/// # Errors
/// A size that is 0, not a multiple of 4, or over 4 GiB.
pub fn flat_geometry(bytes: u64) -> Result<FrameGeometry, String> {
    if bytes == 0 || !bytes.is_multiple_of(4) {
        return Err(format!("a flat frame of {bytes} bytes: need a non-zero multiple of 4"));
    }
    let width = u32::try_from(bytes / 4).map_err(|_| format!("a flat frame of {bytes} bytes is over 16 GiB"))?;
    FrameGeometry::new(width, 1, gpu_ipc::core::wire::PixelFormat::Rgba8).map_err(|e| e.to_string())
}

/// A socket path unique to this process and `tag`.
pub fn socket_path(tag: &str) -> PathBuf {
    std::env::temp_dir().join(format!("gpu-ipc-bench-{}-{tag}.sock", std::process::id()))
}

/// A strategy by the name `--sync` takes (`cpu-spin`, ...).
pub fn strategy_by_name(name: &str) -> Option<SyncStrategy> {
    name.parse().ok()
}

/// A running helper process; dropping it closes its stdin (which tells it to leave), then waits for it.
pub struct Helper {
    child: Child,
    stdin: Option<ChildStdin>,
    name: String,
}

impl Helper {
    /// Starts this binary again as `role` and waits (up to [`WAIT`]) for it to say `ready`.
    ///
    /// # Errors
    /// It could not start, died, or did not get ready in time (its stderr, inherited, says why).
    pub fn spawn(name: &str, role: &Role) -> Result<Self, String> {
        let exe = std::env::current_exe().map_err(|e| format!("{name}: which binary am I? {e}"))?;
        let json = serde_json::to_string(role).map_err(|e| format!("{name}: {e}"))?;
        let mut child = Command::new(exe)
            .env(ROLE_ENV, json)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .map_err(|e| format!("{name}: could not start the helper process: {e}"))?;
        let stdin = child.stdin.take();
        let stdout = child.stdout.take();
        let mut helper = Self { child, stdin, name: name.to_owned() };
        let (tx, rx) = mpsc::channel();
        if let Some(stdout) = stdout {
            std::thread::spawn(move || {
                for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                    let _ = tx.send(line);
                }
            });
        }
        let deadline = Instant::now() + WAIT;
        loop {
            match rx.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
                Ok(line) if line == "ready" => return Ok(helper),
                Ok(_) => {}
                Err(_) => {
                    let status = helper.child.try_wait().ok().flatten();
                    helper.stop();
                    return Err(match status {
                        Some(status) => format!("{name}: the helper exited ({status}) before it was ready"),
                        None => format!("{name}: the helper was not ready within {WAIT:?}"),
                    });
                }
            }
        }
    }

    /// The helper's pid.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    fn stop(&mut self) {
        drop(self.stdin.take());
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if let Ok(Some(status)) = self.child.try_wait() {
                if !status.success() {
                    eprintln!("{}: the helper exited with {status}", self.name);
                }
                return;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        eprintln!("{}: the helper did not leave within 10 s; killing it", self.name);
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Helper {
    fn drop(&mut self) {
        self.stop();
    }
}

/// The role this process was started in, if it is a helper.
///
/// # Errors
/// [`ROLE_ENV`] is set but not a role.
pub fn role_from_env() -> Option<Result<Role, String>> {
    let json = std::env::var(ROLE_ENV).ok()?;
    Some(serde_json::from_str(&json).map_err(|e| format!("{ROLE_ENV}={json}: {e}")))
}

/// A bench binary's first step: when this process is a helper, play the role and exit; otherwise return.
pub fn run_if_helper() {
    if let Some(role) = role_from_env() {
        let code = match role {
            Ok(role) => run(role),
            Err(e) => {
                eprintln!("bench helper: {e}");
                ExitCode::FAILURE
            }
        };
        std::process::exit(if code == ExitCode::SUCCESS { 0 } else { 1 });
    }
}

/// Plays `role` until the bench closes this process's stdin.
pub fn run(role: Role) -> ExitCode {
    let backend = match &role {
        Role::Exporter { backend, .. } | Role::Echo { backend, .. } | Role::PersistentSink { backend, .. } => *backend,
    };
    match gpu_ipc::dispatch_gpu(backend, Play(role))
        .map_err(|e| e.to_string())
        .and_then(|r| r.map_err(|e| e.to_string()))
    {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("bench helper: {e}");
            ExitCode::FAILURE
        }
    }
}

struct Play(Role);

impl GpuBackendVisitor for Play {
    type Output = Result<(), FrameError>;
    fn visit<B: GpuBackend>(self) -> Self::Output {
        let parent_gone = watch_stdin();
        match self.0 {
            Role::Exporter { sync, socket, geometry, slots, device, .. } => {
                let ctx = Context::for_ordinal(device)?;
                let mut producer = Producer::<B>::create(&ctx, ProducerConfig::new(socket, geometry, slots, sync))?;
                say_ready();
                // Offers are handed out in `admit_pending`: call it continuously, as a producer in its frame loop
                // would, so an attach waits for the handshake and the import, not for a poll interval.
                while !parent_gone.load(Ordering::Acquire) {
                    producer.admit_pending()?;
                    std::thread::yield_now();
                }
                Ok(())
            }
            Role::Echo { sync, ping, pong, device, .. } => {
                let ctx = Context::for_ordinal(device)?;
                let stream = Stream::new(&ctx)?;
                let geometry = flat_geometry(256).map_err(FrameError::Config)?;
                let mut answers = Producer::<B>::create(&ctx, ProducerConfig::new(pong, geometry, 1, sync))?;
                say_ready();
                let mut frames = attach_retrying::<B>(&ctx, &ping, "echo")?;
                answers.wait_for_consumers(1, WAIT)?;
                loop {
                    let frame = match frames.next_frame(Some(&stream), WAIT) {
                        Ok(frame) => frame,
                        // The bench closed its ring (the end of the stream) or died: either way, done.
                        Err(FrameError::ProducerGone { .. } | FrameError::EndOfStream { .. }) => return Ok(()),
                        Err(FrameError::Timeout { .. }) if parent_gone.load(Ordering::Acquire) => return Ok(()),
                        Err(e) => return Err(e),
                    };
                    frames.release(frame, Some(&stream))?;
                    let lease = answers.acquire(Some(&stream), WAIT)?;
                    answers.publish(lease, Some(&stream))?;
                }
            }
            Role::PersistentSink { ping, device, .. } => {
                let ctx = Context::for_ordinal(device)?;
                let stream = Stream::new(&ctx)?;
                let kernel = PersistentVerify::load(&ctx).map_err(|e| FrameError::Config(e.to_string()))?;
                say_ready();
                let mut frames = attach_retrying::<B>(&ctx, &ping, "persistent-sink")?;
                // Until the bench's ring ends (the watchdog raises the kernel's abort word at the hang-up) or the
                // bench is done (dropping the consumer raises it).
                kernel.launch(&mut frames, &stream, u64::MAX / 4, WAIT)?;
                loop {
                    match kernel.finish(&mut frames, Duration::from_millis(100)) {
                        Ok(_) => return Ok(()),
                        Err(FrameError::Timeout { .. }) if !parent_gone.load(Ordering::Acquire) => {}
                        Err(FrameError::Timeout { .. }) => return Ok(()),
                        Err(e) => return Err(e),
                    }
                }
            }
        }
    }
}

fn say_ready() {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "ready");
    let _ = out.flush();
}

/// A flag that turns true when stdin closes: the bench that started this helper is done (or dead).
fn watch_stdin() -> Arc<AtomicBool> {
    let gone = Arc::new(AtomicBool::new(false));
    let flag = gone.clone();
    std::thread::spawn(move || {
        let mut sink = [0u8; 64];
        let mut stdin = std::io::stdin().lock();
        while matches!(stdin.read(&mut sink), Ok(n) if n > 0) {}
        flag.store(true, Ordering::Release);
    });
    gone
}

/// Attaches to the producer at `socket`, retrying (up to [`WAIT`]) while none listens yet.
///
/// # Errors
/// As [`Consumer::attach`], or no producer within [`WAIT`].
pub fn attach_retrying<B: Backend<Context = Context>>(
    ctx: &Context,
    socket: &Path,
    name: &str,
) -> Result<Consumer<B>, FrameError> {
    let options = AttachOptions { name: name.to_owned(), timeout: WAIT, ..AttachOptions::default() };
    let deadline = Instant::now() + WAIT;
    loop {
        match Consumer::<B>::attach(ctx, socket, &options) {
            Err(FrameError::Wire(WireError::NoProducer { .. })) if Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(5));
            }
            other => return other,
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn roles_travel_as_json() {
        let role = Role::Echo {
            backend: gpu_ipc::COMPILED_GPU[0],
            sync: SyncStrategy::GpuStreamOps,
            ping: "/tmp/a.sock".into(),
            pong: "/tmp/b.sock".into(),
            device: 0,
        };
        let json = serde_json::to_string(&role).unwrap();
        assert!(json.starts_with(r#"{"role":"echo","#), "{json}");
        assert_eq!(serde_json::from_str::<Role>(&json).unwrap(), role);
    }

    #[test]
    fn flat_frames_have_the_size_asked_for() {
        assert_eq!(flat_geometry(256 << 20).unwrap().frame_bytes(), 256 << 20);
        assert_eq!(flat_geometry(256).unwrap().frame_bytes(), 256);
        assert!(flat_geometry(6).is_err());
        assert!(flat_geometry(0).is_err());
    }

    #[test]
    fn strategies_by_their_flag_names() {
        for s in SyncStrategy::ALL {
            assert_eq!(strategy_by_name(&s.to_string()), Some(s));
        }
        assert_eq!(strategy_by_name("gpu-push"), None);
    }
}
