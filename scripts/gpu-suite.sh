#!/usr/bin/env bash
# Runs the whole GPU suite from what scripts/stage-gpu.sh staged, on a machine with an NVIDIA GPU and no Rust.
#   scripts/gpu-suite.sh OUT_DIR
# 1. every test of the workspace, GPU tests and the tests ignored "needs root" included (time-sliced GPU: no MPS),
#    less the tests that need MPS (those of `under_mps` modules, ignored "needs a CUDA GPU with MPS running"). Run it
#    as root, as the GPU machine does: a "needs root" test run without root fails, saying so;
# 2. the tests that need MPS (`under_mps::*`: gpu-poll and persistent kernels between processes, frame graphs), with
#    the frame-throughput test, examples/tests/gpu_stamp.rs and examples/tests/gpu_device_producer.rs again, under a
#    private MPS daemon (started here, stopped here); a test of `under_mps` that finds no MPS fails, never passes;
# 3. gpu-ipc doctor (text and --json);
# 4. the research probes, a quick pass of each without and under a private MPS daemon (`gpu-ipc report --quick`,
#    about 5 minutes; GPU_IPC_SKIP_PROBES=1 skips it, which summary.json then says). The full report is
#    scripts/probes-gpu.sh.
# 5. a consumer written in Python from the docs alone (scripts/python-gpu-consumer.sh: cuda-bindings + CuPy, legacy
#    and vmm x cpu-spin, cpu-sleep, ipc-event, about 30 s) into OUT_DIR/python-gpu/; GPU_IPC_SKIP_PYTHON=1 skips it;
# 6. the stress run (`gpu-ipc-stress all`, the development tool staged beside gpu-ipc: hostile clients, a PID-namespace consumer, the random-kill matrix without
#    and under MPS, attach/detach cycles, eviction; about 9 minutes, `--quick` about 3) into OUT_DIR/stress/
#    (stress.json, stress.md). GPU_IPC_SKIP_STRESS=1 skips it; GPU_IPC_STRESS_ARGS adds options (e.g. "--quick",
#    "--only kills,cycles"). GPU_IPC_ALLOW_NO_MPS=1 lets its MPS pass be "not run" instead of failed.
# The tests find the files they read (docs/, ipc-core/tests/python/, testdata) at run time through CARGO_MANIFEST_DIR,
# which nextest sets to this tree (`--workspace-remap .`): the project may sit at any path here, whatever the path it
# was built at.
# OUT_DIR receives: summary.json, doctor.txt, python-gpu/ (step 5), frames.md (throughput table), answers-quick/ (the quick report:
# README.md, plots/, raw/) with answers-quick.txt (its four answers), and results.tgz (environment.txt,
# tests.log, junit.xml, tests-mps.log, doctor.json, frames-*.jsonl, pool-*.jsonl, mps logs).
# Exit status: 0 when the tests, the MPS pass, the doctor, the probes, the Python consumer and the stress run pass, 1 otherwise (a skipped MPS pass is a failure
# unless GPU_IPC_ALLOW_NO_MPS=1; summary.json says "mps": "skipped" and why either way).
set -uo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
cd "$ROOT"
# shellcheck source=scripts/unpack-stage.sh
. "$ROOT/scripts/unpack-stage.sh"
unpack_stage "$ROOT"
OUT="${1:?usage: scripts/gpu-suite.sh OUT_DIR}"
mkdir -p "$OUT"
OUT="$(cd "$OUT" && pwd)"
WORK="$OUT/results"
mkdir -p "$WORK"
STAGE="$ROOT/stage"
[ -x "$STAGE/bin/cargo-nextest" ] || { echo "gpu-suite: nothing staged; run scripts/stage-gpu.sh first" >&2; exit 2; }
NEXTEST=("$STAGE/bin/cargo-nextest" nextest run --archive-file "$STAGE/gpu-tests.tar.zst" --workspace-remap . --profile gpu)
export GPU_IPC_RESULTS_DIR="$WORK"
START=$(date +%s)

