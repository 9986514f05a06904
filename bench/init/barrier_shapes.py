#!/usr/bin/env python3
"""The store-based barrier shapes at 4K-16K generator ranks (tcpstore-bench rendezvous).

  bench/init/barrier_shapes.py [--ranks 4096,8192,16384] [--reps 3] [--build-dir build]
                               [--out bench/results] [--timeout 60]

For each rank count and repetition, alternating: a fresh build/bin/tcpstore-server, then
`tcpstore-bench rendezvous` with
  1.13    --dialect 1.13 --barrier 1.13   (ADD key 1, then ADD key 0 every 10 ms)
  2.x     --dialect 2.x  --barrier 2.x    (ADD 1, ADD 0, last SETs key:last_worker, all WAIT)
  server-1.13 --dialect 1.13 --barrier server (ADD key 1, the last SETs key:done, all WAIT
          on it: what tcpstore:// does on 1.13, which has no BARRIER command)
  server  --dialect 2.x  --barrier server (one BARRIER request per rank)
Each at every --spreads value: ranks start uniformly over that many seconds (0: all at
once); a real job's ranks arrive over seconds, and the 1.13 barrier polls all that time.
1.13 ranks hold 2 connections (main + idle callback) up to 8192 ranks; at 16384 the
callback connection is left out (--conns-per-rank 1): 32768 connections would pass the
20,000-fd cap of one process here. Requests and polls per rank are the generator's own
counts (poll = a request repeated because its condition was not met: the 1.13 barrier's
ADD key 0, rank 0's WAIT+GET init/). Writes OUT/barrier_shapes.{json,md}.
"""
import argparse
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SHAPES = [("1.13", "1.13", "1.13"), ("server-1.13", "1.13", "server"), ("2.x", "2.x", "2.x"),
          ("server", "2.x", "server")]


def run_one(a, ranks, shape, dialect, barrier, spread):
    srv = subprocess.Popen([f"{a.build_dir}/bin/tcpstore-server", "--host", "127.0.0.1",
                            "--port", "0", "--log-level", "warn"], stdout=subprocess.PIPE,
                           stderr=subprocess.DEVNULL, text=True)
    try:
        line = srv.stdout.readline()
        port = int(re.search(r":(\d+)\s*$", line).group(1))
        js = tempfile.mktemp(suffix=".json", prefix="shapes-")
        argv = [f"{a.build_dir}/bin/tcpstore-bench", "rendezvous", "--addr",
                f"127.0.0.1:{port}", "--dialect", dialect, "--barrier", barrier, "--ranks",
                str(ranks), "--server-pid", str(srv.pid), "--timeout", str(a.timeout),
                "--json", js, "--quiet", "--arrival-spread", str(spread)]
        if dialect == "1.13" and ranks > 8192:
            argv += ["--conns-per-rank", "1"]
        p = subprocess.run(argv, capture_output=True, text=True, timeout=a.timeout + 30)
        try:
            with open(js) as f:
                r = json.load(f)
            os.unlink(js)
        except (OSError, ValueError):
            r = {"finished": False, "first_error": p.stderr[-500:]}
        r["shape"] = shape
        r["line"] = p.stdout.strip()
        return r
    finally:
        srv.send_signal(signal.SIGTERM)
        try:
            srv.wait(10)
        except subprocess.TimeoutExpired:
            srv.kill()
            srv.wait()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ranks", default="4096,8192,16384")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--build-dir", default=os.path.join(REPO, "build"))
    ap.add_argument("--out", default=os.path.join(REPO, "bench", "results"))
    ap.add_argument("--timeout", type=float, default=60)
    ap.add_argument("--spreads", default="0,1",
                    help="arrival spreads (s): ranks start uniformly over this window")
    a = ap.parse_args()
    ranks = [int(x) for x in a.ranks.split(",")]
    spreads = [float(x) for x in a.spreads.split(",")]
    load0 = open("/proc/loadavg").read().split()[:3]
    t0 = time.monotonic()
    recs = []
    for rep in range(a.reps):
        for sp in spreads:
            for n in ranks:
                for shape, dialect, barrier in SHAPES:
                    r = run_one(a, n, shape, dialect, barrier, sp)
                    r["rep"] = rep
                    r["spread"] = sp
                    recs.append(r)
                    print(r["line"] or r.get("first_error"), file=sys.stderr, flush=True)
    rows = []
    for sp in spreads:
        for n in ranks:
            for shape, dialect, _ in SHAPES:
                rs = [r for r in recs if r["shape"] == shape and r.get("ranks") == n
                      and r["spread"] == sp]
                ok = [r for r in rs if r.get("finished")]
                row = {"ranks": n, "spread": sp, "shape": shape, "dialect": dialect,
                       "runs": len(rs), "ok": len(ok)}
                if ok:
                    for k in ("wall_s", "rank_p50_s", "rank_p99_s", "requests_per_rank",
                              "polls_per_rank", "server_cpu_s", "conns_per_rank"):
                        row[k] = statistics.median(r[k] for r in ok)
                    row["conn_errors"] = max(r["conn_errors"] for r in ok)
                rows.append(row)
    meta = {"date": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "reps": a.reps, "load_before": load0,
            "load_after": open("/proc/loadavg").read().split()[:3],
            "elapsed_s": time.monotonic() - t0}
    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, "barrier_shapes.json"), "w") as f:
        json.dump({"meta": meta, "summary": rows, "records": recs}, f, indent=1)
    md = [f"barrier shapes: {meta['date']}, {a.reps} repetition(s), medians; load average "
          f"before {' '.join(load0)}, after {' '.join(meta['load_after'])}", "",
          "| ranks | arrival spread (s) | barrier | conns/rank | wall (s) | rank p50 (s) | rank p99 (s) | "
          "requests/rank | polls/rank | server CPU (s) | runs ok |",
          "|---|---|---|---|---|---|---|---|---|---|---|"]
    names = {"1.13": "1.13 polling (ADD 0 every 10 ms)", "2.x": "2.x add + wait",
             "server": "server-side BARRIER (2.x)",
             "server-1.13": "server-side, 1.13 dialect (ADD + one WAIT: tcpstore://)"}
    for r in rows:
        if "wall_s" not in r:
            md.append(f"| {r['ranks']} | {r['spread']:g} | {names[r['shape']]} | | did not finish | | | | | | "
                      f"0/{r['runs']} |")
            continue
        md.append(f"| {r['ranks']} | {r['spread']:g} | {names[r['shape']]} | "
                  f"{r['conns_per_rank']:.0f} | "
                  f"{r['wall_s']:.3f} | {r['rank_p50_s']:.3f} | {r['rank_p99_s']:.3f} | "
                  f"{r['requests_per_rank']:.2f} | {r['polls_per_rank']:.2f} | "
                  f"{r['server_cpu_s']:.2f} | {r['ok']}/{r['runs']} |")
    text = "\n".join(md) + "\n"
    with open(os.path.join(a.out, "barrier_shapes.md"), "w") as f:
        f.write(text)
    print(text)
    return 0 if all(r.get("finished") for r in recs) else 1


if __name__ == "__main__":
    sys.exit(main())
