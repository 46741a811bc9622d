//! The `users` part: does the CUDA driver let a process of another user import the memory? A producer running as
//! this process's uid (root) serves consumers of uid 65534 (`nobody`): `--allow-uid 65534` (socket 0666, the uid
//! checked), and once `--socket-group 65534` (socket 0660, given to that group). The real consumer program, copied
//! where `nobody` can run it, is started as uid and gid 65534 with `--producer-uid` ours, and must import the ring
//! (legacy: `cuIpcOpenMemHandle`; vmm: the allocation's fd, `cuMemImportFromShareableHandle`) and verify
//! [`USERS_FRAMES`] frames, per backend and per strategy of [`USERS_SYNCS`].
//!
//! Either answer is the result ([`CrossUserAnswer`]): imported and verified passes; a consumer that failed with a
//! CUDA error before its first frame is a *finding* naming the error (the driver's answer, not a fault of the
//! harness); anything else fails (the producer did not stream, the socket refused the consumer, a hang, mismatched
//! words, a producer that did not survive the attempt). Needs root: every row is "not run", with why, otherwise.
//! `/dev/nvidia*` is checked for what uid 65534 can open.

use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use serde::Serialize;

use super::outcome::{ProcEnd, Status};
use super::procs::{Child, NOBODY, progress_frames, reachable_copy, socket_path, unsearchable_for, user_may};
use super::run::{Ctx, START_LIMIT};

/// Sync strategies of the part: one CPU-side, one GPU-side.
pub const USERS_SYNCS: [&str; 2] = ["cpu-spin", "gpu-stream-ops"];
/// Frames each consumer of another user must verify.
pub const USERS_FRAMES: u64 = 50;
/// Stderr lines of the consumer kept in the report.
const LAST_LINES: usize = 5;

/// How the producer's socket lets the other user in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum SocketDoor {
    /// `--allow-uid 65534`: mode 0666 and the peer's uid checked.
    Uid,
    /// `--socket-group 65534`: mode 0660, the file given to the group; the kernel checks membership.
    Group,
}

impl SocketDoor {
    /// The producer's options that open the door to `other` (a uid, or a gid).
    pub fn producer_args(self, other: u32) -> Vec<String> {
        let flag = match self {
            Self::Uid => "--allow-uid",
            Self::Group => "--socket-group",
        };
        vec![flag.to_owned(), other.to_string()]
    }

    /// Its words in tables.
    pub fn name(self) -> &'static str {
        match self {
            Self::Uid => "by uid (0666)",
            Self::Group => "by group (0660)",
        }
    }
}

/// What a consumer of another user got: the answer to "does the import work across users?".
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "kind", rename_all = "kebab-case")]
pub enum CrossUserAnswer {
    /// It imported the memory and verified every frame, 0 mismatched words.
    Verified,
    /// It failed with a CUDA error before its first frame: the driver's answer (a finding).
    Refused {
        /// The consumer's error line, with the CUDA call and result, e.g. `cuIpcOpenMemHandle failed:
        /// CUDA_ERROR_...`.
        error: String,
    },
    /// No answer to the question: something else went wrong (a check failure).
    Failed {
        /// What.
        reason: String,
    },
    /// Not run.
    NotRun {
        /// Why (no root, no copy of the consumer that uid 65534 can reach, ...).
        reason: String,
    },
}

impl CrossUserAnswer {
    /// The check's verdict: verified passes, refused is a finding.
    pub fn status(&self) -> Status {
        match self {
            Self::Verified => Status::Passed,
            Self::Refused { .. } => Status::Finding,
            Self::Failed { .. } => Status::Failed,
            Self::NotRun { .. } => Status::NotRun,
        }
    }

    /// In words, for tables.
    pub fn words(&self) -> String {
        match self {
            Self::Verified => format!("imported and verified {USERS_FRAMES} frames"),
            Self::Refused { error } => format!("refused: {error}"),
            Self::Failed { reason } => format!("no answer: {reason}"),
            Self::NotRun { reason } => format!("not run: {reason}"),
        }
    }
}

