#!/usr/bin/env python3
"""tcpstore relays in front of a tcpstore-server, as one foreground server, for
`tcpstore-conform --server-cmd`.

  relay_server.py --server-bin PATH --port PORT [--host H] [--relays N] [--start-timeout S]

Starts `tcpstore-server --port 0` (the upstream), then N relays stacked in front of it
(`tcpstore-server --upstream HOST:PORT`, each relay's upstream the one before; the last one
listens on H:PORT, PORT 0 for any), prints the front relay's `listening on H:PORT` line on
stdout (as tcpstore-server does, for compat/interop/interop.py), and waits. On SIGTERM or SIGINT it stops them all by PID, front first
(SIGTERM, SIGKILL after 5 s), and exits 0. If one dies on its own, it stops the others and
exits 1. Exit 3: a process could not be started. Python 3 standard library only.
"""
import argparse
import re
import signal
import subprocess
import sys
import time

from gateway_server import port_accepts, say, stop


def start(argv, end, stopping):
    """Starts argv (a tcpstore-server) and returns (proc, port) from its `listening on` line."""
    p = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, text=True)
    line = p.stdout.readline()  # the server prints exactly one line, at once, or exits
    m = re.match(r"^listening on \S+:(\d+)", line)
    if not m or time.monotonic() > end or stopping:
        say(f"{argv[0]} did not start (exit {p.poll()}, said {line.strip()!r})")
        stop(p, "server")
        return None, None
    return p, int(m.group(1))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--server-bin", required=True)
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--relays", type=int, default=1, choices=(1, 2, 3))
    ap.add_argument("--start-timeout", type=float, default=30)
    args = ap.parse_args()

    stopping = []
    signal.signal(signal.SIGTERM, lambda *_: stopping.append(1))
    signal.signal(signal.SIGINT, lambda *_: stopping.append(1))
    end = time.monotonic() + args.start_timeout
    procs = []  # upstream first
    try:
        p, port = start([args.server_bin, "--host", "127.0.0.1", "--port", "0"], end, stopping)
        if p is None:
            return 3
        procs.append((p, "upstream"))
        for i in range(args.relays):
            front = i == args.relays - 1
            p, port = start([args.server_bin, "--upstream", f"127.0.0.1:{port}", "--host",
                             args.host if front else "127.0.0.1", "--port",
                             str(args.port if front else 0)], end, stopping)
            if p is None:
                return 3
            procs.append((p, f"relay {i + 1}"))
        if args.host == "127.0.0.1" and not port_accepts(port):
            say(f"the front relay does not accept on {port}")
            return 3
        say(f"{args.relays} relay(s) in front of the upstream (pid {procs[0][0].pid}) on "
            f":{port}")
        print(f"listening on {args.host}:{port}", flush=True)
        while not stopping:
            for proc, name in procs:
                if proc.poll() is not None:
                    say(f"{name} (pid {proc.pid}) exited on its own with {proc.returncode}")
                    return 1
            time.sleep(0.1)  # waiting for SIGTERM/SIGINT or a child's exit
        return 0
    finally:
        for proc, name in reversed(procs):
            rc = stop(proc, name)
            if rc not in (None, 0):
                say(f"{name} exited with {rc} on SIGTERM")


if __name__ == "__main__":
    sys.exit(main())
