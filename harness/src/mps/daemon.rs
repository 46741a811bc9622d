//! A private MPS control daemon for one run (the report's second pass, the benchmark's MPS rows, the stress run's
//! MPS kills): its pipe and log directories in a temporary folder, stopped on every path.

use std::ffi::{OsStr, OsString};
use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use super::{MPS_CONTROL, MPS_LOG_VAR, MPS_PID_FILE, MPS_PIPE_VAR};
use crate::process::{PrivateDir, process_alive, wait_until};

/// How to reach `nvidia-cuda-mps-control`, and how long to wait for it.
#[derive(Debug, Clone)]
pub struct MpsControl {
    /// The program, or `None` when it is not installed.
    pub program: Option<PathBuf>,
    /// Limit of each control command (`-d`, `get_server_list`, `quit`).
    pub command_timeout: Duration,
    /// How long the daemon has to answer after `-d`.
    pub ready_timeout: Duration,
    /// How long the daemon has to exit after `quit`.
    pub stop_timeout: Duration,
}

impl MpsControl {
    /// `nvidia-cuda-mps-control` as found on `PATH`, with the limits the GPU suite uses (10 s each).
    pub fn from_path() -> Self {
        let path = std::env::var_os("PATH").unwrap_or_default();
        Self::with_program(find_on_path(MPS_CONTROL, &path))
    }

    /// `program` with the default limits.
    pub fn with_program(program: Option<PathBuf>) -> Self {
        let ten = Duration::from_secs(10);
        Self { program, command_timeout: ten, ready_timeout: ten, stop_timeout: ten }
    }
}

/// The first executable file called `name` in the directories of `path` (a `PATH` value).
pub fn find_on_path(name: &str, path: &OsStr) -> Option<PathBuf> {
    use std::os::unix::fs::PermissionsExt;
    std::env::split_paths(path).filter(|dir| !dir.as_os_str().is_empty()).map(|dir| dir.join(name)).find(|candidate| {
        std::fs::metadata(candidate).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
    })
}

/// A private MPS control daemon: its pipe and log directories in a temporary folder, started with
/// `nvidia-cuda-mps-control -d`, confirmed with `get_server_list`, stopped with `quit` (and waited for) when
/// [`stop`](Self::stop) is called or the guard is dropped, whichever comes first.
#[derive(Debug)]
pub struct MpsDaemon {
    control: MpsControl,
    program: PathBuf,
    dir: PrivateDir,
    pid: Option<rustix::process::Pid>,
    stopped: bool,
}

/// Why a private MPS daemon could not be started or stopped; said so that the pass it was for can be skipped with
/// the reason.
#[derive(Debug, thiserror::Error)]
pub enum MpsError {
    /// `nvidia-cuda-mps-control` is not installed here.
    #[error("{MPS_CONTROL} not found on PATH")]
    NotInstalled,
    /// A file or folder the daemon needs could not be made.
    #[error("{what}: {source}")]
    Io {
        /// What was being done.
        what: String,
        /// The OS error.
        source: std::io::Error,
    },
    /// `nvidia-cuda-mps-control -d` failed (often: a daemon already runs with the same pipe directory).
    #[error("{MPS_CONTROL} -d failed ({status}): {output}")]
    StartFailed {
        /// Its exit status.
        status: ExitStatus,
        /// Its output, on one line.
        output: String,
    },
    /// The daemon started but did not answer `get_server_list` in time.
    #[error("the MPS daemon started but does not answer get_server_list ({last})")]
    NoAnswer {
        /// The last answer or failure.
        last: String,
    },
    /// A control command did not finish within its limit.
    #[error("`{MPS_CONTROL} {command}` did not finish within {seconds} s")]
    CommandTimeout {
        /// The command (its arguments or its stdin).
        command: String,
        /// The limit.
        seconds: u64,
    },
    /// The daemon was still running after `quit` and the stop limit.
    #[error("the private MPS daemon (pid {pid}) was still running {seconds} s after quit")]
    StillRunning {
        /// Its pid, or `unknown`.
        pid: String,
        /// The limit.
        seconds: u64,
    },
}

