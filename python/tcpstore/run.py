"""``python -m tcpstore.run [torchrun args] script.py [args]``: torchrun on tcpstore-server.

torchrun with a ``tcpstore`` rendezvous backend (``--rdzv-backend tcpstore
--rdzv-endpoint HOST:PORT``, the default backend here): the agents' dynamic
rendezvous lives on that tcpstore-server (torch's C10dRendezvousBackend over
torch's own TCPStore client), and so does the workers' process-group store:
every worker runs through ``tcpstore._worker``, whose ``env://`` is
``tcpstore://HOST:PORT/<run id>/attempt_<restart>`` (registration, fail-fast
join, one key space per run and attempt, server-side barrier); no agent
hosts a store for the workers (torch >= 2.5 would start one on node 0).

Without ``--rdzv-endpoint`` (single node, like ``--standalone``) it starts a
tcpstore-server itself (tcpstore.Server, port 0) and stops it at the end.
Without ``--rdzv-id`` a run id is generated. Join progress of the workers
(``joined K/N``) is printed by node 0 while they join.
"""

import os
import sys
import threading
import uuid
from datetime import timedelta

import tcpstore

from . import jobs

_ENDPOINT_ENV = "TCPSTORE_RUN_ENDPOINT"


def _split_endpoint(ep, default_port=29400):
    ep = ep.strip()
    if ep.startswith("["):
        host, _, rest = ep[1:].partition("]")
        port = rest[1:] if rest.startswith(":") else ""
    elif ep.count(":") == 1:
        host, port = ep.split(":")
    else:
        host, port = ep, ""
    return host, int(port) if port else default_port


def _register_backend():
    from torch.distributed.elastic.rendezvous import registry
    from torch.distributed.elastic.rendezvous.c10d_rendezvous_backend import \
        C10dRendezvousBackend
    from torch.distributed.elastic.rendezvous.dynamic_rendezvous import (
        DynamicRendezvousHandler, create_handler)

    from .torch import torch_store

    try:
        from torch.distributed.elastic.rendezvous.api import RendezvousStoreInfo
    except ImportError:  # torch 1.13: workers' MASTER_* are not ours to set (see below)
        RendezvousStoreInfo = None

    class TcpstoreRendezvousHandler(DynamicRendezvousHandler):
        """The dynamic rendezvous on a tcpstore-server. On 2.x, the store info
        handed to workers is the tcpstore-server itself, so no agent starts a
        TCPStore server for them."""

        def get_backend(self):
            return "tcpstore"

        def next_rendezvous(self):
            if RendezvousStoreInfo is not None and self._tcpstore_endpoint is not None:
                host, port = self._tcpstore_endpoint
                self._bootstrap_store_info = RendezvousStoreInfo(host, port)
                self._shared_tcp_store_server = self._tcpstore_store
            return super().next_rendezvous()

    def create(params):
        host, port = _split_endpoint(params.endpoint)
        timeout = timedelta(seconds=int(params.config.get("read_timeout", 60)))
        store = torch_store(host, port, timeout)
        backend = C10dRendezvousBackend(store, params.run_id)
        handler = create_handler(store, backend, params)
        handler.__class__ = TcpstoreRendezvousHandler
        handler._tcpstore_endpoint = (host, port)
        handler._tcpstore_store = store
        return handler

    registry.handler_registry.register("tcpstore", create)


def _watch_join(host, port, job, world_size, stop):
    """Node 0: prints "tcpstore.run: joined K/N" as workers join (blocking
    waits on the job's ready key, waking once a second for progress)."""
    try:
        c = tcpstore.Client(host, port, timeout=30).with_prefix(job)
    except tcpstore.StoreError:
        return
    last = None
    while not stop.is_set():
        try:
            if c.check([jobs.JOINED]):
                k, _ = jobs.joined_count(c.get(jobs.JOINED))
                if k != last:
                    print(f"tcpstore.run: job {job}: joined {k}/{world_size}", file=sys.stderr,
                          flush=True)
                    last = k
            c.wait([jobs.READY], timeout=1.0)
            print(f"tcpstore.run: job {job}: all {world_size} workers joined", file=sys.stderr,
                  flush=True)
            return
        except tcpstore.StoreTimeout:
            continue
        except tcpstore.StoreError:
            return