{
    echo "date: $(date -u +%FT%TZ)"
    echo "commit: $(cat "$STAGE/COMMIT")"
    echo "host: $(uname -a)"
    nvidia-smi --query-gpu=name,uuid,driver_version,compute_cap,memory.total,compute_mode,clocks.sm,clocks.mem \
        --format=csv 2>&1
    nvidia-smi 2>&1
} >"$WORK/environment.txt"

# The tests that need MPS: every test of an `under_mps` module (each fails where MPS does not run).
MPS_TESTS='test(/^under_mps::/)'
# The tests that need two GPUs (`two_gpus` modules, ignored "needs two CUDA GPUs"): run where there are two, else
# left out and said so (summary.json: "two_gpu_tests").
GPUS=$(nvidia-smi --list-gpus 2>/dev/null | grep -c '^GPU')
if [ "$GPUS" -ge 2 ]; then
    TWO_GPU_FILTER=''
    TWO_GPU_TESTS="run ($GPUS GPUs)"
else
    TWO_GPU_FILTER=' & not test(/^two_gpus::/)'
    TWO_GPU_TESTS="not run: $GPUS GPU(s) here; they need two"
    echo "gpu-suite: $TWO_GPU_TESTS (the two_gpus:: tests are left out)" >&2
fi
[ "$(id -u)" = 0 ] || echo "gpu-suite: not root: the tests ignored \"needs root\" will fail in step 1" >&2

echo "gpu-suite: [1/6] all tests, GPU tests included (no MPS; the tests that need MPS come in step 2)" >&2
# The child-process entry points are ignored tests that the cross-process tests run; on their own they do nothing.
GPU_IPC_RESULTS_TAG=no-mps "${NEXTEST[@]}" --run-ignored all -E "not test(child_process_entry_point) & not ($MPS_TESTS)$TWO_GPU_FILTER" 2>&1 |
    tee "$WORK/tests.log"
TESTS_RC=${PIPESTATUS[0]}
JUNIT=$(find "$ROOT/target" -path '*nextest/gpu/junit.xml' 2>/dev/null | head -1)
[ -n "$JUNIT" ] && cp "$JUNIT" "$WORK/junit.xml"

echo "gpu-suite: [2/6] the tests that need MPS (under_mps::*), frame throughput, gpu_stamp and gpu_device_producer under a private MPS daemon" >&2
# MPS_STATUS: passed | failed | skipped (no nvidia-cuda-mps-control, or the daemon would not start). A skipped MPS
# pass is reported as skipped in summary.json and in the table, and fails the suite unless GPU_IPC_ALLOW_NO_MPS=1.
MPS_RC=0
MPS_STATUS=skipped
MPS_REASON=""
# shellcheck source=scripts/mps.sh
. "$ROOT/scripts/mps.sh"
if mps_start; then
    GPU_IPC_RESULTS_TAG=mps "${NEXTEST[@]}" --run-ignored only \
        -E "$MPS_TESTS | test(every_backend_and_strategy_moves_10000_verified_4k_frames_to_two_consumers) | binary(gpu_stamp) | binary(gpu_device_producer)" 2>&1 |
        tee "$WORK/tests-mps.log"
    MPS_RC=${PIPESTATUS[0]}
    if [ "$MPS_RC" -eq 0 ]; then MPS_STATUS=passed; else MPS_STATUS=failed; fi
fi
mps_stop "$WORK/mps-log"
if [ "$MPS_STATUS" = skipped ]; then
    echo "gpu-suite: MPS pass SKIPPED: $MPS_REASON" | tee "$WORK/tests-mps.log" >&2
    [ "${GPU_IPC_ALLOW_NO_MPS:-0}" = 1 ] || MPS_RC=1
fi

echo "gpu-suite: [3/6] gpu-ipc doctor" >&2
"$STAGE/bin/gpu-ipc" doctor 2>&1 | tee "$OUT/doctor.txt"
DOCTOR_RC=${PIPESTATUS[0]}
"$STAGE/bin/gpu-ipc" doctor --json >"$WORK/doctor.json" 2>"$WORK/doctor-json.stderr"