impl MpsDaemon {
    /// Starts the daemon and waits until it answers; `Err` says why the MPS pass must be skipped.
    ///
    /// # Errors
    /// [`MpsError`]: no control program, a failed start, or a daemon that does not answer.
    pub fn start(control: &MpsControl) -> Result<Self, MpsError> {
        let Some(program) = control.program.clone() else {
            return Err(MpsError::NotInstalled);
        };
        let dir = PrivateDir::new("mps").map_err(|source| MpsError::Io {
            what: "cannot create a temporary directory for MPS".to_owned(),
            source,
        })?;
        for sub in ["pipe", "log"] {
            std::fs::create_dir(dir.path().join(sub))
                .map_err(|source| MpsError::Io { what: format!("cannot create the MPS {sub} directory"), source })?;
        }
        let mut daemon = Self { control: control.clone(), program, dir, pid: None, stopped: true };
        let started = daemon.control_command(&["-d"], None, "start")?;
        if !started.status.success() {
            return Err(MpsError::StartFailed { status: started.status, output: one_line(&started.output) });
        }
        // From here on, the guard's Drop sends `quit` whatever happens.
        daemon.stopped = false;
        let deadline = Instant::now() + control.ready_timeout;
        let mut last;
        loop {
            match daemon.control_command(&[], Some("get_server_list"), "confirm") {
                Ok(answer) if answer.status.success() => break,
                Ok(answer) => last = format!("{}: {}", answer.status, one_line(&answer.output)),
                Err(e) => last = e.to_string(),
            }
            if Instant::now() >= deadline {
                return Err(MpsError::NoAnswer { last });
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        daemon.pid = daemon.read_pid();
        tracing::info!(pid = ?daemon.pid, dir = %daemon.dir.path().display(), "private MPS daemon running");
        Ok(daemon)
    }

    /// Its pipe directory (`CUDA_MPS_PIPE_DIRECTORY`).
    pub fn pipe_dir(&self) -> PathBuf {
        self.dir.path().join("pipe")
    }

    /// Its log directory (`CUDA_MPS_LOG_DIRECTORY`).
    pub fn log_dir(&self) -> PathBuf {
        self.dir.path().join("log")
    }

    /// The environment a client of this daemon needs.
    pub fn client_env(&self) -> Vec<(OsString, Option<OsString>)> {
        vec![
            (MPS_PIPE_VAR.into(), Some(self.pipe_dir().into_os_string())),
            (MPS_LOG_VAR.into(), Some(self.log_dir().into_os_string())),
        ]
    }

    /// Sends `quit` and waits (bounded) until the daemon is gone: its pid no longer runs, or, when its pid is not
    /// known, its pid file is gone. Idempotent.
    ///
    /// # Errors
    /// [`MpsError`]: `quit` could not be sent, or the daemon outlived the stop limit.
    pub fn stop(&mut self) -> Result<(), MpsError> {
        if self.stopped {
            return Ok(());
        }
        self.stopped = true;
        let quit = self.control_command(&[], Some("quit"), "quit")?;
        if !quit.status.success() {
            tracing::warn!(status = %quit.status, output = %one_line(&quit.output), "MPS quit failed");
        }
        let deadline = Instant::now() + self.control.stop_timeout;
        while !self.gone() {
            if Instant::now() >= deadline {
                return Err(MpsError::StillRunning {
                    pid: self.pid.map_or_else(|| "unknown".to_owned(), |p| p.as_raw_nonzero().to_string()),
                    seconds: self.control.stop_timeout.as_secs(),
                });
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        tracing::info!("private MPS daemon stopped");
        Ok(())
    }

    /// Copies the daemon's logs (`control.log`, `server.log`) into `dest`; best effort.
    pub fn copy_logs(&self, dest: &Path) {
        let Ok(entries) = std::fs::read_dir(self.log_dir()) else { return };
        if std::fs::create_dir_all(dest).is_err() {
            return;
        }
        for entry in entries.flatten() {
            if entry.file_type().is_ok_and(|t| t.is_file()) {
                let _ = std::fs::copy(entry.path(), dest.join(entry.file_name()));
            }
        }
    }

    fn read_pid(&self) -> Option<rustix::process::Pid> {
        let text = std::fs::read_to_string(self.pipe_dir().join(MPS_PID_FILE)).ok()?;
        text.trim().parse::<i32>().ok().and_then(rustix::process::Pid::from_raw)
    }

    fn gone(&self) -> bool {
        match self.pid {
            Some(pid) => !process_alive(pid),
            None => !self.pipe_dir().join(MPS_PID_FILE).exists(),
        }
    }

    /// Runs the control program with the daemon's environment, `args`, and `input` on stdin, bounded by the
    /// command limit. Its output goes to a file, not a pipe: `-d` forks a daemon that keeps whatever it inherited
    /// open, and a pipe would never reach end of file.
    fn control_command(&self, args: &[&str], input: Option<&str>, what: &str) -> Result<ControlOutput, MpsError> {
        let out_path = self.dir.path().join(format!("{what}.out"));
        let out = File::create(&out_path)
            .map_err(|source| MpsError::Io { what: format!("cannot create {}", out_path.display()), source })?;
        let err = out
            .try_clone()
            .map_err(|source| MpsError::Io { what: "cannot duplicate a file handle".to_owned(), source })?;
        let mut command = Command::new(&self.program);
        command
            .args(args)
            .env(MPS_PIPE_VAR, self.pipe_dir())
            .env(MPS_LOG_VAR, self.log_dir())
            .stdin(if input.is_some() { Stdio::piped() } else { Stdio::null() })
            .stdout(out)
            .stderr(err);
        let mut child = command
            .spawn()
            .map_err(|source| MpsError::Io { what: format!("cannot run {}", self.program.display()), source })?;
        if let (Some(text), Some(mut stdin)) = (input, child.stdin.take()) {
            // A control program that exits without reading is answered by its exit status, not by this write.
            let _ = writeln!(stdin, "{text}");
        }
        let deadline = Instant::now() + self.control.command_timeout;
        let status = match wait_until(&mut child, deadline) {
            Ok(Some(status)) => status,
            Ok(None) | Err(_) => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(MpsError::CommandTimeout {
                    command: input.map_or_else(|| args.join(" "), str::to_owned),
                    seconds: self.control.command_timeout.as_secs(),
                });
            }
        };
        let output = std::fs::read_to_string(&out_path).unwrap_or_default();
        Ok(ControlOutput { status, output })
    }
}

impl Drop for MpsDaemon {
    fn drop(&mut self) {
        if let Err(problem) = self.stop() {
            tracing::warn!(%problem, "stopping the private MPS daemon");
        }
    }
}

struct ControlOutput {
    status: ExitStatus,
    output: String,
}

/// The first 200 characters of `text` on one line.
fn one_line(text: &str) -> String {
    let line = text.split_whitespace().collect::<Vec<_>>().join(" ");
    if line.is_empty() { "no output".to_owned() } else { line.chars().take(200).collect() }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::super::fake::{calls, fake_control};
    use super::*;

    #[test]
    fn the_mps_guard_starts_confirms_and_quits() {
        let tmp = PrivateDir::new("test-mps").unwrap();
        let control = fake_control(tmp.path());
        let daemon = MpsDaemon::start(&control).unwrap();
        let pipe = daemon.pipe_dir();
        let pid = daemon.pid.expect("the pid file was read");
        assert!(process_alive(pid));
        let env = daemon.client_env();
        assert_eq!(env[0], (MPS_PIPE_VAR.into(), Some(pipe.clone().into_os_string())));
        let logs = tmp.path().join("mps-log");
        drop(daemon);
        assert!(!process_alive(pid), "the daemon was waited for until it was gone");
        assert!(!pipe.exists(), "the private directory was removed");
        let calls = calls(tmp.path());
        let pipe = pipe.display().to_string();
        assert!(calls[0].starts_with(&format!("-d {pipe} ")), "{calls:?}");
        assert_eq!(calls[1], format!("get_server_list {pipe}"));
        assert_eq!(calls.last().unwrap(), &format!("quit {pipe}"));
        assert_eq!(calls.iter().filter(|c| c.starts_with("quit")).count(), 1);
        assert!(!logs.exists());
    }

    #[test]
    fn stop_is_explicit_once_and_keeps_the_logs() {
        let tmp = PrivateDir::new("test-mps").unwrap();
        let control = fake_control(tmp.path());
        let mut daemon = MpsDaemon::start(&control).unwrap();
        daemon.stop().unwrap();
        daemon.stop().unwrap();
        daemon.copy_logs(&tmp.path().join("mps-log"));
        drop(daemon);
        assert_eq!(std::fs::read_to_string(tmp.path().join("mps-log/control.log")).unwrap(), "daemon started\n");
        assert_eq!(calls(tmp.path()).iter().filter(|c| c.starts_with("quit")).count(), 1);
    }

    #[test]
    fn a_failing_start_skips_the_pass_with_the_reason() {
        let tmp = PrivateDir::new("test-mps").unwrap();
        let control = fake_control(tmp.path());
        std::fs::write(tmp.path().join("START_FAILS"), "").unwrap();
        let reason = MpsDaemon::start(&control).unwrap_err().to_string();
        assert!(reason.contains("-d failed"), "{reason}");
        assert!(reason.contains("already running"), "{reason}");
        assert_eq!(calls(tmp.path()).len(), 1, "nothing to quit after a failed start");
    }

    #[test]
    fn a_daemon_that_does_not_answer_is_skipped_and_still_stopped() {
        let tmp = PrivateDir::new("test-mps").unwrap();
        let mut control = fake_control(tmp.path());
        control.ready_timeout = Duration::from_millis(300);
        std::fs::write(tmp.path().join("MUTE"), "").unwrap();
        let reason = MpsDaemon::start(&control).unwrap_err().to_string();
        assert!(reason.contains("does not answer"), "{reason}");
        assert!(calls(tmp.path()).last().unwrap().starts_with("quit "), "the guard quit the daemon it started");
    }

    #[test]
    fn no_control_program_skips() {
        let reason = MpsDaemon::start(&MpsControl::with_program(None)).unwrap_err().to_string();
        assert_eq!(reason, "nvidia-cuda-mps-control not found on PATH");
        assert_eq!(find_on_path(MPS_CONTROL, OsStr::new("/nonexistent:")), None);
    }
}
