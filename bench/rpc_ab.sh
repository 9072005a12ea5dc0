#!/usr/bin/env bash
# RPC p50 at 1 call in flight, devcoord's layer against bare nng, measured A/B interleaved
# (issue 17): on a shared machine the load drifts between cells of bench_rpc, so here every
# round runs each system once (serve + client, 64 B then 64 KiB) and the figure is the median
# of the rounds' p50s. With --before DIR, an older build's rpc_devcoord is a third system (a
# before/after of a change, under the same load).
#
#   bench/rpc_ab.sh [--rounds N] [--seconds S] [--build DIR] [--before DIR]
#
# --build: the build tree (default build-bench, as bench/run.sh); --rounds: 5; --seconds
# per cell: 2 (after 0.5 s of warmup). Prints one line per cell, then the medians and ratios.
set -uo pipefail

here=$(cd "$(dirname "$0")" && pwd)
build=${DEVCOORD_BUILD_DIR:-$(dirname "$here")/build-bench}
before=
rounds=5
seconds=2
while [ $# -gt 0 ]; do
    case "$1" in
    --rounds) rounds=$2; shift ;;
    --seconds) seconds=$2; shift ;;
    --build) build=$2; shift ;;
    --before) before=$2; shift ;;
    *) sed -n '2,11p' "$0" | sed 's/^# \{0,1\}//'; exit 2 ;;
    esac
    shift
done
systems=(nng devcoord)
declare -A bin=([nng]=$build/bench/nng_echo [devcoord]=$build/bench/rpc_devcoord)
if [ -n "$before" ]; then
    systems+=(before)
    bin[before]=$before/bench/rpc_devcoord
fi
for s in "${systems[@]}"; do
    [ -x "${bin[$s]}" ] || { echo "rpc_ab.sh: ${bin[$s]} missing" >&2; exit 2; }
done

free_port() {
    python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

results=$(mktemp)
trap 'rm -f "$results"' EXIT
for r in $(seq 1 "$rounds"); do
    for s in "${systems[@]}"; do
        port=$(free_port)
        "${bin[$s]}" serve "tcp://127.0.0.1:$port" >/dev/null 2>&1 &
        server=$!
        sleep 0.3
        for payload in 64 65536; do
            p50=$("${bin[$s]}" client "tcp://127.0.0.1:$port" 1 "$payload" "$seconds" 0.5 2>&1 |
                sed -n 's/.*p50_us=\([0-9.]*\).*/\1/p')
            echo "round $r $s $payload ${p50:-failed}" | tee -a "$results"
        done
        kill "$server" 2>/dev/null
        wait "$server" 2>/dev/null
    done
done
echo
echo "median over $rounds rounds of each round's p50 (us), 1 call in flight; load now: $(cut -d' ' -f1-3 /proc/loadavg)"
python3 - "$results" <<'EOF'
import statistics, sys
cells = {}
for line in open(sys.argv[1]):
    _, _, system, payload, p50 = line.split()
    if p50 != "failed":
        cells.setdefault((system, payload), []).append(float(p50))
for payload in ("64", "65536"):
    nng = cells.get(("nng", payload))
    base = statistics.median(nng) if nng else None
    for system in ("nng", "devcoord", "before"):
        v = cells.get((system, payload))
        if not v:
            continue
        m = statistics.median(v)
        ratio = f"{m / base:.2f}x nng" if base else "-"
        print(f"{payload:>6} B  {system:<9} {m:8.1f}  {ratio}")
EOF
