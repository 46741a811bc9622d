#!/usr/bin/env bash
# Diagnosis of stale frames after a producer SIGKILL (gpu-stream-ops): one producer, one consumer that checks each
# frame before taking the next, the producer killed at frame KILL_AT; prints the consumer's mismatch reports with the
# kill time. Usage: tools/scripts/diag-stale.sh OUT [backend] [sync] [check]   (check: --check-each-frame or "")
set -uo pipefail
OUT="${1:?usage}"; BACKEND="${2:-vmm}"; SYNC="${3:-gpu-stream-ops}"; CHECK="${4---check-each-frame}"
mkdir -p "$OUT"
S=/tmp/diag-$$.sock
stage/bin/producer --socket $S --backend $BACKEND --sync $SYNC --slots 2 --consumers 1 --frames 100000 \
    --width 1280 --height 720 --progress-every 100 2>"$OUT/p.log" &
PP=$!
stage/bin/consumer --socket $S --backend $BACKEND --frames 0 $CHECK --json >"$OUT/c.json" 2>"$OUT/c.log" &
CP=$!
for _ in $(seq 1 3000); do grep -q "frame 1000" "$OUT/p.log" 2>/dev/null && break; sleep 0.01; done
python3 -c 'import time; print("kill at %.3f s since the epoch" % time.time())' >"$OUT/kill.txt"
kill -9 $PP
wait $CP; echo "consumer exit $?" >>"$OUT/kill.txt"
rm -f "$S" # the killed producer could not remove its socket
cat "$OUT/kill.txt"; grep -c mismatched "$OUT/c.log"; grep mismatched "$OUT/c.log" | head -5; grep mismatched "$OUT/c.log" | tail -3
tail -3 "$OUT/c.log"; cat "$OUT/c.json"
