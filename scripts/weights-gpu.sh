#!/usr/bin/env bash
# The weights' speed and correctness on a GPU machine, from what scripts/stage-gpu.sh staged (no Rust needed there):
#   scripts/weights-gpu.sh OUT_DIR
# 1. the gather kernel byte for byte (ipc-toolkit weights::copy::tests, every alignment, more pieces than one launch)
#    and the weight sets' Rust GPU tests (examples/tests/gpu_weights.rs, legacy and vmm, 291 and 19,000 tensors), from
#    the staged nextest archive (tests.log), about 30 s;
# 2. scripts/python_gpu_weights.py --backend both in a venv with the staged wheel: tensors(torch) and tensors('cupy')
#    against the per-tensor views, update from contiguous, non-contiguous and CPU sources, load_into keeping
#    data_ptrs, stage(torch)/commit, wrong tensors refused by update and bind, updates from sources bound once and
#    loads into targets bound once, the owner's close (weights-python.log, weights-python.json), about 30 s;
# 3. scripts/weights_bench.py run OUT_DIR/bench --backend both --container: Llama-3-8B's 291 and a 19,000-tensor MoE,
#    cold open (tensors(torch), per tensor, torch.multiprocessing, a bucket), the generation switch (update of the
#    state_dict, and of sources bound once, in parts) against one memcpy of the same bytes, memory given back after
#    each part, 1,000 mixed-generation switches, 10 owner kills with the reader on the host and 10 in a container
#    (bench/weights.md, bench/weights.jsonl, bench.log); 229 s on an H200 (2026-11-29);
# 4. scripts/python_gpu_expandable.py (torch tensors of 4 KiB to 1 GiB with expandable segments, shared and read
#    byte for byte by another process; expandable.log, expandable.json), progress lines as it goes, at most 300 s.
# OUT_DIR also receives environment.txt. Exit status: 0 when every step passed, 1 otherwise, 2 when nothing is
# staged. Each step is bounded by `timeout`.
set -uo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
cd "$ROOT"
# shellcheck source=scripts/unpack-stage.sh
. "$ROOT/scripts/unpack-stage.sh"
stage_preamble "$ROOT" weights-gpu "${1:-}"

echo "weights-gpu: [1/4] the gather kernel and the weight sets' Rust GPU tests" >&2
FILTER='test(/the_gather_copy_moves_every_byte|a_reader_process_verifies_every_generation/)'
GPU_IPC_RESULTS_DIR="$OUT" timeout 300 "$STAGE/bin/cargo-nextest" nextest run --archive-file "$STAGE/gpu-tests.tar.zst" \
    --workspace-remap . --run-ignored all -E "$FILTER & not test(child_process_entry_point)" 2>&1 | tee "$OUT/tests.log"
TESTS_RC=${PIPESTATUS[0]}

WORK="$(mktemp -d /tmp/gpu-ipc-weights-gpu-XXXXXX)"
trap 'rm -rf "$WORK"' EXIT
if ! PYTHON="${PYTHON:-python3}" wheel_venv "$WORK/venv" "$WHEEL"; then
    echo "weights-gpu: no venv with the wheel" >&2
    exit 1
fi
VPY="$WORK/venv/bin/python"

echo "weights-gpu: [2/4] scripts/python_gpu_weights.py --backend both" >&2
timeout 300 "$VPY" -u scripts/python_gpu_weights.py --backend both --json "$OUT/weights-python.json" 2>&1 |
    tee "$OUT/weights-python.log"
PY_RC=${PIPESTATUS[0]}

echo "weights-gpu: [3/4] scripts/weights_bench.py run $OUT/bench --backend both --container" >&2
START=$SECONDS
timeout 600 "$VPY" -u scripts/weights_bench.py run "$OUT/bench" --backend both --container 2>&1 | tee "$OUT/bench.log"
BENCH_RC=${PIPESTATUS[0]}
echo "weights-gpu: the benchmark took $((SECONDS - START)) s (exit $BENCH_RC)" | tee -a "$OUT/bench.log" >&2

echo "weights-gpu: [4/4] scripts/python_gpu_expandable.py" >&2
timeout 330 "$VPY" -u scripts/python_gpu_expandable.py --json "$OUT/expandable.json" --timeout 300 2>&1 |
    tee "$OUT/expandable.log"
EXP_RC=${PIPESTATUS[0]}

echo "weights-gpu: tests exit $TESTS_RC, python_gpu_weights.py exit $PY_RC, weights_bench.py exit $BENCH_RC," \
    "python_gpu_expandable.py exit $EXP_RC; results in $OUT" >&2
[ "$TESTS_RC" -eq 0 ] && [ "$PY_RC" -eq 0 ] && [ "$BENCH_RC" -eq 0 ] && [ "$EXP_RC" -eq 0 ]
