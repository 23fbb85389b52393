"""One rank of a small DDP training run, started by torchrun (tests/test_torch_ddp.py).

TORCH_BACKEND names the process group backend. Prints "RESULT {...}": the trained
parameters and, when hetobs is in the loop, what it recorded.
"""

import gc
import json
import os
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

import hetobs

backend = os.environ["TORCH_BACKEND"]
dist.init_process_group(backend)
rank = dist.get_rank()
torch.manual_seed(0)  # the same initial model everywhere (DDP also broadcasts rank 0's)
model = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4))
# One gradient bucket (DDP's first holds up to 1 MiB): one all_reduce per step, which DDP
# completes through its future and never waits on.
ddp = DistributedDataParallel(model)
opt = torch.optim.SGD(ddp.parameters(), lr=0.05)
data = torch.Generator().manual_seed(100 + rank)
for _ in range(6):
    x, y = torch.randn(8, 16, generator=data), torch.randn(8, 4, generator=data)
    opt.zero_grad()
    torch.nn.functional.mse_loss(ddp(x), y).backward()
    opt.step()
out = {"params": [p.detach().flatten().tolist() for p in model.parameters()]}
if backend != "gloo":
    # DDP waits on the vendor future, whose waiters wake before its callbacks run: the
    # callback that ends the last record may still be on its way (microseconds).
    deadline = time.monotonic() + 5
    while True:
        recs = [(r["op"], r["state"]) for r in hetobs.records() if r["backend"] == "gloo"]
        if all(state != "started" for _, state in recs) or time.monotonic() > deadline:
            break
        time.sleep(0.001)
    out["records"] = recs
print("RESULT " + json.dumps(out), flush=True)
# DDP goes before its process group: destroying the group under a live DDP sometimes
# aborts inside Gloo at exit ("terminate called without an active exception"), with plain
# Gloo and without hetobs too (3 of 20 torchrun runs here; 0 of 14 in this order).
dist.barrier()
del ddp
gc.collect()
dist.destroy_process_group()
