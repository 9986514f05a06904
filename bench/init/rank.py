#!/usr/bin/env python3
"""The ranks of one bench/init job (run with the torch under test).

  rank.py fork   --way WAY --world N --gate FIFO --out DIR --addr HOST:PORT [--job ID]
                 [--start-skew S]
  rank.py worker --gate FIFO --out DIR          (a tcpstore.run worker: RANK etc. from env)

fork: imports torch once, then forks N ranks (torch import excluded from every
rank's time, and paid once per job instead of N times). Each rank opens the
start gate (a FIFO the driver holds open for writing), says it is ready (file
DIR/ready.R), blocks in read() until the driver closes the FIFO (EOF for all at
once), then times init_process_group("gloo") + one all_reduce, writes
DIR/result.R (JSON, CLOCK_MONOTONIC seconds) and waits on DIR/exit.fifo before
os._exit(0) (no rank leaves while a peer may still read from it).

Ways (the store each rank talks to):
  env        torch default env://: rank 0 hosts the store at --addr, all start at once
  torchstore env:// as agent-store clients of torch's own TCPStore server, started first
  agent      env:// as agent-store clients of tcpstore-server, started first (README recipe)
  url        init_method="tcpstore://ADDR/JOB" after `import tcpstore.torch`
worker mode is way "run" (python -m tcpstore.run, whose env:// is tcpstore://).
"""
import argparse
import json
import os
import random
import sys
import time


def gate_open(path):
    return os.open(path, os.O_RDONLY)


def gate_wait(fd):
    while os.read(fd, 1):
        pass
    os.close(fd)


def patch_agent_store_libuv(dist):
    """2.x builds without libuv (Debian's): the agent-store branch of
    torch.distributed.rendezvous builds its TCPStore without use_libuv, which
    fails there (compat/README.md, "2.x caveat"). Same bytes on the wire."""
    if "use_libuv" not in (dist.TCPStore.__init__.__doc__ or ""):
        return
    rdzv = sys.modules["torch.distributed.rendezvous"]
    real = rdzv.TCPStore
    rdzv.TCPStore = lambda *a, **kw: real(*a, **{"use_libuv": False, **kw})


def instrument(marks):
    """Timestamps of init_process_group's phases: the rendezvous (store connect, and for
    tcpstore:// the join), the process group (gloo's full-mesh key exchange and connects),
    the store-based barrier (1.13; 2.x only with TORCH_DIST_INIT_BARRIER=1). Wraps the
    module globals init_process_group calls; wraps whatever barrier is installed (ours for
    tcpstore://)."""
    c10d = sys.modules["torch.distributed.distributed_c10d"]

    def timed(name, fn):
        def wrapper(*a, **kw):
            marks.setdefault(name + "_start", time.monotonic())
            try:
                return fn(*a, **kw)
            finally:
                marks[name + "_end"] = time.monotonic()
        return wrapper

    real_rdzv = c10d.rendezvous

    def rendezvous(*a, **kw):
        it = real_rdzv(*a, **kw)

        def gen():
            marks["rdzv_start"] = time.monotonic()
            x = next(it)
            marks["rdzv_end"] = time.monotonic()
            yield x
        return gen()
    c10d.rendezvous = rendezvous
    c10d._new_process_group_helper = timed("pg", c10d._new_process_group_helper)
    c10d._store_based_barrier = timed("barrier", c10d._store_based_barrier)


def one_rank(args, rank, world, init_method):
    import torch
    import torch.distributed as dist
    marks = {}
    instrument(marks)
    gate = gate_open(args.gate)
    open(os.path.join(args.out, f"ready.{rank}"), "w").close()
    gate_wait(gate)
    if args.start_skew > 0:  # this rank's own start, as in a job of separate processes
        time.sleep(random.Random(rank * 7919 + os.getpid()).uniform(0, args.start_skew))
    t0 = time.monotonic()
    c0 = os.times()
    err = None
    t_init = t_ar = None
    try:
        dist.init_process_group("gloo", init_method=init_method, rank=rank, world_size=world)
        t_init = time.monotonic()
        x = torch.ones(4)
        dist.all_reduce(x)
        t_ar = time.monotonic()
        if int(x[0].item()) != world:
            err = f"all_reduce gave {x[0].item()}, expected {world}"
    except Exception as e:  # noqa: BLE001 (reported to the driver)
        err = f"{type(e).__name__}: {e}"
    c1 = os.times()
    res = {"rank": rank, "pid": os.getpid(), "t_gate": t0, "t_init": t_init, "t_done": t_ar,
           "cpu_s": (c1.user - c0.user) + (c1.system - c0.system),
           "error": err, "marks": marks}
    tmp = os.path.join(args.out, f".result.{rank}")
    with open(tmp, "w") as f:
        json.dump(res, f)
    os.rename(tmp, os.path.join(args.out, f"result.{rank}"))
    # Leave only when the driver says every rank is done.
    try:
        fd = os.open(os.path.join(args.out, "exit.fifo"), os.O_RDONLY)
        gate_wait(fd)
    finally:
        os._exit(0 if err is None else 1)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("mode", choices=["fork", "worker"])
    ap.add_argument("--way", choices=["env", "torchstore", "agent", "url"])
    ap.add_argument("--world", type=int)
    ap.add_argument("--gate", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--addr")
    ap.add_argument("--job", default="initbench")
    ap.add_argument("--start-skew", type=float, default=0.0,
                    help="sleep a uniform random 0..S s after the gate, then start the clock")
    ap.add_argument("--peer-port", help="env: ranks other than 0 dial this port (a counting proxy)")
    args = ap.parse_args()

    import torch  # noqa: F401
    import torch.distributed as dist
    import torch.distributed.rendezvous  # noqa: F401

    if args.mode == "worker":  # tcpstore.run has set RANK, WORLD_SIZE, the endpoint
        one_rank(args, int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), "env://")
        return

    host, port = args.addr.rsplit(":", 1)
    os.environ.update(MASTER_ADDR=host, MASTER_PORT=port, WORLD_SIZE=str(args.world),
                      GLOO_SOCKET_IFNAME="lo", USE_LIBUV="0")
    init_method = "env://"
    if args.way in ("torchstore", "agent"):
        os.environ.update(TORCHELASTIC_USE_AGENT_STORE="True", TORCHELASTIC_RESTART_COUNT="0")
        patch_agent_store_libuv(dist)
    elif args.way == "url":
        import tcpstore.torch  # noqa: F401
        init_method = f"tcpstore://{args.addr}/{args.job}"
    elif args.way == "env":
        os.environ.pop("TORCHELASTIC_USE_AGENT_STORE", None)

    # env: rank 0 listens at MASTER_PORT and its own client dials it there; in count runs the
    # other ranks dial a counting proxy in front of it (--peer-port).
    proxied = args.peer_port
    children = []
    for r in range(args.world):
        pid = os.fork()
        if pid == 0:
            os.environ.update(RANK=str(r), LOCAL_RANK=str(r))
            if proxied and r != 0:
                os.environ["MASTER_PORT"] = proxied
            one_rank(args, r, args.world, init_method)
        children.append(pid)
    rc = 0
    for pid in children:
        _, status = os.waitpid(pid, 0)
        if os.waitstatus_to_exitcode(status) != 0:
            rc = 1
    sys.exit(rc)


if __name__ == "__main__":
    main()
