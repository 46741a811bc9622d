#!/usr/bin/env bash
# Issue 30's semaphore and MPS-kill items on a GPU machine, from what scripts/stage-gpu.sh staged (no Rust needed):
#   scripts/semaphore-gpu.sh OUT_DIR
# 1. The semaphore's GPU tests (examples/tests/gpu_semaphore.rs and ipc-core's, through the staged nextest archive):
#    stream waits on the count in device memory, stream posts as the post kernel, the poison and the reset, and
#    round_trips_cpu_and_stream_between_two_processes, which asserts the stream round trip within 2x of bare stream
#    memory operations measured in the same run (results appended to OUT_DIR/semaphore-no-mps.jsonl).
# 2. `semaphore bench --rounds 10000` on legacy and vmm, without MPS and under a private MPS daemon
#    (OUT_DIR/bench.jsonl: one JSON line each, with "mps" and "backend" added): cpu<->cpu, stream<->stream and the
#    memops<->memops reference.
# 3. `gpu-ipc-stress all --only mps-kills --trials 3 --backend B` for B in legacy and vmm, without and under MPS:
#    the fault rates (OUT_DIR/mps-kills-B/stress.md's first table, stress.json's mps_kill_rates).
# Estimated (not measured): 1 about 1-2 min, 2 about 1-2 min, 3 about 3-4 min per backend (8 cells x 3 trials). The
# lent machines allow 10 minutes a call: run it in three, e.g.
#   GPU_IPC_SEMAPHORE_STEPS="tests bench" scripts/semaphore-gpu.sh OUT/semaphore
#   GPU_IPC_SEMAPHORE_STEPS=kills GPU_IPC_SEMAPHORE_KILL_BACKENDS=legacy scripts/semaphore-gpu.sh OUT/semaphore
#   GPU_IPC_SEMAPHORE_STEPS=kills GPU_IPC_SEMAPHORE_KILL_BACKENDS=vmm scripts/semaphore-gpu.sh OUT/semaphore
# Exit status: 0 when every step passed, 1 otherwise.
set -uo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
cd "$ROOT"
# shellcheck source=scripts/unpack-stage.sh
. "$ROOT/scripts/unpack-stage.sh"
unpack_stage "$ROOT"
OUT="${1:?usage: scripts/semaphore-gpu.sh OUT_DIR}"
mkdir -p "$OUT"
OUT="$(cd "$OUT" && pwd)"
STAGE="$ROOT/stage"
BIN="$STAGE/bin"
[ -x "$BIN/semaphore" ] || { echo "semaphore-gpu: nothing staged; run scripts/stage-gpu.sh first" >&2; exit 2; }
STEPS="${GPU_IPC_SEMAPHORE_STEPS:-tests bench kills}"
{
    echo "date: $(date -u +%FT%TZ)"
    echo "commit: $(cat "$STAGE/COMMIT" 2>/dev/null)"
    nvidia-smi --query-gpu=name,driver_version,compute_mode --format=csv 2>&1
} >"$OUT/environment.txt"
FAILED=0

if [[ " $STEPS " == *" tests "* ]]; then
    echo "semaphore-gpu: the semaphore's GPU tests" >&2
    GPU_IPC_RESULTS_DIR="$OUT" GPU_IPC_RESULTS_TAG=no-mps \
        "$BIN/cargo-nextest" nextest run --archive-file "$STAGE/gpu-tests.tar.zst" --workspace-remap . --profile gpu \
        --run-ignored all -E 'binary(gpu_semaphore) | test(/semaphore/)' >"$OUT/tests.log" 2>&1 ||
        { FAILED=1; echo "semaphore-gpu: FAILED: the semaphore's GPU tests (tests.log)" >&2; }
    grep -E "semaphore (legacy|vmm):|Summary|FAIL" "$OUT/tests.log" >&2
fi

if [[ " $STEPS " == *" bench "* ]]; then
    # bench_pass MPS: both backends' round trips, one JSON line each.
    bench_pass() {
        local mps="$1" backend line
        for backend in legacy vmm; do
            echo "+ [$mps] semaphore bench --backend $backend --rounds 10000 --json" >>"$OUT/bench.log"
            line="$(timeout 300 "$BIN/semaphore" bench --backend "$backend" --rounds 10000 --json 2>>"$OUT/bench.log" |
                grep '^{' | tail -n 1)" || { FAILED=1; echo "semaphore-gpu: FAILED: bench [$mps] $backend" >&2; }
            [ -n "$line" ] || line='{}'
            python3 -c 'import json,sys; r=json.loads(sys.argv[3]); r.update(mps=sys.argv[1], backend=sys.argv[2]); print(json.dumps(r))' \
                "$mps" "$backend" "$line" | tee -a "$OUT/bench.jsonl" >&2
        done
    }
    bench_pass no-mps
    # shellcheck source=scripts/mps.sh
    if . "$ROOT/scripts/mps.sh" && mps_start; then
        bench_pass mps
        mps_stop "$OUT/mps-logs"
    else
        FAILED=1
        echo "semaphore-gpu: FAILED: no private MPS daemon for the bench's MPS pass" >&2
    fi
fi

if [[ " $STEPS " == *" kills "* ]]; then
    # One stress run per backend (each about 3-4 minutes: 8 cells x 3 trials), each its own output folder.
    for backend in ${GPU_IPC_SEMAPHORE_KILL_BACKENDS:-legacy vmm}; do
        echo "semaphore-gpu: gpu-ipc-stress all --only mps-kills --trials 3 --backend $backend" >&2
        timeout 590 "$BIN/gpu-ipc-stress" all --only mps-kills --trials 3 --backend "$backend" --bin-dir "$BIN" \
            --out "$OUT/mps-kills-$backend" >"$OUT/mps-kills-$backend.log" 2>&1 ||
            { FAILED=1; echo "semaphore-gpu: FAILED: mps-kills $backend (mps-kills-$backend.log)" >&2; }
        grep "mps-kills rate" "$OUT/mps-kills-$backend.log" >&2
    done
fi
exit "$FAILED"
