#!/usr/bin/env bash
# On the GPU machine, from what scripts/stage-gpu.sh staged: frames through gpu-ipc written and checked by the
# user's own NVRTC-compiled kernel (examples/src/bin/cudarc_frames.rs), launched by cudarc on the user's cudarc stream
# against the same kernel launched by gpu-ipc's launcher on a gpu-ipc stream; then a consumer reading until the end
# of the stream with each strategy after a clean producer exit, and after a producer SIGKILL (gpu-poll under a
# private MPS daemon, the only place it runs).
#   scripts/interop-gpu.sh OUT_DIR [ROUNDS]     (ROUNDS of the throughput table, default 3; rows interleaved)
# OUT_DIR receives interop.jsonl (one line per run), interop.md (the table, medians, ratios) and the logs.
set -uo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
cd "$ROOT"
# shellcheck source=scripts/unpack-stage.sh
. "$ROOT/scripts/unpack-stage.sh"
unpack_stage "$ROOT"
OUT="${1:?usage: scripts/interop-gpu.sh OUT_DIR [ROUNDS]}"
ROUNDS="${2:-3}"
mkdir -p "$OUT"
OUT="$(cd "$OUT" && pwd)"
BIN="$ROOT/stage/bin/cudarc_frames"
[ -x "$BIN" ] || { echo "interop-gpu: $BIN not staged; run scripts/stage-gpu.sh first" >&2; exit 2; }

# cudarc loads NVRTC as libnvrtc.so (or .so.12, .so.11, ...): point it at the toolkit's, whatever its soname.
NVRTC="$(ls /usr/local/cuda/lib64/libnvrtc.so* /usr/local/cuda*/targets/*/lib/libnvrtc.so* 2>/dev/null | grep -v builtins | head -1)"
if [ -n "$NVRTC" ]; then
    LINKS="$(mktemp -d)"
    ln -s "$NVRTC" "$LINKS/libnvrtc.so"
    export LD_LIBRARY_PATH="$LINKS${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    echo "interop-gpu: NVRTC from $NVRTC" >&2
else
    echo "interop-gpu: no libnvrtc.so found; the runs will fail to compile their kernels" >&2
fi
JSONL="$OUT/interop.jsonl"
: >"$JSONL"
FRAMES=3000
RC=0

# One producer/consumer pair; appends the consumer's and producer's summaries to interop.jsonl with the row's keys.
pair() { # test backend sync launch frames consumer_frames [kill]
    local test=$1 backend=$2 sync=$3 launch=$4 frames=$5 cframes=$6 kill=${7:-}
    local sock="/tmp/gpu-ipc-interop-$$.sock" tag="$test-$backend-$sync-$launch"
    "$BIN" --role producer --socket "$sock" --backend "$backend" --sync "$sync" --launch "$launch" \
        --frames "$frames" --json >"$OUT/$tag.producer.json" 2>"$OUT/$tag.producer.log" &
    local producer=$!
    "$BIN" --role consumer --socket "$sock" --backend "$backend" --sync "$sync" --launch "$launch" \
        --frames "$cframes" --json >"$OUT/$tag.consumer.json" 2>"$OUT/$tag.consumer.log" &
    local consumer=$!
    if [ -n "$kill" ]; then
        sleep "$kill"
        kill -9 "$producer" 2>/dev/null
    fi
    local crc=0 prc=0
    wait "$consumer" || crc=$?
    wait "$producer" || prc=$?
    python3 - "$test" "$backend" "$sync" "$launch" "$crc" "$prc" "$OUT/$tag.consumer.json" "$OUT/$tag.producer.json" >>"$JSONL" <<'PY'
import json, sys
test, backend, sync, launch, crc, prc, cpath, ppath = sys.argv[1:]
def load(p):
    try:
        return json.loads(open(p).read().strip() or "null")
    except Exception:
        return None
print(json.dumps({"test": test, "backend": backend, "sync": sync, "launch": launch,
                  "consumer_exit": int(crc), "producer_exit": int(prc),
                  "consumer": load(cpath), "producer": load(ppath)}))
PY
    rm -f "$sock"
}

echo "interop-gpu: throughput, $ROUNDS rounds, 1920x1080 RGB, 4 slots, $FRAMES frames" >&2
for round in $(seq "$ROUNDS"); do
    for backend in legacy vmm; do
        for sync in ipc-event cpu-spin gpu-stream-ops; do
            for launch in cudarc gpu-ipc; do
                pair "throughput" "$backend" "$sync" "$launch" "$FRAMES" "$FRAMES"
            done
        done
    done
    echo "interop-gpu: round $round done" >&2
done

echo "interop-gpu: reading until the end of the stream (clean exit, then SIGKILL)" >&2
for backend in legacy vmm; do
    for sync in cpu-spin cpu-sleep ipc-event gpu-stream-ops; do
        pair "end-of-stream" "$backend" "$sync" cudarc 2000 0
        pair "producer-killed" "$backend" "$sync" cudarc 1000000 0 3
    done
done

# gpu-poll runs only where MPS does: the same two checks under a private MPS daemon.
# shellcheck source=scripts/mps.sh
. "$ROOT/scripts/mps.sh"
if mps_start; then
    echo "interop-gpu: gpu-poll under a private MPS daemon" >&2
    for backend in legacy vmm; do
        pair "end-of-stream" "$backend" gpu-poll cudarc 2000 0
        pair "producer-killed" "$backend" gpu-poll cudarc 1000000 0 3
    done
    mps_stop "$OUT/mps-logs"
else
    echo "interop-gpu: no MPS ($MPS_REASON): gpu-poll rows not run" >&2
    RC=1
fi

python3 "$ROOT/scripts/interop_table.py" "$JSONL" >"$OUT/interop.md" || RC=1
cat "$OUT/interop.md"
[ -n "${LINKS:-}" ] && rm -rf "$LINKS"
exit $RC
