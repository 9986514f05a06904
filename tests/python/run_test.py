#!/usr/bin/env python3
"""python -m tcpstore.run (torchrun on tcpstore-server), 4 workers, real torch.

  run_test.py VERSION [--relays N] [--deadline S]
1. no --rdzv-endpoint: tcpstore.run starts its own tcpstore-server and stops it at the end;
2. --rdzv-endpoint of a tcpstore-server this test started (separate process): the agents'
   rendezvous state and the workers' job keys are on it.
Exit 77 = skipped (peer missing, on purpose).
"""
import argparse
import faulthandler
import json
import os
import re
import subprocess
import sys
import time

import tcpstore

import stores

HERE = os.path.dirname(os.path.abspath(__file__))
WITH_TORCH = os.path.join(HERE, "with_torch.sh")
TRAIN = os.path.join(HERE, "train.py")
FAILS = []


def check(cond, what):
    print(("PASS " if cond else "FAIL ") + what, flush=True)
    if not cond:
        FAILS.append(what)


def launch(version, extra, timeout):
    env = dict(os.environ, GLOO_SOCKET_IFNAME="lo")
    p = subprocess.run([WITH_TORCH, version, "python3", "-m", "tcpstore.run", *extra,
                        "--nnodes", "1", "--nproc_per_node", "4", TRAIN],
                       capture_output=True, text=True, env=env, timeout=timeout)
    # Workers share the agent's stdout: lines may interleave, so find each JSON object.
    results = [json.loads(m.group(1)) for m in re.finditer(r"RESULT (\{[^{}]*\})", p.stdout)]
    return p, results, p.stdout + p.stderr


def check_results(v, what, p, results, text):
    ok = (p.returncode == 0 and sorted(r["rank"] for r in results) == [0, 1, 2, 3] and
          all(r["sum"] == 10.0 and r["world"] == 4 and r["on_tcpstore"] for r in results))
    check(ok, f"{v} {what}: 4 workers, all_reduce 10 (rc {p.returncode})")
    if not ok:
        print(text[-3000:])
    check("all 4 workers joined" in text, f"{v} {what}: join progress shown")
    if v != "1.13":
        check(all(r["master_port"] == r["endpoint"].rsplit(":", 1)[1] for r in results),
              f"{v} {what}: workers' MASTER_PORT is the tcpstore-server (no agent store)")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("version")
    ap.add_argument("--relays", type=int, default=0, choices=(0, 1, 2),
                    help="run the tests through this many relays in front of the server")
    ap.add_argument("--deadline", type=float, default=300)
    a = ap.parse_args()
    faulthandler.dump_traceback_later(a.deadline, exit=True)
    v = a.version

    p, results, text = launch(v, [], 150)
    if p.returncode == 77:
        print("SKIPPED: torch peer missing", flush=True)
        return 77
    check_results(v, "own server", p, results, text)
    m = re.search(r"started tcpstore-server pid (\d+) on (\S+)", text)
    check(m is not None, "tcpstore.run started a tcpstore-server")
    if m:
        pid = int(m.group(1))
        check(not os.path.exists(f"/proc/{pid}") or
              open(f"/proc/{pid}/stat").read().split()[2] == "Z",
              f"its server (pid {pid}) is stopped at the end")

    log = open(os.path.join("/tmp", f"tcpstore-py-run-{os.getpid()}-server.log"), "w+")
    with stores.store(a.relays, stderr=log) as srv:
        run_id = f"run{os.getpid()}"
        p, results, text = launch(v, ["--rdzv_endpoint", srv.address, "--rdzv_id", run_id], 150)
        check_results(v, "external server", p, results, text)
        c = tcpstore.Client("127.0.0.1", srv.port, timeout=10)
        check(c.check([f"torch.rendezvous.{run_id}"]),
              f"the agents' rendezvous state torch.rendezvous.{run_id} is on the server")
        left = [k for k in c.list_keys() if k.startswith(f"{run_id}/")]
        check(left == [], f"the workers' job {run_id}/attempt_0 ran there and was released "
              f"(left: {left[:5]})")
        c.close()
    print(f"{'FAILED' if FAILS else 'OK'}: {len(FAILS)} failed", flush=True)
    return 1 if FAILS else 0


if __name__ == "__main__":
    sys.exit(main())
