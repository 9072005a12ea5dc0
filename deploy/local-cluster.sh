#!/usr/bin/env bash
# Runs the deploy/config/ cluster (one coordinator, three workers) as local processes on
# 127.0.0.1, without containers.
#
#   deploy/local-cluster.sh up       start it (says so and does nothing when already up)
#   deploy/local-cluster.sh status   pids, ports, and `devcoordctl workers list`
#   deploy/local-cluster.sh down     SIGTERM, then SIGKILL after DEVCOORD_STOP_TIMEOUT s
#
# The configs are copied to the cluster folder with only what cannot work outside a
# container rewritten: listen, advertise, coordinator and http get free 127.0.0.1 ports,
# /etc/devcoord/ paths point at deploy/config/ (tokens), state_dir at the cluster folder.
# Everything else (devices, labels, heartbeat, auth, limits, log) stays as written.
#
# Environment:
#   DEVCOORD_CLUSTER_DIR   pids, logs, rewritten configs (default <repo>/.cluster)
#   DEVCOORD_BIN_DIR       a build tree (build/server/coordinator/devcoord-server ...) or
#                          a folder holding the three programs (default <repo>/build)
#   DEVCOORD_STOP_TIMEOUT  seconds between SIGTERM and SIGKILL on down (default 10)
#   DEVCOORD_UP_TIMEOUT    seconds to wait for the cluster to be ready (default 20)
# Exit: 0 ok, 1 failure, 2 usage.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(dirname "${HERE}")"
CONFIG_DIR="${HERE}/config"
CLUSTER_DIR="${DEVCOORD_CLUSTER_DIR:-${REPO}/.cluster}"
BIN_DIR="${DEVCOORD_BIN_DIR:-${REPO}/build}"
STOP_TIMEOUT="${DEVCOORD_STOP_TIMEOUT:-10}"
UP_TIMEOUT="${DEVCOORD_UP_TIMEOUT:-20}"
# Read-only registry queries need a trainer or operator token once auth is on.
TOKEN_FILE="${CONFIG_DIR}/trainer.token"

COORDINATOR=coordinator
WORKERS=(worker-a worker-b worker-c)

log() { printf 'local-cluster: %s\n' "$*" >&2; }
die() {
    log "$*"
    exit 1
}
usage() {
    echo "usage: $0 up|down|status" >&2
    exit 2
}

# The program $1, from a build tree or a flat folder.
program() {
    local name="$1" sub
    case "${name}" in
    devcoord-server) sub=server/coordinator ;;
    devcoord-worker) sub=server/worker ;;
    devcoordctl) sub=client ;;
    esac
    if [[ -x ${BIN_DIR}/${sub}/${name} ]]; then
        echo "${BIN_DIR}/${sub}/${name}"
    elif [[ -x ${BIN_DIR}/${name} ]]; then
        echo "${BIN_DIR}/${name}"
    else
        die "no ${name} in ${BIN_DIR} (build first: cmake -S . -B build && cmake --build build, or set DEVCOORD_BIN_DIR)"
    fi
}

pid_file() { echo "${CLUSTER_DIR}/pids/$1.pid"; }

# The pid of process $1 when it runs this cluster's config, else nothing. Checking the
# command line guards against a recycled pid.
running_pid() {
    local f pid
    f="$(pid_file "$1")"
    [[ -r ${f} ]] || return 0
    pid="$(<"${f}")"
    [[ ${pid} =~ ^[0-9]+$ ]] || return 0
    if [[ -r /proc/${pid}/cmdline ]] &&
        tr '\0' ' ' <"/proc/${pid}/cmdline" | grep -qF -- "${CLUSTER_DIR}/config/$1.yaml"; then
        echo "${pid}"
    fi
}

# shellcheck source=free-port.sh
source "${HERE}/free-port.sh"

