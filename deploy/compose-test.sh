#!/usr/bin/env bash
# CI test of the compose deployment (issue 7), on a Docker host without any registry:
#   1. builds the base image (deploy/base-image.sh; kept when it exists) and the product
#      image (deploy/Dockerfile, from source),
#   2. `docker-compose up -d` under a unique project name and waits until the coordinator
#      and the three workers are healthy; checks the ports published on 127.0.0.1,
#   3. puts a tensor on a cuda device of every worker, all-reduces it with devcoordctl
#      from a container on the compose network and checks every result,
#   4. `docker kill`s a worker and measures the time until the registry says `dead`
#      (must fall inside the heartbeat window of deploy/config/coordinator.yaml), checks
#      that ops naming it are refused, `docker start`s it and waits for `alive`,
#   5. checks auth: no token, an unknown token and a worker token are refused,
#   6. profile `ha` (issue 16): etcd and three coordinators; exactly one leads, the others
#      refuse naming it; `docker kill`s the leader and measures the time until another
#      leads; `docker start`s it and waits until it follows the new leader,
#   7. `docker-compose down -v`.
# Cleanup (down -v, one-off containers, the network) runs on every exit; on failure the
# containers' state and logs are printed first. Run as root from anywhere.
#
# Environment: DEVCOORD_IMAGE (default devcoord:dev), BASE_IMAGE (default
# devcoord-base:bookworm), DEVCOORD_TEST_TIMEOUT seconds per wait (default 90),
# DEVCOORD_NO_CACHE=1 builds the image without the layer cache (a cold CI build).
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(dirname "${HERE}")"
IMAGE="${DEVCOORD_IMAGE:-devcoord:dev}"
BASE_IMAGE="${BASE_IMAGE:-devcoord-base:bookworm}"
TIMEOUT="${DEVCOORD_TEST_TIMEOUT:-90}"
PROJECT="devcoord-ci-$$-${RANDOM}"
WORKERS=(worker-a worker-b worker-c)
VICTIM=worker-c
TRAINER=/etc/devcoord/trainer.token

START_MS=0
declare -A TIMES=()
now_ms() { date +%s%3N; }
log() {
    local ms=$(($(now_ms) - START_MS))
    printf '[compose-test %3d.%ds] %s\n' $((ms / 1000)) $((ms % 1000 / 100)) "$*" >&2
}
die() {
    log "FAIL: $*"
    exit 1
}
START_MS="$(now_ms)"

