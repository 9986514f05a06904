#!/usr/bin/env python3
"""Gateway tests: real torch jobs through two `tcpstore-server --backend etcd://` processes over
a real 3-member etcd cluster (Debian's etcd-server) on loopback.

  gateway.py --server-bin PATH [--etcd-bin PATH] [--deadline S] init-pg VERSION
      a gloo job of 4 ranks, even ranks on gateway A and odd ranks on gateway B; then a waiter
      on A woken by a setter on B, and adders on both gateways (exact total)
  gateway.py ... shared VERSION_113 VERSION_2X
      a 1.13 job and a 2.x job at once on one etcd under different prefixes (two gateways
      each); then the lifetime: `--delete-prefix` ends each job's state (and only that job's)
  gateway.py ... faults VERSION
      kill the etcd leader while the job's ranks rendezvous (the job completes), keep it dead,
      then run a second job on the two members left (service goes on)
  gateway.py ... cli
      the flag's errors: bad URL (exit 2), unreachable etcd at start (exit 3)
  gateway.py ... race VERSION
      gets racing sets of the same fresh keys on one gateway: no wake-up lost
  gateway.py ... restart VERSION
      a client waiting on gateway A sees a clean error (closed connection) when A stops; a new
      gateway on the same prefix serves the state written before

Every process started here is killed by PID on the deadline. Needs only the Python standard
library; torch runs through compat/peers/run.sh as in interop.py (whose helpers this reuses).
"""
import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import interop  # noqa: E402  (the interop driver: Server, Peer, totals, process bookkeeping)
from interop import T, Peer, Server, say, spawn  # noqa: E402
from gateway_server import free_port, free_ports  # noqa: E402  (one copy of the port pickers)


class EtcdCluster:
    """Three etcd members on loopback; data under a temporary directory removed at the end."""

    NAMES = ("m0", "m1", "m2")

    def __init__(self, etcd_bin):
        self.bin = etcd_bin
        self.root = tempfile.mkdtemp(prefix="tcpstore-gw-etcd-")
        ports = free_ports(2 * len(self.NAMES))
        self.client = ports[:len(self.NAMES)]
        self.peer = ports[len(self.NAMES):]
        self.procs = [None] * len(self.NAMES)
        cluster = ",".join(f"{n}=http://127.0.0.1:{p}" for n, p in zip(self.NAMES, self.peer))
        for i, name in enumerate(self.NAMES):
            cmd = [self.bin, f"--name={name}", f"--data-dir={self.root}/{name}",
                   f"--listen-client-urls=http://127.0.0.1:{self.client[i]}",
                   f"--advertise-client-urls=http://127.0.0.1:{self.client[i]}",
                   f"--listen-peer-urls=http://127.0.0.1:{self.peer[i]}",
                   f"--initial-advertise-peer-urls=http://127.0.0.1:{self.peer[i]}",
                   f"--initial-cluster={cluster}", "--initial-cluster-state=new",
                   f"--initial-cluster-token=tcpstore-gw-{os.getpid()}",
                   "--heartbeat-interval=50", "--election-timeout=500",
                   "--logger=zap", "--log-outputs=stderr"]
            log = open(os.path.join(self.root, f"{name}.log"), "w")
            self.procs[i] = spawn(cmd, stdout=log, stderr=log)
        say(f"etcd members on client ports {self.client}")
        self.wait_leader(60)

    def url(self, prefix):
        return "etcd://" + ",".join(f"127.0.0.1:{p}" for p in self.client) + f"/{prefix}"

    def status(self, i):
        req = urllib.request.Request(f"http://127.0.0.1:{self.client[i]}/v3/maintenance/status",
                                     data=b"{}", method="POST")
        try:
            with urllib.request.urlopen(req, timeout=1) as r:
                return json.loads(r.read())
        except (OSError, ValueError):
            return None

    def leader(self):
        for i, p in enumerate(self.procs):
            if p is None or p.poll() is not None:
                continue
            st = self.status(i)
            if st and st.get("leader") and st.get("leader") == st.get("header", {}).get("member_id"):
                return i
        return None

    def wait_leader(self, timeout):
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            leader = self.leader()
            if leader is not None:
                return leader
            time.sleep(0.05)  # polling etcd's status endpoint (no event to wait on)
        T.bad("etcd cluster", f"no leader within {timeout} s (logs in {self.root})")
        sys.exit(T.finish())

    def kill(self, i):
        p = self.procs[i]
        if p is not None and p.poll() is None:
            p.kill()
            p.wait(10)
        say(f"etcd member {self.NAMES[i]} killed (SIGKILL)")

    def stop(self):
        for i in range(len(self.procs)):
            self.kill(i)
        shutil.rmtree(self.root, ignore_errors=True)


