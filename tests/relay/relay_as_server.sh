#!/bin/bash
# Stands in for the tcpstore-server binary in server-level scripts
# (tests/server/garbage_blast.py): starts a real upstream tcpstore-server,
# then a relay in front of it with this script's arguments, so the script
# talks to the relay exactly as to a server. SIGUSR1/SIGTERM go to the
# relay; once it has exited the upstream is stopped (SIGTERM) and the
# relay's exit code is returned (the upstream's must be 0 too).
# usage: TCPSTORE_SERVER_BIN=build/bin/tcpstore-server relay_as_server.sh ARGS...
set -u
bin=${TCPSTORE_SERVER_BIN:?set TCPSTORE_SERVER_BIN}
tmp=$(mktemp -d)
"$bin" --host 127.0.0.1 --port 0 --log-level error >"$tmp/up.out" 2>"$tmp/up.err" &
up=$!
port=
for _ in $(seq 200); do
  port=$(sed -n 's/^listening on 127\.0\.0\.1://p' "$tmp/up.out")
  [ -n "$port" ] && break
  sleep 0.05
done
if [ -z "$port" ]; then
  echo "relay_as_server: the upstream did not start" >&2
  kill -TERM "$up" 2>/dev/null; wait "$up"; rm -rf "$tmp"; exit 1
fi
"$bin" --upstream "127.0.0.1:$port" "$@" &
relay=$!
trap 'kill -USR1 "$relay" 2>/dev/null' USR1
trap 'kill -TERM "$relay" 2>/dev/null' TERM INT
# wait returns early (> 128) when a trapped signal arrives: wait again.
while :; do
  wait "$relay"
  rc=$?
  kill -0 "$relay" 2>/dev/null || break
done
kill -TERM "$up" 2>/dev/null
wait "$up"
up_rc=$?
rm -rf "$tmp"
if [ "$up_rc" != 0 ]; then
  echo "relay_as_server: the upstream exited with $up_rc" >&2
  [ "$rc" = 0 ] && rc=1
fi
exit "$rc"
