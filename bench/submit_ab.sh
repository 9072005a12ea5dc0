#!/usr/bin/env bash
# SubmitOp all-reduce of 4 KiB over 2 workers (issue 17's single-controller small-op row),
# two builds measured A/B interleaved: on a shared machine the load drifts between runs, so
# every round runs each build once (its own coordinator and workers, bench_allreduce
# --small) and the figure is the median of the rounds' medians.
#
#   bench/submit_ab.sh --before DIR [--build DIR] [--rounds N] [--reps N] [--workers N]
#                      [--bytes B]
# --build: the build tree under test (default build-bench, as bench/run.sh); --before: the
# other one (both configured with -DDEVCOORD_BENCH=ON); --rounds: 5; --reps per run: 300;
# --workers: 2 (up to 4); --bytes: the tensor's size, 4096 (both builds must know --bytes).
set -uo pipefail

here=$(cd "$(dirname "$0")" && pwd)
build=${DEVCOORD_BUILD_DIR:-$(dirname "$here")/build-bench}
before=
rounds=5
reps=300
workers=2
bytes=4096
while [ $# -gt 0 ]; do
    case "$1" in
    --rounds) rounds=$2; shift ;;
    --reps) reps=$2; shift ;;
    --workers) workers=$2; shift ;;
    --bytes) bytes=$2; shift ;;
    --build) build=$2; shift ;;
    --before) before=$2; shift ;;
    *) sed -n '2,11p' "$0" | sed 's/^# \{0,1\}//'; exit 2 ;;
    esac
    shift
done
[ -n "$before" ] || { sed -n '2,11p' "$0" | sed 's/^# \{0,1\}//'; exit 2; }
declare -A tree=([after]=$build [before]=$before)
for s in before after; do
    [ -x "${tree[$s]}/bench/bench_allreduce" ] ||
        { echo "submit_ab.sh: ${tree[$s]}/bench/bench_allreduce missing" >&2; exit 2; }
done

results=$(mktemp)
trap 'rm -f "$results"' EXIT
for r in $(seq 1 "$rounds"); do
    # Alternate which goes first, so neither always runs on the warmer machine.
    order="before after"
    [ $((r % 2)) -eq 0 ] && order="after before"
    for s in $order; do
        line=$("${tree[$s]}/bench/bench_allreduce" --build "${tree[$s]}" --small "$reps" --workers "$workers" \
            --bytes "$bytes" 2>&1 |
            grep '^submit all-reduce')
        med=$(sed -n 's/.*median_us=\([0-9.]*\).*/\1/p' <<<"$line")
        echo "round $r $s ${med:-failed}  ($line)"
        echo "$s ${med:-nan}" >>"$results"
    done
done
echo
python3 - "$results" <<'PY'
import statistics, sys
v = {}
for line in open(sys.argv[1]):
    s, x = line.split()
    if x != "nan":
        v.setdefault(s, []).append(float(x))
m = {s: statistics.median(x) for s, x in v.items()}
for s in ("before", "after"):
    if s in m:
        print("%-6s median of %d rounds: %.1f us (rounds: %s)" % (
            s, len(v[s]), m[s], " / ".join("%.0f" % x for x in v[s])))
if "before" in m and "after" in m:
    print("after / before: %.2fx" % (m["after"] / m["before"]))
PY
