#!/usr/bin/python3
"""Rendezvous of up to 96K torch 2.x ranks through relays, on one machine (issue 12 items 4, 7).

For each job size N it runs, alternating, in each repetition:
  direct  one tcpstore-server, the generators' ranks connect to it (N <= --direct-max);
  relays  ceil(N / --relay-ranks) relays (tcpstore-server --upstream, one process each, each on
          its own loopback address 127.0.0.2, .3, ...) in front of one server;
  floor   the same generator processes and ranks against one `tcpstore-bench sized-echo-server`
          per relay position: the same connections and bytes answered by servers doing no work.
The ranks are played by ceil(N / --gen-ranks) `tcpstore-bench init-job` processes (each under
the 20,000-fd cap), started at one common CLOCK_REALTIME instant; each rank does the VALIDATE +
PING handshake, ADD init/ 1, NCCL scalable init (every 128th rank SETs a 128-byte id, every rank
WAITs for all N/128 ids and MULTI_GETs them) and a BARRIER of N (bench/job_slice.h).

Reported per run: wall time (common start to the last rank's barrier release), per-rank p50/p99
over all ranks, connection errors, bad replies, server and relay CPU seconds (/proc/PID/stat,
over the run), load average. Writes <out>/scale96k.json, scale96k.md and scale96k.png.

  /usr/bin/python3 bench/scale/scale_bench.py --build-dir build            # full sweep, 3 reps
  /usr/bin/python3 bench/scale/scale_bench.py --build-dir build --quick    # ~1 min smoke run
Every process it starts is ended by its PID; every run is bounded by --timeout.
"""

import argparse
import datetime
import json
import math
import os
import random
import resource
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time

from scale_report import plot, report_again, summarize, uptime

CLK_TCK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid):
    """utime + stime of a process (all threads), or None."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / CLK_TCK
    except (OSError, IndexError, ValueError):
        return None


TCP_COUNTERS = ("ListenOverflows", "TCPSynRetrans", "TCPTimeouts", "TCPMemoryPressures",
                "TCPRcvQDrop")


def tcp_counters():
    """Machine-wide TcpExt counters of /proc/net/netstat (connect-storm trouble)."""
    try:
        with open("/proc/net/netstat") as f:
            lines = f.read().splitlines()
        for head, vals in zip(lines[::2], lines[1::2]):
            if head.startswith("TcpExt:"):
                d = dict(zip(head.split()[1:], (int(x) for x in vals.split()[1:])))
                return {k: d.get(k, 0) for k in TCP_COUNTERS}
    except (OSError, ValueError):
        pass
    return {k: 0 for k in TCP_COUNTERS}


def tcp_mem_pages_in_use():
    """Pages of kernel memory held by TCP sockets now (/proc/net/sockstat)."""
    try:
        with open("/proc/net/sockstat") as f:
            for line in f:
                if line.startswith("TCP:"):
                    parts = line.split()
                    return int(parts[parts.index("mem") + 1])
    except (OSError, ValueError, IndexError):
        pass
    return 0


TCP_MEM = "/proc/sys/net/ipv4/tcp_mem"


def read_tcp_mem():
    with open(TCP_MEM) as f:
        return f.read().split()


def peak_rss_mib(pid):
    """VmHWM of a process (MiB), or None."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def raise_nofile():
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


class Procs:
    """The processes of one run; stop() ends each by its PID."""

    def __init__(self, tmp):
        self.tmp = tmp
        self.procs = []

    def start(self, name, argv, stdout=subprocess.PIPE):
        err = open(os.path.join(self.tmp, name + ".err"), "w")
        p = subprocess.Popen(argv, stdout=stdout, stderr=err, preexec_fn=raise_nofile)
        err.close()
        p.tag = name
        self.procs.append(p)
        return p

    def stop(self):
        for p in self.procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 10
        for p in self.procs:
            try:
                p.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
            if p.stdout:
                p.stdout.close()
        self.procs = []


def read_listening(p, timeout=15.0):
    """The HOST:PORT of a process's `listening on HOST:PORT` stdout line."""
    deadline = time.monotonic() + timeout
    buf = b""
    fd = p.stdout.fileno()
    while time.monotonic() < deadline:
        r, _, _ = select.select([fd], [], [], 0.2)
        if r:
            chunk = os.read(fd, 4096)
            if not chunk:
                break
            buf += chunk
            for line in buf.decode(errors="replace").splitlines():
                if line.startswith("listening on "):
                    return line[len("listening on "):].strip()
        if p.poll() is not None:
            break
    raise RuntimeError(f"{p.tag} did not print 'listening on' (exit {p.poll()})")


