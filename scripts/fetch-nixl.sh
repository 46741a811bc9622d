#!/usr/bin/env bash
# NIXL's Python package (pip `nixl-cu13`, pinned below) for the bridge (python -m gpu_ipc.bridge):
#   scripts/fetch-nixl.sh wheel [PYVER]            downloads the wheel for CPython PYVER (default: this python3's)
#                                                  into target/nixl/ (cached) and prints its path
#   scripts/fetch-nixl.sh pack OUT.tar.xz [PYVER]  the same wheel (PYVER default 3.12: the GPU machine's python3),
#                                                  reduced to what the UCX backend loads, packed for a machine
#                                                  without a registry (scripts/stage-gpu.sh --nixl)
# The wheel (about 59 MB) holds NIXL's Python module (nixl_cu13/), its libraries (.nixl_cu13.mesonpy.libs/, with the
# plugins under plugins/) and bundled dependencies (nixl_cu13.libs/, UCX's modules under ucx/). `pack` keeps the
# module, the UCX plugin and the libraries these need (their ELF NEEDED closure, UCX's modules and libnuma), and drops
# the other plugins (storage, object stores, EP) and their dependencies. Unpacked onto PYTHONPATH with
# NIXL_PLUGIN_DIR=<dir>/.nixl_cu13.mesonpy.libs/plugins, `import nixl_cu13` gives the API (the `nixl` package is a
# separate, pure-Python wheel that only picks nixl_cu12 or nixl_cu13: not needed). When PYVER is this python3's,
# `pack` checks the reduced tree: an agent with the UCX backend starts from it.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
NIXL_VERSION="1.5.1"
PACKAGE="nixl-cu13"
PYTHON="${PYTHON:-python3}"
CACHE="$ROOT/target/nixl"
HERE_VER="$("$PYTHON" -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')"

wheel() {
    local ver="$1" tag
    tag="cp${ver/./}"
    mkdir -p "$CACHE"
    local found
    found="$(ls "$CACHE"/nixl_cu13-"$NIXL_VERSION"-"$tag"-*.whl 2>/dev/null | head -n1 || true)"
    if [ -z "$found" ]; then
        echo "fetch-nixl: pip download $PACKAGE==$NIXL_VERSION for CPython $ver" >&2
        "$PYTHON" -m pip download --quiet --disable-pip-version-check --no-deps --only-binary=:all: \
            --python-version "$ver" --platform manylinux_2_28_x86_64 -d "$CACHE" "$PACKAGE==$NIXL_VERSION" >&2
        found="$(ls "$CACHE"/nixl_cu13-"$NIXL_VERSION"-"$tag"-*.whl | head -n1)"
    fi
    echo "$found"
}

case "${1:-}" in
wheel)
    wheel "${2:-$HERE_VER}"
    ;;
pack)
    OUT="${2:?usage: scripts/fetch-nixl.sh pack OUT.tar.xz [PYVER]}"
    VER="${3:-3.12}"
    WHEEL="$(wheel "$VER")"
    WORK="$(mktemp -d)"
    trap 'rm -rf "$WORK"' EXIT
    "$PYTHON" -m zipfile -e "$WHEEL" "$WORK/whl"
    mkdir -p "$WORK/tree"
    mv "$WORK/whl/nixl_cu13" "$WORK/whl/nixl_cu13.libs" "$WORK/whl/.nixl_cu13.mesonpy.libs" "$WORK/tree/"
    "$PYTHON" - "$WORK/tree" <<'EOF'
import glob, os, subprocess, sys
tree = sys.argv[1]
os.chdir(tree)
plugins = ".nixl_cu13.mesonpy.libs/plugins"
for p in glob.glob(f"{plugins}/*"):
    if os.path.basename(p) != "libplugin_UCX.so":
        os.remove(p)
for p in glob.glob("nixl_cu13.libs/nixl/*"):  # a second copy of the plugins
    os.remove(p)
os.rmdir("nixl_cu13.libs/nixl")
libs = {os.path.basename(f): f for d in (".nixl_cu13.mesonpy.libs", "nixl_cu13.libs") for f in glob.glob(f"{d}/*.so*")}
todo = glob.glob("nixl_cu13/*.so") + glob.glob(f"{plugins}/*.so") + glob.glob("nixl_cu13.libs/ucx/*.so*")
keep = set()
while todo:
    f = todo.pop()
    if f in keep:
        continue
    keep.add(f)
    for line in subprocess.run(["readelf", "-d", f], capture_output=True, text=True, check=True).stdout.splitlines():
        if "(NEEDED)" in line:
            name = line.split("[", 1)[1].rstrip("]")
            if name in libs:
                todo.append(libs[name])
for name, f in libs.items():
    if f not in keep and not name.startswith("libnuma"):  # libnuma: dlopened by UCX
        os.remove(f)
EOF
    mkdir -p "$(dirname "$OUT")"
    tar -C "$WORK/tree" -cJf "$OUT" .
    echo "fetch-nixl: $(du -h "$OUT" | cut -f1) $OUT ($PACKAGE $NIXL_VERSION, CPython $VER, reduced)" >&2
    if [ "$VER" != "$HERE_VER" ]; then
        echo "fetch-nixl: not loaded here (CPython $HERE_VER, the tree is for $VER)" >&2
    elif ! "$PYTHON" -c 'import numpy' 2>/dev/null; then
        echo "fetch-nixl: not loaded here: $PYTHON has no numpy (NIXL's module imports it)" >&2
    else
        NIXL_PLUGIN_DIR="$WORK/tree/.nixl_cu13.mesonpy.libs/plugins" PYTHONPATH="$WORK/tree" "$PYTHON" -c '
import nixl_cu13 as n
a = n.nixl_agent("fetch-nixl-check", n.nixl_agent_config(backends=["UCX"]))
assert "UCX" in a.backends, a.plugin_list
' >/dev/null 2>&1 || { echo "fetch-nixl: the reduced tree does not start a UCX agent" >&2; exit 1; }
        echo "fetch-nixl: checked: a UCX agent starts from the reduced tree" >&2
    fi
    ;;
*)
    sed -n '2,16p' "$0" >&2
    exit 2
    ;;
esac
