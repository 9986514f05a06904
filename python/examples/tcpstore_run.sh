#!/bin/bash
# torchrun on tcpstore-server: with no --rdzv_endpoint, tcpstore.run starts the server itself
# and stops it at the end; the script is unchanged (init_process_group("gloo") = env://).
set -euo pipefail
exec python3 -m tcpstore.run --nnodes 1 --nproc_per_node "${NPROC:-4}" \
  "$(dirname "$0")/train_env.py"