def pct(values, q):
    if not values:
        return float("nan")
    v = sorted(values)
    k = max(0, min(len(v) - 1, int(math.ceil(q / 100.0 * len(v))) - 1))
    return v[k]


def run_one(a, mode, n, tmp):
    """One run: `mode` in direct|relays|floor, n ranks. Returns a result dict."""
    server_bin = os.path.join(a.build_dir, "bin", "tcpstore-server")
    bench_bin = os.path.join(a.build_dir, "bin", "tcpstore-bench")
    relays = 1 if mode == "direct" else max(1, math.ceil(n / a.relay_ranks))
    gens = max(1, math.ceil(n / a.gen_ranks))
    procs = Procs(tmp)
    res = {"mode": mode, "ranks": n, "relays": relays if mode == "relays" else 0,
           "echo_servers": relays if mode == "floor" else 0, "generators": gens,
           "load_before": os.getloadavg()[0]}
    try:
        server_pid, relay_pids, addrs = None, [], []
        if mode in ("direct", "relays"):
            s = procs.start("server", [server_bin, "--host", "127.0.0.1", "--port", "0",
                                       "--log-level", "warn"] + a.server_args.split())
            server_addr = read_listening(s)
            server_pid = s.pid
            if mode == "direct":
                addrs = [server_addr]
            else:
                for r in range(relays):
                    rp = procs.start(f"relay{r}", [server_bin, "--host", f"127.0.0.{2 + r}",
                                                   "--port", "0", "--log-level", "warn",
                                                   "--upstream", server_addr]
                                    + a.relay_args.split())
                    relay_pids.append(rp.pid)
                    addrs.append(rp)
                addrs = [read_listening(rp) for rp in addrs]
        else:
            for r in range(relays):
                ep = procs.start(f"echo{r}", [bench_bin, "sized-echo-server", "--host",
                                              f"127.0.0.{2 + r}", "--sndbuf",
                                              str(a.echo_sndbuf)])
                relay_pids.append(ep.pid)
                addrs.append(ep)
            addrs = [read_listening(ep) for ep in addrs]
        cpu0 = {pid: cpu_seconds(pid) for pid in [server_pid] + relay_pids if pid}
        tcp0 = tcp_counters()
        start_at = time.time_ns() + int(a.start_delay * 1e9)
        prefix = f"s{random.getrandbits(32):08x}"
        gen_procs, per = [], math.ceil(n / gens)
        for g in range(gens):
            first = g * per
            m = min(per, n - first)
            # Generator g's ranks go round-robin over the relays (echo servers) that hold its
            # slice: ranks [r*relay_ranks, (r+1)*relay_ranks) belong to relay r.
            if mode == "direct":
                mine = addrs
            else:
                lo = first // a.relay_ranks
                hi = min(relays, max(lo + 1, math.ceil((first + m) / a.relay_ranks)))
                mine = addrs[lo:hi]
            argv = [bench_bin, "init-job", "--world", str(n), "--first-rank", str(first),
                    "--ranks", str(m), "--start-at", str(start_at), "--addr", ",".join(mine),
                    "--key-prefix", prefix, "--timeout", str(a.timeout), "--quiet",
                    "--json", os.path.join(tmp, f"gen{g}.json")]
            if a.rcvbuf:
                argv += ["--rcvbuf", str(a.rcvbuf)]
            if mode == "floor":
                argv.append("--echo-floor")
            gen_procs.append(procs.start(f"gen{g}", argv, stdout=subprocess.DEVNULL))
        deadline = time.monotonic() + a.start_delay + a.timeout + 30
        peak_pages = 0
        while any(p.poll() is None for p in gen_procs) and time.monotonic() < deadline:
            peak_pages = max(peak_pages, tcp_mem_pages_in_use())
            time.sleep(0.1)
        rcs = []
        for p in gen_procs:
            if p.poll() is None:
                p.kill()
            rcs.append(p.wait())
        cpu1 = {pid: cpu_seconds(pid) for pid in cpu0}
        hwm = {pid: peak_rss_mib(pid) for pid in cpu0}
        tcp1 = tcp_counters()
        cpu = {pid: (cpu1[pid] - cpu0[pid]) if cpu0[pid] is not None and cpu1[pid] is not None
               else None for pid in cpu0}
        done, slices = [], []
        for g in range(gens):
            try:
                with open(os.path.join(tmp, f"gen{g}.json")) as f:
                    j = json.load(f)
            except (OSError, ValueError):
                j = {"finished": False, "done_ms": [], "first_error": "no JSON"}
            done += j.pop("done_ms", [])
            slices.append(j)
        total = sum(j.get("ranks", 0) for j in slices)
        res.update({
            "finished": all(rc == 0 for rc in rcs) and len(done) == n and total == n,
            "exit_codes": rcs,
            "wall_s": max(done) / 1e3 if done else float("nan"),
            "rank_p50_s": pct(done, 50) / 1e3, "rank_p99_s": pct(done, 99) / 1e3,
            "ranks_done": len(done),
            "conn_errors": sum(j.get("conn_errors", 0) for j in slices),
            "bad_replies": sum(j.get("bad_replies", 0) for j in slices),
            "connect_retries": sum(j.get("retries", 0) for j in slices),
            "ranks_failed": sum(j.get("ranks_failed", 0) for j in slices),
            "start_skew_ms_max": max((j.get("start_skew_ms", 0) for j in slices), default=0),
            "generator_cpu_s": [j.get("generator_cpu_s") for j in slices],
            "server_cpu_s": cpu.get(server_pid) if server_pid else None,
            "server_peak_rss_mib": hwm.get(server_pid) if server_pid else None,
            "relay_peak_rss_mib": [hwm[p] for p in relay_pids] if mode == "relays" else [],
            "relay_cpu_s": [cpu[p] for p in relay_pids] if mode == "relays" else [],
            "echo_cpu_s": [cpu[p] for p in relay_pids] if mode == "floor" else [],
            "first_error": next((j["first_error"] for j in slices if j.get("first_error")), ""),
            "load_after": os.getloadavg()[0],
            "tcp": {k: tcp1[k] - tcp0[k] for k in TCP_COUNTERS},
            "tcp_mem_peak_mib": peak_pages * 4096 / 2**20,
        })
    finally:
        procs.stop()
    return res


