# Sourced by the GPU-machine scripts: a private MPS daemon, started and stopped by the caller.
#   mps_start    starts a daemon whose pipe and log directories live in a fresh temporary directory, exports
#                CUDA_MPS_PIPE_DIRECTORY / CUDA_MPS_LOG_DIRECTORY for what runs next, and returns 0 once the daemon
#                answers; otherwise returns 1 with MPS_REASON saying why (nothing is left running or exported).
#   mps_stop [LOG_COPY]  stops the daemon, unexports the variables, copies its logs to LOG_COPY when given, and
#                removes the temporary directory. Safe to call when mps_start failed.
MPS_DIR=""
MPS_REASON=""

mps_start() {
    MPS_REASON=""
    MPS_DIR="$(mktemp -d)"
    mkdir -p "$MPS_DIR/pipe" "$MPS_DIR/log"
    if ! command -v nvidia-cuda-mps-control >/dev/null; then
        MPS_REASON="nvidia-cuda-mps-control not found"
        return 1
    fi
    if ! CUDA_MPS_PIPE_DIRECTORY="$MPS_DIR/pipe" CUDA_MPS_LOG_DIRECTORY="$MPS_DIR/log" nvidia-cuda-mps-control -d; then
        MPS_REASON="nvidia-cuda-mps-control -d failed"
        return 1
    fi
    export CUDA_MPS_PIPE_DIRECTORY="$MPS_DIR/pipe" CUDA_MPS_LOG_DIRECTORY="$MPS_DIR/log"
    sleep 1
    # The daemon answers only when it really runs; a dead one means the pass would silently run without MPS.
    if ! echo get_server_list | timeout 10 nvidia-cuda-mps-control >/dev/null 2>&1; then
        MPS_REASON="the MPS daemon started but does not answer"
        echo quit | timeout 10 nvidia-cuda-mps-control >/dev/null 2>&1
        unset CUDA_MPS_PIPE_DIRECTORY CUDA_MPS_LOG_DIRECTORY
        return 1
    fi
    return 0
}

mps_stop() {
    if [ -n "${CUDA_MPS_PIPE_DIRECTORY:-}" ]; then
        echo quit | timeout 10 nvidia-cuda-mps-control
        sleep 1
        unset CUDA_MPS_PIPE_DIRECTORY CUDA_MPS_LOG_DIRECTORY
    fi
    if [ -n "$MPS_DIR" ]; then
        [ -n "${1:-}" ] && cp -r "$MPS_DIR/log" "$1" 2>/dev/null
        rm -rf "$MPS_DIR"
        MPS_DIR=""
    fi
}
