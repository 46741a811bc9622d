#!/usr/bin/env bash
# Compiles kernels/cuda/*.cu with the pinned NVRTC into one tree, kernels/images/, a folder per program (cubins,
# PTX, manifest.json): kernels/ (the gpu-ipc-kernels crate's), ring/ (the ring's own kernels/cuda/ring_*.cu, which
# ipc-core embeds), queue/ (the work queue's queue_*.cu, which ipc-toolkit embeds). First it writes the ring's layout
# header, kernels/cuda/gpu_ipc_ring_layout.cuh, from its Rust definition (ipc-core's `ring-layout-header` example).
#   scripts/gen-kernels.sh          regenerate the header and the images, replacing the committed ones
#   scripts/gen-kernels.sh --check  regenerate into a temp dir; fail if the committed files differ
# Needs: cargo; python3 (3.11, standard library) with pip for the pinned wheel; no GPU and no CUDA toolkit.
# See docs/kernels.md.
source "$(dirname "$0")/toolchain.sh"
need_nvrtc

OUT="$ROOT/kernels/images"
HEADER="$ROOT/kernels/cuda/gpu_ipc_ring_layout.cuh"
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
# Built with the whole workspace selected, as test.sh builds (a `-p` would change feature unification and rebuild).
GENERATOR="$(cd "$ROOT" && cargo build --quiet --locked --workspace --example ring-layout-header --message-format=json |
    python3 -c 'import json, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m["target"]["name"] == "ring-layout-header" and m.get("executable"):
        print(m["executable"])')"
if [ -z "$GENERATOR" ]; then
    echo "gen-kernels: building ipc-core's ring-layout-header example failed" >&2
    exit 1
fi
"$GENERATOR" >"$TMP/gpu_ipc_ring_layout.cuh"
stale=0
if ! cmp -s "$HEADER" "$TMP/gpu_ipc_ring_layout.cuh"; then
    if [ "$MODE" = "--check" ]; then
        diff "$HEADER" "$TMP/gpu_ipc_ring_layout.cuh" >&2 || true
        echo "gen-kernels: kernels/cuda/gpu_ipc_ring_layout.cuh is out of date with the ring's layout in ipc-core" >&2
        stale=1
    else
        cp "$TMP/gpu_ipc_ring_layout.cuh" "$HEADER"
        echo "gen-kernels: wrote kernels/cuda/gpu_ipc_ring_layout.cuh"
    fi
fi

python3 "$ROOT/scripts/gen_kernels.py" \
    --nvrtc "$NVRTC_LIB" \
    --package "nvidia-cuda-nvrtc-cu12==12.9.86" \
    --wheel "$NVRTC_WHEEL" \
    --wheel-sha256 "$NVRTC_SHA256" \
    --root "$ROOT" \
    --out "$TMP/images"

if [ "$MODE" = "--check" ]; then
    if ! diff -r "$OUT" "$TMP/images" >&2; then
        echo "gen-kernels: kernels/images/ is out of date with kernels/cuda/ or the pinned NVRTC" >&2
        stale=1
    fi
    if [ "$stale" = 1 ]; then
        echo "  run scripts/gen-kernels.sh and commit kernels/cuda/gpu_ipc_ring_layout.cuh and kernels/images/" >&2
        exit 1
    fi
    echo "gen-kernels: kernels/cuda/gpu_ipc_ring_layout.cuh and kernels/images/ are up to date"
else
    rm -rf "$OUT"
    cp -r "$TMP/images" "$OUT"
    echo "gen-kernels: wrote $(find "$OUT" -type f | wc -l) files to kernels/images/"
fi
