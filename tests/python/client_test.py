#!/usr/bin/env python3
"""tcpstore.Client and tcpstore.Server, for real, against a real server process.

  client_test.py                                  # our tcpstore-server via tcpstore.Server
  client_test.py --server-cmd "CMD" [--dialect 1.13]   # any server printing `listening on H:P`
                                                   # (e.g. torch's, via compat/peers/run.sh)
Needs PYTHONPATH=python and TCPSTORE_LIBRARY / TCPSTORE_SERVER_BIN (set by ctest).
Hard deadline: --deadline seconds (faulthandler dumps the stacks and exits 1).
"""
import argparse
import faulthandler
import os
import re
import shlex
import subprocess
import sys
import threading
import time

import tcpstore

FAILS = []


def check(cond, what):
    print(("PASS " if cond else "FAIL ") + what, flush=True)
    if not cond:
        FAILS.append(what)


def raises(exc, fn, what):
    try:
        fn()
    except exc as e:
        check(True, f"{what} raises {exc.__name__} ({e})")
        return e
    except Exception as e:  # noqa: BLE001
        check(False, f"{what} raised {type(e).__name__}: {e}, not {exc.__name__}")
        return None
    check(False, f"{what} did not raise {exc.__name__}")
    return None


def start_cmd(cmd):
    p = subprocess.Popen(shlex.split(cmd) + ["--host", "127.0.0.1", "--port", "0"],
                         stdout=subprocess.PIPE, text=True)
    line = p.stdout.readline()  # bounded by the faulthandler deadline
    m = re.match(r"^listening on (\S+):(\d+)\s*$", line)
    if not m:
        p.kill()
        raise SystemExit(f"server command printed {line!r}")
    return p, int(m.group(2))


