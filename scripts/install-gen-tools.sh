#!/usr/bin/env bash
# Installs what the generated-file checks need, if missing: libclang (Debian's libclang-dev, needs root) and
# bindgen-cli 0.72.1 (cargo install, about 3 minutes on 2 cores). The pinned CUDA wheels are fetched by
# scripts/toolchain.sh when first needed.
set -euo pipefail
if ! ls /usr/lib/llvm-*/lib/libclang*.so* /usr/lib/x86_64-linux-gnu/libclang*.so* >/dev/null 2>&1; then
    echo "install-gen-tools: installing libclang-dev" >&2
    if [ "$(id -u)" -ne 0 ]; then
        echo "install-gen-tools: libclang is missing and this is not root: install libclang-dev (Debian/Ubuntu)" >&2
        exit 1
    fi
    apt-get install -y -q libclang-dev >/dev/null 2>&1 ||
        { apt-get update -q >/dev/null && apt-get install -y -q libclang-dev >/dev/null; }
fi
if ! bindgen --version 2>/dev/null | grep -q "bindgen 0.72.1"; then
    echo "install-gen-tools: installing bindgen-cli 0.72.1" >&2
    cargo install bindgen-cli --version 0.72.1 --locked --quiet
fi
