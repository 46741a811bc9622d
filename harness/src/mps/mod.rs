//! MPS, the Multi-Process Service, for the probes, the doctor, the benchmark and the stress run: whether it is
//! active ([`detect`], facts for reports over ipc-core's detection, `gpu_ipc::driver::mps`, the one home of
//! what counts as evidence) and a private daemon for one run ([`daemon`]). Two processes' kernels run at the same time only under MPS, so every probe records it and the
//! report, the benchmark and the stress run measure with and without it.

pub mod daemon;
pub mod detect;
pub mod fake;

pub use daemon::{MpsControl, MpsDaemon, MpsError, find_on_path};
pub use detect::{
    DEFAULT_MPS_PIPE_DIRECTORY, MpsProcess, MpsRole, MpsStatus, active_here, mps_role, pipe_directory, probe_mps,
};

/// The MPS control program.
pub use gpu_ipc::driver::mps::CONTROL_PROGRAM as MPS_CONTROL;
/// The variable naming the directory of the MPS daemon's logs.
pub use gpu_ipc::driver::mps::LOG_DIRECTORY_ENV as MPS_LOG_VAR;
/// The variable naming the directory of the MPS daemon's control socket.
pub use gpu_ipc::driver::mps::PIPE_DIRECTORY_ENV as MPS_PIPE_VAR;
/// The file the MPS control daemon writes its pid to, in its pipe directory (removed when it exits).
const MPS_PID_FILE: &str = "nvidia-cuda-mps-control.pid";
