#!/usr/bin/env python3
"""A tcpstore etcd gateway as one foreground server, for `tcpstore-conform --server-cmd`.

  gateway_server.py --server-bin PATH --port PORT [--etcd-bin PATH] [--prefix P]
                    [--start-timeout S]

Starts a 1-member etcd (Debian's etcd-server) on free loopback ports with its data in a
temporary directory, waits until it has a leader, then runs
`tcpstore-server --backend etcd://127.0.0.1:CLIENT/PREFIX --host 127.0.0.1 --port PORT` and
waits on it. On SIGTERM or SIGINT it stops the gateway and etcd by PID (SIGTERM, SIGKILL after
5 s), removes the data directory and exits 0. If either child dies on its own, it stops the
other and exits 1. Exit 3: etcd or the gateway could not be started.

One member, not gateway.py's 3-member cluster: conformance judges what the gateway does on the
wire, not etcd's fault tolerance (gateway.py covers that), and one member starts in well under
a second. Python 3 standard library only.
"""
import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request


def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def free_ports(n):
    """n distinct free ports: all held bound until all are picked (one at a time, the kernel may
    hand out the same port twice)."""
    socks = []
    try:
        for _ in range(n):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            socks.append(s)
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def say(msg):
    print(f"gateway_server: {msg}", file=sys.stderr, flush=True)


def stop(proc, name):
    """SIGTERM, SIGKILL after 5 s; returns the exit status."""
    if proc is None:
        return None
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(5)
        except subprocess.TimeoutExpired:
            say(f"{name} (pid {proc.pid}) ignored SIGTERM; SIGKILL")
            proc.kill()
            proc.wait(5)
    return proc.returncode


def etcd_ready(port):
    """True once the member answers its status endpoint with a leader."""
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v3/maintenance/status",
                                 data=b"{}", method="POST")
    try:
        with urllib.request.urlopen(req, timeout=1) as r:
            return bool(json.loads(r.read()).get("leader"))
    except (OSError, ValueError):
        return False


def port_accepts(port):
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1):
            return True
    except OSError:
        return False


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--server-bin", required=True)
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--etcd-bin", default=shutil.which("etcd") or "/usr/bin/etcd")
    ap.add_argument("--prefix", default="conform")
    ap.add_argument("--start-timeout", type=float, default=30)
    args = ap.parse_args()

    stopping = []
    signal.signal(signal.SIGTERM, lambda *_: stopping.append(1))
    signal.signal(signal.SIGINT, lambda *_: stopping.append(1))

    root = tempfile.mkdtemp(prefix="tcpstore-conform-etcd-")
    etcd = gw = None
    rc = 0
    try:
        # Not the gateway's own port (chosen by our caller, not yet bound).
        client, peer = next(pp for pp in (free_ports(2) for _ in range(20))
                            if args.port not in pp)
        log = open(os.path.join(root, "etcd.log"), "w")
        etcd = subprocess.Popen(
            [args.etcd_bin, "--name=conform", f"--data-dir={root}/data",
             f"--listen-client-urls=http://127.0.0.1:{client}",
             f"--advertise-client-urls=http://127.0.0.1:{client}",
             f"--listen-peer-urls=http://127.0.0.1:{peer}",
             f"--initial-advertise-peer-urls=http://127.0.0.1:{peer}",
             f"--initial-cluster=conform=http://127.0.0.1:{peer}",
             "--initial-cluster-state=new", "--logger=zap", "--log-outputs=stderr"],
            stdout=log, stderr=log, stdin=subprocess.DEVNULL)
        end = time.monotonic() + args.start_timeout
        while not etcd_ready(client):
            if stopping:
                return 0
            if etcd.poll() is not None or time.monotonic() > end:
                say(f"etcd did not start (exit {etcd.poll()}); its log:")
                log.flush()
                with open(os.path.join(root, "etcd.log")) as f:
                    sys.stderr.write(f.read()[-4000:])
                return 3
            time.sleep(0.05)  # polling etcd's status endpoint (no event to wait on)
        url = f"etcd://127.0.0.1:{client}/{args.prefix}"
        say(f"etcd (pid {etcd.pid}) on 127.0.0.1:{client}; gateway {url} on :{args.port}")
        gw = subprocess.Popen([args.server_bin, "--backend", url, "--host", "127.0.0.1",
                               "--port", str(args.port)], stdin=subprocess.DEVNULL)
        while not port_accepts(args.port):
            if stopping:
                return 0
            if gw.poll() is not None or time.monotonic() > end:
                say(f"the gateway did not start (exit {gw.poll()})")
                return 3
            time.sleep(0.05)  # polling the port (no event to wait on)
        # Foreground: wait for a signal or for a child to die on its own.
        while not stopping:
            for proc, name in ((gw, "gateway"), (etcd, "etcd")):
                if proc.poll() is not None:
                    say(f"{name} (pid {proc.pid}) exited on its own with {proc.returncode}")
                    return 1
            time.sleep(0.1)  # waiting for SIGTERM/SIGINT or a child's exit
        return rc
    finally:
        gw_rc = stop(gw, "gateway")
        stop(etcd, "etcd")
        shutil.rmtree(root, ignore_errors=True)
        if gw_rc not in (None, 0):
            say(f"gateway exited with {gw_rc} on SIGTERM")


if __name__ == "__main__":
    sys.exit(main())
