//! The front door of a toolkit object other than a ring: [`ObjectDoor`] runs the ring's hardened admission loop
//! for an [`ObjectHost`] (a pool, a semaphore, a work queue) and keeps the registry of attached peers; [`attach`]
//! is the client's side of the same handshake.
//!
//! The owner makes its exports once, when the object is created; an offer only copies them (fds are duplicated per
//! peer and the copies closed once sent), so a hello is answered on the door's own thread without touching the
//! GPU. After `Attached` the door keeps the peer's connection and watches it: its hang-up is the peer's end
//! ([`ObjectHost::gone`]), seen within [`WATCH_INTERVAL`].

use std::collections::HashMap;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime};

use rustix::event::{PollFd, PollFlags, Timespec, poll};

use ipc_core::door::admission::{Admission, AdmissionConfig, AdmissionEvent, Records};
use ipc_core::wire::{
    Attached, BackendKind, ClientHello, Detach, DetachReason, MAX_STATUS_DETAIL_BYTES, Message, ObjectKind,
    ObjectOffer, PROTOCOL_VERSION, PeerConnection, PeerCredentials, PeerState, PeerStatus, RefusalCode,
    RendezvousListener, SocketAccess, StatusReport, StatusRequest, WireError,
};

/// Longest the door's service thread waits in one poll: a hello to answer, an attached peer's hang-up wake it at once.
pub const WATCH_INTERVAL: Duration = Duration::from_millis(20);

/// A peer of an object, as its owner knows it: what `gpu-ipc ps` lists.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeerInfo {
    /// The peer number the offer gave it (unique for the door's life).
    pub id: u32,
    /// Its pid in the owner's PID namespace; `None` for a peer in a PID namespace the owner cannot see.
    pub pid: Option<u32>,
    /// Its effective uid (`SO_PEERCRED`).
    pub uid: u32,
    /// Its effective gid (`SO_PEERCRED`).
    pub gid: u32,
    /// The name it gave in its hello.
    pub name: String,
    /// When it said its hello.
    pub since: SystemTime,
    /// The part it asked for, at the socket of a pool made of parts (a weight set on several devices); 0 everywhere
    /// else. A host that is not made of parts refuses any other.
    pub part: u32,
}

/// What an object's owner tells its door. Every method runs on the door's service thread: none may block (make
/// the exports when the object is created, duplicate fds per offer).
pub trait ObjectHost: Send + Sync + 'static {
    /// What the object is; a hello that names another kind is refused with `WrongObject`.
    fn kind(&self) -> ObjectKind;
    /// Its backend; a hello that wants another is refused with `BackendMismatch`.
    fn backend(&self) -> BackendKind;
    /// The offer for a peer that said a valid hello: the object's description (the `ObjectOffer` body) and the
    /// fds that travel with it (at most [`ipc_core::wire::MAX_FDS_PER_MESSAGE`]), or a refusal.
    ///
    /// # Errors
    /// The refusal code and the words the peer is told.
    fn offer(&self, peer: &PeerInfo) -> Result<(Vec<u8>, Vec<OwnedFd>), (RefusalCode, String)>;
    /// The peer confirmed the offer (`Attached`).
    fn attached(&self, _peer: &PeerInfo) {}
    /// What the object knows of an attached peer, in a few words for `gpu-ipc ps` (e.g. "holds 3 tasks"); at most
    /// 255 bytes are shown.
    fn describe(&self, _peer: &PeerInfo) -> String {
        String::new()
    }
    /// A peer that was made an offer is gone: its handshake failed after the offer, or its connection hung up after
    /// `Attached`. The door cannot tell a death from a clean close; what the peer left in shared state can.
    fn gone(&self, peer: &PeerInfo);
}

/// Settings of an [`ObjectDoor`].
#[derive(Debug, Clone)]
pub struct DoorConfig {
    /// Bound on one handshake, from accept to `Attached`.
    pub handshake_timeout: Duration,
    /// Connections in flight at most; a silent one is closed to make room.
    pub max_pending: usize,
    /// Who may connect besides the owner's user (mode 0600 and the owner's uid by default).
    pub access: SocketAccess,
}

impl Default for DoorConfig {
    fn default() -> Self {
        Self { handshake_timeout: Duration::from_secs(2), max_pending: 64, access: SocketAccess::default() }
    }
}