def store_ops(port, dialect, torch_server):
    v2 = dialect == "2.x"
    c = tcpstore.Client("127.0.0.1", port, timeout=10, dialect=dialect)
    c.set("py/s", b"v\x00\xff")
    check(c.get("py/s") == b"v\x00\xff", "set/get binary")
    big = os.urandom(3 << 20)
    c.set("py/big", big)
    check(c.get("py/big") == big, "3 MiB value (buffer regrow)")
    c.set("py/str", "ü")
    check(c.get("py/str") == "ü".encode(), "str value as UTF-8")
    check(c.add("py/n", 5) == 5 and c.add("py/n", -7) == -2, "add")
    check(c.compare_set("py/cs", "", "a") == b"a", "compare_set missing + empty expected sets")
    check(c.compare_set("py/cs", "a", "b") == b"b", "compare_set match")
    check(c.compare_set("py/cs", "x", "c") == b"b", "compare_set mismatch returns current")
    check(c.compare_set("py/none", "e", "d") == b"e", "compare_set missing returns expected")
    check(c.check(["py/s", "py/n"]) and not c.check(["py/s", "py/absent"]), "check")
    c.wait(["py/s"], timeout=1)
    t0 = time.monotonic()
    raises(tcpstore.StoreTimeout, lambda: c.wait(["py/absent"], timeout=0.3), "wait timeout")
    raises(tcpstore.StoreTimeout, lambda: c.get("py/absent", timeout=0.3), "get timeout")
    check(time.monotonic() - t0 < 5, "timeouts are honoured")
    check(c.get("py/s") == b"v\x00\xff", "client usable after a timeout")
    check(c.delete_key("py/s") and not c.delete_key("py/s"), "delete_key")
    check(c.num_keys() >= 4, "num_keys")
    p = c.with_prefix("job7")
    p.set("k", "v")
    check(c.get("job7/k") == b"v", "with_prefix maps like PrefixStore")
    check(p.with_prefix("x").add("c", 2) == 2 and c.get("job7/x/c") == b"2", "nested prefix")

    # The GIL is released while blocking: another thread's set wakes this get.
    threading.Timer(0.2, lambda: c.set("py/late", "L")).start()
    check(c.get("py/late", timeout=10) == b"L", "blocking get woken by another thread (GIL free)")

    # barrier / wait_for_workers from several threads (each call blocks in C)
    errs = []

    def arrive(fn):
        try:
            fn()
        except Exception as e:  # noqa: BLE001
            errs.append(e)
    ts = [threading.Thread(target=arrive, args=(lambda: c.barrier("py/bar", 3, timeout=10),))
          for _ in range(3)]
    [t.start() for t in ts]
    [t.join(20) for t in ts]
    check(not errs and not any(t.is_alive() for t in ts), f"barrier of 3 threads {errs}")
    raises(tcpstore.StoreTimeout, lambda: c.barrier("py/bar2", 2, timeout=0.3), "barrier timeout")

    if v2:
        c.append("py/ap", "a")
        c.append("py/ap", "b")
        check(c.get("py/ap") == b"ab", "append")
        c.multi_set(["py/m1", "py/m2", "py/m3"], [b"1", b"", b"3" * 5000])
        check(c.multi_get(["py/m1", "py/m2", "py/m3"]) == [b"1", b"", b"3" * 5000],
              "multi_set / multi_get")
        check(c.multi_get([]) == [], "multi_get of no keys")
        raises(tcpstore.StoreTimeout, lambda: c.multi_get(["py/m1", "py/nope"], timeout=0.3),
               "multi_get timeout")
        c.ping()
        check(True, "ping")
        if torch_server == "2.6":
            raises(tcpstore.NotSupported, c.list_keys, "list_keys on torch 2.6")
        else:
            check("job7/k" in c.list_keys(), "list_keys")
        if not torch_server:
            c.queue_push("py/q", "x")
            check(c.queue_len("py/q") == 1 and c.queue_pop("py/q") == b"x", "queue")
            raises(tcpstore.NotFound, lambda: c.queue_pop("py/q", block=False),
                   "non-blocking pop of an empty queue")
    else:
        raises(tcpstore.NotSupported, lambda: c.append("py/ap", "a"), "append in 1.13 dialect")
        raises(tcpstore.NotSupported, c.ping, "ping in 1.13 dialect")
    raises(tcpstore.InvalidArgument, lambda: c.set("k", 3), "non-bytes value")
    raises(tcpstore.InvalidArgument, lambda: c.wait("k"), "wait with a single key")
    c.close()
    raises(tcpstore.InvalidArgument, lambda: c.get("x"), "use after close")


def server_checks():
    with tcpstore.Server() as s:
        check(s.port > 0 and s.running(), f"Server listens on port {s.port}")
        raises(tcpstore.ServerError, lambda: tcpstore.Server(port=s.port), "second Server on a busy port")
        with tcpstore.Client("127.0.0.1", s.port, timeout=5, dialect="1.13") as old:
            old.set("d", "1")
            check(old.get("d") == b"1", "1.13 dialect against our server")
    check(s.stop() == 0 and not s.running(), "stop() ends the server (exit 0), idempotent")
    raises(tcpstore.ConnectionRefused,
           lambda: tcpstore.Client("127.0.0.1", s.port, timeout=0.5), "connect to a stopped server")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--server-cmd")
    ap.add_argument("--dialect", default="2.x")
    ap.add_argument("--torch-server", default="", help="torch version of --server-cmd")
    ap.add_argument("--deadline", type=float, default=120)
    a = ap.parse_args()
    faulthandler.dump_traceback_later(a.deadline, exit=True)
    print(f"python {sys.version.split()[0]}, library {tcpstore._lib.library_path()}", flush=True)
    proc = None
    try:
        if a.server_cmd:
            proc, port = start_cmd(a.server_cmd)
            store_ops(port, a.dialect, a.torch_server)
        else:
            server_checks()
            with tcpstore.Server() as s:
                store_ops(s.port, a.dialect, "")
    finally:
        if proc:
            proc.terminate()
            proc.wait(30)
    print(f"{'FAILED' if FAILS else 'OK'}: {len(FAILS)} failed", flush=True)
    return 1 if FAILS else 0


if __name__ == "__main__":
    sys.exit(main())
