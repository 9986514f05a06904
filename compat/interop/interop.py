#!/usr/bin/env python3
"""Interop tests: real PyTorch processes as clients of a store server.

  interop.py [--server-bin PATH | --server-cmd CMD] [--deadline S] clients VERSION
  interop.py ... mixed VERSION_A VERSION_B
  interop.py ... init-pg VERSION [VERSION_2] [--ranks 4] [--init-barrier]

The server is started with `--host 127.0.0.1 --port 0` appended and must print
`listening on HOST:PORT` on stdout. Default: --server-bin (our tcpstore-server); override with
--server-cmd or env TCPSTORE_INTEROP_SERVER, e.g. a real torch server:
  TCPSTORE_INTEROP_SERVER="compat/peers/run.sh 2.6 python3 compat/peers/torch_server.py"
The torch peers run through compat/peers/run.sh (set them up with compat/peers/setup.sh).

A missing peer or server binary FAILS, unless TCPSTORE_SKIP_INTEROP=1 (then: loud SKIPPED,
exit 77, which ctest reports as skipped: SKIP_RETURN_CODE in compat/CMakeLists.txt). Every process this script starts is reaped; on the overall deadline all of them are
killed (by PID) and the run fails. Ends with the line `N passed, N failed`.
Needs only the Python standard library (runs under any python3).
"""
import argparse
import os
import re
import shlex
import signal
import subprocess
import sys
import threading
import time

# Exit status of a skipped run (ctest's SKIP_RETURN_CODE; never 0, which would read as passed).
EXIT_SKIPPED = 77

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
RUN_SH = os.path.join(REPO, "compat", "peers", "run.sh")
PEER_PY = os.path.join(HERE, "peer.py")
LISTEN_RE = re.compile(r"^listening on (\[[0-9a-fA-F:.]+\]|[^\s:]+):(\d+)\s*$")
SUMMARY_RE = re.compile(r": (\d+) passed, (\d+) failed\s*$")
COUNTERS_RE = re.compile(r"requests total=\d+")

children = []  # every Popen we started, for the deadline handler
children_lock = threading.Lock()


say_lock = threading.Lock()


def say(msg):
    with say_lock:
        print(msg, flush=True)


def loud(msg):
    bar = "#" * 78
    say(f"{bar}\n# {msg}\n{bar}")


class Totals:
    def __init__(self):
        self.passed = 0
        self.failed = 0

    def ok(self, name):
        self.passed += 1
        say(f"PASS {name}")

    def bad(self, name, why):
        self.failed += 1
        say(f"FAIL {name}: {why}")

    def check(self, cond, name, why):
        (self.ok(name) if cond else self.bad(name, why))

    def finish(self):
        say(f"{self.passed} passed, {self.failed} failed")
        return 0 if self.failed == 0 and self.passed > 0 else 1


T = Totals()


def spawn(cmd, env=None, **kw):
    p = subprocess.Popen(cmd, env=env, stdin=subprocess.DEVNULL, **kw)
    with children_lock:
        children.append(p)
    return p


def kill_all():
    with children_lock:
        procs = list(children)
    for p in procs:
        if p.poll() is None:
            try:
                p.kill()
            except ProcessLookupError:
                pass
    for p in procs:
        try:
            p.wait(10)
        except subprocess.TimeoutExpired:
            pass


def on_deadline(_signo, _frame):
    T.bad("overall deadline", "the test ran out of time; killing every process it started")
    kill_all()
    sys.exit(T.finish() or 1)


def skip_or_fail(what):
    if os.environ.get("TCPSTORE_SKIP_INTEROP") == "1":
        loud(f"SKIPPED (TCPSTORE_SKIP_INTEROP=1): {what}")
        say("0 passed, 0 failed (SKIPPED)")
        sys.exit(EXIT_SKIPPED)
    loud(f"INTEROP PEER MISSING: {what} (set TCPSTORE_SKIP_INTEROP=1 to skip on purpose)")
    T.bad("peer available", what)
    sys.exit(T.finish())


