# An ordinary torchrun script: nothing tcpstore-specific.
import torch
import torch.distributed as dist

dist.init_process_group("gloo")
t = torch.ones(1)
dist.all_reduce(t)
print(f"rank {dist.get_rank()}: all_reduce -> {t.item():g}", flush=True)
dist.destroy_process_group()
