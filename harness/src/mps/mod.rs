//! MPS, the Multi-Process Service, in one place: whether it is active ([`detect`]) and a private daemon for one
//! run ([`daemon`]). Two processes' kernels run at the same time only under MPS, so every probe records it and the
//! report, the benchmark and the stress run measure with and without it.

pub mod daemon;
pub mod detect;

pub use daemon::{MpsControl, MpsDaemon, MpsError, find_on_path};
pub use detect::{
    DEFAULT_MPS_PIPE_DIRECTORY, MpsProcess, MpsRole, MpsStatus, active_here, mps_role, pipe_directory, probe_mps,
};

/// The MPS control program.
pub const MPS_CONTROL: &str = "nvidia-cuda-mps-control";
/// The variable naming the directory of the MPS daemon's control socket.
pub const MPS_PIPE_VAR: &str = "CUDA_MPS_PIPE_DIRECTORY";
/// The variable naming the directory of the MPS daemon's logs.
pub const MPS_LOG_VAR: &str = "CUDA_MPS_LOG_DIRECTORY";
/// The file the MPS control daemon writes its pid to, in its pipe directory (removed when it exits).
const MPS_PID_FILE: &str = "nvidia-cuda-mps-control.pid";
