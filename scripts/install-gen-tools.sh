#!/usr/bin/env bash
# Installs what the generated-file checks need, if missing: libclang (Debian's libclang-dev, needs root) and
# bindgen-cli 0.72.1 (cargo install, about 3 minutes on 2 cores). The pinned CUDA wheels are fetched by
# scripts/toolchain.sh when first needed.
#
# Every failure prints one line naming the missing tool and the fix, then exits 1.
set -euo pipefail
BINDGEN_VERSION="0.72.1"

fail() { # tool fix
    echo "install-gen-tools: $1 is missing and could not be installed: $2" >&2
    exit 1
}

# What bindgen (through clang-sys) loads: libclang.so, libclang.so.N or libclang-N.so, never libclang-cpp (the C++
# interface that Debian installs beside LLVM, which bindgen cannot use). Looks where clang-sys looks.
libclang_path() {
    local dir f
    local dirs=()
    [ -n "${LIBCLANG_PATH:-}" ] && dirs+=("$LIBCLANG_PATH")
    command -v llvm-config >/dev/null 2>&1 && dirs+=("$(llvm-config --libdir 2>/dev/null)")
    dirs+=(/usr/lib/llvm-*/lib /usr/local/lib /usr/lib /usr/lib/x86_64-linux-gnu /usr/lib/aarch64-linux-gnu /usr/lib64)
    for dir in "${dirs[@]}"; do
        for f in "$dir"/libclang.so "$dir"/libclang.so.[0-9]* "$dir"/libclang-[0-9]*.so*; do
            [ -e "$f" ] && { echo "$f"; return 0; }
        done
    done
    return 1
}

if found="$(libclang_path)"; then
    echo "install-gen-tools: libclang found: $found" >&2
else
    echo "install-gen-tools: libclang (for bindgen) not found; installing libclang-dev" >&2
    if [ "$(id -u)" -ne 0 ]; then
        fail libclang "run as root, or install it yourself: sudo apt-get install libclang-dev (Debian/Ubuntu), or set LIBCLANG_PATH to the folder holding libclang.so"
    fi
    command -v apt-get >/dev/null 2>&1 ||
        fail libclang "no apt-get here: install your distribution's libclang package, or set LIBCLANG_PATH to the folder holding libclang.so"
    if ! apt-get install -y -q libclang-dev >/dev/null 2>&1; then
        apt-get update -q >/dev/null 2>&1 ||
            fail libclang "apt-get update failed (no network?): install libclang-dev (Debian/Ubuntu) by hand"
        apt-get install -y -q libclang-dev >/dev/null 2>&1 ||
            fail libclang "apt-get install libclang-dev failed: run it by hand to see why"
    fi
    found="$(libclang_path)" ||
        fail libclang "libclang-dev was installed but no libclang.so appeared: set LIBCLANG_PATH to the folder holding it"
    echo "install-gen-tools: installed libclang: $found" >&2
fi

if ! bindgen --version 2>/dev/null | grep -q "bindgen $BINDGEN_VERSION"; then
    command -v cargo >/dev/null 2>&1 || fail "bindgen-cli $BINDGEN_VERSION" "cargo is not on PATH: install Rust (rustup.rs)"
    echo "install-gen-tools: installing bindgen-cli $BINDGEN_VERSION (cargo install, about 3 minutes)" >&2
    cargo install bindgen-cli --version "$BINDGEN_VERSION" --locked --quiet ||
        fail "bindgen-cli $BINDGEN_VERSION" "cargo install bindgen-cli --version $BINDGEN_VERSION --locked failed (no network to crates.io?): run it by hand"
    bindgen --version 2>/dev/null | grep -q "bindgen $BINDGEN_VERSION" ||
        fail "bindgen-cli $BINDGEN_VERSION" "installed, but \`bindgen\` on PATH is another version or missing: put ~/.cargo/bin first on PATH"
fi
# bindgen itself must load libclang: a quick run proves the pair works before the real check.
probe="$(mktemp --suffix=.h)"
trap 'rm -f "$probe"' EXIT
echo 'int gpu_ipc_probe(void);' >"$probe"
if ! out="$(bindgen "$probe" 2>&1)"; then
    echo "$out" | head -5 >&2
    fail "a libclang that bindgen can load" "install libclang-dev, or set LIBCLANG_PATH to the folder holding libclang.so"
fi
echo "install-gen-tools: bindgen $BINDGEN_VERSION loads libclang" >&2
