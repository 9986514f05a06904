"""tcpstore.Client: a client of a c10d TCPStore server over the C API.

Semantics are those of tcpstore::Client (include/tcpstore/client.h): keys map
exactly like torch's TCPStore (``set("k")`` is torch's ``get("k")``),
``with_prefix`` like torch's PrefixStore, one shared connection set per
endpoint and process, blocking operations on their own connections, a
deadline on every call. Every blocking call releases the GIL (ctypes).

Errors are typed (tcpstore.errors): StoreTimeout, ConnectionRefused,
ConnectionClosed, StoreIOError, ProtocolError, LimitExceeded,
InvalidArgument, NotSupported, NotFound; all subclass StoreError
(a RuntimeError).
"""

import ctypes
import threading
from datetime import timedelta

from . import _lib
from .errors import InvalidArgument, error_for

_BUFFER_TOO_SMALL = 64
_tls = threading.local()

DIALECT_2X = "2.x"
DIALECT_113 = "1.13"


def _key(k):
    if isinstance(k, bytes):
        return k
    if isinstance(k, str):
        return k.encode("utf-8")
    raise InvalidArgument(f"key must be str or bytes, not {type(k).__name__}")


def _value(v):
    if isinstance(v, (bytes, bytearray, memoryview)):
        return bytes(v)
    if isinstance(v, str):
        return v.encode("utf-8")
    raise InvalidArgument(f"value must be bytes or str, not {type(v).__name__}")


def _keys(keys):
    if isinstance(keys, (str, bytes)):
        raise InvalidArgument("keys must be a list of keys, not a single key")
    ks = [_key(k) for k in keys]
    return (ctypes.c_char_p * max(len(ks), 1))(*ks), len(ks)


def _millis(t):
    """Seconds (number or timedelta) -> milliseconds; None -> -1 (default)."""
    if t is None:
        return -1
    if isinstance(t, timedelta):
        t = t.total_seconds()
    if t < 0:
        raise InvalidArgument("timeout must be >= 0")
    return int(round(t * 1000))


def _raise(rc):
    lib = _lib.library()
    msg = (lib.tcpstore_last_error_message() or b"").decode("utf-8", "replace")
    raise error_for(rc, msg or lib.tcpstore_status_name(rc).decode())


def _check(rc):
    if rc != 0:
        _raise(rc)


def _read(call):
    """Runs call(buf, len_ptr) with the C API's size-in/size-out protocol."""
    cap = getattr(_tls, "cap", 4096)
    while True:
        buf = ctypes.create_string_buffer(cap)
        n = ctypes.c_size_t(cap)
        rc = call(buf, ctypes.byref(n))
        if rc == _BUFFER_TOO_SMALL:
            cap = max(n.value, cap * 2)
            continue
        _check(rc)
        _tls.cap = min(max(cap, 4096), 1 << 20)
        return buf.raw[: n.value]


