#!/usr/bin/env bash
# The toolkit's figures on a GPU machine, from what scripts/stage-gpu.sh staged (no Rust needed there):
#   scripts/toolkit-gpu.sh OUT_DIR
# Without MPS, then under a private MPS daemon (started and stopped here): the pool's attach and lookup cost at 1 and
# 16 GiB (stage/bin/pool bench), the semaphore's round trips CPU<->CPU and stream<->stream (stage/bin/semaphore
# bench), and each further toolkit bench staged beside them (work_queue) when present; legacy and vmm each. Then the
# three-stage pipeline rows of `gpu-ipc bench pipeline` beside the two-process rings (--rows three-stage,-s4-c1,
# both backends; docs/pipelines.md).
# OUT_DIR receives toolkit.jsonl (one JSON line per run, with "mps", "backend", "what" added), pipeline-MPS.json
# and pipeline-MPS.md (the bench's JSON and table, MPS = no-mps or mps), toolkit.log (every command and its output)
# and environment.txt. Exit status: 0 when every run exited 0, 1 otherwise.
set -uo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
cd "$ROOT"
# shellcheck source=scripts/unpack-stage.sh
. "$ROOT/scripts/unpack-stage.sh"
unpack_stage "$ROOT"
OUT="${1:?usage: scripts/toolkit-gpu.sh OUT_DIR}"
mkdir -p "$OUT"
OUT="$(cd "$OUT" && pwd)"
BIN="$ROOT/stage/bin"
[ -x "$BIN/pool" ] || { echo "toolkit-gpu: nothing staged; run scripts/stage-gpu.sh first" >&2; exit 2; }
{
    echo "date: $(date -u +%FT%TZ)"
    echo "commit: $(cat "$ROOT/stage/COMMIT")"
    nvidia-smi --query-gpu=name,driver_version,compute_mode,clocks.sm,clocks.mem --format=csv 2>&1
} >"$OUT/environment.txt"
FAILED=0

# run MPS BACKEND WHAT CMD...: runs CMD, logs it, appends its last JSON line (tagged) to toolkit.jsonl.
run() {
    local mps="$1" backend="$2" what="$3"
    shift 3
    echo "+ [$mps] $*" >>"$OUT/toolkit.log"
    local out rc
    out="$(timeout 300 "$@" 2>>"$OUT/toolkit.log")"
    rc=$?
    echo "$out" >>"$OUT/toolkit.log"
    echo "  exit $rc" >>"$OUT/toolkit.log"
    [ $rc -eq 0 ] || { FAILED=1; echo "toolkit-gpu: FAILED [$mps] $*" >&2; }
    local line
    line="$(echo "$out" | grep '^{' | tail -n 1)"
    [ -n "$line" ] || line='{}'
    python3 - "$mps" "$backend" "$what" "$rc" "$line" >>"$OUT/toolkit.jsonl" <<'PY'
import json, sys
mps, backend, what, rc, line = sys.argv[1:6]
try:
    row = json.loads(line)
except ValueError:
    row = {"unparsed": line}
if not isinstance(row, dict):
    row = {"value": row}
row.update({"mps": mps, "backend": backend, "what": what, "exit": int(rc)})
print(json.dumps(row))
PY
}

pass() {
    local mps="$1"
    for backend in legacy vmm; do
        for mib in 1024 16384; do
            run "$mps" "$backend" "pool-attach-${mib}MiB" \
                "$BIN/pool" bench --backend "$backend" --capacity-mib "$mib" --buffers 64 --attaches 20 --json
        done
        run "$mps" "$backend" semaphore-round-trip "$BIN/semaphore" bench --backend "$backend" --rounds 10000 --json
        # The work queue: tasks per second with kernels popping, one process on its own queue, then 1 and 4 worker
        # processes (every run checked task by task; docs/work-queue.md).
        [ -x "$BIN/work_queue" ] && run "$mps" "$backend" work-queue "$BIN/work_queue" bench --backend "$backend" --json
    done
    # The pipeline rows: one bench run (its own JSON document and table), the machine as this pass left it.
    local bench=("$BIN/gpu-ipc" bench pipeline --rows 'three-stage,-s4-c1' --no-progress
        --out "$OUT/pipeline-$mps.json" --markdown "$OUT/pipeline-$mps.md")
    echo "+ [$mps] ${bench[*]}" >>"$OUT/toolkit.log"
    timeout 600 "${bench[@]}" >>"$OUT/toolkit.log" 2>&1 || { FAILED=1; echo "toolkit-gpu: FAILED [$mps] ${bench[*]}" >&2; }
}

# GPU_IPC_TOOLKIT_PASSES picks the passes ("no-mps mps" by default), for machines that limit one command's time.
PASSES="${GPU_IPC_TOOLKIT_PASSES:-no-mps mps}"
if [[ " $PASSES " == *" no-mps "* ]]; then
    echo "toolkit-gpu: without MPS" >&2
    pass no-mps
fi
# shellcheck source=scripts/mps.sh
. "$ROOT/scripts/mps.sh"
if [[ " $PASSES " != *" mps "* ]]; then
    :
elif mps_start; then
    echo "toolkit-gpu: under a private MPS daemon" >&2
    pass mps
    mps_stop "$OUT/mps-log"
else
    echo "toolkit-gpu: MPS pass skipped: $MPS_REASON" | tee -a "$OUT/toolkit.log" >&2
    mps_stop
fi
exit $FAILED