/// Why a door could not open, or a client could not attach.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DoorError {
    /// Nothing listens at the path.
    #[error("nothing listens at {}: start the process that creates the {kind} first", path.display())]
    NoOwner {
        /// The socket path.
        path: PathBuf,
        /// The kind the client wanted.
        kind: ObjectKind,
    },
    /// The owner refused the peer.
    #[error("the owner refused: {message} (code {code})")]
    Refused {
        /// Its code.
        code: RefusalCode,
        /// Its words.
        message: String,
    },
    /// The owner answered with something that is not an offer for the kind asked for.
    #[error("the owner at {} sent {what}, not an offer of a {kind}", path.display())]
    NotAnOffer {
        /// The socket path.
        path: PathBuf,
        /// The kind the client wanted.
        kind: ObjectKind,
        /// What it sent.
        what: String,
    },
    /// The answer to a status request is not a report.
    #[error("the owner at {} answered a status request with {what}, not a report", path.display())]
    NotAReport {
        /// The socket path.
        path: PathBuf,
        /// What it sent.
        what: String,
    },
    /// A wire or socket failure.
    #[error(transparent)]
    Wire(#[from] WireError),
    /// The door's thread could not start.
    #[error("starting the door's thread: {0}")]
    Thread(#[source] std::io::Error),
}

/// The owner's side: the socket, its admission thread and the thread that answers hellos and watches attached
/// peers. Dropping it stops both threads and removes the socket file; attached peers then see their connection
/// hang up.
pub struct ObjectDoor {
    path: PathBuf,
    registry: Arc<Mutex<Registry>>,
    stop: Arc<AtomicBool>,
    service: Option<JoinHandle<()>>,
}

impl std::fmt::Debug for ObjectDoor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ObjectDoor").field("path", &self.path).finish_non_exhaustive()
    }
}

/// The peers a door knows: offered (handshake in flight) and attached (with their connections).
#[derive(Default)]
struct Registry {
    next_id: u32,
    offered: HashMap<u32, PeerInfo>,
    attached: Vec<(PeerInfo, PeerConnection)>,
}

/// The front door's view of an object's records: peer numbers, which need no marking when a handshake fails (the
/// service thread tells the host on `Failed`), and the registry a status report is made from.
struct PeerNumbers {
    host: Arc<dyn ObjectHost>,
    registry: Arc<Mutex<Registry>>,
}

impl Records for PeerNumbers {
    type Id = u32;

    fn object(&self) -> ObjectKind {
        self.host.kind()
    }

    fn wire_id(id: u32) -> u32 {
        id
    }

    fn mark_dead(&self, _id: u32) -> Result<(), String> {
        Ok(())
    }

    fn peers(&self) -> Vec<PeerStatus> {
        let registry = self.registry.lock().unwrap_or_else(PoisonError::into_inner);
        let attached = registry.attached.iter().map(|(info, _)| (info, PeerState::Attached));
        let joining = registry.offered.values().map(|info| (info, PeerState::Joining));
        attached
            .chain(joining)
            .map(|(info, state)| PeerStatus {
                id: info.id,
                pid: info.pid,
                uid: info.uid,
                gid: info.gid,
                since_unix_ms: info
                    .since
                    .duration_since(std::time::UNIX_EPOCH)
                    .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX)),
                last_sign_ms: None,
                state,
                name: info.name.clone(),
                detail: truncate_detail(self.host.describe(info)),
            })
            .collect()
    }
}

/// At most [`MAX_STATUS_DETAIL_BYTES`] bytes of `text`, cut at a character boundary.
fn truncate_detail(mut text: String) -> String {
    let mut end = text.len().min(MAX_STATUS_DETAIL_BYTES);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    text.truncate(end);
    text
}

impl ObjectDoor {
    /// Binds `path` (a stale socket file of a dead owner is replaced; a live owner's is not) and starts serving
    /// `host`.
    ///
    /// # Errors
    /// The socket could not be bound ([`DoorError::Wire`]), or a thread not started.
    pub fn open(path: &Path, host: Arc<dyn ObjectHost>, config: DoorConfig) -> Result<Self, DoorError> {
        let listener = RendezvousListener::bind_with(path, &config.access)?;
        let path = listener.path().to_path_buf();
        let registry = Arc::new(Mutex::new(Registry::default()));
        let admission = Admission::start(
            listener,
            Arc::new(PeerNumbers { host: host.clone(), registry: registry.clone() }),
            AdmissionConfig {
                backend: host.backend(),
                handshake_timeout: config.handshake_timeout,
                max_pending: config.max_pending.max(1),
            },
        )
        .map_err(DoorError::Thread)?;
        let stop = Arc::new(AtomicBool::new(false));
        let service = {
            let (registry, stop) = (registry.clone(), stop.clone());
            std::thread::Builder::new()
                .name(format!("gpu-ipc-{}-door", host.kind()))
                .spawn(move || serve(&admission, host.as_ref(), &registry, &stop))
                .map_err(DoorError::Thread)?
        };
        tracing::info!(path = %path.display(), "object door open");
        Ok(Self { path, registry, stop, service: Some(service) })
    }

