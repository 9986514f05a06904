#!/bin/bash
# Smoke test of tcpstore-bench against tcpstore-server (behaviour, not speed):
# every scenario finishes with zero connection errors and writes its JSON;
# abuse (scaled down, against a second server with an 8 MiB budget so the
# budget's refusals happen) finishes with the honest clients' data exact.
#   bench/smoke_test.sh BIN_DIR
set -euo pipefail
BIN=${1:?usage: smoke_test.sh BIN_DIR}
TMP=$(mktemp -d /tmp/tcpstore-bench-smoke.XXXXXX)
SERVER_PID=
ABUSE_PID=
cleanup() {
  for p in $SERVER_PID $ABUSE_PID; do kill "$p" 2>/dev/null || true; wait "$p" 2>/dev/null || true; done
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

"$BIN/tcpstore-server" --port 0 --host 127.0.0.1 --log-level error --max-memory-bytes 8388608 \
  --partial-request-ms 1000 >"$TMP/abuse-server.out" 2>"$TMP/abuse-server.err" &
ABUSE_PID=$!
for _ in $(seq 100); do grep -q '^listening on ' "$TMP/abuse-server.out" && break; sleep 0.05; done
ABUSE_ADDR=$(sed -n 's/^listening on //p' "$TMP/abuse-server.out")
[ -n "$ABUSE_ADDR" ] || { echo "FAIL: abuse server did not print 'listening on'"; exit 1; }
rc=0
"${B[@]}" abuse --addr "$ABUSE_ADDR" --server-pid "$ABUSE_PID" --scale 0.05 --hold 0.3 \
  --settle 3 --partial-linger 5 --timeout 60 --quiet --json "$TMP/abuse.json" >"$TMP/abuse.out" || rc=$?
if [ "$rc" != 0 ]; then echo "FAIL: abuse (exit code $rc)"; cat "$TMP/abuse.out"; exit 1; fi
cat "$TMP/abuse.out"
for want in '"finished": true' '"honest_exact": true' '"probe_lost": 0' '"first_reply_missing": 0' '"refused": 1'; do
  grep -q "$want" "$TMP/abuse.json" || { echo "FAIL: abuse: no $want in its JSON"; exit 1; }
done
echo "PASS"
