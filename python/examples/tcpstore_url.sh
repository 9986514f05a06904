#!/bin/bash
# A WORLD_SIZE-rank gloo job with init_method="tcpstore://": start tcpstore-server first, every
# rank joins it through torch's own TCPStore client, a missing rank is named within 60 s.
set -euo pipefail
export WORLD_SIZE=${WORLD_SIZE:-4}
coproc STORE { exec tcpstore-server --host 127.0.0.1 --port "${TCPSTORE_PORT:-0}" --world-size "$WORLD_SIZE"; }
read -r line <&"${STORE[0]}"                   # "listening on 127.0.0.1:PORT"
export TCPSTORE_ADDR=127.0.0.1:${line##*:}
export TCPSTORE_JOB_ID=${TCPSTORE_JOB_ID:-example-$$}
pids=()
for r in $(seq 0 $((WORLD_SIZE - 1))); do
  RANK=$r python3 "$(dirname "$0")/train_tcpstore_url.py" & pids+=($!)
done
rc=0; for p in "${pids[@]}"; do wait "$p" || rc=1; done
kill -TERM "$STORE_PID"; wait "$STORE_PID" || true
exit $rc
