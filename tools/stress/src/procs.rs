//! The child processes of a stress run: the staged `producer` and `consumer` programs, spawned with piped output
//! (stderr lines watched for progress, the last ones kept; stdout kept for the `--json` summary), every wait
//! bounded, a process past its deadline killed and counted as hung.

use std::collections::VecDeque;
use std::ffi::OsString;
use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex, mpsc};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::outcome::ProcEnd;

/// Lines of stderr kept per process.
const TAIL_LINES: usize = 30;

/// Where the example programs are.
#[derive(Debug, Clone)]
pub struct Bins {
    /// The `producer` program.
    pub producer: PathBuf,
    /// The `consumer` program.
    pub consumer: PathBuf,
}

impl Bins {
    /// `producer` and `consumer` in `dir`, or next to this program (`stage/bin/`, `target/release/`).
    ///
    /// # Errors
    /// Which program is missing where, and what to do.
    pub fn find(dir: Option<&Path>) -> Result<Self, String> {
        let dir = match dir {
            Some(dir) => dir.to_owned(),
            None => std::env::current_exe()
                .ok()
                .and_then(|exe| exe.parent().map(Path::to_owned))
                .ok_or("cannot find the directory of this program; pass --bin-dir")?,
        };
        let find = |name: &str| {
            let path = dir.join(name);
            if path.is_file() {
                Ok(path)
            } else {
                Err(format!(
                    "no `{name}` program in {}: build the examples (`cargo build --release -p gpu-ipc-examples`, or \
                     scripts/stage-gpu.sh) or pass --bin-dir",
                    dir.display()
                ))
            }
        };
        Ok(Self { producer: find("producer")?, consumer: find("consumer")? })
    }

    /// Another staged example (`pool`, `semaphore`, `work_queue`, `pipeline`) beside the producer.
    ///
    /// # Errors
    /// It is not there, and what to do.
    pub fn tool(&self, name: &str) -> Result<PathBuf, String> {
        let dir = self.producer.parent().unwrap_or(Path::new("."));
        let path = dir.join(name);
        if path.is_file() {
            Ok(path)
        } else {
            Err(format!("no `{name}` program in {} (scripts/stage-gpu.sh stages it)", dir.display()))
        }
    }
}

/// The environment every child gets on top of ours (the MPS client variables, when a daemon runs).
pub type ChildEnv = Vec<(OsString, OsString)>;

/// A running child.
pub struct Child {
    name: String,
    child: std::process::Child,
    lines: mpsc::Receiver<String>,
    tail: Arc<Mutex<VecDeque<String>>>,
    stdout: Option<JoinHandle<String>>,
    stderr: Option<JoinHandle<()>>,
    /// When it was started.
    pub started: Instant,
}

impl Child {
    /// Starts `program args` with `env` added; stdin is a pipe (closing it ends a `--until-stdin-closes`
    /// producer) or nothing.
    ///
    /// # Errors
    /// The program could not be started.
    pub fn spawn(name: &str, program: &Path, args: &[String], env: &ChildEnv) -> Result<Self, String> {
        Self::spawn_command(name, Command::new(program).args(args), env)
    }

