#!/bin/bash
# examples_test.sh VERSION BIN_DIR SCRIPT N: runs python/examples/SCRIPT with torch VERSION, the
# build's binaries first on PATH; passes if it exits 0 and printed N "all_reduce -> N" lines.
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd -P)
REPO=$(cd "$HERE/../.." && pwd -P)
version=$1 bin=$2 script=$3 n=$4
out=$("$HERE/with_torch.sh" "$version" /usr/bin/env PATH="$bin:/usr/local/bin:/usr/bin:/bin" \
  GLOO_SOCKET_IFNAME=lo WORLD_SIZE="$n" NPROC="$n" \
  timeout -k 5 150 bash "$REPO/python/examples/$script") || {
  rc=$?
  [ "$rc" = 77 ] && exit 77
  echo "$out"
  echo "FAIL: $script exited $rc"
  exit 1
}
echo "$out"
got=$(grep -oE "all_reduce -> ${n}([^0-9.]|$)" <<<"$out" | wc -l)
[ "$got" = "$n" ] || { echo "FAIL: $got of $n ranks reported all_reduce -> $n"; exit 1; }
echo "PASS: $script with torch $version"
