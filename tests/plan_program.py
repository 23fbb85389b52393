"""One rank of a data-parallel job with sleep-made compute (tests/test_plan.py).

Each step computes PLAN_BATCH samples at PLAN_PER_SAMPLE seconds each (a sleep: the
rank's speed, not a synchronisation), then all-reduces a gradient. PLAN_BACKEND: native
(hetobs.init, numpy), or a torch backend name (hetobs_gloo, hetobs_islands). With
PLAN_REPORT=1 it tells hetobs its batch (hetobs.plan.report_batch). After PLAN_STEPS
steps it writes "ready" into FIFO ready-<rank> and waits for a line on go-<rank>
(both in PLAN_FIFO_DIR, made by the test), so the test can read the live job.
"""

import os
import time

import numpy as np

import hetobs

rank = int(os.environ["RANK"])
backend = os.environ["PLAN_BACKEND"]
per_sample = float(os.environ["PLAN_PER_SAMPLE"])
batch = int(os.environ["PLAN_BATCH"])
steps = int(os.environ["PLAN_STEPS"])

if backend == "native":
    comm = hetobs.init()
    grad = np.ones(4096, np.float32)

    def reduce() -> None:
        comm.all_reduce(grad)
else:
    import torch
    import torch.distributed as dist

    dist.init_process_group(backend)
    tensor = torch.ones(4096)

    def reduce() -> None:
        dist.all_reduce(tensor)

if os.environ.get("PLAN_REPORT") == "1":
    hetobs.plan.report_batch(batch)
reduce()  # the first collective: every rank has joined before the timed steps
for _ in range(steps):
    time.sleep(batch * per_sample)
    reduce()
fifos = os.environ["PLAN_FIFO_DIR"]
with open(os.path.join(fifos, f"ready-{rank}"), "w") as f:
    f.write("ready\n")
with open(os.path.join(fifos, f"go-{rank}")) as f:
    f.read()
if backend == "native":
    comm.close()
else:
    dist.destroy_process_group()
