#!/usr/bin/env bash
# Frame graphs with and without MPS (issue 32, "frame graphs without MPS") on a GPU machine, from what
# scripts/stage-gpu.sh staged (no Rust needed there):
#   scripts/graphs-gpu.sh OUT_DIR
# 1. the driver's GPU test of batch memory operation nodes (gpu-ipc-driver's
#    a_graph_waits_on_its_mem_op_node_with_the_values_set_before_each_launch) from the staged nextest archive,
#    a few seconds;
# 2. `gpu-ipc bench pipeline` on the frame-graph rows, their references and the same rings call by call,
#    without MPS then under a private MPS daemon (`--mps`): the graph rows' names end with how they wait
#    (`-kernel-waits`: unavailable without MPS; `-stream-op-waits`: both passes); about 2 x 3 minutes (not yet timed).
# OUT_DIR receives tests.log, no-mps/ and mps/ (the bench's Markdown and JSON, bench.log), environment.txt. Exit
# status: 0 when the test passed and both passes ran, 1 otherwise, 2 when nothing is staged.
set -uo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
cd "$ROOT"
# shellcheck source=scripts/unpack-stage.sh
. "$ROOT/scripts/unpack-stage.sh"
unpack_stage "$ROOT"
OUT="${1:?usage: scripts/graphs-gpu.sh OUT_DIR}"
mkdir -p "$OUT"
OUT="$(cd "$OUT" && pwd)"
STAGE="$ROOT/stage"
[ -x "$STAGE/bin/cargo-nextest" ] && [ -x "$STAGE/bin/gpu-ipc" ] ||
    { echo "graphs-gpu: nothing staged; run scripts/stage-gpu.sh first" >&2; exit 2; }
{
    echo "date: $(date -u +%FT%TZ)"
    echo "commit: $(cat "$STAGE/COMMIT")"
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv 2>&1
} >"$OUT/environment.txt"

echo "graphs-gpu: [1/2] the driver's GPU test of batch memory operation nodes" >&2
"$STAGE/bin/cargo-nextest" nextest run --archive-file "$STAGE/gpu-tests.tar.zst" --workspace-remap . \
    --run-ignored all -E 'test(/mem_op_node/)' 2>&1 | tee "$OUT/tests.log"
TESTS_RC=${PIPESTATUS[0]}

ROWS="graphs,single-process-pipelined,ours-vmm-gpu-stream-ops-s4-c1,ours-vmm-gpu-stream-ops-s8-c1,ours-vmm-gpu-poll-s4-c1,ours-vmm-gpu-poll-s8-c1,ours-legacy-gpu-stream-ops-s4-c1,ours-legacy-gpu-stream-ops-s8-c1,ours-legacy-gpu-poll-s4-c1,ours-legacy-gpu-poll-s8-c1"
BENCH_RC=0
for pass in no-mps mps; do
    echo "graphs-gpu: [2/2] gpu-ipc bench pipeline, $pass" >&2
    mkdir -p "$OUT/$pass"
    flags=()
    [ "$pass" = mps ] && flags=(--mps)
    "$STAGE/bin/gpu-ipc" bench pipeline --rows "$ROWS" --json --out "$OUT/$pass/bench.json" --markdown "$OUT/$pass/bench.md" "${flags[@]}" 2>&1 |
        tee "$OUT/$pass/bench.log"
    rc=${PIPESTATUS[0]}
    [ "$rc" -eq 0 ] || BENCH_RC=1
done

echo "graphs-gpu: test exit $TESTS_RC, bench exit $BENCH_RC; results in $OUT" >&2
[ "$TESTS_RC" -eq 0 ] && [ "$BENCH_RC" -eq 0 ]
