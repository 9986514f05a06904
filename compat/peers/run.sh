#!/bin/bash
# Run a command with a given real PyTorch (see compat/README.md).
#   compat/peers/run.sh VERSION CMD [ARGS...]      VERSION: 1.13 | 2.6 | 2.14
# 1.13: on the host, clean environment, `python3` = /usr/bin/python3 (Debian's torch 1.13).
# 2.6 / 2.14: inside the chroot made by setup.sh, in a private mount namespace (nothing is
#   left mounted on the host), clean environment, with the repository, /tmp and the current
#   directory bind-mounted at the same paths, cwd preserved.
# Passed through: TORCH_*, MASTER_*, RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, GROUP_RANK,
#   USE_LIBUV, GLOO_*, TORCHELASTIC_*, TCPSTORE_*, PYTHONUNBUFFERED, PYTHONFAULTHANDLER.
# Extra directories to bind (2.x): TCPSTORE_PEERS_BIND="/dir1:/dir2".
# Every step execs, so the PID of run.sh is the PID of CMD: kill it by that PID.
# Exit 125 (loudly) if the peer is not set up.
set -u
if [ $# -lt 2 ]; then
  echo "usage: $0 VERSION CMD [ARGS...]   (VERSION: 1.13, 2.6, 2.14)" >&2
  exit 2
fi
VERSION=$1
shift
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd -P)
REPO=$(cd "$HERE/../.." && pwd -P)
PEERS_DIR=${TCPSTORE_PEERS_DIR:-/var/tmp/tcpstore-peers}
BASE_PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin

not_ready() {
  echo "######################################################################" >&2
  echo "run.sh: PEER NOT AVAILABLE: torch $VERSION: $*" >&2
  echo "run.sh: run: $HERE/setup.sh $VERSION" >&2
  echo "######################################################################" >&2
  exit 125
}

# NAME=value for every variable the peer may see.
ENV_ARGS=(HOME=/root LANG=C.UTF-8 PYTHONDONTWRITEBYTECODE=1)
while IFS= read -r name; do
  case "$name" in
    TORCH_* | MASTER_* | TORCHELASTIC_* | TCPSTORE_* | GLOO_* | RANK | WORLD_SIZE | LOCAL_RANK | \
      LOCAL_WORLD_SIZE | GROUP_RANK | USE_LIBUV | PYTHONUNBUFFERED | PYTHONFAULTHANDLER)
      ENV_ARGS+=("$name=${!name}")
      ;;
  esac
done < <(compgen -e)

case "$VERSION" in
  1.13)
    [ -x /usr/bin/python3 ] || not_ready "/usr/bin/python3 is missing"
    exec /usr/bin/env -i "${ENV_ARGS[@]}" HOME="${HOME:-/root}" PATH="$HERE/host-bin:$BASE_PATH" "$@"
    ;;
  2.6 | 2.14)
    ROOT="$PEERS_DIR/$VERSION"
    [ -f "$ROOT/.tcpstore-ready" ] || not_ready "no ready chroot at $ROOT"
    [ "$(id -u)" = 0 ] || not_ready "running a chroot needs root"
    CWD=$(pwd -P)
    BINDS=("$REPO" /tmp)
    case "$CWD" in
      "$REPO" | "$REPO"/* | /tmp | /tmp/*) ;;
      /) ;;
      *) BINDS+=("$CWD") ;;
    esac
    if [ -n "${TCPSTORE_PEERS_BIND:-}" ]; then
      IFS=: read -r -a extra <<<"$TCPSTORE_PEERS_BIND"
      BINDS+=("${extra[@]}")
    fi
    # In the new mount namespace: proc, dev, sys, the binds; then chroot, cd, exec.
    # shellcheck disable=SC2016 # expanded by the inner shell
    exec unshare --mount --propagation private /bin/bash -c '
      set -e
      root=$1 cwd=$2 nb=$3
      shift 3
      binds=("${@:1:nb}")
      shift "$nb"
      mount -t proc proc "$root/proc"
      mount --rbind /dev "$root/dev"
      mount --rbind /sys "$root/sys"
      for d in "${binds[@]}"; do
        [ -d "$d" ] || continue
        mkdir -p "$root$d"
        mount --rbind "$d" "$root$d"
      done
      exec chroot "$root" /bin/sh -c "cd \"\$1\" && shift && exec \"\$@\"" run.sh "$cwd" "$@"
    ' run.sh "$ROOT" "$CWD" "${#BINDS[@]}" "${BINDS[@]}" \
      /usr/bin/env -i "${ENV_ARGS[@]}" PATH="$BASE_PATH" "$@"
    ;;
  *)
    echo "run.sh: unknown version '$VERSION' (use 1.13, 2.6 or 2.14)" >&2
    exit 2
    ;;
esac
