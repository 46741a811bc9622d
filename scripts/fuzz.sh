#!/usr/bin/env bash
# Coverage-guided fuzzing of every decoder that reads a peer's bytes (docs/fuzzing.md): builds the libFuzzer
# targets of fuzz/ on the stable toolchain (the coverage instrumentation passed as plain rustc flags, no nightly,
# no cargo-fuzz), runs each for a while from its committed corpus, prints executions and coverage per target, and
# fails on the first crash, leak, timeout or out-of-memory, naming the input and the command that reproduces it.
#   scripts/fuzz.sh                          every target, 10 s each
#   scripts/fuzz.sh --seconds 300 pool_directory queue_memory
#   scripts/fuzz.sh --build-only
# New inputs that add coverage go to fuzz/grown/<target>/ (ignored by git); crashes to fuzz/artifacts/<target>/.
# After a fix, copy the crash into fuzz/corpus/<target>/ (every run starts by replaying it) and add a unit test.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
FUZZ="$ROOT/fuzz"
SECONDS_EACH=10
BUILD_ONLY=0
TARGETS=()
while [ $# -gt 0 ]; do
    case "$1" in
        --seconds) SECONDS_EACH="$2"; shift 2 ;;
        --seconds=*) SECONDS_EACH="${1#*=}"; shift ;;
        --build-only) BUILD_ONLY=1; shift ;;
        -h|--help) sed -n '2,10p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        -*) echo "fuzz.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
        *) TARGETS+=("$1"); shift ;;
    esac
done
ALL_TARGETS=(wire_message object_offers pool_directory queue_memory semaphore_block weights_manifest)
[ ${#TARGETS[@]} -gt 0 ] || TARGETS=("${ALL_TARGETS[@]}")

# What cargo-fuzz passes on nightly, minus `-Zsanitizer`: sancov's inline 8-bit counters and PC table are what
# libFuzzer reads as coverage; comparisons are traced so it can solve magic numbers and lengths; debug assertions
# and overflow checks make an overflow a finding. `--cfg fuzzing` is what libfuzzer-sys and fuzzed crates test for.
# An explicit `--target` keeps these flags off build scripts and proc macros (they run on the host, uninstrumented).
HOST="$(rustc -vV | sed -n 's/^host: //p')"
export RUSTFLAGS="-Cpasses=sancov-module -Cllvm-args=-sanitizer-coverage-level=4 \
-Cllvm-args=-sanitizer-coverage-inline-8bit-counters -Cllvm-args=-sanitizer-coverage-pc-table \
-Cllvm-args=-sanitizer-coverage-trace-compares --cfg fuzzing -Cdebug-assertions -Coverflow-checks"
export CARGO_TARGET_DIR="$FUZZ/target/libfuzzer"
BIN="$CARGO_TARGET_DIR/$HOST/release"
BIN_ARGS=()
for t in "${TARGETS[@]}"; do BIN_ARGS+=(--bin "$t"); done
echo "fuzz.sh: building ${TARGETS[*]} (release, coverage-instrumented; the first build takes minutes)" >&2
(cd "$FUZZ" && cargo build --quiet --release --locked --target "$HOST" "${BIN_ARGS[@]}")
[ "$BUILD_ONLY" = 1 ] && exit 0

LOGS="$FUZZ/target/fuzz-logs"
mkdir -p "$LOGS"
failed=()
printf '%-16s %12s %10s %8s %8s %7s  %s\n' target executions exec/s cov ft corpus result
for t in "${TARGETS[@]}"; do
    mkdir -p "$FUZZ/grown/$t" "$FUZZ/artifacts/$t"
    log="$LOGS/$t.log"
    rc=0
    # The first folder receives new inputs; the committed corpus (seeds and past crashes) is read, never written.
    # -timeout: one input running this long is a hang; -rss_limit_mb: an input that needs this much is an OOM.
    "$BIN/$t" -max_total_time="$SECONDS_EACH" -timeout=10 -rss_limit_mb=2048 -max_len=8192 -print_final_stats=1 \
        -artifact_prefix="$FUZZ/artifacts/$t/" "$FUZZ/grown/$t" "$FUZZ/corpus/$t" >"$log" 2>&1 || rc=$?
    execs="$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)"
    rate="$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log" | tail -1)"
    # The last status line: "#N DONE cov: C ft: F corp: U/S ..." (or the last pulse before a crash).
    status="$(grep -E '^#[0-9]+[[:space:]]+(DONE|pulse|NEW|REDUCE|INITED)' "$log" | tail -1 || true)"
    cov="$(sed -n 's/.* cov: \([0-9]*\).*/\1/p' <<<"$status")"
    ft="$(sed -n 's/.* ft: \([0-9]*\).*/\1/p' <<<"$status")"
    corp="$(sed -n 's/.* corp: \([0-9]*\)\/.*/\1/p' <<<"$status")"
    if [ "$rc" = 0 ]; then
        result=ok
    else
        failed+=("$t")
        artifact="$(sed -n 's/.*Test unit written to \(.*\)$/\1/p' "$log" | tail -1)"
        result="FAILED (exit $rc)"
    fi
    printf '%-16s %12s %10s %8s %8s %7s  %s\n' "$t" "${execs:-?}" "${rate:-?}" "${cov:-?}" "${ft:-?}" "${corp:-?}" "$result"
    if [ "$rc" != 0 ]; then
        grep -E -m1 -A2 "panicked at|ERROR: libFuzzer" "$log" | sed 's/^/    /' >&2 || true
        echo "    log: $log" >&2
        if [ -n "${artifact:-}" ]; then
            echo "    input: $artifact" >&2
            echo "    reproduce: $BIN/$t $artifact" >&2
        fi
    fi
done
if [ ${#failed[@]} -gt 0 ]; then
    echo "fuzz.sh: FAILED: ${failed[*]}" >&2
    exit 1
fi
