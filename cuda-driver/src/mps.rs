//! MPS (the CUDA Multi-Process Service) detection: the one place in the workspace that decides whether MPS runs.
//!
//! Without MPS, two processes' kernels never run at the same time on one GPU (they are time-sliced), so anything
//! that has a kernel of one process wait for a kernel of another (the `GpuPoll` strategy, the probes' MPS passes)
//! must know. The evidence, each piece for a reason:
//!
//! - `GPU_IPC_ASSUME_MPS` ([`ASSUME_MPS_ENV`]): an override. `1` says MPS runs, `0` says it does not (tests of the
//!   refusal); anything else, or unset, leaves it to detection ([`assume_mps`]).
//! - `CU_DEVICE_ATTRIBUTE_MPS_ENABLED`: what the driver says of a device, where the driver knows it.
//! - The control pipe `<pipe directory>/control`, a FIFO the control daemon (`nvidia-cuda-mps-control -d`) creates.
//!   The pipe directory is `CUDA_MPS_PIPE_DIRECTORY` ([`PIPE_DIRECTORY_ENV`]) when set and not empty, else
//!   [`DEFAULT_PIPE_DIRECTORY`]: where this process's CUDA contexts would look for a daemon ([`PipeDirectory`]).
//!   It shows a daemon of another PID namespace too (a container sharing the host's `/tmp/nvidia-mps`).
//! - MPS processes in `/proc` ([`mps_processes`]): what the doctor reports; a daemon in another PID namespace, or
//!   hidden by `hidepid`, is not listed, so this alone never proves MPS absent.
//!
//! [`MpsEvidence::gather`] reads the override, the attribute and the control pipe; [`MpsEvidence::running`] is the
//! verdict the `GpuPoll` strategy goes by.

use std::ffi::OsStr;
use std::io;
use std::os::unix::fs::FileTypeExt;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::device::Device;
use super::sys;

/// Set by the environment to skip MPS detection: `1` assumes MPS runs, `0` assumes it does not; anything else, or
/// unset, detects it.
pub const ASSUME_MPS_ENV: &str = "GPU_IPC_ASSUME_MPS";
/// The variable naming the directory of the MPS daemon's control pipe (read by the CUDA driver and the daemon).
pub const PIPE_DIRECTORY_ENV: &str = "CUDA_MPS_PIPE_DIRECTORY";
/// The variable naming the directory of the MPS daemon's logs.
pub const LOG_DIRECTORY_ENV: &str = "CUDA_MPS_LOG_DIRECTORY";
/// The MPS pipe directory the CUDA driver uses when [`PIPE_DIRECTORY_ENV`] is not set.
pub const DEFAULT_PIPE_DIRECTORY: &str = "/tmp/nvidia-mps";
/// The MPS control program (the daemon, and the client that talks to it).
pub const CONTROL_PROGRAM: &str = "nvidia-cuda-mps-control";
/// The MPS server program (started by the daemon; owns the GPU context its clients share).
pub const SERVER_PROGRAM: &str = "nvidia-cuda-mps-server";
/// `/proc/<pid>/comm` keeps 15 bytes, so both MPS programs show as this prefix there.
const COMM_PREFIX: &str = "nvidia-cuda-mps";

/// [`ASSUME_MPS_ENV`]'s value read: `1` is yes, `0` is no, anything else (or unset) asks for detection.
pub fn assume_mps(value: Option<&OsStr>) -> Option<bool> {
    match value?.to_str()? {
        "1" => Some(true),
        "0" => Some(false),
        _ => None,
    }
}

/// The MPS pipe directory CUDA clients in this environment would use.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PipeDirectory {
    /// The directory.
    pub path: PathBuf,
    /// Whether it came from [`PIPE_DIRECTORY_ENV`] rather than [`DEFAULT_PIPE_DIRECTORY`].
    pub from_env: bool,
}

impl PipeDirectory {
    /// From this process's environment.
    pub fn from_env() -> Self {
        Self::from_value(std::env::var_os(PIPE_DIRECTORY_ENV).as_deref())
    }

