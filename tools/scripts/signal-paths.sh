#!/usr/bin/env bash
# Builds tools/scripts/signal-paths.cu with nvcc and runs it on the GPU machine, without and under a private MPS daemon:
# the floor the CUDA driver gives for the handoffs gpu-ipc's strategies make (no gpu-ipc code involved).
#   tools/scripts/signal-paths.sh OUT_DIR [FRAMES] [rtk|pipe|pipek]
# OUT_DIR receives signal-paths.txt (every figure, "pass key value unit"), environment.txt and build.log.
# FRAMES: frames per `frames` run (default 3000). About 1-2 minutes in all. With `rtk`, only the round trips of
# persistent kernels (under MPS): what each per-frame step of the ring's device API costs (about 30 s). With `pipe`,
# only the stamped pipelines (`pipe`, without and under MPS): where a frame's time goes, events against stream
# memory operations, one process against two (about 1 minute); with `pipek`, only two processes under MPS, events,
# stream operations and polling kernels, three interleaved rounds (about 1 minute).
# Exit status: 0 every run ended (read the figures), 1 a run failed or timed out (the text says which), 2 no nvcc.
set -uo pipefail
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
OUT="${1:?usage: tools/scripts/signal-paths.sh OUT_DIR [FRAMES]}"
FRAMES="${2:-3000}"
ONLY="${3:-}"
mkdir -p "$OUT"
OUT="$(cd "$OUT" && pwd)"
NVCC="$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)"
[ -x "$NVCC" ] || { echo "signal-paths: nvcc not found" >&2; exit 2; }
BIN="$(mktemp -d)/signal-paths"
"$NVCC" -O2 -std=c++17 -arch=native -o "$BIN" "$ROOT/tools/scripts/signal-paths.cu" -lcuda >"$OUT/build.log" 2>&1 ||
    { cat "$OUT/build.log" >&2; exit 1; }
{
    echo "date: $(date -u +%FT%TZ)"
    echo "commit: ${GPU_IPC_COMMIT:-$(cat "$ROOT/stage/COMMIT" 2>/dev/null || git -C "$ROOT" rev-parse HEAD 2>/dev/null || echo unknown)}"
    nvidia-smi --query-gpu=name,driver_version,compute_mode,clocks.sm,clocks.mem --format=csv 2>&1
} >"$OUT/environment.txt"
TXT="$OUT/signal-paths.txt"
: >"$TXT"
FAILED=0

# one PASS ARGS...: one run, its lines prefixed with the pass.
one() {
    local pass="$1"
    shift
    echo "signal-paths: [$pass] $*" >&2
    local rc
    timeout 150 "$BIN" "$@" >"$OUT/run.tmp" 2>&1
    rc=$?
    sed "s/^/$pass /" "$OUT/run.tmp" | tee -a "$TXT"
    if [ "$rc" -ne 0 ]; then
        echo "$pass FAILED ($rc): $*" | tee -a "$TXT"
        FAILED=1
    fi
}

# every PASS: the runs of one pass; polling kernels only where both processes' kernels can run at once (MPS).
every() {
    local pass="$1"
    one "$pass" single 3000
    one "$pass" cpu 20000
    for mem in host dev; do
        for mech in ops batch1 ours ours-lite; do one "$pass" rt "$mem" "$mech" 5000; done
        for slots in 1 2 8 32; do one "$pass" frames "$mem" "$slots" "$FRAMES"; done
        for slots in 2 8; do one "$pass" frames "$mem" "$slots" "$FRAMES" 4; done
    done
}

# persistent PASS: round trips of two persistent kernels, the device API's per-frame steps added one at a time
# (signal-paths.cu, `rtk`); "fsrjwa" is every step gpu-ipc's kernels take, "osrjwa" the same with one fence.
persistent() {
    local pass="$1"
    for mem in host dev; do
        for steps in - f s r j w a fsrjwa osrjwa o; do one "$pass" rtk "$mem" "$steps" 20000; done
    done
    # Device words as gpu-ipc keeps them (counters polled in device memory, a copy of each store, the progress
    # words and the view of the records in host memory), one host-side step at a time.
    for steps in w wm ws wsp wc wv wmsp wmspc wmspv wmspcv wW wmspcvW g wg wmspcvg; do one "$pass" rtk dev "$steps" 20000; done
}

# pipes PASS: fill -> verify timelines, one process and two, events and stream memory operations.
pipes() {
    local pass="$1"
    for procs in 1 2; do
        for mech in event host dev khost kdev; do
            # Two processes' polling kernels run at once only under MPS.
            [ "$procs$pass" = 2no-mps ] && [ "${mech#k}" != "$mech" ] && continue
            for slots in 1 2 8; do one "$pass" pipe "$procs" "$mech" "$slots" "$FRAMES"; done
        done
    done
}

# pipek: two processes, the handoffs a frame ring can use on the GPU, three interleaved rounds (under MPS only).
pipek() {
    for round in 1 2 3; do
        for mech in event dev kdev kdevm khost; do
            for slots in 1 8; do one "mps-r$round" pipe 2 "$mech" "$slots" "$FRAMES"; done
        done
    done
}

case "$ONLY" in
rtk | pipek) ;;
pipe) pipes no-mps ;;
*) every no-mps ;;
esac
# shellcheck source=scripts/mps.sh
. "$ROOT/scripts/mps.sh"
if mps_start; then
    if [ "$ONLY" = pipe ] || [ "$ONLY" = pipek ]; then
        if [ "$ONLY" = pipe ]; then pipes mps; else pipek; fi
        mps_stop "$OUT/mps-log"
        rm -f "$OUT/run.tmp"
        exit "$FAILED"
    fi
    persistent mps
    if [ "$ONLY" = rtk ]; then
        mps_stop "$OUT/mps-log"
        rm -f "$OUT/run.tmp"
        exit "$FAILED"
    fi
    every mps
    # Last, each under a fresh daemon: a kill may break the server for every client.
    for mem in host dev; do
        for mech in stream kernel; do
            mps_stop
            mps_start && one mps killwait "$mem" "$mech"
        done
    done
else
    echo "mps SKIPPED: $MPS_REASON" | tee -a "$TXT"
    FAILED=1
fi
mps_stop "$OUT/mps-log"
rm -f "$OUT/run.tmp"
exit "$FAILED"