/// One consumer of uid 65534 against a producer of ours.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct UsersRun {
    /// Backend.
    pub backend: String,
    /// Sync strategy.
    pub sync: String,
    /// How the socket let the consumer in.
    pub door: SocketDoor,
    /// Whether it attached (a summary or a progress line came).
    pub attached: bool,
    /// Frames it verified.
    pub frames: u64,
    /// Mismatched words its verify kernel counted.
    pub mismatched_words: u64,
    /// The answer.
    pub answer: CrossUserAnswer,
    /// The consumer's exit code (`None`: not started, or ended by a signal).
    pub consumer_exit: Option<i32>,
    /// How the consumer ended: `exit N`, `hung (killed at its deadline)`, `killed by a signal`; `None` when it was
    /// not started.
    pub consumer_end: Option<String>,
    /// The consumer's last stderr lines (the exact CUDA error when it failed).
    pub consumer_last_lines: Vec<String>,
    /// How the producer ended (it must survive the attempt either way).
    pub producer: String,
    /// The check's verdict: the answer's, or failed when the producer did not end well.
    pub status: Status,
    /// What was seen, in one line.
    pub detail: String,
}

impl UsersRun {
    /// A row with this answer (its verdict and detail from it) and nothing seen yet.
    fn new(row: Row, answer: CrossUserAnswer) -> Self {
        Self {
            backend: row.backend.to_owned(),
            sync: row.sync.to_owned(),
            door: row.door,
            attached: false,
            frames: 0,
            mismatched_words: 0,
            status: answer.status(),
            detail: answer.words(),
            answer,
            consumer_exit: None,
            consumer_end: None,
            consumer_last_lines: Vec::new(),
            producer: String::new(),
        }
    }
}

/// A `/dev/nvidia*` device file and whether uid 65534 may open it for reading and writing.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct DeviceAccess {
    /// Its path.
    pub path: String,
    /// Its mode, in octal.
    pub mode: String,
    /// Its owner's uid.
    pub owner: u32,
    /// Its group.
    pub group: u32,
    /// Uid/gid 65534 has read and write permission (by the mode bits; ACLs are not read).
    pub read_write: bool,
}

/// The `users` part's results.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct UsersReport {
    /// The producer's uid (this process's).
    pub producer_uid: u32,
    /// The consumers' uid.
    pub consumer_uid: u32,
    /// The consumers' gid (no supplementary groups).
    pub consumer_gid: u32,
    /// The `/dev/nvidia*` device files.
    pub devices: Vec<DeviceAccess>,
    /// What the consumers' user can open of them, in words.
    pub devices_note: String,
    /// One per backend x strategy, and the group socket's.
    pub runs: Vec<UsersRun>,
}

/// One row of the part.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Row {
    /// Backend.
    pub backend: &'static str,
    /// Sync strategy.
    pub sync: &'static str,
    /// The socket's door.
    pub door: SocketDoor,
}

/// The rows: every backend x [`USERS_SYNCS`] through a socket open by uid, then one through a group socket (vmm
/// when it is among `backends`, with cpu-spin).
pub fn rows(backends: &[&'static str]) -> Vec<Row> {
    let mut rows: Vec<Row> = backends
        .iter()
        .flat_map(|&backend| USERS_SYNCS.iter().map(move |&sync| Row { backend, sync, door: SocketDoor::Uid }))
        .collect();
    let group_backend = if backends.contains(&"vmm") { Some("vmm") } else { backends.first().copied() };
    if let Some(backend) = group_backend {
        rows.push(Row { backend, sync: "cpu-spin", door: SocketDoor::Group });
    }
    rows
}

/// The `/dev/nvidia*` device files in `dev` (directories left out), by name, with what `uid`/`gid` may do.
pub fn device_access(dev: &Path, uid: u32, gid: u32) -> Vec<DeviceAccess> {
    use std::os::unix::fs::MetadataExt;
    let Ok(entries) = std::fs::read_dir(dev) else {
        return Vec::new();
    };
    let mut devices: Vec<DeviceAccess> = entries
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with("nvidia"))
        .filter_map(|e| {
            let path = e.path();
            let m = std::fs::metadata(&path).ok().filter(|m| !m.is_dir())?;
            Some(DeviceAccess {
                path: path.display().to_string(),
                mode: format!("{:04o}", m.mode() & 0o7777),
                owner: m.uid(),
                group: m.gid(),
                read_write: user_may(uid, gid, m.uid(), m.gid(), m.mode(), 0o6),
            })
        })
        .collect();
    devices.sort_by(|a, b| a.path.cmp(&b.path));
    devices
}

