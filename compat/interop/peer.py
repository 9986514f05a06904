#!/usr/bin/env python3
"""Runs inside a real torch peer (through compat/peers/run.sh) against a store server.

  python3 peer.py api     --port P [--host H]   every Store method this torch exposes
  python3 peer.py write   --port P --tag T      cross-dialect writer (see interop.py mixed)
  python3 peer.py read    --port P --tag T      cross-dialect reader
  python3 peer.py waiter  --port P --key K      blocks in wait([K]) until another peer sets K
  python3 peer.py setter  --port P --key K --value V
  python3 peer.py adder   --port P --key K --times N
  python3 peer.py initpg                        one rank of init_process_group (env://)

Prints `PASS name` / `FAIL name: why` per check and ends with `<label>: N passed, N failed`.
Exit status 0 only if nothing failed. Needs no other file of this repository.
"""
import argparse
import datetime
import os
import sys
import threading
import time
import traceback

import torch
import torch.distributed as dist

VERSION = tuple(int(x) for x in torch.__version__.split("+")[0].split(".")[:2])
V113 = VERSION < (2, 0)
HAS_LIBUV_KW = "use_libuv" in (dist.TCPStore.__init__.__doc__ or "")
LABEL = f"torch {torch.__version__}"


def td(seconds):
    return datetime.timedelta(seconds=seconds)


class Checks:
    def __init__(self, label):
        self.label = label
        self.passed = 0
        self.failed = 0

    def run(self, name, fn, *args):
        t0 = time.monotonic()
        try:
            fn(*args)
        except Exception as e:  # noqa: BLE001 - every failure is reported, none is fatal
            self.failed += 1
            detail = "".join(traceback.format_exception_only(type(e), e)).strip()
            print(f"FAIL {name}: {detail}", flush=True)
            tb = traceback.format_exc().strip().splitlines()
            for line in tb[-6:]:
                print(f"     | {line}", flush=True)
        else:
            self.passed += 1
            print(f"PASS {name} ({time.monotonic() - t0:.2f}s)", flush=True)

    def summary(self):
        print(f"{self.label}: {self.passed} passed, {self.failed} failed", flush=True)
        return 0 if self.failed == 0 and self.passed > 0 else 1


def expect(cond, what):
    if not cond:
        raise AssertionError(what)


def expect_eq(got, want, what=""):
    if got != want:
        raise AssertionError(f"{what}: got {got!r}, want {want!r}")


def expect_raises(fn, check_exc, what):
    """fn() must raise; check_exc(e) validates the exception (raise AssertionError if wrong)."""
    try:
        fn()
    except AssertionError:
        raise
    except Exception as e:  # noqa: BLE001
        check_exc(e)
        return e
    raise AssertionError(f"{what}: did not raise")


def is_timeout_error(e):
    """The exception this torch version raises for a wait/get that timed out."""
    msg = str(e)
    if V113:
        expect(type(e) is RuntimeError, f"1.13 timeout should be RuntimeError, got {type(e).__name__}: {msg}")
        expect("timeout" in msg.lower(), f"1.13 timeout message: {msg}")
    else:
        expect(type(e).__name__ == "DistStoreError", f"2.x timeout should be DistStoreError, got {type(e).__name__}: {msg}")
        expect(isinstance(e, RuntimeError), "DistStoreError is a RuntimeError")
        expect("timeout" in msg, f"2.x timeout message: {msg}")


def client(host, port, timeout=30.0, world_size=None, wait_for_workers=False):
    kwargs = {"wait_for_workers": wait_for_workers}
    if HAS_LIBUV_KW:
        kwargs["use_libuv"] = False
    return dist.TCPStore(host, port, world_size, False, td(timeout), **kwargs)


def fence(store):
    """A round trip on store's connection: everything it sent before is applied on the server.

    set/append/multi_set have no reply, so another connection's request could otherwise be
    served before them."""
    store.num_keys()


