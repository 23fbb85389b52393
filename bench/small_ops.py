#!/usr/bin/env python3
"""Where the time of a small collective goes, from Python down to the transport.

Starts N ranks of hetobs (shared memory by default) and times, in interleaved rounds,
the same 8 B float32 op (--op: all_reduce, all_gather, reduce_scatter, broadcast; all_gather's
size is the gathered one) through each layer:

    python   comm.all_reduce(x)                  the public call (numpy fast path: fast_entry)
    general  as_buffer + checks + native.run      the general path (what every call took before)
    run      native.run(op, ptr, ...)             the pybind11 call with prepared arguments
    native   native.run_loop(..., iters)          the op looped in C++ (GIL released once)

so general - run is the Python-side checks, run - native the binding (ten-argument
conversion, GIL release/acquire) and native the transport plus recording. Prints a
markdown table of medians over rounds (max over ranks of each rank's median) with the
load average. `--clock cpu` counts the calling thread's CPU time instead of wall time:
on a loaded shared machine that is the only honest per-call cost at 1 rank (wall time
there includes being descheduled); with peers, waiting shows only in wall time.

    python bench/small_ops.py --ranks 2,4 --rounds 9
    python bench/small_ops.py --ranks 1 --clock cpu
    python bench/small_ops.py --ranks 2 --op all_gather
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

from hetobs.ports import free_port

LAYERS = ("python", "general", "run", "native")


def rank_main(iters: int, rounds: int, nbytes: int, clock_name: str, op_name: str = "all_reduce") -> None:
    import numpy as np

    import hetobs
    from hetobs.buffers import as_buffer
    from hetobs.comm import OPS, _block

    comm = hetobs.init()
    native, n = comm._native, comm.size
    count = max(1, nbytes // 4)
    x = np.zeros(count // n if op_name == "all_gather" else count, dtype=np.float32)
    y = {"all_gather": np.zeros(x.size * n, np.float32),
           "reduce_scatter": np.zeros(_block(count, n, comm.rank)[1], np.float32)}.get(op_name, x)
    b, o = as_buffer(x, "x", writable=True), as_buffer(y, "out", writable=True)
    op, red = OPS[op_name], comm._reduction("sum", b)
    args = (op, b.ptr, b.count, o.ptr, o.count, b.dtype, red, 0, -1.0)
    clock = time.thread_time_ns if clock_name == "cpu" else time.perf_counter_ns
    public = {"all_reduce": lambda: comm.all_reduce(x), "broadcast": lambda: comm.broadcast(x, 0),
              "all_gather": lambda: comm.all_gather(y, x), "reduce_scatter": lambda: comm.reduce_scatter(y, x)}
    call = public[op_name]

    def general_once() -> None:  # the general path's steps, as comm.py takes them
        if op_name in ("all_reduce", "broadcast"):
            g = as_buffer(x, f"{op_name} x", writable=True)
            kw = {"redop": comm._reduction("sum", g)} if op_name == "all_reduce" else {"root": comm._check_rank(0, "root")}
            comm._run(op_name, g, g, **kw)
            return
        go, gx = as_buffer(y, f"{op_name} out", writable=True), as_buffer(x, f"{op_name} x")
        comm._same_dtype(go, gx, f"{op_name} out/x")
        kw = {"redop": comm._reduction("sum", gx)} if op_name == "reduce_scatter" else {}
        comm._run(op_name, gx, go, **kw)

    def python() -> float:
        t0 = clock()
        for _ in range(iters):
            call()
        return (clock() - t0) / iters

    def general() -> float:
        t0 = clock()
        for _ in range(iters):
            general_once()
        return (clock() - t0) / iters

    def run() -> float:
        f = native.run
        t0 = clock()
        for _ in range(iters):
            f(*args, False)
        return (clock() - t0) / iters

    def loop() -> float:
        if clock_name == "wall":
            return native.run_loop(*args, iters) / iters
        t0 = clock()
        native.run_loop(*args, iters)
        return (clock() - t0) / iters

    fns = {"python": python, "general": general, "run": run, "native": loop}
    for f in fns.values():  # warm-up
        f()
    out: dict[str, list[float]] = {k: [] for k in LAYERS}
    for r in range(rounds):
        order = list(LAYERS[r % len(LAYERS):] + LAYERS[:r % len(LAYERS)])  # same order on every rank
        for k in order:
            out[k].append(fns[k]())
    print(json.dumps({"rank": comm.rank, "ns": out, "oversubscribed": native.wait_policy()["oversubscribed"]}))
    comm.close()


def run_world(n: int, transport: str, iters: int, rounds: int, nbytes: int, clock: str,
              bind: bool = False, op: str = "all_reduce") -> dict[str, float]:
    port = free_port()
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), WORLD_SIZE=str(n),
               HETOBS_TRANSPORT=transport, HETOBS_JOB_ID=f"small-ops-{port}")
    cpus = sorted(os.sched_getaffinity(0))
    pin = (lambda r: ["taskset", "-c", str(cpus[r % len(cpus)])]) if bind else (lambda r: [])
    procs = [subprocess.Popen([*pin(r), sys.executable, __file__, "--rank-main", str(iters), str(rounds), str(nbytes),
                               clock, op],
                              env=dict(env, RANK=str(r)), stdout=subprocess.PIPE, text=True) for r in range(n)]
    outs = [p.communicate(timeout=600)[0] for p in procs]
    if any(p.returncode for p in procs):
        raise SystemExit(f"a rank failed: {[p.returncode for p in procs]}")
    per_rank = [json.loads(o.strip().splitlines()[-1]) for o in outs]
    med = {k: max(statistics.median(pr["ns"][k]) for pr in per_rank) for k in LAYERS}
    med["oversubscribed"] = float(per_rank[0]["oversubscribed"])
    return med


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "--rank-main":
        rank_main(int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5], sys.argv[6])
        return 0
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ranks", default="2,4")
    ap.add_argument("--transport", default="shm")
    ap.add_argument("--bytes", type=int, default=8)
    ap.add_argument("--op", choices=("all_reduce", "all_gather", "reduce_scatter", "broadcast"), default="all_reduce")
    ap.add_argument("--iters", type=int, default=2000)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--clock", choices=("wall", "cpu"), default="wall")
    ap.add_argument("--bind", choices=("none", "core", "both"), default="none",
                    help="core: rank r pinned to CPU r mod CPUs (as Open MPI binds at <= 2 ranks); both: each "
                         "rank count twice, unpinned and pinned, one after the other")
    a = ap.parse_args()
    print(f"`python bench/small_ops.py {' '.join(sys.argv[1:])}`; {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; "
          f"load average {os.getloadavg()[0]:.2f} at start on {os.cpu_count()} cores (shared machine)\n")
    print(f"{a.bytes} B {a.op}, {a.transport}, {a.clock} clock, us per call\n")
    print("| ranks | python (fast path) | general (before) | run | native | checks = general-run "
          "| binding = run-native | oversubscribed |")
    print("|---|---|---|---|---|---|---|---|")
    binds = {"none": [False], "core": [True], "both": [False, True]}[a.bind]
    for n, bind in ((int(v), b) for v in a.ranks.split(",") for b in binds):
        m = run_world(n, a.transport, a.iters, a.rounds, a.bytes, a.clock, bind, a.op)
        us = {k: m[k] / 1e3 for k in LAYERS}
        print(f"| {n}{' pinned' if bind else ''} | {us['python']:.2f} | {us['general']:.2f} | {us['run']:.2f} | {us['native']:.2f} | "
              f"{us['general'] - us['run']:.2f} | {us['run'] - us['native']:.2f} | "
              f"{'yes' if m['oversubscribed'] else 'no'} |", flush=True)
    print(f"\nload average {os.getloadavg()[0]:.2f} at the end")
    return 0


if __name__ == "__main__":
    sys.exit(main())
