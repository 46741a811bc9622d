# Shared by the project commands: fetches the pinned CUDA wheels from PyPI into
# .toolchain-cache/ (ignored by git), checks their SHA-256, and unpacks them.
# Source it; it defines CUDA_INCLUDE (cuda.h) and NVRTC_LIB (libnvrtc.so.12).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
CACHE="$ROOT/.toolchain-cache"

# The pinned versions (named in docs/driver-layer.md and docs/kernels.md): change them here, and there.
CUDA_RUNTIME_WHEEL="nvidia_cuda_runtime_cu12-12.9.79-py3-none-manylinux2014_x86_64.manylinux_2_17_x86_64.whl"
CUDA_RUNTIME_SHA256="25bba2dfb01d48a9b59ca474a1ac43c6ebf7011f1b0b8cc44f54eb6ac48a96c3"
NVRTC_WHEEL="nvidia_cuda_nvrtc_cu12-12.9.86-py3-none-manylinux2010_x86_64.manylinux_2_12_x86_64.whl"
NVRTC_SHA256="210cf05005a447e29214e9ce50851e83fc5f4358df8b453155d5e1918094dcb4"

fetch_wheel() { # pip-spec wheel-file sha256
    local spec="$1" file="$2" sum="$3"
    mkdir -p "$CACHE/wheels"
    if [ ! -f "$CACHE/wheels/$file" ]; then
        if ! python3 -m pip --version >/dev/null 2>&1; then
            echo "toolchain: python3 with pip is needed to fetch $spec: install python3-pip (Debian/Ubuntu)" >&2
            exit 1
        fi
        echo "toolchain: downloading $spec into $CACHE/wheels/ (unpacked there; nothing is installed)" >&2
        python3 -m pip download --quiet --no-deps --only-binary=:all: \
            --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 \
            --platform manylinux2010_x86_64 --platform manylinux_2_12_x86_64 \
            -d "$CACHE/wheels" "$spec" >&2 || {
            echo "toolchain: pip could not download $spec from PyPI (no network?); fetch $file into $CACHE/wheels/" >&2
            exit 1
        }
    fi
    echo "$sum  $CACHE/wheels/$file" | sha256sum --check --quiet - >&2 || {
        echo "toolchain: $CACHE/wheels/$file does not have the pinned SHA-256; delete it and run again" >&2
        exit 1
    }
    local dest="$CACHE/unpacked/${file%%-py3-*}"
    if [ ! -d "$dest" ]; then
        mkdir -p "$dest.tmp"
        python3 -m zipfile -e "$CACHE/wheels/$file" "$dest.tmp"
        mv "$dest.tmp" "$dest"
    fi
    echo "$dest"
}

need_runtime_headers() {
    local d
    d="$(fetch_wheel nvidia-cuda-runtime-cu12==12.9.79 "$CUDA_RUNTIME_WHEEL" "$CUDA_RUNTIME_SHA256")"
    CUDA_INCLUDE="$d/nvidia/cuda_runtime/include"
}

need_nvrtc() {
    local d
    d="$(fetch_wheel nvidia-cuda-nvrtc-cu12==12.9.86 "$NVRTC_WHEEL" "$NVRTC_SHA256")"
    NVRTC_LIB="$d/nvidia/cuda_nvrtc/lib/libnvrtc.so.12"
}
