#!/usr/bin/env python3
"""One rank of a test job through init_method="tcpstore://..." (run by torch_job_test.py).

  rank.py URL RANK WORLD_SIZE [--hold CTL_KEY] [--join-only]
Prints `RESULT {json}` on success; on failure `ERROR <type>: <message>` and exit 3.
--hold: after init, block until CTL_KEY (a raw user key on the same server) exists.
"""
import json
import sys
import time
from datetime import timedelta
from urllib.parse import urlparse


def main():
    url, rank, world = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    hold = sys.argv[sys.argv.index("--hold") + 1] if "--hold" in sys.argv else None
    import torch
    import torch.distributed as dist

    import tcpstore.torch as tt
    c10d = sys.modules["torch.distributed.distributed_c10d"]
    assert c10d._store_based_barrier is tt._server_side_store_barrier
    t0 = time.monotonic()
    try:
        dist.init_process_group("gloo", init_method=url, rank=rank, world_size=world,
                                timeout=timedelta(seconds=60))
    except Exception as e:  # noqa: BLE001
        print(f"ERROR {type(e).__name__} after {time.monotonic() - t0:.2f} s: {e}", flush=True)
        return 3
    init_s = time.monotonic() - t0
    t = torch.tensor([rank + 1.0])
    dist.all_reduce(t)
    evens = dist.new_group([r for r in range(world) if r % 2 == 0])
    if rank % 2 == 0:
        e = torch.tensor([1.0])
        dist.all_reduce(e, group=evens)
        assert e.item() == len(range(0, world, 2)), e
    dist.barrier()
    if hold:
        u = urlparse(url)
        tt.torch_store(u.hostname, u.port, timedelta(seconds=60)).get(hold)
    out = {"rank": rank, "sum": t.item(), "init_s": round(init_s, 3), "torch": torch.__version__}
    dist.destroy_process_group()
    print("RESULT " + json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
