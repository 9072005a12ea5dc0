#!/usr/bin/env bash
# Runs every devcoord benchmark against its peers in one go (issue 5) and prints one summary
# table: measure, devcoord, peer, ratio, goal, met?. Writes bench/results/latest.json (the
# machine, the summary and every bench's own JSON) and PNG plots made with gnuplot.
#
#   bench/run.sh [--quick] [--build DIR] [--out DIR] [--only NAME[,NAME...]] [--report]
#
# Build first (the peers need `.ci/setup-debian.sh bench`):
#   cmake -S . -B build-bench -DCMAKE_BUILD_TYPE=Release -DDEVCOORD_BENCH=ON
#   cmake --build build-bench -j2
# --quick: fewer sizes, repeats and seconds per cell (a smoke run of a few minutes).
# --out: where results go (default bench/results, git-ignored).
# NAME: allreduce, group, datalink, rpc, registry, fanout, failure, rss. --report runs nothing and rebuilds the
# summary, latest.json and plots from the results already in bench/results (an earlier run's
# group.dat copied there as group.before.dat adds its one-worker rows to group.png, dashed).
# Benchmarks never fail on a figure; the script exits non-zero only when a bench could not run.
set -uo pipefail

here=$(cd "$(dirname "$0")" && pwd)
repo=$(dirname "$here")
build=${DEVCOORD_BUILD_DIR:-$repo/build-bench}
out=$here/results
quick=()
only=allreduce,group,datalink,rpc,registry,fanout,failure,rss
report_only=0

usage() {
    sed -n '2,16p' "$0" | sed 's/^# \{0,1\}//'
    exit 2
}
while [ $# -gt 0 ]; do
    case "$1" in
    --quick) quick=(--quick) ;;
    --build) [ $# -ge 2 ] || usage; build=$2; shift ;;
    --out) [ $# -ge 2 ] || usage; out=$2; shift ;;
    --only) [ $# -ge 2 ] || usage; only=$2; shift ;;
    --report) report_only=1 ;;
    -h | --help) usage ;;
    *) echo "run.sh: unknown option '$1'" >&2; usage ;;
    esac
    shift
done
build=$(cd "$build" 2>/dev/null && pwd) || {
    echo "run.sh: no build directory; build with -DDEVCOORD_BENCH=ON first (see --help)" >&2
    exit 2
}

