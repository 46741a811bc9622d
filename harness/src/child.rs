//! The parent-child channel of a measurement (a probe or the benchmark): JSON messages, each optionally carrying file descriptors (`SCM_RIGHTS`),
//! over a Unix stream socket, and the child processes that speak it.
//!
//! A measurement that needs a second process (an exporter, an importer, a writer, an observer, a benchmark's
//! consumer) starts a copy of this binary as `gpu-ipc helper --socket PATH` ([`ChildProcess::spawn`], the one way
//! the harness starts a helper); the child connects, reads its [`ChildTask`] and then the two
//! exchange whatever messages the measurement defines. Every receive has a deadline and a child that outlives its
//! deadline is killed, so no measurement can hang on a child.
//!
//! Framing: a 4-byte little-endian length and a 4-byte fd count, then that many bytes of JSON; the first two fds ride
//! on the first byte, any further ones on one-byte frames that follow, two at a time (the same raw layer as the
//! rendezvous protocol, `ipc_core::wire::{send_bytes, recv_bytes}`, which takes two fds per `recvmsg`).

use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::Path;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use gpu_ipc::core::wire::{WireError, recv_bytes, send_bytes};

use crate::process::PrivateDir;
use serde::{Deserialize, Serialize};

use serde::de::DeserializeOwned;

/// Longest JSON message accepted (arrays of timestamps travel through shared memory, not here).
pub const MAX_MESSAGE_BYTES: u32 = 64 << 20;
/// Most fds one message may carry.
pub const MAX_FDS_PER_MESSAGE: u32 = 64;
/// The hidden `gpu-ipc` subcommand a helper process runs (`gpu-ipc helper --socket PATH`); `probe-child`, its
/// first name, stays an alias of it.
pub const HELPER_COMMAND: &str = "helper";
/// Fds per `sendmsg`: the raw layer's room (`ipc_core::wire::MAX_FDS_PER_MESSAGE`).
pub const MAX_FDS_PER_FRAME: usize = gpu_ipc::core::wire::MAX_FDS_PER_MESSAGE;

