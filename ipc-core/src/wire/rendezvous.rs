//! The rendezvous socket: where a producer listens and consumers connect.
//!
//! Permissions: the socket file gets its mode (0600 unless [`SocketAccess`] says otherwise) and group between
//! `bind` and `listen`, through an `O_PATH` handle on the file checked to be the socket we bound (never by path
//! again: whoever can write the directory could swap in a symlink or a hard link meanwhile). Changing the umask
//! instead would race with every other thread of the process (it is process-wide), and `fchmod` on a socket fd
//! changes the socket inode, not the file `bind` created. The window between `bind` and the mode is harmless:
//! `connect` to a socket that is not yet listening fails with `ECONNREFUSED`.

use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use rustix::event::{PollFd, PollFlags, poll};
use rustix::fs::{AtFlags, FileType, Gid, Mode, OFlags, chmod, chownat, fstat, lstat, open, unlink};
use rustix::io::Errno;
use rustix::net::sockopt::{Timeout, set_socket_timeout};
use rustix::net::{
    AddressFamily, SocketAddrUnix, SocketFlags, SocketType, accept_with, bind, connect, listen, socket_with, socketpair,
};
use rustix::process::geteuid;

use super::codes::RefusalCode;
use super::error::WireError;
use super::fdpass::{Deadline, ReceivedMessage, recv_message, send_message, send_message_in};
use super::message::{Message, Refused};
use super::peercred::{RawPeerCred, peer_credentials};

/// Longest path `sockaddr_un` holds, without its terminating NUL.
const MAX_SOCKET_PATH_BYTES: usize = 107;
/// Pending connections the kernel queues before `connect` blocks.
const LISTEN_BACKLOG: i32 = 64;
/// How long the producer spends telling a rejected peer why, before hanging up.
const REFUSAL_SEND_TIMEOUT: Duration = Duration::from_millis(200);

/// Who is at the other end of a connection, from `SO_PEERCRED` (the kernel's record of the
/// peer at `connect`/`socketpair` time, not something the peer claims).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PeerCredentials {
    /// The peer's pid in our PID namespace; `None` when the kernel answers 0, which it does for a peer whose
    /// process we cannot see (it lives in a PID namespace that is neither ours nor below ours: e.g. another
    /// container sharing the socket directory). Such a peer is served all the same; only its liveness cannot be
    /// judged by pid (`kill(pid, 0)`): the connection's hang-up is the sign that it is gone.
    pub pid: Option<u32>,
    /// Peer's effective uid (as our user namespace maps it).
    pub uid: u32,
    /// Peer's effective gid (as our user namespace maps it).
    pub gid: u32,
}

impl PeerCredentials {
    /// Credentials from the kernel's raw answer: pid 0 (or a negative pid, which the kernel never gives) means
    /// "not visible from our PID namespace", never a failed call.
    pub fn from_raw(raw: RawPeerCred) -> Self {
        Self { pid: u32::try_from(raw.pid).ok().filter(|pid| *pid != 0), uid: raw.uid, gid: raw.gid }
    }

    /// Reads `SO_PEERCRED` of a connected Unix socket.
    pub fn of_socket(socket: BorrowedFd<'_>) -> Result<Self, WireError> {
        let raw = peer_credentials(socket).map_err(|e| WireError::Os {
            op: "getsockopt(SO_PEERCRED)",
            source: Errno::from_io_error(&e).unwrap_or(Errno::IO),
        })?;
        Ok(Self::from_raw(raw))
    }
}