    /// From a value of [`PIPE_DIRECTORY_ENV`]: unset or empty means [`DEFAULT_PIPE_DIRECTORY`], as for the driver.
    pub fn from_value(value: Option<&OsStr>) -> Self {
        match value.filter(|dir| !dir.is_empty()) {
            Some(dir) => Self { path: PathBuf::from(dir), from_env: true },
            None => Self { path: PathBuf::from(DEFAULT_PIPE_DIRECTORY), from_env: false },
        }
    }

    /// `<directory>/control`, where the control daemon makes its FIFO.
    pub fn control_path(&self) -> PathBuf {
        self.path.join("control")
    }

    /// What is at [`control_path`](Self::control_path).
    pub fn control_pipe(&self) -> ControlPipe {
        ControlPipe::inspect(&self.path)
    }
}

/// What is at `<pipe directory>/control`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ControlPipe {
    /// A FIFO: a control daemon made it (and, unless it crashed, runs).
    Fifo,
    /// Nothing.
    Absent,
    /// Something that is not a FIFO.
    NotAFifo,
    /// It could not be inspected: the error, as text.
    Unreadable(String),
}

impl ControlPipe {
    /// Looks at `<pipe_directory>/control` (without following a symbolic link).
    pub fn inspect(pipe_directory: &Path) -> Self {
        match std::fs::symlink_metadata(pipe_directory.join("control")) {
            Ok(meta) if meta.file_type().is_fifo() => Self::Fifo,
            Ok(_) => Self::NotAFifo,
            Err(err) if err.kind() == io::ErrorKind::NotFound => Self::Absent,
            Err(err) => Self::Unreadable(err.to_string()),
        }
    }

    /// Whether it is the daemon's FIFO.
    pub fn is_fifo(&self) -> bool {
        *self == Self::Fifo
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
    /// [`CONTROL_PROGRAM`], the daemon that starts servers.
    Control,
    /// [`SERVER_PROGRAM`], the process that owns the GPU context clients share.
    Server,
    /// An MPS process whose command line could not be read.
    Unidentified,
}

/// The MPS processes running in `proc_dir` (`/proc`, or a fake one in tests), by pid. Zombies do not count (an
/// exited daemon whose parent never reaps it, PID 1 of many containers, stays one).
///
/// # Errors
/// `proc_dir` cannot be listed. A process that exits while it is read is skipped, not an error.
pub fn mps_processes(proc_dir: &Path) -> io::Result<Vec<MpsProcess>> {
    let mut processes = Vec::new();
    for entry in std::fs::read_dir(proc_dir)?.flatten() {
        let Some(pid) = entry.file_name().to_str().and_then(|name| name.parse::<u32>().ok()) else {
            continue;
        };
        let Ok(comm) = std::fs::read_to_string(entry.path().join("comm")) else {
            continue;
        };
        if std::fs::read_to_string(entry.path().join("stat")).is_ok_and(|stat| is_zombie(&stat)) {
            continue;
        }
        let cmdline = std::fs::read(entry.path().join("cmdline")).ok();
        if let Some(role) = mps_role(&comm, cmdline.as_deref()) {
            processes.push(MpsProcess { pid, role });
        }
    }
    processes.sort_by_key(|process| process.pid);
    Ok(processes)
}

/// Whether a `/proc/<pid>/stat` line describes a zombie: its state, the field after the `(comm)`, is `Z`.
fn is_zombie(stat: &str) -> bool {
    stat.rfind(')').and_then(|end| stat[end + 1..].split_whitespace().next()) == Some("Z")
}

/// Which MPS binary a process runs, from its `comm` and (when readable) its NUL-separated `cmdline`; `None` when it
/// is not an MPS process. `comm` alone cannot tell: it keeps 15 bytes, `nvidia-cuda-mps` for both.
pub fn mps_role(comm: &str, cmdline: Option<&[u8]>) -> Option<MpsRole> {
    if !comm.trim_end().starts_with(COMM_PREFIX) {
        return None;
    }
    let program = cmdline
        .and_then(|args| args.split(|byte| *byte == 0).next())
        .map(|arg0| String::from_utf8_lossy(arg0).into_owned())
        .unwrap_or_default();
    Some(match program.rsplit('/').next().unwrap_or("") {
        CONTROL_PROGRAM => MpsRole::Control,
        SERVER_PROGRAM => MpsRole::Server,
        _ => MpsRole::Unidentified,
    })
}

/// What MPS detection found for one device, for [`MpsEvidence::running`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MpsEvidence {
    /// [`ASSUME_MPS_ENV`]'s answer, when it gives one.
    pub assumed: Option<bool>,
    /// `CU_DEVICE_ATTRIBUTE_MPS_ENABLED`, when the driver knows it.
    pub attribute: Option<bool>,
    /// The MPS pipe directory this process's contexts would use.
    pub pipe_directory: PathBuf,
    /// Whether `<pipe_directory>/control` is a FIFO (the control daemon makes it).
    pub control_pipe: bool,
}