    /// The socket path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The peers attached now, oldest first.
    pub fn peers(&self) -> Vec<PeerInfo> {
        let registry = self.registry.lock().unwrap_or_else(PoisonError::into_inner);
        registry.attached.iter().map(|(info, _)| info.clone()).collect()
    }
}

impl Drop for ObjectDoor {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(service) = self.service.take() {
            let _ = service.join();
        }
    }
}

/// The service thread: answers hellos, records attaches, and reports peers whose connection hung up. The
/// admission thread (owned here) stops, and the socket file goes, when this returns.
fn serve(admission: &Admission<PeerNumbers>, host: &dyn ObjectHost, registry: &Mutex<Registry>, stop: &AtomicBool) {
    while !stop.load(Ordering::Acquire) {
        while let Some(event) = admission.try_next() {
            handle(admission, host, registry, event);
        }
        watch_attached(host, registry, admission.news());
    }
    let mut registry = registry.lock().unwrap_or_else(PoisonError::into_inner);
    registry.attached.clear();
}

fn handle(
    admission: &Admission<PeerNumbers>,
    host: &dyn ObjectHost,
    registry: &Mutex<Registry>,
    event: AdmissionEvent<u32>,
) {
    match event {
        AdmissionEvent::WantsOffer { token, name, peer, part, .. } => {
            let info = {
                let mut registry = registry.lock().unwrap_or_else(PoisonError::into_inner);
                let id = registry.next_id;
                registry.next_id = registry.next_id.wrapping_add(1);
                PeerInfo { id, pid: peer.pid, uid: peer.uid, gid: peer.gid, name, since: SystemTime::now(), part }
            };
            let kit = offer_for(host, &info);
            if kit.is_ok() {
                let mut registry = registry.lock().unwrap_or_else(PoisonError::into_inner);
                registry.offered.insert(info.id, info.clone());
            }
            if admission.offer(token, kit).is_some() {
                // The admission thread is gone: nobody will send the offer.
                registry.lock().unwrap_or_else(PoisonError::into_inner).offered.remove(&info.id);
                host.gone(&info);
            }
        }
        AdmissionEvent::Attached { id, conn, .. } => {
            let info = registry.lock().unwrap_or_else(PoisonError::into_inner).offered.remove(&id);
            if let Some(info) = info {
                tracing::info!(peer = id, pid = info.pid, name = %info.name, "peer attached");
                host.attached(&info);
                registry.lock().unwrap_or_else(PoisonError::into_inner).attached.push((info, conn));
            }
        }
        AdmissionEvent::Failed { id } => {
            let info = registry.lock().unwrap_or_else(PoisonError::into_inner).offered.remove(&id);
            if let Some(info) = info {
                host.gone(&info);
            }
        }
    }
}

fn offer_for(host: &dyn ObjectHost, info: &PeerInfo) -> ipc_core::door::admission::OfferKit<u32> {
    let (body, fds) = host.offer(info)?;
    let fd_count = u16::try_from(fds.len()).map_err(|_| (RefusalCode::ShuttingDown, "too many fds".to_owned()))?;
    let offer = ObjectOffer { kind: host.kind(), peer_id: info.id, fd_count, body };
    Ok((info.id, Message::ObjectOffer(offer), fds))
}