/// Which peers a connection accepts, by the effective uid `SO_PEERCRED` reports for them.
///
/// The producer applies it to every consumer that connects, the consumer to the producer it connects to (a
/// socket planted by another user must not feed it memory handles). Who can connect at all is decided first by
/// the socket file's mode and group ([`SocketAccess`]): the kernel checks the connecting process's groups,
/// supplementary ones included, which `SO_PEERCRED` does not report.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum PeerPolicy {
    /// Only processes running as our effective uid (the default): GPU memory of one user is not
    /// shared with another by accident.
    #[default]
    SameUser,
    /// Our effective uid and these: e.g. a service user's producer and the uids of the consumers it serves, or,
    /// on the consumer's side, the uid the producer runs as.
    Users(Vec<u32>),
    /// Any peer that can open the socket file: with [`SocketAccess::group`], the members of that group.
    AnyUser,
}

impl PeerPolicy {
    /// Whether a peer running as `uid` is accepted by a process running as `our_uid`.
    pub fn allows(&self, uid: u32, our_uid: u32) -> bool {
        match self {
            Self::SameUser => uid == our_uid,
            Self::Users(uids) => uid == our_uid || uids.contains(&uid),
            Self::AnyUser => true,
        }
    }
}

/// Who may reach the producer's rendezvous socket: its file mode and group, and the peer check made after a
/// connection is accepted. The default is the owner alone (mode 0600, [`PeerPolicy::SameUser`]).
///
/// Connecting to a Unix socket needs write permission on its file (and search permission on every directory
/// above it, which is the caller's to arrange). To serve another user's consumers, either widen the mode and name
/// the users ([`PeerPolicy::Users`]), or give the socket to a group the consumers' users are in and let the kernel
/// decide ([`SocketAccess::group`]).
///
/// ```no_run
/// use ipc_core::frames::{AttachOptions, ProducerConfig};
/// use ipc_core::wire::{FrameGeometry, PeerPolicy, PixelFormat, SocketAccess, SyncStrategy};
///
/// let geometry = FrameGeometry::new(3840, 2160, PixelFormat::Rgb8)?;
/// let mut config = ProducerConfig::new("/run/frames/cam0.sock", geometry, 4, SyncStrategy::IpcEvent);
/// // Members of group 44 (e.g. "video"): mode 0660, the socket given to that group.
/// config.access = SocketAccess::group(44);
/// // Or named users: mode 0666 and a uid check.
/// config.access = SocketAccess::users([1001, 1002]);
///
/// // On the consumer's side (uid 1001): accept a producer run by uid 998.
/// let options = AttachOptions { producer: PeerPolicy::Users(vec![998]), ..AttachOptions::default() };
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SocketAccess {
    /// Permission bits of the socket file (at most 0o777, owner read and write included).
    pub mode: u32,
    /// The group the socket file is given to (`chown`; the producer's user must be in it, or root).
    pub group: Option<u32>,
    /// Which peers are served once connected.
    pub peers: PeerPolicy,
}

impl Default for SocketAccess {
    fn default() -> Self {
        Self { mode: 0o600, group: None, peers: PeerPolicy::SameUser }
    }
}

impl SocketAccess {
    /// The members of group `gid` and the owner: mode 0660, the socket given to `gid`, any peer that got through.
    pub fn group(gid: u32) -> Self {
        Self { mode: 0o660, group: Some(gid), peers: PeerPolicy::AnyUser }
    }

    /// The owner and the users `uids`: mode 0666 (the uid check does the filtering).
    pub fn users(uids: impl IntoIterator<Item = u32>) -> Self {
        Self { mode: 0o666, group: None, peers: PeerPolicy::Users(uids.into_iter().collect()) }
    }

    fn check(&self) -> Result<(), WireError> {
        if self.mode & !0o777 != 0 || self.mode & 0o600 != 0o600 {
            return Err(WireError::BadSocketMode { mode: self.mode });
        }
        Ok(())
    }
}

/// The producer's listening socket. Unlinks its path on drop (only if the path still names
/// this socket, so a successor's socket is never removed).
#[derive(Debug)]
pub struct RendezvousListener {
    socket: OwnedFd,
    path: PathBuf,
    /// `(st_dev, st_ino)` of the socket file we created.
    identity: (u64, u64),
    policy: PeerPolicy,
}