def sweep(a, modes, runs):
    with tempfile.TemporaryDirectory(prefix="scale96k.") as tmp:
        for rep in range(a.reps):
            for n in a.ranks:
                order = [m for m in modes if m != "direct" or n <= a.direct_max]
                if rep % 2:
                    order.reverse()  # alternate which mode runs first
                for mode in order:
                    run_dir = tempfile.mkdtemp(dir=tmp, prefix=f"{mode}-{n}-")
                    r = run_one(a, mode, n, run_dir)
                    r["rep"] = rep
                    if not r["finished"] or r["conn_errors"] or a.keep_logs:
                        # Keep the processes' stderr of a failed run (every run's with
                        # --keep-logs: the relays print their combining counters at exit).
                        sub = "logs" if a.keep_logs else "failed-logs"
                        keep = os.path.join(a.out, sub, f"{mode}-{n}-rep{rep}")
                        os.makedirs(keep, exist_ok=True)
                        for name in os.listdir(run_dir):
                            if name.endswith(".err"):
                                shutil.copy(os.path.join(run_dir, name), keep)
                        r["logs"] = keep
                    runs.append(r)
                    print(f"rep {rep} N={n} {mode}: "
                          f"{'ok' if r['finished'] else 'DID NOT FINISH'} wall {r['wall_s']:.3f} s "
                          f"p99 {r['rank_p99_s']:.3f} s errors {r['conn_errors']}+"
                          f"{r['bad_replies']}+{r['ranks_failed']} server cpu {r['server_cpu_s']} "
                          f"relay cpu {r['relay_cpu_s']} load {r['load_after']:.2f} tcp {r['tcp']} "
                          f"tcp mem peak {r['tcp_mem_peak_mib']:.0f} MiB"
                          + (f" first error: {r['first_error']}" if r["first_error"] else ""),
                          flush=True)


def on_sigterm(signum, frame):
    raise KeyboardInterrupt(f"signal {signum}")