json_escape() {
    local s=$1
    s=${s//\\/\\\\}
    s=${s//\"/\\\"}
    s=${s//$'\t'/ }
    s=${s//$'\n'/ }
    printf '%s' "$s"
}

mkdir -p "$out" && out=$(cd "$out" && pwd) || exit 2
IFS=, read -r -a benches <<<"$only"
failed=()
if [ $report_only -eq 0 ]; then
    for b in "${benches[@]}"; do
        if [ ! -x "$build/bench/bench_$b" ]; then
            echo "run.sh: $build/bench/bench_$b missing; build with -DDEVCOORD_BENCH=ON" >&2
            exit 2
        fi
        rm -f "$out/$b.json" "$out/$b.summary.tsv" "$out/$b.txt"
    done
    started=$(date -u +%Y-%m-%dT%H:%M:%SZ)
    load_before=$(cut -d' ' -f1-3 /proc/loadavg)
    for b in "${benches[@]}"; do
        echo "==== bench_$b ${quick[*]:-}"
        # A bench stops every process it started when killed (timeout sends SIGTERM).
        timeout --kill-after=30 3600 "$build/bench/bench_$b" "${quick[@]}" --out "$out" \
            --build "$build" 2>&1 | tee "$out/$b.txt"
        rc=${PIPESTATUS[0]}
        if [ "$rc" -ne 0 ]; then
            echo "run.sh: bench_$b exited with $rc" >&2
            failed+=("$b")
        fi
    done
    load_after=$(cut -d' ' -f1-3 /proc/loadavg)
    # What --report needs to describe this run later.
    printf 'started=%q\nload_before=%q\nload_after=%q\nquick_run=%q\n' "$started" \
        "$load_before" "$load_after" "${quick[*]:-}" >"$out/run.env"
fi
started=unknown load_before=unknown load_after=unknown quick_run=
# shellcheck disable=SC1091
[ -f "$out/run.env" ] && . "$out/run.env"

# ---- summary table ---------------------------------------------------------------------------
tsv=$(mktemp)
trap 'rm -f "$tsv"' EXIT
printf 'measure\tdevcoord\tpeer\tratio\tgoal\tmet?\n' >"$tsv"
for b in "${benches[@]}"; do
    [ -f "$out/$b.summary.tsv" ] && cat "$out/$b.summary.tsv" >>"$tsv"
done
echo
echo "==== summary (ratio: devcoord/peer, or devcoord/goal where there is no peer)"
column -t -s $'\t' "$tsv"

# ---- latest.json -----------------------------------------------------------------------------
cpu=$(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -1)
mem_kib=$(sed -n 's/^MemTotal:[[:space:]]*\([0-9]*\) kB/\1/p' /proc/meminfo)
os=$(sed -n 's/^PRETTY_NAME="\(.*\)"/\1/p' /etc/os-release 2>/dev/null)
commit=$(git -C "$repo" rev-parse --short HEAD 2>/dev/null || echo unknown)
{
    printf '{\n "machine": {"cpu": "%s", "cores": %s, "memory_kib": %s, "kernel": "%s", "os": "%s"},\n' \
        "$(json_escape "$cpu")" "$(nproc)" "${mem_kib:-0}" "$(json_escape "$(uname -r)")" \
        "$(json_escape "$os")"
    printf ' "run": {"started": "%s", "quick": %s, "commit": "%s", "loadavg_before": "%s", "loadavg_after": "%s", "command": "%s"},\n' \
        "$started" "$([ -n "$quick_run" ] && echo true || echo false)" "$commit" \
        "$load_before" "$load_after" "$(json_escape "bench/run.sh $quick_run")"
    printf ' "summary": ['
    first=1
    while IFS=$'\t' read -r measure dc peer ratio goal met; do
        [ "$measure" = measure ] && continue
        [ $first -eq 1 ] || printf ','
        first=0
        printf '\n  {"measure": "%s", "devcoord": "%s", "peer": "%s", "ratio": "%s", "goal": "%s", "met": "%s"}' \
            "$(json_escape "$measure")" "$(json_escape "$dc")" "$(json_escape "$peer")" \
            "$(json_escape "$ratio")" "$(json_escape "$goal")" "$(json_escape "$met")"
    done <"$tsv"
    printf '\n ],\n "benches": {'
    first=1
    for b in "${benches[@]}"; do
        [ -f "$out/$b.json" ] || continue
        [ $first -eq 1 ] || printf ','
        first=0
        printf '\n  "%s": ' "$b"
        cat "$out/$b.json"
    done
    printf ' }\n}\n'
} >"$out/latest.json"
echo
echo "wrote $out/latest.json"

# ---- plots -----------------------------------------------------------------------------------
if command -v gnuplot >/dev/null; then
    term="pngcairo size 1000,600"
    gnuplot -e "set terminal pngcairo" >/dev/null 2>&1 || term="png size 1000,600"
    if [ -f "$out/allreduce.dat" ]; then
        gnuplot <<EOF && echo "wrote $out/allreduce.png"
set terminal $term
set output "$out/allreduce.png"
set title "All-reduce f32 sum: bus bandwidth vs size\n(devcoord time includes the submit through the coordinator)"
set xlabel "tensor size (bytes)"
set ylabel "bus bandwidth (GB/s)"
set logscale x 2
set logscale y 10
set format x "%.0b %BB"
set key right bottom
set grid
plot "$out/allreduce.dat" using 1:2 with linespoints lw 2 title "devcoord, 2 workers", \
     "" using 1:3 with linespoints lw 2 dt 2 title "gloo, 2 processes", \
     "" using 1:4 with linespoints lw 2 title "devcoord, 4 workers", \
     "" using 1:5 with linespoints lw 2 dt 2 title "gloo, 4 processes", \
     "" using 1:6 with lines lw 2 lc rgb "black" dt 3 title "loopback TCP (iperf3)"
EOF
    fi
    if [ -f "$out/group.dat" ]; then
        # What the multi-worker layouts' ranks passed (the first run is 2 ranks on 2 workers):
        # dc_group_alloc memory, or plain buffers streamed to the worker (--plain, older runs).
        multi=$(grep -o '"memory": "[^"]*"' "$out/group.json" 2>/dev/null | head -1 | cut -d'"' -f4)
        # An earlier run's group.dat copied beside it as group.before.dat: its one-worker rows
        # are drawn too, thin and dashed, for a before -> after plot.
        before=
        if [ -f "$out/group.before.dat" ]; then
            before=", \\
     \"$out/group.before.dat\" using 1:4 with linespoints lw 1 dt 4 lc 3 title \"before: 2 ranks on 1 worker\", \\
     \"\" using 1:5 with linespoints lw 1 dt 4 lc 4 title \"before: 4 ranks on 1 worker\""
        fi
        gnuplot <<EOF && echo "wrote $out/group.png"
set terminal $term
set output "$out/group.png"
set title "Group all-reduce f32 sum: rank 0's time from the call to the result in its buffer\n(one-worker layouts: dc_group_alloc; across workers: ${multi:-unknown memory})" noenhanced
set xlabel "tensor size (bytes)"
set ylabel "median time (us)"
set logscale x 2
set logscale y 10
set xtics ("4 KiB" 4096, "1 MiB" 1048576, "16 MiB" 16777216)
set xrange [2048:33554432]
set key left top
set grid
plot "$out/group.dat" using 1:2 with linespoints lw 2 title "devcoord, 2 ranks on 2 workers", \
     "" using 1:3 with linespoints lw 2 title "devcoord, 4 ranks on 4 workers", \
     "" using 1:4 with linespoints lw 2 title "devcoord, 2 ranks on 1 worker", \
     "" using 1:5 with linespoints lw 2 title "devcoord, 4 ranks on 1 worker", \
     "" using 1:6 with linespoints lw 2 dt 2 lc rgb "black" title "gloo, 2 processes", \
     "" using 1:7 with linespoints lw 2 dt 3 lc rgb "black" title "gloo, 4 processes"$before
EOF
    fi
    if [ -f "$out/fanout.dat" ]; then
        gnuplot <<EOF && echo "wrote $out/fanout.png"
set terminal $term
set output "$out/fanout.png"
set title "Fan-out: SubmitOp barrier latency vs workers"
set xlabel "workers (one cpu device each)"
set ylabel "latency (us)"
set logscale x 2
set logscale y 10
set key left top
set grid
plot "$out/fanout.dat" using 1:2 with linespoints lw 2 title "median", \
     "" using 1:3 with linespoints lw 2 dt 2 title "p99", \
     "" using 1:4 with lines lw 1 lc rgb "black" title "least-squares fit of the medians"
EOF
    fi
else
    echo "run.sh: gnuplot not found: no plots (.ci/setup-debian.sh bench)" >&2
fi

if [ ${#failed[@]} -gt 0 ]; then
    echo "run.sh: benches that did not complete: ${failed[*]}" >&2
    exit 1
fi
