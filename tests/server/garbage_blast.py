#!/usr/bin/python3
"""Socket-level garbage blast against a running tcpstore-server binary.

Starts build/bin/tcpstore-server on 127.0.0.1 port 0, then for DURATION
seconds runs hostile connections (random bytes, valid prefixes cut at random
points, random valid requests in both dialects including waits, watches,
cancels and abrupt resets, relay-extension frames after the mux preamble)
while well-behaved clients (1.13 and 2.x, on plain connections and on
channels of mux connections) keep writing and verifying their own keys with a per-reply deadline. Fails if a good client
ever sees a wrong reply or waits longer than STALL_S for one,
if the server dies, or if SIGTERM does not give exit code 0.

usage: garbage_blast.py SERVER_BINARY [DURATION_S] [SEED]
Bounded: at most MAX_OPEN hostile connections at once; plain stdlib python.
"""
import os
import random
import signal
import socket
import struct
import subprocess
import sys
import threading
import time

STALL_S = 5.0
MAX_OPEN = 200
MAGIC = b"\x00\xce\xf7\x85\x3c"
MUX_PREAMBLE = b"\xffTSMUX\x00\x01"  # the relay extension (protocol/mux.h)


def u64(n):
    return struct.pack("<Q", n & 0xFFFFFFFFFFFFFFFF)


def s(b):
    return u64(len(b)) + b


def recv_exact(sock, n):
    out = b""
    while len(out) < n:
        chunk = sock.recv(n - len(out))
        if not chunk:
            raise EOFError("server closed a good connection")
        out += chunk
    return out


class MuxChannel:
    """One channel of its own mux connection, used like a socket: each
    sendall() is one request (one REQUEST frame); recv() returns DATA."""

    CHANNEL = 7

    def __init__(self, port, dialect):
        self.sock = socket.create_connection(("127.0.0.1", port),
                                             timeout=STALL_S)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.sock.sendall(MUX_PREAMBLE)
        assert recv_exact(self.sock, 8) == MUX_PREAMBLE
        self.sock.sendall(mux_frame(1, self.CHANNEL, bytes([dialect - 1])))
        self.buf = b""

    def sendall(self, request):
        self.sock.sendall(mux_frame(2, self.CHANNEL, request))

    def recv(self, n):
        while not self.buf:
            kind, ch, length = struct.unpack("<BII", recv_exact(self.sock, 9))
            payload = recv_exact(self.sock, length) if length else b""
            if kind == 5:
                raise EOFError("server closed a good channel: %r" % payload)
            assert (kind, ch) == (4, self.CHANNEL), (kind, ch)
            self.buf = payload
        out, self.buf = self.buf[:n], self.buf[n:]
        return out


class Good:
    """A well-behaved client of one dialect verifying its own keys."""

    def __init__(self, port, dialect, tag, mux=False):
        self.dialect = dialect
        self.tag = tag
        self.ops = 0
        self.max_latency = 0.0
        if mux:  # a channel of a relay's connection (server-side mux path)
            self.sock = MuxChannel(port, dialect)
        else:
            self.sock = socket.create_connection(("127.0.0.1", port),
                                                 timeout=STALL_S)
            self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if dialect == 2 and not mux:
            self.sock.sendall(MAGIC + b"\x0d" + struct.pack("<I", 4242))
            assert recv_exact(self.sock, 4) == struct.pack("<I", 4242)
        c = {1: dict(set=0, get=2, add=3, wait=5, num=6, dele=8),
             2: dict(set=1, get=3, add=4, wait=6, num=7, dele=8)}[dialect]
        self.c = {k: bytes([v]) for k, v in c.items()}

    def timed(self, fn):
        t0 = time.monotonic()
        r = fn()
        self.max_latency = max(self.max_latency, time.monotonic() - t0)
        return r

    def step(self, i):
        key = b"good/%s/%d" % (self.tag, i % 50)
        val = os.urandom(random.randint(0, 300))
        c = self.c
        self.sock.sendall(c["set"] + s(key) + s(val))
        self.sock.sendall(c["wait"] + u64(1) + s(key))
        self.sock.sendall(c["get"] + s(key))
        got = self.timed(lambda: (recv_exact(self.sock, 1),
                                  recv_exact(self.sock, struct.unpack(
                                      "<Q", recv_exact(self.sock, 8))[0])))
        assert got[0] == b"\x00", got
        assert got[1] == val, "value mismatch for %r" % key
        ctr = b"good/%s/ctr" % self.tag
        self.sock.sendall(c["add"] + s(ctr) + u64(1))
        n = struct.unpack("<q", self.timed(lambda: recv_exact(self.sock, 8)))[0]
        assert n == self.ops + 1, (n, self.ops)
        self.ops += 1


