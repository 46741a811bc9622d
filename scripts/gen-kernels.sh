#!/usr/bin/env bash
# Compiles kernels/cuda/*.cu with the pinned NVRTC (cubins, PTX, manifest.json): the ring's sync kernels
# (kernels/cuda/ring_*.cu) into ipc-core/ring-kernels/, which ipc-core embeds, the work queue's (queue_*.cu) into
# ipc-toolkit/queue-kernels/, which ipc-toolkit embeds, the weights' gather copy (weights_*.cu) into
# ipc-toolkit/weights-kernels/, which ipc-toolkit embeds too; all others into kernels/generated/.
#   scripts/gen-kernels.sh          regenerate and replace both folders
#   scripts/gen-kernels.sh --check  regenerate into a temp dir; fail if the committed files differ
# Needs: python3 (3.11, standard library) with pip for the pinned wheel; no GPU and no CUDA toolkit.
# See docs/kernels.md.
source "$(dirname "$0")/toolchain.sh"
need_nvrtc

OUT="$ROOT/kernels/generated"
RING_OUT="$ROOT/ipc-core/ring-kernels"
QUEUE_OUT="$ROOT/ipc-toolkit/queue-kernels"
WEIGHTS_OUT="$ROOT/ipc-toolkit/weights-kernels"
MODE="${1:-write}"
case "$MODE" in
    write | --check) ;;
    *)
        echo "usage: scripts/gen-kernels.sh [--check]" >&2
        exit 2
        ;;
esac

TMP="$(mktemp -d)"
trap 'rm -rf "$TMP"' EXIT
python3 "$ROOT/scripts/gen_kernels.py" \
    --nvrtc "$NVRTC_LIB" \
    --package "nvidia-cuda-nvrtc-cu12==12.9.86" \
    --wheel "$NVRTC_WHEEL" \
    --wheel-sha256 "$NVRTC_SHA256" \
    --root "$ROOT" \
    --out "$TMP/generated" \
    --ring-out "$TMP/ring-kernels" \
    --queue-out "$TMP/queue-kernels" \
    --weights-out "$TMP/weights-kernels"

if [ "$MODE" = "--check" ]; then
    stale=0
    for pair in "$OUT:$TMP/generated" "$RING_OUT:$TMP/ring-kernels" "$QUEUE_OUT:$TMP/queue-kernels" "$WEIGHTS_OUT:$TMP/weights-kernels"; do
        committed="${pair%%:*}"
        if ! diff -r "$committed" "${pair#*:}" >&2; then
            echo "gen-kernels: ${committed#"$ROOT"/}/ is out of date with kernels/cuda/ or the pinned NVRTC;" >&2
            stale=1
        fi
    done
    if [ "$stale" = 1 ]; then
        echo "  run scripts/gen-kernels.sh and commit kernels/generated/, ipc-core/ring-kernels/, ipc-toolkit/queue-kernels/ and ipc-toolkit/weights-kernels/" >&2
        exit 1
    fi
    echo "gen-kernels: kernels/generated/, ipc-core/ring-kernels/, ipc-toolkit/queue-kernels/ and ipc-toolkit/weights-kernels/ are up to date"
else
    for pair in "$OUT:$TMP/generated" "$RING_OUT:$TMP/ring-kernels" "$QUEUE_OUT:$TMP/queue-kernels" "$WEIGHTS_OUT:$TMP/weights-kernels"; do
        committed="${pair%%:*}"
        rm -rf "$committed"
        mkdir -p "$(dirname "$committed")"
        cp -r "${pair#*:}" "$committed"
        echo "gen-kernels: wrote $(find "$committed" -type f | wc -l) files to ${committed#"$ROOT"/}/"
    done
fi
