#!/usr/bin/env bash
# Builds everything the GPU machine runs and stages it, stripped, in stage/ (ignored by git):
#   stage/gpu-tests.tar.zst   a nextest archive of every test binary of the workspace (profile `gpu`, zstd -19; only the
#                             packages named in GPU_IPC_STAGE_PACKAGES when it is set, e.g. "gpu-ipc-examples ipc-core")
#   stage/bin/cargo-nextest   the standalone nextest runner (the GPU machine has no Rust toolchain)
#   stage/bin/gpu-ipc         the CLI; stage/bin/gpu-ipc-stress: the stress run (tools/stress);
#                             stage/bin/producer, consumer, pipeline, semaphore, pool, work_queue, consumer_overhead: the examples
#                             (when built)
#   stage/wheels/             the Python package's wheel (scripts/build-wheel.sh; scripts/python-gpu.sh installs it)
#   stage/benches.tar.xz      the criterion benches gpu_memory, gpu_signal, api_cpu and bench-summary (xz: 12 MB of
#                             binaries in under 2 MB; stage/ has little room), which scripts/bench-gpu.sh OUT_DIR runs
#   stage/nixl.tar.xz         with --nixl only: NIXL's Python package for the GPU machine's CPython (NIXL_PYVER,
#                             default 3.12), reduced to its UCX backend (scripts/fetch-nixl.sh pack; about 9 MB),
#                             which scripts/bridge-gpu.sh OUT_DIR unpacks onto PYTHONPATH
# Then, on the GPU machine, from the project root: scripts/gpu-suite.sh OUT_DIR  (see docs/gpu-testing.md).
#
#   scripts/stage-gpu.sh --bridge   stages only what scripts/bridge-gpu.sh needs, in its own folder stage-bridge/
#                                   (ignored by git; the device tool carries it alone: carry ["stage-bridge"]):
#                                   stage-bridge/wheels/ (the wheel, release), stage-bridge/nixl.tar.xz (NIXL for
#                                   CPython NIXL_PYVER, default 3.12), stage-bridge/COMMIT. No Rust binary: the
#                                   bridge's harness runs Python ends only. About 15 MB; stage/ is left alone.
# The project may sit at any path there: the tests find the files they read (docs/, ipc-core/tests/python/, testdata)
# at run time through CARGO_MANIFEST_DIR, which `cargo-nextest nextest run --archive-file ... --workspace-remap .` sets
# to the tree it runs in. A test binary run by hand from the archive needs CARGO_MANIFEST_DIR=TREE/<its package dir>.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
cd "$ROOT"
WITH_NIXL=0
if [ "${1:-}" = "--nixl" ]; then
    WITH_NIXL=1
fi
if [ "${1:-}" = "--bridge" ]; then
    BRIDGE_STAGE="$ROOT/stage-bridge"
    rm -rf "$BRIDGE_STAGE"
    mkdir -p "$BRIDGE_STAGE"
    echo "stage-gpu: the bridge only, in stage-bridge/: the Python wheel (scripts/build-wheel.sh)" >&2
    scripts/build-wheel.sh "$BRIDGE_STAGE/wheels" >/dev/null
    echo "stage-gpu: NIXL for the bridge (scripts/fetch-nixl.sh pack)" >&2
    scripts/fetch-nixl.sh pack "$BRIDGE_STAGE/nixl.tar.xz" "${NIXL_PYVER:-3.12}"
    git rev-parse HEAD >"$BRIDGE_STAGE/COMMIT" 2>/dev/null || echo unknown >"$BRIDGE_STAGE/COMMIT"
    STAGE_KIB=$(du -sk "$BRIDGE_STAGE" | cut -f1)
    TREE_KIB=$(git ls-files -z 2>/dev/null | du -ck --files0-from=- 2>/dev/null | tail -1 | cut -f1)
    TREE_KIB=${TREE_KIB:-0}
    ls -la "$BRIDGE_STAGE" "$BRIDGE_STAGE/wheels" >&2
    echo "stage-gpu: stage-bridge/ $(( STAGE_KIB / 1024 )) MiB + tracked tree $(( TREE_KIB / 1024 )) MiB" >&2
    if [ $(( STAGE_KIB + TREE_KIB )) -gt $(( 63 * 1024 )) ]; then
        echo "stage-gpu: stage-bridge/ plus the working tree is over 63 MiB (the device tool carries 64 MiB)" >&2
        exit 1
    fi
    exit 0
fi
STAGE="$ROOT/stage"
rm -rf "$STAGE"
mkdir -p "$STAGE/bin"

echo "stage-gpu: building the test archive (profile gpu)" >&2
# GPU_IPC_STAGE_PACKAGES="pkg ..." archives only those packages' tests (a smaller stage when the tree has grown and
# only some GPU tests are to run: the archive of every package is about 15 MB once recompressed below, 45 MB without zstd).
ARCHIVE_SCOPE=(--workspace)
if [ -n "${GPU_IPC_STAGE_PACKAGES:-}" ]; then
    ARCHIVE_SCOPE=()
    for package in $GPU_IPC_STAGE_PACKAGES; do ARCHIVE_SCOPE+=(-p "$package"); done
    echo "stage-gpu: the test archive holds only: $GPU_IPC_STAGE_PACKAGES" >&2
