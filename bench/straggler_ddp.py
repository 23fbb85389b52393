#!/usr/bin/env python3
"""Is a 20%-slower rank named by `hetobs_last_arrivals_total` within 50 steps of a live DDP job?

Each run starts --ranks processes of a DDP training loop through the hetobs torch backend
(`init_process_group("hetobs")`: the native transport), an MLP on the CPU; one rank (a
different one each run) is slower: after its forward pass it waits 20% of its own measured
step time (a slower device; a wait, so it takes no CPU from the others on a shared machine).
After --steps steps the driver reads the exporter's metric from the ranks' stats segments
(no dump, no --window) and names the rank with the most last arrivals. Prints one markdown
row per run and the tally, with the command and the load average.

    python bench/straggler_ddp.py --runs 10 --ranks 3 --steps 50
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time

LAYERS = (512, 1024, 1024, 1)


def worker(args: argparse.Namespace) -> None:
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    import hetobs  # noqa: F401 - registers the "hetobs" backend

    torch.set_num_threads(1)
    dist.init_process_group("hetobs")
    rank = dist.get_rank()
    torch.manual_seed(0)
    mods: list = []
    for a, b in zip(LAYERS, LAYERS[1:]):
        mods += [torch.nn.Linear(a, b), torch.nn.ReLU()]
    ddp = DistributedDataParallel(torch.nn.Sequential(*mods[:-1]))
    opt = torch.optim.SGD(ddp.parameters(), lr=1e-4)
    gen = torch.Generator().manual_seed(1 + rank)
    x, y = torch.randn(32, LAYERS[0], generator=gen), torch.randn(32, LAYERS[-1], generator=gen)
    slow = rank == args.slow
    times: list[float] = []
    delay = 0.0
    for step in range(args.steps):
        t0 = time.perf_counter()
        loss = torch.nn.functional.mse_loss(ddp(x), y)
        if slow and delay:
            time.sleep(delay)  # the slower device: its backward (and its all_reduces) start later
        loss.backward()
        opt.step()
        opt.zero_grad()
        times.append(time.perf_counter() - t0)
        if step == 4:  # the first five steps, all ranks alike, set the slow rank's extra time
            delay = args.slower * sorted(times)[2]
    sys.stdout.write(json.dumps({"rank": rank, "done": True, "step_ms": sorted(times)[len(times) // 2] * 1e3})
                     + "\n")
    sys.stdout.flush()
    sys.stdin.readline()
    dist.destroy_process_group()


def one_run(args: argparse.Namespace, slow: int, workdir: str) -> dict:
    from hetobs.exporters.metrics import families
    from hetobs.exporters.source import ShmSource
    from hetobs.launch_local import LocalJob, new_job_id

    cmd = [sys.executable, os.path.abspath(__file__), "--worker", "--slow", str(slow), "--steps", str(args.steps),
           "--slower", str(args.slower)]
    job_id = new_job_id("strag-")
    with LocalJob(cmd, args.ranks, log_dir=workdir, hetobs_dir=os.path.join(workdir, "hetobs"), job_id=job_id,
                  env={"OMP_NUM_THREADS": "1"}, stdin="pipe", stdout="pipe", log_prefix=f"{job_id}-") as job:
        job.start()
        done = [json.loads(p.stdout.readline()) for p in job.procs]  # type: ignore[union-attr]
        last: dict[int, float] = {}
        for fam in families(ShmSource(job.job_id).snapshot()):
            if fam.spec.name == "hetobs_last_arrivals":
                for labels, v in fam.samples:
                    last[int(labels[1])] = last.get(int(labels[1]), 0.0) + v
        for p in job.procs:
            p.stdin.write(b"\n")  # type: ignore[union-attr]
            p.stdin.flush()  # type: ignore[union-attr]
        job.wait(120)
    named = max(last, key=lambda r: last[r]) if last else None
    return {"slow": slow, "named": named, "last": [int(last.get(r, 0)) for r in range(args.ranks)],
            "step_ms": [round(d["step_ms"], 1) for d in sorted(done, key=lambda d: d["rank"])]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--ranks", type=int, default=3)
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--slower", type=float, default=0.2, help="the slow rank's extra time, as a share of its step")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--slow", type=int, default=-1, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        return worker(args)
    from hetobs.bench.units import load_average

    load0 = load_average()
    rows = []
    with tempfile.TemporaryDirectory() as workdir:
        for i in range(args.runs):
            rows.append(one_run(args, i % args.ranks, workdir))
    load1 = load_average()
    print(f"`python bench/straggler_ddp.py --runs {args.runs} --ranks {args.ranks} --steps {args.steps} "
          f"--slower {args.slower}` — load average {load0} before, {load1} after\n")
    print("| run | slow rank | named | last arrivals per rank | step ms per rank |")
    print("|---|---|---|---|---|")
    for i, r in enumerate(rows):
        print(f"| {i + 1} | {r['slow']} | {r['named']} | {r['last']} | {r['step_ms']} |")
    hits = sum(r["named"] == r["slow"] for r in rows)
    print(f"\nnamed the slow rank in {hits} of {len(rows)} runs")


if __name__ == "__main__":
    main()
