"""What observation costs per op, as time added per call, from interleaved runs (medians).

    .venv/bin/python bench/overhead.py watchdog [--rounds 9] [--ops 200000]
        hetobs native all_reduce (8 B) with HETOBS_WATCHDOG=1 vs 0: the watchdog and the live
        stats segment. World size 1 isolates the bookkeeping; 2 ranks over shared memory
        show it beside a real op.
    .venv/bin/python bench/overhead.py torch-wrapper [--rounds 9] [--ops 5000]
        torch.distributed all_reduce over "hetobs_gloo" vs plain "gloo" (1 rank 8 B: the
        wrapper alone; 2 and 4 ranks, 8 B and 1 MiB): records, stats and watchdog visibility.
        "hetobs_gloo" runs as hetobs._torch_ext (C++); the Python fallback
        (HETOBS_TORCH_NATIVE=0) is timed in the same rounds for comparison.

Runs rotate (A B C, B C A, ...) so drift hits all alike; each prints a markdown table.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
import uuid

from hetobs.ports import free_port

MiB = 1 << 20


def _worker(what: str, variant: str, ops: int, nbytes: int) -> None:
    if what == "watchdog":
        import numpy as np

        import hetobs

        comm = hetobs.init()
        x = np.ones(max(1, nbytes // 4), np.float32)
        op, bar, rank = comm.all_reduce, comm.barrier, comm.rank
    else:
        import torch
        import torch.distributed as dist

        import hetobs  # noqa: F401 - registers the hetobs backends

        dist.init_process_group("hetobs_gloo" if variant == "hetobs_gloo_py" else variant)
        x = torch.ones(max(1, nbytes // 4))
        op, bar, rank = dist.all_reduce, dist.barrier, dist.get_rank()
    for _ in range(min(ops, 500)):
        op(x)
    bar()
    t = time.perf_counter_ns()
    for _ in range(ops):
        op(x)
    ns = (time.perf_counter_ns() - t) / ops
    if rank == 0:
        print(json.dumps({"ns_per_op": ns}), flush=True)
    if what != "watchdog":
        bar()
        dist.destroy_process_group()  # leaving it to interpreter exit can abort inside Gloo


def _job(what: str, variant: str, world: int, ops: int, nbytes: int) -> float:
    port, job = free_port(), f"ovh{uuid.uuid4().hex[:8]}"
    procs = []
    for r in range(world):
        env = dict(os.environ, RANK=str(r), WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                   HETOBS_JOB_ID=job, HETOBS_TRANSPORT="shm", HETOBS_DEBUG="ERROR", OMP_NUM_THREADS="1")
        if what == "watchdog":
            env["HETOBS_WATCHDOG"] = "1" if variant == "on" else "0"
        else:
            env["HETOBS_TORCH_NATIVE"] = "0" if variant == "hetobs_gloo_py" else "1"
        procs.append(subprocess.Popen([sys.executable, __file__, "--worker", what, variant, str(ops), str(nbytes)],
                                      env=env, stdout=subprocess.PIPE, text=True))
    outs = [p.communicate(timeout=900)[0] for p in procs]
    if any(p.returncode for p in procs):
        raise SystemExit(f"a rank failed ({what} {variant}, {world} ranks)")
    return float(json.loads(outs[0].strip().splitlines()[-1])["ns_per_op"])


def _compare(what: str, variants: tuple[str, ...], world: int, ops: int, nbytes: int,
             rounds: int) -> list[float]:
    """Median ns/op of each variant; the order rotates every round so drift hits all alike."""
    times: dict[str, list[float]] = {v: [] for v in variants}
    for i in range(rounds):
        for v in variants[i % len(variants):] + variants[:i % len(variants)]:
            times[v].append(_job(what, v, world, ops, nbytes))
    return [statistics.median(times[v]) for v in variants]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("what", choices=("watchdog", "torch-wrapper"))
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--ops", type=int, default=0, help="ops per timed loop (default: 200000 / 5000)")
    ap.add_argument("--only-one-rank", action="store_true", help="torch-wrapper: just the 1-rank row")
    a, rest = ap.parse_known_args()
    if rest[:1] == ["--worker"]:
        raise SystemExit("internal: --worker goes first")
    if a.what == "watchdog":
        ops = a.ops or 200000
        print("| ranks | bytes | watchdog off (ns/op) | watchdog on (ns/op) | added (ns/op) | rounds |")
        print("|---|---|---|---|---|---|")
        for world in (1, 2):
            off, on = _compare("watchdog", ("off", "on"), world, ops // world, 8, a.rounds)
            print(f"| {world} | 8 | {off:.0f} | {on:.0f} | {on - off:+.0f} | {a.rounds} |", flush=True)
    else:
        ops = a.ops or 5000
        print("| ranks | bytes | gloo (us/op) | hetobs_gloo (us/op) | added (us/op) "
              "| Python fallback (us/op) | added (us/op) | rounds |")
        print("|---|---|---|---|---|---|---|---|")
        # One rank isolates the wrapper's own cost (Gloo still runs its op on its worker thread).
        rows = ((1, 8),) if a.only_one_rank else ((1, 8), (2, 8), (2, MiB), (4, 8), (4, MiB))
        for world, nbytes in rows:
            n = ops if nbytes < MiB else max(100, ops // 20)  # a 1 MiB op is ~50x an 8 B one here
            base, obs, py = _compare("torch", ("gloo", "hetobs_gloo", "hetobs_gloo_py"), world, n, nbytes,
                                     a.rounds)
            print(f"| {world} | {nbytes} | {base / 1e3:.2f} | {obs / 1e3:.2f} | {(obs - base) / 1e3:+.2f} "
                  f"| {py / 1e3:.2f} | {(py - base) / 1e3:+.2f} | {a.rounds} |", flush=True)


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        _worker(sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5]))
    else:
        main()
