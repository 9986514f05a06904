#!/usr/bin/env python3
"""A TCP proxy that counts c10d store requests (both dialects), for bench/init count runs.

  count_proxy.py --upstream HOST:PORT [--port 0] --dump FILE

Prints "listening on 127.0.0.1:PORT" once it accepts. With --wait-upstream it
first waits (connect probes every 2 ms) until the upstream accepts, so that
clients dialling too early are refused exactly as by the upstream itself.
Forwards bytes both ways unchanged; parses the client->server stream of each
connection (2.x if it starts with VALIDATE, else 1.13) and records, per
connection, its accept time and every request (CLOCK_MONOTONIC, command, poll
flag). On SIGTERM/SIGINT writes FILE (JSON) and exits.

Poll: a request sent again, identically, on the same connection because the
condition it reads was not met yet: a repeat of a non-blocking read (GET,
ADD with delta 0, CHECK, GETNUMKEYS, MULTI_GET, QUEUE_LEN) already sent on that
connection; and a WAIT for the same single key sent just before such a repeated
GET (torch's get() is WAIT+GET, so a polling get() costs both). A WAIT that is
repeated but followed by nothing repeated (gloo: wait(k) then get(k)) blocks
server-side and is not a poll.
"""
import argparse
import asyncio
import json
import signal
import struct
import sys
import time

MAGIC = b"\x00\xce\xf7\x85\x3c"
# command -> (name, fields); fields: s=str, i=i64/u64, k=key list, u=u32, m=multi_set
V1 = {0: ("SET", "ss"), 1: ("COMPARE_SET", "sss"), 2: ("GET", "s"), 3: ("ADD", "si"),
      4: ("CHECK", "k"), 5: ("WAIT", "k"), 6: ("GETNUMKEYS", ""), 7: ("WATCH_KEY", "s"),
      8: ("DELETE_KEY", "s")}
V2 = {0: ("VALIDATE", "u"), 1: ("SET", "ss"), 2: ("COMPARE_SET", "sss"), 3: ("GET", "s"),
      4: ("ADD", "si"), 5: ("CHECK", "k"), 6: ("WAIT", "k"), 7: ("GETNUMKEYS", ""),
      8: ("DELETE_KEY", "s"), 9: ("APPEND", "ss"), 10: ("MULTI_GET", "k"),
      11: ("MULTI_SET", "m"), 12: ("CANCEL_WAIT", ""), 13: ("PING", "u"),
      14: ("QUEUE_PUSH", "ss"), 15: ("QUEUE_POP", "s"), 16: ("QUEUE_LEN", "s"),
      17: ("LIST_KEYS", ""), 18: ("BARRIER", "si")}
READS = {"GET", "CHECK", "GETNUMKEYS", "MULTI_GET", "QUEUE_LEN"}


class Incomplete(Exception):
    pass


def parse_one(buf, table):
    """(name, request bytes, length) of the first complete request in buf, or raises."""
    if not buf:
        raise Incomplete
    cmd = buf[0]
    if cmd not in table:
        raise ValueError(f"unknown command byte {cmd}")
    name, fields = table[cmd]
    pos = 1

    def need(n):
        if len(buf) < pos + n:
            raise Incomplete

    def u64():
        nonlocal pos
        need(8)
        v = struct.unpack_from("<Q", buf, pos)[0]
        pos += 8
        return v

    def string():
        nonlocal pos
        n = u64()
        if n > 1 << 30:
            raise ValueError("absurd length")
        need(n)
        pos += n

    for f in fields:
        if f == "s":
            string()
        elif f == "i":
            u64()
        elif f == "u":
            need(4)
            pos += 4
        elif f == "k":
            for _ in range(u64()):
                string()
        elif f == "m":
            for _ in range(u64()):
                string()
                string()
    return name, bytes(buf[:pos]), pos


class Conn:
    def __init__(self, cid):
        self.cid = cid
        self.t_accept = time.monotonic()
        self.table = None
        self.buf = bytearray()
        self.seen = set()
        self.prev = None  # (name, bytes, index) of the previous request
        self.reqs = []  # [t, name, poll]
        self.error = None

    def feed(self, data):
        self.buf += data
        if self.table is None:
            if len(self.buf) < 5 and MAGIC.startswith(bytes(self.buf)):
                return
            self.table = V2 if bytes(self.buf[:5]) == MAGIC else V1
        while self.buf and self.error is None:
            try:
                name, raw, n = parse_one(self.buf, self.table)
            except Incomplete:
                return
            except ValueError as e:
                self.error = str(e)
                return
            del self.buf[:n]
            self.record(name, raw)

    def record(self, name, raw):
        now = time.monotonic()
        read = name in READS or (name == "ADD" and raw[-8:] == b"\x00" * 8)
        poll = read and raw in self.seen
        if read:
            self.seen.add(raw)
        if poll and name == "GET" and self.prev is not None:
            pname, praw, pidx = self.prev
            # WAIT [k] right before a repeated GET k: both belong to the polling get().
            key = raw[1:]
            if pname == "WAIT" and praw.endswith(key) and not self.reqs[pidx][2]:
                self.reqs[pidx][2] = True
        self.reqs.append([now, name, poll])
        self.prev = (name, raw, len(self.reqs) - 1)


class Proxy:
    def __init__(self, up_host, up_port):
        self.up = (up_host, up_port)
        self.conns = []

    async def handle(self, reader, writer):
        c = Conn(len(self.conns))
        self.conns.append(c)
        try:
            ur, uw = await asyncio.open_connection(*self.up)
        except OSError as e:
            c.error = f"upstream: {e}"
            writer.close()
            return

        async def pump(src, dst, count):
            try:
                while True:
                    data = await src.read(65536)
                    if not data:
                        break
                    if count:
                        c.feed(data)
                    dst.write(data)
                    await dst.drain()
            except (ConnectionError, OSError):
                pass
            finally:
                try:
                    dst.close()
                except Exception:  # noqa: BLE001
                    pass

        await asyncio.gather(pump(reader, uw, True), pump(ur, writer, False))

    def dump(self, path):
        out = [{"id": c.cid, "t_accept": c.t_accept,
                "dialect": None if c.table is None else ("2.x" if c.table is V2 else "1.13"),
                "error": c.error, "requests": c.reqs} for c in self.conns]
        with open(path, "w") as f:
            json.dump({"connections": out}, f)


async def wait_upstream(host, port, deadline):
    while time.monotonic() < deadline:
        try:
            r, w = await asyncio.open_connection(host, port)
            w.close()
            return True
        except OSError:
            await asyncio.sleep(0.002)
    return False


async def amain(a):
    host, port = a.upstream.rsplit(":", 1)
    proxy = Proxy(host, int(port))
    if a.wait_upstream and not await wait_upstream(host, int(port), time.monotonic() + a.seconds):
        print("count_proxy: upstream never accepted", file=sys.stderr)
    srv = await asyncio.start_server(proxy.handle, "127.0.0.1", a.port, backlog=4096)
    print(f"listening on 127.0.0.1:{srv.sockets[0].getsockname()[1]}", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for s in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(s, stop.set)
    try:
        await asyncio.wait_for(stop.wait(), a.seconds)
    except asyncio.TimeoutError:
        pass
    proxy.dump(a.dump)
    srv.close()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--upstream", required=True)
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--dump", required=True)
    ap.add_argument("--wait-upstream", action="store_true")
    ap.add_argument("--seconds", type=float, default=600)
    asyncio.run(amain(ap.parse_args()))


if __name__ == "__main__":
    main()