impl MpsEvidence {
    /// Reads the environment ([`ASSUME_MPS_ENV`], [`PIPE_DIRECTORY_ENV`]), the device's
    /// `CU_DEVICE_ATTRIBUTE_MPS_ENABLED` and the control pipe.
    pub fn gather(device: Device) -> Self {
        let assumed = assume_mps(std::env::var_os(ASSUME_MPS_ENV).as_deref());
        let attribute = device.attribute(sys::CU_DEVICE_ATTRIBUTE_MPS_ENABLED).ok().map(|v| v != 0);
        let pipe_directory = PipeDirectory::from_env();
        let control_pipe = pipe_directory.control_pipe().is_fifo();
        Self { assumed, attribute, pipe_directory: pipe_directory.path, control_pipe }
    }

    /// Whether MPS runs: as [`ASSUME_MPS_ENV`] says when it says, else when the attribute says so or the control
    /// pipe exists.
    pub fn running(&self) -> bool {
        match self.assumed {
            Some(assumed) => assumed,
            None => self.attribute == Some(true) || self.control_pipe,
        }
    }

    /// Why MPS counts as not running (`None` when it runs), in words a user can check.
    pub fn why_not(&self) -> Option<String> {
        if self.running() {
            return None;
        }
        Some(match self.assumed {
            Some(_) => format!("{ASSUME_MPS_ENV}=0 says so"),
            None => format!(
                "the device reports {} and there is no control pipe at {}",
                match self.attribute {
                    Some(_) => "CU_DEVICE_ATTRIBUTE_MPS_ENABLED = 0",
                    None => "no MPS attribute",
                },
                self.pipe_directory.join("control").display()
            ),
        })
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn evidence(assumed: Option<bool>, attribute: Option<bool>, control_pipe: bool) -> MpsEvidence {
        MpsEvidence { assumed, attribute, pipe_directory: PathBuf::from("/tmp/nvidia-mps"), control_pipe }
    }

    #[test]
    fn the_override_wins_else_the_attribute_or_the_pipe() {
        for running in
            [evidence(None, Some(true), false), evidence(None, Some(false), true), evidence(Some(true), None, false)]
        {
            assert!(running.running(), "{running:?}");
            assert_eq!(running.why_not(), None);
        }
        for not in
            [evidence(None, None, false), evidence(None, Some(false), false), evidence(Some(false), Some(true), true)]
        {
            assert!(!not.running(), "{not:?}");
        }
        assert_eq!(
            evidence(None, None, false).why_not().unwrap(),
            "the device reports no MPS attribute and there is no control pipe at /tmp/nvidia-mps/control"
        );
        assert_eq!(
            evidence(None, Some(false), false).why_not().unwrap(),
            "the device reports CU_DEVICE_ATTRIBUTE_MPS_ENABLED = 0 and there is no control pipe at \
             /tmp/nvidia-mps/control"
        );
        assert_eq!(evidence(Some(false), Some(true), true).why_not().unwrap(), "GPU_IPC_ASSUME_MPS=0 says so");
    }

    #[test]
    fn only_0_and_1_override_mps_detection() {
        assert_eq!(assume_mps(Some(OsStr::new("1"))), Some(true));
        assert_eq!(assume_mps(Some(OsStr::new("0"))), Some(false));
        for other in ["", "yes", "true", " 1"] {
            assert_eq!(assume_mps(Some(OsStr::new(other))), None, "{other:?}");
        }
        assert_eq!(assume_mps(None), None);
    }

    #[test]
    fn an_unset_or_empty_pipe_variable_means_the_default_directory() {
        let default = PipeDirectory { path: PathBuf::from("/tmp/nvidia-mps"), from_env: false };
        assert_eq!(PipeDirectory::from_value(None), default);
        assert_eq!(PipeDirectory::from_value(Some(OsStr::new(""))), default);
        let set = PipeDirectory::from_value(Some(OsStr::new("/run/mps")));
        assert_eq!(set, PipeDirectory { path: PathBuf::from("/run/mps"), from_env: true });
        assert_eq!(set.control_path(), PathBuf::from("/run/mps/control"));
    }

    #[test]
    fn only_a_fifo_is_a_control_pipe() {
        let dir = std::env::temp_dir().join(format!("gpu-ipc-mps-pipe-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        assert_eq!(ControlPipe::inspect(&dir), ControlPipe::Absent, "nothing there");
        std::fs::write(dir.join("control"), b"").unwrap();
        assert_eq!(ControlPipe::inspect(&dir), ControlPipe::NotAFifo, "a regular file");
        std::fs::remove_file(dir.join("control")).unwrap();
        rustix::fs::mknodat(rustix::fs::CWD, dir.join("control"), rustix::fs::FileType::Fifo, 0o600.into(), 0).unwrap();
        assert_eq!(ControlPipe::inspect(&dir), ControlPipe::Fifo, "a FIFO");
        assert!(ControlPipe::inspect(&dir).is_fifo());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn zombies_are_told_from_running_processes() {
        assert!(is_zombie("1324 (nvidia-cuda-mps) Z 1 1324 1324 0 -1 4227136"));
        assert!(!is_zombie("1324 (nvidia-cuda-mps) S 1 1324 1324 0 -1 4227136"));
        assert!(!is_zombie("77 (odd) Z name) R 1 77"));
    }

    #[test]
    fn mps_role_reads_cmdline_because_comm_is_truncated() {
        let control: &[u8] = b"/usr/bin/nvidia-cuda-mps-control\0-d\0";
        let server: &[u8] = b"nvidia-cuda-mps-server\0";
        assert_eq!(mps_role("nvidia-cuda-mps\n", Some(control)), Some(MpsRole::Control));
        assert_eq!(mps_role("nvidia-cuda-mps\n", Some(server)), Some(MpsRole::Server));
        assert_eq!(mps_role("nvidia-cuda-mps\n", None), Some(MpsRole::Unidentified));
        assert_eq!(mps_role("bash\n", Some(b"bash\0")), None);
    }

    #[test]
    fn mps_processes_are_found_in_a_proc_directory_zombies_left_out() {
        let proc_dir = std::env::temp_dir().join(format!("gpu-ipc-mps-proc-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&proc_dir);
        for (pid, comm, cmdline, state) in [
            ("42", "nvidia-cuda-mps\n", &b"nvidia-cuda-mps-server\0"[..], "S"),
            ("7", "nvidia-cuda-mps\n", &b"/usr/bin/nvidia-cuda-mps-control\0-d\0"[..], "S"),
            ("9", "nvidia-cuda-mps\n", &b""[..], "Z"),
            ("11", "bash\n", &b"bash\0"[..], "S"),
        ] {
            let dir = proc_dir.join(pid);
            std::fs::create_dir_all(&dir).unwrap();
            std::fs::write(dir.join("comm"), comm).unwrap();
            std::fs::write(dir.join("cmdline"), cmdline).unwrap();
            std::fs::write(dir.join("stat"), format!("{pid} ({}) {state} 1", comm.trim_end())).unwrap();
        }
        std::fs::create_dir_all(proc_dir.join("self-not-a-pid")).unwrap();
        let found = mps_processes(&proc_dir).unwrap();
        assert_eq!(
            found,
            [MpsProcess { pid: 7, role: MpsRole::Control }, MpsProcess { pid: 42, role: MpsRole::Server }]
        );
        std::fs::remove_dir_all(&proc_dir).unwrap();
        assert!(mps_processes(&proc_dir).is_err(), "a directory that is gone");
    }
}
