"""Loads libtcpstore.so (the C API of include/tcpstore/tcpstore.h) with ctypes.

Why ctypes and not an extension module: the C API is a stable C ABI, so one
libtcpstore.so serves every Python (Debian's 3.11 on the host, the 3.13/3.14
of the torch chroots, any venv) without Python headers or a build per
interpreter ABI. ctypes.CDLL releases the GIL around every foreign call, so a
thread blocked in get()/wait()/barrier() never stalls other Python threads.

Lookup order: $TCPSTORE_LIBRARY (a path), then the package's own directory
(what `cmake --install` lays out), then the system's (ld.so paths).
"""

import ctypes
import ctypes.util
import glob
import os
import threading

_lock = threading.Lock()
_lib = None
_path = None

c_int, c_int64, c_size_t, c_char_p, c_void_p = (
    ctypes.c_int, ctypes.c_int64, ctypes.c_size_t, ctypes.c_char_p, ctypes.c_void_p)
P = ctypes.POINTER


class Options(ctypes.Structure):
    _fields_ = [
        ("dialect", c_int),
        ("timeout_ms", c_int64),
        ("connect_timeout_ms", c_int64),
        ("prefix", c_char_p),
    ]


# name: (restype, argtypes)
_PROTOTYPES = {
    "tcpstore_options_init": (None, [P(Options)]),
    "tcpstore_connect": (c_int, [c_char_p, ctypes.c_uint16, P(Options), P(c_void_p)]),
    "tcpstore_with_prefix": (c_int, [c_void_p, c_char_p, P(c_void_p)]),
    "tcpstore_close": (None, [c_void_p]),
    "tcpstore_set": (c_int, [c_void_p, c_char_p, c_char_p, c_size_t]),
    "tcpstore_get": (c_int, [c_void_p, c_char_p, c_int64, c_void_p, P(c_size_t)]),
    "tcpstore_add": (c_int, [c_void_p, c_char_p, c_int64, P(c_int64)]),
    "tcpstore_compare_set": (c_int, [c_void_p, c_char_p, c_char_p, c_size_t, c_char_p,
                                     c_size_t, c_void_p, P(c_size_t)]),
    "tcpstore_check": (c_int, [c_void_p, P(c_char_p), c_size_t, P(c_int)]),
    "tcpstore_wait": (c_int, [c_void_p, P(c_char_p), c_size_t, c_int64]),
    "tcpstore_delete_key": (c_int, [c_void_p, c_char_p, P(c_int)]),
    "tcpstore_num_keys": (c_int, [c_void_p, P(c_int64)]),
    "tcpstore_append": (c_int, [c_void_p, c_char_p, c_char_p, c_size_t]),
    "tcpstore_multi_set": (c_int, [c_void_p, P(c_char_p), P(c_char_p), P(c_size_t),
                                   c_size_t]),
    "tcpstore_multi_get": (c_int, [c_void_p, P(c_char_p), c_size_t, c_int64, c_void_p,
                                   P(c_size_t), P(c_size_t)]),
    "tcpstore_ping": (c_int, [c_void_p]),
    "tcpstore_list_keys": (c_int, [c_void_p, c_void_p, P(c_size_t), P(c_size_t)]),
    "tcpstore_queue_push": (c_int, [c_void_p, c_char_p, c_char_p, c_size_t]),
    "tcpstore_queue_pop": (c_int, [c_void_p, c_char_p, c_int, c_void_p, P(c_size_t)]),
    "tcpstore_queue_len": (c_int, [c_void_p, c_char_p, P(c_int64)]),
    "tcpstore_barrier": (c_int, [c_void_p, c_char_p, c_int64, c_int64]),
    "tcpstore_wait_for_workers": (c_int, [c_void_p, c_int64, c_int64]),
    "tcpstore_last_error_message": (c_char_p, []),
    "tcpstore_status_name": (c_char_p, [c_int]),
}


def _candidates():
    env = os.environ.get("TCPSTORE_LIBRARY")
    if env:
        return [env], True
    here = os.path.dirname(os.path.abspath(__file__))
    found = sorted(glob.glob(os.path.join(here, "libtcpstore.so*")), key=len)
    system = ctypes.util.find_library("tcpstore")
    return found + ["libtcpstore.so.0", "libtcpstore.so"] + ([system] if system else []), False


def library():
    """The loaded CDLL (loaded once per process)."""
    global _lib, _path
    with _lock:
        if _lib is not None:
            return _lib
        names, explicit = _candidates()
        errors = []
        for name in names:
            try:
                lib = ctypes.CDLL(name)
            except OSError as e:
                errors.append(f"{name}: {e}")
                continue
            for fn, (res, args) in _PROTOTYPES.items():
                f = getattr(lib, fn)
                f.restype = res
                f.argtypes = args
            _lib, _path = lib, name
            return lib
        where = "TCPSTORE_LIBRARY" if explicit else "the package directory and system paths"
        raise OSError(
            f"tcpstore: cannot load libtcpstore.so from {where} "
            f"(set TCPSTORE_LIBRARY to the built library, e.g. build/lib/libtcpstore.so): "
            + "; ".join(errors))


def library_path():
    """Where the library was loaded from (loads it if needed)."""
    library()
    if os.path.sep in _path:
        return os.path.abspath(_path)
    # Loaded by soname: ask the dynamic loader where it found it.
    try:
        with open("/proc/self/maps") as maps:
            for line in maps:
                if "libtcpstore.so" in line:
                    return line.split()[-1]
    except OSError:
        pass
    return _path
