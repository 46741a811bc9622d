//! `gpu-ipc doctor --check-socket PATH`: could this process attach to the producer whose rendezvous socket is at
//! PATH, and if not, why and what to do. No CUDA is needed: this is about the socket file, its directories, who
//! listens and whom it lets in.
//!
//! The facts are gathered by [`gather`] (file system, `connect`, `SO_PEERCRED`, and a short wait for an immediate
//! `Refused`: a producer that does not allow our uid says so before it reads anything); [`findings`] draws the
//! conclusions from them with a pure function, so every conclusion is tested without sockets. Nothing is sent: the
//! producer sees a client that connected and left without a word, which costs it nothing.

use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::time::Duration;

use gpu_ipc::core::wire::{Message, PeerConnection, PeerPolicy, WireError};
use rustix::fs::{Access, AtFlags, CWD, accessat};
use serde::Serialize;

use super::finding::{Finding, Severity};

/// How long to wait for a producer's immediate refusal after connecting.
const REFUSAL_WAIT: Duration = Duration::from_millis(300);

/// What was found at the path, in the order it was looked at.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SocketFacts {
    /// The path asked about.
    pub path: PathBuf,
    /// Our effective uid and gid, and our supplementary groups.
    pub uid: u32,
    /// Our effective gid.
    pub gid: u32,
    /// Our supplementary groups.
    pub groups: Vec<u32>,
    /// The first directory above the path that we cannot search (`x`), if any.
    pub unsearchable_dir: Option<PathBuf>,
    /// What is at the path.
    pub file: FileFacts,
    /// What connecting gave.
    pub connect: ConnectFacts,
}

/// The file at the path.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum FileFacts {
    /// Nothing there (or a directory on the way is missing).
    Missing,
    /// Something we could not `lstat` (the error).
    Unreadable {
        /// The OS error, in words.
        error: String,
    },
    /// Not a socket.
    NotSocket,
    /// A socket file.
    Socket {
        /// Its permission bits.
        mode: u32,
        /// Its owner.
        owner_uid: u32,
        /// Its group.
        owner_gid: u32,
        /// Whether we may write it (what `connect` needs), by the effective ids.
        writable: bool,
    },
}

/// What `connect` and the moments after it gave.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum ConnectFacts {
    /// Not tried (nothing to connect to).
    NotTried,
    /// Nobody listens (`ECONNREFUSED`): a socket left by a producer that stopped or died.
    NobodyListens,
    /// The kernel refused us (`EACCES`/`EPERM`).
    PermissionDenied,
    /// The producer's backlog is full (`connect` timed out).
    Busy,
    /// Another error.
    Failed {
        /// The OS error, in words.
        error: String,
    },
    /// Connected.
    Connected {
        /// The producer's uid (`SO_PEERCRED`).
        producer_uid: u32,
        /// Its pid as we see it; `None` in a PID namespace we cannot see.
        producer_pid: Option<u32>,
        /// The refusal it sent at once, if any: (code, message).
        refused: Option<(u8, String)>,
    },
}

/// Gathers the facts about `path`.
pub fn gather(path: &Path) -> SocketFacts {
    let uid = rustix::process::geteuid().as_raw();
    let gid = rustix::process::getegid().as_raw();
    let groups = rustix::process::getgroups().map(|g| g.into_iter().map(|g| g.as_raw()).collect()).unwrap_or_default();
    let unsearchable_dir = path
        .ancestors()
        .skip(1)
        .filter(|dir| !dir.as_os_str().is_empty())
        .collect::<Vec<_>>()
        .into_iter()
        .rev()
        .find(|dir| accessat(CWD, *dir, Access::EXEC_OK, AtFlags::EACCESS).is_err())
        .map(Path::to_path_buf);
    let file = match std::fs::symlink_metadata(path) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => FileFacts::Missing,
        Err(e) => FileFacts::Unreadable { error: e.to_string() },
        Ok(meta) if !meta.file_type().is_socket() => FileFacts::NotSocket,
        Ok(meta) => FileFacts::Socket {
            mode: meta.mode() & 0o7777,
            owner_uid: meta.uid(),
            owner_gid: meta.gid(),
            writable: accessat(CWD, path, Access::WRITE_OK, AtFlags::EACCESS).is_ok(),
        },
    };
    let connect = match file {
        FileFacts::Socket { .. } => connect(path),
        _ => ConnectFacts::NotTried,
    };
    SocketFacts { path: path.to_path_buf(), uid, gid, groups, unsearchable_dir, file, connect }
}