def gateway(server_bin, url):
    return Server([server_bin, "--backend", url], counters=True)


def rank_env(version, gw_port, ranks, rank, init_barrier=False):
    env = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(gw_port), "WORLD_SIZE": str(ranks),
           "RANK": str(rank), "LOCAL_RANK": str(rank),
           "GLOO_SOCKET_IFNAME": "lo", "TORCHELASTIC_USE_AGENT_STORE": "True"}
    if version == "1.13":
        env["TORCHELASTIC_RESTART_COUNT"] = "0"
    if init_barrier:
        env["TORCH_DIST_INIT_BARRIER"] = "1"
    return env


def start_job(version, gateways, ranks=4, tag=""):
    """One gloo job; rank r talks to gateways[r % len(gateways)]."""
    procs = []
    for r in range(ranks):
        gw = gateways[r % len(gateways)]
        procs.append(Peer(version, "initpg", gw.port, env=rank_env(version, gw.port, ranks, r),
                          name=f"{tag}{version} rank {r} (gateway :{gw.port})"))
    return procs


def finish_job(version, procs, what):
    oks = [p.finish(240) for p in procs]
    T.check(all(oks), what, "some rank failed")
    return all(oks)


def from_rank0_key(version):
    # Where rank 0's `from_rank0` lands (see interop.mode_init_pg).
    return "/worker/attempt_0/default_pg/from_rank0" if version == "1.13" else "default_pg/0//from_rank0"


def cross_gateway_checks(version, a, b):
    # The job's state is in etcd: the other gateway reads what rank 0 wrote through its own.
    for gw in (a, b):
        Peer(version, "waiter", gw.port, "--key", from_rank0_key(version), "--value", "hello",
             name=f"{version} reads from_rank0 on :{gw.port}").finish(90)
    # A waiter on A is released by a set through B (B's write reaches A's etcd watch).
    key = f"gw_wait_{version}"
    w = Peer(version, "waiter", a.port, "--key", key, "--value", "through B",
             name=f"{version} waiter on A")
    if not w.waiting.wait(90):
        T.bad(w.name, "never reached its wait")
    else:
        T.check(a.wait_count("wait", 1, 60), "gateway A received the WAIT", "no WAIT counted")
        Peer(version, "setter", b.port, "--key", key, "--value", "through B",
             name=f"{version} setter on B").finish(90)
    w.finish(90)
    # Concurrent adds through both gateways are exact.
    times = 100
    adders = [Peer(version, "adder", gw.port, "--key", "gw_counter", "--times", times,
                   name=f"{version} adder on :{gw.port}") for gw in (a, b)]
    ok = all([x.finish(120) for x in adders])
    last = Peer(version, "adder", a.port, "--key", "gw_counter", "--times", 1,
                name=f"{version} final adder")
    if last.finish(90) and ok:
        v = last.value("VALUE")
        T.check(v == str(2 * times + 1), "adds through two gateways are exact",
                f"final value {v!r}, want {2 * times + 1}")


def delete_prefix(server_bin, url):
    r = subprocess.run([server_bin, "--backend", url, "--delete-prefix"], capture_output=True,
                       text=True, timeout=60, stdin=subprocess.DEVNULL)
    say(f"delete-prefix {url}: exit {r.returncode}: {r.stdout.strip()} {r.stderr.strip()}")
    if r.returncode != 0:
        return None
    try:
        return int(r.stdout.split()[1])
    except (IndexError, ValueError):
        return None


def mode_init_pg(cluster, server_bin, version):
    a = gateway(server_bin, cluster.url("job-a"))
    b = gateway(server_bin, cluster.url("job-a"))
    finish_job(version, start_job(version, [a, b]), f"gloo job x4 on torch {version} through 2 gateways")
    cross_gateway_checks(version, a, b)
    return [a, b]


