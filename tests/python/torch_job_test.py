#!/usr/bin/env python3
"""tcpstore:// with real torch jobs (gloo, real processes) on our tcpstore-server.

  torch_job_test.py VERSION [--relays N] [--deadline S]      VERSION: 1.13 | 2.6 | 2.14
Runs on the host (stdlib + tcpstore); the ranks run with that torch via with_torch.sh.
Checks: a 4-rank job (all_reduce, new_group, barrier) and its key release; a 4-rank job with
rank 3 missing fails on every waiting rank within its 3 s join deadline, naming rank 3; two
jobs at once on one server; a second job reusing a live job's id fails at once (JobConflict),
and after the first job ends the id is free again. Exit 77 = skipped (peer missing, on purpose).
"""
import argparse
import faulthandler
import os
import re
import subprocess
import sys
import time

import tcpstore

import stores

HERE = os.path.dirname(os.path.abspath(__file__))
WITH_TORCH = os.path.join(HERE, "with_torch.sh")
RANK_PY = os.path.join(HERE, "rank.py")
FAILS = []


def check(cond, what):
    print(("PASS " if cond else "FAIL ") + what, flush=True)
    if not cond:
        FAILS.append(what)


class Job:
    def __init__(self, version, url, ranks, world, extra=()):
        # 2.x runs the store-based barrier only with TORCH_DIST_INIT_BARRIER=1: exercise ours.
        env = dict(os.environ, GLOO_SOCKET_IFNAME="lo", TORCH_DIST_INIT_BARRIER="1")
        self.t0 = time.monotonic()
        self.procs = {r: subprocess.Popen([WITH_TORCH, version, "python3", RANK_PY, url, str(r),
                                           str(world), *extra],
                                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                          text=True, env=env)
                      for r in ranks}

    def wait(self, timeout):
        out = {}
        for r, p in self.procs.items():
            try:
                text, _ = p.communicate(timeout=max(timeout - (time.monotonic() - self.t0), 1))
            except subprocess.TimeoutExpired:
                p.kill()
                text, _ = p.communicate()
                text += "\n<killed: deadline>"
            out[r] = (p.returncode, text)
        return out


def skipped(results):
    return any(rc == 77 or "SKIPPED" in t for rc, t in results.values())


