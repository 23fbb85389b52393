"""Per-op cost of the watchdog and the live stats segment (HETOBS_WATCHDOG=1 vs 0).

Runs the same small all_reduce loop in jobs with the watchdog on and off, interleaved
(on, off, on, off, ...) so drift hits both alike, and reports the median time per op
of each and their difference in ns. World size 1 isolates the bookkeeping (no
transport at all); world size 2 over shared memory shows it beside a real op.

    .venv/bin/python bench/watchdog_overhead.py [--rounds 9] [--ops 200000]
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import time
import uuid


def worker(ops: int) -> None:
    import numpy as np

    import hetobs

    comm = hetobs.init()
    x = np.ones(2, np.float32)
    for _ in range(min(ops, 1000)):
        comm.all_reduce(x)
    comm.barrier()
    t = time.perf_counter_ns()
    for _ in range(ops):
        comm.all_reduce(x)
    ns = (time.perf_counter_ns() - t) / ops
    if comm.rank == 0:
        print(json.dumps({"ns_per_op": ns}), flush=True)
    comm.close()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def run_job(world: int, watchdog: bool, ops: int) -> float:
    port, job = free_port(), f"ovh{uuid.uuid4().hex[:8]}"
    procs = []
    for r in range(world):
        env = dict(os.environ, RANK=str(r), WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                   HETOBS_JOB_ID=job, HETOBS_TRANSPORT="shm", HETOBS_WATCHDOG="1" if watchdog else "0",
                   HETOBS_DEBUG="ERROR", OMP_NUM_THREADS="1")
        procs.append(subprocess.Popen([sys.executable, __file__, "--worker", "--ops", str(ops)], env=env,
                                      stdout=subprocess.PIPE, text=True))
    outs = [p.communicate(timeout=600)[0] for p in procs]
    if any(p.returncode for p in procs):
        raise SystemExit(f"a rank failed (world {world}, watchdog {watchdog})")
    return float(json.loads(outs[0].strip().splitlines()[-1])["ns_per_op"])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--ops", type=int, default=200000)
    ap.add_argument("--worlds", default="1,2")
    a = ap.parse_args()
    if a.worker:
        return worker(a.ops)
    print("| ranks | watchdog off (ns/op) | watchdog on (ns/op) | added (ns/op) | rounds |")
    print("|---|---|---|---|---|")
    for world in (int(w) for w in a.worlds.split(",")):
        on, off = [], []
        for i in range(a.rounds):
            for wd in ((True, False) if i % 2 == 0 else (False, True)):
                (on if wd else off).append(run_job(world, wd, a.ops // world))
        m_on, m_off = statistics.median(on), statistics.median(off)
        print(f"| {world} | {m_off:.0f} | {m_on:.0f} | {m_on - m_off:+.0f} | {a.rounds} |", flush=True)


if __name__ == "__main__":
    main()
