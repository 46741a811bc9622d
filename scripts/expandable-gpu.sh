#!/usr/bin/env bash
# Sharing ranges over several allocations side by side (PyTorch's expandable segments) on a GPU machine, from what
# scripts/stage-gpu.sh staged (no Rust needed there):
#   scripts/expandable-gpu.sh OUT_DIR
# 1. the Rust GPU tests of it (examples/tests/gpu_pool.rs: a range over 12 vmm allocations side by side and ranges
#    straddling 2 and 3 of them, checked in place by another process; a range running into a private allocation and
#    a legacy range past its allocation refused with the reason; the single-allocation cases beside them), from the
#    staged nextest archive, about 30 s;
# 2. scripts/python_gpu_expandable.py in a venv with the staged wheel: torch tensors of 4 KiB to 1 GiB made with
#    expandable_segments:True, some straddling PyTorch's allocations, shared by name and read byte for byte by
#    another process, again after the owner freed them; about 1 minute, progress lines as it goes, every wait bounded
#    and the whole run at most 300 s (it then says which step it was in).
# OUT_DIR receives tests.log, expandable.log (the table), expandable.json and environment.txt. Exit status: 0 when
# both pass, 1 otherwise, 2 when nothing is staged.
set -uo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
cd "$ROOT"
# shellcheck source=scripts/unpack-stage.sh
. "$ROOT/scripts/unpack-stage.sh"
stage_preamble "$ROOT" expandable-gpu "${1:-}"

echo "expandable-gpu: [1/2] the Rust GPU tests (examples/tests/gpu_pool.rs)" >&2
FILTER='test(/side_by_side|shared_in_place|cannot_be_shared_in_place/)'
GPU_IPC_RESULTS_DIR="$OUT" "$STAGE/bin/cargo-nextest" nextest run --archive-file "$STAGE/gpu-tests.tar.zst" \
    --workspace-remap . --run-ignored all -E "$FILTER & not test(child_process_entry_point)" 2>&1 |
    tee "$OUT/tests.log"
TESTS_RC=${PIPESTATUS[0]}

echo "expandable-gpu: [2/2] torch tensors with expandable segments (scripts/python_gpu_expandable.py)" >&2
WORK="$(mktemp -d /tmp/gpu-ipc-expandable-XXXXXX)"
trap 'rm -rf "$WORK"' EXIT
if PYTHON="${PYTHON:-python3}" wheel_venv "$WORK/venv" "$WHEEL"; then
    "$WORK/venv/bin/python" -u scripts/python_gpu_expandable.py --json "$OUT/expandable.json" --timeout 300 2>&1 |
        tee "$OUT/expandable.log"
    PY_RC=${PIPESTATUS[0]}
else
    echo "expandable-gpu: no venv with the wheel" | tee "$OUT/expandable.log"
    PY_RC=2
fi

echo "expandable-gpu: tests exit $TESTS_RC, python_gpu_expandable.py exit $PY_RC; results in $OUT" >&2
[ "$TESTS_RC" -eq 0 ] && [ "$PY_RC" -eq 0 ]
