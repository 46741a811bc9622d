#!/usr/bin/env bash
# The Python package on a GPU machine, from what scripts/stage-gpu.sh staged (the wheel in stage/wheels, the Rust
# examples in stage/bin.tar.xz; nothing is downloaded there):
#   scripts/python-gpu.sh OUT_DIR
# 1. a fresh venv made with --system-site-packages (so that it sees the machine's torch, CuPy, JAX), the staged
#    wheel installed with `pip install --no-index --no-deps`;
# 2. the README's Python quick start run as written (scripts/python_readme.py: its producer and consumer blocks of
#    python/README.md, two processes; every printed mean checked);
# 3. the rows (scripts/python_gpu.py, ends in scripts/python_gpu_ends.py): torch producer -> torch consumer for
#    legacy, vmm x cpu-spin, cpu-sleep, ipc-event, gpu-stream-ops at 3840x2160 RGB (4 slots); a Rust producer ->
#    torch consumer against a Rust producer -> Rust consumer in interleaved rounds (the torch consumer's FPS as a
#    fraction of the Rust consumer's; goal >= 0.9); a torch producer -> Rust consumer; CuPy and JAX consumers; a
#    semaphore between two processes (CPU posts -> stream waits, stream posts -> CPU waits); a tensor PyTorch
#    allocated itself shared by name and read in place by another process (gpu_ipc.share / gpu_ipc.open), with the
#    default caching allocator (legacy) and with expandable_segments:True (vmm); each
#    frame checked on the GPU against the Rust examples' pattern (0 mismatched words), the zero-copy checks, a tensor
#    of a frame read after its consumer closed, FPS and CPU time per frame of both ends;
#    then a freed shared tensor under PyTorch's caching allocator (scripts/python_gpu_pool_free.py, pool-free.log);
#    then tensors of 4 KiB to 1 GiB made with expandable_segments:True, some straddling PyTorch's allocations, shared
#    and read byte for byte by another process (scripts/python_gpu_expandable.py, expandable.{log,json});
#    a state_dict shared with gpu_ipc.weights, both backends (scripts/python_gpu_weights.py, weights.{log,json});
# 4. gpu-poll, both backends, under a private MPS daemon (scripts/mps.sh; recorded as skipped when none starts).
# Writes OUT_DIR/python-package.md (the table, with device, date and commit), python-package.json,
# python-package.rows.jsonl, python-package.log (every process's output), readme-example.{json,log} and readme/ (the
# code that ran). Exit status: 0 every row ok (skipped gpu-poll rows aside), the comparison measured and the README
# example right; 1 otherwise; 2 nothing staged, no python3, or no venv.
set -uo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
cd "$ROOT"
# shellcheck source=scripts/unpack-stage.sh
. "$ROOT/scripts/unpack-stage.sh"
# shellcheck source=scripts/mps.sh
. "$ROOT/scripts/mps.sh"
OUT="${1:?usage: scripts/python-gpu.sh OUT_DIR}"
mkdir -p "$OUT"
OUT="$(cd "$OUT" && pwd)"
PYTHON="${PYTHON:-python3}"
command -v "$PYTHON" >/dev/null || { echo "python-gpu: $PYTHON not found" >&2; exit 2; }
WHEEL="$(ls stage/wheels/gpu_ipc-*.whl 2>/dev/null | head -n1)"
[ -n "$WHEEL" ] || { echo "python-gpu: no stage/wheels/gpu_ipc-*.whl; run scripts/stage-gpu.sh first" >&2; exit 2; }
unpack_stage "$ROOT"
export GPU_IPC_EXAMPLES_DIR="${GPU_IPC_EXAMPLES_DIR:-$ROOT/stage/bin}"
rm -f "$OUT"/python-package.* "$OUT"/readme-example.*

WORK="$(mktemp -d /tmp/gpu-ipc-pygpu-XXXXXX)"
trap 'mps_stop; rm -rf "$WORK"' EXIT
PYTHON="$PYTHON" wheel_venv "$WORK/venv" "$WHEEL" || exit 2
VPY="$WORK/venv/bin/python"
echo "python-gpu: $(basename "$WHEEL") in $WORK/venv; results in $OUT" >&2

echo "python-gpu: the README's quick start, as written (python/README.md)" >&2
"$VPY" scripts/python_readme.py python/README.md "$OUT"
README_RC=$?

echo "python-gpu: a freed shared tensor under PyTorch's caching allocator (scripts/python_gpu_pool_free.py)" >&2
"$VPY" scripts/python_gpu_pool_free.py --backend both 2>&1 | tee "$OUT/pool-free.log"
POOL_FREE_RC=${PIPESTATUS[0]}

echo "python-gpu: expandable segments, tensors over several allocations (scripts/python_gpu_expandable.py)" >&2
"$VPY" scripts/python_gpu_expandable.py --json "$OUT/expandable.json" 2>&1 | tee "$OUT/expandable.log"
EXPANDABLE_RC=${PIPESTATUS[0]}

echo "python-gpu: a state_dict published and read by another process (scripts/python_gpu_weights.py)" >&2
"$VPY" scripts/python_gpu_weights.py --backend both --json "$OUT/weights.json" 2>&1 | tee "$OUT/weights.log"
WEIGHTS_RC=${PIPESTATUS[0]}

echo "python-gpu: the rows (no MPS)" >&2
"$VPY" scripts/python_gpu.py run "$OUT" --set main

echo "python-gpu: gpu-poll under a private MPS daemon" >&2
if mps_start; then
    "$VPY" scripts/python_gpu.py run "$OUT" --set mps
    mps_stop "$OUT/mps-log"
else
    "$VPY" scripts/python_gpu.py skip "$OUT" --set mps --reason "no MPS daemon: $MPS_REASON"
fi

"$VPY" scripts/python_gpu.py report "$OUT"
REPORT_RC=$?
[ "$README_RC" -eq 0 ] || echo "python-gpu: the README's quick start did not run as written (exit $README_RC): $OUT/readme-example.log" >&2
[ "$WEIGHTS_RC" -eq 0 ] || echo "python-gpu: the weights check failed (exit $WEIGHTS_RC): $OUT/weights.log" >&2
[ "$POOL_FREE_RC" -eq 0 ] || echo "python-gpu: the freed-tensor check failed (exit $POOL_FREE_RC): $OUT/pool-free.log" >&2
[ "$EXPANDABLE_RC" -eq 0 ] || echo "python-gpu: the expandable-segments check failed (exit $EXPANDABLE_RC): $OUT/expandable.log" >&2
[ "$REPORT_RC" -eq 0 ] && [ "$README_RC" -eq 0 ] && [ "$POOL_FREE_RC" -eq 0 ] && [ "$EXPANDABLE_RC" -eq 0 ] && [ "$WEIGHTS_RC" -eq 0 ]
