#!/usr/bin/env bash
# The device-side ring as its own bench rows (issue 32, "the last step under MPS") on a GPU machine, from what
# scripts/stage-gpu.sh staged (no Rust needed there):
#   scripts/resident-rows-gpu.sh OUT_DIR
# 1. the GPU tests of the grid persistent kernels (bench/src/resident/gpu_tests.rs: 500 4K frames through a 4-slot ring
#    with both sides grid kernels in one process, every word checked and every frame timed; the grid consumer counting
#    every word of frames with the wrong pattern; a grid consumer whose frames never come leaving every block after its
#    timeout) from the staged nextest archive, a few seconds;
# 2. `gpu-ipc bench pipeline --mps` on the resident rows (resident-<backend>-s2/-s4/-s8, both sides grid kernels;
#    resident-<backend>-s4-one-block, the one-block kernels), their references (single-process-pipelined-s2/4/8 among
#    them), the frame graphs of the vmm backend (kernel waits and stream-op waits) and the vmm rings frame by frame
#    (ipc-event, gpu-stream-ops; 4 and 8 slots), $RESIDENT_FRAMES frames a row (default 2000); RESIDENT_ROWS replaces
#    the row filter; the Markdown ends with the resident rows against the pipelined reference at equal depth;
# 3. the same rows without MPS (the graph rows with stream-op waits run; the resident rows and kernel waits must say
#    "unavailable" with the reason).
# Not yet timed: about 3-4 minutes (2: about 20 rows of a few seconds each; 3: the references and the reasons).
# OUT_DIR receives environment.txt, tests.log, mps/ and no-mps/ (bench.json, bench.md, bench.log). Exit status: 0 when
# the tests passed and both passes ran, 1 otherwise, 2 when nothing is staged.
set -uo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
cd "$ROOT"
# shellcheck source=scripts/unpack-stage.sh
. "$ROOT/scripts/unpack-stage.sh"
unpack_stage "$ROOT"
OUT="${1:?usage: scripts/resident-rows-gpu.sh OUT_DIR}"
mkdir -p "$OUT"
OUT="$(cd "$OUT" && pwd)"
STAGE="$ROOT/stage"
[ -x "$STAGE/bin/cargo-nextest" ] && [ -x "$STAGE/bin/gpu-ipc" ] ||
    { echo "resident-rows-gpu: nothing staged; run scripts/stage-gpu.sh first" >&2; exit 2; }
FRAMES="${RESIDENT_FRAMES:-2000}"
{
    echo "date: $(date -u +%FT%TZ)"
    echo "commit: $(cat "$STAGE/COMMIT")"
    echo "frames per row: $FRAMES"
    nvidia-smi --query-gpu=name,driver_version,compute_cap,memory.total --format=csv 2>&1
} >"$OUT/environment.txt"

echo "resident-rows-gpu: [1/3] the grid persistent kernels' GPU tests" >&2
"$STAGE/bin/cargo-nextest" nextest run --archive-file "$STAGE/gpu-tests.tar.zst" --workspace-remap . --profile gpu \
    --run-ignored all -E 'package(gpu-ipc-bench) & test(/resident::gpu_tests::/)' --no-capture 2>&1 | tee "$OUT/tests.log"
TESTS_RC=${PIPESTATUS[0]}

ROWS="${RESIDENT_ROWS:-resident,graphs-vmm,ours-vmm-ipc-event-s4-c1,ours-vmm-ipc-event-s8-c1,ours-vmm-gpu-stream-ops-s4-c1,ours-vmm-gpu-stream-ops-s8-c1}"
BENCH_RC=0
for pass in mps no-mps; do
    echo "resident-rows-gpu: [$([ "$pass" = mps ] && echo 2 || echo 3)/3] gpu-ipc bench pipeline, $pass" >&2
    mkdir -p "$OUT/$pass"
    flags=()
    [ "$pass" = mps ] && flags=(--mps)
    "$STAGE/bin/gpu-ipc" bench pipeline --rows "$ROWS" --frames "$FRAMES" --json --out "$OUT/$pass/bench.json" \
        --markdown "$OUT/$pass/bench.md" "${flags[@]}" 2>&1 | tee "$OUT/$pass/bench.log"
    rc=${PIPESTATUS[0]}
    [ "$rc" -eq 0 ] || BENCH_RC=1
done

echo "resident-rows-gpu: tests exit $TESTS_RC, bench exit $BENCH_RC; results in $OUT" >&2
[ "$TESTS_RC" -eq 0 ] && [ "$BENCH_RC" -eq 0 ]
