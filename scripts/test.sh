#!/usr/bin/env bash
# The project's test command (README, CI): formatting, lints, every test (GPU tests show as ignored on a machine
# without a GPU), doc tests, and the generated-file checks (bindings and kernels regenerate byte for byte).
#   scripts/test.sh            everything
#   scripts/test.sh --quick    skip the generated-file checks (no bindgen / NVRTC download needed)
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
cd "$ROOT"
CURRENT_STEP="start"
step() { CURRENT_STEP="$*"; printf '\n== %s\n' "$*" >&2; }
# Never a bare exit status: say which step failed.
trap 'rc=$?; echo "scripts/test.sh: FAILED (exit $rc) at step: $CURRENT_STEP" >&2' ERR

step "cargo fmt --check"
cargo fmt --all -- --check

step "cargo clippy (all targets, -D warnings)"
cargo clippy --workspace --all-targets --locked -- -D warnings

step "tests (GPU tests are listed as ignored on a machine without a GPU)"
if cargo nextest --version >/dev/null 2>&1; then
    cargo nextest run --workspace --locked --no-fail-fast
else
    echo "(cargo-nextest not installed: using cargo test)" >&2
    cargo test --workspace --locked --no-fail-fast --lib --bins --tests
fi

step "tests that need root (consumers running as another user)"
if [ "$(id -u)" = 0 ]; then
    cargo test -p ipc-core --test other_users --locked -- --ignored
else
    echo "(not root: the tests marked 'needs root' stay ignored)" >&2
fi

step "benches, each run once (criterion's test mode; GPU benches say they are skipped without a GPU)"
cargo test -p gpu-ipc-benches --benches --locked

step "doc tests"
cargo test --workspace --doc --locked

step "docs build without warnings"
RUSTDOCFLAGS="-D warnings" cargo doc --workspace --no-deps --locked --quiet

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

step "all checks passed"
