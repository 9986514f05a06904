#!/bin/bash
# Prepare real PyTorch peers for the interop tests (see compat/README.md).
#   compat/peers/setup.sh [VERSION...]     VERSION: 1.13 (host) | 2.6 (trixie chroot) | 2.14 (sid chroot)
# Idempotent and cached: a ready chroot is reused (the second run takes seconds).
# Chroots live in ${TCPSTORE_PEERS_DIR:-/var/tmp/tcpstore-peers}/<version>; a chroot is only
# marked ready once `import torch` works inside it; a half-built one is removed and redone.
# Mirror: the host's apt configuration (override with TCPSTORE_DEBIAN_MIRROR).
# Exit status: 0 if every requested version is ready, 1 otherwise (each failure is reported).
set -u
PEERS_DIR=${TCPSTORE_PEERS_DIR:-/var/tmp/tcpstore-peers}
KEYRING=/usr/share/keyrings/debian-archive-keyring.gpg
CLEAN_PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin

log() { echo "setup.sh: $*" >&2; }
loud() {
  echo "######################################################################" >&2
  echo "setup.sh: $*" >&2
  echo "######################################################################" >&2
}

suite_of() {
  case "$1" in
    2.6) echo trixie ;;
    2.14) echo sid ;;
    *) return 1 ;;
  esac
}

# The main Debian archive URL from the host's apt configuration (never hard-coded).
host_mirror() {
  if [ -n "${TCPSTORE_DEBIAN_MIRROR:-}" ]; then
    echo "$TCPSTORE_DEBIAN_MIRROR"
    return 0
  fi
  local m=""
  if [ -r /etc/apt/sources.list.d/debian.sources ]; then
    # First URIs: value of a deb822 stanza that is not a security archive.
    m=$(awk 'tolower($1)=="uris:" { for (i = 2; i <= NF; i++) if ($i !~ /security/) { print $i; exit } }' \
      /etc/apt/sources.list.d/debian.sources)
  fi
  if [ -z "$m" ] && [ -r /etc/apt/sources.list ]; then
    m=$(awk '$1=="deb" { for (i = 2; i <= NF; i++) if ($i ~ /^[a-z]+:\/\//) { if ($i !~ /security/) { print $i; exit } else break } }' \
      /etc/apt/sources.list)
  fi
  if [ -z "$m" ]; then
    return 1
  fi
  echo "$m"
}

# Run a command inside chroot $1 in a private mount namespace with a clean environment.
in_chroot() {
  local root=$1
  shift
  # shellcheck disable=SC2016 # expanded by the inner shell
  unshare --mount --propagation private /bin/sh -ec '
    root=$1; shift
    mount -t proc proc "$root/proc"
    mount --rbind /dev "$root/dev"
    mount --rbind /sys "$root/sys"
    exec chroot "$root" /usr/bin/env -i PATH='"$CLEAN_PATH"' HOME=/root LANG=C.UTF-8 \
      DEBIAN_FRONTEND=noninteractive "$@"
  ' in_chroot "$root" "$@"
}

# No mount of this host namespace may live below $1 before we delete it.
safe_rm() {
  local dir=$1
  [ -e "$dir" ] || return 0
  if awk -v d="$dir" 'index($2, d) == 1 { found = 1 } END { exit !found }' /proc/self/mounts; then
    loud "refusing to remove $dir: something is mounted below it"
    return 1
  fi
  rm -rf --one-file-system -- "$dir"
}

setup_host() {
  if /usr/bin/python3 -c 'import torch, torch.distributed; print(torch.__version__)' >/dev/null 2>&1; then
    log "1.13: ready (host /usr/bin/python3, torch $(/usr/bin/python3 -c 'import torch; print(torch.__version__)' 2>/dev/null))"
    return 0
  fi
  loud "1.13: NOT READY: /usr/bin/python3 cannot import torch (apt-get install python3-torch)"
  return 1
}

