#!/usr/bin/env python3
"""Real torch gloo jobs through relays (tcpstore-server --upstream), real processes only.

  torch_relay_test.py VERSION RELAYS [--deadline S]    VERSION: 1.13 | 2.6 | 2.14; RELAYS: 1 | 2
Starts an upstream tcpstore-server and RELAYS relays stacked in front of it; the ranks (torch's
own TCPStore client, via tests/python/rank.py and init_method="tcpstore://") talk only to the
front relay. Checks: a 4-rank job (all_reduce, new_group, barrier) completes with the right sum
and releases its keys upstream; a job missing rank 3 fails on every waiting rank within its 3 s
join deadline, naming rank 3 (waits with timeouts, CANCEL_WAIT in 2.x, through the relays).
Exit 77 = skipped (torch peer missing, on purpose).
"""
import argparse
import faulthandler
import os
import re
import signal
import subprocess
import sys
import time

import tcpstore

HERE = os.path.dirname(os.path.abspath(__file__))
PY_TESTS = os.path.join(HERE, "..", "python")
WITH_TORCH = os.path.join(PY_TESTS, "with_torch.sh")
RANK_PY = os.path.join(PY_TESTS, "rank.py")
FAILS = []


def check(cond, what):
    print(("PASS " if cond else "FAIL ") + what, flush=True)
    if not cond:
        FAILS.append(what)


def job(version, url, ranks, world, timeout):
    env = dict(os.environ, GLOO_SOCKET_IFNAME="lo", TORCH_DIST_INIT_BARRIER="1")
    t0 = time.monotonic()
    procs = {r: subprocess.Popen([WITH_TORCH, version, "python3", RANK_PY, url, str(r),
                                  str(world)], stdout=subprocess.PIPE,
                                 stderr=subprocess.STDOUT, text=True, env=env)
             for r in ranks}
    out = {}
    for r, p in procs.items():
        try:
            text, _ = p.communicate(timeout=max(timeout - (time.monotonic() - t0), 1))
        except subprocess.TimeoutExpired:
            p.kill()
            text, _ = p.communicate()
            text += "\n<killed: deadline>"
        out[r] = (p.returncode, text)
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("version")
    ap.add_argument("relays", type=int)
    ap.add_argument("--deadline", type=float, default=300)
    a = ap.parse_args()
    faulthandler.dump_traceback_later(a.deadline, exit=True)
    v = a.version
    logs = [open(f"/tmp/tcpstore-relay-{os.getpid()}-{i}.log", "w+")
            for i in range(a.relays + 1)]
    servers = [tcpstore.Server(stderr=logs[0])]
    try:
        for i in range(1, a.relays + 1):
            servers.append(tcpstore.Server(
                stderr=logs[i], args=["--upstream", f"127.0.0.1:{servers[-1].port}"]))
        front, origin = servers[-1], servers[0]
        res = job(v, f"tcpstore://127.0.0.1:{front.port}/job-ok", range(4), 4, 150)
        if any(rc == 77 or "SKIPPED" in t for rc, t in res.values()):
            print("SKIPPED: torch peer missing", flush=True)
            return 77
        for r, (rc, text) in sorted(res.items()):
            check(rc == 0 and '"sum": 10.0' in text,
                  f"{v} rank {r} of a 4-rank job through {a.relays} relay(s) (rc {rc})")
            if rc:
                print(text)
        c = tcpstore.Client("127.0.0.1", origin.port, timeout=30)
        left = [k for k in c.list_keys() if k.startswith("job-ok/")]
        check(left == [], f"the job released its keys upstream (left: {left[:5]})")

        # The ranks time their own join (torch's start-up in a chroot can take tens of
        # seconds on a loaded machine, so the wall clock of the whole job says little).
        res = job(v, f"tcpstore://127.0.0.1:{front.port}/job-missing?join_timeout=3",
                  range(3), 4, 150)
        for r, (rc, text) in sorted(res.items()):
            m = re.search(r"ERROR JoinError after ([\d.]+) s: (.*)", text)
            ok = (rc == 3 and m and "missing rank(s): 3" in m.group(2) and
                  float(m.group(1)) < 3 + 2.5)
            check(ok, f"{v} rank {r} of a job missing rank 3 (rc {rc}): "
                      f"{m.group(0) if m else text[-300:]}")
            if not ok:
                print(text)
        check(c.get("job-missing/tcpstore/world_size") == b"4",
              "the relays wrote through to the upstream")
        c.close()
    finally:
        for s in reversed(servers):
            s.stop()
    for i, log in enumerate(logs):
        log.seek(0)
        stats = [l for l in log.read().splitlines() if "requests total=" in l]
        print(f"{'upstream' if i == 0 else f'relay {i}'}: {stats[-1] if stats else '?'}")
    print(f"{'FAILED' if FAILS else 'OK'}: {len(FAILS)} failed", flush=True)
    return 1 if FAILS else 0


if __name__ == "__main__":
    sys.exit(main())
