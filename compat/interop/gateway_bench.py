#!/usr/bin/env python3
"""Figures for bench/README.md "etcd gateway": starts a 3-member etcd (gateway.py's fixture), one
`tcpstore-server --backend etcd://` and one in-memory tcpstore-server, and runs the same
tcpstore-bench scenarios against each, REPS times (medians are read off by hand).

  compat/interop/gateway_bench.py [BUILD_BIN_DIR] [REPS]
  compat/interop/gateway_bench.py BUILD_BIN_DIR REPS adds
      adds/s on ONE key through one gateway, with combining (the default) and without
      (`?combine-adds=0`), for several client counts
  compat/interop/gateway_bench.py BUILD_BIN_DIR REPS two-gateways
      the 4096-rank rendezvous (2.x ranks: ADD init/, the add+wait barrier, the NCCL-style id
      exchange) with its ranks spread over TWO gateways of the same job, alternating with one
      gateway and with the in-memory server
"""
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gateway  # noqa: E402
import interop  # noqa: E402

BIN = sys.argv[1] if len(sys.argv) > 1 else "build/bin"
REPS = int(sys.argv[2]) if len(sys.argv) > 2 else 3
MODE = sys.argv[3] if len(sys.argv) > 3 else "scenarios"
ADD_CLIENTS = [1, 16, 64]
SCENARIOS = [
    ["rendezvous", "--dialect", "2.x", "--ranks", "4096", "--barrier", "2.x"],
    ["ops", "--op", "get", "--clients", "1", "--seconds", "3"],
    ["ops", "--op", "set", "--clients", "1", "--seconds", "3"],
    ["ops", "--op", "add", "--clients", "1", "--seconds", "3"],
]


def adds():
    cluster = gateway.EtcdCluster("/usr/bin/etcd")
    servers = []
    try:
        for combine in ("1", "0"):
            srv = gateway.gateway(f"{BIN}/tcpstore-server",
                                  cluster.url(f"adds{combine}") + f"?combine-adds={combine}")
            servers.append(srv)
            for clients in ADD_CLIENTS:
                for _ in range(REPS):
                    args = ["ops", "--addr", f"127.0.0.1:{srv.port}", "--op", "add", "--keys", "1",
                            "--clients", str(clients), "--seconds", "3", "--timeout", "60"]
                    r = subprocess.run([f"{BIN}/tcpstore-bench", *args], capture_output=True,
                                       text=True, timeout=90)
                    print(f"combine-adds={combine} clients={clients}: "
                          f"{r.stdout.strip() or r.stderr.strip()}", flush=True)
    finally:
        for srv in servers:
            srv.stop()
        interop.kill_all()
        cluster.stop()


def two_gateways():
    cluster = gateway.EtcdCluster("/usr/bin/etcd")
    servers = []
    try:
        gw = [gateway.gateway(f"{BIN}/tcpstore-server", cluster.url("bench2")) for _ in range(2)]
        mem = interop.Server([f"{BIN}/tcpstore-server", "--log-level", "warn"], counters=True)
        servers = [*gw, mem]
        targets = [("two gateways", f"127.0.0.1:{gw[0].port},127.0.0.1:{gw[1].port}"),
                   ("one gateway", f"127.0.0.1:{gw[0].port}"),
                   ("in memory", f"127.0.0.1:{mem.port}")]
        for _ in range(REPS):
            for label, addr in targets:
                for sc in (["rendezvous", "--dialect", "2.x", "--ranks", "4096", "--barrier",
                            "2.x"],
                           ["nccl-scalable-init", "--ranks", "4096"]):
                    args = [sc[0], "--addr", addr, *sc[1:], "--timeout", "60", "--quiet"]
                    r = subprocess.run([f"{BIN}/tcpstore-bench", *args], capture_output=True,
                                       text=True, timeout=90)
                    print(f"{label}: {r.stdout.strip() or r.stderr.strip()}", flush=True)
    finally:
        for srv in servers:
            srv.stop()
        interop.kill_all()
        cluster.stop()


def main():
    if MODE == "adds":
        return adds()
    if MODE == "two-gateways":
        return two_gateways()
    cluster = gateway.EtcdCluster("/usr/bin/etcd")
    servers = []
    try:
        servers = [("gateway", gateway.gateway(f"{BIN}/tcpstore-server", cluster.url("bench"))),
                   ("memory", interop.Server([f"{BIN}/tcpstore-server", "--log-level", "warn"],
                                             counters=True))]
        for label, srv in servers:
            for sc in SCENARIOS:
                for _ in range(REPS):
                    args = [sc[0], "--addr", f"127.0.0.1:{srv.port}", *sc[1:], "--timeout", "60"]
                    r = subprocess.run([f"{BIN}/tcpstore-bench", *args], capture_output=True,
                                       text=True, timeout=90)
                    print(f"{label}: {r.stdout.strip() or r.stderr.strip()}", flush=True)
    finally:
        for _, srv in servers:
            srv.stop()
        interop.kill_all()
        cluster.stop()


if __name__ == "__main__":
    main()
