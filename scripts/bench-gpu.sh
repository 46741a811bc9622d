#!/usr/bin/env bash
# Runs the criterion micro-benchmarks on the GPU machine from what scripts/stage-gpu.sh staged (stage/benches.tar.xz:
# gpu_memory, gpu_signal, api_cpu, bench-summary), and writes criterion's output and a Markdown summary.
#   scripts/bench-gpu.sh OUT_DIR [criterion options for the GPU benches, e.g. a filter or --measurement-time 2]
# 1. gpu_memory and gpu_signal with the machine as it is, without MPS;
# 2. the same under a private MPS daemon (started here, stopped here);
# 3. api_cpu (the frame API's CPU cost on the fake backend; no GPU involved) once.
# Estimated at about 3 minutes in all with the default (short) criterion settings (not yet timed). A GPU bench that
# finds no GPU fails here (GPU_IPC_BENCH_REQUIRE_GPU=1) instead of skipping.
# OUT_DIR receives: summary.md (one section per pass), environment.txt, and per pass (no-mps, mps, cpu):
# criterion-PASS/ (criterion's JSON: estimates, samples), samples-PASS/ (round trips and attaches timed one by one),
# BENCH-PASS.log.
# Environment: GPU_IPC_BENCH_PASSES (default "no-mps mps"); GPU_IPC_ALLOW_NO_MPS=1 lets a pass under MPS that
# cannot start be reported as skipped rather than failed.
# Exit status: 0 every bench of every pass ran; 1 otherwise (summary.md says which); 2 nothing staged.
set -uo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
cd "$ROOT"
OUT="${1:?usage: scripts/bench-gpu.sh OUT_DIR [criterion options]}"
shift
ARGS="$*"
mkdir -p "$OUT"
OUT="$(cd "$OUT" && pwd)"
STAGE="$ROOT/stage"
[ -f "$STAGE/benches.tar.xz" ] || { echo "bench-gpu: stage/benches.tar.xz missing; run scripts/stage-gpu.sh first" >&2; exit 2; }
BIN="$(mktemp -d)"
# Python's tarfile reads xz without an xz binary (the GPU machine may have none).
python3 -c '
import sys, tarfile
with tarfile.open(sys.argv[1]) as t:
    t.extractall(sys.argv[2], **({"filter": "data"} if hasattr(tarfile, "data_filter") else {}))
' "$STAGE/benches.tar.xz" "$BIN" || { echo "bench-gpu: cannot unpack stage/benches.tar.xz" >&2; exit 2; }
COMMIT="$(cat "$STAGE/COMMIT" 2>/dev/null || echo unknown)"
DEVICE="$(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | head -1)"
START=$(date +%s)
export GPU_IPC_BENCH_REQUIRE_GPU=1
{
    echo "date: $(date -u +%FT%TZ)"
    echo "commit: $COMMIT"
    echo "host: $(uname -a)"
    nvidia-smi --query-gpu=name,uuid,driver_version,compute_cap,memory.total,compute_mode,clocks.sm,clocks.mem \
        --format=csv 2>&1
} >"$OUT/environment.txt"

FAILED=()
SUMMARY="$OUT/summary.md"
: >"$SUMMARY"

# run_bench PASS BENCH [criterion options]: one bench binary, its output under OUT.
run_bench() {
    local pass="$1" bench="$2"
    shift 2
    echo "bench-gpu: [$pass] $bench" >&2
    CRITERION_HOME="$OUT/criterion-$pass" GPU_IPC_BENCH_SAMPLES="$OUT/samples-$pass" \
        timeout 300 "$BIN/$bench" --bench --noplot "$@" 2>&1 | tee "$OUT/$bench-$pass.log"
    local rc=${PIPESTATUS[0]}
    [ "$rc" -eq 0 ] || FAILED+=("$bench ($pass): exit $rc, see $bench-$pass.log")
}

# summarise PASS TITLE: appends the pass's tables to summary.md.
summarise() {
    "$BIN/bench-summary" --criterion "$OUT/criterion-$1" --samples "$OUT/samples-$1" --title "$2" \
        --context "commit $COMMIT" --context "device: ${DEVICE:-unknown}" \
        --context "command: scripts/bench-gpu.sh OUT $ARGS" >>"$SUMMARY" 2>>"$OUT/summary.log" ||
        FAILED+=("summary of $1: see summary.log")
}

# shellcheck source=scripts/mps.sh
. "$ROOT/scripts/mps.sh"
for pass in ${GPU_IPC_BENCH_PASSES:-no-mps mps}; do
    case "$pass" in
    no-mps)
        run_bench no-mps gpu_memory "$@"
        run_bench no-mps gpu_signal "$@"
        summarise no-mps "GPU micro-benchmarks, no MPS"
        ;;
    mps)
        REASON=""
        if mps_start; then
            run_bench mps gpu_memory "$@"
            run_bench mps gpu_signal "$@"
            summarise mps "GPU micro-benchmarks, under a private MPS daemon"
        else
            REASON="$MPS_REASON"
        fi
        mps_stop "$OUT/mps-log"
        if [ -n "$REASON" ]; then
            echo "bench-gpu: MPS pass SKIPPED: $REASON" >&2
            printf '# GPU micro-benchmarks, under MPS\n\nSkipped: %s.\n\n' "$REASON" >>"$SUMMARY"
            [ "${GPU_IPC_ALLOW_NO_MPS:-0}" = 1 ] || FAILED+=("MPS pass: $REASON")
        fi
        ;;
    *) FAILED+=("unknown pass '$pass' in GPU_IPC_BENCH_PASSES (no-mps, mps)") ;;
    esac
done

run_bench cpu api_cpu
summarise cpu "Frame API CPU cost, fake backend (no GPU involved)"

rm -rf "$BIN"
END=$(date +%s)
{
    echo "Run took $((END - START)) s."
    if [ "${#FAILED[@]}" -ne 0 ]; then
        echo
        echo "Failed:"
        printf -- '- %s\n' "${FAILED[@]}"
    fi
} >>"$SUMMARY"
cat "$SUMMARY"
[ "${#FAILED[@]}" -eq 0 ]
