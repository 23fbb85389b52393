#!/usr/bin/env python3
"""Wall time and CPU time per all_reduce, hetobs over TCP against Gloo, interleaved.

Tells a CPU-bound run from one with idle gaps: on loopback every byte is copied into and out
of the kernel's socket buffers on the same cores that reduce, so when CPU per op (user + sys,
all threads of a rank) is about wall per op x cores / ranks, overlapping steps cannot help
and only less work per byte can. Each round starts fresh jobs of world-size processes per
backend (3 warm-up ops and a barrier, then the timed ones); the table gives the slowest rank's
wall time, the ranks' mean CPU time per op, and the share of the machine's CPU time that was
idle while every rank was in its timed loop (/proc/stat, sampled every 5 ms).

    python bench/cpu_per_op.py --world 4 --bytes 64M --iters 6 --rounds 2
"""

from __future__ import annotations

import argparse
import os
import random
import resource
import subprocess
import sys
import threading
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
        op, done, barrier = (lambda: dist.all_reduce(x)), dist.destroy_process_group, dist.barrier
    else:
        import numpy as np

        import hetobs

        comm = hetobs.init()
        x = np.ones(nbytes // 4, np.float32)
        op, done, barrier = (lambda: comm.all_reduce(x)), comm.close, comm.barrier
    for _ in range(3):
        op()
    barrier()  # every rank enters the timed loop together: the idle window is theirs alone
    r0, t0 = resource.getrusage(resource.RUSAGE_SELF), time.monotonic()
    for _ in range(iters):
        op()
    t1, r1 = time.monotonic(), resource.getrusage(resource.RUSAGE_SELF)
    cpu = r1.ru_utime - r0.ru_utime + r1.ru_stime - r0.ru_stime
    print(f"{(t1 - t0) / iters * 1e3:.3f} {cpu / iters * 1e3:.3f} {t0:.6f} {t1:.6f}", flush=True)
    done()


def _cpu_times() -> tuple[float, int, int]:
    """(monotonic time, idle + iowait ticks, all ticks) of the whole machine (/proc/stat's cpu line)."""
    with open("/proc/stat") as f:
        ticks = [int(v) for v in f.readline().split()[1:9]]
    return time.monotonic(), ticks[3] + ticks[4], sum(ticks)


def _idle_share(samples: list[tuple[float, int, int]], start: float, end: float) -> float:
    """Idle share of the CPU time between the first sample at or after `start` and the last at or before `end`."""
    inside = [s for s in samples if start <= s[0] <= end]
    if len(inside) < 2 or inside[-1][2] == inside[0][2]:
        return float("nan")
    return (inside[-1][1] - inside[0][1]) / (inside[-1][2] - inside[0][2])


def run(backend: str, world: int, nbytes: int, iters: int) -> tuple[float, float, float]:
    port = random.randint(20000, 40000)
    samples: list[tuple[float, int, int]] = []
    stop = threading.Event()

    def sample() -> None:
        while not stop.wait(0.005):
            samples.append(_cpu_times())

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    procs = []
    for r in range(world):
        env = dict(os.environ, RANK=str(r), WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                   HETOBS_TRANSPORT="tcp", OMP_NUM_THREADS="1", HETOBS_JOB_ID=f"cpu-per-op-{port}")
        procs.append(subprocess.Popen([sys.executable, __file__, "--worker", backend, str(nbytes), str(iters)],
                                      env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True))
    rows = []
    try:
        for p in procs:
            out, _ = p.communicate(timeout=600)
            if p.returncode != 0:
                raise SystemExit(f"{backend}: a rank exited with {p.returncode}")
            rows.append([float(v) for v in out.split()[-4:]])
    finally:
        stop.set()
        sampler.join()
    idle = _idle_share(samples, max(r[2] for r in rows), min(r[3] for r in rows))
    return max(r[0] for r in rows), sum(r[1] for r in rows) / len(rows), idle


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
    print("| round | backend | wall ms/op | cpu ms/op (per rank) | idle | load |\n|---|---|---|---|---|---|")
    for rnd in range(1, a.rounds + 1):
        for b in BACKENDS:
            wall, cpu, idle = run(b, a.world, nbytes, a.iters)
            print(f"| {rnd} | {b} | {wall:.1f} | {cpu:.1f} | {idle:.1%} | {os.getloadavg()[0]:.1f} |", flush=True)


if __name__ == "__main__":
    main()
