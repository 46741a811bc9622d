#!/usr/bin/env bash
# The Python consumer for the GPU backends (ipc-core/tests/python/cuda_consumer.py, written from the docs alone)
# against the real producer, on a GPU machine, from what scripts/stage-gpu.sh staged (no Rust needed):
#   scripts/python-gpu-consumer.sh OUT_DIR
# For each backend (legacy, vmm) x sync (cpu-spin, cpu-sleep, ipc-event, gpu-stream-ops): stage/bin/producer on a
# temporary socket (1280x720 frames, --consumers 2), and two Python consumers at once, each reading and checking
# FRAMES frames (default 200; PY_GPU_FRAMES) against docs/kernels.md's frame check pattern. PY_GPU_CONSUMER_ARGS
# adds options to the consumers (e.g. "--verifier host"); PYTHON names the interpreter (default python3).
# Writes OUT_DIR/python-gpu.md (one row per backend x sync: exits, frames, mismatched words, verifier, the first
# error line) and OUT_DIR/python-gpu.log (every process's output). Every process runs under `timeout`; rows stop
# being started once the script has run 150 s, so it ends within about 3 minutes (8 rows; about 5 s each expected).
# Exit status: 0 only when every row's two consumers exited 0 having verified FRAMES frames each with 0 mismatched
# words; 1 otherwise; 2 when nothing is staged or python3 is missing.
set -uo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
cd "$ROOT"
# shellcheck source=scripts/unpack-stage.sh
. "$ROOT/scripts/unpack-stage.sh"
unpack_stage "$ROOT"
OUT="${1:?usage: scripts/python-gpu-consumer.sh OUT_DIR}"
mkdir -p "$OUT"
OUT="$(cd "$OUT" && pwd)"
PRODUCER="$ROOT/stage/bin/producer"
CONSUMER="$ROOT/ipc-core/tests/python/cuda_consumer.py"
PYTHON="${PYTHON:-python3}"
FRAMES="${PY_GPU_FRAMES:-200}"
PRODUCER_FRAMES=$((FRAMES + 200)) # the consumers join at frame 0 (--consumers 2) and leave after FRAMES
ROW_TIMEOUT=30                    # seconds, for each process of a row
BUDGET=150                        # no new row after this many seconds
MD="$OUT/python-gpu.md"
LOG="$OUT/python-gpu.log"
[ -x "$PRODUCER" ] || { echo "python-gpu-consumer: no $PRODUCER; run scripts/stage-gpu.sh first" >&2; exit 2; }
command -v "$PYTHON" >/dev/null || { echo "python-gpu-consumer: $PYTHON not found" >&2; exit 2; }

WORK="$(mktemp -d /tmp/gpu-ipc-pycuda-XXXXXX)"
PIDS=()
cleanup() {
    local pid
    for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null; done
    rm -rf "$WORK"
}
trap cleanup EXIT

# The summary field $2 of the JSON line (the last line of file $1), or "-".
field() {
    "$PYTHON" - "$1" "$2" <<'PY' 2>/dev/null || echo "-"
import json, sys
lines = [l for l in open(sys.argv[1]).read().splitlines() if l.startswith("{")]
print(json.loads(lines[-1]).get(sys.argv[2], "-") if lines else "-")
PY
}

{
    echo "date: $(date -u +%FT%TZ)"
    echo "commit: $(cat "$ROOT/stage/COMMIT" 2>/dev/null || echo unknown) (staged), $(git -C "$ROOT" rev-parse HEAD 2>/dev/null || echo unknown) (tree)"
    nvidia-smi -L 2>&1
    "$PYTHON" -c 'import sys; print("python", sys.version.split()[0])' 2>&1
    "$PYTHON" -c 'from importlib.metadata import version as v
for p in ("cuda-bindings", "cuda-python", "cupy-cuda13x", "cupy-cuda12x", "cupy", "numpy"):
    try: print(p, v(p))
    except Exception: pass' 2>&1
    "$PYTHON" "$CONSUMER" --self-test 2>&1
} >"$LOG"

{
    echo "# Python consumer (cuda_consumer.py) against the real producer"
    echo
    echo "$(date -u +%FT%TZ), $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | head -1)," \
        "1280x720 rgb8, 2 slots, two consumers of $FRAMES frames each per row. Exits and counts: consumer a / b."
    echo
    echo "| backend | sync | producer exit | consumer exit | frames | mismatched words | verifier | first error line |"
    echo "|---|---|---:|---:|---:|---:|---|---|"
} >"$MD"

