"""One rank of the cost-of-watching benchmark: `python -m hetobs.bench.ddp_worker --backend NAME`.

A DDP training loop (an MLP Linear 1024-2048-2048-1, ~8.4 M parameters, batch 32, one
torch thread: steps of tens of milliseconds on a CPU) under the torch backend NAME
("gloo", "hetobs_gloo", "hetobs"). Started by hetobs.bench.overhead with RANK,
WORLD_SIZE, MASTER_ADDR and MASTER_PORT set; speaks the protocol of hetobs.bench.worker
(one JSON object per line, commands on stdin, replies on the stdout it was started with):

    start-up                          -> {"rank", "ready": true, "backend", "wrapper", "pid"}
    {"cmd": "run", "steps"}           -> {"rank", "steps": [seconds of each step], "cpu_seconds"}
    {"cmd": "exit"}                   -> {"rank", "bye": true, "records"}
    any failure                       -> {"rank", "error": "..."} and exit code 1

Each batch starts after a barrier and times `steps` whole steps (forward, backward with
DDP's bucketed all_reduce overlapping it, optimizer step) back to back, each on its own,
and the CPU time the process (all its threads: Gloo's, hetobs's) spent on the batch.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from itertools import pairwise
from typing import Any, Callable

from .worker import _protocol_stream, serve

WARMUP_STEPS = 10
BATCH = 32
LAYERS = (1024, 2048, 2048, 1)


class _Loop:
    def __init__(self, backend: str) -> None:
        import torch
        import torch.distributed as dist
        from torch.nn.parallel import DistributedDataParallel

        import hetobs  # noqa: F401 - registers the hetobs backends

        torch.set_num_threads(1)
        self.torch, self.dist = torch, dist
        dist.init_process_group(backend)
        self.rank = dist.get_rank()
        torch.manual_seed(0)
        mods: list[Any] = []
        for a, b in pairwise(LAYERS):
            mods += [torch.nn.Linear(a, b), torch.nn.ReLU()]
        self.model = torch.nn.Sequential(*mods[:-1])
        self.ddp = DistributedDataParallel(self.model)
        self.opt = torch.optim.SGD(self.ddp.parameters(), lr=1e-4)
        gen = torch.Generator().manual_seed(1 + self.rank)
        self.x = torch.randn(BATCH, LAYERS[0], generator=gen)
        self.y = torch.randn(BATCH, LAYERS[-1], generator=gen)
        self.steps(WARMUP_STEPS)

    def wrapper(self) -> str:
        """Which wrapper instruments the default group: "c++", "python" or "none"."""
        from hetobs.torch.python_wrapper import InstrumentedBackend

        pg = self.dist.group.WORLD
        if isinstance(pg, InstrumentedBackend):
            return "python"
        try:
            name = pg._get_backend(self.torch.device("cpu")).name()
        except RuntimeError:  # a Python ProcessGroup ("hetobs") registers no C++ backend
            return "none"
        return "c++" if name in ("hetobs_gloo", "hetobs_nccl") else "none"

    def steps(self, n: int) -> None:
        mse = self.torch.nn.functional.mse_loss
        for _ in range(n):
            self.opt.zero_grad(set_to_none=True)
            mse(self.ddp(self.x), self.y).backward()
            self.opt.step()

    def run(self, n: int) -> tuple[list[float], float]:
        """Each step's wall seconds, and the process's CPU seconds (every thread) for the batch."""
        self.dist.barrier()
        times = []
        cpu = time.process_time()
        t = time.perf_counter()
        for _ in range(n):
            self.steps(1)
            now = time.perf_counter()
            times.append(now - t)
            t = now
        return times, time.process_time() - cpu

    def close(self) -> int:
        import gc

        import hetobs

        records = sum(1 for r in hetobs.records() if r["backend"] in ("gloo", "native"))
        # DDP goes before its process group (tests/torch_ddp_program.py says why).
        self.dist.barrier()
        del self.ddp
        gc.collect()
        self.dist.destroy_process_group()
        return records


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m hetobs.bench.ddp_worker", description=__doc__.splitlines()[0])
    p.add_argument("--backend", choices=("gloo", "hetobs_gloo", "hetobs"), required=True)
    args = p.parse_args(argv)
    proto = _protocol_stream()
    rank = int(os.environ.get("RANK", "-1"))

    def reply(obj: dict[str, Any]) -> None:
        proto.write(json.dumps({"rank": rank, **obj}) + "\n")
        proto.flush()

    def start() -> tuple[Callable[[dict[str, Any]], dict[str, Any]], Callable[[], dict[str, Any]]]:
        loop = _Loop(args.backend)
        reply({"ready": True, "backend": args.backend, "wrapper": loop.wrapper(), "pid": os.getpid()})

        def run(msg: dict[str, Any]) -> dict[str, Any]:
            times, cpu = loop.run(int(msg["steps"]))
            return {"steps": times, "cpu_seconds": cpu}

        return run, lambda: {"records": loop.close()}

    return serve(sys.stdin, reply, start)


if __name__ == "__main__":
    sys.exit(main())
