#!/usr/bin/env bash
# Sets up a fresh Debian bookworm machine, builds devcoord, and runs a coordinator and one
# worker on their defaults (coordinator tcp://127.0.0.1:7400, http 127.0.0.1:7480; worker
# with one cpu:0 device on tcp://127.0.0.1:7500), then shows the registry.
#   bash deploy/quickstart.sh          start (or show, when already running)
#   bash deploy/quickstart.sh stop     stop both
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
dir=$root/.cluster/quickstart
ctl=$root/build/client/devcoordctl

running() { [ -f "$dir/$1.pid" ] && kill -0 "$(cat "$dir/$1.pid")" 2>/dev/null; }

stop() {
    for p in worker coordinator; do
        if running "$p"; then
            kill -TERM "$(cat "$dir/$p.pid")"
            for _ in $(seq 50); do running "$p" || break; sleep 0.1; done
            running "$p" && kill -KILL "$(cat "$dir/$p.pid")"
            echo "stopped $p"
        fi
        rm -f "$dir/$p.pid"
    done
}

if [ "${1:-start}" = stop ]; then
    stop
    exit 0
fi

bash .ci/setup-debian.sh build
cmake -S . -B build -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build build -j"$(nproc)"
mkdir -p "$dir"

if ! running coordinator; then
    # Detached from this shell: they outlive it and do not hold its output open.
    setsid build/server/coordinator/devcoord-server </dev/null >/dev/null 2>"$dir/coordinator.log" &
    echo $! >"$dir/coordinator.pid"
fi
for _ in $(seq 100); do "$ctl" health >/dev/null 2>&1 && break; sleep 0.1; done
if ! "$ctl" health >/dev/null 2>&1; then
    echo "the coordinator did not come up; its log:" >&2
    tail -20 "$dir/coordinator.log" >&2
    exit 1
fi
if ! running worker; then
    setsid build/server/worker/devcoord-worker </dev/null >/dev/null 2>"$dir/worker.log" &
    echo $! >"$dir/worker.pid"
fi
for _ in $(seq 100); do
    [ "$("$ctl" -o json devices list 2>/dev/null | grep -c '"name"')" -gt 0 ] && break
    sleep 0.1
done

echo
echo "devcoord is running (logs in $dir):"
echo
"$ctl" status
echo
"$ctl" workers list
echo
"$ctl" devices list
device=$("$ctl" -o json devices list | sed -n 's/[^[]*\[{"name":"\([^"]*\)".*/\1/p')
cat <<MSG

Try:  build/client/devcoordctl tensor put $device x --dtype f32 --values 1,2,3
      build/client/devcoordctl submit --op all-reduce --reduce sum --tensor x --devices $device
      build/client/devcoordctl --help
Stop: bash deploy/quickstart.sh stop
MSG
