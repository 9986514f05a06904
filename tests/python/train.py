#!/usr/bin/env python3
"""A torchrun worker for run_test.py: default init (env://), gloo, all_reduce, barrier."""
import json
import os
import sys

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
t = torch.tensor([dist.get_rank() + 1.0])
dist.all_reduce(t)
dist.barrier()
print("RESULT " + json.dumps({"rank": dist.get_rank(), "world": dist.get_world_size(),
                              "sum": t.item(), "job": os.environ.get("TORCHELASTIC_RUN_ID"),
                              "on_tcpstore": "tcpstore.torch" in sys.modules,
                              "master_port": os.environ.get("MASTER_PORT"),
                              "endpoint": os.environ.get("TCPSTORE_RUN_ENDPOINT")}),
      flush=True)
dist.destroy_process_group()