def mode_shared(cluster, server_bin, v113, v2):
    gws = {v: [gateway(server_bin, cluster.url(f"job-{v}")) for _ in range(2)] for v in (v113, v2)}
    jobs = [(v, start_job(v, gws[v], tag="shared ")) for v in (v113, v2)]
    for v, procs in jobs:
        finish_job(v, procs, f"gloo job x4 on torch {v} sharing etcd (prefix job-{v})")
    for v in (v113, v2):
        a, b = gws[v]
        Peer(v, "waiter", b.port, "--key", from_rank0_key(v), "--value", "hello",
             name=f"{v} reads from_rank0 on its gateway B").finish(90)
    # Lifetime: the end of one job's state leaves the other's intact.
    n = delete_prefix(server_bin, cluster.url(f"job-{v113}"))
    T.check(n is not None and n > 0, "delete-prefix removes the 1.13 job's keys", f"deleted {n}")
    n = delete_prefix(server_bin, cluster.url(f"job-{v113}"))
    T.check(n == 0, "delete-prefix again finds nothing left", f"deleted {n}")
    a2, _ = gws[v2]
    Peer(v2, "waiter", a2.port, "--key", from_rank0_key(v2), "--value", "hello",
         name=f"{v2} job's key survives the other job's delete").finish(90)
    n = delete_prefix(server_bin, cluster.url(f"job-{v2}"))
    T.check(n is not None and n > 0, "delete-prefix removes the 2.x job's keys", f"deleted {n}")
    return gws[v113] + gws[v2]


def mode_faults(cluster, server_bin, version):
    a = gateway(server_bin, cluster.url("job-f"))
    b = gateway(server_bin, cluster.url("job-f"))
    procs = start_job(version, [a, b], tag="faults ")
    # Kill the leader once the rendezvous has begun (the gateways counted requests).
    began = a.wait_count("total", 1, 120) and b.wait_count("total", 1, 120)
    T.check(began, "the rendezvous reached both gateways", "no request counted")
    leader = cluster.leader()
    T.check(leader is not None, "etcd has a leader before the kill", "none")
    if leader is not None:
        cluster.kill(leader)
    done_early = all(p.proc.poll() is not None for p in procs)
    say(f"leader killed; ranks already finished: {done_early}")
    finish_job(version, procs, f"gloo job x4 on torch {version} completes across a leader kill")
    # The killed member stays dead: a second job (its own prefix, two new gateways) on the two
    # members left, and the first gateways still answer.
    cluster.wait_leader(30)
    c = gateway(server_bin, cluster.url("job-f2"))
    d = gateway(server_bin, cluster.url("job-f2"))
    finish_job(version, start_job(version, [c, d], tag="after "),
               f"a second job on torch {version} with one etcd member gone")
    Peer(version, "waiter", b.port, "--key", from_rank0_key(version), "--value", "hello",
         name=f"{version} first job's key read after the kill").finish(90)
    return [a, b, c, d]


def mode_restart(cluster, server_bin, version):
    url = cluster.url("job-r")
    a = gateway(server_bin, url)
    b = gateway(server_bin, url)
    Peer(version, "setter", b.port, "--key", "before_restart", "--value", "kept",
         name=f"{version} setter on B").finish(90)
    w = Peer(version, "waiter", a.port, "--key", "never_set", "--value", "x",
             name=f"{version} waiter on A (A stops)")
    if not w.waiting.wait(90):
        T.bad(w.name, "never reached its wait")
    else:
        T.check(a.wait_count("wait", 1, 60), "gateway A received the WAIT", "no WAIT counted")
        T.check(a.stop() == 0, "gateway A stops cleanly (SIGTERM)", "bad exit status")
        try:
            w.proc.wait(90)
        except subprocess.TimeoutExpired:
            T.bad(w.name, "still waiting 90 s after its gateway stopped")
        w.thread.join(10)
        fails = [line for line in w.lines if line.startswith("FAIL ")]
        say(f"waiter's error: {fails}")
        T.check(len(fails) == 1 and "AssertionError" not in fails[0]
                and "timeout" not in fails[0].lower(),
                "the waiter sees an error (closed connection), not a value or a timeout",
                f"waiter lines: {fails}")
    a2 = gateway(server_bin, url)
    Peer(version, "waiter", a2.port, "--key", "before_restart", "--value", "kept",
         name=f"{version} reads through the restarted gateway").finish(90)
    return [a2, b]


RACE_CLIENT = r"""
import sys, threading, datetime, torch.distributed as dist
port, n = int(sys.argv[1]), int(sys.argv[2])
td = datetime.timedelta(seconds=5)
kw = {"use_libuv": False} if "use_libuv" in (dist.TCPStore.__init__.__doc__ or "") else {}
a = dist.TCPStore("127.0.0.1", port, None, False, td, **kw)
b = dist.TCPStore("127.0.0.1", port, None, False, td, **kw)
lost = 0
for i in range(n):
    k = f"race{i}"
    t = threading.Thread(target=a.set, args=(k, "v"))
    t.start()
    try:
        b.get(k)
    except RuntimeError as e:
        lost += 1
        print(f"LOST {k}: {e}", flush=True)
        b = dist.TCPStore("127.0.0.1", port, None, False, td, **kw)
    t.join()
print(f"RACE lost {lost} of {n}", flush=True)
"""