impl RendezvousListener {
    /// Creates the socket file at `path` (mode 0600) and listens on it.
    ///
    /// If `path` exists: a socket nobody listens on (connect fails with `ECONNREFUSED`, left by
    /// a crashed producer) is replaced; a live one is [`WireError::PathInUse`]; anything that is
    /// not a socket is left alone and reported as [`WireError::PathNotSocket`].
    pub fn bind(path: impl AsRef<Path>) -> Result<Self, WireError> {
        Self::bind_with(path, &SocketAccess::default())
    }

    /// As [`bind`](Self::bind), with the socket file's mode and group and the peer check of `access`.
    ///
    /// # Errors
    /// As `bind`; a mode outside 0o600..=0o777 ([`WireError::BadSocketMode`]); a group the process may not give
    /// the file to ([`WireError::SocketGroup`]); the file swapped for another right after `bind`
    /// ([`WireError::PathReplaced`]).
    pub fn bind_with(path: impl AsRef<Path>, access: &SocketAccess) -> Result<Self, WireError> {
        access.check()?;
        let path = path.as_ref().to_path_buf();
        let addr = socket_addr(&path)?;
        remove_stale_socket(&path, &addr)?;

        let socket = socket_with(
            AddressFamily::UNIX,
            SocketType::STREAM,
            // Non-blocking so that `accept` after a spurious `poll` wake-up cannot hang.
            SocketFlags::CLOEXEC | SocketFlags::NONBLOCK,
            None,
        )
        .map_err(WireError::os("socket"))?;
        bind(&socket, &addr).map_err(|source| path_error("bind", &path, source))?;
        // Everything after `bind` goes through one handle on the file, opened without following a symlink and
        // checked to be a socket of ours: whoever can write the directory could otherwise swap the fresh socket for
        // a symlink to another file between two calls by path, and have that file's group and mode changed.
        let file = open(&path, OFlags::PATH | OFlags::NOFOLLOW | OFlags::CLOEXEC, Mode::empty())
            .map_err(|source| path_error("open", &path, source))?;
        let stat = fstat(&file).map_err(|source| path_error("fstat", &path, source))?;
        if FileType::from_raw_mode(stat.st_mode) != FileType::Socket
            || stat.st_uid != geteuid().as_raw()
            || stat.st_nlink > 1
        {
            // Not the file we bound: leave it alone (no `Drop` cleanup of someone else's file).
            return Err(WireError::PathReplaced { path });
        }
        // From here on, `Drop` removes the file if a later step fails.
        let listener = Self { socket, path, identity: (stat.st_dev, stat.st_ino), policy: access.peers.clone() };
        // The group before the mode: until both are set, only the owner can connect (bind made the file with
        // the umask's bits at most, and no peer is accepted before `listen`).
        if let Some(gid) = access.group {
            chownat(&file, "", None, Some(Gid::from_raw(gid)), AtFlags::EMPTY_PATH)
                .map_err(|source| WireError::SocketGroup { gid, path: listener.path.clone(), source })?;
        }
        set_mode(&file, &listener.path, access.mode, stat.st_mode)?;
        listen(&listener.socket, LISTEN_BACKLOG).map_err(|source| path_error("listen", &listener.path, source))?;
        tracing::info!(path = %listener.path.display(), "rendezvous socket listening");
        Ok(listener)
    }

    /// Replaces the peer policy (default [`PeerPolicy::SameUser`]).
    pub fn with_peer_policy(mut self, policy: PeerPolicy) -> Self {
        self.policy = policy;
        self
    }

