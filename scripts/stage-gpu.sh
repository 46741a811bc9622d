#!/usr/bin/env bash
# Builds everything the GPU machine runs and stages it, stripped, in stage/ (ignored by git):
#   stage/gpu-tests.tar.zst   a nextest archive of every test binary of the workspace (profile `gpu`)
#   stage/bin/cargo-nextest   the standalone nextest runner (the GPU machine has no Rust toolchain)
#   stage/bin/gpu-ipc         the CLI; stage/bin/producer, stage/bin/consumer: the examples (when built)
# Then, on the GPU machine, from the project root: scripts/gpu-suite.sh OUT_DIR  (see docs/gpu-testing.md).
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
cd "$ROOT"
STAGE="$ROOT/stage"
rm -rf "$STAGE"
mkdir -p "$STAGE/bin"

echo "stage-gpu: building the test archive (profile gpu)" >&2
cargo nextest archive --workspace --cargo-profile gpu --archive-file "$STAGE/gpu-tests.tar.zst" >&2

echo "stage-gpu: building the binaries (profile gpu)" >&2
cargo build --profile gpu --workspace --bins >&2
for bin in gpu-ipc producer consumer; do
    if [ -f "target/gpu/$bin" ]; then
        cp "target/gpu/$bin" "$STAGE/bin/"
    fi
done

NEXTEST="$(command -v cargo-nextest)"
strip -o "$STAGE/bin/cargo-nextest" "$NEXTEST"
git rev-parse HEAD >"$STAGE/COMMIT" 2>/dev/null || echo unknown >"$STAGE/COMMIT"

TOTAL_KIB=$(du -sk "$STAGE" | cut -f1)
echo "stage-gpu: staged $(( TOTAL_KIB / 1024 )) MiB in stage/:" >&2
ls -la "$STAGE" "$STAGE/bin" >&2
if [ "$TOTAL_KIB" -gt $(( 48 * 1024 )) ]; then
    echo "stage-gpu: stage/ is over 48 MiB; the working tree plus stage/ must stay under 64 MiB" >&2
    exit 1
fi
