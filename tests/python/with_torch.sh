#!/bin/bash
# with_torch.sh VERSION CMD [ARGS...]: run CMD with torch VERSION (1.13 on the host, 2.6 / 2.14 in
# their chroots via compat/peers/run.sh) with PYTHONPATH set to the repository's python/.
# A missing peer fails (run.sh exits 125, loudly) unless TCPSTORE_SKIP_INTEROP=1: then it exits
# 77, which ctest reports as "Skipped" (SKIP_RETURN_CODE 77).
set -u
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd -P)
REPO=$(cd "$HERE/../.." && pwd -P)
VERSION=$1
shift
PEERS_DIR=${TCPSTORE_PEERS_DIR:-/var/tmp/tcpstore-peers}
if [ "${TCPSTORE_SKIP_INTEROP:-0}" = 1 ]; then
  case "$VERSION" in
    1.13) /usr/bin/python3 -c 'import torch' 2>/dev/null || { echo "SKIPPED: no torch 1.13"; exit 77; } ;;
    *) [ -f "$PEERS_DIR/$VERSION/.tcpstore-ready" ] || { echo "SKIPPED: no torch $VERSION chroot"; exit 77; } ;;
  esac
fi
exec "$REPO/compat/peers/run.sh" "$VERSION" /usr/bin/env PYTHONPATH="$REPO/python" \
  PYTHONUNBUFFERED=1 "$@"