def later(delay, fn, *args):
    """Run fn(*args) in a thread after delay seconds; returns the thread (join it)."""
    errors = []

    def body():
        time.sleep(delay)
        try:
            fn(*args)
        except Exception as e:  # noqa: BLE001
            errors.append(e)

    t = threading.Thread(target=body, daemon=True)
    t.errors = errors
    t.start()
    return t


def joined(t, timeout=30.0):
    t.join(timeout)
    expect(not t.is_alive(), "helper thread did not finish")
    if t.errors:
        raise t.errors[0]


# ---------------------------------------------------------------------------------------------
# api: every Store method of this version
# ---------------------------------------------------------------------------------------------
def cmd_api(args):
    host, port = args.host, args.port
    c = Checks(f"{LABEL} api")
    K = f"api{VERSION[0]}{VERSION[1]}_{os.getpid()}_"
    s = client(host, port)
    other = client(host, port)

    # -- methods exposed by this version (the table in peers.md) ----------------------------
    def methods():
        names = {n for n in dir(s) if not n.startswith("_")}
        base = {"add", "compare_set", "delete_key", "get", "num_keys", "set", "set_timeout", "wait"}
        expect(base <= names, f"missing base methods: {base - names}")
        if not V113:
            ext = {"append", "check", "has_extended_api", "multi_get", "multi_set"}
            expect(ext <= names, f"missing 2.x methods: {ext - names}")
        print(f"     methods: {sorted(names)}", flush=True)
    c.run("methods", methods)

    def host_port():
        expect_eq(s.port, port, "store.port")
        expect_eq(s.host, host, "store.host")
    c.run("host_port", host_port)

    # -- set / get -----------------------------------------------------------------------------
    def set_get():
        s.set(K + "a", "hello")
        expect_eq(s.get(K + "a"), b"hello", "get")
        expect_eq(other.get(K + "a"), b"hello", "get via another client")
        s.set(K + "a", b"second")
        expect_eq(s.get(K + "a"), b"second", "overwrite")
    c.run("set_get", set_get)

    def set_get_binary():
        v = bytes(range(256)) * 3
        s.set(K + "bin", v)
        expect_eq(s.get(K + "bin"), v, "binary value")
    c.run("set_get_binary", set_get_binary)

    def set_get_empty():
        s.set(K + "empty", "")
        expect_eq(s.get(K + "empty"), b"", "empty value")
    c.run("set_get_empty", set_get_empty)

    def set_get_utf8_key():
        key = K + "ключ/ü/✓"
        s.set(key, "utf8")
        expect_eq(other.get(key), b"utf8", "utf-8 key")
    c.run("set_get_utf8_key", set_get_utf8_key)

    def set_get_large():
        for n in (3000, 1 << 20, 4 << 20):
            v = (b"0123456789abcdef" * (n // 16 + 1))[:n]
            s.set(K + f"big{n}", v)
            got = other.get(K + f"big{n}")
            expect(got == v, f"{n}-byte value came back as {len(got)} bytes")
    c.run("set_get_large", set_get_large)

    # -- add -------------------------------------------------------------------------------------
    def add():
        expect_eq(s.add(K + "cnt", 5), 5, "add to a new key")
        expect_eq(other.add(K + "cnt", -2), 3, "add -2")
        expect_eq(s.add(K + "cnt", 0), 3, "add 0")
        expect_eq(s.get(K + "cnt"), b"3", "decimal text")
        expect_eq(s.add(K + "neg", -7), -7, "negative new key")
        expect_eq(s.get(K + "neg"), b"-7", "negative decimal text")
    c.run("add", add)

    def add_parsing():
        s.set(K + "p1", "12abc")
        expect_eq(s.add(K + "p1", 1), 13, "'12abc' + 1")
        expect_eq(s.get(K + "p1"), b"13", "value rewritten")
        s.set(K + "p2", "  7")
        expect_eq(s.add(K + "p2", 1), 8, "'  7' + 1")
        s.set(K + "p3", str(2**63 - 1))
        expect_eq(s.add(K + "p3", 1), -(2**63), "INT64_MAX + 1 wraps")
    c.run("add_parsing", add_parsing)

    def add_non_numeric():
        s.set(K + "abc", "abc")
        fence(s)
        victim = client(host, port, timeout=5)
        expect_raises(lambda: victim.add(K + "abc", 1), lambda e: None, "add to 'abc'")
        expect_eq(s.get(K + "abc"), b"abc", "value unchanged after failed add")
        expect_eq(s.add(K + "cnt", 1), 4, "other clients unaffected")
    c.run("add_non_numeric", add_non_numeric)

    # -- compare_set: the four cases -------------------------------------------------------------
    def compare_set_missing_expected_empty():
        expect_eq(s.compare_set(K + "cs1", "", "new"), b"new", "reply")
        expect_eq(other.get(K + "cs1"), b"new", "stored")
    c.run("compare_set_missing_expected_empty", compare_set_missing_expected_empty)

    def compare_set_missing_expected_nonempty():
        expect_eq(s.compare_set(K + "cs2", "exp", "des"), b"exp", "reply is expected")
        expect_eq(s.delete_key(K + "cs2"), False, "nothing stored")
    c.run("compare_set_missing_expected_nonempty", compare_set_missing_expected_nonempty)

    def compare_set_match():
        s.set(K + "cs3", "old")
        expect_eq(s.compare_set(K + "cs3", "old", "newer"), b"newer", "reply")
        expect_eq(other.get(K + "cs3"), b"newer", "stored")
    c.run("compare_set_match", compare_set_match)

    def compare_set_mismatch():
        s.set(K + "cs4", "current")
        expect_eq(s.compare_set(K + "cs4", "wrong", "des"), b"current", "reply is current")
        expect_eq(other.get(K + "cs4"), b"current", "unchanged")
    c.run("compare_set_mismatch", compare_set_mismatch)

    # -- delete_key / num_keys -------------------------------------------------------------------
    def delete_key():
        s.set(K + "del", "x")
        fence(s)
        expect_eq(s.delete_key(K + "del"), True, "delete existing")
        expect_eq(other.delete_key(K + "del"), False, "delete missing")
        s.set(K + "del", "again")
        expect_eq(other.get(K + "del"), b"again", "re-created")
    c.run("delete_key", delete_key)

    def num_keys():
        n0 = s.num_keys()
        expect(n0 >= 1, f"num_keys {n0}")
        s.set(K + "nk1", "1")
        s.set(K + "nk2", "2")
        expect_eq(s.num_keys(), n0 + 2, "after two new keys")
        s.set(K + "nk1", "overwrite")
        expect_eq(s.num_keys(), n0 + 2, "overwrite adds nothing")
        s.delete_key(K + "nk1")
        s.delete_key(K + "nk2")
        expect_eq(s.num_keys(), n0, "after deleting them")
    c.run("num_keys", num_keys)

    # -- wait ------------------------------------------------------------------------------------
    def wait_present():
        s.set(K + "w1", "1")
        s.set(K + "w2", "2")
        s.wait([K + "w1", K + "w2"])
        s.wait([K + "w1"], td(5))
        s.wait([])
    c.run("wait_present", wait_present)

    def wait_woken_no_timeout():
        t = later(0.4, other.set, K + "w3", "3")
        s.wait([K + "w3"])
        joined(t)
    c.run("wait_woken_no_timeout", wait_woken_no_timeout)

    def wait_woken_with_timeout():
        t = later(0.4, other.add, K + "w4", 1)
        s.wait([K + "w1", K + "w4"], td(20))
        joined(t)
    c.run("wait_woken_with_timeout", wait_woken_with_timeout)

    def wait_two_missing_keys():
        t1 = later(0.3, other.set, K + "w5", "5")
        t2 = later(0.6, other.set, K + "w6", "6")
        s.wait([K + "w5", K + "w6"], td(20))
        joined(t1)
        joined(t2)
        expect_eq(s.get(K + "w6"), b"6", "both keys present")
    c.run("wait_two_missing_keys", wait_two_missing_keys)

    def wait_timeout_raises():
        # A fresh client: on 1.13 a timed-out wait leaves a stale registration (docs/protocol.md 4.3).
        w = client(host, port, timeout=30)
        expect_raises(lambda: w.wait([K + "never"], td(0.5)), is_timeout_error, "wait with timeout")
        if not V113:
            w.set(K + "after_wait_to", "ok")
            expect_eq(w.get(K + "after_wait_to"), b"ok", "same client works after the timeout")
    c.run("wait_timeout_raises", wait_timeout_raises)

    # -- get blocking / timeouts -----------------------------------------------------------------
    def get_woken_by_other_set():
        t = later(0.5, other.set, K + "late", "late value")
        expect_eq(s.get(K + "late"), b"late value", "blocking get")
        joined(t)
    c.run("get_woken_by_other_client_set", get_woken_by_other_set)

    def get_timeout():
        # 1.13 truncates the connect deadline to whole seconds: with 0.5 s it gives up before
        # connecting ("timed out after 0s"), so use 1 s.
        g = client(host, port, timeout=1.0)
        expect_raises(lambda: g.get(K + "absent"), is_timeout_error, "get of a missing key")
        if not V113:
            # 2.x cancels the wait, so the stream stays aligned and the client keeps working.
            g.set(K + "gt", "after")
            expect_eq(g.get(K + "gt"), b"after", "same client after the timeout")
            other.set(K + "absent", "now here")
            expect_eq(g.get(K + "absent"), b"now here", "no stale byte after a late set")
            expect_eq(g.add(K + "gtc", 2), 2, "add on the same client")
    c.run("get_missing_key_timeout", get_timeout)

    def set_timeout():
        t = client(host, port, timeout=60)
        t.set_timeout(td(0.5))
        t0 = time.monotonic()
        expect_raises(lambda: t.get(K + "absent2"), is_timeout_error, "get after set_timeout(0.5 s)")
        expect(time.monotonic() - t0 < 30, "set_timeout shortened the timeout (not the 60 s default)")
        if not V113:
            t.set_timeout(td(30))
            tr = later(0.3, other.set, K + "absent2", "v")
            expect_eq(t.get(K + "absent2"), b"v", "after raising the timeout again")
            joined(tr)
    c.run("set_timeout", set_timeout)

    # -- wait_for_workers ------------------------------------------------------------------------
    def wait_for_workers():
        # Non-master stores with world_size: each sends ADD init/ +1 and returns.
        stores = [client(host, port, timeout=20, world_size=3, wait_for_workers=True) for _ in range(3)]
        for i, st in enumerate(stores):
            st.set(K + f"wfw{i}", str(i))
        expect_eq(stores[0].get(K + "wfw2"), b"2", "stores work")
        expect_eq(stores[2].add(K + "wfwc", 1) + stores[1].add(K + "wfwc", 1), 3, "counter across stores")
    c.run("wait_for_workers", wait_for_workers)

    # -- PrefixStore -----------------------------------------------------------------------------
    def prefix_store():
        p = dist.PrefixStore(K + "pfx", s)
        p.set("k", "v")
        expect_eq(other.get(K + "pfx/k"), b"v", "prefixed key on the server")
        expect_eq(p.get("k"), b"v", "get through the prefix")
        expect_eq(p.add("c", 3), 3, "add through the prefix")
        expect_eq(other.get(K + "pfx/c"), b"3", "add result")
        expect_eq(p.compare_set("c", "3", "4"), b"4", "compare_set through the prefix")
        p.wait(["k", "c"])
        expect_eq(p.num_keys(), s.num_keys(), "num_keys is not prefixed")
        expect_eq(p.delete_key("c"), True, "delete through the prefix")
        expect_eq(s.delete_key(K + "pfx/c"), False, "deleted on the server")
        t = later(0.3, other.set, K + "pfx/late", "x")
        expect_eq(p.get("late"), b"x", "blocking get through the prefix")
        joined(t)
    c.run("prefix_store", prefix_store)

    def prefix_store_nested():
        p = dist.PrefixStore(K + "outer", s)
        q = dist.PrefixStore("inner", p)
        q.set("k", "nested")
        expect_eq(other.get(K + "outer/inner/k"), b"nested", "nested key")
        expect_eq(p.get("inner/k"), b"nested", "through the outer prefix")
        expect_eq(q.add("n", 2), 2, "add nested")
        if not V113:
            q.append("ap", "x")
            q.append("ap", "y")
            fence(s)
            expect_eq(other.get(K + "outer/inner/ap"), b"xy", "append nested")
            expect_eq(q.check(["k", "ap"]), True, "check nested")
            expect_eq(q.check(["k", "missing"]), False, "check nested missing")
            q.multi_set(["m1", "m2"], ["1", "2"])
            expect_eq(q.multi_get(["m2", "m1"]), [b"2", b"1"], "multi_get nested")
            expect_eq(other.get(K + "outer/inner/m1"), b"1", "multi_set nested")
    c.run("prefix_store_nested", prefix_store_nested)

    # -- 2.x extended API ------------------------------------------------------------------------
    if not V113:
        def has_extended_api():
            expect_eq(s.has_extended_api(), True, "has_extended_api")
            expect_eq(s.libuvBackend, False, "libuvBackend")
        c.run("has_extended_api", has_extended_api)

        def append():
            s.append(K + "ap", "xy")
            s.append(K + "ap", b"z")
            fence(s)
            expect_eq(other.get(K + "ap"), b"xyz", "append")
            t = later(0.3, other.append, K + "ap_wake", "w")
            expect_eq(s.get(K + "ap_wake"), b"w", "append creating the key wakes a waiter")
            joined(t)
        c.run("append", append)

        def check():
            s.set(K + "ck", "1")
            expect_eq(s.check([K + "ck"]), True, "present")
            expect_eq(s.check([K + "ck_missing"]), False, "missing")
            expect_eq(s.check([K + "ck", K + "ck_missing"]), False, "one missing")
            expect_eq(s.check([]), True, "no keys")
        c.run("check", check)

        def multi_set_get():
            s.multi_set([K + "ms1", K + "ms2", K + "ms3"], ["a", b"", b"\x00\xff"])
            expect_eq(other.multi_get([K + "ms3", K + "ms1", K + "ms2"]), [b"\x00\xff", b"a", b""], "multi_get")
            expect_eq(s.multi_get([]), [], "empty multi_get")
            s.multi_set([], [])
            t = later(0.3, other.multi_set, [K + "ms_w1", K + "ms_w2"], ["1", "2"])
            expect_eq(s.multi_get([K + "ms_w2", K + "ms_w1"]), [b"2", b"1"], "multi_get waits for multi_set")
            joined(t)
        c.run("multi_set_multi_get", multi_set_get)

    # -- 2.14 -------------------------------------------------------------------------------------
    if hasattr(s, "list_keys"):
        def list_keys():
            s.set(K + "lk", "1")
            fence(s)
            keys = other.list_keys()
            expect(K + "lk" in keys, f"{K}lk not in list_keys() ({len(keys)} keys)")
            expect(K + "a" in keys, "earlier key listed")
            expect(all(not k.startswith("/") for k in keys), "client strips the '/' prefix")
            expect("init/" not in keys and "init" not in keys, "raw init/ key filtered by the client")
            expect_eq(len(keys), len(set(keys)), "no duplicates")
        c.run("list_keys", list_keys)

        def barrier():
            b2 = client(host, port)
            t = later(0.5, b2.barrier, K + "bar", 2, td(20))
            s.barrier(K + "bar", 2, td(20))
            joined(t)
            expect_eq(other.get(K + "bar"), b"2", "barrier counter")
            s.barrier(K + "bar1", 1, td(5))
        c.run("barrier", barrier)

        def barrier_timeout():
            bt = client(host, port)
            expect_raises(lambda: bt.barrier(K + "bt", 2, td(0.4)), is_timeout_error, "lonely barrier")
            expect_eq(bt.get(K + "bt"), b"1", "increment stays; client still works")
            other.barrier(K + "bt", 2, td(5))
        c.run("barrier_timeout", barrier_timeout)

        def clone():
            cl = s.clone()
            cl.set(K + "clone", "c")
            expect_eq(s.get(K + "clone"), b"c", "clone shares the server")
            expect_eq(cl.get(K + "a"), b"second", "clone reads")
        c.run("clone", clone)

        def queues_refused():
            expect_raises(lambda: s.queue_push(K + "q", "x"), lambda e: expect(type(e) is NotImplementedError, repr(e)),
                          "queue_push on the classic client")
            expect_eq(s.get(K + "a"), b"second", "client still works")
        c.run("queues_refused_locally", queues_refused)

    # The original client survived everything above.
    def still_alive():
        expect_eq(s.get(K + "a"), b"second", "main client")
        expect_eq(other.add(K + "cnt", 0), 4, "other client")
    c.run("clients_still_alive", still_alive)
    return c.summary()


# ---------------------------------------------------------------------------------------------
# roles used by the mixed-version test
# ---------------------------------------------------------------------------------------------
def cmd_write(args):
    c = Checks(f"{LABEL} write")
    s = client(args.host, args.port)
    T = args.tag

    def write():
        s.set(T + "str", f"from {LABEL}")
        s.set(T + "bin", bytes(range(256)))
        s.set(T + "empty", "")
        expect_eq(s.add(T + "cnt", 10), 10, "add on a new counter")
        s.set(T + "cs", "old")
        s.set(T + "del", "x")
        p = dist.PrefixStore("xp", dist.PrefixStore(T + "pre", s))
        p.set("k", "prefixed")
        if not V113:
            s.append(T + "ap", "ab")
            s.multi_set([T + "m1", T + "m2"], ["1", "2"])
        fence(s)
    c.run("write", write)
    return c.summary()


def cmd_read(args):
    c = Checks(f"{LABEL} read")
    s = client(args.host, args.port, timeout=20)
    T = args.tag

    def read():
        expect(s.get(T + "str").startswith(b"from torch "), "string from the other dialect")
        expect_eq(s.get(T + "bin"), bytes(range(256)), "binary")
        expect_eq(s.get(T + "empty"), b"", "empty")
        expect_eq(s.add(T + "cnt", 5), 15, "counter adds up across dialects")
        expect_eq(s.compare_set(T + "cs", "old", "new"), b"new", "compare_set on the other's key")
        expect_eq(s.delete_key(T + "del"), True, "delete the other's key")
        p = dist.PrefixStore("xp", dist.PrefixStore(T + "pre", s))
        expect_eq(p.get("k"), b"prefixed", "nested PrefixStore across dialects")
        if not V113:
            s.wait([T + "str", T + "cnt"], td(5))
            expect_eq(s.check([T + "str", T + "cnt"]), True, "check")
        if hasattr(s, "list_keys"):
            keys = set(s.list_keys())
            want = {T + "str", T + "bin", T + "cnt", T + "cs", T + "pre/xp/k"}
            expect(want <= keys, f"list_keys lacks the other dialect's keys {sorted(want - keys)}")
            expect(T + "del" not in keys, "deleted key not listed")
    c.run("read", read)
    return c.summary()


def cmd_waiter(args):
    c = Checks(f"{LABEL} waiter")
    s = client(args.host, args.port, timeout=60)

    def wait_then_get():
        print("WAITING", flush=True)  # the driver starts the setter after this line
        s.wait([args.key], td(60))
        expect_eq(s.get(args.key), args.value.encode(), "value set by the other dialect")
    c.run(f"woken by another process ({args.key})", wait_then_get)
    return c.summary()


def cmd_setter(args):
    c = Checks(f"{LABEL} setter")
    s = client(args.host, args.port)
    c.run("set", lambda: s.set(args.key, args.value))
    return c.summary()


def cmd_adder(args):
    c = Checks(f"{LABEL} adder")
    s = client(args.host, args.port)

    def adds():
        v = None
        for _ in range(args.times):
            v = s.add(args.key, 1)
        print(f"VALUE {v}", flush=True)
    c.run(f"add x{args.times}", adds)
    return c.summary()


# ---------------------------------------------------------------------------------------------
# initpg: one rank of a 4-process gloo job whose store is an external server
# ---------------------------------------------------------------------------------------------
def cmd_initpg(args):
    rank = int(os.environ["RANK"])
    world = int(os.environ["WORLD_SIZE"])
    c = Checks(f"{LABEL} rank {rank}")
    if not V113:
        # The agent-store branch of the rendezvous builds its TCPStore without use_libuv, which
        # fails on Debian's libuv-less builds (peers.md 3). Add use_libuv=False there only.
        rdzv = sys.modules["torch.distributed.rendezvous"]
        real = rdzv.TCPStore

        def tcpstore_without_libuv(*a, **kw):
            kw.setdefault("use_libuv", False)
            return real(*a, **kw)

        rdzv.TCPStore = tcpstore_without_libuv

    def init():
        dist.init_process_group("gloo", init_method="env://", timeout=td(60))
        expect_eq(dist.get_rank(), rank, "rank")
        expect_eq(dist.get_world_size(), world, "world size")
    c.run("init_process_group", init)
    if c.failed:
        return c.summary()

    def all_reduce():
        t = torch.tensor([float(rank + 1), 1.0])
        dist.all_reduce(t)
        expect_eq(t.tolist(), [float(world * (world + 1) // 2), float(world)], "sum")
        m = torch.tensor([rank * 10])
        dist.all_reduce(m, op=dist.ReduceOp.MAX)
        expect_eq(m.item(), (world - 1) * 10, "max")
    c.run("all_reduce", all_reduce)

    c.run("barrier", dist.barrier)

    def broadcast():
        t = torch.tensor([rank]) if rank == 0 else torch.tensor([-1])
        t = torch.tensor([42]) if rank == 0 else t
        dist.broadcast(t, src=0)
        expect_eq(t.item(), 42, "broadcast from rank 0")
    c.run("broadcast", broadcast)

    def new_group():
        evens = [r for r in range(world) if r % 2 == 0]
        odds = [r for r in range(world) if r % 2 == 1]
        g_even = dist.new_group(evens)
        g_odd = dist.new_group(odds)
        mine, members = (g_even, evens) if rank % 2 == 0 else (g_odd, odds)
        t = torch.tensor([float(rank)])
        dist.all_reduce(t, group=mine)
        expect_eq(t.item(), float(sum(members)), f"all_reduce in group {members}")
        g_all = dist.new_group(list(range(world)))
        out = [torch.zeros(1) for _ in range(world)]
        dist.all_gather(out, torch.tensor([float(rank * rank)]), group=g_all)
        expect_eq([x.item() for x in out], [float(r * r) for r in range(world)], "all_gather in new_group")
        dist.barrier(group=g_all)
    c.run("new_group", new_group)

    def store_visible():
        # The default group's store is ours: a key set by rank 0 reaches everyone.
        st = dist.distributed_c10d._get_default_store()
        if rank == 0:
            st.set("from_rank0", "hello")
        expect_eq(st.get("from_rank0"), b"hello", "default store")
    c.run("default_store", store_visible)

    c.run("final_barrier", dist.barrier)
    dist.destroy_process_group()
    return c.summary()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("role", choices=["api", "write", "read", "waiter", "setter", "adder", "initpg"])
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--tag", default="x_")
    ap.add_argument("--key", default="k")
    ap.add_argument("--value", default="v")
    ap.add_argument("--times", type=int, default=1)
    args = ap.parse_args()
    fn = {"api": cmd_api, "write": cmd_write, "read": cmd_read, "waiter": cmd_waiter,
          "setter": cmd_setter, "adder": cmd_adder, "initpg": cmd_initpg}[args.role]
    print(f"peer {args.role}: {LABEL}, python {sys.version.split()[0]}, pid {os.getpid()}", flush=True)
    rc = fn(args)
    sys.stdout.flush()
    os._exit(rc)  # do not let a store destructor or a gloo thread hang the exit


if __name__ == "__main__":
    main()