    /// As [`Child::spawn`], with a prepared command (e.g. `unshare ... consumer ...`).
    ///
    /// # Errors
    /// The program could not be started.
    pub fn spawn_command(name: &str, command: &mut Command, env: &ChildEnv) -> Result<Self, String> {
        let mut child = command
            .envs(env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| format!("cannot start {name} ({:?}): {e}", command.get_program()))?;
        let (tx, lines) = mpsc::channel();
        let tail: Arc<Mutex<VecDeque<String>>> = Arc::default();
        let stderr = child.stderr.take().map(|stderr| {
            let tail = tail.clone();
            std::thread::spawn(move || {
                for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                    if let Ok(mut tail) = tail.lock() {
                        if tail.len() == TAIL_LINES {
                            tail.pop_front();
                        }
                        tail.push_back(line.clone());
                    }
                    let _ = tx.send(line);
                }
            })
        });
        let stdout = child.stdout.take().map(|mut stdout| {
            std::thread::spawn(move || {
                let mut text = String::new();
                let _ = stdout.read_to_string(&mut text);
                text
            })
        });
        Ok(Self { name: name.to_owned(), child, lines, tail, stdout, stderr, started: Instant::now() })
    }

    /// Its pid.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Waits until a stderr line satisfies `wanted`.
    ///
    /// # Errors
    /// The process ended first (its last lines), or `deadline` passed.
    pub fn wait_line(&mut self, mut wanted: impl FnMut(&str) -> bool, deadline: Instant) -> Result<(), String> {
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left.min(Duration::from_millis(100))) {
                Ok(line) if wanted(&line) => return Ok(()),
                Ok(_) => {}
                Err(mpsc::RecvTimeoutError::Disconnected) => {
                    let status = self.child.wait().map(|s| s.to_string()).unwrap_or_else(|e| e.to_string());
                    return Err(format!("{} ended ({status}) before: {}", self.name, self.tail_text().trim_end()));
                }
                Err(mpsc::RecvTimeoutError::Timeout) if Instant::now() >= deadline => {
                    return Err(format!("{} did not get there in time", self.name));
                }
                Err(mpsc::RecvTimeoutError::Timeout) => {}
            }
        }
    }

    /// Waits for its `frame N` progress report with N >= `frames`.
    ///
    /// # Errors
    /// As [`Child::wait_line`].
    pub fn wait_progress(&mut self, frames: u64, deadline: Instant) -> Result<(), String> {
        self.wait_line(|line| progress_frames(line).is_some_and(|n| n >= frames), deadline)
    }

    /// The frame count of its next `frame N` progress report.
    ///
    /// # Errors
    /// As [`Child::wait_line`].
    pub fn next_progress(&mut self, deadline: Instant) -> Result<u64, String> {
        let mut seen = None;
        self.wait_line(
            |line| {
                let n = progress_frames(line);
                if n.is_some() {
                    seen = n;
                }
                n.is_some()
            },
            deadline,
        )?;
        seen.ok_or_else(|| format!("{}: no progress line", self.name))
    }

    /// Writes `text` to its stdin (best effort: a program that exits without reading is answered by its status).
    pub fn write_stdin(&mut self, text: &str) {
        use std::io::Write;
        if let Some(stdin) = self.child.stdin.as_mut() {
            let _ = stdin.write_all(text.as_bytes());
        }
    }

    /// Closes its stdin (a `--until-stdin-closes` producer then finishes its run).
    pub fn close_stdin(&mut self) {
        drop(self.child.stdin.take());
    }

    /// SIGKILL, now.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
    }

    fn tail_text(&self) -> String {
        self.tail.lock().map(|t| t.iter().map(|l| format!("{l}\n")).collect()).unwrap_or_default()
    }

    fn end(mut self, exit: Option<i32>, hung: bool, after_kill_s: Option<f64>) -> ProcEnd {
        // The pipes close with the process; the readers end then.
        let stdout = self.stdout.take().and_then(|h| h.join().ok()).unwrap_or_default();
        if let Some(h) = self.stderr.take() {
            let _ = h.join();
        }
        let summary = stdout.lines().rev().find_map(|l| serde_json::from_str::<serde_json::Value>(l).ok());
        ProcEnd { name: self.name.clone(), exit, hung, after_kill_s, summary, stderr_tail: self.tail_text() }
    }

    /// Waits for it to end, at most until `deadline` (then it is killed and counted as hung).
    pub fn finish(self, deadline: Instant) -> ProcEnd {
        finish_all(vec![self], deadline, None).pop().unwrap_or_default()
    }
}