/// Why talking to a helper process failed.
#[derive(Debug, thiserror::Error)]
pub enum ChannelError {
    /// A socket-level failure (including a hang-up: the peer died).
    #[error("helper channel: {0}")]
    Wire(#[from] WireError),
    /// The bytes were not the JSON expected.
    #[error("helper channel: malformed message: {0}")]
    Json(#[from] serde_json::Error),
    /// A length beyond [`MAX_MESSAGE_BYTES`].
    #[error("helper channel: a message of {0} bytes is too large")]
    TooLarge(u32),
    /// Setting up the socket or the child failed.
    #[error("helper channel: {op}: {source}")]
    Io {
        /// What was being done.
        op: &'static str,
        /// The OS error.
        source: std::io::Error,
    },
    /// The child did not connect or exit in time.
    #[error("helper channel: the child process {what} within {after:?}")]
    Timeout {
        /// What it did not do.
        what: &'static str,
        /// The deadline.
        after: Duration,
    },
}

/// One end of a parent-child channel.
#[derive(Debug)]
pub struct Channel {
    stream: UnixStream,
}

impl Channel {
    /// Connects to the parent's socket (the child's side).
    ///
    /// # Errors
    /// The connect failure.
    pub fn connect(path: &Path) -> Result<Self, ChannelError> {
        let stream = UnixStream::connect(path).map_err(|source| ChannelError::Io { op: "connect", source })?;
        Ok(Self { stream })
    }

    /// Sends `message` with `fds` attached (closed once sent, as the rendezvous protocol does). Any number of fds:
    /// the raw layer passes [`MAX_FDS_PER_FRAME`] per `sendmsg`, so further ones follow on one-byte frames.
    ///
    /// # Errors
    /// Encoding or socket failures; a peer that hung up.
    pub fn send<T: Serialize>(&self, message: &T, fds: Vec<OwnedFd>) -> Result<(), ChannelError> {
        let json = serde_json::to_vec(message)?;
        let len = u32::try_from(json.len()).map_err(|_| ChannelError::TooLarge(u32::MAX))?;
        let total = u32::try_from(fds.len()).map_err(|_| ChannelError::TooLarge(u32::MAX))?;
        let mut bytes = Vec::with_capacity(json.len() + 8);
        bytes.extend_from_slice(&len.to_le_bytes());
        bytes.extend_from_slice(&total.to_le_bytes());
        bytes.extend_from_slice(&json);
        let mut fds = fds.into_iter();
        let first: Vec<OwnedFd> = fds.by_ref().take(MAX_FDS_PER_FRAME).collect();
        send_bytes(self.stream.as_fd(), &bytes, first, Duration::from_secs(30))?;
        loop {
            let more: Vec<OwnedFd> = fds.by_ref().take(MAX_FDS_PER_FRAME).collect();
            if more.is_empty() {
                return Ok(());
            }
            send_bytes(self.stream.as_fd(), &[0], more, Duration::from_secs(30))?;
        }
    }

    /// Receives one message and its fds, waiting at most `timeout`.
    ///
    /// # Errors
    /// A timeout, a hang-up (the peer died), or a malformed message.
    pub fn recv<T: DeserializeOwned>(&self, timeout: Duration) -> Result<(T, Vec<OwnedFd>), ChannelError> {
        let started = Instant::now();
        let rest = || timeout.saturating_sub(started.elapsed()).max(Duration::from_millis(100));
        let mut header = [0u8; 8];
        let mut fds = recv_bytes(self.stream.as_fd(), &mut header, timeout)?;
        let [l0, l1, l2, l3, f0, f1, f2, f3] = header;
        let len = u32::from_le_bytes([l0, l1, l2, l3]);
        let total = u32::from_le_bytes([f0, f1, f2, f3]);
        if len > MAX_MESSAGE_BYTES {
            return Err(ChannelError::TooLarge(len));
        }
        if total > MAX_FDS_PER_MESSAGE {
            return Err(ChannelError::TooLarge(total));
        }
        let mut json = vec![0u8; len as usize];
        recv_bytes(self.stream.as_fd(), &mut json, rest())?;
        while fds.len() < total as usize {
            let mut marker = [0u8; 1];
            fds.extend(recv_bytes(self.stream.as_fd(), &mut marker, rest())?);
        }
        Ok((serde_json::from_slice(&json)?, fds))
    }

    /// Receives a message that carries no fds.
    ///
    /// # Errors
    /// As [`Channel::recv`].
    pub fn recv_plain<T: DeserializeOwned>(&self, timeout: Duration) -> Result<T, ChannelError> {
        Ok(self.recv(timeout)?.0)
    }
}

/// What a helper process is asked to do, as the channel carries it: the role (`<room>-<role>`, e.g.
/// `crash-observer`, which routes it to the room that owns it) and the role's parameters.
///
/// Each room describes its roles as one typed enum, `#[serde(tag = "role", content = "params")]` with a variant per
/// role renamed to the role's name; [`ChildTask::of`] wraps a value of it and [`ChildTask::decode`] turns the
/// envelope back into it, so parameters are typed on both sides and an unknown role is a decoding error.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ChildTask {
    /// The role, e.g. `"overhead-exporter"`.
    pub role: String,
    /// The role's parameters (`null` for a role that has none).
    #[serde(default)]
    pub params: serde_json::Value,
}

impl ChildTask {
    /// The envelope of `task`, a room's typed task enum (see [`ChildTask`]).
    ///
    /// # Errors
    /// A `task` that does not serialize as `{"role": ..., "params": ...}`.
    pub fn of<T: Serialize>(task: &T) -> Result<Self, serde_json::Error> {
        serde_json::from_value(serde_json::to_value(task)?)
    }