    /// The socket path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Waits at most `timeout` for a consumer to connect.
    ///
    /// A peer the policy rejects is sent a [`Refused`] (`PeerNotAllowed`), disconnected, and
    /// reported as [`WireError::PeerUidMismatch`]; the listener stays usable.
    pub fn accept(&self, timeout: Duration) -> Result<PeerConnection, WireError> {
        let deadline = Deadline::after(timeout);
        let socket = loop {
            deadline.wait(self.socket.as_fd(), PollFlags::IN, "accept")?;
            match accept_with(&self.socket, SocketFlags::CLOEXEC) {
                Ok(socket) => break socket,
                // Another thread took the connection, or the peer gave up before we got to it.
                Err(Errno::AGAIN | Errno::INTR | Errno::CONNABORTED) => {}
                Err(source) => return Err(path_error("accept", &self.path, source)),
            }
        };
        let connection = PeerConnection::from_socket(socket)?;
        if let Err(error) = check_policy(&self.policy, connection.peer) {
            tracing::warn!(%error, path = %self.path.display(), "refusing peer");
            let refusal = Message::Refused(Refused { code: RefusalCode::PeerNotAllowed, message: error.to_string() });
            // Best effort: the peer may already be gone, and the error we return matters more.
            let _ = connection.send(&refusal, Vec::new(), REFUSAL_SEND_TIMEOUT);
            connection.discard_unread();
            return Err(error);
        }
        tracing::info!(
            pid = connection.peer.pid,
            uid = connection.peer.uid,
            pid_namespace = if connection.peer.pid.is_some() { "ours or below" } else { "another" },
            path = %self.path.display(),
            "consumer connected"
        );
        Ok(connection)
    }
}

impl AsFd for RendezvousListener {
    /// The listening socket, for an event loop to poll for readability (= a pending connection).
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.socket.as_fd()
    }
}

impl Drop for RendezvousListener {
    fn drop(&mut self) {
        // Remove the file only if it is still ours: a newer producer may have replaced a socket
        // it found stale. Errors are ignored: there is nobody to report them to.
        let still_ours = lstat(&self.path).is_ok_and(|stat| (stat.st_dev, stat.st_ino) == self.identity);
        if still_ours {
            let _ = unlink(&self.path);
        }
    }
}

/// One end of a producer-consumer connection. Dropping it closes the socket, which the peer
/// sees as a hang-up.
#[derive(Debug)]
pub struct PeerConnection {
    socket: OwnedFd,
    peer: PeerCredentials,
}

impl PeerConnection {
    /// Connects to the producer listening at `path`, waiting at most `timeout` (a full listen
    /// backlog makes `connect` wait). The producer must run as our user.
    pub fn connect(path: impl AsRef<Path>, timeout: Duration) -> Result<Self, WireError> {
        Self::connect_with(path, timeout, &PeerPolicy::SameUser)
    }

    /// As [`connect`](Self::connect), accepting a producer that runs as a user `producer` allows.
    ///
    /// # Errors
    /// As `connect`; a producer of a user `producer` does not allow ([`WireError::PeerUidMismatch`]).
    pub fn connect_with(path: impl AsRef<Path>, timeout: Duration, producer: &PeerPolicy) -> Result<Self, WireError> {
        let path = path.as_ref();
        let addr = socket_addr(path)?;
        let socket = socket_with(AddressFamily::UNIX, SocketType::STREAM, SocketFlags::CLOEXEC, None)
            .map_err(WireError::os("socket"))?;
        // A Unix-socket `connect` waits for backlog room for up to SO_SNDTIMEO, then fails with
        // EAGAIN; zero would mean "forever", so the floor is a millisecond.
        let limit = timeout.max(Duration::from_millis(1));
        set_socket_timeout(&socket, Timeout::Send, Some(limit)).map_err(WireError::os("setsockopt(SO_SNDTIMEO)"))?;
        match connect(&socket, &addr) {
            Ok(()) => {}
            Err(Errno::AGAIN | Errno::INPROGRESS) => {
                return Err(WireError::Timeout { op: "connect", after: timeout });
            }
            Err(source) => return Err(path_error("connect", path, source)),
        }
        let connection = Self::from_socket(socket)?;
        // The same check the producer makes: a socket planted by another user must not feed us
        // memory handles.
        check_policy(producer, connection.peer)?;
        tracing::info!(pid = connection.peer.pid, path = %path.display(), "connected to producer");
        if connection.peer.pid.is_none() {
            tracing::info!(
                path = %path.display(),
                "the producer is in another PID namespace: its pid cannot tell whether it is alive; its \
                 connection's hang-up does"
            );
        }
        Ok(connection)
    }