def mux_frame(kind, channel, payload):
    return struct.pack("<BII", kind, channel, len(payload)) + payload


def random_mux_frames(rng):
    """A relay's frames: mostly valid OPEN/REQUEST/CLOSE, some garbage."""
    out, opened, nxt = [], [], 1
    for _ in range(rng.randint(1, 40)):
        r = rng.random()
        if r < 0.3 or not opened:
            d = rng.choice([1, 2])
            out.append(mux_frame(1, nxt, bytes([d - 1])))
            opened.append((nxt, d))
            nxt += rng.randint(1, 3)
        elif r < 0.8:
            ch, d = rng.choice(opened)
            out.append(mux_frame(2, ch, random_request(rng, d)))
        elif r < 0.9:
            out.append(mux_frame(3, rng.choice(opened)[0], b""))
        else:  # out of rule: any type, any channel, any length
            out.append(bytes([rng.randrange(256)]) + rng.randbytes(
                rng.randint(0, 16)))
    return b"".join(out)


def random_request(rng, dialect):
    """One syntactically valid request with random (hostile) contents."""
    def key():
        return b"g/" + rng.randbytes(rng.randint(0, 12))

    def val():
        return rng.randbytes(rng.choice([0, 1, 5, 100, rng.randint(0, 5000)]))

    def keys():
        n = rng.randint(0, 6)
        return u64(n) + b"".join(s(key()) for _ in range(n))
    if dialect == 1:
        table = [
            lambda: b"\x00" + s(key()) + s(val()),
            lambda: b"\x01" + s(key()) + s(val()) + s(val()),
            lambda: b"\x02" + s(key()),
            lambda: b"\x03" + s(key()) + u64(rng.getrandbits(64)),
            lambda: b"\x04" + keys(),
            lambda: b"\x05" + keys(),
            lambda: b"\x06",
            lambda: b"\x07" + s(key()),
            lambda: b"\x08" + s(key()),
        ]
    else:
        table = [
            lambda: b"\x01" + s(key()) + s(val()),
            lambda: b"\x02" + s(key()) + s(val()) + s(val()),
            lambda: b"\x03" + s(key()),
            lambda: b"\x04" + s(key()) + u64(rng.getrandbits(64)),
            lambda: b"\x05" + keys(),
            lambda: b"\x06" + keys(),
            lambda: b"\x07",
            lambda: b"\x08" + s(key()),
            lambda: b"\x09" + s(key()) + s(val()),
            lambda: b"\x0a" + keys(),
            lambda: b"\x0b" + u64(2) + s(key()) + s(val()) + s(key()) + s(val()),
            lambda: b"\x0c",
            lambda: b"\x0d" + rng.randbytes(4),
            lambda: b"\x0e" + s(key()) + s(val()),
            lambda: b"\x0f" + s(key()),
            lambda: b"\x10" + s(key()),
            lambda: b"\x11",
            lambda: b"\x12" + s(key()) + u64(rng.randint(-2, 5)),
        ]
    return rng.choice(table)()


