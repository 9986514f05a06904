"""``import tcpstore.torch``: the ``tcpstore://`` init_method for torch 1.13 and 2.x.

    import tcpstore.torch
    torch.distributed.init_process_group(
        "gloo", init_method="tcpstore://HOST:PORT/JOBID?join_timeout=60",
        rank=r, world_size=n)        # or RANK / WORLD_SIZE in the environment

Every rank is a client of an external tcpstore-server through torch's own C++
TCPStore client (no Python on the data path), wrapped in
PrefixStore(JOBID, store). The job id comes from the URL path, else
$TCPSTORE_JOB_ID, else $TORCHELASTIC_RUN_ID (+ "/attempt_<restart count>"),
else "default" (one job at a time per server; a second one fails at once).

Join: each rank registers and waits, server-side, until all joined, within
the join deadline (?join_timeout=S or $TCPSTORE_JOIN_TIMEOUT, default 60 s,
never longer than init_process_group's timeout); then every waiting rank
raises tcpstore.JoinError naming the missing ranks. Keys: tcpstore/jobs.py.

The store-based barrier of init_process_group / new_group is replaced by
one that is just as real: ADD, then the last arriver sets
"<barrier key>:last_worker" and every other rank blocks in one WAIT on it
(same key and timeout as torch's; torch 1.13 polls ADD every 10 ms instead).
"""

import atexit
import inspect
import os
import sys
import threading
from datetime import timedelta
from urllib.parse import parse_qs, urlparse

import torch.distributed as dist
import torch.distributed.distributed_c10d  # noqa: F401  (loads the module)
import torch.distributed.rendezvous  # noqa: F401

from . import jobs
from .errors import InvalidArgument

_rdzv = sys.modules["torch.distributed.rendezvous"]
_c10d = sys.modules["torch.distributed.distributed_c10d"]

DEFAULT_JOIN_TIMEOUT = 60.0
_TORCH_113 = "group_name" not in inspect.signature(_c10d._store_based_barrier).parameters
_HAS_USE_LIBUV = "use_libuv" in (dist.TCPStore.__init__.__doc__ or "")


def torch_store(host, port, timeout):
    """torch's own TCPStore client of host:port (never a server, no init/ count).

    On 2.x the classic client is asked for (use_libuv=False): builds without
    libuv (Debian's) refuse use_libuv=True, and the client bytes are the same."""
    kw = {"wait_for_workers": False}
    if _HAS_USE_LIBUV:
        kw["use_libuv"] = False
    return dist.TCPStore(host, port, None, False, timeout, **kw)


def job_id_from_env():
    if os.environ.get("TCPSTORE_JOB_ID"):
        return os.environ["TCPSTORE_JOB_ID"]
    run = os.environ.get("TORCHELASTIC_RUN_ID")
    if run:
        restart = os.environ.get("TORCHELASTIC_RESTART_COUNT")
        return f"{run}/attempt_{restart}" if restart is not None else run
    return "default"


def _seconds(v, what):
    try:
        s = float(v)
    except ValueError:
        raise InvalidArgument(f"tcpstore://: {what} must be a number of seconds, not {v!r}")
    if not s > 0:
        raise InvalidArgument(f"tcpstore://: {what} must be > 0")
    return s


class _Job:
    """What this process remembers of its job for the release at exit."""

    def __init__(self, host, port, job, world_size, store):
        self.host, self.port, self.job, self.world_size, self.store = (
            host, port, job, world_size, store)
        self.done = False

    def clear(self):
        from .client import Client
        c = Client(self.host, self.port, timeout=30).with_prefix(self.job)
        keys = c.list_keys()  # NotSupported on servers without LIST_KEYS: job stays claimed
        rest = [k for k in keys if k != jobs.WORLD_SIZE]
        for k in rest:
            c.delete_key(k)
        c.delete_key(jobs.WORLD_SIZE)  # last: the claim goes away with the job's keys

    def release(self):
        if self.done:
            return
        self.done = True
        try:
            jobs.finish(self.store, self.world_size, self.clear)
        except Exception as e:  # noqa: BLE001 (exit path: report, never raise)
            print(f"tcpstore: job '{self.job}' not released: {e}", file=sys.stderr)


