//! The other process of a cross-process bench: a helper process as every helper of the measurement tooling is
//! started (`harness::child`): the bench binary runs itself again, told the parent's socket in [`SOCKET_ENV`],
//! and receives its [`Role`] over the helper channel. A helper says [`HelperMessage::Ready`] once its socket
//! exists, and leaves when the bench says [`HelperMessage::Leave`] or hangs up (it ended or died).
//!
//! Legacy CUDA IPC needs this: `cuIpcOpenMemHandle` refuses a handle exported by the calling process, so imported
//! memory can only be measured against an allocation another process made. Both backends go through the same
//! path (a [`Producer`] in the helper, a [`Consumer`] in the bench), so imported memory is measured as consumers
//! see it.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use ::harness::MeasurementError;
use ::harness::child::{Channel, ChannelError, ChildProcess, ChildTask, HelperLaunch};
use gpu_ipc::core::backend::{Backend, GpuBackend};
use gpu_ipc::core::frames::{AttachOptions, Consumer, FrameError, Producer, ProducerConfig};
use gpu_ipc::core::wire::{FrameGeometry, SyncStrategy, WireError};
use gpu_ipc::driver::{Context, Stream};
use gpu_ipc::{BackendKind, GpuBackendVisitor};
use gpu_ipc_kernels::persistent::PersistentVerify;
use serde::{Deserialize, Serialize};

/// The environment variable that makes a bench binary a helper process: the path of its parent's socket.
pub const SOCKET_ENV: &str = "GPU_IPC_BENCH_HELPER_SOCKET";

/// Bound on each wait of a helper and of the bench's own calls against it.
pub const WAIT: Duration = Duration::from_secs(30);

/// What a helper process does.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "role", content = "params", rename_all = "kebab-case")]
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

impl Role {
    fn backend(&self) -> BackendKind {
        match self {
            Self::Exporter { backend, .. } | Self::Echo { backend, .. } | Self::PersistentSink { backend, .. } => {
                *backend
            }
        }
    }
}

/// What a helper and the bench say to each other after the role.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "message", rename_all = "kebab-case")]
pub enum HelperMessage {
    /// Helper -> bench: set up (its socket exists).
    Ready,
    /// Bench -> helper: done, leave.
    Leave,
}

/// Why a helper could not be started.
#[derive(Debug, thiserror::Error)]
pub enum HelperError {
    /// Starting it or talking to it failed (it died, or was not ready within [`WAIT`]).
    #[error("{name}: {source}")]
    Channel {
        /// The helper's name.
        name: String,
        /// What failed.
        source: ChannelError,
    },
    /// The role could not be encoded as a task.
    #[error("{name}: its role: {source}")]
    Task {
        /// The helper's name.
        name: String,
        /// The encoding error.
        source: serde_json::Error,
    },
    /// The helper said it failed (or something other than `ready`).
    #[error("{name}: the helper failed: {said}")]
    Failed {
        /// The helper's name.
        name: String,
        /// What it said.
        said: String,
    },
}

/// A frame of `bytes` bytes (a multiple of 4): one row of RGBA pixels.
///
/// # Errors
/// [`WireError::InvalidField`] for a size that is 0, not a multiple of 4, or over 16 GiB.
pub fn flat_geometry(bytes: u64) -> Result<FrameGeometry, WireError> {
    let invalid = |reason: String| WireError::InvalidField { field: "flat frame", reason };
    if bytes == 0 || !bytes.is_multiple_of(4) {
        return Err(invalid(format!("{bytes} bytes: need a non-zero multiple of 4")));
    }
    let width = u32::try_from(bytes / 4).map_err(|_| invalid(format!("{bytes} bytes is over 16 GiB")))?;
    FrameGeometry::new(width, 1, gpu_ipc::core::wire::PixelFormat::Rgba8)
}

/// A socket path unique to this process and `tag`.
pub fn socket_path(tag: &str) -> PathBuf {
    std::env::temp_dir().join(format!("gpu-ipc-bench-{}-{tag}.sock", std::process::id()))
}

/// A strategy by the name `--sync` takes (`cpu-spin`, ...).
pub fn strategy_by_name(name: &str) -> Option<SyncStrategy> {
    name.parse().ok()
}

/// A running helper process; dropping it tells it to leave, then waits (10 s at most) for it.
pub struct Helper {
    process: ChildProcess,
    name: String,
}