    /// This envelope as the room's typed task enum `T`.
    ///
    /// # Errors
    /// A role `T` does not have, or parameters that do not fit it.
    pub fn decode<T: DeserializeOwned>(self) -> Result<T, serde_json::Error> {
        serde_json::from_value(serde_json::to_value(self)?)
    }
}

/// How a helper process is started: always this binary again, told where the parent's socket is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HelperLaunch<'a> {
    /// `gpu-ipc helper --socket PATH` ([`HELPER_COMMAND`]): this binary is the `gpu-ipc` command.
    Subcommand,
    /// This binary with no arguments and the socket's path in the environment variable named here: for binaries
    /// whose command line is not ours (criterion's benches); the binary's first step serves the task when it is set.
    SocketInEnv(&'a str),
}

/// A helper process of a measurement with its channel; killed (and reaped) on drop if it is still running.
#[derive(Debug)]
pub struct ChildProcess {
    child: Child,
    channel: Channel,
    _dir: PrivateDir,
}

impl ChildProcess {
    /// Starts `gpu-ipc helper` with `task`, with `env` added to its environment, and waits at most
    /// `connect_timeout` for it to connect (CUDA is not touched before it connects, so this is quick).
    ///
    /// # Errors
    /// Failing to start the child, or a child that does not connect in time.
    pub fn spawn(task: &ChildTask, env: &[(&str, &str)], connect_timeout: Duration) -> Result<Self, ChannelError> {
        Self::spawn_as(HelperLaunch::Subcommand, task, env, connect_timeout)
    }

    /// As [`ChildProcess::spawn`], started the way `launch` says (this binary need not be the `gpu-ipc` command).
    ///
    /// # Errors
    /// As [`ChildProcess::spawn`].
    pub fn spawn_as(
        launch: HelperLaunch<'_>,
        task: &ChildTask,
        env: &[(&str, &str)],
        connect_timeout: Duration,
    ) -> Result<Self, ChannelError> {
        let dir = PrivateDir::new("helper").map_err(|source| ChannelError::Io { op: "mkdir", source })?;
        let socket = dir.path().join("helper.sock");
        let listener = UnixListener::bind(&socket).map_err(|source| ChannelError::Io { op: "bind", source })?;
        listener.set_nonblocking(true).map_err(|source| ChannelError::Io { op: "set_nonblocking", source })?;
        let exe = std::env::current_exe().map_err(|source| ChannelError::Io { op: "current_exe", source })?;
        let mut command = Command::new(exe);
        match launch {
            HelperLaunch::Subcommand => command.arg(HELPER_COMMAND).arg("--socket").arg(&socket),
            HelperLaunch::SocketInEnv(var) => command.env(var, &socket),
        };
        command.stdin(Stdio::null());
        for (key, value) in env {
            command.env(key, value);
        }
        let mut child = command.spawn().map_err(|source| ChannelError::Io { op: "spawn", source })?;
        let deadline = Instant::now() + connect_timeout;
        let stream = loop {
            match listener.accept() {
                Ok((stream, _)) => break stream,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    if Instant::now() > deadline || matches!(child.try_wait(), Ok(Some(_))) {
                        let _ = child.kill();
                        let _ = child.wait();
                        return Err(ChannelError::Timeout { what: "did not connect", after: connect_timeout });
                    }
                    std::thread::sleep(Duration::from_millis(2));
                }
                Err(source) => {
                    let _ = child.kill();
                    let _ = child.wait();
                    return Err(ChannelError::Io { op: "accept", source });
                }
            }
        };
        stream.set_nonblocking(false).map_err(|source| ChannelError::Io { op: "set_nonblocking", source })?;
        let process = Self { child, channel: Channel { stream }, _dir: dir };
        process.channel.send(task, Vec::new())?;
        Ok(process)
    }

    /// The child's process id.
    pub fn id(&self) -> u32 {
        self.child.id()
    }

    /// The channel to the child.
    pub fn channel(&self) -> &Channel {
        &self.channel
    }

    /// Sends SIGKILL (the crash probe's cases; also what drop does to a child still running).
    pub fn kill(&mut self) {
        let _ = self.child.kill();
    }

    /// Waits at most `timeout` for the child to exit; kills it if it does not.
    ///
    /// # Errors
    /// [`ChannelError::Timeout`] when it had to be killed.
    pub fn wait(&mut self, timeout: Duration) -> Result<ExitStatus, ChannelError> {
        let deadline = Instant::now() + timeout;
        loop {
            match self.child.try_wait() {
                Ok(Some(status)) => return Ok(status),
                Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(2)),
                Ok(None) => {
                    self.kill();
                    let _ = self.child.wait();
                    return Err(ChannelError::Timeout { what: "did not exit", after: timeout });
                }
                Err(source) => return Err(ChannelError::Io { op: "waitpid", source }),
            }
        }
    }
}