compose() {
    DEVCOORD_IMAGE="${IMAGE}" DEVCOORD_BASE_IMAGE="${BASE_IMAGE}" \
        DEVCOORD_PORT="${PORT}" DEVCOORD_HTTP_PORT="${HTTP_PORT}" \
        docker-compose --ansi never -p "${PROJECT}" -f "${HERE}/compose.yaml" "$@"
}
cid() { compose ps -q "$1"; }
# devcoordctl with the trainer token inside worker-a's container (it holds that token
# and resolves every advertised address).
ctl() { compose exec -T worker-a devcoordctl -s tcp://coordinator:7400 --token-file "${TRAINER}" "$@"; }

cleanup() {
    local rc=$?
    trap - EXIT INT TERM
    if ((rc != 0)) && [[ -n ${PORT:-} ]]; then
        log "state of project ${PROJECT} after the failure:"
        compose ps >&2 || true
        for c in $(compose ps -q 2>/dev/null); do
            docker inspect -f '{{.Name}} health: {{if .State.Health}}{{.State.Health.Status}} {{range .State.Health.Log}}[exit {{.ExitCode}}: {{.Output}}] {{end}}{{end}}' "${c}" >&2 || true
        done
        compose logs --no-color --tail=100 >&2 || true
    fi
    if [[ -n ${PORT:-} ]]; then
        log "docker-compose down -v"
        compose --profile tools --profile ha down -v --remove-orphans --timeout 10 >/dev/null 2>&1 ||
            log "down failed; remove project ${PROJECT} by hand"
    fi
    if ((rc == 0)); then
        log "PASS in $((($(now_ms) - START_MS) / 1000)) s"
    else
        log "FAILED (exit ${rc})"
    fi
    exit "${rc}"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# shellcheck source=free-port.sh
source "${HERE}/free-port.sh"

# Waits until $2 (a command) succeeds, for at most TIMEOUT s; $1 names what is awaited.
wait_for() {
    local what="$1" deadline=$((SECONDS + TIMEOUT))
    shift
    until "$@" >/dev/null 2>&1; do
        ((SECONDS < deadline)) || die "timed out after ${TIMEOUT} s waiting for ${what}"
        sleep 0.5
    done
}

all_healthy() {
    local c n=0
    for c in $(compose ps -q); do
        [[ $(docker inspect -f '{{if .State.Health}}{{.State.Health.Status}}{{end}}' "${c}") == healthy ]] || return 1
        n=$((n + 1))
    done
    ((n == 1 + ${#WORKERS[@]}))
}

healthy() { [[ $(docker inspect -f '{{.State.Health.Status}}' "$(cid "$1")") == healthy ]]; }

# The "values" array of a `tensor get -o json` document, e.g. [1111,2222,3333].
values_of() { grep -o '"values": *\[[^]]*\]' | sed 's/.*\[/[/; s/ //g'; }

# ---- 1. images -------------------------------------------------------------------------
[[ ${EUID} -eq 0 ]] || die "must run as root (the base image is built with debootstrap)"
command -v docker-compose >/dev/null || die "docker-compose not found (bash .ci/setup-debian.sh docker)"
docker info >/dev/null 2>&1 || die "docker engine not reachable"

t="$(now_ms)"
BASE_IMAGE="${BASE_IMAGE}" bash "${HERE}/base-image.sh" >/dev/null
TIMES[base]=$(($(now_ms) - t))
log "base image ${BASE_IMAGE} ready ($((TIMES[base] / 1000)) s)"

t="$(now_ms)"
build_log="$(mktemp)"
no_cache=()
[[ ${DEVCOORD_NO_CACHE:-0} == 1 ]] && no_cache=(--no-cache)
if ! docker build -q --force-rm "${no_cache[@]}" -f "${HERE}/Dockerfile" --build-arg "BASE=${BASE_IMAGE}" -t "${IMAGE}" \
    "${REPO}" >"${build_log}" 2>&1; then
    tail -n 40 "${build_log}" >&2
    rm -f "${build_log}"
    die "docker build failed"
fi
rm -f "${build_log}"
TIMES[build]=$(($(now_ms) - t))
log "image ${IMAGE} built ($((TIMES[build] / 1000)) s)"

# ---- 2. up, healthy, published ports ---------------------------------------------------
PORT="$(free_port)"
HTTP_PORT="$(free_port "${PORT}")"
compose config -q || die "docker-compose rejects compose.yaml"
t="$(now_ms)"
log "docker-compose -p ${PROJECT} up -d (coordinator on 127.0.0.1:${PORT}, http ${HTTP_PORT})"
compose up -d --no-build >/dev/null 2>&1 || {
    compose up -d --no-build || true
    die "docker-compose up failed"
}
wait_for "all four containers healthy" all_healthy
TIMES[up]=$(($(now_ms) - t))
log "coordinator and ${#WORKERS[@]} workers healthy ($((TIMES[up] / 1000)) s after up)"

# The RPC port from the host (a host-network container: the host may have no build).
docker run --rm --network host -v "${HERE}/config/worker.token:/t:ro" "${IMAGE}" \
    devcoordctl -s "tcp://127.0.0.1:${PORT}" --token-file /t health >/dev/null ||
    die "devcoordctl health through the published port 127.0.0.1:${PORT} failed"
# The HTTP port from the host: /readyz says ready.
exec 3<>"/dev/tcp/127.0.0.1/${HTTP_PORT}" || die "nothing on the published HTTP port ${HTTP_PORT}"
printf 'GET /readyz HTTP/1.0\r\nHost: localhost\r\n\r\n' >&3
readyz="$(cat <&3)"
exec 3<&-
[[ ${readyz} == "HTTP/1."?" 200"* ]] || die "GET /readyz on 127.0.0.1:${HTTP_PORT}: ${readyz%%$'\r'*}"
! docker port "$(cid coordinator)" | grep -qv '127\.0\.0\.1:' ||
    die "a port is published beyond 127.0.0.1: $(docker port "$(cid coordinator)")"
log "published ports answer on 127.0.0.1 (RPC health, GET /readyz 200)"
for s in coordinator "${WORKERS[@]}"; do
    uid="$(compose exec -T "${s}" id -u)"
    [[ ${uid} == 10001 ]] || die "${s} runs as uid ${uid}, not 10001"
done
log "all four daemons run as uid 10001"

# ---- 3. tensors and an all-reduce across the three worker containers ---------------------
t="$(now_ms)"
out="$(compose run --rm -T --entrypoint bash ctl -s 2>&1 <<'EOF'
set -euo pipefail
c() { devcoordctl --token-file /etc/devcoord/trainer.token "$@"; }
c tensor put worker-a/cuda:0 grad --dtype f32 --values 1,2,3
c tensor put worker-a/cuda:1 grad --dtype f32 --values 10,20,30
c tensor put worker-b/cuda:0 grad --dtype f32 --values 100,200,300
c tensor put worker-c/cuda:0 grad --dtype f32 --values 1000,2000,3000
echo "SUBMIT $(c -o json submit --op all-reduce --reduce sum --tensor grad \
    --devices worker-a/cuda:0,worker-a/cuda:1,worker-b/cuda:0,worker-c/cuda:0)"
for d in worker-a/cuda:0 worker-a/cuda:1 worker-b/cuda:0 worker-c/cuda:0; do
    echo "GET ${d} $(c -o json tensor get "${d}" grad)"
done
EOF
)" || {
    printf '%s\n' "${out}" >&2
    die "the all-reduce client failed"
}
submit="$(grep '^SUBMIT ' <<<"${out}")"
[[ ${submit} == *'"status":"OK"'* ]] || die "all-reduce not OK: ${submit}"
for w in "${WORKERS[@]}"; do
    [[ ${submit} == *"{\"name\":\"${w}\",\"status\":\"OK\""* ]] || die "${w} did not answer OK: ${submit}"
done
for d in worker-a/cuda:0 worker-a/cuda:1 worker-b/cuda:0 worker-c/cuda:0; do
    got="$(grep "^GET ${d} " <<<"${out}" | values_of)"
    [[ ${got} == "[1111,2222,3333]" ]] || die "${d} holds ${got:-nothing} after the all-reduce, expected [1111,2222,3333]"
done
TIMES[allreduce]=$(($(now_ms) - t))
log "all-reduce (sum) over 4 cuda devices on 3 worker containers: every device holds [1111,2222,3333]"

# ---- 4. kill a worker: dead within the window, refused in ops, back after start ---------
interval_ms="$(grep -o 'interval_ms: *[0-9]*' "${HERE}/config/coordinator.yaml" | grep -o '[0-9]*$')"
dead_after_ms="$(grep -o 'dead_after_ms: *[0-9]*' "${HERE}/config/coordinator.yaml" | grep -o '[0-9]*$')"
[[ -n ${interval_ms} && -n ${dead_after_ms} ]] || die "no heartbeat settings in coordinator.yaml"
epoch_before="$(ctl -o json workers show "${VICTIM}" | grep -o '"epoch": *[0-9]*' | grep -o '[0-9]*$')"

# The poller runs inside worker-a and stamps the moment it first sees `dead`, so neither
# `docker exec` start-up nor polling from the host adds to the measured time.
poll_log="$(mktemp)"
# shellcheck disable=SC2016 # $(...) and $_ expand inside the container
compose exec -T worker-a bash -c '
    for _ in $(seq 1 400); do
        if devcoordctl -s tcp://coordinator:7400 --token-file '"${TRAINER}"' -o json \
               workers show '"${VICTIM}"' | grep -q "\"state\": *\"dead\""; then
            date +%s%3N; exit 0
        fi
        sleep 0.05
    done
    exit 1' >"${poll_log}" 2>&1 &
poller=$!
sleep 1 # the poller is running and sees the worker alive
victim_id="$(cid "${VICTIM}")"
kill_ms="$(now_ms)"
docker kill "${victim_id}" >/dev/null
killed_ms="$(now_ms)"
wait "${poller}" || {
    cat "${poll_log}" >&2
    rm -f "${poll_log}"
    die "${VICTIM} not dead in the registry 20 s after docker kill"
}
dead_ms="$(tail -n 1 "${poll_log}")"
rm -f "${poll_log}"
# The worker died somewhere between kill_ms and killed_ms (`docker kill` takes a few
# hundred ms on a loaded machine), so the kill -> dead time lies in [early, late] ms.
early=$((dead_ms - killed_ms))
late=$((dead_ms - kill_ms))
TIMES[dead]=${late}
# Dead means silent for dead_after_ms since the last heartbeat, which came at most one
# interval (plus its round trip and scheduling jitter: 500 ms) before the kill; 500 ms
# above cover the coordinator's sweep tick and the polling.
lo=$((dead_after_ms - interval_ms - 500))
hi=$((dead_after_ms + 500))
((early <= hi && late >= lo)) ||
    die "${VICTIM} dead ${early}-${late} ms after docker kill, outside [${lo}, ${hi}] ms (heartbeat ${interval_ms} ms, dead after ${dead_after_ms} ms)"
log "docker kill ${VICTIM} -> dead in the registry after ${early}-${late} ms (docker kill took $((killed_ms - kill_ms)) ms; window [${lo}, ${hi}] ms)"
[[ $(docker inspect -f '{{.State.Running}}' "${victim_id}") == false ]] ||
    die "${VICTIM} runs again: restart policy after docker kill?"

rc=0
refused="$(ctl -o json submit --op all-reduce --reduce sum --tensor grad \
    --devices "worker-a/cuda:0,${VICTIM}/cuda:0" 2>&1)" || rc=$?
[[ ${rc} == 1 && ${refused} == *'"status":"UNAVAILABLE"'* && ${refused} == *"worker ${VICTIM} is dead"* ]] ||
    die "an op on the dead ${VICTIM} was not refused with UNAVAILABLE (exit ${rc}): ${refused}"
log "an all-reduce naming dead ${VICTIM} is refused: UNAVAILABLE, worker ${VICTIM} is dead"

t="$(now_ms)"
docker start "${victim_id}" >/dev/null
victim_alive() { ctl -o json workers show "${VICTIM}" | grep -q '"state": *"alive"'; }
wait_for "${VICTIM} alive again" victim_alive
TIMES[alive]=$(($(now_ms) - t))
epoch_after="$(ctl -o json workers show "${VICTIM}" | grep -o '"epoch": *[0-9]*' | grep -o '[0-9]*$')"
((epoch_after > epoch_before)) || die "${VICTIM} alive again but its epoch did not grow (${epoch_before} -> ${epoch_after})"
wait_for "${VICTIM} healthy again" healthy "${VICTIM}"
log "docker start ${VICTIM} -> alive after ${TIMES[alive]} ms, new epoch ${epoch_after} (was ${epoch_before}), healthy"

# The restarted worker lost its tensors (host executor, memory only): a new op works.
compose run --rm -T --entrypoint bash ctl -s >/dev/null 2>&1 <<'EOF' || die "all-reduce after the restart failed"
set -euo pipefail
c() { devcoordctl --token-file /etc/devcoord/trainer.token "$@"; }
c tensor put worker-a/cuda:0 g2 --dtype i32 --values 1,2
c tensor put worker-b/cuda:0 g2 --dtype i32 --values 3,4
c tensor put worker-c/cuda:0 g2 --dtype i32 --values 5,6
c -o json submit --op all-reduce --reduce max --tensor g2 \
    --devices worker-a/cuda:0,worker-b/cuda:0,worker-c/cuda:0 | grep -q '"status":"OK"'
c -o json tensor get worker-a/cuda:0 g2 | grep -q '"values": *\[5, *6\]'
EOF
log "all-reduce (max) across the three workers after the restart: OK"

# ---- 5. auth ---------------------------------------------------------------------------
# From inside worker-a: no token and an unknown one (the container's host name) are
# UNAUTHENTICATED; the worker's own token may not read the registry (PERMISSION_DENIED).
# The workers' data-plane auth is not reached this way: devcoordctl resolves devices
# through the coordinator first.
auth_fail=()
auth_case() { # expected-code description devcoordctl-arguments...
    local want="$1" what="$2" rc=0 got
    shift 2
    got="$(compose exec -T worker-a devcoordctl -s tcp://coordinator:7400 "$@" 2>&1)" || rc=$?
    [[ ${rc} == 1 && ${got} == *"devcoordctl: ${want}"* ]] ||
        auth_fail+=("${what}: expected exit 1 and ${want}, got exit ${rc}: ${got}")
}
auth_case UNAUTHENTICATED "no token" workers list
auth_case UNAUTHENTICATED "unknown token" --token-file /etc/hostname workers list
auth_case PERMISSION_DENIED "worker token on ListWorkers" --token-file /etc/devcoord/worker.token workers list
auth_case PERMISSION_DENIED "worker token on SubmitOp" --token-file /etc/devcoord/worker.token \
    submit --op all-reduce --reduce sum --tensor grad --devices worker-a/cuda:0,worker-b/cuda:0
if ((${#auth_fail[@]})); then
    printf '  %s\n' "${auth_fail[@]}" >&2
    die "auth checks failed (${#auth_fail[@]} of 4)"
fi
log "auth: no token / unknown token UNAUTHENTICATED, worker token PERMISSION_DENIED for ListWorkers and SubmitOp"

# ---- 6. profile ha: etcd and three coordinators; the leader killed ----------------------
HA=(coordinator-1 coordinator-2 coordinator-3)
WORKER_TOKEN=/etc/devcoord/worker.token
t="$(now_ms)"
compose --profile ha up -d --no-build etcd "${HA[@]}" >/dev/null 2>&1 || {
    compose --profile ha up -d --no-build etcd "${HA[@]}" || true
    die "docker-compose --profile ha up failed"
}
ha_healthy() {
    local s
    for s in etcd "${HA[@]}"; do healthy "${s}" || return 1; done
}
wait_for "etcd and the three HA coordinators healthy" ha_healthy
TIMES[ha_up]=$(($(now_ms) - t))
# `health` against one coordinator, from inside coordinator $1: 0 only from the leader.
ha_health() { compose exec -T "$1" devcoordctl -s "tcp://$2:7400" --token-file "${WORKER_TOKEN}" --timeout 2s health 2>&1; }
# The one HA coordinator answering as leader, asked from inside $1 (exit 1: none or several).
ha_leader() {
    local s found=()
    for s in "${HA[@]}"; do
        [[ ${s} == "${2:-}" ]] && continue
        ha_health "$1" "${s}" >/dev/null && found+=("${s}")
    done
    ((${#found[@]} == 1)) && echo "${found[0]}"
}
leader="$(ha_leader coordinator-1)" || die "not exactly one HA coordinator answers as leader"
for s in "${HA[@]}"; do
    [[ ${s} == "${leader}" ]] && continue
    out="$(ha_health coordinator-1 "${s}")" && die "follower ${s} answered health as a leader"
    [[ ${out} == *"UNAVAILABLE"*"leader: tcp://${leader}:7400"* ]] ||
        die "follower ${s} does not name the leader ${leader}: ${out}"
done
log "profile ha up in $((TIMES[ha_up] / 1000)) s: ${leader} leads, the two followers refuse naming it"
via=coordinator-1
[[ ${leader} == coordinator-1 ]] && via=coordinator-2
kill_ms="$(now_ms)"
docker kill "$(cid "${leader}")" >/dev/null
new_leader() { ha_leader "${via}" "${leader}" >/dev/null; }
wait_for "a new leader after docker kill ${leader}" new_leader
TIMES[ha_failover]=$(($(now_ms) - kill_ms))
new="$(ha_leader "${via}" "${leader}")"
log "docker kill ${leader} -> ${new} leads after ${TIMES[ha_failover]} ms (lease 3000 ms)"
docker start "$(cid "${leader}")" >/dev/null
follows_new() { [[ $(ha_health "${via}" "${leader}") == *"leader: tcp://${new}:7400"* ]]; }
wait_for "${leader} back as a follower of ${new}" follows_new
log "docker start ${leader} -> a follower of ${new}"

# ---- 7. summary (down -v runs in cleanup) ------------------------------------------------
printf '  %-34s %7d ms\n' >&2 \
    "base image (built or found)" "${TIMES[base]}" \
    "docker build" "${TIMES[build]}" \
    "up -d until all healthy" "${TIMES[up]}" \
    "tensor puts + all-reduce + gets" "${TIMES[allreduce]}" \
    "docker kill -> dead (upper bound)" "${TIMES[dead]}" \
    "docker start -> alive in registry" "${TIMES[alive]}" \
    "profile ha: up until healthy" "${TIMES[ha_up]}" \
    "profile ha: kill leader -> new leader" "${TIMES[ha_failover]}"

