#!/usr/bin/env bash
# Installs the build in BUILD_DIR into a temporary prefix and builds a program outside the
# tree against it, once with pkg-config and once with CMake's find_package; both must run.
# The public header must also compile as C++.
#   bash tests/install/run.sh [BUILD_DIR]
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
build=$(cd "${1:-$here/../../build}" && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
prefix=$work/prefix

cmake --install "$build" --prefix "$prefix" >/dev/null
echo "installed into $prefix:"
(cd "$prefix" && find . -type f -o -type l | sort | sed 's/^/  /')

echo "== pkg-config"
export PKG_CONFIG_PATH=$prefix/lib/pkgconfig
# shellcheck disable=SC2046
cc -std=c11 -Wall -Wextra -Werror "$here/consumer.c" $(pkg-config --cflags --libs devcoord) \
    -Wl,-rpath,"$prefix/lib" -o "$work/consumer-pc"
"$work/consumer-pc"

echo "== C++"
# shellcheck disable=SC2046
c++ -Wall -Wextra -Werror "$here/consumer.cpp" $(pkg-config --cflags --libs devcoord) \
    -Wl,-rpath,"$prefix/lib" -o "$work/consumer-cxx"
"$work/consumer-cxx"

echo "== cmake find_package(devcoord)"
cmake -S "$here" -B "$work/cmake" -DCMAKE_PREFIX_PATH="$prefix" \
    -DCMAKE_BUILD_RPATH="$prefix/lib" >/dev/null
cmake --build "$work/cmake" >/dev/null
"$work/cmake/consumer"

echo "== installed devcoordctl and man pages"
"$prefix/bin/devcoordctl" --version
for page in man1/devcoordctl.1 man8/devcoord-server.8 man8/devcoord-worker.8; do
    test -s "$prefix/share/man/$page" && echo "  $page"
done
echo "== installed Python package (finds the installed library by itself)"
pkgdir=$(find "$prefix" -type d -name devcoord -path '*-packages/devcoord' | head -n 1)
test -n "$pkgdir" && test -s "$pkgdir/_libpath.py"
(cd "$work" && env -u DEVCOORD_LIB PYTHONPATH="$(dirname "$pkgdir")" /usr/bin/python3 -c \
    'import devcoord; print("devcoord", devcoord.version(), devcoord.parse_device("node-a/cuda"))')
echo "== Rust crate linked through pkg-config against the install (Debian's cargo)"
if [ -x /usr/bin/cargo ]; then
    (cd "$here/../../bindings/rust" && env -u DEVCOORD_LIB_DIR RUSTC=/usr/bin/rustc \
        CARGO_TARGET_DIR="$work/cargo" /usr/bin/cargo build --offline --quiet --example all_reduce)
    ldd "$work/cargo/debug/examples/all_reduce" | grep -F "$prefix/lib/" | grep devcoord
else
    echo "  skipped: /usr/bin/cargo is not installed (.ci/setup-debian.sh dev)"
fi
echo "install test: ok"