def hostile(port, rng, stop, stats, lock):
    open_socks = []
    while not stop.is_set():
        try:
            sk = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sk.settimeout(0.5)
            sk.connect(("127.0.0.1", port))
        except OSError:
            stats["connect_fail"] += 1
            time.sleep(0.01)
            continue
        mode = rng.randrange(8)
        try:
            if mode == 0:  # pure random bytes
                sk.sendall(rng.randbytes(rng.randint(1, 2000)))
            elif mode == 1:  # valid prefix, then random tail or cut
                d = rng.choice([1, 2])
                data = (MAGIC if d == 2 else b"") + b"".join(
                    random_request(rng, d) for _ in range(rng.randint(1, 5)))
                cut = rng.randint(0, len(data))
                sk.sendall(data[:cut] + (rng.randbytes(rng.randint(0, 64))
                                         if rng.random() < 0.5 else b""))
            elif mode == 2:  # many valid random requests, read a bit
                d = rng.choice([1, 2])
                data = (MAGIC if d == 2 else b"") + b"".join(
                    random_request(rng, d) for _ in range(rng.randint(1, 60)))
                for i in range(0, len(data), 997):
                    sk.sendall(data[i:i + 997])
                try:
                    sk.recv(65536)
                except OSError:
                    pass
            elif mode == 3:  # huge announced lengths / counts
                d = rng.choice([1, 2])
                code = bytes([rng.randrange(0x14)])
                sk.sendall((MAGIC if d == 2 else b"") + code +
                           u64(rng.choice([2**62, 2**63, 2**64 - 1, 8193,
                                           8 * 2**20 + 1, 131073,
                                           rng.getrandbits(64)])))
            elif mode == 4:  # byte-at-a-time valid requests
                d = rng.choice([1, 2])
                data = (MAGIC if d == 2 else b"") + random_request(rng, d)
                for b in data[:200]:
                    sk.send(bytes([b]))
            elif mode == 5:  # wait on a missing key, then vanish (RST)
                d = rng.choice([1, 2])
                k = b"g/never/" + rng.randbytes(4)
                w = b"\x05" if d == 1 else b"\x06"
                sk.sendall((MAGIC if d == 2 else b"") + w + u64(1) + s(k))
                if d == 1 and rng.random() < 0.5:
                    sk.sendall(b"\x07" + s(b"g/w"))  # watch too
            elif mode == 7:  # relay extension: frames, maybe cut short
                data = MUX_PREAMBLE + random_mux_frames(rng)
                if rng.random() < 0.3:
                    data = data[:rng.randint(0, len(data))]
                sk.sendall(data)
                if rng.random() < 0.5:
                    try:
                        sk.recv(65536)
                    except OSError:
                        pass
            else:  # half close after requests
                d = rng.choice([1, 2])
                sk.sendall((MAGIC if d == 2 else b"") +
                           random_request(rng, d))
                sk.shutdown(socket.SHUT_WR)
        except OSError:
            pass
        # Always close with a reset: a FIN close leaves the client side in
        # TIME_WAIT, and ~100k of those exhaust the loopback ephemeral ports
        # for every process on the machine (bind to port 0 then fails).
        sk.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER,
                      struct.pack("ii", 1, 0))
        if rng.random() < 0.3 and len(open_socks) < MAX_OPEN // 4:
            open_socks.append(sk)  # leave it open (idle / partial)
        else:
            sk.close()
        if len(open_socks) >= MAX_OPEN // 4 or rng.random() < 0.02:
            for o in open_socks:
                o.close()
            open_socks.clear()
        with lock:
            stats["hostile"] += 1
        time.sleep(0.002)  # bounded rate: ~1500 connections/s in total
    for o in open_socks:
        o.close()


def main():
    binary = sys.argv[1]
    duration = float(sys.argv[2]) if len(sys.argv) > 2 else 60.0
    seed = int(sys.argv[3]) if len(sys.argv) > 3 else 1
    srv = subprocess.Popen([binary, "--host", "127.0.0.1", "--port", "0",
                            "--log-level", "error"],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    line = srv.stdout.readline().decode()
    assert line.startswith("listening on 127.0.0.1:"), line
    port = int(line.rsplit(":", 1)[1])
    stop = threading.Event()
    stats = {"hostile": 0, "connect_fail": 0}
    lock = threading.Lock()
    errors = []
    threads = [threading.Thread(target=hostile,
                                args=(port, random.Random(seed * 100 + i),
                                      stop, stats, lock))
               for i in range(4)]
    goods = [Good(port, 1, b"v1"), Good(port, 2, b"v2"),
             Good(port, 1, b"mux-v1", mux=True),
             Good(port, 2, b"mux-v2", mux=True)]

    def run_good(g):
        i = 0
        try:
            while not stop.is_set():
                g.step(i)
                i += 1
        except Exception as e:  # noqa: BLE001
            errors.append("%s: %r" % (g.tag, e))
            stop.set()
    gthreads = [threading.Thread(target=run_good, args=(g,)) for g in goods]
    for t in threads + gthreads:
        t.start()
    deadline = time.monotonic() + duration
    while time.monotonic() < deadline and not stop.is_set():
        if srv.poll() is not None:
            errors.append("server exited with %s" % srv.returncode)
            break
        time.sleep(0.2)
    stop.set()
    for t in threads + gthreads:
        t.join(30)
    alive = srv.poll() is None
    if alive:
        srv.send_signal(signal.SIGUSR1)
        time.sleep(0.3)
        srv.send_signal(signal.SIGTERM)
        try:
            rc = srv.wait(20)
        except subprocess.TimeoutExpired:
            srv.kill()
            rc = "timeout"
        if rc != 0:
            errors.append("exit code %s after SIGTERM" % rc)
    err = srv.stderr.read().decode(errors="replace")
    counters = [l for l in err.splitlines() if "requests total=" in l]
    print("hostile connections: %d, good ops: %s, max good latency: %s"
          % (stats["hostile"], [g.ops for g in goods],
             ["%.3fs" % g.max_latency for g in goods]))
    print("server counters (last):", counters[-1] if counters else "none")
    bad = [l for l in err.splitlines() if "ERROR" in l or "Sanitizer" in l
           or "runtime error" in l or " E " in l]
    if bad:
        errors.append("server stderr: " + " | ".join(bad[:10]))
    if errors:
        print("FAIL:", *errors, sep="\n  ")
        return 1
    print("OK")
    return 0


if __name__ == "__main__":
    sys.exit(main())
