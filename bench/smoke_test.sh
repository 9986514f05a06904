#!/bin/bash
# Smoke test of tcpstore-bench against tcpstore-server (behaviour, not speed):
# every scenario finishes with zero connection errors and writes its JSON.
#   bench/smoke_test.sh BIN_DIR
set -euo pipefail
BIN=${1:?usage: smoke_test.sh BIN_DIR}
TMP=$(mktemp -d /tmp/tcpstore-bench-smoke.XXXXXX)
SERVER_PID=
cleanup() {
  if [ -n "$SERVER_PID" ]; then kill "$SERVER_PID" 2>/dev/null || true; wait "$SERVER_PID" 2>/dev/null || true; fi
  rm -rf "$TMP"
}
trap cleanup EXIT
"$BIN/tcpstore-server" --port 0 --host 127.0.0.1 --log-level warn >"$TMP/server.out" 2>"$TMP/server.err" &
SERVER_PID=$!
for _ in $(seq 100); do grep -q '^listening on ' "$TMP/server.out" && break; sleep 0.05; done
ADDR=$(sed -n 's/^listening on //p' "$TMP/server.out")
[ -n "$ADDR" ] || { echo "FAIL: server did not print 'listening on'"; cat "$TMP/server.err"; exit 1; }
B=("$BIN/tcpstore-bench")
run() {
  local name=$1; shift
  if ! "${B[@]}" "$@" --addr "$ADDR" --server-pid "$SERVER_PID" --timeout 20 --quiet --json "$TMP/$name.json" >"$TMP/$name.out"; then
    echo "FAIL: $name: tcpstore-bench $*"; cat "$TMP/$name.out"; exit 1
  fi
  cat "$TMP/$name.out"
  grep -q '"finished": false' "$TMP/$name.json" && { echo "FAIL: $name did not finish"; exit 1; }
  if grep -Eq '"(conn_errors|conn_lost)": [1-9]' "$TMP/$name.json"; then echo "FAIL: $name had connection errors"; exit 1; fi
  return 0
}
run r113 rendezvous --dialect 1.13 --ranks 64
run r2x rendezvous --dialect 2.x --ranks 64
run rsrv rendezvous --dialect 2.x --barrier server --ranks 64
run rsrv113 rendezvous --dialect 1.13 --barrier server --ranks 64
for name in r113 r2x rsrv rsrv113; do
  grep -q '"polls_per_rank"' "$TMP/$name.json" || { echo "FAIL: $name: no polls_per_rank"; exit 1; }
done
run get ops --op get --clients 2 --pipeline 2 --idle 16 --seconds 0.3 --warmup 0.1
run mix113 ops --dialect 1.13 --op mix --clients 2 --pipeline 4 --seconds 0.3 --warmup 0.1
run mem memory --keys 2000 --idle 8
run nccl nccl-scalable-init --ranks 300
run nccl113 nccl-scalable-init --dialect 1.13 --ranks 300
run nccl_floor nccl-scalable-init --ranks 300 --echo-floor
run gloo gloo-mesh --ranks 24
run gloo_floor gloo-mesh --ranks 24 --echo-floor
run hb heartbeat --ranks 64 --seconds 1
run hb_floor heartbeat --ranks 64 --seconds 1 --echo-floor
grep -q '"reply_bytes": 123900' "$TMP/nccl.json" || { echo "FAIL: nccl-scalable-init reply bytes"; exit 1; }
grep -q '"checks": 64' "$TMP/hb.json" || { echo "FAIL: heartbeat did not answer 64 CHECKs"; exit 1; }
grep -q '"keys": 2000' "$TMP/mem.json" || { echo "FAIL: memory did not store 2000 keys"; exit 1; }
"${B[@]}" ops --op echo --seconds 0.3 --warmup 0.1 --quiet >"$TMP/echo.out" || { echo "FAIL: echo"; exit 1; }
cat "$TMP/echo.out"
echo "PASS"
