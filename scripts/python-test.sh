#!/usr/bin/env bash
# The Python package's tests on the host backend (no GPU needed), as CI runs them (the last step of scripts/test.sh):
#   scripts/python-test.sh [PYTEST_ARGS...]
# Builds the Rust example programs (`producer`, `consumer`, `semaphore`: the other end of the interop tests) and the
# wheel (dev profile, scripts/build-wheel.sh --dev), installs the wheel into a fresh venv with pinned pytest, numpy, mypy
# and NIXL (scripts/fetch-nixl.sh),
# runs pytest on python/tests, then checks the stubs against the native module (mypy.stubtest) and type-checks the
# tests with mypy --strict against the stubs.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
cd "$ROOT"
PYTHON="${PYTHON:-python3}"
WORK="$ROOT/target/py-test"
VENV="$WORK/venv"

echo "python-test: building the example programs (debug)" >&2
cargo build --quiet --locked -p gpu-ipc-examples --bin producer --bin consumer --bin semaphore
WHEEL="$(scripts/build-wheel.sh --dev "$WORK/wheels")"

echo "python-test: installing the wheel, pytest, numpy, mypy into a fresh venv, $VENV (nothing system-wide)" >&2
rm -rf "$VENV"
"$PYTHON" -m venv "$VENV"
"$VENV/bin/pip" install --quiet --disable-pip-version-check pytest==9.2.0 numpy==2.4.6 mypy==2.4.1 "$WHEEL"
# NIXL for the bridge's tests (python/tests/test_bridge_nixl.py: DRAM over UCX between processes): the pinned wheel,
# cached in target/nixl (about 2 s to download once, 2 s to install; --no-deps: it names torch, which it does not
# need for host memory). GPU_IPC_TEST_NIXL unset: installed when it can be fetched, else pytest reports those tests
# as skipped with the reason; GPU_IPC_TEST_NIXL=1: a wheel that cannot be fetched fails this script, and a NIXL that
# does not load fails the tests; GPU_IPC_TEST_NIXL=0: left out (the tests show as skipped).
NIXL_WANTED="${GPU_IPC_TEST_NIXL:-}"
if [ "$NIXL_WANTED" = 0 ]; then
    echo "python-test: GPU_IPC_TEST_NIXL=0: NIXL left out; the bridge's NIXL tests will show as skipped" >&2
elif NIXL_WHEEL="$(PYTHON="$VENV/bin/python" scripts/fetch-nixl.sh wheel)"; then
    "$VENV/bin/pip" install --quiet --disable-pip-version-check --no-deps "$NIXL_WHEEL"
elif [ "$NIXL_WANTED" = 1 ]; then
    echo "python-test: GPU_IPC_TEST_NIXL=1 and the NIXL wheel could not be fetched (scripts/fetch-nixl.sh wheel)" >&2
    exit 1
else
    echo "python-test: no NIXL wheel (offline?): the bridge's NIXL tests will show as skipped" >&2
fi

export GPU_IPC_EXAMPLES_DIR="$ROOT/target/debug"
echo "python-test: pytest python/tests" >&2
# -rs: each skipped test's reason in the summary (a skip is reported, never counted as a pass).
"$VENV/bin/python" -m pytest python/tests -q -rs -p no:cacheprovider "$@"

echo "python-test: stubs match the module (mypy.stubtest gpu_ipc._gpu_ipc)" >&2
"$VENV/bin/python" -m mypy.stubtest gpu_ipc._gpu_ipc --allowlist python/stubtest-allowlist.txt

echo "python-test: the tests type-check against the stubs (mypy --strict)" >&2
(cd python/tests && "$VENV/bin/python" -m mypy --strict --no-incremental --cache-dir=/dev/null .)