/// Waits up to [`WATCH_INTERVAL`] for an attached peer's connection to hang up (or say anything: after `Attached`
/// a peer only says `Detach` before it closes) and reports the ones that did.
fn watch_attached(host: &dyn ObjectHost, registry: &Mutex<Registry>, news: BorrowedFd<'_>) {
    // Poll duplicates of the sockets, so that the registry is not locked while waiting.
    let watched: Vec<(u32, OwnedFd)> = {
        let registry = registry.lock().unwrap_or_else(PoisonError::into_inner);
        registry
            .attached
            .iter()
            .filter_map(|(info, conn)| Some((info.id, conn.as_fd().try_clone_to_owned().ok()?)))
            .collect()
    };
    // The admission thread's news first: a hello waiting for its offer wakes the thread at once.
    let mut fds: Vec<PollFd<'_>> = std::iter::once(PollFd::from_borrowed_fd(news, PollFlags::IN))
        .chain(watched.iter().map(|(_, fd)| PollFd::new(fd, PollFlags::IN | PollFlags::RDHUP)))
        .collect();
    let timeout = Timespec { tv_sec: 0, tv_nsec: i64::try_from(WATCH_INTERVAL.as_nanos()).unwrap_or(20_000_000) };
    if poll(&mut fds, Some(&timeout)).is_err() {
        return;
    }
    let stirred: Vec<u32> =
        fds.iter().skip(1).zip(&watched).filter(|(fd, _)| !fd.revents().is_empty()).map(|(_, (id, _))| *id).collect();
    drop(fds);
    for id in stirred {
        let gone = {
            let mut registry = registry.lock().unwrap_or_else(PoisonError::into_inner);
            let Some(index) = registry.attached.iter().position(|(info, _)| info.id == id) else { continue };
            let hung_up = registry.attached.get(index).is_none_or(|(_, conn)| conn.is_peer_gone().unwrap_or(true));
            if hung_up {
                Some(registry.attached.swap_remove(index))
            } else {
                // It said something (a `Detach` before closing, or a hostile peer's bytes): what is there is read
                // and dropped without waiting for a whole message, so that poll stops reporting it and no peer can
                // hold this thread (waiting 1 ms for the rest of a message, a peer sending a byte at a time held
                // it 1 ms a round each: 60 of them slowed every new attach to 45-62 ms).
                if let Some((_, conn)) = registry.attached.get(index) {
                    conn.discard_unread();
                }
                None
            }
        };
        if let Some((info, conn)) = gone {
            tracing::info!(peer = info.id, pid = info.pid, name = %info.name, "peer gone");
            drop(conn);
            host.gone(&info);
        }
    }
}

/// The client's connection to an object's owner, kept for as long as the client uses the object: the owner's
/// hang-up says it is gone; dropping it tells the owner that this peer is.
#[derive(Debug)]
pub struct OwnerLink {
    conn: PeerConnection,
    peer_id: u32,
}

impl OwnerLink {
    /// The peer number the owner assigned.
    pub fn peer_id(&self) -> u32 {
        self.peer_id
    }

    /// The owner's credentials (`SO_PEERCRED`; pid `None` in a PID namespace this process cannot see).
    pub fn owner(&self) -> PeerCredentials {
        self.conn.peer()
    }

    /// Whether the owner has hung up (its process ended, or it dropped the object), without waiting.
    pub fn owner_gone(&self) -> bool {
        self.conn.is_peer_gone().unwrap_or(true)
    }
}

impl AsFd for OwnerLink {
    /// The connection, to poll in an event loop (readable or hung up: the owner is gone).
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.conn.as_fd()
    }
}

/// Connects to the owner of a `kind` at `path`, says hello, and hands the offer and its fds to `import`; on
/// success tells the owner `Attached` and returns what `import` made with the link to keep. On failure of
/// `import` the owner is told (`Detach`, import failed) and the error returned.
///
/// # Errors
/// [`DoorError::NoOwner`] when nothing listens at `path`; [`DoorError::Refused`] with the owner's words (another
/// kind of object, another backend, another user); [`DoorError::NotAnOffer`]; a timeout or wire failure
/// ([`DoorError::Wire`]); or whatever `import` returns.
pub fn attach<T, E: From<DoorError>>(
    path: &Path,
    kind: ObjectKind,
    wanted_backend: Option<BackendKind>,
    name: &str,
    timeout: Duration,
    import: impl FnOnce(&ObjectOffer, Vec<OwnedFd>) -> Result<T, E>,
) -> Result<(T, OwnerLink), E> {
    attach_part(path, kind, wanted_backend, name, 0, timeout, import)
}