/// What `uid` can open of `devices`, in one sentence.
pub fn devices_note(devices: &[DeviceAccess], uid: u32) -> String {
    let closed: Vec<String> = devices
        .iter()
        .filter(|d| !d.read_write)
        .map(|d| format!("{} ({} {}:{})", d.path, d.mode, d.owner, d.group))
        .collect();
    if devices.is_empty() {
        "no /dev/nvidia* device files here".to_owned()
    } else if closed.is_empty() {
        let all = devices.iter().map(|d| d.path.as_str()).collect::<Vec<_>>().join(", ");
        format!("uid {uid} may open every /dev/nvidia* file read-write ({all})")
    } else {
        format!("uid {uid} may not open read-write: {}; its CUDA calls can fail for that alone", closed.join(", "))
    }
}

/// Runs the part for `backends` (root only).
pub fn users(ctx: &Ctx, backends: &[&'static str]) -> UsersReport {
    users_in(ctx, backends, rustix::process::geteuid().is_root(), Path::new("/dev"))
}

/// [`users`] with the root question answered and the device directory given (tests).
pub fn users_in(ctx: &Ctx, backends: &[&'static str], root: bool, dev: &Path) -> UsersReport {
    let producer_uid = rustix::process::geteuid().as_raw();
    let devices = device_access(dev, NOBODY, NOBODY);
    let mut report = UsersReport {
        producer_uid,
        consumer_uid: NOBODY,
        consumer_gid: NOBODY,
        devices_note: devices_note(&devices, NOBODY),
        devices,
        runs: Vec::new(),
    };
    let rows = rows(backends);
    let not_run = |reason: &str| {
        rows.iter().map(|&r| UsersRun::new(r, CrossUserAnswer::NotRun { reason: reason.to_owned() })).collect()
    };
    if !root {
        report.runs = not_run(&format!(
            "needs root to start a consumer as uid {NOBODY} (this process runs as uid {producer_uid})"
        ));
        return report;
    }
    let copy = match reachable_copy(&ctx.bins.consumer, "users") {
        Ok(copy) => copy,
        Err(e) => {
            report.runs = not_run(&format!("no copy of the consumer that uid {NOBODY} can run: {e}"));
            return report;
        }
    };
    let socket = socket_path("users");
    let dirs = [copy.program().parent(), socket.parent()];
    if let Some(why) = dirs.into_iter().flatten().find_map(|d| unsearchable_for(NOBODY, NOBODY, d)) {
        report.runs = not_run(&format!("set TMPDIR to a directory uid {NOBODY} can reach: {why}"));
        return report;
    }
    let closed_devices = report.devices.iter().any(|d| !d.read_write);
    for row in rows {
        let mut run = one(ctx, copy.program(), row, producer_uid);
        if closed_devices && run.status != Status::Passed {
            run.detail = format!("{}; {}", run.detail, report.devices_note);
        }
        report.runs.push(run);
    }
    report
}

/// The consumer's arguments: verify [`USERS_FRAMES`] frames from `socket`, accepting a producer of `producer_uid`.
pub fn consumer_args(socket: &Path, backend: &str, producer_uid: u32) -> Vec<String> {
    let (frames, uid) = (USERS_FRAMES.to_string(), producer_uid.to_string());
    Ctx::consumer_args(
        socket,
        backend,
        "users",
        &["--frames", &frames, "--progress-every", "10", "--producer-uid", &uid],
    )
}

/// The producer's options besides the socket, backend and strategy: streams to whoever comes until its stdin
/// closes, the door open to uid (or gid) 65534.
pub fn producer_extra(door: SocketDoor) -> Vec<String> {
    let mut extra: Vec<String> =
        ["--slots", "4", "--consumers", "0", "--frames", "0", "--until-stdin-closes", "--progress-every", "100"]
            .map(str::to_owned)
            .to_vec();
    extra.extend(door.producer_args(NOBODY));
    extra
}

/// One row: a streaming producer of ours, one consumer of uid 65534 (`consumer`, the reachable copy).
fn one(ctx: &Ctx, consumer: &Path, row: Row, producer_uid: u32) -> UsersRun {
    let socket = socket_path("users");
    let extra = producer_extra(row.door);
    let extra: Vec<&str> = extra.iter().map(String::as_str).collect();
    let started = ctx.producer(&socket, row.backend, row.sync, &extra).and_then(|mut producer| {
        match producer.wait_progress(100, Instant::now() + START_LIMIT) {
            Ok(()) => Ok(producer),
            Err(e) => {
                let _ = producer.finish(Instant::now() + Duration::from_secs(10));
                Err(e)
            }
        }
    });
    let mut producer = match started {
        Ok(p) => p,
        Err(e) => {
            let _ = std::fs::remove_file(&socket);
            return UsersRun::new(row, CrossUserAnswer::Failed { reason: format!("the producer did not stream: {e}") });
        }
    };
    let mut command = Command::new(consumer);
    command.args(consumer_args(&socket, row.backend, producer_uid)).uid(NOBODY).gid(NOBODY);
    let spawned = Child::spawn_command(&format!("consumer uid {NOBODY}"), &mut command, &ctx.env);
    let end = spawned.map(|c| c.finish(Instant::now() + START_LIMIT));
    producer.close_stdin();
    let producer = producer.finish(Instant::now() + Duration::from_secs(30));
    let _ = std::fs::remove_file(&socket);
    let end = match end {
        Ok(end) => end,
        Err(e) => return UsersRun::new(row, CrossUserAnswer::NotRun { reason: format!("as uid {NOBODY}: {e}") }),
    };
    let attached = end.summary.is_some() || end.stderr_tail.lines().any(|l| progress_frames(l).is_some());
    let mut run = UsersRun::new(row, answer_of(&end, attached));
    run.attached = attached;
    run.frames = end.count("frames").unwrap_or(0);
    run.mismatched_words = end.count("mismatched_words").unwrap_or(0);
    run.consumer_exit = end.exit;
    run.consumer_end = Some(match (end.hung, end.exit) {
        (true, _) => "hung (killed at its deadline)".to_owned(),
        (false, Some(code)) => format!("exit {code}"),
        (false, None) => "killed by a signal".to_owned(),
    });
    run.consumer_last_lines = last_lines(&end.stderr_tail);
    run.producer = producer.describe();
    run.detail = format!(
        "{}; {}; {} frames verified, {} mismatched words",
        run.answer.words(),
        end.describe(),
        run.frames,
        run.mismatched_words
    );
    if producer.exit != Some(0) {
        run.status = Status::Failed;
        run.detail = format!("{}; the producer did not survive the attempt: {}", run.detail, run.producer);
    }
    run
}

/// The last [`LAST_LINES`] non-empty lines of `tail`.
fn last_lines(tail: &str) -> Vec<String> {
    let lines: Vec<&str> = tail.lines().filter(|l| !l.trim().is_empty()).collect();
    lines[lines.len().saturating_sub(LAST_LINES)..].iter().map(|l| (*l).to_owned()).collect()
}

/// The answer a consumer's end gives: verified, refused by CUDA before its first frame, or no answer.
pub fn answer_of(end: &ProcEnd, attached: bool) -> CrossUserAnswer {
    let frames = end.count("frames").unwrap_or(0);
    let mismatched = end.count("mismatched_words").unwrap_or(0);
    if end.hung {
        return CrossUserAnswer::Failed { reason: format!("the consumer hung (killed after {START_LIMIT:?})") };
    }
    if end.exit == Some(0) && frames == USERS_FRAMES && mismatched == 0 {
        return CrossUserAnswer::Verified;
    }
    if end.summary.is_some() {
        return CrossUserAnswer::Failed {
            reason: format!("imported, but {frames} of {USERS_FRAMES} frames verified, {mismatched} mismatched words"),
        };
    }
    let cuda = end.stderr_tail.lines().rev().find(|l| l.contains("CUDA_ERROR_") || l.contains("no CUDA driver"));
    match cuda {
        Some(line) if !attached => CrossUserAnswer::Refused { error: line.trim().to_owned() },
        Some(line) => CrossUserAnswer::Failed { reason: format!("a CUDA error after attaching: {}", line.trim()) },
        None => CrossUserAnswer::Failed { reason: end.describe() },
    }
}

#[cfg(test)]
mod tests;
