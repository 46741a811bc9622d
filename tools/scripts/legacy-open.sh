#!/usr/bin/env bash
# Builds tools/scripts/legacy-open.cu with nvcc and times, on the GPU machine, an importer's cuIpcOpenMemHandle and
# cuIpcCloseMemHandle of one cuMemAlloc allocation of each size, in a fresh process each time (the bare driver, no
# gpu-ipc code): why the legacy backend rounds its allocations up to 2 MiB (ipc_legacy::ALLOCATION_GRANULE).
#   tools/scripts/legacy-open.sh OUT_DIR [BYTES ...]
# Default sizes: 1 GiB and 22 GiB, each exactly and plus 256 bytes (the weights' arena of 22.4 GB was such a size).
# OUT_DIR receives legacy-open.jsonl (one line per open: bytes, open_ms, first_read_ms, close_ms, ok; three per size)
# and build.log. About 30 s on an H200. Exit status: 0 every open read its byte back, 1 otherwise, 2 no nvcc.
set -uo pipefail
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
OUT="${1:?usage: tools/scripts/legacy-open.sh OUT_DIR [BYTES ...]}"
shift
SIZES=("$@")
[ ${#SIZES[@]} -gt 0 ] || SIZES=(1073741824 1073742080 23622320128 23622320384)
mkdir -p "$OUT"
OUT="$(cd "$OUT" && pwd)"
NVCC="$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)"
[ -x "$NVCC" ] || { echo "legacy-open: nvcc not found" >&2; exit 2; }
WORK="$(mktemp -d /tmp/legacy-open-XXXXXX)"
trap 'exec 7>&- 2>/dev/null; rm -rf "$WORK"' EXIT
"$NVCC" -O2 -o "$WORK/legacy-open" "$ROOT/tools/scripts/legacy-open.cu" -lcuda >"$OUT/build.log" 2>&1 \
    || { echo "legacy-open: build failed (build.log)" >&2; exit 1; }
: >"$OUT/legacy-open.jsonl"
rc=0
for bytes in "${SIZES[@]}"; do
    mkfifo "$WORK/go"
    "$WORK/legacy-open" export "$bytes" "$WORK/handle" <"$WORK/go" >"$WORK/export.txt" 2>&1 &
    exporter=$!
    exec 7>"$WORK/go"
    for _ in $(seq 1 300); do grep -q ready "$WORK/export.txt" 2>/dev/null && break; sleep 0.1; done
    if ! grep -q ready "$WORK/export.txt"; then
        echo "legacy-open: the exporter of $bytes bytes did not start: $(cat "$WORK/export.txt")" >&2
        rc=1
    else
        for _ in 1 2 3; do
            "$WORK/legacy-open" import "$WORK/handle" | tee -a "$OUT/legacy-open.jsonl" || rc=1
        done
    fi
    echo go >&7
    exec 7>&-
    wait "$exporter" || rc=1
    rm -f "$WORK/go" "$WORK/handle" "$WORK/export.txt"
done
exit $rc