fi
cargo nextest archive "${ARCHIVE_SCOPE[@]}" --cargo-profile gpu --archive-file "$STAGE/gpu-tests.tar.zst" >&2
# nextest writes the archive at a fast zstd level (about 45 MB for the workspace); at level 19 with a 128 MiB window
# (--long=27, the most a zstd reader accepts without being told) it is about a third of that, which leaves the stage
# and the tree under what travels. About 2 minutes on 2 cores; skipped where zstd is not installed.
if command -v zstd >/dev/null 2>&1; then
    echo "stage-gpu: recompressing the test archive (zstd -19 --long=27)" >&2
    zstd -dc "$STAGE/gpu-tests.tar.zst" | zstd -19 -T0 --long=27 -q -o "$STAGE/gpu-tests.tar.zst.19"
    mv "$STAGE/gpu-tests.tar.zst.19" "$STAGE/gpu-tests.tar.zst"
fi

echo "stage-gpu: building the binaries (profile gpu)" >&2
cargo build --profile gpu --workspace --bins >&2
for bin in gpu-ipc gpu-ipc-stress producer consumer pipeline cudarc_frames semaphore pool work_queue consumer_overhead; do
    if [ -f "target/gpu/$bin" ]; then
        cp "target/gpu/$bin" "$STAGE/bin/"
    fi
done
# The suite cannot run without these two (the examples are optional extras of some feature sets).
for bin in gpu-ipc gpu-ipc-stress; do
    [ -x "$STAGE/bin/$bin" ] || { echo "stage-gpu: $bin was not built" >&2; exit 1; }
done

echo "stage-gpu: building the criterion benches (profile gpu)" >&2
BENCH_DIR="$(mktemp -d)"
# Bench executables have hashed names under target/gpu/deps: take their paths from cargo's JSON messages.
cargo build --profile gpu -p gpu-ipc-benches --benches --message-format=json-render-diagnostics |
    python3 -c '
import json, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and "bench" in m["target"]["kind"] and m.get("executable") \
            and m["target"]["name"] in ("gpu_memory", "gpu_signal", "api_cpu"):
        print(m["target"]["name"] + "\t" + m["executable"])
' | while IFS=$'\t' read -r name exe; do cp "$exe" "$BENCH_DIR/$name"; done
cp target/gpu/bench-summary "$BENCH_DIR/"
for bench in gpu_memory gpu_signal api_cpu bench-summary; do
    [ -x "$BENCH_DIR/$bench" ] || { echo "stage-gpu: bench executable $bench was not built" >&2; exit 1; }
done
tar -C "$BENCH_DIR" -cJf "$STAGE/benches.tar.xz" .
rm -rf "$BENCH_DIR"

# The Python package's wheel (release), which scripts/python-gpu.sh installs there (no registry on that machine).
echo "stage-gpu: building the Python wheel (scripts/build-wheel.sh)" >&2
scripts/build-wheel.sh "$STAGE/wheels" >/dev/null

if [ "$WITH_NIXL" = 1 ]; then
    echo "stage-gpu: NIXL for the bridge (scripts/fetch-nixl.sh pack)" >&2
    scripts/fetch-nixl.sh pack "$STAGE/nixl.tar.xz" "${NIXL_PYVER:-3.12}"
fi

NEXTEST="$(command -v cargo-nextest)"
strip -o "$STAGE/bin/cargo-nextest" "$NEXTEST"
git rev-parse HEAD >"$STAGE/COMMIT" 2>/dev/null || echo unknown >"$STAGE/COMMIT"

# The binaries travel packed (xz: 36 MB in about 9): unpacked by scripts/unpack-stage.sh on the GPU machine.
tar -C "$STAGE/bin" -cJf "$STAGE/bin.tar.xz" .
rm -rf "$STAGE/bin"

TOTAL_KIB=$(du -sk "$STAGE" | cut -f1)
echo "stage-gpu: staged $(( TOTAL_KIB / 1024 )) MiB in stage/:" >&2
ls -la "$STAGE" >&2
tar -tvJf "$STAGE/bin.tar.xz" >&2
# What travels is the working tree and stage/ together, 64 MiB in all (the device tool's limit on carry).
TREE_KIB=$(git ls-files -z 2>/dev/null | du -ck --files0-from=- 2>/dev/null | tail -1 | cut -f1)
TREE_KIB=${TREE_KIB:-0}
echo "stage-gpu: stage/ $(( TOTAL_KIB / 1024 )) MiB + tracked tree $(( TREE_KIB / 1024 )) MiB" >&2
if [ $(( TOTAL_KIB + TREE_KIB )) -gt $(( 63 * 1024 )) ]; then
    echo "stage-gpu: stage/ plus the working tree is over 63 MiB; what travels to the GPU machine must stay under 64 MiB" >&2
    exit 1
fi
