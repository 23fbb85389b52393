"""Rank-side programs for tests/test_arrivals.py (who arrives last) and tests/test_digests.py.

Run as ``python tests/arrival_programs.py <program> <json-args>`` by tests/_telemetry_job.py's
RankJob (events on stdout as ``@@ {json}`` lines, commands on stdin), so the test
synchronises on what the ranks say, never on time.
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any

import numpy as np


def event(name: str, **data: Any) -> None:
    sys.stdout.write("@@ " + json.dumps({"event": name, "rank": int(os.environ["RANK"]), **data}) + "\n")
    sys.stdout.flush()


def command() -> str:
    return sys.stdin.readline().strip()


def prog_steps(args: dict[str, Any]) -> None:
    """`steps` training-like steps: compute (a sleep of `compute_ms`, `slow_factor` times longer on
    `slow_rank`, plus a uniform 0..`jitter_ms` drawn per rank and step, as a real step's time
    varies; the workload, not a synchronisation), then an all_reduce of `elements` float32.
    Reports `done` with the last arrival each judged op named here, then waits for `exit`."""
    import random

    import hetobs

    comm = hetobs.init()
    rank = comm.rank
    compute = float(args.get("compute_ms", 0.0)) / 1e3
    if rank == int(args.get("slow_rank", -1)):
        compute *= float(args.get("slow_factor", 1.0))
    jitter = float(args.get("jitter_ms", 0.0)) / 1e3
    draw = random.Random(rank)  # each rank's own sequence: no rank's times follow another's
    x = np.ones(int(args.get("elements", 1024)), np.float32)
    comm.barrier()  # every rank connected and in step before the first measured op
    for _ in range(int(args["steps"])):
        if compute or jitter:
            time.sleep(compute + draw.uniform(0.0, jitter))
        comm.all_reduce(x)
    recs = [r for r in hetobs.records() if r["op"] == "all_reduce"]
    event("done", last=[r["last_arrival_rank"] for r in recs if r["arrival_judged"]],
          lag_ns=[r["arrival_lag_ns"] for r in recs if r["arrival_judged"]],
          behind_ns=[r["behind_first_ns"] for r in recs if r["arrival_judged"]])
    command()
    comm.close()


def prog_digest(args: dict[str, Any]) -> None:
    """`steps` ops (`op`: all_reduce, all_gather or broadcast of `elements` float32 per rank) with
    HETOBS_DIGEST on; rank `flip_rank` flips a bit of its result at seq `flip_seq` (the test hook,
    set before the first op). Reports `done` with every DataMismatchError's fields, then waits."""
    rank = int(os.environ["RANK"])
    if rank == int(args.get("flip_rank", -1)):
        os.environ["HETOBS_TEST_FLIP_BIT"] = f"{args['flip_seq']}:{args.get('flip_element', 0)}:{args.get('flip_bit', 0)}"
    import hetobs

    comm = hetobs.init()
    n, op, world = int(args["elements"]), args["op"], comm.size
    caught = []
    for i in range(int(args["steps"])):
        try:
            if op == "all_reduce":
                comm.all_reduce(np.full(n, 1.0 + i, np.float32))
            elif op == "all_gather":
                comm.all_gather(np.empty(world * n, np.float32), np.full(n, float(rank + i), np.float32))
            else:
                comm.broadcast(np.full(n, float(i), np.float32) if rank == 0 else np.zeros(n, np.float32), root=0)
        except hetobs.DataMismatchError as e:
            caught.append({"ranks": e.ranks, "op": e.op, "seq": e.seq, "element": e.element, "comm": e.comm})
    event("done", caught=caught)
    command()
    comm.close()


def prog_torch_digest(args: dict[str, Any]) -> None:
    """The same through torch's ``hetobs_gloo`` (Gloo, wrapped): `steps` ops (`op`: all_reduce,
    all_gather (list), all_gather_into_tensor or broadcast); reports `done` with each op index that
    raised and the error's type, then waits for `exit`."""
    rank = int(os.environ["RANK"])
    if rank == int(args.get("flip_rank", -1)):
        os.environ["HETOBS_TEST_FLIP_BIT"] = f"{args['flip_seq']}:{args.get('flip_element', 0)}:{args.get('flip_bit', 0)}"
    import torch
    import torch.distributed as dist

    import hetobs.torch  # noqa: F401  (registers hetobs_gloo)

    dist.init_process_group("hetobs_gloo", rank=rank, world_size=int(os.environ["WORLD_SIZE"]))
    n, op, world = int(args["elements"]), args["op"], dist.get_world_size()
    caught = []
    for i in range(int(args["steps"])):
        try:
            if op == "all_reduce":
                dist.all_reduce(torch.full((n,), 1.0 + i))
            elif op == "all_gather":
                dist.all_gather([torch.empty(n) for _ in range(world)], torch.full((n,), float(rank + i)))
            elif op == "all_gather_into_tensor":
                dist.all_gather_into_tensor(torch.empty(world * n), torch.full((n,), float(rank + i)))
            else:
                dist.broadcast(torch.full((n,), float(i)) if rank == 0 else torch.zeros(n), src=0)
        except dist.DistBackendError as e:
            caught.append({"step": i, "type": type(e).__name__})
    event("done", caught=caught)
    command()
    dist.destroy_process_group()


if __name__ == "__main__":
    globals()["prog_" + sys.argv[1]](json.loads(sys.argv[2]))
