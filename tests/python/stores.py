"""The store a Python test talks to: a tcpstore-server, or relays stacked in front of one.

    with stores.store(relays, stderr=log) as srv:   # srv.port, srv.address: the front
        ...

relays = 0: one tcpstore.Server. 1 or 2: an upstream tcpstore.Server plus that many relays
(`tcpstore-server --upstream`), each a separate process whose upstream is the one before;
every process logs to `stderr`. They stop front first, so the upstream's counters line is
the last one in the log.
"""
import contextlib

import tcpstore


@contextlib.contextmanager
def store(relays=0, stderr=None):
    with contextlib.ExitStack() as stack:
        srv = stack.enter_context(tcpstore.Server(stderr=stderr))
        for _ in range(relays):
            srv = stack.enter_context(
                tcpstore.Server(stderr=stderr, args=["--upstream", f"127.0.0.1:{srv.port}"]))
        yield srv
