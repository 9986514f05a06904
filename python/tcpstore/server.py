"""tcpstore.Server: runs a tcpstore-server process and reads its port.

    with tcpstore.Server() as srv:           # port 0: the kernel picks one
        c = tcpstore.Client("127.0.0.1", srv.port)

The binary is $TCPSTORE_SERVER_BIN, else tcpstore-server next to the loaded
libtcpstore.so (same directory, or ../bin as in a build tree or an install
prefix), else on PATH. The server is a separate process: it survives no
longer than stop() / the with-block / this process's normal exit (atexit).
"""

import atexit
import os
import re
import select
import shutil
import signal
import subprocess
import threading
import time

_LISTENING = re.compile(rb"^listening on (\S+):(\d+)\s*$")


class ServerError(RuntimeError):
    """The server binary is missing, or it exited before listening."""


def find_server_binary():
    env = os.environ.get("TCPSTORE_SERVER_BIN")
    if env:
        return env
    try:
        from . import _lib
        libdir = os.path.dirname(_lib.library_path())
        for cand in (os.path.join(libdir, "tcpstore-server"),
                     os.path.join(libdir, "..", "bin", "tcpstore-server"),
                     # <prefix>/lib/python3/dist-packages/tcpstore -> <prefix>/bin
                     os.path.join(libdir, "..", "..", "..", "..", "bin", "tcpstore-server")):
            if os.access(cand, os.X_OK):
                return os.path.normpath(cand)
    except OSError:
        pass
    found = shutil.which("tcpstore-server")
    if found:
        return found
    raise ServerError("tcpstore-server not found: set TCPSTORE_SERVER_BIN, or put it next to "
                      "libtcpstore.so or on PATH")


class Server:
    """Starts ``tcpstore-server --port PORT [--host HOST] [--world-size N] ARGS``.

    Blocks until the server prints its ``listening on`` line (``timeout``
    seconds, default 30), then ``port`` and ``host`` are known. stop() sends
    SIGTERM and waits (then SIGKILL); idempotent. Logs go to this process's
    stderr unless ``stderr`` (a file object or subprocess constant) is given.
    """

    def __init__(self, host="127.0.0.1", port=0, world_size=None, args=(), binary=None,
                 timeout=30.0, stderr=None):
        self.binary = binary or find_server_binary()
        cmd = [self.binary, "--port", str(int(port))]
        if host:
            cmd += ["--host", host]
        if world_size:
            cmd += ["--world-size", str(int(world_size))]
        cmd += list(args)
        self.command = cmd
        try:
            self._proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                          stderr=stderr)
        except OSError as e:
            raise ServerError(f"cannot run {self.binary}: {e}") from e
        self.pid = self._proc.pid
        self._stopped = False
        atexit.register(self.stop)
        try:
            self.listen_host, self.port = self._read_listening(timeout)
        except BaseException:
            self.stop()
            raise
        self.host = host or "127.0.0.1"
        # Drain anything else on stdout (SIGUSR1 counters), so it never blocks.
        threading.Thread(target=self._drain, name="tcpstore-server-stdout", daemon=True).start()

    def _read_listening(self, timeout):
        deadline = time.monotonic() + timeout
        fd = self._proc.stdout.fileno()
        line = b""
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise ServerError(f"{self.binary}: no 'listening on' line within {timeout} s")
            ready, _, _ = select.select([fd], [], [], left)
            if not ready:
                continue
            chunk = os.read(fd, 1)
            if not chunk:
                rc = self._proc.wait(timeout=max(deadline - time.monotonic(), 0.1))
                raise ServerError(f"{' '.join(self.command)} exited with status {rc} before "
                                  "listening (exit 3: cannot bind, e.g. port in use, or cannot reach "
                                  "its etcd or upstream; its stderr says which)")
            if chunk == b"\n":
                m = _LISTENING.match(line)
                if m:
                    return m.group(1).decode(), int(m.group(2))
                line = b""
            else:
                line += chunk

    def _drain(self):
        try:
            while self._proc.stdout.read(65536):
                pass
        except (OSError, ValueError):
            pass

    @property
    def address(self):
        """"HOST:PORT" for clients (IPv6 hosts in brackets)."""
        h = f"[{self.host}]" if ":" in self.host else self.host
        return f"{h}:{self.port}"

    def running(self):
        return self._proc.poll() is None

    def stop(self, timeout=10.0):
        """SIGTERM, wait up to timeout, then SIGKILL. Returns the exit status."""
        if self._stopped:
            return self._proc.returncode
        self._stopped = True
        try:
            atexit.unregister(self.stop)
        except Exception:
            pass
        if self._proc.poll() is None:
            self._proc.send_signal(signal.SIGTERM)
            try:
                self._proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
        return self._proc.returncode

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()

    def __repr__(self):
        return f"tcpstore.Server(pid={self.pid}, address={self.address!r})"