fn connect(path: &Path) -> ConnectFacts {
    // Any producer uid is accepted here: telling whether it is ours is a finding, not a failure to connect.
    let conn = match PeerConnection::connect_with(path, Duration::from_secs(1), &PeerPolicy::AnyUser) {
        Ok(conn) => conn,
        Err(WireError::NoProducer { .. }) => return ConnectFacts::NobodyListens,
        Err(WireError::PermissionDenied { .. }) => return ConnectFacts::PermissionDenied,
        Err(WireError::Timeout { .. }) => return ConnectFacts::Busy,
        Err(e) => return ConnectFacts::Failed { error: e.to_string() },
    };
    let refused = match conn.recv(REFUSAL_WAIT) {
        Ok(received) => match received.message {
            Message::Refused(r) => Some((r.code as u8, r.message)),
            _ => None,
        },
        Err(_) => None,
    };
    let peer = conn.peer();
    ConnectFacts::Connected { producer_uid: peer.uid, producer_pid: peer.pid, refused }
}

fn finding(id: &str, severity: Severity, what: String, why: &str, fix: Option<String>) -> Finding {
    Finding { id: id.to_owned(), severity, what, why: why.to_owned(), fix }
}

/// The conclusions, most severe first. An empty list of failures means a consumer running as this user could
/// attach (as far as the socket goes: backend, strategy and CUDA are the rest of the doctor's business).
pub fn findings(facts: &SocketFacts) -> Vec<Finding> {
    let path = facts.path.display();
    let mut found = Vec::new();
    if let Some(dir) = &facts.unsearchable_dir {
        found.push(finding(
            "socket-dir-not-searchable",
            Severity::Fail,
            format!("directory {} is not searchable by uid {}", dir.display(), facts.uid),
            "reaching a socket needs search (x) permission on every directory above it",
            Some(format!(
                "chmod o+x {} (or g+x with this user in its group), or put the socket elsewhere",
                dir.display()
            )),
        ));
    }
    match &facts.file {
        FileFacts::Missing => found.push(finding(
            "socket-missing",
            Severity::Fail,
            format!("nothing at {path}"),
            "the producer creates its socket when it starts and removes it when it stops",
            Some(
                "start the producer, or pass the path it uses (--socket); in a container, mount the socket's \
                 directory from the host (e.g. docker -v /run/frames:/run/frames)"
                    .to_owned(),
            ),
        )),
        FileFacts::Unreadable { error } => found.push(finding(
            "socket-unreadable",
            Severity::Fail,
            format!("cannot look at {path}: {error}"),
            "the path or a directory on it is not accessible to this user",
            None,
        )),
        FileFacts::NotSocket => found.push(finding(
            "socket-not-a-socket",
            Severity::Fail,
            format!("{path} is not a socket"),
            "a producer never replaces anything but a stale socket at its path",
            Some("remove the file, or give the producer another --socket path".to_owned()),
        )),
        FileFacts::Socket { mode, owner_uid, owner_gid, writable } => {
            if !writable {
                let member = facts.gid == *owner_gid || facts.groups.contains(owner_gid);
                found.push(finding(
                    "socket-no-permission",
                    Severity::Fail,
                    format!(
                        "{path} (mode {mode:04o}, owner uid {owner_uid}, group {owner_gid}) is not writable by uid {} \
                         (gid {}, groups {:?})",
                        facts.uid, facts.gid, facts.groups
                    ),
                    "connecting to a Unix socket needs write permission on its file; the producer's socket is mode \
                     0600 (its user alone) unless it was told otherwise",
                    Some(if member {
                        format!("the producer can open its socket to its group: --socket-group {owner_gid} (mode 0660)")
                    } else {
                        format!(
                            "start the producer with --allow-uid {} (mode 0666 and a uid check), or with \
                             --socket-group GID for a group this user is in (in code: ProducerConfig::access), or run \
                             the consumer as uid {owner_uid}",
                            facts.uid
                        )
                    }),
                ));
            }
        }
    }
    match &facts.connect {
        ConnectFacts::NotTried => {}
        ConnectFacts::NobodyListens => found.push(finding(
            "socket-stale",
            Severity::Fail,
            format!("nobody listens on {path}"),
            "the socket was left by a producer that stopped or died; the next producer on this path replaces it",
            Some("start the producer".to_owned()),
        )),
        ConnectFacts::PermissionDenied => {
            if !found.iter().any(|f| f.id == "socket-no-permission") {
                found.push(finding(
                    "socket-connect-denied",
                    Severity::Fail,
                    format!("connect to {path} was denied"),
                    "the kernel refused the connection (a security module, or a directory's permissions)",
                    None,
                ));
            }
        }
        ConnectFacts::Busy => found.push(finding(
            "socket-busy",
            Severity::Warn,
            format!("the producer at {path} did not take the connection within 1 s"),
            "its backlog of connections is full: it is overloaded, or not serving its front door",
            Some("try again; check the producer's logs".to_owned()),
        )),
        ConnectFacts::Failed { error } => found.push(finding(
            "socket-connect-failed",
            Severity::Fail,
            format!("connect to {path} failed: {error}"),
            "an unexpected error",
            None,
        )),
        ConnectFacts::Connected { producer_uid, producer_pid, refused } => {
            if let Some((code, message)) = refused {
                found.push(finding(
                    "producer-refuses-uid",
                    Severity::Fail,
                    format!("the producer refused uid {} at once (code {code}: {message})", facts.uid),
                    "the producer checks each consumer's uid (SO_PEERCRED) against its policy",
                    Some(format!(
                        "start the producer with --allow-uid {} (in code: ProducerConfig::access = \
                         SocketAccess::users([{}]))",
                        facts.uid, facts.uid
                    )),
                ));
            }
            if *producer_uid != facts.uid {
                found.push(finding(
                    "producer-other-user",
                    Severity::Warn,
                    format!("the producer runs as uid {producer_uid}, this process as uid {}", facts.uid),
                    "a consumer accepts only a producer of its own uid unless told otherwise, so that a socket \
                     planted by another user cannot feed it memory",
                    Some(format!(
                        "start the consumer with --producer-uid {producer_uid} (in code: AttachOptions::producer = \
                         PeerPolicy::Users(vec![{producer_uid}]))"
                    )),
                ));
            }
            if producer_pid.is_none() {
                found.push(finding(
                    "producer-other-pid-namespace",
                    Severity::Info,
                    "the producer is in a PID namespace this process cannot see (SO_PEERCRED pid 0)".to_owned(),
                    "fine: its liveness comes from the connection, not its pid",
                    None,
                ));
            }
        }
    }
    found.sort_by_key(|f| std::cmp::Reverse(f.severity));
    found
}