impl Helper {
    /// Starts this binary again as `role` and waits (up to [`WAIT`]) for it to say it is ready.
    ///
    /// # Errors
    /// It could not start, died, failed, or did not get ready in time (its stderr, inherited, says more).
    pub fn spawn(name: &str, role: &Role) -> Result<Self, HelperError> {
        let task = ChildTask::of(role).map_err(|source| HelperError::Task { name: name.to_owned(), source })?;
        let channel_error = |source| HelperError::Channel { name: name.to_owned(), source };
        let process =
            ChildProcess::spawn_as(HelperLaunch::SocketInEnv(SOCKET_ENV), &task, &[], WAIT).map_err(channel_error)?;
        let said: serde_json::Value = process.channel().recv_plain(WAIT).map_err(channel_error)?;
        if serde_json::from_value::<HelperMessage>(said.clone()).ok() != Some(HelperMessage::Ready) {
            return Err(HelperError::Failed { name: name.to_owned(), said: said.to_string() });
        }
        Ok(Self { process, name: name.to_owned() })
    }

    /// The helper's pid.
    pub fn pid(&self) -> u32 {
        self.process.id()
    }
}

impl Drop for Helper {
    fn drop(&mut self) {
        // A helper that already left has hung up: nothing to tell it.
        let _ = self.process.channel().send(&HelperMessage::Leave, Vec::new());
        match self.process.wait(Duration::from_secs(10)) {
            Ok(status) if !status.success() => eprintln!("{}: the helper exited with {status}", self.name),
            Ok(_) => {}
            Err(e) => eprintln!("{}: {e}; killed", self.name),
        }
    }
}

/// A bench binary's first step: when this process is a helper ([`SOCKET_ENV`] is set), play the role it is given
/// and exit; otherwise return.
pub fn run_if_helper() {
    if let Some(socket) = std::env::var_os(SOCKET_ENV) {
        let code = ::harness::run::serve(Path::new(&socket), play);
        std::process::exit(i32::from(code));
    }
}

/// Plays the role of `task` until the bench says leave or hangs up.
fn play(task: ChildTask, channel: &Channel) -> Result<(), MeasurementError> {
    let role: Role =
        task.decode().map_err(|source| MeasurementError::Malformed { what: "bench helper role".to_owned(), source })?;
    let (parent_gone, played) = (AtomicBool::new(false), AtomicBool::new(false));
    std::thread::scope(|scope| {
        scope.spawn(|| watch_parent(channel, &parent_gone, &played));
        let result = gpu_ipc::dispatch_gpu(role.backend(), Play { role, channel, parent_gone: &parent_gone })
            .map_err(MeasurementError::from)
            .and_then(|played| played.map_err(MeasurementError::from));
        played.store(true, Ordering::Release);
        result
    })
}

struct Play<'a> {
    role: Role,
    channel: &'a Channel,
    parent_gone: &'a AtomicBool,
}

impl GpuBackendVisitor for Play<'_> {
    type Output = Result<(), FrameError>;
    fn visit<B: GpuBackend>(self) -> Self::Output {
        let Play { role, channel, parent_gone } = self;
        let say_ready =
            || channel.send(&HelperMessage::Ready, Vec::new()).map_err(|e| FrameError::Config(e.to_string()));
        match role {
            Role::Exporter { sync, socket, geometry, slots, device, .. } => {
                let ctx = Context::for_ordinal(device)?;
                let mut producer = Producer::<B>::create(&ctx, ProducerConfig::new(socket, geometry, slots, sync))?;
                say_ready()?;
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
                let geometry = flat_geometry(256)?;
                let mut answers = Producer::<B>::create(&ctx, ProducerConfig::new(pong, geometry, 1, sync))?;
                say_ready()?;
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
                say_ready()?;
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

/// Sets `parent_gone` when the bench says leave or hangs up (it is done, or dead); returns once that happened or
/// the role is `played`.
fn watch_parent(channel: &Channel, parent_gone: &AtomicBool, played: &AtomicBool) {
    while !played.load(Ordering::Acquire) {
        match channel.recv_plain::<HelperMessage>(Duration::from_millis(200)) {
            Err(ChannelError::Wire(WireError::Timeout { .. })) => {}
            Ok(HelperMessage::Ready) => {}
            Ok(HelperMessage::Leave) | Err(_) => {
                parent_gone.store(true, Ordering::Release);
                return;
            }
        }
    }
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
        let task = ChildTask::of(&role).unwrap();
        assert_eq!((task.role.as_str(), task.params["device"].as_i64()), ("echo", Some(0)));
        assert_eq!(task.decode::<Role>().unwrap(), role);
        let leave = serde_json::to_value(HelperMessage::Leave).unwrap();
        assert_eq!(leave, serde_json::json!({"message": "leave"}));
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
