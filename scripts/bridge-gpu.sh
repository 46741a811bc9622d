#!/usr/bin/env bash
# The bridge over NIXL on a GPU machine, in one call (about 3 minutes; it stops starting work after BRIDGE_BUDGET_S,
# default 270 s), from what `scripts/stage-gpu.sh --bridge` staged in stage-bridge/ (the wheel, NIXL reduced to its
# UCX backend, the commit; nothing is downloaded there). A full stage (`scripts/stage-gpu.sh --nixl`: stage/wheels,
# stage/nixl.tar.xz) works too. BRIDGE_STAGE=DIR picks the folder; default stage-bridge/ if present, else stage/.
#   scripts/bridge-gpu.sh OUT_DIR [--host]      (--host: a dry run of the harness on the host backend, no GPU)
# 1. a fresh venv made with --system-site-packages (the machine's torch and cuda-bindings), the staged gpu_ipc wheel
#    installed with `pip install --no-index --no-deps`; NIXL unpacked into it and put on PYTHONPATH, NIXL_PLUGIN_DIR
#    at its plugins;
# 2. scripts/bridge_gpu.py run OUT_DIR: for each backend (BRIDGE_BACKENDS, default legacy,vmm) the plain ring (torch
#    producer -> two torch consumers), the bridge with its defaults (torch producer -> ring A -> send -> NIXL ->
#    receive -> ring B -> two torch consumers; every word checked on the GPU; FPS, its ratio to the plain ring, latency
#    p50/p99; the path and transport the sending end's probe found), the bridge with --path direct, the refused row
#    (UCX_TLS=tcp,cuda_copy --expect gpu-direct: exit 3 before any frame), on two GPUs the bridge with ring B on GPU 1;
#    then BRIDGE_KILLS (default 10) SIGKILLs of each end and each backend mid-stream, the other end's error timed
#    (goal: within 1 s; ring B on GPU 1 when there are two).
# BRIDGE_MPS=1: every process (the plain ring's too) under a private MPS daemon, started and stopped here (scripts/mps.sh;
# the title of bridge.md says which); without it, the processes time-slice the GPU.
# Writes OUT_DIR/bridge.md (the tables, with device, date and commit), bridge.json, bridge.log (every process's
# output, the sending end's reports during each run). Exit status: 0 every row, refusal and kill trial as expected
# and the default rows on a GPU path; 1 otherwise; 2 nothing staged.
set -uo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
cd "$ROOT"
OUT="${1:?usage: scripts/bridge-gpu.sh OUT_DIR [--host]}"
mkdir -p "$OUT"
OUT="$(cd "$OUT" && pwd)"
PYTHON="${PYTHON:-python3}"
command -v "$PYTHON" >/dev/null || { echo "bridge-gpu: $PYTHON not found" >&2; exit 2; }
if [ -z "${BRIDGE_STAGE:-}" ]; then
    BRIDGE_STAGE="stage"
    [ -d stage-bridge ] && BRIDGE_STAGE="stage-bridge"
fi
BRIDGE_STAGE="$(cd "$BRIDGE_STAGE" 2>/dev/null && pwd)" || {
    echo "bridge-gpu: no stage folder; run scripts/stage-gpu.sh --bridge first (and carry stage-bridge)" >&2; exit 2; }
WHEEL="$(ls "$BRIDGE_STAGE"/wheels/gpu_ipc-*.whl 2>/dev/null | head -n1)"
[ -n "$WHEEL" ] || { echo "bridge-gpu: no $BRIDGE_STAGE/wheels/gpu_ipc-*.whl; run scripts/stage-gpu.sh --bridge" >&2; exit 2; }
[ -f "$BRIDGE_STAGE/nixl.tar.xz" ] || { echo "bridge-gpu: no $BRIDGE_STAGE/nixl.tar.xz; run scripts/stage-gpu.sh --bridge" >&2; exit 2; }
export BRIDGE_STAGE_DIR="$BRIDGE_STAGE"
# shellcheck source=scripts/unpack-stage.sh
. "$ROOT/scripts/unpack-stage.sh"

WORK="$(mktemp -d /tmp/gpu-ipc-bridge-XXXXXX)"
trap 'rm -rf "$WORK"' EXIT
PYTHON="$PYTHON" wheel_venv "$WORK/venv" "$WHEEL" || exit 2
mkdir -p "$WORK/nixl"
tar -C "$WORK/nixl" -xJf "$BRIDGE_STAGE/nixl.tar.xz" || exit 2
VPY="$WORK/venv/bin/python"
HERE_TAG="$("$VPY" -c 'import sys; print(f"cpython-{sys.version_info[0]}{sys.version_info[1]}")')"
if ! ls "$WORK/nixl/nixl_cu13/"_bindings."$HERE_TAG"-*.so >/dev/null 2>&1; then
    echo "bridge-gpu: $BRIDGE_STAGE/nixl.tar.xz is not for this $HERE_TAG ($(ls "$WORK/nixl/nixl_cu13/" | grep _bindings));" \
        "stage again with NIXL_PYVER=<this python's X.Y> scripts/stage-gpu.sh --bridge" >&2
    exit 2
fi
export PYTHONPATH="$WORK/nixl${PYTHONPATH:+:$PYTHONPATH}"
export NIXL_PLUGIN_DIR="$WORK/nixl/.nixl_cu13.mesonpy.libs/plugins"
"$VPY" -c 'import gpu_ipc.bridge_nixl as b; b.load_nixl()' || { echo "bridge-gpu: NIXL does not load" >&2; exit 2; }
if [ "${2:-}" != "--host" ]; then
    "$VPY" -c 'import cuda.bindings.driver' 2>/dev/null || "$VPY" -c 'import cuda.cuda' 2>/dev/null ||
        echo "bridge-gpu: WARNING: no cuda-bindings here: the receiving end cannot make landing buffers" >&2
fi
echo "bridge-gpu: $(basename "$WHEEL") and NIXL from $BRIDGE_STAGE in $WORK; results in $OUT" >&2
if [ "${BRIDGE_MPS:-0}" = 1 ]; then
    # shellcheck source=scripts/mps.sh
    . "$ROOT/scripts/mps.sh"
    mps_start || { echo "bridge-gpu: BRIDGE_MPS=1 but MPS does not start: $MPS_REASON" >&2; exit 1; }
    "$VPY" scripts/bridge_gpu.py run "$OUT" "${@:2}"
    RC=$?
    mps_stop "$OUT/mps-log"
    exit $RC
fi
"$VPY" scripts/bridge_gpu.py run "$OUT" "${@:2}"  # --host: the dry run on the host backend
