#!/usr/bin/env bash
# Quick end-to-end check of the staged example programs on a GPU machine: for each backend and sync strategy, one
# producer and two consumers exchange FRAMES (default 2000) 4K frames. Prints one line per run; exit 1 on failure.
#   tools/scripts/frames-smoke.sh [FRAMES]
set -uo pipefail
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
# shellcheck source=scripts/unpack-stage.sh
. "$ROOT/scripts/unpack-stage.sh"
unpack_stage "$ROOT"
BIN="$ROOT/stage/bin"
FRAMES="${1:-2000}"
FAIL=0
for backend in legacy vmm; do
    for sync in cpu-spin cpu-sleep ipc-event gpu-stream-ops; do
        sock="$(mktemp -u /tmp/gpu-ipc-smoke-XXXXXX.sock)"
        timeout 60 "$BIN/producer" --socket "$sock" --backend "$backend" --sync "$sync" --frames "$FRAMES" \
            --consumers 2 --json >/tmp/p.json 2>/tmp/p.err &
        P=$!
        timeout 60 "$BIN/consumer" --socket "$sock" --backend "$backend" --frames "$FRAMES" --name a --json \
            >/tmp/a.json 2>/tmp/a.err &
        A=$!
        timeout 60 "$BIN/consumer" --socket "$sock" --backend "$backend" --frames "$FRAMES" --name b --json \
            >/tmp/b.json 2>/tmp/b.err &
        B=$!
        wait $P; PRC=$?; wait $A; ARC=$?; wait $B; BRC=$?
        echo "$backend/$sync: exit $PRC/$ARC/$BRC producer $(cat /tmp/p.json) a $(cat /tmp/a.json)"
        if [ $PRC -ne 0 ] || [ $ARC -ne 0 ] || [ $BRC -ne 0 ]; then
            FAIL=1
            tail -3 /tmp/p.err /tmp/a.err /tmp/b.err
        fi
    done
done
exit $FAIL