_jobs = []
_jobs_lock = threading.Lock()


def _release_all():
    with _jobs_lock:
        for j in _jobs:
            j.release()


atexit.register(_release_all)


def _tcpstore_rendezvous_handler(url, timeout=None, **kwargs):
    if timeout is None:
        timeout = _c10d.default_pg_timeout
    u = urlparse(url)
    q = {k: v[-1] for k, v in parse_qs(u.query).items()}
    if not u.hostname or u.port is None:
        raise InvalidArgument(f"tcpstore:// needs HOST:PORT: {url!r}")
    job = u.path.strip("/") or job_id_from_env()
    rank = int(q.get("rank", os.environ.get("RANK", -1)))
    world_size = int(q.get("world_size", os.environ.get("WORLD_SIZE", -1)))
    if rank < 0 or world_size < 1 or rank >= world_size:
        raise InvalidArgument(
            f"tcpstore:// needs rank and world_size (arguments or RANK / WORLD_SIZE): "
            f"rank={rank} world_size={world_size}")
    join_s = _seconds(q.get("join_timeout", os.environ.get("TCPSTORE_JOIN_TIMEOUT",
                                                           DEFAULT_JOIN_TIMEOUT)),
                      "join_timeout")
    join_s = min(join_s, timeout.total_seconds())
    join_td = timedelta(seconds=max(join_s, 1.0))  # torch 1.13 connects in whole seconds
    host, port = u.hostname, u.port
    # Connecting counts against the join deadline too; then the job's own timeout.
    store = torch_store(host, port, join_td)
    job_store = dist.PrefixStore(job, store)
    jobs.join(job_store, job, rank, world_size, join_s, where=f" on {host}:{port}",
              probe_store=lambda: dist.PrefixStore(job, torch_store(host, port, join_td)))
    store.set_timeout(timeout)
    with _jobs_lock:
        _jobs.append(_Job(host, port, job, world_size, job_store))
    yield (job_store, rank, world_size)
    raise RuntimeError("tcpstore:// cannot re-rendezvous (use a new job id)")


def _server_side_store_barrier(rank, store, *args, **kwargs):
    """torch's store-based barrier, real and server-side: ADD, then the last
    arriver SETs "<key>:last_worker" and everyone else blocks in one WAIT."""
    if _TORCH_113:
        (timeout,) = args[:1] or (kwargs["timeout"],)
        key = f"{_c10d.STORE_BASED_BARRIER_PREFIX}:{_c10d._group_count}"
        world_size = _c10d.get_world_size()
    else:
        names = ["group_name", "rendezvous_count", "timeout"]
        vals = dict(zip(names, args))
        vals.update({k: v for k, v in kwargs.items() if k in names})
        key = f"{_c10d.STORE_BASED_BARRIER_PREFIX}:{vals['group_name']}"
        world_size, timeout = vals["rendezvous_count"], vals["timeout"]
    last = f"{key}:last_worker"
    if store.add(key, 1) >= world_size:
        store.set(last, "1")
        return
    try:
        store.wait([last], timeout)
    except RuntimeError as e:
        raise RuntimeError(
            f"Timed out initializing process group in store based barrier on rank {rank}, "
            f"for key: {key} (world_size={world_size}, timeout={timeout}): {e}") from e


def install():
    """Registers tcpstore:// and the server-side store barrier (idempotent)."""
    if "tcpstore" not in _rdzv._rendezvous_handlers:
        _rdzv.register_rendezvous_handler("tcpstore", _tcpstore_rendezvous_handler)
    if _c10d._store_based_barrier is not _server_side_store_barrier:
        _c10d._torch_store_based_barrier = _c10d._store_based_barrier
        _c10d._store_based_barrier = _server_side_store_barrier


install()
