#!/usr/bin/env python3
"""Wall time and CPU time per all_reduce, hetobs over TCP against Gloo, interleaved.

Tells a CPU-bound run from one with idle gaps: on loopback every byte is copied into and out
of the kernel's socket buffers on the same cores that reduce, so when CPU per op (user + sys,
all threads of a rank) is about wall per op x cores / ranks, overlapping steps cannot help
and only less work per byte can. Each round starts fresh jobs of world-size processes per
backend (3 warm-up ops, then the timed ones); the table gives the slowest rank's wall time
and the ranks' mean CPU time per op.

    python bench/cpu_per_op.py --world 4 --bytes 64M --iters 6 --rounds 2
"""

from __future__ import annotations

import argparse
import os
import random
import resource
import subprocess
import sys
import time

BACKENDS = ("gloo", "hetobs-tcp")


def _size(text: str) -> int:
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    return int(text[:-1]) * units[text[-1].upper()] if text[-1].upper() in units else int(text)


def worker(backend: str, nbytes: int, iters: int) -> None:
    if backend == "gloo":
        import torch
        import torch.distributed as dist

        dist.init_process_group("gloo")
        x = torch.ones(nbytes // 4)
        op, done = (lambda: dist.all_reduce(x)), dist.destroy_process_group
    else:
        import numpy as np

        import hetobs

        comm = hetobs.init()
        x = np.ones(nbytes // 4, np.float32)
        op, done = (lambda: comm.all_reduce(x)), comm.close
    for _ in range(3):
        op()
    r0, t0 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
    for _ in range(iters):
        op()
    wall, r1 = time.perf_counter() - t0, resource.getrusage(resource.RUSAGE_SELF)
    cpu = r1.ru_utime - r0.ru_utime + r1.ru_stime - r0.ru_stime
    print(f"{wall / iters * 1e3:.2f} {cpu / iters * 1e3:.2f}", flush=True)
    done()


def run(backend: str, world: int, nbytes: int, iters: int) -> tuple[float, float]:
    port = random.randint(20000, 40000)
    procs = []
    for r in range(world):
        env = dict(os.environ, RANK=str(r), WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                   HETOBS_TRANSPORT="tcp", OMP_NUM_THREADS="1", HETOBS_JOB_ID=f"cpu-per-op-{port}")
        procs.append(subprocess.Popen([sys.executable, __file__, "--worker", backend, str(nbytes), str(iters)],
                                      env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True))
    rows = []
    for p in procs:
        out, _ = p.communicate(timeout=600)
        if p.returncode != 0:
            raise SystemExit(f"{backend}: a rank exited with {p.returncode}")
        rows.append([float(v) for v in out.split()[-2:]])
    return max(w for w, _ in rows), sum(c for _, c in rows) / len(rows)


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        worker(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
        return
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--world", type=int, default=2)
    ap.add_argument("--bytes", default="64M")
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--rounds", type=int, default=2)
    a = ap.parse_args()
    nbytes = _size(a.bytes)
    print("| round | backend | wall ms/op | cpu ms/op (per rank) | load |\n|---|---|---|---|---|")
    for rnd in range(1, a.rounds + 1):
        for b in BACKENDS:
            wall, cpu = run(b, a.world, nbytes, a.iters)
            print(f"| {rnd} | {b} | {wall:.1f} | {cpu:.1f} | {os.getloadavg()[0]:.1f} |", flush=True)


if __name__ == "__main__":
    main()
