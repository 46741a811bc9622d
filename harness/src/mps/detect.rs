//! Whether MPS (the Multi-Process Service) is active: MPS processes in `/proc`, and the control pipe.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::fact::Fact;

/// The MPS pipe directory the CUDA driver uses when `CUDA_MPS_PIPE_DIRECTORY` is not set.
pub use gpu_ipc::driver::mps::DEFAULT_PIPE_DIRECTORY as DEFAULT_MPS_PIPE_DIRECTORY;
/// One MPS process, and which binary it runs: ipc-core's, the one home of MPS detection.
pub use gpu_ipc::driver::mps::{MpsProcess, MpsRole, mps_role};

use gpu_ipc::driver::mps::{ControlPipe, PipeDirectory, mps_processes};

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

/// Looks for MPS processes in `<proc>/*/comm` and for the control pipe in the pipe directory (ipc-core's detection,
/// as facts for the doctor's report).
pub fn probe_mps(proc_dir: &Path, pipe_directory: &Path, pipe_directory_from_env: bool) -> MpsStatus {
    let processes = match mps_processes(proc_dir) {
        Ok(processes) => Fact::Known(processes),
        Err(err) => Fact::Unknown(format!("cannot list {}: {err}", proc_dir.display())),
    };
    let control = pipe_directory.join("control");
    let control_pipe = match ControlPipe::inspect(pipe_directory) {
        ControlPipe::Fifo => Fact::Known(true),
        ControlPipe::Absent => Fact::Known(false),
        ControlPipe::NotAFifo => Fact::Unknown(format!("{} exists but is not a FIFO", control.display())),
        ControlPipe::Unreadable(err) => Fact::Unknown(format!("cannot inspect {}: {err}", control.display())),
    };
    MpsStatus { processes, pipe_directory: pipe_directory.display().to_string(), pipe_directory_from_env, control_pipe }
}

/// The pipe directory CUDA clients of this process would use: `CUDA_MPS_PIPE_DIRECTORY` when set (and whether it
/// was), else [`DEFAULT_MPS_PIPE_DIRECTORY`].
pub fn pipe_directory() -> (PathBuf, bool) {
    let dir = PipeDirectory::from_env();
    (dir.path, dir.from_env)
}

/// Whether MPS is active for this process now: an MPS process runs, or the control pipe exists.
pub fn active_here() -> bool {
    let (pipes, from_env) = pipe_directory();
    probe_mps(Path::new("/proc"), &pipes, from_env).active()
}

#[cfg(test)]
mod tests {
    use super::*;

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
