# One rank: RANK and WORLD_SIZE from the environment, the store from TCPSTORE_ADDR.
import os

import torch
import torch.distributed as dist

import tcpstore.torch  # noqa: F401  (registers tcpstore://)

dist.init_process_group(
    "gloo", init_method=f"tcpstore://{os.environ['TCPSTORE_ADDR']}/{os.environ['TCPSTORE_JOB_ID']}")
t = torch.ones(1)
dist.all_reduce(t)
print(f"rank {dist.get_rank()}: all_reduce -> {t.item():g}", flush=True)
dist.destroy_process_group()