class Client:
    """A handle on a TCPStore server (ours, or torch 1.13 / 2.x servers).

    Client(host, port, timeout=300, connect_timeout=None, dialect="2.x",
    prefix=None). ``timeout`` (seconds or timedelta) is the default for
    waits, blocking reads and replies; ``connect_timeout`` (default: timeout)
    bounds connecting with retries. ``dialect="1.13"`` talks to torch 1.13
    servers. Thread-safe, except that close() must not race other calls.
    """

    def __init__(self, host="127.0.0.1", port=29500, timeout=300.0, connect_timeout=None,
                 dialect=DIALECT_2X, prefix=None, _handle=None):
        self._lib = _lib.library()
        self._timeout_ms = _millis(timeout)
        self.host, self.port, self.dialect = host, int(port), dialect
        if _handle is not None:
            self._h = _handle
            return
        self._h = None
        o = _lib.Options()
        self._lib.tcpstore_options_init(ctypes.byref(o))
        if dialect in ("2.x", "2", 2):
            o.dialect = 1
        elif dialect in ("1.13", 113):
            o.dialect = 0
        else:
            raise InvalidArgument(f"unknown dialect {dialect!r} (use '2.x' or '1.13')")
        o.timeout_ms = self._timeout_ms
        o.connect_timeout_ms = self._timeout_ms if connect_timeout is None else _millis(
            connect_timeout)
        o.prefix = _key(prefix) if prefix is not None else None
        h = ctypes.c_void_p()
        _check(self._lib.tcpstore_connect(host.encode(), self.port, ctypes.byref(o),
                                          ctypes.byref(h)))
        self._h = h

    # -- lifetime ---------------------------------------------------------
    def close(self):
        """Frees the handle (connections close when the last handle goes)."""
        h, self._h = self._h, None
        if h:
            self._lib.tcpstore_close(h)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:  # interpreter shutdown
            pass

    def _handle(self):
        if not self._h:
            raise InvalidArgument("client is closed")
        return self._h

    # -- configuration ----------------------------------------------------
    @property
    def timeout(self):
        """Default timeout of this handle, as a timedelta."""
        return timedelta(milliseconds=self._timeout_ms)

    def set_timeout(self, timeout):
        """Changes this handle's default timeout for blocking calls."""
        self._timeout_ms = _millis(timeout)

    def _ms(self, timeout):
        return self._timeout_ms if timeout is None else _millis(timeout)

    def with_prefix(self, prefix):
        """A view like torch's PrefixStore(prefix, store); shares connections."""
        h = ctypes.c_void_p()
        _check(self._lib.tcpstore_with_prefix(self._handle(), _key(prefix), ctypes.byref(h)))
        c = Client.__new__(Client)
        c._lib, c._timeout_ms = self._lib, self._timeout_ms
        c.host, c.port, c.dialect, c._h = self.host, self.port, self.dialect, h
        return c

    # -- store operations -------------------------------------------------
    def set(self, key, value):
        v = _value(value)
        _check(self._lib.tcpstore_set(self._handle(), _key(key), v, len(v)))

    def get(self, key, timeout=None):
        """Waits until key exists (timeout), returns its value (bytes)."""
        k, ms, h = _key(key), self._ms(timeout), self._handle()
        return _read(lambda buf, n: self._lib.tcpstore_get(h, k, ms, buf, n))

    def add(self, key, delta=1):
        out = ctypes.c_int64()
        _check(self._lib.tcpstore_add(self._handle(), _key(key), int(delta), ctypes.byref(out)))
        return out.value

    def compare_set(self, key, expected, desired):
        """torch semantics: returns the value now stored (or expected if the
        key is missing and expected is non-empty)."""
        k, e, d, h = _key(key), _value(expected), _value(desired), self._handle()
        return _read(lambda buf, n: self._lib.tcpstore_compare_set(h, k, e, len(e), d, len(d),
                                                                   buf, n))

    def check(self, keys):
        arr, n = _keys(keys)
        out = ctypes.c_int()
        _check(self._lib.tcpstore_check(self._handle(), arr, n, ctypes.byref(out)))
        return bool(out.value)

    def wait(self, keys, timeout=None):
        arr, n = _keys(keys)
        _check(self._lib.tcpstore_wait(self._handle(), arr, n, self._ms(timeout)))

    def delete_key(self, key):
        out = ctypes.c_int()
        _check(self._lib.tcpstore_delete_key(self._handle(), _key(key), ctypes.byref(out)))
        return bool(out.value)

    def num_keys(self):
        out = ctypes.c_int64()
        _check(self._lib.tcpstore_num_keys(self._handle(), ctypes.byref(out)))
        return out.value

    def append(self, key, value):
        v = _value(value)
        _check(self._lib.tcpstore_append(self._handle(), _key(key), v, len(v)))

    def multi_set(self, keys, values):
        keys, values = list(keys), [_value(v) for v in values]
        if len(keys) != len(values):
            raise InvalidArgument("multi_set: keys and values differ in length")
        arr, n = _keys(keys)
        vals = (ctypes.c_char_p * max(n, 1))(*values)
        lens = (ctypes.c_size_t * max(n, 1))(*[len(v) for v in values])
        _check(self._lib.tcpstore_multi_set(self._handle(), arr, vals, lens, n))

    def multi_get(self, keys, timeout=None):
        """Waits for all keys (timeout), returns their values in order."""
        arr, n = _keys(keys)
        lens = (ctypes.c_size_t * max(n, 1))()
        ms, h = self._ms(timeout), self._handle()
        blob = _read(lambda buf, ln: self._lib.tcpstore_multi_get(h, arr, n, ms, buf, ln, lens))
        out, pos = [], 0
        for i in range(n):
            out.append(blob[pos:pos + lens[i]])
            pos += lens[i]
        return out

    def ping(self):
        """Round trip (2.x dialect; NotSupported in 1.13)."""
        _check(self._lib.tcpstore_ping(self._handle()))

    def list_keys(self):
        h = self._handle()
        blob = _read(lambda buf, n: self._lib.tcpstore_list_keys(h, buf, n, None))
        return [k.decode("utf-8", "surrogateescape") for k in blob.split(b"\0")[:-1]]

    def queue_push(self, key, value):
        v = _value(value)
        _check(self._lib.tcpstore_queue_push(self._handle(), _key(key), v, len(v)))

    def queue_pop(self, key, block=True):
        """block=False raises NotFound on an empty queue."""
        k, h, b = _key(key), self._handle(), 1 if block else 0
        return _read(lambda buf, n: self._lib.tcpstore_queue_pop(h, k, b, buf, n))

    def queue_len(self, key):
        out = ctypes.c_int64()
        _check(self._lib.tcpstore_queue_len(self._handle(), _key(key), ctypes.byref(out)))
        return out.value

    def barrier(self, name, world_size, timeout=None):
        """Returns when world_size callers arrived at barrier name (server-side
        BARRIER, or add + one wait; keys in include/tcpstore/client.h)."""
        _check(self._lib.tcpstore_barrier(self._handle(), _key(name), int(world_size),
                                          self._ms(timeout)))

    def wait_for_workers(self, world_size, timeout=None):
        """Counts this process on torch's init/ key and waits for world_size."""
        _check(self._lib.tcpstore_wait_for_workers(self._handle(), int(world_size),
                                                   self._ms(timeout)))

    def __repr__(self):
        return f"tcpstore.Client({self.host!r}, {self.port}, dialect={self.dialect!r})"
