#!/usr/bin/env bash
# The GPU-resident path on a GPU machine (issue 33's move of kernels and frame graphs into ipc_core::resident, the
# generated ring layout, the one tree of kernel images; issue 30's kernel lease), from what scripts/stage-gpu.sh
# staged (no Rust needed there):
#   scripts/resident-gpu.sh OUT_DIR
# 1. without MPS (from the staged nextest archive): the kernel lease in one process
#    (examples/tests/gpu_kernel_lease.rs: a 1 ms lease orphans a waiting persistent consumer and producer, the
#    default lease keeps a 600 ms wait alive, an evicted consumer's kernel leaves on the producer's word and waits
#    out its timeout with the lease off), the run-ahead marks, and the kernels crate's images on this device;
# 2. under a private MPS daemon: the persistent-kernel, frame-graph, stamp and gpu-poll tests (`under_mps::*` of
#    gpu_device_producer, gpu_stamp, gpu_poll), which run the regenerated ring kernels, then, last, the two kill
#    tests of gpu_kernel_lease (a SIGKILLed persistent producer / consumer: survivor's typed outcome, this process's
#    GPU work unharmed);
# 3. `gpu-ipc-stress mps-kills --mps on --backend vmm --trials N` (N = $RESIDENT_TRIALS, default 3): every kind of
#    kernel killed under MPS with the kernel lease on and, for persistent kernels and frame graphs, off, beside a
#    bystander pair; its own private MPS daemon, restarted after a fault. The rates are the table of
#    OUT_DIR/stress/stress.md ("Kills while a kernel waits on shared memory").
# Not yet timed: about 4-5 minutes with N = 3 (10 cells x 3 trials of about 5 s, the tests about a minute).
# OUT_DIR receives environment.txt, tests.log, tests-mps.log, tests-mps-kills.log, stress/ (stress.json, stress.md,
# the MPS logs). Exit status: 0 when every test passed and the stress run passed (a fault under MPS is a "finding",
# not a failure: read the rates), 1 otherwise, 2 when nothing is staged.
set -uo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
cd "$ROOT"
# shellcheck source=scripts/unpack-stage.sh
. "$ROOT/scripts/unpack-stage.sh"
unpack_stage "$ROOT"
OUT="${1:?usage: scripts/resident-gpu.sh OUT_DIR}"
mkdir -p "$OUT"
OUT="$(cd "$OUT" && pwd)"
STAGE="$ROOT/stage"
[ -x "$STAGE/bin/cargo-nextest" ] && [ -x "$STAGE/bin/gpu-ipc-stress" ] ||
    { echo "resident-gpu: nothing staged; run scripts/stage-gpu.sh first" >&2; exit 2; }
NEXTEST=("$STAGE/bin/cargo-nextest" nextest run --archive-file "$STAGE/gpu-tests.tar.zst" --workspace-remap . --profile gpu)
TRIALS="${RESIDENT_TRIALS:-3}"
{
    echo "date: $(date -u +%FT%TZ)"
    echo "commit: $(cat "$STAGE/COMMIT")"
    nvidia-smi --query-gpu=name,driver_version,compute_cap,memory.total --format=csv 2>&1
} >"$OUT/environment.txt"

echo "resident-gpu: [1/3] the kernel lease in one process, run-ahead marks, the kernels' images (no MPS)" >&2
"${NEXTEST[@]}" --run-ignored all -E \
    '(binary(gpu_kernel_lease) & not test(/^under_mps::/)) | test(/the_stream_reports_its_marks/) | (package(gpu-ipc-kernels) & binary(gpu_kernels))' \
    2>&1 | tee "$OUT/tests.log"
TESTS_RC=${PIPESTATUS[0]}

# shellcheck source=scripts/mps.sh
. "$ROOT/scripts/mps.sh"
MPS_RC=1
KILLS_RC=1
echo "resident-gpu: [2/3] persistent kernels, frame graphs, stamps and gpu-poll under a private MPS daemon" >&2
if mps_start; then
    "${NEXTEST[@]}" --run-ignored only -E \
        'test(/^under_mps::/) & (binary(gpu_device_producer) | binary(gpu_stamp) | binary(gpu_poll))' \
        2>&1 | tee "$OUT/tests-mps.log"
    MPS_RC=${PIPESTATUS[0]}
    # Last: a kill that faulted the MPS server would take the clients of the tests after it with it.
    "${NEXTEST[@]}" --run-ignored only -E 'binary(gpu_kernel_lease) & test(/^under_mps::/)' \
        2>&1 | tee "$OUT/tests-mps-kills.log"
    KILLS_RC=${PIPESTATUS[0]}
    mps_stop "$OUT/mps-log"
else
    echo "resident-gpu: no MPS: $MPS_REASON" | tee "$OUT/tests-mps.log" >&2
fi

echo "resident-gpu: [3/3] gpu-ipc-stress mps-kills, kernel lease on and off, $TRIALS trials per cell" >&2
"$STAGE/bin/gpu-ipc-stress" mps-kills --mps on --backend vmm --trials "$TRIALS" --kernel-lease both \
    --out "$OUT/stress" 2>&1 | tee "$OUT/stress.log"
STRESS_RC=${PIPESTATUS[0]}

echo "resident-gpu: tests $TESTS_RC, MPS tests $MPS_RC, kill tests $KILLS_RC, stress $STRESS_RC; results in $OUT" >&2
echo "resident-gpu: the fault rates, lease on against off: $OUT/stress/stress.md" >&2
[ "$TESTS_RC" -eq 0 ] && [ "$MPS_RC" -eq 0 ] && [ "$KILLS_RC" -eq 0 ] && [ "$STRESS_RC" -eq 0 ]