    /// Two connected ends in this process (`socketpair`), for tests and in-process use.
    pub fn pair() -> Result<(Self, Self), WireError> {
        let (a, b) = socketpair(AddressFamily::UNIX, SocketType::STREAM, SocketFlags::CLOEXEC, None)
            .map_err(WireError::os("socketpair"))?;
        Ok((Self::from_socket(a)?, Self::from_socket(b)?))
    }

    fn from_socket(socket: OwnedFd) -> Result<Self, WireError> {
        let peer = PeerCredentials::of_socket(socket.as_fd())?;
        Ok(Self { socket, peer })
    }

    /// The peer's credentials, from `SO_PEERCRED`.
    pub fn peer(&self) -> PeerCredentials {
        self.peer
    }

    /// Sends `message` with `fds` (closed on return; see [`super::send_message`]), in the oldest protocol version
    /// that carries it.
    pub fn send(&self, message: &Message, fds: Vec<OwnedFd>, timeout: Duration) -> Result<(), WireError> {
        send_message(self.socket.as_fd(), message, fds, timeout)
    }

    /// Sends `message` with `fds` in protocol `version`: what both sides agreed on at the hello.
    pub fn send_in(
        &self,
        version: u16,
        message: &Message,
        fds: Vec<OwnedFd>,
        timeout: Duration,
    ) -> Result<(), WireError> {
        send_message_in(self.socket.as_fd(), version, message, fds, timeout)
    }

    /// Receives one message and its fds (see [`super::recv_message`]).
    pub fn recv(&self, timeout: Duration) -> Result<ReceivedMessage, WireError> {
        recv_message(self.socket.as_fd(), timeout)
    }

    /// Reads and drops what the peer sent and we did not read (at most 64 KiB, without waiting), so that closing
    /// right after a refusal is an orderly end of stream for the peer: closing a Unix stream socket with unread
    /// bytes makes the peer's next read fail with `ECONNRESET` once it has read what we sent.
    pub fn discard_unread(&self) {
        const LIMIT: usize = 64 * 1024;
        let mut sink = [0u8; 4096];
        let mut discarded = 0;
        while discarded < LIMIT {
            match rustix::net::recv(self.socket.as_fd(), &mut sink, rustix::net::RecvFlags::DONTWAIT) {
                Ok((n, _)) if n > 0 => discarded += n,
                _ => return,
            }
        }
    }

    /// Whether the peer has closed its end (or the connection failed), without blocking.
    ///
    /// True once the peer has hung up even if it left unread messages (e.g. a final
    /// `Detach`), which [`PeerConnection::recv`] still returns.
    pub fn is_peer_gone(&self) -> Result<bool, WireError> {
        let mut fds = [PollFd::new(&self.socket, PollFlags::IN | PollFlags::RDHUP)];
        loop {
            match poll(&mut fds, Some(&rustix::event::Timespec { tv_sec: 0, tv_nsec: 0 })) {
                Ok(_) => break,
                Err(Errno::INTR) => {}
                Err(source) => return Err(WireError::Os { op: "poll", source }),
            }
        }
        let gone = PollFlags::HUP | PollFlags::RDHUP | PollFlags::ERR | PollFlags::NVAL;
        Ok(fds[0].revents().intersects(gone))
    }
}

impl AsFd for PeerConnection {
    /// The connected socket, for an event loop to poll (readable = a message or a hang-up).
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.socket.as_fd()
    }
}