def require_peer(version):
    try:
        r = subprocess.run([RUN_SH, version, "python3", "-c", "import torch.distributed"],
                           stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=120)
    except subprocess.TimeoutExpired:
        skip_or_fail(f"torch {version}: probing the peer timed out")
    if r.returncode != 0:
        tail = (r.stderr or r.stdout).strip().splitlines()[-8:]
        skip_or_fail(f"torch {version} is not usable (run.sh exit {r.returncode}; "
                     f"setup: compat/peers/setup.sh {version}):\n# " + "\n# ".join(tail))


class Server:
    """The server under test; its stdout is drained by a thread after the listening line.

    With counters=True (our tcpstore-server) stderr is drained too, and SIGUSR1 makes the server
    print its request counters there: count() reads one, an observable event to wait for."""

    def __init__(self, cmd, deadline=60.0, counters=False):
        self.cmd = cmd + ["--host", "127.0.0.1", "--port", "0"]
        say(f"server: {' '.join(shlex.quote(c) for c in self.cmd)}")
        self.proc = spawn(self.cmd, stdout=subprocess.PIPE, text=True, bufsize=1,
                          stderr=subprocess.PIPE if counters else None)
        self.port = None
        self.counters = counters
        self.counter_lines = []
        self.counter_cond = threading.Condition()
        got = []

        def err_reader():
            for line in self.proc.stderr:
                line = line.rstrip("\n")
                if COUNTERS_RE.search(line):
                    with self.counter_cond:
                        self.counter_lines.append(line)
                        self.counter_cond.notify_all()
                else:
                    say(f"[server stderr] {line}")

        if counters:
            threading.Thread(target=err_reader, daemon=True).start()

        listening = threading.Event()  # the listening line came, or stdout closed

        def reader():
            for line in self.proc.stdout:
                line = line.rstrip("\n")
                m = LISTEN_RE.match(line)
                if m and self.port is None and not got:
                    got.append(int(m.group(2)))
                    listening.set()
                else:
                    say(f"[server stdout] {line}")
            listening.set()

        self.thread = threading.Thread(target=reader, daemon=True)
        self.thread.start()
        listening.wait(deadline)
        if not got:
            rc = self.proc.poll()
            self.stop()
            T.bad("server start", f"no `listening on HOST:PORT` line (exit status {rc})")
            sys.exit(T.finish())
        self.port = got[0]
        say(f"server listening on port {self.port}")

    def alive(self):
        return self.proc.poll() is None

    def count(self, command, timeout=10.0):
        """Our server: its counter of `command` requests now (SIGUSR1, then the printed line);
        None if no counters line came within the timeout."""
        with self.counter_cond:
            seen = len(self.counter_lines)
            self.proc.send_signal(signal.SIGUSR1)
            if not self.counter_cond.wait_for(lambda: len(self.counter_lines) > seen, timeout):
                return None
            m = re.search(rf" {re.escape(command)}=(\d+)\b", self.counter_lines[-1])
            return int(m.group(1)) if m else 0

    def wait_count(self, command, at_least, timeout):
        """Our server: waits (each round trip is one SIGUSR1 and its counters line) until the
        counter of `command` reaches at_least; False at the deadline."""
        end = time.monotonic() + timeout
        while time.monotonic() < end and self.alive():
            n = self.count(command, timeout=max(0.1, end - time.monotonic()))
            if n is not None and n >= at_least:
                return True
        return False

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)
            return None


