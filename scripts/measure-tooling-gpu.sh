#!/usr/bin/env bash
# Checks the measurement tooling on the GPU machine from what scripts/stage-gpu.sh staged: every kind of helper
# process (`gpu-ipc helper` with each role; the criterion benches' helpers) and every kind of benchmark row, in quick
# passes, so that a renamed or moved piece that no longer runs shows here in minutes rather than in a full run.
#   scripts/measure-tooling-gpu.sh OUT_DIR
# 1. `gpu-ipc doctor` and `--json`: its self-test's consumer is a helper (role doctor-self-test); expected exit 0,
#    and per backend a line "cpu-spin: pid N attached in X ms and verified 8 frames (4 MiB each)" (and the same for
#    gpu-stream-ops where the device has 64-bit stream memory operations);
# 2. `gpu-ipc bench pipeline --quick` on rows of every kind (the references always run; the study's designs, the
#    imported-buffer rows, ours at 2 slots with one consumer and 4 slots with four, three stages, paced at 60 FPS,
#    frame graphs on stream-op waits): helper roles bench-consumer, bench-stage, bench-exporter; then the same rows
#    under a private MPS daemon (`--mps`). Expected: exit 0 and no row "failed" (rows "unavailable" say why, e.g.
#    gpu-poll without MPS); rows-PASS.txt lists each row's outcome;
# 3. `gpu-ipc probe vmm-compat --quick`: a fresh helper per allocation (roles vmm-compat-*); expected exit 0;
# 4. the criterion GPU benches whose helpers are started with the socket in the environment (gpu_memory's exporters,
#    gpu_signal's echo, persistent sink and attach exporters), briefly, without and under MPS (scripts/bench-gpu.sh
#    with short criterion times); expected exit 0 and summary.md with their tables.
# About 8 minutes in all (not yet timed). OUT_DIR receives summary.json (each step's exit status and failed rows),
# doctor.txt, doctor.json, bench-PASS.{json,md,log}, rows-PASS.txt, vmm-compat.{json,log}, benches/ (bench-gpu.sh).
# Exit status: 0 when every step passed, 1 otherwise, 2 nothing staged.
set -uo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
cd "$ROOT"
# shellcheck source=scripts/unpack-stage.sh
. "$ROOT/scripts/unpack-stage.sh"
unpack_stage "$ROOT"
OUT="${1:?usage: scripts/measure-tooling-gpu.sh OUT_DIR}"
mkdir -p "$OUT"
OUT="$(cd "$OUT" && pwd)"
BIN="$ROOT/stage/bin/gpu-ipc"
[ -x "$BIN" ] || { echo "measure-tooling-gpu: $BIN not staged; run scripts/stage-gpu.sh first" >&2; exit 2; }
GPU_IPC_COMMIT="$(cat "$ROOT/stage/COMMIT" 2>/dev/null || echo unknown)"
export GPU_IPC_COMMIT
START=$(date +%s)

echo "measure-tooling-gpu: [1/4] gpu-ipc doctor" >&2
"$BIN" doctor 2>&1 | tee "$OUT/doctor.txt"
DOCTOR_RC=${PIPESTATUS[0]}
"$BIN" doctor --json >"$OUT/doctor.json" 2>>"$OUT/doctor.txt"
DOCTOR_JSON_RC=$?

ROWS="study,memory-imported,ours+cpu-spin+s2-c1,ours+gpu-stream-ops+s4-c4,three-stage+gpu-stream-ops,paced-60+gpu-stream-ops,graphs+stream-op-waits"
declare -A BENCH_RC FAILED_ROWS
for pass in no-mps mps; do
    echo "measure-tooling-gpu: [2/4] gpu-ipc bench pipeline --quick ($pass)" >&2
    extra=()
    [ "$pass" = mps ] && extra=(--mps)
    "$BIN" bench pipeline --quick --no-progress --rows "$ROWS" "${extra[@]}" --out "$OUT/bench-$pass.json" \
        --markdown "$OUT/bench-$pass.md" >"$OUT/bench-$pass.log" 2>&1
    BENCH_RC[$pass]=$?
    # Each row's outcome, and how many failed (a missing JSON counts as one failure).
    FAILED_ROWS[$pass]=$(python3 - "$OUT/bench-$pass.json" "$OUT/rows-$pass.txt" <<'EOF'
import json, sys
try:
    rows = json.load(open(sys.argv[1]))["results"]["rows"]
except (OSError, ValueError, KeyError) as e:
    open(sys.argv[2], "w").write(f"no results: {e}\n")
    print(1)
    sys.exit(0)
with open(sys.argv[2], "w") as out:
    for r in rows:
        o = r["outcome"]
        out.write(f"{r['row']}: {o['status']}{': ' + o['reason'] if 'reason' in o else ''}\n")
print(sum(1 for r in rows if r["outcome"]["status"] == "failed"))
EOF
)
done

echo "measure-tooling-gpu: [3/4] gpu-ipc probe vmm-compat --quick" >&2
"$BIN" probe vmm-compat --quick --no-progress --out "$OUT/vmm-compat.json" >"$OUT/vmm-compat.log" 2>&1
VMM_RC=$?

echo "measure-tooling-gpu: [4/4] criterion GPU benches, briefly (scripts/bench-gpu.sh)" >&2
"$ROOT/scripts/bench-gpu.sh" "$OUT/benches" --warm-up-time 0.2 --measurement-time 0.5 >"$OUT/benches.log" 2>&1
BENCHES_RC=$?

END=$(date +%s)
cat >"$OUT/summary.json" <<EOF
{"commit": "$GPU_IPC_COMMIT", "doctor_exit": $DOCTOR_RC, "doctor_json_exit": $DOCTOR_JSON_RC, "bench_no_mps_exit": ${BENCH_RC[no-mps]}, "bench_no_mps_failed_rows": ${FAILED_ROWS[no-mps]}, "bench_mps_exit": ${BENCH_RC[mps]}, "bench_mps_failed_rows": ${FAILED_ROWS[mps]}, "vmm_compat_exit": $VMM_RC, "benches_exit": $BENCHES_RC, "seconds": $((END - START))}
EOF
cat "$OUT/summary.json"
if [ "$DOCTOR_RC" -eq 0 ] && [ "$DOCTOR_JSON_RC" -eq 0 ] && [ "${BENCH_RC[no-mps]}" -eq 0 ] \
    && [ "${BENCH_RC[mps]}" -eq 0 ] && [ "${FAILED_ROWS[no-mps]}" = 0 ] && [ "${FAILED_ROWS[mps]}" = 0 ] \
    && [ "$VMM_RC" -eq 0 ] && [ "$BENCHES_RC" -eq 0 ]; then
    exit 0
fi
exit 1