PROBES_STATUS=skipped
PROBES_RC=0
if [ "${GPU_IPC_SKIP_PROBES:-0}" != 1 ]; then
    echo "gpu-suite: [4/6] research probes, quick pass, without and with MPS (gpu-ipc report --quick)" >&2
    GPU_IPC_COMMIT="$(cat "$STAGE/COMMIT")" "$STAGE/bin/gpu-ipc" report --quick --timeout 240 --out "$OUT/answers-quick" \
        >"$OUT/answers-quick.txt" 2>"$WORK/report.log"
    PROBES_RC=$?
    if [ "$PROBES_RC" -eq 0 ]; then PROBES_STATUS=passed; else PROBES_STATUS=failed; fi
    cat "$OUT/answers-quick.txt"
fi

PYTHON_STATUS=skipped
PYTHON_RC=0
if [ "${GPU_IPC_SKIP_PYTHON:-0}" != 1 ]; then
    echo "gpu-suite: [5/6] a consumer in Python from the docs (scripts/python-gpu-consumer.sh)" >&2
    "$ROOT/scripts/python-gpu-consumer.sh" "$OUT/python-gpu" >"$WORK/python-gpu.txt" 2>&1
    PYTHON_RC=$?
    if [ "$PYTHON_RC" -eq 0 ]; then PYTHON_STATUS=passed; else PYTHON_STATUS=failed; fi
    cat "$OUT/python-gpu/python-gpu.md" 2>/dev/null || cat "$WORK/python-gpu.txt"
fi

STRESS_STATUS=skipped
STRESS_RC=0
if [ "${GPU_IPC_SKIP_STRESS:-0}" != 1 ]; then
    echo "gpu-suite: [6/6] stress: hostile clients, namespaces, kills (no MPS and MPS), cycles, eviction" >&2
    STRESS_OPTS=()
    [ "${GPU_IPC_ALLOW_NO_MPS:-0}" = 1 ] && STRESS_OPTS+=(--allow-no-mps)
    # shellcheck disable=SC2206 # word splitting of the extra options is wanted
    STRESS_OPTS+=(${GPU_IPC_STRESS_ARGS:-})
    "$STAGE/bin/gpu-ipc-stress" all --bin-dir "$STAGE/bin" --out "$OUT/stress" "${STRESS_OPTS[@]}" \
        >"$OUT/stress.txt" 2>"$WORK/stress.log"
    STRESS_RC=$?
    if [ "$STRESS_RC" -eq 0 ]; then STRESS_STATUS=passed; else STRESS_STATUS=failed; fi
    cat "$OUT/stress.txt"
fi

python3 "$ROOT/scripts/frames_table.py" "$WORK" --mps-status "$MPS_STATUS" --mps-reason "$MPS_REASON" >"$OUT/frames.md" 2>&1
cat "$OUT/frames.md"

END=$(date +%s)
cat >"$OUT/summary.json" <<JSON
{"commit": "$(cat "$STAGE/COMMIT")", "tests_exit": $TESTS_RC, "mps": "$MPS_STATUS", "mps_reason": "$MPS_REASON", "mps_tests_exit": $MPS_RC, "doctor_exit": $DOCTOR_RC, "probes": "$PROBES_STATUS", "probes_exit": $PROBES_RC, "python": "$PYTHON_STATUS", "python_exit": $PYTHON_RC, "stress": "$STRESS_STATUS", "stress_exit": $STRESS_RC, "two_gpu_tests": "$TWO_GPU_TESTS", "seconds": $((END - START))}
JSON
tar -C "$OUT" -czf "$OUT/results.tgz" results && rm -rf "$WORK"
cat "$OUT/summary.json"
[ "$TESTS_RC" -eq 0 ] && [ "$DOCTOR_RC" -eq 0 ] && [ "$MPS_RC" -eq 0 ] && [ "$PROBES_RC" -eq 0 ] && [ "$PYTHON_RC" -eq 0 ] && [ "$STRESS_RC" -eq 0 ]
