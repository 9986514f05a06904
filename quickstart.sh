#!/usr/bin/env bash
# tcpstore quick start, for a fresh Debian 12 machine (run as root, or with sudo for apt-get).
#
#   ./quickstart.sh server [tcpstore-server flags]   install deps, build, run the server
#   ./quickstart.sh test                             install deps (incl. torch peers), build, run every test
#
# Both are idempotent: a second run skips installed packages, reuses the build
# directory and the cached torch chroots, and takes seconds before the real work.
# stdout carries only what the program prints (for the server, its "listening on" line);
# package installation and build output go to stderr. ccache is used if it is installed.
# Environment: BUILD_DIR (default ./build), JOBS (default nproc),
# TCPSTORE_SKIP_INTEROP=1 to skip the torch interop tests (they are run by default).
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
build=${BUILD_DIR:-$here/build}
jobs=${JOBS:-$(nproc)}

# The etcd gateway (store/etcd) needs gRPC/protobuf and etcd's API definitions, which Debian
# ships in its golang-* source packages; the keyspace's keyed hash is libsodium's SipHash.
build_pkgs=(build-essential cmake ninja-build pkg-config libuv1-dev libfmt-dev doctest-dev
  libbenchmark-dev nlohmann-json3-dev help2man libsodium-dev
  libgrpc++-dev libprotobuf-dev protobuf-compiler protobuf-compiler-grpc
  golang-etcd-server-dev golang-github-gogo-protobuf-dev golang-github-gogo-googleapis-dev)
test_pkgs=(python3-torch debootstrap python3-matplotlib etcd-server openssl)

log() { printf '[quickstart] %s\n' "$*" >&2; }

# Installs the packages of $@ that are missing; apt-get update once, only if needed.
ensure_pkgs() {
  local missing=()
  for p in "$@"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  [ ${#missing[@]} -eq 0 ] && return 0
  log "installing: ${missing[*]}"
  local sudo=""
  [ "$(id -u)" -ne 0 ] && sudo=sudo
  $sudo apt-get update -q >&2
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -q --no-install-recommends "${missing[@]}" >&2
}

# Build output goes to stderr: stdout carries only what the program prints
# (for the server, its one "listening on HOST:PORT" line).
# Configures only if needed or if cmake arguments are given ($@), then builds.
configure_and_build() {
  local launcher=()
  if command -v ccache >/dev/null; then
    launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_C_COMPILER_LAUNCHER=ccache)
  fi
  if [ ! -f "$build/build.ninja" ] || [ $# -gt 0 ]; then
    cmake -S "$here" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo "${launcher[@]}" "$@" >&2
  fi
  cmake --build "$build" -j "$jobs" >&2
}

cmd=${1:-}
[ $# -gt 0 ] && shift
case "$cmd" in
  server)
    ensure_pkgs "${build_pkgs[@]}"
    configure_and_build
    exec "$build/bin/tcpstore-server" "$@"
    ;;
  test)
    ensure_pkgs "${build_pkgs[@]}"
    if [ "${TCPSTORE_SKIP_INTEROP:-0}" != 1 ]; then
      ensure_pkgs "${test_pkgs[@]}"
      log "preparing torch peers (1.13 on the host, 2.6 and 2.14 in cached chroots)"
      "$here/compat/peers/setup.sh" 1.13 2.6 2.14
    else
      log "TCPSTORE_SKIP_INTEROP=1: torch interop tests will be reported as SKIPPED"
    fi
    configure_and_build -DTCPSTORE_WERROR=ON
    cd "$build"
    exec ctest --output-on-failure -j "$jobs" "$@"
    ;;
  *)
    sed -n '2,12p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'
    exit 2
    ;;
esac
