#!/usr/bin/env bash
# Installs the Debian bookworm packages devcoord needs. Every entry point (README commands,
# .ci/run, deploy scripts) calls this, so a fresh machine needs nothing installed by hand.
#   .ci/setup-debian.sh [build] [dev] [test] [bench] [docker]
# build: compilers, cmake and the libraries (always included); libcjson-dev parses etcd's
#        JSON gateway (state.backend etcd)
# dev:   clang (libFuzzer, sanitizers), clang-format, clang-tidy, valgrind, and Debian's
#        cargo and rustc for bindings/rust (test bindings.rust is skipped without them),
#        python3-numpy for the numpy paths of bindings/python (skipped without it),
#        python3-torch for bindings/python's torch tensors, DDP hook and examples/ddp_train.py
# test:  headless chromium, which renders the coordinator's status page in
#        integration.statuspage (skipped without it); etcd-server, which integration.ha
#        starts on loopback for coordinators in high availability (skipped without it)
# bench: the peers and tools the benchmarks compare against
# docker: what deploy/ needs to build its base image without a registry
set -euo pipefail

groups=("$@")
pkgs=(build-essential cmake pkg-config libprotobuf-c-dev protobuf-c-compiler libnng-dev
      libmbedtls-dev libssl-dev libyaml-dev libcmocka-dev python3 python3-prometheus-client curl procps
      iproute2 openssl libcjson-dev)
for g in "${groups[@]}"; do
    case "$g" in
    build) ;;
    dev) pkgs+=(clang clang-format clang-tidy libclang-rt-14-dev valgrind cargo rustc
                python3-numpy python3-torch) ;;
    test) pkgs+=(chromium etcd-server) ;;
    bench) pkgs+=(python3-torch iperf3 gnuplot-nox libgrpc++-dev protobuf-compiler-grpc
                  libprotobuf-dev protobuf-compiler hyperfine) ;;
    docker) pkgs+=(debootstrap docker-compose) ;;
    *) echo "setup-debian.sh: unknown group '$g'" >&2; exit 2 ;;
    esac
done

missing=()
for p in "${pkgs[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0

SUDO=
[ "$(id -u)" -eq 0 ] || SUDO=sudo
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update
$SUDO apt-get install -y --no-install-recommends "${missing[@]}"
