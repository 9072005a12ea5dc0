#!/usr/bin/env bash
# Sets up a fresh Debian bookworm machine, builds devcoord, and runs the cluster the README's
# tour uses (deploy/config/quickstart/): a coordinator on tcp://127.0.0.1:7400 (HTTP
# 127.0.0.1:7480) and two workers, node-a and node-b, with two cuda devices each, on free
# ports. The built-in host executor keeps "cuda" tensors in host memory: no GPU is needed.
# Then it shows the registry.
#   bash deploy/quickstart.sh          start (or show, when already running)
#   bash deploy/quickstart.sh stop     stop all three
#
# deploy/compose.yaml publishes its coordinator on 7401 and 7481: both run side by side.
# When 7400 or 7480 is taken by something else, move the quickstart with
# DEVCOORD_QUICKSTART_PORT and DEVCOORD_QUICKSTART_HTTP_PORT (then point devcoordctl at it:
# export DEVCOORD_ADDR=127.0.0.1:PORT).
#
# Environment:
#   DEVCOORD_QUICKSTART_PORT       the coordinator's port (default 7400)
#   DEVCOORD_QUICKSTART_HTTP_PORT  its HTTP port (default 7480)
#   DEVCOORD_QUICKSTART_DIR        pids, logs and configs (default <repo>/.cluster/quickstart)
#   DEVCOORD_BIN_DIR               a build tree to run as it is: no setup, no build
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
port=${DEVCOORD_QUICKSTART_PORT:-7400}
http_port=${DEVCOORD_QUICKSTART_HTTP_PORT:-7480}
dir=${DEVCOORD_QUICKSTART_DIR:-$root/.cluster/quickstart}
bin=${DEVCOORD_BIN_DIR:-$root/build}
configs=$root/deploy/config/quickstart
addr=tcp://127.0.0.1:$port
ctl=$bin/client/devcoordctl
workers=(node-a node-b)

die() {
    echo "quickstart: $*" >&2
    exit 1
}
# shellcheck source=free-port.sh
source "$root/deploy/free-port.sh"

# The pid of process $1 while it runs this quickstart's config (a recycled pid does not).
pid_of() {
    local f=$dir/$1.pid pid
    [[ -r $f ]] || return 0
    pid=$(<"$f")
    [[ $pid =~ ^[0-9]+$ ]] || return 0
    if [[ -r /proc/$pid/cmdline ]] &&
        tr '\0' ' ' <"/proc/$pid/cmdline" | grep -qF -- "$dir/$1.yaml"; then
        echo "$pid"
    fi
}

stop() {
    local name pid
    # Workers first: they deregister while the coordinator still listens.
    for name in "${workers[@]}" coordinator; do
        pid=$(pid_of "$name")
        if [[ -n $pid ]]; then
            kill -TERM "$pid" 2>/dev/null || true
            for _ in $(seq 100); do
                [[ -n $(pid_of "$name") ]] || break
                sleep 0.1
            done
            if [[ -n $(pid_of "$name") ]]; then
                kill -KILL "$pid" 2>/dev/null || true
            fi
            echo "stopped $name"
        fi
        rm -f "$dir/$name.pid"
    done
}

# Starts $1 (program $2, config $3) detached from this shell: it outlives it and does not
# hold its output open.
start() {
    setsid "$2" --config "$3" </dev/null >>"$dir/$1.log" 2>&1 &
    echo $! >"$dir/$1.pid"
}

listening() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

alive_workers() {
    "$ctl" -s "$addr" -o json workers list 2>/dev/null | grep -o '"state":"alive"' | wc -l
}

case "${1:-start}" in
stop)
    stop
    exit 0
    ;;
start) ;;
*)
    echo "usage: $0 [start|stop]" >&2
    exit 2
    ;;
esac

if [[ -z ${DEVCOORD_BIN_DIR:-} ]]; then
    bash .ci/setup-debian.sh build
    cmake -S . -B build -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
    cmake --build build -j"$(nproc)"
fi
[[ -x $ctl ]] || die "no devcoordctl in $bin/client (build first, or fix DEVCOORD_BIN_DIR)"
mkdir -p "$dir"

if [[ -z $(pid_of coordinator) ]]; then
    for p in "$port" "$http_port"; do
        if listening "$p"; then
            die "127.0.0.1:$p is taken: run with DEVCOORD_QUICKSTART_PORT=7410" \
                "DEVCOORD_QUICKSTART_HTTP_PORT=7490 (other free ports will do), or stop what" \
                "listens there"
        fi
    done
    sed -e "s|^listen:.*|listen: $addr|" -e "s|^http:.*|http: 127.0.0.1:$http_port|" \
        "$configs/coordinator.yaml" >"$dir/coordinator.yaml"
    start coordinator "$bin/server/coordinator/devcoord-server" "$dir/coordinator.yaml"
fi
for _ in $(seq 100); do
    "$ctl" -s "$addr" --timeout 1s health >/dev/null 2>&1 && break
    sleep 0.1
done
if ! "$ctl" -s "$addr" --timeout 1s health >/dev/null 2>&1; then
    echo "quickstart: the coordinator did not come up; its log:" >&2
    tail -20 "$dir/coordinator.log" >&2
    exit 1
fi

taken=("$port" "$http_port")
for w in "${workers[@]}"; do
    [[ -z $(pid_of "$w") ]] || continue
    wport=$(free_port "${taken[@]}")
    taken+=("$wport")
    cp "$configs/$w.yaml" "$dir/$w.yaml"
    printf 'coordinator: %s\nlisten: tcp://127.0.0.1:%s\nadvertise: tcp://127.0.0.1:%s\n' \
        "$addr" "$wport" "$wport" >>"$dir/$w.yaml"
    start "$w" "$bin/server/worker/devcoord-worker" "$dir/$w.yaml"
done
for _ in $(seq 100); do
    [[ $(alive_workers) -eq ${#workers[@]} ]] && break
    sleep 0.1
done
if [[ $(alive_workers) -ne ${#workers[@]} ]]; then
    echo "quickstart: the workers did not register; their logs:" >&2
    for w in "${workers[@]}"; do tail -10 "$dir/$w.log" >&2; done
    exit 1
fi

echo
echo "devcoord is running: coordinator $addr (HTTP 127.0.0.1:$http_port), workers" \
    "${workers[*]}; logs in $dir"
echo
"$ctl" -s "$addr" status
echo
"$ctl" -s "$addr" workers list
echo
"$ctl" -s "$addr" devices list
echo
if [[ $port != 7400 ]]; then
    echo "devcoordctl looks for 127.0.0.1:7400 unless told: export DEVCOORD_ADDR=$addr"
fi
echo "Next: the tour in README.md (\"A tour\"), from this folder: $root"
if [[ -n ${DEVCOORD_QUICKSTART_DIR:-} ]]; then
    echo "Stop: DEVCOORD_QUICKSTART_DIR=$dir bash deploy/quickstart.sh stop"
else
    echo "Stop: bash deploy/quickstart.sh stop"
fi
