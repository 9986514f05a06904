#!/bin/bash
# tests/install/run.sh BUILD_DIR WORK_DIR LIBDIR CC CXX GENERATOR [LAUNCHER]
# Installs BUILD_DIR into WORK_DIR/prefix (components runtime and devel: what a library user
# gets), then builds and runs the consumers in consumer/ against that prefix only, once with
# find_package(tcpstore) and once with pkg-config. Run by ctest (install_consumer).
set -euo pipefail
build=$1 work=$2 libdir=$3 cc=$4 cxx=$5 generator=$6 launcher=${7:-}
here=$(cd "$(dirname "$0")" && pwd)
prefix=$work/prefix
step() { echo "--- $*"; }

rm -rf "$work"
mkdir -p "$work"
step "cmake --install $build --prefix $prefix (runtime, devel)"
for c in runtime devel; do
  cmake --install "$build" --prefix "$prefix" --component "$c" >"$work/install-$c.log"
done
# Only include/tcpstore/*.h may be installed as headers.
extra=$(cd "$prefix/include" && find . -type f ! -path './tcpstore/*.h')
[ -z "$extra" ] || { echo "FAIL: unexpected files under include/: $extra"; exit 1; }
# Consumers' include path is the installed include/ and nothing else (no source or build tree).
bad=$(grep -h "INTERFACE_INCLUDE_DIRECTORIES" "$prefix/$libdir/cmake/tcpstore/"tcpstoreTargets*.cmake |
  grep -vF "\"\${_IMPORT_PREFIX}/include\"" || true)
[ -z "$bad" ] || { echo "FAIL: exported include directories other than include/: $bad"; exit 1; }
! grep -rqF "$build" "$prefix/$libdir/cmake" "$prefix/$libdir/pkgconfig" ||
  { echo "FAIL: installed CMake/pkg-config files name the build tree $build"; exit 1; }
echo "headers: $(cd "$prefix/include" && find . -type f | sort | tr '\n' ' ')"

# The installed tcpstore-server serves the C programs (and checks the installed binary).
server_pid=
stop_server() {
  if [ -n "$server_pid" ]; then
    kill -TERM "$server_pid" 2>/dev/null || true
    local rc=0
    wait "$server_pid" || rc=$?
    server_pid=
    [ "$rc" -eq 0 ] || { echo "FAIL: installed tcpstore-server exited $rc on SIGTERM"; return 1; }
  fi
}
trap 'stop_server || true' EXIT
mkfifo "$work/server.out"
"$prefix/bin/tcpstore-server" --host 127.0.0.1 --port 0 --log-level warn >"$work/server.out" &
server_pid=$!
exec 3<"$work/server.out"
IFS= read -r -t 30 line <&3 || { echo "FAIL: installed tcpstore-server printed nothing"; exit 1; }
[[ $line == "listening on 127.0.0.1:"* ]] || { echo "FAIL: unexpected: $line"; exit 1; }
port=${line##*:}
echo "installed tcpstore-server: $line"
export LD_LIBRARY_PATH=$prefix/$libdir

step "find_package(tcpstore) consumer"
launch=()
[ -n "$launcher" ] && launch=("-DCMAKE_CXX_COMPILER_LAUNCHER=$launcher" "-DCMAKE_C_COMPILER_LAUNCHER=$launcher")
cmake -S "$here/consumer" -B "$work/cmake" -G "$generator" -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_C_COMPILER="$cc" -DCMAKE_CXX_COMPILER="$cxx" "${launch[@]}" \
  -DCMAKE_PREFIX_PATH="$prefix" -DCMAKE_FIND_USE_PACKAGE_REGISTRY=OFF >"$work/cmake-configure.log" ||
  { cat "$work/cmake-configure.log"; exit 1; }
cmake --build "$work/cmake" || exit 1
"$work/cmake/consumer_cxx"
"$work/cmake/consumer_c" 127.0.0.1 "$port"

step "pkg-config consumer"
export PKG_CONFIG_PATH=$prefix/$libdir/pkgconfig
cflags=$(pkg-config --cflags tcpstore | xargs)
incdir=$(realpath -m "${cflags#-I}")
[ "$incdir" = "$prefix/include" ] ||
  { echo "FAIL: pkg-config --cflags tcpstore is '$cflags', not -I$prefix/include"; exit 1; }
mkdir -p "$work/pc"
# shellcheck disable=SC2046 # word splitting of pkg-config output is intended
"$cc" -std=c11 -Wall -Wextra -Werror -o "$work/pc/consumer_c" "$here/consumer/consumer.c" \
  $(pkg-config --cflags --libs tcpstore)
# shellcheck disable=SC2046
"$cxx" -std=c++20 -Wall -Wextra -Werror -o "$work/pc/consumer_cxx" "$here/consumer/consumer.cc" \
  $(pkg-config --cflags --libs tcpstore-server tcpstore)
"$work/pc/consumer_cxx"
"$work/pc/consumer_c" 127.0.0.1 "$port"

stop_server
echo "PASS"