class Peer:
    """One torch process running peer.py ROLE; output is echoed with a prefix."""

    def __init__(self, version, role, port, *args, env=None, name=None):
        self.name = name or f"{version} {role}"
        full_env = dict(os.environ)
        full_env.update(env or {})
        full_env["PYTHONUNBUFFERED"] = "1"
        cmd = [RUN_SH, version, "python3", PEER_PY, role, "--port", str(port), *map(str, args)]
        self.proc = spawn(cmd, env=full_env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True, bufsize=1)
        self.lines = []
        self.summary = None
        self.waiting = threading.Event()
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self):
        for line in self.proc.stdout:
            line = line.rstrip("\n")
            self.lines.append(line)
            say(f"  [{self.name}] {line}")
            if line == "WAITING":
                self.waiting.set()
            m = SUMMARY_RE.search(line)
            if m:
                self.summary = (int(m.group(1)), int(m.group(2)))

    def finish(self, timeout):
        """Wait for the process; fold its checks into the totals. Returns True if it passed."""
        try:
            rc = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)
            self.thread.join(5)
            T.bad(self.name, f"did not finish within {timeout:.0f} s (killed)")
            return False
        self.thread.join(10)
        if self.summary is None:
            T.bad(self.name, f"exit status {rc} without a summary line")
            return False
        p, f = self.summary
        T.passed += p
        T.failed += f
        if rc != 0 and f == 0:
            T.bad(self.name, f"exit status {rc}")
            return False
        say(f"  -> {self.name}: {p} passed, {f} failed, exit status {rc}")
        return rc == 0

    def value(self, prefix):
        for line in self.lines:
            if line.startswith(prefix):
                return line[len(prefix):].strip()
        return None


def waiter_and_setter(server, wait_ver, set_ver, tag):
    port = server.port
    key = f"{tag}_{wait_ver}_waits_for_{set_ver}"
    value = f"set by torch {set_ver}"
    waits_before = server.count("wait") if server.counters else None
    w = Peer(wait_ver, "waiter", port, "--key", key, "--value", value,
             name=f"{wait_ver} waiter (woken by {set_ver})")
    if not w.waiting.wait(90):
        T.bad(w.name, "never reached its wait")
    else:
        if server.counters:
            # The set must really wake the waiter: start it once the server has counted the WAIT.
            T.check(waits_before is not None and server.wait_count("wait", waits_before + 1, 60),
                    f"{w.name}: the server received its WAIT", "no WAIT counted within 60 s")
        # A torch server shows nothing of its waiters: the setter starts after the waiter's
        # WAITING line, so the wake path is likely but not proven there (torch-selfcheck only).
        s = Peer(set_ver, "setter", port, "--key", key, "--value", value, name=f"{set_ver} setter")
        s.finish(90)
    w.finish(90)


def mode_clients(server, version):
    Peer(version, "api", server.port).finish(240)
    waiter_and_setter(server, version, version, "same")


def mode_mixed(server, va, vb):
    port = server.port
    for writer, reader in ((va, vb), (vb, va)):
        tag = f"x_{writer}_to_{reader}_"
        if Peer(writer, "write", port, "--tag", tag).finish(90):
            Peer(reader, "read", port, "--tag", tag).finish(90)
    waiter_and_setter(server, vb, va, "mix")
    waiter_and_setter(server, va, vb, "mix")
    # Concurrent counters from both dialects add up.
    times = 200
    adders = [Peer(v, "adder", port, "--key", "mixed_counter", "--times", times, name=f"{v} adder")
              for v in (va, vb)]
    ok = all([a.finish(120) for a in adders])
    last = Peer(va, "adder", port, "--key", "mixed_counter", "--times", 1, name=f"{va} final adder")
    if last.finish(90) and ok:
        v = last.value("VALUE")
        T.check(v == str(2 * times + 1), "counter across dialects",
                f"final value {v!r}, want {2 * times + 1}")


