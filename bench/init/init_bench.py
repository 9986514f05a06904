#!/usr/bin/env python3
"""bench/init: real torch init_process_group("gloo") + one all_reduce, five ways.

  bench/init/init_bench.py [--versions 1.13,2.6] [--worlds 8,16,32,64] [--reps 3]
                           [--ways env,torchstore,agent,url,run] [--no-count]
                           [--budget S] [--job-timeout S] [--build-dir build] [--out DIR]

Runs on the host with any Python 3 (stdlib only); the ranks run with the torch
under test through compat/peers/run.sh (1.13: /usr/bin/python3; 2.6: chroot).

Ways:
  env         torch default env://: rank 0 hosts the store; all ranks start together
  torchstore  torch's own TCPStore server (compat/peers/torch_server.py, same torch)
              started first; every rank an agent-store client (env://)
  agent       tcpstore-server started first; every rank an agent-store client
              (env://, TORCHELASTIC_USE_AGENT_STORE=True: the README recipe)
  url         tcpstore-server started first; init_method="tcpstore://HOST:PORT/JOB"
  run         python -m tcpstore.run --rdzv_endpoint <tcpstore-server started first>

Method: env/torchstore/agent/url fork their ranks from one parent that already
imported torch (and tcpstore.torch); run's workers are started by torchrun
(one interpreter each). Every rank imports torch, opens a start gate (a FIFO),
and the driver releases all ranks at once when all are ready; each rank times
init_process_group + all_reduce from its own release (torch import excluded).
Timed runs: reps x worlds x versions, the ways alternating innermost. Count
runs (one per version, world and way, after the timed runs, not timed):
the ranks dial a counting proxy (bench/init/count_proxy.py) in front of the
store, which counts requests and polls per connection opened after the gate
(env: ranks 1..W-1 only, rank 0 talks to its in-process server directly).
Where the server is ours, its own counters (per command) are kept too.

Writes DIR/init_bench.json, DIR/init_bench.md (table), DIR/init_bench.png (bench/init/report.py).
"""
import argparse
import json
import os
import random
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time

from report import PHASES, WAY_TITLES, plot, summarize, table

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
RUN_SH = os.path.join(REPO, "compat", "peers", "run.sh")
TORCH_SERVER = os.path.join(REPO, "compat", "peers", "torch_server.py")
RANK_PY = os.path.join(HERE, "rank.py")
PROXY_PY = os.path.join(HERE, "count_proxy.py")
WAYS = ["env", "torchstore", "agent", "url", "run"]
def log(*a):
    print(time.strftime("%H:%M:%S"), *a, file=sys.stderr, flush=True)


def free_port():
    """A free port below the ephemeral range (32768+ here), so that the machine's outgoing
    connections cannot take it between this check and rank 0's bind."""
    for _ in range(200):
        port = random.randint(20000, 32000)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
                return port
            except OSError:
                continue
    raise RuntimeError("no free port in 20000-32000")


