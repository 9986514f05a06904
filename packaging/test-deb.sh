#!/bin/bash
# Installs a built tcpstore .deb into a clean Debian bookworm root and runs the server and the
# CLI from it (loopback only).
#
#   packaging/test-deb.sh path/to/tcpstore_*.deb     run the test (needs root)
#   packaging/test-deb.sh --prepare                  only build the cached base root
#
# The base root is built once with debootstrap (minbase) and cached in
# ${TCPSTORE_DEBROOT_DIR:-/var/tmp/tcpstore-debroot}/bookworm; it is marked ready only once apt
# works inside it, and a half-built one is removed and redone. Every run mounts a throw-away
# overlay on top of the base (or copies it if overlayfs is unavailable), so the base stays clean
# and each run starts from the same root. Dependencies of the .deb come from the host's Debian
# mirror through apt-get (the same mirror compat/peers/setup.sh uses; TCPSTORE_DEBIAN_MIRROR
# overrides it). The first run takes a few minutes (debootstrap); later runs take seconds.
# Exit status: 0 when every check passed, 1 otherwise.
set -euo pipefail
BASE_DIR=${TCPSTORE_DEBROOT_DIR:-/var/tmp/tcpstore-debroot}
SUITE=bookworm
BASE="$BASE_DIR/$SUITE"
KEYRING=/usr/share/keyrings/debian-archive-keyring.gpg
CLEAN_PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin

log() { echo "test-deb.sh: $*" >&2; }
die() {
  log "FAIL: $*"
  exit 1
}

# The main Debian archive URL from the host's apt configuration (as compat/peers/setup.sh).
host_mirror() {
  if [ -n "${TCPSTORE_DEBIAN_MIRROR:-}" ]; then
    echo "$TCPSTORE_DEBIAN_MIRROR"
    return 0
  fi
  local m=""
  if [ -r /etc/apt/sources.list.d/debian.sources ]; then
    m=$(awk 'tolower($1)=="uris:" { for (i = 2; i <= NF; i++) if ($i !~ /security/) { print $i; exit } }' \
      /etc/apt/sources.list.d/debian.sources)
  fi
  if [ -z "$m" ] && [ -r /etc/apt/sources.list ]; then
    m=$(awk '$1=="deb" { for (i = 2; i <= NF; i++) if ($i ~ /^[a-z]+:\/\//) { if ($i !~ /security/) { print $i; exit } else break } }' \
      /etc/apt/sources.list)
  fi
  [ -n "$m" ] || return 1
  echo "$m"
}

# Runs "$@" inside root $1 in a private mount namespace with a clean environment.
in_root() {
  local root=$1
  shift
  # shellcheck disable=SC2016 # expanded by the inner shell
  unshare --mount --propagation private /bin/sh -ec '
    root=$1; shift
    mount -t proc proc "$root/proc"
    mount --rbind /dev "$root/dev"
    exec chroot "$root" /usr/bin/env -i PATH='"$CLEAN_PATH"' HOME=/root LANG=C.UTF-8 \
      DEBIAN_FRONTEND=noninteractive "$@"
  ' in_root "$root" "$@"
}

# Removes $1 unless something of this mount namespace is mounted below it.
safe_rm() {
  local dir=$1
  [ -e "$dir" ] || return 0
  if awk -v d="$dir" 'index($2, d) == 1 { found = 1 } END { exit !found }' /proc/self/mounts; then
    log "refusing to remove $dir: something is mounted below it"
    return 1
  fi
  rm -rf --one-file-system -- "$dir"
}

