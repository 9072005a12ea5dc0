#!/usr/bin/env bash
# Integration test of deploy/local-cluster.sh: brings the deploy/config/ cluster up as
# local processes in a temporary folder, checks `up` twice and `status`, puts a tensor on
# a cuda device of every worker, all-reduces it (mean) with devcoordctl, checks every
# result, and always takes the cluster down again.
#
# Environment: DEVCOORD_BIN_DIR as for local-cluster.sh (default <repo>/build).
# Registered with ctest, e.g.:
#   add_test(NAME integration.local_cluster
#            COMMAND bash ${CMAKE_SOURCE_DIR}/deploy/local-cluster-test.sh)
#   set_tests_properties(integration.local_cluster PROPERTIES
#            ENVIRONMENT "DEVCOORD_BIN_DIR=${CMAKE_BINARY_DIR}")
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(dirname "${HERE}")"
BIN_DIR="${DEVCOORD_BIN_DIR:-${REPO}/build}"
export DEVCOORD_BIN_DIR="${BIN_DIR}"
DEVCOORD_CLUSTER_DIR="$(mktemp -d "${TMPDIR:-/tmp}/devcoord-cluster.XXXXXX")"
export DEVCOORD_CLUSTER_DIR
CLUSTER="${HERE}/local-cluster.sh"

fail() {
    echo "local-cluster-test: FAIL: $*" >&2
    exit 1
}
cleanup() {
    local rc=$?
    trap - EXIT
    if ((rc != 0)); then
        for f in "${DEVCOORD_CLUSTER_DIR}"/logs/*.log; do
            [[ -r ${f} ]] && { echo "== ${f}"; tail -n 30 "${f}"; } >&2
        done
    fi
    "${CLUSTER}" down || rc=1
    rm -rf "${DEVCOORD_CLUSTER_DIR}"
    ((rc == 0)) && echo "local-cluster-test: PASS" >&2
    exit "${rc}"
}
trap cleanup EXIT

ctl_prog="${BIN_DIR}/client/devcoordctl"
[[ -x ${ctl_prog} ]] || ctl_prog="${BIN_DIR}/devcoordctl"
[[ -x ${ctl_prog} ]] || fail "no devcoordctl in ${BIN_DIR}"

up_out="$("${CLUSTER}" up)"
addr="$(sed -n 's/^export DEVCOORD_ADDR=//p' <<<"${up_out}")"
[[ ${addr} == tcp://127.0.0.1:* ]] || fail "up printed no coordinator address: ${up_out}"
again="$("${CLUSTER}" up 2>&1)" || fail "a second up failed: ${again}"
[[ ${again} == *"already up"* ]] || fail "a second up did not say 'already up': ${again}"
status="$("${CLUSTER}" status)"
for w in worker-a worker-b worker-c; do
    grep -Eq "^${w} +[0-9]+ +running" <<<"${status}" || fail "status shows ${w} not running: ${status}"
    grep -Eq "^${w} .* alive " <<<"${status}" || fail "workers list shows ${w} not alive: ${status}"
done

ctl() { "${ctl_prog}" -s "${addr}" --token-file "${HERE}/config/trainer.token" "$@"; }
ctl tensor put worker-a/cuda:0 grad --dtype f64 --values 1,2,3,4 >/dev/null
ctl tensor put worker-a/cuda:1 grad --dtype f64 --values 3,4,5,6 >/dev/null
ctl tensor put worker-b/cuda:0 grad --dtype f64 --values 5,6,7,8 >/dev/null
ctl tensor put worker-c/cuda:0 grad --dtype f64 --values 7,8,9,10 >/dev/null
devices=worker-a/cuda:0,worker-a/cuda:1,worker-b/cuda:0,worker-c/cuda:0
reply="$(ctl -o json submit --op all-reduce --reduce mean --tensor grad --devices "${devices}")" ||
    fail "all-reduce refused: ${reply}"
[[ ${reply} == *'"status":"OK"'* ]] || fail "all-reduce not OK: ${reply}"
for d in ${devices//,/ }; do
    got="$(ctl -o json tensor get "${d}" grad | grep -o '"values": *\[[^]]*\]' | tr -d ' ')"
    [[ ${got} == '"values":[4,5,6,7]' ]] || fail "${d} holds ${got} after the mean all-reduce"
done
echo "local-cluster-test: all-reduce (mean) over ${devices}: [4,5,6,7] everywhere" >&2
