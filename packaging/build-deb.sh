#!/bin/bash
# Builds the tcpstore .deb: a Release build installed under /usr, packed by CPack.
#   packaging/build-deb.sh [BUILD_DIR]      (default ./build-deb)
# Prints the path of the .deb on stdout (build output goes to stderr). Needs cmake, ninja,
# the build dependencies, help2man (man pages), dpkg-dev and file (dpkg-shlibdeps).
# Environment: JOBS (default nproc); extra cmake arguments in TCPSTORE_DEB_CMAKE_ARGS.
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$top/build-deb}
launcher=()
if command -v ccache >/dev/null; then
  launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_C_COMPILER_LAUNCHER=ccache)
fi
# shellcheck disable=SC2086 # TCPSTORE_DEB_CMAKE_ARGS is a list of arguments
cmake -S "$top" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_INSTALL_PREFIX=/usr \
  -DTCPSTORE_INSTALL_SERVICE=ON -DTCPSTORE_BUILD_TESTS=OFF -DTCPSTORE_BUILD_BENCH=OFF \
  "${launcher[@]}" ${TCPSTORE_DEB_CMAKE_ARGS:-} >&2
cmake --build "$build" -j "${JOBS:-$(nproc)}" >&2
rm -f "$build"/tcpstore_*.deb
(cd "$build" && cpack -G DEB >&2)
deb=$(ls "$build"/tcpstore_*.deb)
dpkg-deb --info "$deb" >&2
echo "$deb"