# Sets top-level key $2 of YAML file $1 to $3 (replacing the line, or appending it).
set_key() {
    local file="$1" key="$2" value="$3"
    if grep -q "^${key}:" "${file}"; then
        sed -i "s|^${key}:.*|${key}: ${value}|" "${file}"
    else
        printf '%s: %s\n' "${key}" "${value}" >>"${file}"
    fi
}

# Copies deploy/config/$1.yaml to the cluster folder with the local paths.
rewrite_common() {
    local src="${CONFIG_DIR}/$1.yaml" dst="${CLUSTER_DIR}/config/$1.yaml"
    [[ -r ${src} ]] || die "missing ${src}"
    sed -e "s|/etc/devcoord/|${CONFIG_DIR}/|g" "${src}" >"${dst}"
    echo "${dst}"
}

# Starts program $2 as process $1 with config $3, detached from this shell's session.
start() {
    local name="$1" prog="$2" cfg="$3" pid
    # 9>&-: the daemons must not hold the up/down lock.
    setsid "${prog}" --config "${cfg}" >>"${CLUSTER_DIR}/logs/${name}.log" 2>&1 </dev/null 9>&- &
    pid=$!
    echo "${pid}" >"$(pid_file "${name}")"
    log "started ${name} (pid ${pid}), log ${CLUSTER_DIR}/logs/${name}.log"
}

ctl() { "$(program devcoordctl)" -s "$(<"${CLUSTER_DIR}/address")" --token-file "${TOKEN_FILE}" "$@"; }

all_names() { echo "${COORDINATOR}" "${WORKERS[@]}"; }

# Fails (with the tail of its log) when process $1 is gone.
check_alive() {
    if [[ -z $(running_pid "$1") ]]; then
        tail -n 20 "${CLUSTER_DIR}/logs/$1.log" >&2 || true
        return 1
    fi
}