/// The report of `--check-socket`: the facts, the findings and the verdict.
#[derive(Debug, Serialize)]
pub struct SocketReport {
    /// What was found.
    pub facts: SocketFacts,
    /// What it means.
    pub findings: Vec<Finding>,
    /// Whether a consumer running as this user can attach (no failing finding).
    pub attachable: bool,
}

impl SocketReport {
    /// Gathers and judges.
    pub fn new(facts: SocketFacts) -> Self {
        let findings = findings(&facts);
        let attachable = findings.iter().all(|f| f.severity != Severity::Fail);
        Self { facts, findings, attachable }
    }

    /// The plain-text report.
    pub fn text(&self) -> String {
        let mut out = format!("gpu-ipc doctor: rendezvous socket {}\n", self.facts.path.display());
        out.push_str(&match &self.facts.connect {
            ConnectFacts::Connected { producer_uid, producer_pid, .. } => format!(
                "  a producer listens: uid {producer_uid}, {}\n",
                producer_pid.map_or("pid unknown (another PID namespace)".to_owned(), |p| format!("pid {p}"))
            ),
            _ => "  no producer reached\n".to_owned(),
        });
        out.push_str(&super::render::findings_text(&self.findings));
        let other_user = self.findings.iter().any(|f| f.id == "producer-other-user");
        out.push_str(match (self.attachable, other_user) {
            (true, false) => "  verdict: a consumer running as this user can attach here\n",
            (true, true) => {
                "  verdict: a consumer running as this user can attach here once it accepts the producer's uid \
                 (see WARN above)\n"
            }
            (false, _) => "  verdict: a consumer running as this user cannot attach here (see FAIL above)\n",
        });
        out
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    fn facts(file: FileFacts, connect: ConnectFacts) -> SocketFacts {
        SocketFacts {
            path: PathBuf::from("/run/frames/cam0.sock"),
            uid: 1001,
            gid: 1001,
            groups: vec![44],
            unsearchable_dir: None,
            file,
            connect,
        }
    }

    fn socket(mode: u32, owner_uid: u32, owner_gid: u32, writable: bool) -> FileFacts {
        FileFacts::Socket { mode, owner_uid, owner_gid, writable }
    }

    fn ids(facts: &SocketFacts) -> Vec<String> {
        findings(facts).into_iter().map(|f| f.id).collect()
    }

    #[test]
    fn each_fact_gives_its_finding() {
        let connected = |uid, refused| ConnectFacts::Connected { producer_uid: uid, producer_pid: Some(7), refused };
        assert_eq!(ids(&facts(FileFacts::Missing, ConnectFacts::NotTried)), ["socket-missing"]);
        assert_eq!(ids(&facts(FileFacts::NotSocket, ConnectFacts::NotTried)), ["socket-not-a-socket"]);
        assert_eq!(ids(&facts(socket(0o600, 1001, 1001, true), ConnectFacts::NobodyListens)), ["socket-stale"]);
        assert!(ids(&facts(socket(0o600, 1001, 1001, true), connected(1001, None))).is_empty());
        assert_eq!(
            ids(&facts(socket(0o600, 998, 998, false), ConnectFacts::PermissionDenied)),
            ["socket-no-permission"]
        );
        assert_eq!(
            ids(&facts(socket(0o666, 998, 998, true), connected(998, Some((4, "no".into()))))),
            ["producer-refuses-uid", "producer-other-user"]
        );
        assert_eq!(ids(&facts(socket(0o666, 998, 998, true), connected(998, None))), ["producer-other-user"]);
        let mut hidden = facts(socket(0o600, 1001, 1001, true), connected(1001, None));
        hidden.connect = ConnectFacts::Connected { producer_uid: 1001, producer_pid: None, refused: None };
        assert_eq!(ids(&hidden), ["producer-other-pid-namespace"]);
        let mut closed_dir = facts(FileFacts::Missing, ConnectFacts::NotTried);
        closed_dir.unsearchable_dir = Some(PathBuf::from("/run/frames"));
        assert_eq!(ids(&closed_dir), ["socket-dir-not-searchable", "socket-missing"]);
    }

    #[test]
    fn every_finding_id_is_in_the_docs() {
        let docs = include_str!("../../docs/doctor.md");
        let source = include_str!("socket.rs");
        // Every id this module can emit is a string literal passed to `finding(`.
        let emitted: Vec<&str> = source
            .split("finding(\n")
            .skip(1)
            .filter_map(|rest| rest.trim_start().strip_prefix('"')?.split('"').next())
            .collect();
        assert!(emitted.len() >= 10, "{emitted:?}");
        for id in emitted {
            assert!(docs.contains(&format!("`{id}`")), "docs/doctor.md does not list finding {id}");
        }
    }

    #[test]
    fn the_fix_for_a_closed_socket_depends_on_the_group() {
        // In the socket's group (44): open the socket to the group. Not in it: name the uid.
        let in_group = findings(&facts(socket(0o600, 998, 44, false), ConnectFacts::PermissionDenied));
        assert!(in_group[0].fix.as_deref().unwrap().contains("--socket-group 44"), "{in_group:?}");
        let outside = findings(&facts(socket(0o600, 998, 998, false), ConnectFacts::PermissionDenied));
        assert!(outside[0].fix.as_deref().unwrap().contains("--allow-uid 1001"), "{outside:?}");
    }

    #[test]
    fn real_sockets_missing_stale_and_live() {
        let dir = std::env::temp_dir().join(format!("gpu-ipc-doctor-socket-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let missing = SocketReport::new(gather(&dir.join("none.sock")));
        assert!(!missing.attachable);
        assert_eq!(missing.findings[0].id, "socket-missing");

        let file = dir.join("file.sock");
        std::fs::write(&file, b"").unwrap();
        assert_eq!(SocketReport::new(gather(&file)).findings[0].id, "socket-not-a-socket");

        // A socket nobody listens on: bound, then the listener closed (std leaves the file).
        let stale = dir.join("stale.sock");
        drop(std::os::unix::net::UnixListener::bind(&stale).unwrap());
        assert_eq!(SocketReport::new(gather(&stale)).findings[0].id, "socket-stale");

        // A live producer socket of our own user: attachable, and it answered nothing (we sent nothing).
        let live = dir.join("live.sock");
        let listener = gpu_ipc::core::wire::RendezvousListener::bind(&live).unwrap();
        let report = SocketReport::new(gather(&live));
        assert!(report.attachable, "{}", report.text());
        assert!(matches!(report.facts.connect, ConnectFacts::Connected { refused: None, .. }), "{report:?}");
        assert!(report.text().contains("can attach"), "{}", report.text());
        drop(listener);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