def _fix_std_from_str():
    """torch 1.13's torchrun on Python >= 3.11 (Debian 12): Std.from_str("0")
    returns None, because iterating an IntFlag no longer yields its 0 member,
    and torchrun then fails in start_processes ('NoneType' has no 'get').
    Map the lost 0 back to Std.NONE; other values are untouched."""
    from torch.distributed.elastic.multiprocessing import api as mp_api
    std = mp_api.Std
    if std.from_str("0") is not None:
        return
    orig = std.from_str

    def from_str(vm):
        out = orig(vm)
        if out is None:
            return std.NONE
        if isinstance(out, dict):
            return {k: std.NONE if v is None else v for k, v in out.items()}
        return out

    std.from_str = staticmethod(from_str)


def main(argv=None):
    from torch.distributed import run as torchrun

    _fix_std_from_str()
    _register_backend()
    args = torchrun.parse_args(sys.argv[1:] if argv is None else argv)
    if args.standalone:
        raise SystemExit("tcpstore.run: --standalone is implied when no --rdzv-endpoint is given")
    if args.rdzv_backend in (None, "static"):
        args.rdzv_backend = "tcpstore"
    if args.rdzv_backend != "tcpstore":
        raise SystemExit(f"tcpstore.run: --rdzv-backend must be tcpstore, not {args.rdzv_backend}")
    if not args.rdzv_id or args.rdzv_id == "none":
        args.rdzv_id = uuid.uuid4().hex[:12]
    server = None
    if not args.rdzv_endpoint:
        min_nodes, max_nodes = torchrun.parse_min_max_nnodes(args.nnodes)
        if max_nodes != 1:
            raise SystemExit("tcpstore.run: more than one node needs --rdzv-endpoint HOST:PORT "
                             "(a tcpstore-server every node reaches)")
        server = tcpstore.Server(host="127.0.0.1", port=0)
        args.rdzv_endpoint = server.address
        print(f"tcpstore.run: started tcpstore-server pid {server.pid} on {server.address}",
              file=sys.stderr, flush=True)
    host, port = _split_endpoint(args.rdzv_endpoint)
    # Workers: env:// becomes tcpstore://ENDPOINT/<run id>/attempt_<n> (tcpstore._worker).
    os.environ[_ENDPOINT_ENV] = f"{host}:{port}" if ":" not in host else f"[{host}]:{port}"
    pkg_parent = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    os.environ["PYTHONPATH"] = os.pathsep.join(
        [pkg_parent] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p])
    if args.no_python:
        print("tcpstore.run: --no-python: workers must `import tcpstore.torch` and use "
              f"init_method from ${_ENDPOINT_ENV} themselves", file=sys.stderr)
    else:
        script_args = ["--module"] if args.module else []
        args.training_script_args = script_args + [args.training_script] + list(
            args.training_script_args)
        args.training_script = "tcpstore._worker"
        args.module = True
    stop = threading.Event()
    watcher = None
    if server is not None or int(getattr(args, "node_rank", 0) or 0) == 0:
        try:
            nproc = int(args.nproc_per_node)
            nnodes = torchrun.parse_min_max_nnodes(args.nnodes)[1]
            watcher = threading.Thread(
                target=_watch_join, args=(host, port, f"{args.rdzv_id}/attempt_0",
                                          nproc * nnodes, stop), daemon=True)
            watcher.start()
        except ValueError:  # nproc "auto"/"gpu": no progress line
            pass
    try:
        torchrun.run(args)
    finally:
        stop.set()
        if server is not None:
            server.stop()


if __name__ == "__main__":
    main()
