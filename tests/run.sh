#!/usr/bin/env bash
# Sets up a fresh Debian bookworm machine (packages via .ci/setup-debian.sh), builds devcoord
# and runs every test: unit tests and the integration tests that start the real binaries.
#   bash tests/run.sh            (build dir: build/, override with BUILD_DIR=...)
set -euo pipefail
cd "$(dirname "$0")/.."
bash .ci/setup-debian.sh build
build=${BUILD_DIR:-build}
cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo ${CMAKE_ARGS:-}
cmake --build "$build" -j"$(nproc)"
ctest --test-dir "$build" --output-on-failure --timeout 600 ${CTEST_ARGS:-}
