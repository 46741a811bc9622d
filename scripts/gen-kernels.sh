#!/usr/bin/env bash
# Compiles kernels/cuda/*.cu with the pinned NVRTC into kernels/generated/ (cubins, PTX, manifest.json).
#   scripts/gen-kernels.sh          regenerate and replace kernels/generated/
#   scripts/gen-kernels.sh --check  regenerate into a temp dir; fail if the committed files differ
# Needs: python3 (3.11, standard library) with pip for the pinned wheel; no GPU and no CUDA toolkit.
# See docs/kernels.md.
source "$(dirname "$0")/toolchain.sh"
need_nvrtc

OUT="$ROOT/kernels/generated"
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
    --out "$TMP/generated"

if [ "$MODE" = "--check" ]; then
    if ! diff -r "$OUT" "$TMP/generated" >&2; then
        echo "gen-kernels: kernels/generated/ is out of date with kernels/cuda/ or the pinned NVRTC;" >&2
        echo "  run scripts/gen-kernels.sh and commit kernels/generated/" >&2
        exit 1
    fi
    echo "gen-kernels: kernels/generated/ is up to date"
else
    rm -rf "$OUT"
    mkdir -p "$(dirname "$OUT")"
    cp -r "$TMP/generated" "$OUT"
    echo "gen-kernels: wrote $(find "$OUT" -type f | wc -l) files to kernels/generated/"
fi