cmd_up() {
    local name n_running=0 cport chttp ports=() cfg wport whttp deadline alive
    for name in $(all_names); do
        [[ -n $(running_pid "${name}") ]] && n_running=$((n_running + 1))
    done
    if ((n_running == ${#WORKERS[@]} + 1)); then
        log "already up: coordinator $(<"${CLUSTER_DIR}/address") ($0 status for more)"
        return 0
    fi
    ((n_running == 0)) || die "partly up (${n_running} of $((${#WORKERS[@]} + 1)) processes); run '$0 down' first"

    local server worker
    server="$(program devcoord-server)"
    worker="$(program devcoord-worker)"
    program devcoordctl >/dev/null
    mkdir -p "${CLUSTER_DIR}"/{config,logs,pids,state}
    rm -f "${CLUSTER_DIR}"/pids/*.pid "${CLUSTER_DIR}/address"

    cport="$(free_port)"
    chttp="$(free_port "${cport}")"
    ports=("${cport}" "${chttp}")
    cfg="$(rewrite_common "${COORDINATOR}")"
    set_key "${cfg}" listen "tcp://127.0.0.1:${cport}"
    # Set even when absent: the coordinator's default HTTP port is a fixed one.
    set_key "${cfg}" http "127.0.0.1:${chttp}"
    if grep -q '^state_dir:' "${cfg}"; then
        set_key "${cfg}" state_dir "${CLUSTER_DIR}/state"
    fi
    echo "tcp://127.0.0.1:${cport}" >"${CLUSTER_DIR}/address"
    start "${COORDINATOR}" "${server}" "${cfg}"

    deadline=$((SECONDS + UP_TIMEOUT))
    until ctl health >/dev/null 2>&1; do
        check_alive "${COORDINATOR}" || die "the coordinator exited"
        ((SECONDS < deadline)) || die "the coordinator is not ready after ${UP_TIMEOUT} s"
        sleep 0.2
    done

    for name in "${WORKERS[@]}"; do
        wport="$(free_port "${ports[@]}")"
        whttp="$(free_port "${ports[@]}" "${wport}")"
        ports+=("${wport}" "${whttp}")
        cfg="$(rewrite_common "${name}")"
        set_key "${cfg}" coordinator "tcp://127.0.0.1:${cport}"
        set_key "${cfg}" listen "tcp://127.0.0.1:${wport}"
        set_key "${cfg}" advertise "tcp://127.0.0.1:${wport}"
        if grep -q '^http:' "${cfg}"; then
            set_key "${cfg}" http "127.0.0.1:${whttp}"
        fi
        start "${name}" "${worker}" "${cfg}"
    done

    # Ready when every worker is alive in the registry.
    until
        alive="$(ctl -o json workers list 2>/dev/null | grep -o '"state": *"alive"' | wc -l)"
        ((alive == ${#WORKERS[@]}))
    do
        for name in "${WORKERS[@]}"; do
            check_alive "${name}" || die "${name} exited"
        done
        ((SECONDS < deadline)) || die "only ${alive} of ${#WORKERS[@]} workers alive after ${UP_TIMEOUT} s"
        sleep 0.2
    done

    log "up: ${#WORKERS[@]} workers alive"
    echo "coordinator: $(<"${CLUSTER_DIR}/address")"
    echo "export DEVCOORD_ADDR=$(<"${CLUSTER_DIR}/address")"
    echo "# with auth on, pass --token-file ${TOKEN_FILE} to devcoordctl"
}

cmd_status() {
    local name pid state cfg addr up=0
    printf '%-12s %-8s %-8s %s\n' PROCESS PID STATE ADDRESSES
    for name in $(all_names); do
        pid="$(running_pid "${name}")"
        state=stopped
        [[ -n ${pid} ]] && state=running && up=$((up + 1))
        cfg="${CLUSTER_DIR}/config/${name}.yaml"
        addr=""
        if [[ -r ${cfg} ]]; then
            addr="$(grep -E '^(listen|http):' "${cfg}" | sed -E 's/^([a-z]+): *([^ #]*).*/\1=\2/' | tr '\n' ' ')"
        fi
        printf '%-12s %-8s %-8s %s\n' "${name}" "${pid:--}" "${state}" "${addr}"
    done
    if ((up == 0)); then
        echo "cluster is down (folder ${CLUSTER_DIR})"
        return 0
    fi
    echo "coordinator: $(<"${CLUSTER_DIR}/address")   logs: ${CLUSTER_DIR}/logs"
    echo
    ctl workers list || log "devcoordctl workers list failed"
}

cmd_down() {
    local name pid deadline left=() stopped=0
    # Workers first, so they deregister while the coordinator still listens.
    for name in "${WORKERS[@]}" "${COORDINATOR}"; do
        pid="$(running_pid "${name}")"
        [[ -n ${pid} ]] || continue
        kill -TERM "${pid}" 2>/dev/null || true
        deadline=$((SECONDS + STOP_TIMEOUT))
        while [[ -n $(running_pid "${name}") ]] && ((SECONDS < deadline)); do
            sleep 0.1
        done
        if [[ -n $(running_pid "${name}") ]]; then
            log "${name} (pid ${pid}) ignored SIGTERM for ${STOP_TIMEOUT} s: SIGKILL"
            kill -KILL "${pid}" 2>/dev/null || true
            left+=("${pid}")
        fi
        stopped=$((stopped + 1))
    done
    for pid in "${left[@]}"; do
        while kill -0 "${pid}" 2>/dev/null; do sleep 0.1; done
    done
    rm -f "${CLUSTER_DIR}"/pids/*.pid
    if ((stopped == 0)); then
        log "not running"
    else
        log "stopped ${stopped} processes (logs kept in ${CLUSTER_DIR}/logs)"
    fi
}

[[ $# -eq 1 ]] || usage
case "$1" in
up | down)
    # One up or down at a time per cluster folder.
    mkdir -p "${CLUSTER_DIR}"
    exec 9>"${CLUSTER_DIR}/lock"
    flock 9
    "cmd_$1"
    ;;
status) cmd_status ;;
*) usage ;;
esac
