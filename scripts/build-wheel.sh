#!/usr/bin/env bash
# Builds the Python package gpu_ipc (python/: PyO3 abi3 + maturin) as one wheel for CPython 3.10+, any NVIDIA
# driver and any GPU (libcuda is loaded at run time, the kernels are embedded: no CUDA toolkit needed):
#   scripts/build-wheel.sh [--dev] [OUT_DIR]     (default OUT_DIR: target/wheels)
# It makes a venv under target/py-venv with the pinned maturin, builds the wheel (release; --dev: the dev profile,
# faster to build, what scripts/python-test.sh uses) into OUT_DIR, replacing any gpu_ipc wheel there, and prints
# the wheel's path on stdout.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
cd "$ROOT"
MATURIN_VERSION="1.16.0"
PROFILE=(--release)
if [ "${1:-}" = "--dev" ]; then
    PROFILE=()
    shift
fi
OUT="${1:-target/wheels}"
mkdir -p "$OUT"
OUT="$(cd "$OUT" && pwd)"
PYTHON="${PYTHON:-python3}"
VENV="$ROOT/target/py-venv"

if ! "$VENV/bin/maturin" --version 2>/dev/null | grep -qx "maturin $MATURIN_VERSION"; then
    echo "build-wheel: installing maturin $MATURIN_VERSION into $VENV" >&2
    [ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
    "$VENV/bin/pip" install --quiet --disable-pip-version-check "maturin==$MATURIN_VERSION"
fi

rm -f "$OUT"/gpu_ipc-*.whl
echo "build-wheel: maturin build ${PROFILE[*]:-(dev profile)} -> $OUT" >&2
# --interpreter: the abi3 wheel only needs some CPython >= 3.10 to name; the venv's is at hand.
"$VENV/bin/maturin" build "${PROFILE[@]}" --manifest-path python/Cargo.toml --interpreter "$VENV/bin/python" \
    --out "$OUT" >&2
WHEEL="$(ls "$OUT"/gpu_ipc-*.whl)"
echo "build-wheel: $(du -h "$WHEEL" | cut -f1) $WHEEL" >&2
echo "$WHEEL"
