#!/usr/bin/env python3
"""What result digests (HETOBS_DIGEST) cost: all_reduce busbw with digests off and on, side by side.

Two ways, both printed:
- `--interleaved` (the one to read on a shared machine): two live jobs, digests off and on, whose
  batches of all_reduces alternate (off, on, on, off, ...), so both see the same load; busbw per
  batch at rank 0, medians and the median of the paired ratios;

- by default, `hetobs bench` (as a user: one process tree per batch) alternately with HETOBS_DIGEST=0
and HETOBS_DIGEST=1 (at HETOBS_DIGEST_RATE, default the setting's), --rounds times, and prints
a markdown table of the median busbw of each (backend, size) with digests on over off, with
the command and the load average before and after (the machine is shared).

    python bench/digest_cost.py --interleaved --sizes 1M,16M --rounds 15 --backends hetobs-shm
    python bench/digest_cost.py --sizes 1M,16M --rounds 5
    python bench/digest_cost.py --rate 1 --rounds 3          # every op checked: the full price
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys

from hetobs.bench.units import format_size, load_average


def _rate(args: argparse.Namespace) -> float:
    """The sampling rate the jobs run at: --rate, else the setting's (the table's default unless set)."""
    from hetobs.config import setting

    return args.rate if args.rate is not None else float(setting("HETOBS_DIGEST_RATE"))


def _bench(args: argparse.Namespace, digest: bool) -> list[dict]:
    env = dict(os.environ, HETOBS_DIGEST="1" if digest else "0")
    if args.rate is not None:
        env["HETOBS_DIGEST_RATE"] = str(args.rate)
    cmd = [sys.executable, "-m", "hetobs.cli", "bench", "--ranks", str(args.ranks), "--op", "all_reduce",
           "--backends", args.backends, "--sizes", args.sizes, "--reps", str(args.reps), "--json"]
    r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=1800)
    if r.returncode != 0:
        sys.exit(f"hetobs bench failed ({r.returncode}):\n{r.stderr[-3000:]}")
    return json.loads(r.stdout)


def worker() -> None:
    """One rank of an interleaved job: `SIZE ITERS` on stdin runs a timed batch, prints seconds (rank 0)."""
    import time

    import numpy as np

    import hetobs

    comm = hetobs.init()
    bufs: dict[int, np.ndarray] = {}
    for line in sys.stdin:
        if not line.strip():
            break
        size, iters = map(int, line.split())
        x = bufs.setdefault(size, np.ones(size // 4, np.float32))
        comm.all_reduce(x)  # warm (and aligned: every rank enters the batch together)
        comm.barrier()
        t0 = time.perf_counter()
        for _ in range(iters):
            comm.all_reduce(x)
        dt = time.perf_counter() - t0
        sys.stdout.write(f"{dt}\n")
        sys.stdout.flush()
    comm.close()


def interleaved(args: argparse.Namespace) -> None:
    import tempfile

    from hetobs.bench.units import parse_sizes
    from hetobs.launch_local import LocalJob, new_job_id

    sizes = parse_sizes(args.sizes)
    transport = args.backends.split(",")[0].replace("hetobs-", "")
    workdir = tempfile.mkdtemp(prefix="digest-cost-")
    jobs: dict[bool, LocalJob] = {}
    for digest in (False, True):
        env: dict[str, str | None] = {"HETOBS_TRANSPORT": transport, "HETOBS_DIGEST": "1" if digest else "0",
                                      "HETOBS_DEBUG": "error", "OMP_NUM_THREADS": "1"}
        if args.rate is not None:
            env["HETOBS_DIGEST_RATE"] = str(args.rate)
        jobs[digest] = LocalJob([sys.executable, os.path.abspath(__file__), "--worker"], args.ranks,
                                log_dir=os.path.join(workdir, "on" if digest else "off"),
                                hetobs_dir=os.path.join(workdir, "hetobs"), job_id=new_job_id("dcost-"), env=env,
                                stdin="pipe", stdout="pipe").start()
    load0 = load_average()
    gbps: dict[tuple[int, bool], list[float]] = {}
    try:
        for i in range(args.rounds):
            for size in sizes:
                # A whole number of sampling periods a batch (the sampled ops are every 32nd by default):
                # a batch of a few ops that holds one sampled op or none would make the ratios lumpy.
                iters = args.batch
                for digest in ((False, True) if i % 2 == 0 else (True, False)):
                    for p in jobs[digest].procs:
                        p.stdin.write(f"{size} {iters}\n".encode())  # type: ignore[union-attr]
                        p.stdin.flush()  # type: ignore[union-attr]
                    dts = [float(p.stdout.readline()) for p in jobs[digest].procs]  # type: ignore[union-attr]
                    factor = 2 * (args.ranks - 1) / args.ranks
                    gbps.setdefault((size, digest), []).append(size * iters / max(dts) / 1e9 * factor)
    finally:
        for job in jobs.values():
            for p in job.procs:
                p.stdin.close()  # type: ignore[union-attr]  (a closed stdin ends the worker)
        for job in jobs.values():
            job.wait(60)
            job.close()
        shutil.rmtree(workdir, ignore_errors=True)
    rate = _rate(args)
    print(f"`python bench/digest_cost.py --interleaved --sizes {args.sizes} --backends hetobs-{transport} --ranks "
          f"{args.ranks} --rounds {args.rounds}" + (f" --rate {args.rate}" if args.rate is not None else "")
          + f"` (rate {rate}) — load average {load0} before, {load_average()} after\n")
    print("| transport | size | busbw off GB/s | busbw on GB/s | on / off (medians) | median of paired ratios |")
    print("|---|---|---|---|---|---|")
    for size in sizes:
        offs, ons = gbps[(size, False)], gbps[(size, True)]
        ratios = [b / a for a, b in zip(offs, ons)]
        print(f"| {transport} | {format_size(size)} | {statistics.median(offs):.2f} | {statistics.median(ons):.2f} | "
              f"{statistics.median(ons) / statistics.median(offs):.3f} | {statistics.median(ratios):.3f} |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="1M,16M")
    ap.add_argument("--backends", default="hetobs-shm,hetobs-tcp")
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=5, help="alternating off/on batches of `hetobs bench`")
    ap.add_argument("--reps", type=int, default=5, help="--reps of each `hetobs bench`")
    ap.add_argument("--rate", type=float, default=None, help="HETOBS_DIGEST_RATE (default: the setting's)")
    ap.add_argument("--interleaved", action="store_true", help="two live jobs, batches alternating (see above)")
    ap.add_argument("--batch", type=int, default=128, help="--interleaved: all_reduces per batch")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        return worker()
    if args.interleaved:
        return interleaved(args)
    load0 = load_average()
    busbw: dict[tuple[str, int, bool], list[float]] = {}
    for i in range(args.rounds):
        # Alternate which goes first: the load of a shared machine drifts between batches.
        for digest in ((False, True) if i % 2 == 0 else (True, False)):
            for row in _bench(args, digest):
                busbw.setdefault((row["backend"], row["size"], digest), []).append(row["busbw"])
    print(f"`python bench/digest_cost.py --sizes {args.sizes} --backends {args.backends} --ranks {args.ranks} "
          f"--rounds {args.rounds} --reps {args.reps}" + (f" --rate {args.rate}" if args.rate is not None else "")
          + f"` — load average {load0} before, {load_average()} after\n")
    print("| backend | size | busbw off GB/s | busbw on GB/s | on / off (medians) | on / off per round (paired) "
          "| best off | best on | on / off (best) |")
    print("|---|---|---|---|---|---|---|---|---|")
    for (backend, size, digest) in sorted(busbw):
        if digest:
            continue
        offs, ons = busbw[(backend, size, False)], busbw.get((backend, size, True), [])
        off, on = statistics.median(offs), statistics.median(ons) if ons else float("nan")
        paired = " ".join(f"{b / a:.2f}" for a, b in zip(offs, ons))
        label = format_size(size)
        best_off, best_on = max(offs), max(ons) if ons else float("nan")
        print(f"| {backend} | {label} | {off:.2f} | {on:.2f} | {on / off:.3f} | {paired} | {best_off:.2f} | "
              f"{best_on:.2f} | {best_on / best_off:.3f} |")
    # The price computed from its parts, which the load does not blur: one hash of the result per
    # sampled op (measured here, in this process) against the op's time at the best busbw off.
    try:
        from hetobs import _core
    except ImportError:
        return
    rate = _rate(args)
    print("\n| size | hash of the result (us) | hash GB/s | best op time off (us, shm) | hash per op at the rate "
          "(share of the op) |")
    print("|---|---|---|---|---|")
    for (backend, size, digest) in sorted(busbw):
        if digest or backend != "hetobs-shm":
            continue
        ns = _core.bench_digest(size, 10 if size > 1 << 20 else 50)
        op_us = size / (max(busbw[(backend, size, False)]) * 1e9) * 1e6 * 2 * (args.ranks - 1) / args.ranks
        print(f"| {format_size(size)} | {ns / 1e3:.1f} | {size / ns:.2f} | {op_us:.1f} | {rate * ns / 1e3 / op_us * 100:.2f}% |")


if __name__ == "__main__":
    main()