prepare_base() {
  if [ -f "$BASE/.tcpstore-ready" ]; then
    log "base root ready: $BASE ($(cat "$BASE/.tcpstore-ready"))"
    return 0
  fi
  command -v debootstrap >/dev/null || die "debootstrap is not installed (apt-get install debootstrap)"
  local mirror build="$BASE_DIR/.build-$SUITE" t0
  mirror=$(host_mirror) || die "no Debian mirror in the host apt configuration (set TCPSTORE_DEBIAN_MIRROR)"
  log "building the $SUITE base root from $mirror (log: $BASE_DIR/$SUITE.log)"
  t0=$(date +%s)
  safe_rm "$build"
  if ! {
    unshare --mount --propagation private \
      debootstrap --variant=minbase --keyring="$KEYRING" "$SUITE" "$build" "$mirror" &&
      { cp -L /etc/resolv.conf "$build/etc/resolv.conf" 2>/dev/null || true; } &&
      in_root "$build" /bin/sh -ec 'apt-get update && apt-get clean'
  } >"$BASE_DIR/$SUITE.log" 2>&1; then
    tail -n 15 "$BASE_DIR/$SUITE.log" >&2
    safe_rm "$build"
    die "building the base root failed"
  fi
  echo "debian $SUITE minbase from $mirror, built $(date -u +%FT%TZ) in $(($(date +%s) - t0)) s" \
    >"$build/.tcpstore-ready"
  mv "$build" "$BASE"
  log "base root ready after $(($(date +%s) - t0)) s"
}

# The checks, run as root inside the throw-away root (POSIX sh: minbase has no bash extras).
# shellcheck disable=SC2016 # expanded inside the root
CHECKS='
set -eu
fail() { echo "test-deb.sh (in root): FAIL: $*" >&2; exit 1; }
apt-get install -y -q --no-install-recommends /tmp/tcpstore.deb >/tmp/apt.log 2>&1 ||
  { tail -n 20 /tmp/apt.log >&2; fail "apt-get install of the .deb"; }
echo "installed: $(dpkg-query -W -f "\${Package} \${Version}; Depends: \${Depends}" tcpstore)"
for f in /usr/bin/tcpstore-server /usr/bin/tcpstore-cli /usr/include/tcpstore/client.h \
    /usr/share/man/man1/tcpstore-server.1.gz /usr/share/man/man1/tcpstore-cli.1.gz \
    /usr/lib/systemd/system/tcpstore-server.service /etc/default/tcpstore-server; do
  [ -e "$f" ] || fail "$f is not installed"
done
dpkg -L tcpstore | grep -q "/pkgconfig/tcpstore.pc\$" || fail "tcpstore.pc is not in the package"
dpkg -L tcpstore | grep -q "/cmake/tcpstore/tcpstoreConfig.cmake\$" || fail "no CMake package"
dpkg -L tcpstore | grep -q "/libtcpstore.so.0\$" || fail "no libtcpstore.so.0"
grep -q "^EnvironmentFile=-/etc/default/tcpstore-server" /usr/lib/systemd/system/tcpstore-server.service ||
  fail "the unit does not read /etc/default/tcpstore-server"
tcpstore-server --version
mkfifo /tmp/server.out
tcpstore-server --host 127.0.0.1 --port 0 >/tmp/server.out 2>/tmp/server.err &
pid=$!
exec 3</tmp/server.out
IFS= read -r line <&3 || fail "the server printed nothing (stderr: $(cat /tmp/server.err))"
case "$line" in
  "listening on 127.0.0.1:"*) port=${line##*:} ;;
  *) kill "$pid"; fail "unexpected first line: $line" ;;
esac
echo "server pid $pid: $line"
cli() { tcpstore-cli --addr "127.0.0.1:$port" --timeout 10 "$@"; }
[ "$(cli ping)" = ok ] || { kill "$pid"; fail "ping"; }
cli set deb-test-key "from the .deb" || { kill "$pid"; fail "set"; }
[ "$(cli get deb-test-key)" = "from the .deb" ] || { kill "$pid"; fail "get"; }
[ "$(cli add counter 5)" = 5 ] || { kill "$pid"; fail "add"; }
[ "$(cli num-keys)" = 2 ] || { kill "$pid"; fail "num-keys"; }
kill -TERM "$pid"
rc=0
wait "$pid" || rc=$?
[ "$rc" -eq 0 ] || fail "the server exited $rc after SIGTERM (stderr: $(cat /tmp/server.err))"
echo "server stopped cleanly on SIGTERM"
'

