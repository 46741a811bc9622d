#!/usr/bin/env bash
# The Python package on a GPU machine, from the wheel scripts/stage-gpu.sh staged (nothing is downloaded there):
#   scripts/python-gpu.sh OUT_DIR
# Installs stage/wheels/gpu_ipc-*.whl (pip --no-index --no-deps) into a venv made with --system-site-packages, so
# that it sees the machine's torch and CuPy, then runs scripts/python_gpu.py: a torch producer and a torch consumer
# in two processes for backend legacy, vmm x sync cpu-spin, ipc-event, gpu-stream-ops at 3840x2160 RGB (4 slots),
# and a CuPy consumer row (vmm, gpu-stream-ops); every byte of every frame checked on the GPU, the consumer's FPS and
# CPU time per frame, and the zero-copy checks (torch.from_dlpack(frame).data_ptr() == frame.ptr; CuPy's from_dlpack
# and __cuda_array_interface__). PY_GPU_FRAMES frames per row (default 600); rows stop being started after 420 s.
# Writes OUT_DIR/python-package.json, OUT_DIR/python-package.md (the table) and OUT_DIR/python-package.log (every
# process's output; python-package.*, not python-gpu.*, which scripts/python-gpu-consumer.sh writes). Exit status: 0 every row ok; 1 a row failed; 2 no wheel staged, no python3, or no GPU for torch.
set -uo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
cd "$ROOT"
OUT="${1:?usage: scripts/python-gpu.sh OUT_DIR}"
mkdir -p "$OUT"
OUT="$(cd "$OUT" && pwd)"
PYTHON="${PYTHON:-python3}"
command -v "$PYTHON" >/dev/null || { echo "python-gpu: $PYTHON not found" >&2; exit 2; }
WHEEL="$(ls stage/wheels/gpu_ipc-*.whl 2>/dev/null | head -n1)"
[ -n "$WHEEL" ] || { echo "python-gpu: no stage/wheels/gpu_ipc-*.whl; run scripts/stage-gpu.sh first" >&2; exit 2; }

WORK="$(mktemp -d /tmp/gpu-ipc-pygpu-XXXXXX)"
trap 'rm -rf "$WORK"' EXIT
"$PYTHON" -m venv --system-site-packages "$WORK/venv" || exit 2
# When $PYTHON is itself a virtual environment (the GPU machine's python3 is /opt/torch/.venv), the new venv's
# "system" is the base interpreter, without torch: let it also see the calling interpreter's site-packages.
VENV_SITE="$("$WORK/venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
"$PYTHON" -c 'import site; print("\n".join(site.getsitepackages()))' >"$VENV_SITE/gpu-ipc-parent-site.pth" || exit 2
"$WORK/venv/bin/pip" install --quiet --disable-pip-version-check --no-index --no-deps "$WHEEL" || exit 2
echo "python-gpu: $(basename "$WHEEL") in $WORK/venv; results in $OUT" >&2
"$WORK/venv/bin/python" scripts/python_gpu.py run "$OUT"