class Proc:
    """A child in its own process group; stop() ends that group by its id."""

    def __init__(self, argv, stderr=None, env=None):
        self.p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=stderr, text=True,
                                  start_new_session=True, env=env)

    def listening(self, timeout):
        deadline = time.monotonic() + timeout
        import selectors
        sel = selectors.DefaultSelector()
        sel.register(self.p.stdout, selectors.EVENT_READ)
        while time.monotonic() < deadline:
            if sel.select(max(0.0, deadline - time.monotonic())):
                line = self.p.stdout.readline()
                if not line:
                    return None
                m = re.search(r"listening on .*:(\d+)\s*$", line)
                if m:
                    return int(m.group(1))
        return None

    def stop(self, timeout=10):
        if self.p.poll() is None:
            try:
                os.killpg(self.p.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
            try:
                self.p.wait(timeout)
            except subprocess.TimeoutExpired:
                try:
                    os.killpg(self.p.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                self.p.wait()
        return self.p.returncode


def cpu_seconds(pid):
    """utime + stime of a process (ticks of /proc/PID/stat), or None."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return None


def parse_counters(text):
    """The last 'requests total=N cmd=N ...' line of tcpstore-server's stderr."""
    line = None
    for ln in text.splitlines():
        if "requests total=" in ln:
            line = ln
    if line is None:
        return None
    part = line[line.index("requests total="):].split("|")[0]
    return {k: int(v) for k, v in re.findall(r"(\w+)=(\d+)", part)}


def failed_rank(tmp):
    for n in os.listdir(tmp):
        if n.startswith("result."):
            try:
                with open(os.path.join(tmp, n)) as f:
                    x = json.load(f)
            except (OSError, ValueError):
                continue
            if x.get("error"):
                return f"rank {x['rank']}: {x['error']}"
    return None


class Bench:
    def __init__(self, a):
        self.a = a
        self.bin = os.path.join(os.path.abspath(a.build_dir), "bin")
        self.lib = os.path.join(os.path.abspath(a.build_dir), "lib", "libtcpstore.so")
        self.t_start = time.monotonic()
        self.seq = 0

    def left(self):
        return self.a.budget - (time.monotonic() - self.t_start)

    def torch_cmd(self, version, argv):
        return [RUN_SH, version, "/usr/bin/env", f"PYTHONPATH={REPO}/python",
                f"TCPSTORE_LIBRARY={self.lib}",
                f"TCPSTORE_SERVER_BIN={self.bin}/tcpstore-server", "PYTHONUNBUFFERED=1",
                # gloo's address: loopback, as the forked ranks set it (else the host name)
                "GLOO_SOCKET_IFNAME=lo",
                "python3", *argv]

    def job(self, version, way, world, count):
        """One job; returns its record (never raises for a failed job)."""
        self.seq += 1
        rec = {"version": version, "way": way, "world": world, "count_run": count,
               "ok": False, "error": None}
        tmp = tempfile.mkdtemp(prefix=f"initbench-{os.getpid()}-{self.seq}-", dir="/tmp")
        gate = os.path.join(tmp, "gate.fifo")
        exit_fifo = os.path.join(tmp, "exit.fifo")
        os.mkfifo(gate)
        os.mkfifo(exit_fifo)
        gate_fd = os.open(gate, os.O_RDWR)
        exit_fd = os.open(exit_fifo, os.O_RDWR)
        server = proxy = ranks = None
        srv_err = open(os.path.join(tmp, "server.log"), "w+")
        ranks_log = open(os.path.join(tmp, "ranks.log"), "w+")
        proxy_dump = os.path.join(tmp, "proxy.json")
        timeout = self.a.job_timeout
        try:
            # 1. the store, started first (not for env)
            if way == "env":
                port = free_port()
            elif way == "torchstore":
                server = Proc([RUN_SH, version, "python3", TORCH_SERVER, "--host", "127.0.0.1",
                               "--port", "0", "--seconds", str(timeout + 60)], stderr=srv_err)
                port = server.listening(60)
            else:
                server = Proc([f"{self.bin}/tcpstore-server", "--host", "127.0.0.1", "--port",
                               "0", "--world-size", str(world)], stderr=srv_err)
                port = server.listening(20)
            if port is None:
                raise RuntimeError(f"{way}: the store did not start")
            dial = port
            peer_port = None
            if count:
                pport = free_port()
                proxy = Proc([sys.executable, PROXY_PY, "--upstream", f"127.0.0.1:{port}",
                              "--port", str(pport), "--dump", proxy_dump, "--seconds",
                              str(timeout + 60)] + (["--wait-upstream"] if way == "env" else []),
                             stderr=srv_err)
                if way == "env":
                    peer_port = pport  # listens once rank 0's store accepts
                else:
                    if proxy.listening(20) != pport:
                        raise RuntimeError("counting proxy did not start")
                    dial = pport
            addr = f"127.0.0.1:{dial}"
            # 2. the ranks
            common = ["--gate", gate, "--out", tmp, "--start-skew", str(self.a.start_skew)]
            if way == "run":
                argv = ["-m", "tcpstore.run", "--nnodes", "1", "--nproc_per_node", str(world),
                        "--rdzv_endpoint", addr, "--rdzv_id", f"initbench{self.seq}",
                        "--monitor_interval", "0.2", RANK_PY, "worker", *common]
            else:
                argv = [RANK_PY, "fork", "--way", way, "--world", str(world), "--addr",
                        f"127.0.0.1:{port}" if way == "env" else addr,
                        "--job", f"initbench{self.seq}", *common]
                if peer_port:
                    argv += ["--peer-port", str(peer_port)]
            t_launch = time.monotonic()
            ranks = Proc(self.torch_cmd(version, argv), stderr=ranks_log)
            ranks.p.stdout.close()
            deadline = t_launch + timeout

            def count_files(prefix):
                return sum(1 for n in os.listdir(tmp) if n.startswith(prefix))

            while count_files("ready.") < world:
                if time.monotonic() > deadline or ranks.p.poll() is not None:
                    raise RuntimeError(f"only {count_files('ready.')}/{world} ranks got ready")
                time.sleep(0.02)
            rec["ready_s"] = time.monotonic() - t_launch
            time.sleep(0.2)  # the last ready rank is in read() by now (it opened the gate first)
            srv_cpu0 = cpu_seconds(server.p.pid) if server else None
            t_release = time.monotonic()
            os.close(gate_fd)
            gate_fd = None
            polls = 0
            while count_files("result.") < world:
                if time.monotonic() > deadline or ranks.p.poll() is not None:
                    raise RuntimeError(f"only {count_files('result.')}/{world} ranks finished")
                polls += 1
                # every 0.5 s: a rank that failed (the others would wait for it until the
                # deadline); seldom, so that the driver stays off the CPU the ranks need
                failed = failed_rank(tmp) if polls % 50 == 0 else None
                if failed:
                    raise RuntimeError(failed)
                time.sleep(0.01)
            t_all = time.monotonic()
            srv_cpu1 = cpu_seconds(server.p.pid) if server else None
            if srv_cpu0 is not None and srv_cpu1 is not None:
                rec["server_cpu_s"] = srv_cpu1 - srv_cpu0
            os.close(exit_fd)
            exit_fd = None
            try:
                ranks.p.wait(max(5, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
            res = []
            for r in range(world):
                with open(os.path.join(tmp, f"result.{r}")) as f:
                    res.append(json.load(f))
            errs = [f"rank {x['rank']}: {x['error']}" for x in res if x["error"]]
            if errs:
                raise RuntimeError("; ".join(errs[:3]))
            per = [x["t_done"] - x["t_gate"] for x in res]
            init = [x["t_init"] - x["t_gate"] for x in res]
            phases = {}
            for name, a, b in PHASES:
                xs = [x["marks"][b] - (x["t_gate"] if a == "gate" else x["marks"][a])
                      for x in res if b in x.get("marks", {}) and
                      (a == "gate" or a in x["marks"])]
                if name == "all_reduce":
                    xs = [x["t_done"] - x["t_init"] for x in res]
                if len(xs) == world:
                    phases[name] = statistics.median(xs)
            cpus = [x["cpu_s"] for x in res if x.get("cpu_s") is not None]
            if len(cpus) == world:
                rec["ranks_cpu_s"] = sum(cpus)
            rec.update(ok=True, per_rank_s=per, init_only_s=init, phases_p50_s=phases,
                       p50_s=statistics.median(per), max_s=max(per),
                       wall_s=max(x["t_done"] for x in res) - t_release,
                       release_skew_s=max(x["t_gate"] for x in res) - t_release,
                       t_release=t_release, t_all=t_all)
        except Exception as e:  # noqa: BLE001 (recorded)
            rec["error"] = str(e)
        finally:
            for fd in (gate_fd, exit_fd):
                if fd is not None:
                    os.close(fd)
            if ranks is not None:
                rec["ranks_rc"] = ranks.stop(timeout=10)
            if proxy is not None:
                proxy.stop()
            if server is not None:
                server.stop()
            srv_err.seek(0)
            text = srv_err.read()
            if way in ("agent", "url", "run"):
                rec["server_counters"] = parse_counters(text)
            if count and rec.get("ok"):
                rec.update(self.proxy_counts(proxy_dump, rec, world, way))
            if not rec["ok"]:
                ranks_log.seek(0)
                rec["ranks_log_tail"] = ranks_log.read()[-3000:]
                rec["server_log_tail"] = text[-2000:]
            srv_err.close()
            ranks_log.close()
            if rec["ok"] or not self.a.keep_failed:
                shutil.rmtree(tmp, ignore_errors=True)
            else:
                rec["tmp"] = tmp
        return rec

    @staticmethod
    def proxy_counts(path, rec, world, way):
        try:
            with open(path) as f:
                conns = json.load(f)["connections"]
        except (OSError, ValueError) as e:
            return {"count_error": f"no proxy dump: {e}"}
        t0, t1 = rec["t_release"], rec["t_all"]
        reqs = polls = 0
        by_cmd, polls_by_cmd = {}, {}
        nconn = 0
        for c in conns:
            if c["t_accept"] < t0 or c["t_accept"] > t1:
                continue
            nconn += 1
            for t, name, poll in c["requests"]:
                if t > t1:
                    continue
                reqs += 1
                by_cmd[name] = by_cmd.get(name, 0) + 1
                if poll:
                    polls += 1
                    polls_by_cmd[name] = polls_by_cmd.get(name, 0) + 1
        ranks_counted = world - 1 if way == "env" else world
        return {"counted_ranks": ranks_counted, "counted_connections": nconn,
                "requests": reqs, "polls": polls, "requests_by_cmd": by_cmd,
                "polls_by_cmd": polls_by_cmd,
                "requests_per_rank": reqs / ranks_counted, "polls_per_rank": polls / ranks_counted}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--versions", default="1.13,2.6")
    ap.add_argument("--worlds", default="8,16,32,64")
    ap.add_argument("--ways", default=",".join(WAYS))
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--no-count", action="store_true", help="skip the count runs")
    ap.add_argument("--budget", type=float, default=3600, help="global bound (s)")
    ap.add_argument("--job-timeout", type=float, default=180)
    ap.add_argument("--start-skew", type=float, default=0.0, metavar="S",
                    help="each rank starts a uniform random 0..S s after the gate (a real "
                         "job's ranks never start in the same instant); its clock starts then")
    ap.add_argument("--build-dir", default=os.path.join(REPO, "build"))
    ap.add_argument("--out", default=os.path.join(REPO, "bench", "results"))
    ap.add_argument("--name", default="init_bench")
    ap.add_argument("--keep-failed", action="store_true")
    ap.add_argument("--report", metavar="JSON",
                    help="only rebuild the table and plot from a results file")
    a = ap.parse_args()
    if a.report:
        with open(a.report) as f:
            d = json.load(f)
        meta, records = d["meta"], d["records"]
        rows = summarize(records, meta["versions"], meta["worlds"], meta["ways"])
        with open(a.report, "w") as f:
            json.dump({"meta": meta, "summary": rows, "records": records}, f, indent=1)
        md = table(rows, meta)
        base = os.path.splitext(a.report)[0]
        with open(base + ".md", "w") as f:
            f.write(md)
        plot(rows, meta["versions"], meta["worlds"], meta["ways"], base + ".png")
        print(md)
        return 0
    versions = a.versions.split(",")
    worlds = [int(x) for x in a.worlds.split(",")]
    ways = a.ways.split(",")
    for w in ways:
        if w not in WAYS:
            sys.exit(f"unknown way {w}")
    b = Bench(a)
    for f in (f"{b.bin}/tcpstore-server", b.lib):
        if not os.path.exists(f):
            sys.exit(f"missing {f}: cmake --build {a.build_dir} --target tcpstore-server "
                     "tcpstore_shared")
    meta = {"date": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "reps": a.reps,
            "load_before": open("/proc/loadavg").read().split()[:3],
            "cpus": os.cpu_count(), "start_skew_s": a.start_skew, "versions": versions, "worlds": worlds, "ways": ways}
    records = []
    plan = [(v, w, way, False) for _ in range(a.reps) for w in worlds for v in versions
            for way in ways]
    if not a.no_count:
        plan += [(v, w, way, True) for w in worlds for v in versions for way in ways]
    os.makedirs(a.out, exist_ok=True)
    jpath = os.path.join(a.out, f"{a.name}.json")
    for i, (v, w, way, count) in enumerate(plan):
        if b.left() < 30:
            log(f"global budget reached: {len(plan) - i} job(s) not run")
            meta["not_run"] = len(plan) - i
            break
        rec = b.job(v, way, w, count)
        records.append(rec)
        if rec["ok"]:
            extra = (f" req/rank {rec['requests_per_rank']:.1f} polls/rank "
                     f"{rec['polls_per_rank']:.1f}") if "requests_per_rank" in rec else ""
            log(f"[{i + 1}/{len(plan)}] torch {v} W={w} {way}{' (count)' if count else ''}: "
                f"p50 {rec['p50_s']:.3f} s max {rec['max_s']:.3f} s{extra}")
        else:
            log(f"[{i + 1}/{len(plan)}] torch {v} W={w} {way}: FAILED: {rec['error']}")
        meta["elapsed_s"] = time.monotonic() - b.t_start
        with open(jpath, "w") as f:  # after every job: a partial run keeps its results
            json.dump({"meta": meta, "records": records}, f, indent=1)
    meta["elapsed_s"] = time.monotonic() - b.t_start
    meta["load_after"] = open("/proc/loadavg").read().split()[:3]
    rows = summarize(records, versions, worlds, ways)
    with open(jpath, "w") as f:
        json.dump({"meta": meta, "summary": rows, "records": records}, f, indent=1)
    md = table(rows, meta)
    with open(os.path.join(a.out, f"{a.name}.md"), "w") as f:
        f.write(md)
    plot(rows, versions, worlds, ways, os.path.join(a.out, f"{a.name}.png"))
    print(md)
    return 0 if all(r["ok"] for r in records) else 1


if __name__ == "__main__":
    sys.exit(main())