run_test() {
  local deb=$1 run t0 rc=0
  [ -f "$deb" ] || die "no such .deb: $deb"
  t0=$(date +%s)
  prepare_base
  run=$(mktemp -d "$BASE_DIR/run.XXXXXX")
  mkdir -p "$run/upper" "$run/work" "$run/root"
  cp "$deb" "$run/tcpstore.deb"
  # The unit file is checked on the host (the minimal root has no systemd): its ExecStart is
  # pointed at the extracted binary so that `systemd-analyze verify` can check it exists.
  mkdir "$run/x"
  dpkg-deb -x "$deb" "$run/x"
  if command -v systemd-analyze >/dev/null; then
    sed "s|^ExecStart=/usr/bin/|ExecStart=$run/x/usr/bin/|" \
      "$run/x/usr/lib/systemd/system/tcpstore-server.service" >"$run/tcpstore-server.service"
    systemd-analyze verify --man=no "$run/tcpstore-server.service" ||
      { safe_rm "$run"; die "systemd-analyze verify: the unit file has errors"; }
    log "systemd-analyze verify: tcpstore-server.service is valid"
  else
    log "systemd-analyze not found: the unit file is only checked for presence"
  fi
  # The packaged .pc files resolve to the packaged include and library directories.
  if command -v pkg-config >/dev/null; then
    local pcdir inc lib
    pcdir=$(dirname "$(find "$run/x" -name tcpstore.pc)")
    inc=$(PKG_CONFIG_PATH=$pcdir pkg-config --variable=includedir tcpstore)
    lib=$(PKG_CONFIG_PATH=$pcdir pkg-config --variable=libdir tcpstore-server)
    if [ "$(realpath -m "$inc")" != "$run/x/usr/include" ] || [ ! -f "$lib/libtcpstore_server.a" ]; then
      safe_rm "$run"
      die "the packaged .pc files point to $inc and $lib"
    fi
    log "pkg-config: the packaged tcpstore.pc and tcpstore-server.pc resolve inside the package"
  fi
  # One private mount namespace holds the overlay, proc and dev; they vanish with it.
  # shellcheck disable=SC2016 # expanded by the inner shell
  unshare --mount --propagation private /bin/sh -ec '
    base=$1 run=$2 checks=$3
    root=$run/root
    if ! mount -t overlay overlay -o "lowerdir=$base,upperdir=$run/upper,workdir=$run/work" "$root" 2>/dev/null; then
      echo "test-deb.sh: overlayfs unavailable, copying the base root" >&2
      cp -a "$base/." "$root/"
    fi
    cp "$run/tcpstore.deb" "$root/tmp/tcpstore.deb"
    mount -t proc proc "$root/proc"
    mount --rbind /dev "$root/dev"
    exec chroot "$root" /usr/bin/env -i PATH='"$CLEAN_PATH"' HOME=/root LANG=C.UTF-8 \
      DEBIAN_FRONTEND=noninteractive /bin/sh -c "$checks"
  ' test-deb "$BASE" "$run" "$CHECKS" || rc=$?
  safe_rm "$run" || true
  if [ $rc -ne 0 ]; then
    die "the .deb install test failed (exit $rc)"
  fi
  log "PASS in $(($(date +%s) - t0)) s: $(basename "$deb") installs into a clean $SUITE root; server and CLI work"
}

[ "$(id -u)" = 0 ] || die "needs root (debootstrap, chroot, mounts)"
mkdir -p "$BASE_DIR"
case "${1:-}" in
  --prepare)
    (
      flock 9
      prepare_base
    ) 9>"$BASE_DIR/.lock"
    ;;
  "" | -h | --help)
    sed -n '2,16p' "$0" | sed 's/^# \{0,1\}//'
    exit 2
    ;;
  *)
    (
      flock 9
      run_test "$(realpath "$1")"
    ) 9>"$BASE_DIR/.lock"
    ;;
esac