def run_ok(version, srv, job, world=4, timeout=120):
    res = Job(version, f"tcpstore://127.0.0.1:{srv.port}/{job}", range(world), world).wait(timeout)
    return res


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("version")
    ap.add_argument("--relays", type=int, default=0, choices=(0, 1, 2),
                    help="run the tests through this many relays in front of the server")
    ap.add_argument("--deadline", type=float, default=400)
    a = ap.parse_args()
    faulthandler.dump_traceback_later(a.deadline, exit=True)
    log = open(os.path.join("/tmp", f"tcpstore-py-{os.getpid()}-server.log"), "w+")
    with stores.store(a.relays, stderr=log) as srv:
        c = tcpstore.Client("127.0.0.1", srv.port, timeout=30)
        v = a.version

        # 1. a 4-rank job, alone on its own server: count its ADDs
        log1 = open(log.name + ".job-ok", "w+")
        with stores.store(a.relays, stderr=log1) as srv1:
            res = run_ok(v, srv1, "job-ok")
            if skipped(res):
                print("SKIPPED: torch peer missing", flush=True)
                return 77
            for r, (rc, text) in sorted(res.items()):
                check(rc == 0 and '"sum": 10.0' in text, f"{v} rank {r} of a 4-rank "
                      f"tcpstore:// job (rc {rc}) {text.strip().splitlines()[-1:] if rc else ''}")
                if rc:
                    print(text)
            c1 = tcpstore.Client("127.0.0.1", srv1.port, timeout=30)
            left = [k for k in c1.list_keys() if k.startswith("job-ok/")]
            check(left == [], f"the finished job released its keys (left: {left[:5]})")
            c1.close()
        log1.seek(0)
        adds = re.findall(r"requests total=.* add=(\d+)", log1.read())
        # Per rank: 1 ADD to join, 1 at exit, 1 per store-based barrier (init_process_group and
        # new_group): 16. torch's own 1.13 barrier alone would add at least one ADD(0) per rank
        # and barrier, and one more every 10 ms of waiting.
        check(adds and int(adds[-1]) <= 16,
              f"{v} no polling: the job sent {adds[-1] if adds else '?'} ADDs in all (<= 16)")
        # 2. rank 3 missing: every waiting rank fails within the 3 s join deadline, naming it
        t0 = time.monotonic()
        res = Job(v, f"tcpstore://127.0.0.1:{srv.port}/job-missing?join_timeout=3", range(3),
                  4).wait(60)
        for r, (rc, text) in sorted(res.items()):
            m = re.search(r"ERROR JoinError after ([\d.]+) s: (.*)", text)
            check(rc == 3 and m and "missing rank(s): 3" in m.group(2) and
                  float(m.group(1)) < 3 + 2.5,
                  f"{v} rank {r} of a job missing rank 3: {m.group(0) if m else text[-300:]}")
        check(time.monotonic() - t0 < 40, "the failed job ended promptly")
        check(c.get("job-missing/tcpstore/rank/0").split()[-1].isdigit(),
              "registration key job-missing/tcpstore/rank/0 = 'host pid'")
        check(not c.check(["job-missing/tcpstore/rank/3"]), "no key for the missing rank")
        check(c.get("job-missing/tcpstore/world_size") == b"4", "world_size key")
        check(b"missing rank(s): 3" in c.get("job-missing/tcpstore/failed"), "failed key")
        # the missing rank arrives late: it fails at once (its own ADD shows the poisoned count)
        late = Job(v, f"tcpstore://127.0.0.1:{srv.port}/job-missing?join_timeout=30", [3],
                   4).wait(60)
        for r, (rc, text) in sorted(late.items()):
            m = re.search(r"ERROR JoinError after ([\d.]+) s: (.*)", text)
            check(rc == 3 and m and float(m.group(1)) < 5 and "joined too late" in m.group(2)
                  and "missing rank(s): 3" in m.group(2),
                  f"{v} late rank {r} of the failed job: {m.group(0)[:200] if m else text[-300:]}")

        # 3. two jobs at once on one server, then a second job reusing a live job's id
        a_job = Job(v, f"tcpstore://127.0.0.1:{srv.port}/job-a", range(2), 2,
                    ["--hold", "ctl/job-a/go"])
        b_job = Job(v, f"tcpstore://127.0.0.1:{srv.port}/job-b", range(2), 2)
        for r, (rc, text) in sorted(b_job.wait(120).items()):
            check(rc == 0 and '"sum": 3.0' in text, f"{v} job-b rank {r} next to job-a (rc {rc})")
        c.wait(["job-a/tcpstore/ready"], timeout=60)
        t0 = time.monotonic()
        dup = Job(v, f"tcpstore://127.0.0.1:{srv.port}/job-a", range(2), 2).wait(60)
        for r, (rc, text) in sorted(dup.items()):
            m = re.search(r"ERROR JobConflict after ([\d.]+) s: (.*)", text)
            check(rc == 3 and m and float(m.group(1)) < 5 and f"rank {r} is already registered"
                  in m.group(2), f"{v} reuse of live job-a's id, rank {r}: "
                  f"{m.group(0)[:200] if m else text[-300:]}")
        c.set("ctl/job-a/go", "1")
        for r, (rc, text) in sorted(a_job.wait(120).items()):
            check(rc == 0 and '"sum": 3.0' in text, f"{v} job-a rank {r} unharmed (rc {rc})")
        again = run_ok(v, srv, "job-a", world=2)
        check(all(rc == 0 for rc, _ in again.values()), f"{v} job-a's id reused after it ended"
              f"{[t.strip().splitlines()[-1:] for rc, t in again.values() if rc]}")
        c.close()
    log.seek(0)
    stats = [l for l in log.read().splitlines() if "requests total=" in l]
    print("server: " + (stats[-1] if stats else "no summary"), flush=True)
    print(f"{'FAILED' if FAILS else 'OK'}: {len(FAILS)} failed", flush=True)
    return 1 if FAILS else 0


if __name__ == "__main__":
    sys.exit(main())