fn check_policy(policy: &PeerPolicy, peer: PeerCredentials) -> Result<(), WireError> {
    let our_uid = geteuid().as_raw();
    if policy.allows(peer.uid, our_uid) {
        Ok(())
    } else {
        Err(WireError::PeerUidMismatch { pid: peer.pid, peer_uid: peer.uid, our_uid })
    }
}

fn socket_addr(path: &Path) -> Result<SocketAddrUnix, WireError> {
    if path.as_os_str().as_bytes().len() > MAX_SOCKET_PATH_BYTES {
        return Err(WireError::PathTooLong { path: path.to_path_buf() });
    }
    SocketAddrUnix::new(path).map_err(|source| path_error("sockaddr_un", path, source))
}

/// Sets the mode of the file `file` (an `O_PATH` handle of `path`) without going through the path again:
/// `chmod` of its `/proc/self/fd` link reaches the file itself. Without `/proc` nothing is set by path (a chmod by
/// path would follow a symlink swapped in meanwhile): the default mode is left to `bind` when it already keeps
/// everyone but the owner out (no group or other write bit: connecting needs write permission), and any other
/// case is an error.
fn set_mode(file: &OwnedFd, path: &Path, mode: u32, created: u32) -> Result<(), WireError> {
    let link = format!("/proc/self/fd/{}", file.as_raw_fd());
    match chmod(link.as_str(), Mode::from_raw_mode(mode)) {
        Ok(()) => Ok(()),
        // No /proc: connecting needs write permission, so a socket bind made without group/other write (umask
        // 022 or stricter) already admits only its owner; never chmod by path (it follows a swapped-in symlink).
        Err(Errno::NOENT) if mode == 0o600 && created & 0o022 == 0 => Ok(()),
        Err(Errno::NOENT) => Err(path_error("chmod through /proc/self/fd (is /proc mounted?)", path, Errno::NOENT)),
        Err(source) => Err(path_error("chmod", path, source)),
    }
}

/// Removes `path` if it is a socket nobody listens on; see [`RendezvousListener::bind`].
fn remove_stale_socket(path: &Path, addr: &SocketAddrUnix) -> Result<(), WireError> {
    let stat = match lstat(path) {
        Ok(stat) => stat,
        Err(Errno::NOENT) => return Ok(()),
        Err(source) => return Err(path_error("lstat", path, source)),
    };
    if FileType::from_raw_mode(stat.st_mode) != FileType::Socket {
        return Err(WireError::PathNotSocket { path: path.to_path_buf() });
    }
    let probe = socket_with(
        AddressFamily::UNIX,
        SocketType::STREAM,
        // Non-blocking: a live producer with a full backlog answers EAGAIN instead of stalling us.
        SocketFlags::CLOEXEC | SocketFlags::NONBLOCK,
        None,
    )
    .map_err(WireError::os("socket"))?;
    match connect(&probe, addr) {
        Err(Errno::CONNREFUSED) => {
            tracing::warn!(path = %path.display(), "removing stale rendezvous socket");
            unlink(path).map_err(|source| path_error("unlink", path, source))
        }
        Ok(()) | Err(Errno::AGAIN) => Err(WireError::PathInUse { path: path.to_path_buf() }),
        Err(source) => Err(path_error("connect", path, source)),
    }
}

/// Maps an errno on a socket path to the error that tells the user what to do.
fn path_error(op: &'static str, path: &Path, source: Errno) -> WireError {
    let path = path.to_path_buf();
    match source {
        Errno::ACCESS | Errno::PERM => WireError::PermissionDenied { op, path },
        Errno::NOENT | Errno::CONNREFUSED if op == "connect" => WireError::NoProducer { path },
        Errno::ADDRINUSE => WireError::PathInUse { path },
        Errno::NAMETOOLONG => WireError::PathTooLong { path },
        source => WireError::PathOs { op, path, source },
    }
}
