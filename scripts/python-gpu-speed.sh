#!/usr/bin/env bash
# The Python package's own cost per frame, a torch consumer against the Rust consumer (the same GPU work) and the stamp
# check after a producer SIGKILL, on the GPU machine, from a staged tree (scripts/stage-gpu.sh: stage/wheels/ the
# wheel, stage/bin consumer_overhead, producer, consumer):
#   scripts/python-gpu-speed.sh OUT_DIR
# Installs the staged wheel into a fresh virtual environment that sees the machine's torch (nothing system-wide) and
# runs scripts/python_gpu_speed.py run OUT_DIR: OUT_DIR/python-speed.{md,json} (device, date, commit) and
# python-speed.log, python-speed-pairs.log. About 3-4 minutes on an H200. Exit status: 0 every row ok; 1 a row
# failed; 2 nothing staged.
set -uo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
cd "$ROOT"
# shellcheck source=scripts/unpack-stage.sh
. "$ROOT/scripts/unpack-stage.sh"
OUT="${1:?usage: scripts/python-gpu-speed.sh OUT_DIR}"
mkdir -p "$OUT"
OUT="$(cd "$OUT" && pwd)"
WHEEL="$(ls stage/wheels/gpu_ipc-*.whl 2>/dev/null | head -n1)"
[ -n "$WHEEL" ] || { echo "python-gpu-speed: no stage/wheels/gpu_ipc-*.whl; run scripts/stage-gpu.sh first" >&2; exit 2; }
unpack_stage "$ROOT"
export GPU_IPC_EXAMPLES_DIR="${GPU_IPC_EXAMPLES_DIR:-$ROOT/stage/bin}"
WORK="$(mktemp -d /tmp/gpu-ipc-pyspeed-XXXXXX)"
trap 'rm -rf "$WORK"' EXIT
wheel_venv "$WORK/venv" "$WHEEL" || exit 2
"$WORK/venv/bin/python" scripts/python_gpu_speed.py run "$OUT" 2>&1 | tee "$OUT/python-speed.log"
exit "${PIPESTATUS[0]}"
