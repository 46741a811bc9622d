#!/usr/bin/env bash
# Runs the whole GPU suite from what scripts/stage-gpu.sh staged, on a machine with an NVIDIA GPU and no Rust.
#   scripts/gpu-suite.sh OUT_DIR
# Writes into OUT_DIR: environment.txt (nvidia-smi, driver, MPS state), tests.log and junit.xml (every test of
# the workspace, GPU tests included), doctor.txt and doctor.json (gpu-ipc doctor), summary.json.
# Exit status: 0 when the tests and the doctor pass, 1 otherwise.
set -uo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
cd "$ROOT"
OUT="${1:?usage: scripts/gpu-suite.sh OUT_DIR}"
mkdir -p "$OUT"
STAGE="$ROOT/stage"
[ -x "$STAGE/bin/cargo-nextest" ] || { echo "gpu-suite: nothing staged; run scripts/stage-gpu.sh first" >&2; exit 2; }
START=$(date +%s)

{
    echo "date: $(date -u +%FT%TZ)"
    echo "commit: $(cat "$STAGE/COMMIT")"
    echo "host: $(uname -a)"
    nvidia-smi --query-gpu=name,uuid,driver_version,compute_cap,memory.total,compute_mode,clocks.sm,clocks.mem \
        --format=csv 2>&1
    nvidia-smi 2>&1
} >"$OUT/environment.txt"

echo "gpu-suite: [1/2] tests (GPU tests included)" >&2
"$STAGE/bin/cargo-nextest" nextest run --archive-file "$STAGE/gpu-tests.tar.zst" --workspace-remap . \
    --profile gpu --run-ignored all 2>&1 | tee "$OUT/tests.log"
TESTS_RC=${PIPESTATUS[0]}
JUNIT=$(find "$ROOT/target" -path '*nextest/gpu/junit.xml' 2>/dev/null | head -1)
[ -n "$JUNIT" ] && cp "$JUNIT" "$OUT/junit.xml"

echo "gpu-suite: [2/2] gpu-ipc doctor" >&2
"$STAGE/bin/gpu-ipc" doctor 2>&1 | tee "$OUT/doctor.txt"
DOCTOR_RC=${PIPESTATUS[0]}
"$STAGE/bin/gpu-ipc" doctor --json >"$OUT/doctor.json" 2>"$OUT/doctor-json.stderr"

END=$(date +%s)
cat >"$OUT/summary.json" <<JSON
{"commit": "$(cat "$STAGE/COMMIT")", "tests_exit": $TESTS_RC, "doctor_exit": $DOCTOR_RC, "seconds": $((END - START))}
JSON
cat "$OUT/summary.json"
[ "$TESTS_RC" -eq 0 ] && [ "$DOCTOR_RC" -eq 0 ]
