//! Small process and file helpers every room of the harness uses: a private temporary directory, a bounded wait
//! for a child, and killing a child's whole process group.

use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};
use std::process::{Child, ExitStatus};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// Waits for `child` until `deadline`; `None` when it is still running then.
pub fn wait_until(child: &mut Child, deadline: Instant) -> std::io::Result<Option<ExitStatus>> {
    loop {
        if let Some(status) = child.try_wait()? {
            return Ok(Some(status));
        }
        if Instant::now() >= deadline {
            return Ok(None);
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Kills the process group `child` leads (it was started with `process_group(0)`, so its group id is its pid),
/// then reaps `child`.
pub fn kill_group(child: &mut Child) {
    let pid = i32::try_from(child.id()).ok().and_then(rustix::process::Pid::from_raw);
    match pid {
        Some(pid) => {
            if let Err(e) = rustix::process::kill_process_group(pid, rustix::process::Signal::KILL) {
                tracing::warn!(%e, "could not kill the child's process group; killing the child alone");
                let _ = child.kill();
            }
        }
        None => {
            let _ = child.kill();
        }
    }
    let _ = child.wait();
}

/// A private temporary directory (mode 0700), removed with everything in it when dropped.
#[derive(Debug)]
pub struct PrivateDir {
    path: PathBuf,
}

impl PrivateDir {
    /// Creates `$TMPDIR/gpu-ipc-<what>-<pid>-<n>`.
    pub fn new(what: &str) -> std::io::Result<Self> {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let path = std::env::temp_dir().join(format!("gpu-ipc-{what}-{}-{n}", std::process::id()));
        // A directory left by a killed earlier run with the same pid is stale, and ours to replace.
        let _ = std::fs::remove_dir_all(&path);
        std::fs::DirBuilder::new().mode(0o700).create(&path)?;
        Ok(Self { path })
    }

    /// Its path.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for PrivateDir {
    fn drop(&mut self) {
        if let Err(e) = std::fs::remove_dir_all(&self.path) {
            tracing::debug!(%e, path = %self.path.display(), "could not remove a temporary directory");
        }
    }
}

/// Whether `pid` runs (a zombie does not count: a daemon reparented to an init that never reaps stays one).
pub fn process_alive(pid: rustix::process::Pid) -> bool {
    match rustix::process::test_kill_process(pid) {
        Ok(()) => {
            let stat = std::fs::read_to_string(format!("/proc/{}/stat", pid.as_raw_nonzero())).unwrap_or_default();
            let state = stat.rfind(')').and_then(|end| stat[end + 1..].split_whitespace().next());
            state != Some("Z")
        }
        Err(e) => e == rustix::io::Errno::PERM,
    }
}
