"""One rank of a small float64 DDP run, started by torchrun (tests/test_islands.py).

TORCH_BACKEND names the backend; under "hetobs_islands", ISLAND_LAYOUT ("a:gloo,b:hetobs,
s:sccl:standin, ...", one entry per rank: island, library and optionally device) gives each
rank its island the way a launcher script per node would, through HETOBS_ISLAND,
HETOBS_ISLAND_BACKEND and HETOBS_ISLAND_DEVICE. A rank on a device keeps its model and data
there (the stand-in accelerator "standin": forward, backward and the optimizer step run on
it, its gradients cross islands from device memory). Writes the trained parameters and the
islands records into RESULT_DIR/rank-<r>.json.
"""

import gc
import json
import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

import hetobs

backend = os.environ["TORCH_BACKEND"]
rank = int(os.environ["RANK"])
device = "cpu"
if backend == "hetobs_islands":
    island, inner, *dev = os.environ["ISLAND_LAYOUT"].split(",")[rank].split(":")
    os.environ["HETOBS_ISLAND"], os.environ["HETOBS_ISLAND_BACKEND"] = island, inner
    if dev:
        device = os.environ["HETOBS_ISLAND_DEVICE"] = dev[0]
        import hetobs_standin  # noqa: F401  (the stand-in device and its library)
dist.init_process_group(backend)
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.Tanh(), torch.nn.Linear(64, 4)).double().to(device)
ddp = DistributedDataParallel(model, bucket_cap_mb=0.01)  # several buckets per step
opt = torch.optim.SGD(ddp.parameters(), lr=0.05)
data = torch.Generator().manual_seed(100 + rank)
for _ in range(5):
    x, y = torch.randn(8, 16, generator=data, dtype=torch.float64), torch.randn(8, 4, generator=data,
                                                                               dtype=torch.float64)
    x, y = x.to(device), y.to(device)
    opt.zero_grad()
    torch.nn.functional.mse_loss(ddp(x), y).backward()
    opt.step()
out = {"params": [p.detach().cpu().flatten().tolist() for p in model.parameters()]}
if backend == "hetobs_islands":
    out["records"] = [(r["op"], r["state"], r.get("island"), r["device_type"]) for r in hetobs.records()
                      if r["backend"] == "islands"]
with open(os.path.join(os.environ["RESULT_DIR"], f"rank-{rank}.json"), "w") as f:  # long: not a stdout line
    json.dump(out, f)
dist.barrier()
del ddp
gc.collect()
dist.destroy_process_group()