def mode_race(cluster, server_bin, version):
    # A get (WAIT + GET) racing a set of the same fresh key, both on one gateway: the wake-up
    # must never be lost (it was, 1 in 10, when a Put reached the watch during the WAIT's read).
    gw = gateway(server_bin, cluster.url("job-race"))
    n = 150
    r = subprocess.run([interop.RUN_SH, version, "python3", "-c", RACE_CLIENT, str(gw.port), str(n)],
                       capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL)
    out = r.stdout.strip().splitlines()
    for line in out[-6:]:
        say(f"  [race] {line}")
    T.check(r.returncode == 0 and f"RACE lost 0 of {n}" in out,
            f"{n} racing set/get pairs on one gateway: no lost wake-up",
            f"exit {r.returncode}: {out[-1] if out else r.stderr.strip()[-300:]}")
    return [gw]


def mode_cli(server_bin):
    """The flag's errors (no etcd, no torch needed)."""
    def run(*args):
        r = subprocess.run([server_bin, *args, "--port", "0"], capture_output=True, text=True,
                           timeout=30, stdin=subprocess.DEVNULL)
        say(f"{' '.join(args)}: exit {r.returncode}; stderr {r.stderr.strip()!r}")
        return r
    r = run("--backend", "etcd://no-port")
    T.check(r.returncode == 2 and "bad value for --backend" in r.stderr,
            "a bad etcd URL is exit 2 with one clear line", f"exit {r.returncode}")
    r = run("--backend", "redis://x:1")
    T.check(r.returncode == 2, "an unknown backend is exit 2", f"exit {r.returncode}")
    r = run("--delete-prefix")
    T.check(r.returncode == 2, "--delete-prefix without etcd is exit 2", f"exit {r.returncode}")
    r = run("--backend", f"etcd://127.0.0.1:{free_port()}/x")
    T.check(r.returncode == 3 and "etcd not reachable" in r.stderr,
            "an unreachable etcd at start is exit 3", f"exit {r.returncode}")
    return []


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--server-bin", required=True)
    ap.add_argument("--etcd-bin", default=shutil.which("etcd") or "/usr/bin/etcd")
    ap.add_argument("--deadline", type=float, default=600)
    ap.add_argument("mode", choices=["cli", "race", "init-pg", "shared", "faults", "restart"])
    ap.add_argument("versions", nargs="*")
    args = ap.parse_args()

    signal.signal(signal.SIGALRM, interop.on_deadline)
    signal.alarm(int(args.deadline))
    signal.signal(signal.SIGTERM, interop.on_deadline)
    if not os.access(args.server_bin, os.X_OK):
        interop.skip_or_fail(f"server binary {args.server_bin!r} does not exist")
    if not os.access(args.etcd_bin, os.X_OK):
        interop.skip_or_fail(f"etcd binary {args.etcd_bin!r} missing (Debian etcd-server)")
    for v in args.versions:
        interop.require_peer(v)

    if args.mode == "cli":
        mode_cli(args.server_bin)
        return T.finish()
    cluster = EtcdCluster(args.etcd_bin)
    gws = []
    try:
        v = args.versions
        if args.mode == "init-pg":
            gws = mode_init_pg(cluster, args.server_bin, v[0])
        elif args.mode == "shared":
            gws = mode_shared(cluster, args.server_bin, v[0], v[1])
        elif args.mode == "race":
            gws = mode_race(cluster, args.server_bin, v[0])
        elif args.mode == "faults":
            gws = mode_faults(cluster, args.server_bin, v[0])
        else:
            gws = mode_restart(cluster, args.server_bin, v[0])
        for gw in gws:
            T.check(gw.alive(), f"gateway :{gw.port} still running", "it died")
    finally:
        rcs = [gw.stop() for gw in gws]
        interop.kill_all()
        cluster.stop()
    T.check(all(rc == 0 for rc in rcs), "gateways exit 0 on SIGTERM", f"exit statuses {rcs}")
    return T.finish()


if __name__ == "__main__":
    sys.exit(main())
