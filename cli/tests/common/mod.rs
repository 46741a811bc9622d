//! What the command-line tests share: where the `gpu-ipc` binary is.

use std::path::PathBuf;

/// The `gpu-ipc` binary: nextest's `NEXTEST_BIN_EXE_gpu-ipc` when it replays an archive on another machine (the GPU
/// suite), else the path Cargo built it at.
pub fn gpu_ipc_exe() -> PathBuf {
    std::env::var_os("NEXTEST_BIN_EXE_gpu-ipc")
        .or_else(|| std::env::var_os("NEXTEST_BIN_EXE_gpu_ipc"))
        .map_or_else(|| PathBuf::from(env!("CARGO_BIN_EXE_gpu-ipc")), PathBuf::from)
}