/// [`attach`] to part `part` of a pool made of parts (a weight set on several devices: one part per device, one
/// socket); part 0 is what [`attach`] asks for. The hello names the part (`ClientHello::part`); an owner that has
/// no such part refuses ([`DoorError::Refused`], code 7), and an owner of a release before parts refuses the
/// hello as malformed (code 6): neither serves another part in its place.
///
/// # Errors
/// As [`attach`].
pub fn attach_part<T, E: From<DoorError>>(
    path: &Path,
    kind: ObjectKind,
    wanted_backend: Option<BackendKind>,
    name: &str,
    part: u32,
    timeout: Duration,
    import: impl FnOnce(&ObjectOffer, Vec<OwnedFd>) -> Result<T, E>,
) -> Result<(T, OwnerLink), E> {
    let deadline = Instant::now() + timeout;
    let left = || deadline.saturating_duration_since(Instant::now());
    let conn = PeerConnection::connect(path, timeout).map_err(|source| match source {
        WireError::NoProducer { .. } => DoorError::NoOwner { path: path.to_path_buf(), kind },
        other => DoorError::Wire(other),
    })?;
    let hello = ClientHello {
        protocol_version: PROTOCOL_VERSION,
        client_pid: std::process::id(),
        wanted_backend,
        consumer_name: name.to_owned(),
        object: kind,
        part,
    };
    let sent = conn.send(&Message::ClientHello(hello), Vec::new(), left());
    let answer = match (sent, conn.recv(left())) {
        (_, Ok(answer)) => answer,
        (Err(e), Err(_)) | (Ok(()), Err(e)) => return Err(DoorError::Wire(e).into()),
    };
    let offer = match answer.message {
        Message::ObjectOffer(offer) if offer.kind == kind => offer,
        Message::Refused(refused) => {
            return Err(DoorError::Refused { code: refused.code, message: refused.message }.into());
        }
        other => {
            let what = match &other {
                Message::ObjectOffer(offer) => format!("an offer of a {}", offer.kind),
                other => other.message_type().name().to_owned(),
            };
            return Err(DoorError::NotAnOffer { path: path.to_path_buf(), kind, what }.into());
        }
    };
    if answer.fds.len() != usize::from(offer.fd_count) {
        let e = WireError::FdCountMismatch {
            message: "ObjectOffer",
            expected: usize::from(offer.fd_count),
            received: answer.fds.len(),
        };
        return Err(DoorError::Wire(e).into());
    }
    let peer_id = offer.peer_id;
    match import(&offer, answer.fds) {
        Ok(made) => {
            conn.send(&Message::Attached(Attached { consumer_id: peer_id }), Vec::new(), left())
                .map_err(DoorError::Wire)?;
            Ok((made, OwnerLink { conn, peer_id }))
        }
        Err(e) => {
            let bye = Detach { consumer_id: peer_id, reason: DetachReason::ImportFailed };
            let _ = conn.send(&Message::Detach(bye), Vec::new(), Duration::from_millis(200));
            Err(e)
        }
    }
}

/// Asks the owner of the ring or object at `path` who is attached (what `gpu-ipc ps` shows). Needs no CUDA and
/// takes no record: the owner answers and hangs up.
///
/// # Errors
/// [`DoorError::NoOwner`] when nothing listens at `path`; [`DoorError::Refused`] (e.g. another user's socket);
/// [`DoorError::NotAReport`]; an owner of an older build answers with a refusal, code 6 ([`DoorError::Refused`]); a
/// timeout or wire failure.
pub fn status(path: &Path, timeout: Duration) -> Result<StatusReport, DoorError> {
    let deadline = Instant::now() + timeout;
    let left = || deadline.saturating_duration_since(Instant::now());
    let conn = PeerConnection::connect(path, timeout).map_err(|source| match source {
        WireError::NoProducer { .. } => DoorError::NoOwner { path: path.to_path_buf(), kind: ObjectKind::Ring },
        other => DoorError::Wire(other),
    })?;
    // (`NoOwner` names a ring: the common case; the words say to start the owner either way.)
    let sent = conn.send(&Message::StatusRequest(StatusRequest), Vec::new(), left());
    let answer = match (sent, conn.recv(left())) {
        (_, Ok(answer)) => answer,
        (Err(e), Err(_)) | (Ok(()), Err(e)) => return Err(DoorError::Wire(e)),
    };
    match answer.message {
        Message::StatusReport(report) => Ok(report),
        Message::Refused(refused) => Err(DoorError::Refused { code: refused.code, message: refused.message }),
        other => Err(DoorError::NotAReport { path: path.to_path_buf(), what: other.message_type().name().to_owned() }),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests;