START=$(date +%s)
FAILED=0
for backend in legacy vmm; do
    for sync in cpu-spin cpu-sleep ipc-event gpu-stream-ops; do
        if [ $(($(date +%s) - START)) -ge "$BUDGET" ]; then
            echo "| $backend | $sync | - | - | - | - | - | not run: the script's time budget ($BUDGET s) was spent |" >>"$MD"
            FAILED=1
            continue
        fi
        row="$WORK/$backend-$sync"
        mkdir -p "$row"
        sock="$row/frames.sock"
        echo "python-gpu-consumer: $backend / $sync" >&2
        timeout "$ROW_TIMEOUT" "$PRODUCER" --socket "$sock" --backend "$backend" --sync "$sync" \
            --frames "$PRODUCER_FRAMES" --width 1280 --height 720 --consumers 2 --attach-timeout 20 --json \
            >"$row/producer.out" 2>"$row/producer.err" &
        P=$!
        PIDS+=("$P")
        # The consumers get CUDA ready before connecting; still, start them only once the socket is there.
        for _ in $(seq 150); do [ -S "$sock" ] && break; kill -0 "$P" 2>/dev/null || break; sleep 0.1; done
        # shellcheck disable=SC2086 # PY_GPU_CONSUMER_ARGS is split on purpose
        timeout "$ROW_TIMEOUT" "$PYTHON" "$CONSUMER" --socket "$sock" --frames "$FRAMES" --name a \
            ${PY_GPU_CONSUMER_ARGS:-} >"$row/a.out" 2>"$row/a.err" &
        A=$!
        # shellcheck disable=SC2086
        timeout "$ROW_TIMEOUT" "$PYTHON" "$CONSUMER" --socket "$sock" --frames "$FRAMES" --name b \
            ${PY_GPU_CONSUMER_ARGS:-} >"$row/b.out" 2>"$row/b.err" &
        B=$!
        PIDS+=("$A" "$B")
        wait "$A"; ARC=$?
        wait "$B"; BRC=$?
        # The producer publishes the rest of its frames to nobody and ends; where a consumer failed it may wait for
        # one that never comes: give it a little time, then stop it (exit 143 in the table).
        grace=100
        [ "$ARC" -eq 0 ] && [ "$BRC" -eq 0 ] || grace=20
        for _ in $(seq "$grace"); do kill -0 "$P" 2>/dev/null || break; sleep 0.1; done
        kill "$P" 2>/dev/null
        wait "$P"; PRC=$?
        PIDS=()

        fa=$(field "$row/a.out" frames); fb=$(field "$row/b.out" frames)
        ma=$(field "$row/a.out" mismatched_words); mb=$(field "$row/b.out" mismatched_words)
        va=$(field "$row/a.out" verifier); vb=$(field "$row/b.out" verifier)
        verifier="$va"
        [ "$va" = "$vb" ] || verifier="$va / $vb"
        error=""
        for who in a b producer; do
            case $who in a) rc=$ARC ;; b) rc=$BRC ;; producer) rc=$PRC ;; esac
            if [ "$rc" -ne 0 ] && [ -z "$error" ]; then
                line=$(grep -m1 -v '^\s*$' "$row/$who.err")
                [ "$rc" -eq 124 ] && line="timed out after $ROW_TIMEOUT s${line:+; $line}"
                error="$who (exit $rc): ${line:-no message}"
            fi
        done
        if [ "$ARC" -eq 0 ] && [ "$BRC" -eq 0 ] && [ "$fa" = "$FRAMES" ] && [ "$fb" = "$FRAMES" ] &&
            [ "$ma" = 0 ] && [ "$mb" = 0 ]; then
            verdict=ok
        else
            verdict=FAILED
            FAILED=1
            [ -n "$error" ] || error="a consumer did not verify $FRAMES frames with 0 mismatched words"
        fi
        echo "| $backend | $sync | $PRC | $ARC / $BRC | $fa / $fb | $ma / $mb | $verifier | ${error//|/\\|} |" >>"$MD"
        echo "python-gpu-consumer: $backend / $sync: $verdict (exits $PRC $ARC $BRC)" >&2
        for f in producer.out producer.err a.out a.err b.out b.err; do
            echo "===== $backend / $sync: $f"
            cat "$row/$f"
        done >>"$LOG"
    done
done

echo >>"$MD"
echo "Total $(($(date +%s) - START)) s. $([ "$FAILED" -eq 0 ] && echo "Every row verified every frame." || echo "FAILED: see the rows above and python-gpu.log.")" >>"$MD"
cat "$MD"
exit "$FAILED"
