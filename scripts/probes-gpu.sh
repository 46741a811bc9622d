#!/usr/bin/env bash
# Runs the research probes on the GPU machine from what scripts/stage-gpu.sh staged (stage/bin/gpu-ipc), and writes
# the report: `gpu-ipc report` runs every probe without MPS and under a private MPS daemon it starts and stops.
#   scripts/probes-gpu.sh OUT_DIR [report options, e.g. --quick or --only coherency]
# OUT_DIR receives the report (README.md, plots/, raw/ with every probe's JSON and log) and report.log.
set -uo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
OUT="${1:?usage: scripts/probes-gpu.sh OUT_DIR [report options]}"
shift
mkdir -p "$OUT"
BIN="$ROOT/stage/bin/gpu-ipc"
[ -x "$BIN" ] || { echo "probes-gpu: $BIN not staged; run scripts/stage-gpu.sh first" >&2; exit 2; }
GPU_IPC_COMMIT="$(cat "$ROOT/stage/COMMIT" 2>/dev/null || echo unknown)"
export GPU_IPC_COMMIT
cd "$ROOT"
# shellcheck source=scripts/unpack-stage.sh
. "$ROOT/scripts/unpack-stage.sh"
unpack_stage "$ROOT"
"$BIN" report --out "$OUT" "$@" 2>&1 | tee "$OUT/report.log"
exit "${PIPESTATUS[0]}"
