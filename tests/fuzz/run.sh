#!/usr/bin/env bash
# Builds the libFuzzer targets (clang, DEVCOORD_FUZZ=ON) in their own build dir and runs each
# for SECONDS on a copy of its committed corpus (tests/fuzz/corpus/<target>/), after replaying
# the saved reproducers of past findings (tests/fuzz/crashes/<target>-*.bin). Prints each
# target's executions and any crash, leak, timeout or out-of-memory; exits non-zero if any.
#   bash tests/fuzz/run.sh [SECONDS]     (default 60; build dir build-fuzz/, override with
#                                         BUILD_DIR=...; TARGETS="fuzz_device ..." for some;
#                                         JOBS=N targets at once, default nproc)
set -euo pipefail
cd "$(dirname "$0")/../.."
seconds=${1:-60}
build=${BUILD_DIR:-build-fuzz}
targets=${TARGETS:-fuzz_request fuzz_device fuzz_config fuzz_pbwire fuzz_dataplane fuzz_datalink fuzz_chunked}

bash .ci/setup-debian.sh build dev
CC=clang cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DDEVCOORD_FUZZ=ON \
    -DDEVCOORD_TESTS=OFF >/dev/null
# Only the fuzz targets: nothing else is needed.
# shellcheck disable=SC2086
cmake --build "$build" -j"$(nproc)" --target $targets

# Undefined behaviour is a finding too, not just a line in the log.
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-halt_on_error=1:print_stacktrace=1}

out="$build/fuzz-results"
rm -rf "$out"
mkdir -p "$out"
# One target, in a subshell of its own (run with &): replays its reproducers, fuzzes, writes
# its report to $out/<target>.report (first, so a failure of its own lands there too) and
# exits non-zero on any finding.
fuzz_one() {
    local t=$1 name bin work repro rc execs rate a ok=1
    exec >"$out/$t.report" 2>&1
    name=${t#fuzz_}
    bin="$build/tests/fuzz/$t"
    work="$out/$t"
    mkdir -p "$work/corpus" "$work/artifacts"
    cp tests/fuzz/corpus/"$name"/* "$work/corpus/"
    local opts=(-rss_limit_mb=2048 -timeout=10 -artifact_prefix="$work/artifacts/")

    echo "== $t: replaying saved reproducers"
    for repro in tests/fuzz/crashes/"$name"-*.bin; do
        [ -e "$repro" ] || continue
        if ! "$bin" "${opts[@]}" "$repro" >"$work/replay-$(basename "$repro").log" 2>&1; then
            echo "   still fails: $repro (log: $work/replay-$(basename "$repro").log)"
            ok=0
        fi
    done

    echo "== $t: fuzzing for ${seconds}s"
    rc=0
    "$bin" "${opts[@]}" -max_total_time="$seconds" -print_final_stats=1 "$work/corpus" \
        >"$work/fuzz.log" 2>&1 || rc=$?
    execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$work/fuzz.log" | tail -n 1)
    rate=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$work/fuzz.log" | tail -n 1)
    if [ -n "$execs" ]; then
        echo "   executions: $execs (${rate:-?}/s)"
    else
        echo "   executions: $(grep -o '^#[0-9]*' "$work/fuzz.log" | tail -n 1 | tr -d '#')"
    fi
    if [ "$rc" -ne 0 ]; then
        ok=0
        echo "   FINDING (exit $rc), log: $work/fuzz.log"
        grep -E '^(FINDING|==[0-9]+==ERROR|SUMMARY)|runtime error' "$work/fuzz.log" | sed 's/^/   /' || true
        for a in "$work"/artifacts/*; do
            [ -e "$a" ] && echo "   reproducer: $a"
        done
    fi
    [ "$ok" -eq 1 ]
}

# JOBS targets at once (each fuzzes on one core for a fixed time): the step takes
# ceil(targets / JOBS) x SECONDS instead of targets x SECONDS.
jobs=${JOBS:-$(nproc)}
failed=()
set -- $targets
while [ $# -gt 0 ]; do
    batch=()
    pids=()
    while [ $# -gt 0 ] && [ ${#batch[@]} -lt "$jobs" ]; do
        fuzz_one "$1" &
        pids+=($!)
        batch+=("$1")
        shift
    done
    for i in "${!batch[@]}"; do
        rc=0
        wait "${pids[$i]}" || rc=$?
        cat "$out/${batch[$i]}.report"
        [ "$rc" -eq 0 ] || failed+=("${batch[$i]}")
    done
done

if [ ${#failed[@]} -gt 0 ]; then
    echo "fuzz: findings in ${failed[*]}"
    exit 1
fi
echo "fuzz: no findings"
