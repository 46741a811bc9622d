//! Whether MPS (the Multi-Process Service) is active: MPS processes in `/proc`, and the control pipe.

use std::io;
use std::os::unix::fs::FileTypeExt;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::fact::Fact;

/// The MPS pipe directory the CUDA driver uses when `CUDA_MPS_PIPE_DIRECTORY` is not set.
pub const DEFAULT_MPS_PIPE_DIRECTORY: &str = "/tmp/nvidia-mps";

/// `/proc/<pid>/comm` keeps 15 bytes, so both MPS binaries (`nvidia-cuda-mps-control`, `nvidia-cuda-mps-server`)
/// show up under this one truncated name; `cmdline` tells them apart.
const MPS_COMM_PREFIX: &str = "nvidia-cuda-mps";

/// What the MPS (Multi-Process Service) probe found.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MpsStatus {
    /// MPS processes visible in this PID namespace. A daemon in another namespace (the host, seen from a container)
    /// or hidden by `hidepid` is not listed; the control pipe still shows it.
    pub processes: Fact<Vec<MpsProcess>>,
    /// The pipe directory CUDA clients in this environment would use.
    pub pipe_directory: String,
    /// Whether `pipe_directory` came from `CUDA_MPS_PIPE_DIRECTORY` rather than the default.
    pub pipe_directory_from_env: bool,
    /// Whether `<pipe_directory>/control` exists (a FIFO the control daemon creates).
    pub control_pipe: Fact<bool>,
}

impl MpsStatus {
    /// Whether MPS looks active: an MPS process is running, or the control pipe exists.
    pub fn active(&self) -> bool {
        let running = self.processes.known().is_some_and(|processes| !processes.is_empty());
        running || self.control_pipe == Fact::Known(true)
    }
}

/// One MPS process.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MpsProcess {
    /// Its pid, in this process's PID namespace.
    pub pid: u32,
    /// Which MPS binary it is.
    pub role: MpsRole,
}

/// Which MPS binary a process runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum MpsRole {
    /// `nvidia-cuda-mps-control`, the daemon that starts servers.
    Control,
    /// `nvidia-cuda-mps-server`, the process that owns the GPU context clients share.
    Server,
    /// An MPS process whose command line could not be read.
    Unidentified,
}

/// Looks for MPS processes in `<proc>/*/comm` and for the control pipe in the pipe directory.
pub fn probe_mps(proc_dir: &Path, pipe_directory: &Path, pipe_directory_from_env: bool) -> MpsStatus {
    MpsStatus {
        processes: probe_mps_processes(proc_dir),
        pipe_directory: pipe_directory.display().to_string(),
        pipe_directory_from_env,
        control_pipe: probe_mps_control_pipe(pipe_directory),
    }
}

/// The pipe directory CUDA clients of this process would use: `CUDA_MPS_PIPE_DIRECTORY` when set (and whether it
/// was), else [`DEFAULT_MPS_PIPE_DIRECTORY`].
pub fn pipe_directory() -> (PathBuf, bool) {
    match std::env::var_os(super::MPS_PIPE_VAR).filter(|dir| !dir.is_empty()) {
        Some(dir) => (PathBuf::from(dir), true),
        None => (PathBuf::from(DEFAULT_MPS_PIPE_DIRECTORY), false),
    }
}

/// Whether MPS is active for this process now: an MPS process runs, or the control pipe exists.
pub fn active_here() -> bool {
    let (pipes, from_env) = pipe_directory();
    probe_mps(Path::new("/proc"), &pipes, from_env).active()
}

fn probe_mps_processes(proc_dir: &Path) -> Fact<Vec<MpsProcess>> {
    let entries = match std::fs::read_dir(proc_dir) {
        Ok(entries) => entries,
        Err(err) => return Fact::Unknown(format!("cannot list {}: {err}", proc_dir.display())),
    };
    let mut processes = Vec::new();
    for entry in entries.flatten() {
        let Some(pid) = entry.file_name().to_str().and_then(|name| name.parse::<u32>().ok()) else {
            continue;
        };
        // A process may exit between listing and reading; that is not an error worth reporting.
        let Ok(comm) = std::fs::read_to_string(entry.path().join("comm")) else {
            continue;
        };
        // An exited daemon whose parent never reaps it (PID 1 of many containers) stays as a zombie: not running.
        if std::fs::read_to_string(entry.path().join("stat")).is_ok_and(|stat| is_zombie(&stat)) {
            continue;
        }
        let cmdline = std::fs::read(entry.path().join("cmdline")).ok();
        if let Some(role) = mps_role(&comm, cmdline.as_deref()) {
            processes.push(MpsProcess { pid, role });
        }
    }
    processes.sort_by_key(|process| process.pid);
    Fact::Known(processes)
}

/// Whether a `/proc/<pid>/stat` line describes a zombie: its state, the field after the `(comm)`, is `Z`.
fn is_zombie(stat: &str) -> bool {
    stat.rfind(')').and_then(|end| stat[end + 1..].split_whitespace().next()) == Some("Z")
}

/// Which MPS binary a process runs, from its `comm` and (when readable) its NUL-separated `cmdline`; `None` when it
/// is not an MPS process.
pub fn mps_role(comm: &str, cmdline: Option<&[u8]>) -> Option<MpsRole> {
    if !comm.trim_end().starts_with(MPS_COMM_PREFIX) {
        return None;
    }
    let program = cmdline
        .and_then(|args| args.split(|byte| *byte == 0).next())
        .map(|arg0| String::from_utf8_lossy(arg0).into_owned())
        .unwrap_or_default();
    let name = program.rsplit('/').next().unwrap_or("");
    Some(match name {
        "nvidia-cuda-mps-control" => MpsRole::Control,
        "nvidia-cuda-mps-server" => MpsRole::Server,
        _ => MpsRole::Unidentified,
    })
}

fn probe_mps_control_pipe(pipe_directory: &Path) -> Fact<bool> {
    let control = pipe_directory.join("control");
    match std::fs::symlink_metadata(&control) {
        Ok(meta) if meta.file_type().is_fifo() => Fact::Known(true),
        Ok(_) => Fact::Unknown(format!("{} exists but is not a FIFO", control.display())),
        Err(err) if err.kind() == io::ErrorKind::NotFound => Fact::Known(false),
        Err(err) => Fact::Unknown(format!("cannot inspect {}: {err}", control.display())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zombies_are_recognised_from_their_stat_line() {
        assert!(is_zombie("1324 (nvidia-cuda-mps) Z 1 1324 1324 0 -1 4227136"));
        assert!(!is_zombie("1324 (nvidia-cuda-mps) S 1 1324 1324 0 -1 4227136"));
        assert!(!is_zombie("77 (odd) Z name) R 1 77"));
    }

    #[test]
    fn mps_role_reads_cmdline_because_comm_is_truncated() {
        let control = b"/usr/bin/nvidia-cuda-mps-control\0-d\0";
        let server = b"nvidia-cuda-mps-server\0";
        assert_eq!(mps_role("nvidia-cuda-mps\n", Some(control)), Some(MpsRole::Control));
        assert_eq!(mps_role("nvidia-cuda-mps\n", Some(server)), Some(MpsRole::Server));
        assert_eq!(mps_role("nvidia-cuda-mps\n", None), Some(MpsRole::Unidentified));
        assert_eq!(mps_role("bash\n", Some(b"bash\0")), None);
    }
}
