#!/usr/bin/env bash
# The bridge over NIXL on a GPU machine, from what scripts/stage-gpu.sh --nixl staged (the wheel in stage/wheels,
# NIXL reduced in stage/nixl.tar.xz, the Rust examples in stage/bin.tar.xz; nothing is downloaded there):
#   scripts/bridge-gpu.sh OUT_DIR [--host]      (--host: a dry run of the harness on the host backend, no GPU)
# 1. a fresh venv made with --system-site-packages (the machine's torch), the staged gpu_ipc wheel installed with
#    `pip install --no-index --no-deps`; NIXL unpacked into it and put on PYTHONPATH, NIXL_PLUGIN_DIR at its plugins;
# 2. scripts/bridge_gpu.py run OUT_DIR: for each backend (BRIDGE_BACKENDS, default legacy,vmm) the plain ring
#    (torch producer -> two torch consumers) and the bridge (torch producer -> ring A -> send -> NIXL -> receive ->
#    ring B -> two torch consumers) with UCX's default transports and with UCX_TLS=tcp,cuda_copy, every word checked
#    on the GPU, FPS and end-to-end latency p50/p99; then BRIDGE_KILLS (default 10) SIGKILLs of each end mid-stream
#    (Rust producer and consumer around the bridge), the other end's error timed (goal: within 1 s).
# Writes OUT_DIR/bridge.md (the tables, with device, date and commit), bridge.json, bridge.log (every process's
# output). Exit status: 0 the first backend's rows and every kill trial passed; 1 otherwise; 2 nothing staged.
set -uo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
cd "$ROOT"
# shellcheck source=scripts/unpack-stage.sh
. "$ROOT/scripts/unpack-stage.sh"
OUT="${1:?usage: scripts/bridge-gpu.sh OUT_DIR}"
mkdir -p "$OUT"
OUT="$(cd "$OUT" && pwd)"
PYTHON="${PYTHON:-python3}"
command -v "$PYTHON" >/dev/null || { echo "bridge-gpu: $PYTHON not found" >&2; exit 2; }
WHEEL="$(ls stage/wheels/gpu_ipc-*.whl 2>/dev/null | head -n1)"
[ -n "$WHEEL" ] || { echo "bridge-gpu: no stage/wheels/gpu_ipc-*.whl; run scripts/stage-gpu.sh --nixl first" >&2; exit 2; }
[ -f stage/nixl.tar.xz ] || { echo "bridge-gpu: no stage/nixl.tar.xz; run scripts/stage-gpu.sh --nixl first" >&2; exit 2; }
unpack_stage "$ROOT"
export GPU_IPC_EXAMPLES_DIR="${GPU_IPC_EXAMPLES_DIR:-$ROOT/stage/bin}"

WORK="$(mktemp -d /tmp/gpu-ipc-bridge-XXXXXX)"
trap 'rm -rf "$WORK"' EXIT
PYTHON="$PYTHON" wheel_venv "$WORK/venv" "$WHEEL" || exit 2
mkdir -p "$WORK/nixl"
tar -C "$WORK/nixl" -xJf stage/nixl.tar.xz || exit 2
VPY="$WORK/venv/bin/python"
HERE_TAG="$("$VPY" -c 'import sys; print(f"cpython-{sys.version_info[0]}{sys.version_info[1]}")')"
if ! ls "$WORK/nixl/nixl_cu13/"_bindings."$HERE_TAG"-*.so >/dev/null 2>&1; then
    echo "bridge-gpu: stage/nixl.tar.xz is not for this $HERE_TAG ($(ls "$WORK/nixl/nixl_cu13/" | grep _bindings));" \
        "stage again with NIXL_PYVER=<this python's X.Y> scripts/stage-gpu.sh --nixl" >&2
    exit 2
fi
export PYTHONPATH="$WORK/nixl${PYTHONPATH:+:$PYTHONPATH}"
export NIXL_PLUGIN_DIR="$WORK/nixl/.nixl_cu13.mesonpy.libs/plugins"
"$VPY" -c 'import gpu_ipc.bridge_nixl as b; b.load_nixl()' || { echo "bridge-gpu: NIXL does not load" >&2; exit 2; }
echo "bridge-gpu: $(basename "$WHEEL") and NIXL in $WORK; results in $OUT" >&2
"$VPY" scripts/bridge_gpu.py run "$OUT" "${@:2}"  # --host: the dry run on the host backend