impl Drop for ChildProcess {
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            let _ = self.child.kill();
        }
        let _ = self.child.wait();
    }
}

/// What a child sends when its role failed, so the parent can say why instead of "hung up".
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ChildFailure {
    /// The error, in words.
    pub error: String,
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use std::io::Write;

    #[test]
    fn json_and_fds_cross_a_socket_pair() {
        let (a, b) = UnixStream::pair().unwrap();
        let (a, b) = (Channel { stream: a }, Channel { stream: b });
        let mut file = tempfile_fd();
        file.write_all(b"hello").unwrap();
        a.send(&serde_json::json!({"n": 7, "s": "x"}), vec![OwnedFd::from(file)]).unwrap();
        let (value, fds): (serde_json::Value, _) = b.recv(Duration::from_secs(5)).unwrap();
        assert_eq!(value["n"], 7);
        assert_eq!(fds.len(), 1);
        let stat = rustix::fs::fstat(&fds[0]).unwrap();
        assert_eq!(stat.st_size, 5);
    }

    #[test]
    fn more_fds_than_one_sendmsg_carries_all_arrive_in_order() {
        let (a, b) = UnixStream::pair().unwrap();
        let (a, b) = (Channel { stream: a }, Channel { stream: b });
        let mut files = Vec::new();
        for i in 0..5 {
            let mut file = tempfile_fd();
            file.write_all(&vec![b'x'; i + 1]).unwrap();
            files.push(OwnedFd::from(file));
        }
        a.send(&serde_json::json!({"n": 5}), files).unwrap();
        a.send(&serde_json::json!({"n": 0}), Vec::new()).unwrap();
        let (value, fds): (serde_json::Value, _) = b.recv(Duration::from_secs(5)).unwrap();
        assert_eq!(value["n"], 5);
        let sizes: Vec<i64> = fds.iter().map(|fd| rustix::fs::fstat(fd).unwrap().st_size).collect();
        assert_eq!(sizes, vec![1, 2, 3, 4, 5]);
        let (next, none): (serde_json::Value, _) = b.recv(Duration::from_secs(5)).unwrap();
        assert_eq!((next["n"].as_u64(), none.len()), (Some(0), 0));
    }

    #[test]
    fn a_dead_peer_is_an_error_not_a_hang() {
        let (a, b) = UnixStream::pair().unwrap();
        drop(a);
        let b = Channel { stream: b };
        let started = Instant::now();
        assert!(b.recv_plain::<serde_json::Value>(Duration::from_secs(5)).is_err());
        assert!(started.elapsed() < Duration::from_secs(1));
    }

    #[test]
    fn oversized_length_is_refused() {
        let (mut a, b) = UnixStream::pair().unwrap();
        a.write_all(&u32::MAX.to_le_bytes()).unwrap();
        a.write_all(&0u32.to_le_bytes()).unwrap();
        let b = Channel { stream: b };
        assert!(matches!(b.recv_plain::<serde_json::Value>(Duration::from_secs(1)), Err(ChannelError::TooLarge(_))));
    }

    #[derive(Debug, PartialEq, Serialize, Deserialize)]
    #[serde(tag = "role", content = "params")]
    enum Task {
        #[serde(rename = "test-writer")]
        Writer { device: i32 },
        #[serde(rename = "test-idle")]
        Idle,
    }

    #[test]
    fn typed_tasks_travel_as_role_and_params() {
        let task = ChildTask::of(&Task::Writer { device: 3 }).unwrap();
        assert_eq!(task.role, "test-writer");
        assert_eq!(task.params["device"], 3);
        assert_eq!(task.decode::<Task>().unwrap(), Task::Writer { device: 3 });
        assert_eq!(ChildTask::of(&Task::Idle).unwrap().decode::<Task>().unwrap(), Task::Idle);
        let unknown = ChildTask { role: "test-reader".to_owned(), params: serde_json::Value::Null };
        assert!(unknown.decode::<Task>().is_err());
    }

    fn tempfile_fd() -> std::fs::File {
        let dir = PrivateDir::new("helper-test").unwrap();
        let path = dir.path().join("f");
        let file = std::fs::OpenOptions::new().create(true).truncate(true).read(true).write(true).open(&path).unwrap();
        drop(dir);
        file
    }
}
