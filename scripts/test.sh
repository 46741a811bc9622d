#!/usr/bin/env bash
# The project's test command (README, CI): formatting, lints, every test (GPU tests show as ignored on a machine
# without a GPU), doc tests, the generated-file checks (bindings and kernels regenerate byte for byte) and the Python
# package's tests.
#   scripts/test.sh            everything
#   scripts/test.sh --quick    skip the generated-file checks (no bindgen / NVRTC download needed)
#
# What it installs, and where (each is printed as it happens):
#   - libclang-dev, a Debian package, with apt-get, only when no libclang is found and only as root (otherwise it
#     stops and says how to install it): scripts/install-gen-tools.sh, not with --quick.
#   - bindgen-cli 0.72.1 with `cargo install`, into ~/.cargo/bin (global for this user), when that version is not
#     on PATH: scripts/install-gen-tools.sh, not with --quick.
#   - the pinned CUDA wheels (headers, NVRTC) downloaded with `pip download` and unpacked into .toolchain-cache/ in
#     the checkout, nothing installed: scripts/toolchain.sh, for the generated-file checks, not with --quick.
#   - maturin into the venv target/py-venv (scripts/build-wheel.sh), then the wheel, pytest, numpy, mypy and, when it
#     can be fetched, NIXL into a fresh venv target/py-test/venv (scripts/python-test.sh). Nothing goes into the
#     system's Python.
# At the end, pass or fail, it removes what the kill tests' killed processes could not: their sockets and folders
# named gpu-ipc-* in the temporary directory (cleanup_tmp below).
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
cd "$ROOT"
CURRENT_STEP="start"
# Each step's header says how long the script has run, so a slow step shows in the log.
step() { CURRENT_STEP="$*"; printf '\n== %s  [%d s]\n' "$*" "$SECONDS" >&2; }
# Never a bare exit status: say which step failed.
trap 'rc=$?; echo "scripts/test.sh: FAILED (exit $rc) at step: $CURRENT_STEP" >&2' ERR

# A SIGKILLed producer, owner or stress child cannot unlink its socket (nor a dying test its folder): the tests name
# each such file gpu-ipc-*-<pid of the test process>-* in the temporary directory. On exit, remove those this run
# made (newer than the mark below, ours, and whose test process has ended); another run's live files stay.
TMP_DIR="${TMPDIR:-/tmp}"
START_MARK="$(mktemp "$TMP_DIR/test-sh-start.XXXXXX")"
cleanup_tmp() {
    local f pid removed=0
    for f in "$TMP_DIR"/gpu-ipc-*; do
        [ -e "$f" ] || [ -L "$f" ] || continue
        [ -O "$f" ] && [ "$f" -nt "$START_MARK" ] || continue
        pid="$(basename "$f" | grep -oE -- '-[0-9]+(-|\.|$)' | head -n 1 | tr -dc '0-9')" || true
        if [ -n "$pid" ] && [ -d "/proc/$pid" ]; then continue; fi
        rm -rf -- "$f" && removed=$((removed + 1))
    done
    rm -f -- "$START_MARK"
    if [ "$removed" -gt 0 ]; then
        echo "scripts/test.sh: removed $removed socket(s) and folder(s) the tests' killed processes left in $TMP_DIR" >&2
    fi
}
trap cleanup_tmp EXIT

# One feature set for everything: every cargo command below selects the whole workspace (`--workspace`), so clippy's
# check build, the test build, the benches, the doc tests and the docs each build once and share their dependencies.
# A `-p PACKAGE` here would change feature unification and rebuild the workspace (minutes on 2 cores).
CARGO_FLAGS=(--workspace --locked)

step "cargo fmt --check"
cargo fmt --all -- --check

step "cargo clippy (all targets, -D warnings)"
cargo clippy "${CARGO_FLAGS[@]}" --all-targets -- -D warnings

# The tests ignored as "needs root" (each runs a child as another user); run below when this script runs as root.
ROOT_TESTS='(package(ipc-core) & (binary(other_users) | test(=another_user_is_kept_out)
    | test(=a_refused_other_user_peer_does_not_end_the_producer)))
    | (package(gpu-ipc-stress) & test(/as_root_the_consumer_runs_as_nobody/))'

if cargo nextest --version >/dev/null 2>&1; then
    step "tests (GPU tests are listed as ignored on a machine without a GPU)"
    cargo nextest run "${CARGO_FLAGS[@]}" --no-fail-fast
    step "tests that need root (consumers running as another user)"
    if [ "$(id -u)" = 0 ]; then
        # The same build as above: only the filter differs.
        cargo nextest run "${CARGO_FLAGS[@]}" --no-fail-fast --run-ignored only -E "$ROOT_TESTS"
    else
        echo "(not root: the tests marked 'needs root' stay ignored)" >&2
    fi
else
    step "tests (GPU tests are listed as ignored on a machine without a GPU)"
    echo "(cargo-nextest not installed: using cargo test)" >&2
    cargo test "${CARGO_FLAGS[@]}" --no-fail-fast --lib --bins --tests
    step "tests that need root (consumers running as another user)"
    if [ "$(id -u)" = 0 ]; then
        cargo test "${CARGO_FLAGS[@]}" --test other_users -- --ignored
        cargo test "${CARGO_FLAGS[@]}" --test wire_rendezvous -- --ignored --exact another_user_is_kept_out
        cargo test "${CARGO_FLAGS[@]}" --test hostile_clients -- --ignored --exact \
            a_refused_other_user_peer_does_not_end_the_producer
    else
        echo "(not root: the tests marked 'needs root' stay ignored)" >&2
    fi
fi

step "benches, each run once (criterion's test mode; GPU benches say they are skipped without a GPU)"
# `--bench '*'`: the bench targets only (`--benches` would also run every library's unit tests again).
cargo test "${CARGO_FLAGS[@]}" --bench '*'

step "doc tests"
cargo test "${CARGO_FLAGS[@]}" --doc

step "docs build without warnings"
RUSTDOCFLAGS="-D warnings" cargo doc "${CARGO_FLAGS[@]}" --no-deps --quiet

if [ "${1:-}" != "--quick" ]; then
    step "tools for the generated-file checks (libclang, bindgen-cli 0.72.1)"
    scripts/install-gen-tools.sh
    step "generated bindings are up to date"
    scripts/gen-bindings.sh --check
    step "generated kernel images are up to date"
    scripts/gen-kernels.sh --check
fi
# The Python package (python/): wheel, pytest on the host backend, stubs (scripts/python-test.sh).
step "python package (wheel + pytest, host backend)"
scripts/python-test.sh

# Coverage-guided fuzzing of the decoders a peer feeds (fuzz/, docs/fuzzing.md): a short run, 12 s per target, from
# the committed corpus (which replays every past crash first); the build is a one-time few minutes.
step "fuzz targets, a short run (scripts/fuzz.sh --seconds 12)"
scripts/fuzz.sh --seconds 12

step "all checks passed"