build_chroot() {
  local ver=$1 suite root build mirror t0 t1
  suite=$(suite_of "$ver")
  root="$PEERS_DIR/$ver"
  build="$PEERS_DIR/.build-$ver"
  if [ -f "$root/.tcpstore-ready" ] && in_chroot "$root" python3 -c 'import torch' >/dev/null 2>&1; then
    log "$ver: ready ($suite chroot $root, $(cat "$root/.tcpstore-ready"))"
    return 0
  fi
  if [ "$(id -u)" != 0 ]; then
    loud "$ver: NOT READY: building the $suite chroot needs root"
    return 1
  fi
  if ! command -v debootstrap >/dev/null; then
    loud "$ver: NOT READY: debootstrap is not installed (apt-get install debootstrap)"
    return 1
  fi
  if ! mirror=$(host_mirror); then
    loud "$ver: NOT READY: no Debian mirror found in the host apt configuration (set TCPSTORE_DEBIAN_MIRROR)"
    return 1
  fi
  log "$ver: building $suite chroot in $root from $mirror (log: $PEERS_DIR/$ver.log)"
  t0=$(date +%s)
  safe_rm "$root" || return 1
  safe_rm "$build" || return 1
  {
    echo "=== $(date -u) debootstrap $suite from $mirror"
    unshare --mount --propagation private \
      debootstrap --variant=minbase --keyring="$KEYRING" "$suite" "$build" "$mirror" &&
      {
        # sid on a frozen mirror is past its Valid-Until; harmless for trixie.
        cat >"$build/etc/apt/apt.conf.d/99tcpstore" <<'CONF'
Acquire::Check-Valid-Until "false";
Acquire::Check-Date "false";
Acquire::IndexTargets::deb::DEP-11 { DefaultEnabled "false"; };
Acquire::IndexTargets::deb::DEP-11-icons { DefaultEnabled "false"; };
Acquire::IndexTargets::deb::DEP-11-icons-small { DefaultEnabled "false"; };
Acquire::IndexTargets::deb::DEP-11-icons-large { DefaultEnabled "false"; };
Acquire::IndexTargets::deb::DEP-11-icons-hidpi { DefaultEnabled "false"; };
Acquire::IndexTargets::deb::DEP-11-icons-large-hidpi { DefaultEnabled "false"; };
CONF
        cp -L /etc/resolv.conf "$build/etc/resolv.conf" 2>/dev/null || true
        echo "=== $(date -u) apt-get install python3-torch"
      } &&
      in_chroot "$build" /bin/sh -ec \
        'apt-get update && apt-get install -y --no-install-recommends python3-torch && apt-get clean' &&
      echo "=== $(date -u) check" &&
      in_chroot "$build" python3 -c 'import torch, torch.distributed; print(torch.__version__)' &&
      in_chroot "$build" dpkg-query -W python3-torch
  } >"$PEERS_DIR/$ver.log" 2>&1
  local rc=$?
  if [ $rc -ne 0 ]; then
    loud "$ver: NOT READY: building the $suite chroot failed (exit $rc); last lines of $PEERS_DIR/$ver.log:"
    tail -n 15 "$PEERS_DIR/$ver.log" >&2
    safe_rm "$build"
    return 1
  fi
  local tv pv
  tv=$(in_chroot "$build" python3 -c 'import torch; print(torch.__version__)' 2>/dev/null)
  # shellcheck disable=SC2016 # a dpkg-query format, not a shell expansion
  pv=$(in_chroot "$build" dpkg-query -W -f '${Version}' python3-torch 2>/dev/null)
  mv "$build" "$root" || return 1
  t1=$(date +%s)
  echo "torch $tv (python3-torch $pv, $suite), built $(date -u +%FT%TZ) in $((t1 - t0)) s" >"$root/.tcpstore-ready"
  log "$ver: ready after $((t1 - t0)) s ($(cat "$root/.tcpstore-ready"))"
  return 0
}

main() {
  local versions=("$@") rc=0 v
  [ ${#versions[@]} -gt 0 ] || versions=(1.13 2.6 2.14)
  mkdir -p "$PEERS_DIR"
  for v in "${versions[@]}"; do
    case "$v" in
      1.13) setup_host || rc=1 ;;
      2.6 | 2.14)
        # One builder per version at a time; others wait for it and then see it ready.
        (
          flock 9
          build_chroot "$v"
        ) 9>"$PEERS_DIR/.lock-$v" || rc=1
        ;;
      *)
        loud "unknown version '$v' (use 1.13, 2.6 or 2.14)"
        rc=1
        ;;
    esac
  done
  return $rc
}

main "$@"