/// Waits for every child to end (polled every millisecond, so exit times are exact to about 1 ms), at most until
/// `deadline`; those still running then are killed and marked hung. `killed_at`: when the trial's victim was
/// killed; each end records how long after it the process ended.
pub fn finish_all(children: Vec<Child>, deadline: Instant, killed_at: Option<Instant>) -> Vec<ProcEnd> {
    /// A child and, once it ended, its exit code and when.
    type Slot = (Child, Option<(Option<i32>, Instant)>);
    let mut slots: Vec<Slot> = children.into_iter().map(|c| (c, None)).collect();
    loop {
        for (child, ended) in &mut slots {
            if ended.is_none()
                && let Ok(Some(status)) = child.child.try_wait()
            {
                *ended = Some((status.code(), Instant::now()));
            }
        }
        if slots.iter().all(|(_, e)| e.is_some()) || Instant::now() >= deadline {
            break;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    slots
        .into_iter()
        .map(|(mut child, ended)| match ended {
            Some((code, at)) => {
                let after = killed_at.map(|k| at.saturating_duration_since(k).as_secs_f64());
                child.end(code, false, after)
            }
            None => {
                child.kill();
                let _ = child.child.wait();
                child.end(None, true, None)
            }
        })
        .collect()
}

/// N in a progress line `producer: frame N` / `consumer NAME: frame N`.
pub fn progress_frames(line: &str) -> Option<u64> {
    let (_, n) = line.rsplit_once(": frame ")?;
    n.trim().parse().ok()
}

/// Open fds of process `pid` (root or the same user), or `None`.
pub fn fd_count(pid: u32) -> Option<u64> {
    std::fs::read_dir(format!("/proc/{pid}/fd")).ok().map(|d| d.count() as u64)
}

/// Polls `pid`'s fd count until it is at most `baseline` or `limit` passes; returns the last count.
pub fn fds_settle(pid: u32, baseline: u64, limit: Duration) -> Option<u64> {
    let deadline = Instant::now() + limit;
    loop {
        let now = fd_count(pid);
        if now.is_none_or(|n| n <= baseline) || Instant::now() >= deadline {
            return now;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A temporary rendezvous socket path, unique in this run.
pub fn socket_path(tag: &str) -> PathBuf {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    std::env::temp_dir().join(format!("gpu-ipc-stress-{}-{tag}-{n}.sock", std::process::id()))
}

/// The uid and gid of `nobody`, the other user of the `hostile` and `users` parts.
pub const NOBODY: u32 = 65534;

/// A copy of a program that another user can run: a fresh directory (0755) in the temporary directory holding the
/// program (0755). Removed when dropped.
#[derive(Debug)]
pub struct ReachableCopy {
    dir: PathBuf,
    program: PathBuf,
}

impl ReachableCopy {
    /// The copied program.
    pub fn program(&self) -> &Path {
        &self.program
    }
}

impl Drop for ReachableCopy {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Copies `program` where another user can run it (the staged programs usually sit under a home directory it
/// cannot search): `$TMPDIR/gpu-ipc-stress-TAG-PID-N/NAME`, directory and file 0755, the name kept.
///
/// # Errors
/// What could not be made, copied or chmod-ed, naming the path.
pub fn reachable_copy(program: &Path, tag: &str) -> Result<ReachableCopy, String> {
    use std::os::unix::fs::PermissionsExt;
    let name = program.file_name().ok_or_else(|| format!("{} names no program", program.display()))?;
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    let dir = std::env::temp_dir().join(format!("gpu-ipc-stress-{tag}-{}-{n}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir(&dir).map_err(|e| format!("mkdir {}: {e}", dir.display()))?;
    // From here on, dropping the copy removes the directory.
    let copy = ReachableCopy { program: dir.join(name), dir };
    let chmod = |path: &Path| {
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755))
            .map_err(|e| format!("chmod 0755 {}: {e}", path.display()))
    };
    chmod(&copy.dir)?;
    std::fs::copy(program, &copy.program).map_err(|e| format!("copy {}: {e}", program.display()))?;
    chmod(&copy.program)?;
    Ok(copy)
}

/// Whether the user `uid`, with the one group `gid` (no supplementary groups: what `Command::uid` leaves a
/// process started by root), has every permission bit of `wanted` (`0o4` read, `0o2` write, `0o1` execute or
/// search) on a file of this owner, group and mode. ACLs are not read.
pub fn user_may(uid: u32, gid: u32, owner: u32, group: u32, mode: u32, wanted: u32) -> bool {
    let bits = if uid == owner {
        mode >> 6
    } else if gid == group {
        mode >> 3
    } else {
        mode
    };
    bits & wanted == wanted
}

/// The first directory from the root down to `dir` (included) that `uid`/`gid` cannot search, with its mode and
/// owner; `None` when it can reach `dir`.
pub fn unsearchable_for(uid: u32, gid: u32, dir: &Path) -> Option<String> {
    use std::os::unix::fs::MetadataExt;
    let mut ancestors: Vec<&Path> = dir.ancestors().collect();
    ancestors.reverse();
    for a in ancestors {
        match std::fs::metadata(a) {
            Ok(m) if user_may(uid, gid, m.uid(), m.gid(), m.mode(), 0o1) => {}
            Ok(m) => {
                return Some(format!(
                    "{} (mode {:04o}, owner {}:{}) is not searchable by uid {uid}",
                    a.display(),
                    m.mode() & 0o7777,
                    m.uid(),
                    m.gid()
                ));
            }
            Err(e) => return Some(format!("{}: {e}", a.display())),
        }
    }
    None
}

/// Strings from string literals, for argument lists.
pub fn args(list: &[&str]) -> Vec<String> {
    list.iter().map(|s| (*s).to_owned()).collect()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn progress_lines_parse() {
        assert_eq!(progress_frames("producer: frame 150"), Some(150));
        assert_eq!(progress_frames("consumer a: frame 7"), Some(7));
        assert_eq!(progress_frames("producer: waiting for 2 consumer(s)"), None);
    }

    #[test]
    fn a_child_reports_its_exit_summary_and_last_lines_and_a_hang_is_killed() {
        let env = ChildEnv::new();
        let mut sh = Child::spawn(
            "sh",
            Path::new("/bin/sh"),
            &args(&["-c", "echo 'x: frame 5' >&2; echo oops >&2; echo '{\"frames\": 3}'; exit 4"]),
            &env,
        )
        .unwrap();
        sh.wait_progress(5, Instant::now() + Duration::from_secs(10)).unwrap();
        let end = sh.finish(Instant::now() + Duration::from_secs(10));
        assert_eq!(end.exit, Some(4));
        assert!(!end.hung);
        assert_eq!(end.count("frames"), Some(3));
        assert_eq!(end.describe(), "sh: exit 4: oops");

        let sleeper = Child::spawn("sleeper", Path::new("/bin/sleep"), &args(&["30"]), &env).unwrap();
        let started = Instant::now();
        let end = sleeper.finish(Instant::now() + Duration::from_millis(200));
        assert!(end.hung);
        assert!(started.elapsed() < Duration::from_secs(5));
    }

    #[test]
    fn waiting_for_a_line_from_a_process_that_ended_says_so() {
        let mut sh =
            Child::spawn("sh", Path::new("/bin/sh"), &args(&["-c", "echo bye >&2"]), &ChildEnv::new()).unwrap();
        let err = sh.wait_progress(1, Instant::now() + Duration::from_secs(10)).unwrap_err();
        assert!(err.contains("sh ended") && err.contains("bye"), "{err}");
    }

    #[test]
    fn exit_times_are_measured_from_the_kill() {
        let env = ChildEnv::new();
        let a = Child::spawn("a", Path::new("/bin/sh"), &args(&["-c", "sleep 0.2"]), &env).unwrap();
        let ends = finish_all(vec![a], Instant::now() + Duration::from_secs(10), Some(Instant::now()));
        let after = ends[0].after_kill_s.unwrap();
        assert!((0.15..2.0).contains(&after), "{after}");
    }

    #[test]
    fn fds_of_this_process_are_counted() {
        assert!(fd_count(std::process::id()).unwrap() >= 3);
        assert!(fds_settle(std::process::id(), 10_000, Duration::ZERO).is_some());
    }

    #[test]
    fn permissions_pick_the_owner_then_the_group_then_the_others() {
        // rw for the owner only.
        assert!(user_may(65534, 65534, 65534, 0, 0o600, 0o6));
        assert!(!user_may(65534, 65534, 0, 0, 0o600, 0o6));
        // The group's bits when the gid matches, even if the others' would allow it.
        assert!(!user_may(65534, 65534, 0, 65534, 0o606, 0o6));
        assert!(user_may(65534, 65534, 0, 65534, 0o660, 0o6));
        assert!(user_may(65534, 65534, 0, 0, 0o666, 0o6));
        assert!(!user_may(65534, 65534, 0, 0, 0o664, 0o6));
        assert!(user_may(65534, 65534, 0, 0, 0o755, 0o1));
        assert!(!user_may(65534, 65534, 0, 0, 0o700, 0o1));
    }

    #[test]
    fn a_copy_for_another_user_is_reachable_and_goes_away_when_dropped() {
        use std::os::unix::fs::PermissionsExt;
        let copy = reachable_copy(Path::new("/bin/sh"), "test-copy").unwrap();
        assert_eq!(copy.program().file_name().unwrap(), "sh");
        let mode = std::fs::metadata(copy.program()).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o755);
        let dir = copy.program().parent().unwrap().to_owned();
        assert_eq!(unsearchable_for(NOBODY, NOBODY, &dir), None);
        drop(copy);
        assert!(!dir.exists());
        let e = reachable_copy(Path::new("/nonexistent-gpu-ipc/consumer"), "test-missing").unwrap_err();
        assert!(e.contains("copy /nonexistent-gpu-ipc/consumer"), "{e}");
    }

    #[test]
    fn an_unsearchable_directory_is_named() {
        use std::os::unix::fs::PermissionsExt;
        let dir = std::env::temp_dir().join(format!("gpu-ipc-stress-closed-{}", std::process::id()));
        std::fs::create_dir_all(dir.join("inner")).unwrap();
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700)).unwrap();
        let owner = std::os::unix::fs::MetadataExt::uid(&std::fs::metadata(&dir).unwrap());
        // Another uid than the owner's, with no group in common.
        let other = if owner == NOBODY { 1 } else { NOBODY };
        let why = unsearchable_for(other, other, &dir.join("inner")).unwrap();
        assert!(why.starts_with(&format!("{} (mode 0700", dir.display())), "{why}");
        let _ = std::fs::remove_dir_all(dir);
    }
}
