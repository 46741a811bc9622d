# Sourced by the GPU-machine scripts: stage/bin travels packed (stage/bin.tar.xz, see scripts/stage-gpu.sh: the
# working tree plus stage/ must stay under the 64 MiB the device tool carries); this unpacks it once.
unpack_stage() {
    local root="$1"
    if [ ! -x "$root/stage/bin/cargo-nextest" ] && [ -f "$root/stage/bin.tar.xz" ]; then
        mkdir -p "$root/stage/bin"
        tar -C "$root/stage/bin" -xJf "$root/stage/bin.tar.xz"
    fi
}

# A venv at $1 that sees the calling interpreter's packages (the GPU machine's torch, CuPy, JAX: its python3 is
# itself a venv, so --system-site-packages alone would see only the base interpreter's), with the staged wheel $2
# installed from the file (nothing is downloaded). The interpreter is $PYTHON (default python3). Non-zero on failure.
wheel_venv() {
    local venv="$1" wheel="$2" python="${PYTHON:-python3}" site
    "$python" -m venv --system-site-packages "$venv" || return 1
    site="$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')" || return 1
    "$python" -c 'import site; print("\n".join(site.getsitepackages()))' >"$site/gpu-ipc-parent-site.pth" || return 1
    "$venv/bin/pip" install --quiet --disable-pip-version-check --no-index --no-deps "$wheel"
}

# The preamble of a GPU-machine script that runs the staged tests and the staged wheel, called with the repository
# root, the script's name and its OUT_DIR argument: unpacks the stage, makes OUT_DIR and sets OUT (its absolute path),
# STAGE (ROOT/stage) and WHEEL (the staged wheel); writes OUT/environment.txt (date, the staged commit, the GPUs).
# Exits the script with status 2, saying why, without OUT_DIR or when nothing is staged.
#   stage_preamble "$ROOT" weights-gpu "${1:-}"
stage_preamble() {
    local root="$1" name="$2"
    OUT="${3:-}"
    [ -n "$OUT" ] || { echo "usage: scripts/$name.sh OUT_DIR" >&2; exit 2; }
    unpack_stage "$root"
    mkdir -p "$OUT"
    OUT="$(cd "$OUT" && pwd)"
    STAGE="$root/stage"
    [ -x "$STAGE/bin/cargo-nextest" ] || { echo "$name: nothing staged; run scripts/stage-gpu.sh first" >&2; exit 2; }
    WHEEL="$(ls "$STAGE"/wheels/gpu_ipc-*.whl 2>/dev/null | head -n1)"
    [ -n "$WHEEL" ] || { echo "$name: no stage/wheels/gpu_ipc-*.whl; run scripts/stage-gpu.sh first" >&2; exit 2; }
    {
        echo "date: $(date -u +%FT%TZ)"
        echo "commit: $(cat "$STAGE/COMMIT")"
        nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv 2>&1
    } >"$OUT/environment.txt"
}
