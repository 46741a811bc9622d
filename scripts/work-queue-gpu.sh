#!/usr/bin/env bash
# On the GPU machine, from what scripts/stage-gpu.sh staged: the work queue's tasks per second with kernels popping
# (`work_queue bench`: one process on its own queue, then 1 and 4 worker processes on the queue of another), for
# the legacy and vmm backends, without MPS and under a private MPS daemon (scripts/mps.sh).
#   scripts/work-queue-gpu.sh OUT_DIR [TASKS] [ROUNDS]   (TASKS per run, default 1000000; ROUNDS per pass, default 3)
# OUT_DIR receives work-queue.jsonl (one line per bench run: the pass, the backend, the round and its rows),
# work-queue.md (the table: median of the rounds) and the logs. Exit status: 0 when every run added up (each task
# completed exactly once, checked by the sums of the task values) and the MPS pass ran; 1 otherwise.
set -uo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
cd "$ROOT"
# shellcheck source=scripts/unpack-stage.sh
. "$ROOT/scripts/unpack-stage.sh"
unpack_stage "$ROOT"
OUT="${1:?usage: scripts/work-queue-gpu.sh OUT_DIR [TASKS] [ROUNDS]}"
TASKS="${2:-1000000}"
ROUNDS="${3:-3}"
mkdir -p "$OUT"
OUT="$(cd "$OUT" && pwd)"
BIN="$ROOT/stage/bin/work_queue"
[ -x "$BIN" ] || { echo "work-queue-gpu: $BIN not staged; run scripts/stage-gpu.sh first" >&2; exit 2; }
JSONL="$OUT/work-queue.jsonl"
: >"$JSONL"
RC=0

pass() { # tag
    local tag=$1 round backend
    for round in $(seq 1 "$ROUNDS"); do
        for backend in legacy vmm; do
            local log="$OUT/bench-$tag-$backend-$round"
            if "$BIN" bench --backend "$backend" --tasks "$TASKS" --workers 1,4 --json >"$log.json" 2>"$log.log"; then
                echo "work-queue-gpu: $tag $backend round $round done" >&2
            else
                echo "work-queue-gpu: $tag $backend round $round FAILED (see $log.log)" >&2
                RC=1
            fi
            python3 -c '
import json, sys
tag, backend, rnd, path = sys.argv[1:5]
try:
    summary = json.load(open(path))
except ValueError:
    summary = {"outcome": "no summary", "rows": []}
print(json.dumps({"pass": tag, "backend": backend, "round": int(rnd), "outcome": summary.get("outcome"),
                  "message": summary.get("message"), "rows": summary.get("rows", [])}))
' "$tag" "$backend" "$round" "$log.json" >>"$JSONL"
        done
    done
}

# shellcheck source=scripts/mps.sh
. "$ROOT/scripts/mps.sh"
pass no-mps
if mps_start; then
    pass mps
    mps_stop "$OUT/mps-log"
else
    echo "work-queue-gpu: MPS pass SKIPPED: $MPS_REASON" >&2
    echo "{\"pass\": \"mps\", \"outcome\": \"skipped\", \"message\": \"$MPS_REASON\", \"rows\": []}" >>"$JSONL"
    RC=1
fi

python3 - "$JSONL" "$TASKS" >"$OUT/work-queue.md" <<'PY'
import json, statistics, sys
runs = [json.loads(line) for line in open(sys.argv[1])]
tasks = sys.argv[2]
print(f"Work queue, kernels popping: {tasks} tasks of 16 bytes per run, median of the rounds (tasks per second from")
print("the first kernel's start to the last one's end, on the GPU's clock).")
print()
print("| pass | backend | mode | worker processes | tasks/s (median) | rounds | all added up |")
print("|---|---|---|---:|---:|---:|---|")
rows = {}
for run in runs:
    if run.get("outcome") == "skipped":
        print(f"| {run['pass']} | - | skipped: {run.get('message')} | | | | |")
        continue
    for row in run["rows"]:
        key = (run["pass"], run["backend"], row["mode"], row["workers"])
        rows.setdefault(key, []).append(row)
for (tag, backend, mode, workers), found in rows.items():
    rate = statistics.median(r["tasks_per_s"] for r in found)
    ok = all(r["ok"] for r in found)
    print(f"| {tag} | {backend} | {mode} | {workers} | {rate:,.0f} | {len(found)} | {'yes' if ok else 'NO'} |")
failed = [r for r in runs if r.get("outcome") not in ("done", "skipped")]
for run in failed:
    print(f"\nFAILED: {run['pass']} {run.get('backend')} round {run.get('round')}: {run.get('message')}")
PY
cat "$OUT/work-queue.md"
exit "$RC"