def mode_init_pg(server, versions, ranks, init_barrier):
    """One gloo job of `ranks` processes per version, all jobs at the same time on one server.

    A 1.13 job and a 2.x job can share a server (1.13's agent-store keys start with
    /worker/attempt_0/, 2.x's with /default_pg/); two 2.x jobs would use the same keys."""
    if sum(1 for v in versions if v != "1.13") > 1 or versions.count("1.13") > 1:
        T.bad("init-pg arguments", "at most one 1.13 job and one 2.x job share a server")
        return
    jobs = []
    for version in versions:
        env = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(server.port), "WORLD_SIZE": str(ranks),
               "GLOO_SOCKET_IFNAME": "lo", "TORCHELASTIC_USE_AGENT_STORE": "True"}
        if version == "1.13":
            env["TORCHELASTIC_RESTART_COUNT"] = "0"
        if init_barrier:
            env["TORCH_DIST_INIT_BARRIER"] = "1"  # 2.x: store-based barrier in init and new_group
        procs = []
        for r in range(ranks):
            e = dict(env, RANK=str(r), LOCAL_RANK=str(r))
            procs.append(Peer(version, "initpg", server.port, env=e, name=f"{version} rank {r}"))
        jobs.append((version, procs))
    for version, procs in jobs:
        oks = [p.finish(240) for p in procs]
        T.check(all(oks), f"init_process_group x{ranks} on torch {version}", "some rank failed")
    for version, _ in jobs:
        # Rank 0 wrote `from_rank0` through _get_default_store(); where it lands on the server
        # shows the rendezvous prefixes (docs/protocol.md 6.4: 1.13 agent-store clients add
        # /worker/attempt_<restart count>, 2.x do not). Observed on real torch: 1.13's default
        # store is the `default_pg` PrefixStore, 2.x's is the default group's `0/` store below it.
        if version == "1.13":
            key = "/worker/attempt_0/default_pg/from_rank0"
        else:
            key = "default_pg/0//from_rank0"
        Peer(version, "waiter", server.port, "--key", key, "--value", "hello",
             name=f"{version} reads {key}").finish(90)
        # The store-based barrier of init_process_group ran on our server (docs/protocol.md 6.3):
        # 1.13 always (counter key, value = world size); 2.x only with TORCH_DIST_INIT_BARRIER=1
        # (the last rank sets <key>:last_worker = 1).
        if version == "1.13":
            key, value = "/worker/attempt_0/default_pg/store_based_barrier_key:1", str(ranks)
        elif init_barrier:
            key, value = "default_pg/store_based_barrier_key:0:last_worker", "1"
        else:
            continue
        Peer(version, "waiter", server.port, "--key", key, "--value", value,
             name=f"{version} reads {key}").finish(90)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--server-bin", help="our tcpstore-server binary")
    ap.add_argument("--server-cmd", help="server command line (shell words); overrides --server-bin")
    ap.add_argument("--deadline", type=float, default=300, help="hard limit for the whole script (s)")
    ap.add_argument("--ranks", type=int, default=4, help="init-pg: processes per job")
    ap.add_argument("--init-barrier", action="store_true", help="init-pg: TORCH_DIST_INIT_BARRIER=1")
    ap.add_argument("mode", choices=["clients", "mixed", "init-pg"])
    ap.add_argument("versions", nargs="+")
    args = ap.parse_args()

    signal.signal(signal.SIGALRM, on_deadline)
    signal.alarm(int(args.deadline))
    signal.signal(signal.SIGTERM, on_deadline)

    cmd_text = args.server_cmd or os.environ.get("TCPSTORE_INTEROP_SERVER")
    ours = not cmd_text
    if cmd_text:
        cmd = shlex.split(cmd_text)
    else:
        if not args.server_bin or not os.access(args.server_bin, os.X_OK):
            skip_or_fail(f"server binary {args.server_bin!r} does not exist (build target tcpstore-server)")
        cmd = [args.server_bin]
    for v in args.versions:
        require_peer(v)

    server = Server(cmd, counters=ours)
    try:
        if args.mode == "clients":
            mode_clients(server, args.versions[0])
        elif args.mode == "mixed":
            mode_mixed(server, args.versions[0], args.versions[1])
        else:
            mode_init_pg(server, args.versions, args.ranks, args.init_barrier)
        T.check(server.alive(), "server still running after the clients", "the server died")
    finally:
        rc = server.stop()
        kill_all()
    T.check(rc == 0, "server exits 0 on SIGTERM", f"exit status {rc}")
    return T.finish()


if __name__ == "__main__":
    sys.exit(main())