def main():
    signal.signal(signal.SIGTERM, on_sigterm)
    signal.signal(signal.SIGINT, on_sigterm)
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build-dir", default="build")
    ap.add_argument("--out", default=None, help="results directory (default bench/results, "
                    "--quick: bench/results/quick)")
    ap.add_argument("--ranks", default="1024,2048,4096,8192,16384,32768,65536,98304")
    ap.add_argument("--modes", default="direct,relays,floor")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--relay-ranks", type=int, default=8192)
    ap.add_argument("--gen-ranks", type=int, default=16384,
                    help="most ranks per generator process (fds: one per rank)")
    ap.add_argument("--rcvbuf", type=int, default=0,
                    help="SO_RCVBUF of the generators' sockets (0: kernel autotuning)")
    ap.add_argument("--echo-sndbuf", type=int, default=0,
                    help="SO_SNDBUF of the echo servers' sockets (0: autotuning): their unsent "
                    "replies are then a count in the process, as a server's output queue is")
    ap.add_argument("--direct-max", type=int, default=16384)
    ap.add_argument("--timeout", type=float, default=120, help="per-run bound (s)")
    ap.add_argument("--start-delay", type=float, default=1.5,
                    help="common start this long after the generators are launched")
    ap.add_argument("--tcp-mem", default=None, metavar="MIN,PRESSURE,MAX",
                    help="set net.ipv4.tcp_mem (pages) for the sweep, restored at the end "
                    "(root). 96K ranks move ~10 GB of MULTI_GET replies over loopback; "
                    "Debian's default (~2.2 GiB max on 23 GiB) makes the kernel drop packets")
    ap.add_argument("--server-args", default="", help="extra tcpstore-server flags (the central "
                    "server), e.g. '--max-memory-bytes 17179869184'")
    ap.add_argument("--relay-args", default="", help="extra flags of every relay")
    ap.add_argument("--allow-retried-connects", action="store_true",
                    help="exit 0 even if some connects failed and were retried (every rank "
                         "still finished, no bad reply): the smoke test on a loaded CI machine")
    ap.add_argument("--keep-logs", action="store_true",
                    help="keep every process's stderr under <out>/logs/")
    ap.add_argument("--quick", action="store_true", help="1K and 2K ranks, 1 rep, 512/relay")
    ap.add_argument("--from-json", metavar="FILE", help="no runs: rewrite the markdown and the "
                    "plot next to FILE from its runs")
    a = ap.parse_args()
    if a.from_json:
        return report_again(a.from_json)
    here = os.path.dirname(os.path.abspath(__file__))
    if a.quick:
        a.ranks, a.reps, a.relay_ranks = "1024,2048", 1, 512
    a.ranks = [int(x) for x in a.ranks.split(",")]
    modes = a.modes.split(",")
    out = a.out or os.path.join(here, "..", "results", "quick" if a.quick else "")
    os.makedirs(out, exist_ok=True)
    a.out = out
    cmd = "/usr/bin/python3 bench/scale/scale_bench.py " + " ".join(sys.argv[1:])
    runs, t0 = [], time.monotonic()
    tcp_mem_orig = read_tcp_mem()
    if a.tcp_mem:
        with open(TCP_MEM, "w") as f:
            f.write(" ".join(a.tcp_mem.split(",")))
    a.tcp_mem_used = read_tcp_mem()
    print(f"net.ipv4.tcp_mem = {' '.join(a.tcp_mem_used)} pages"
          f"{' (was ' + ' '.join(tcp_mem_orig) + ')' if a.tcp_mem else ''}", flush=True)
    try:
        sweep(a, modes, runs)
    except KeyboardInterrupt as e:
        print(f"interrupted ({e}): every process this run started has been ended", flush=True)
        return 130
    finally:
        if a.tcp_mem:
            with open(TCP_MEM, "w") as f:
                f.write(" ".join(tcp_mem_orig))
    elapsed = time.monotonic() - t0
    when = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    up = uptime()
    md = summarize(a, runs, elapsed, cmd, when, up)
    stem = os.path.join(out, "scale96k")
    with open(stem + ".json", "w") as f:
        json.dump({"command": cmd, "elapsed_s": elapsed, "uptime": up, "finished_at": when,
                   "options": {k: v for k, v in vars(a).items()}, "runs": runs}, f, indent=1)
    with open(stem + ".md", "w") as f:
        f.write(md)
    plotted = plot(a, runs, stem + ".png")
    print(md)
    print(f"wrote {stem}.json, {stem}.md" + (f", {stem}.png" if plotted else ""))
    def clean(r):
        return (r["finished"] and r["bad_replies"] == 0 and r["ranks_failed"] == 0 and
                (a.allow_retried_connects or r["conn_errors"] == 0))
    return 0 if all(clean(r) for r in runs) else 1


if __name__ == "__main__":
    sys.exit(main())
