#!/usr/bin/env python3
"""Time added per call by libhetobs_mpi.so: an MPI_Allreduce loop with and without the preload.

Runs bench/mpi_overhead_loop.c (compiled here with mpicc) under `mpirun`, alternating
plain and preloaded runs (the order flips every round) so drift in machine load hits
both alike, and reports medians of ns per call and of the paired differences. One rank
(`-np 1`) isolates the interposer's own cost; more ranks add MPI's wake-ups and, when
ranks outnumber cores, scheduler noise (shown as the spread of the plain runs).

    python bench/mpi_overhead.py                    # 4, 2 and 1 ranks; 8 B and 64 KiB
    python bench/mpi_overhead.py --np 4,2 --rounds 9 --bytes 8,65536,1048576

Prints a markdown table (and the command line) on stdout.
"""

from __future__ import annotations

import argparse
import os
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
LOOP = HERE / "mpi_overhead_loop.c"


def run_loop(exe: Path, np: int, nbytes: int, iters: int, preload: str | None, workdir: Path) -> float:
    cmd = ["mpirun", "--allow-run-as-root", "--oversubscribe", "--bind-to", "none", "-np", str(np)]
    env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
    if preload:
        cmd += ["-x", f"LD_PRELOAD={preload}", "-x", f"HETOBS_DIR={workdir / 'hetobs'}",
                "-x", "HETOBS_JOB_ID=bench-mpi-overhead"]
    cmd += [str(exe), str(nbytes), str(iters), str(max(100, iters // 10))]
    p = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600, check=False)
    if p.returncode != 0:
        raise SystemExit(f"mpirun failed ({p.returncode}): {' '.join(cmd)}\n{p.stdout}{p.stderr}")
    for line in p.stdout.splitlines():
        if line.startswith("ns_per_call "):
            return float(line.split()[1])
    raise SystemExit(f"no timing in the output of {' '.join(cmd)}:\n{p.stdout}{p.stderr}")


def median_abs_dev(xs: list[float]) -> float:
    m = statistics.median(xs)
    return statistics.median(abs(x - m) for x in xs)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--np", default="4,2,1", help="rank counts, comma-separated (default 4,2,1)")
    ap.add_argument("--bytes", default="8,65536", help="payload sizes in bytes (default 8,65536)")
    ap.add_argument("--rounds", type=int, default=7, help="plain/preloaded pairs per configuration (default 7)")
    ap.add_argument("--seconds", type=float, default=0.3, help="target length of one timed loop (default 0.3)")
    ap.add_argument("--lib", default=None, help="the interposer (default: hetobs.preload.library_path('mpi'))")
    args = ap.parse_args(argv)
    if not (shutil.which("mpicc") and shutil.which("mpirun")):
        print("mpicc/mpirun not found: install an MPI (Debian: openmpi-bin libopenmpi-dev)", file=sys.stderr)
        return 2
    lib = args.lib
    if lib is None:
        from hetobs.preload import library_path

        lib = library_path("mpi")
    nps = [int(x) for x in args.np.split(",") if x]
    sizes = [int(x) for x in args.bytes.split(",") if x]
    rows = []
    with tempfile.TemporaryDirectory(prefix="hetobs-mpi-bench-") as tmp:
        work = Path(tmp)
        exe = work / "loop"
        subprocess.run(["mpicc", "-O2", "-o", str(exe), str(LOOP)], check=True)
        for np in nps:
            for nbytes in sizes:
                probe = run_loop(exe, np, nbytes, 2000, None, work)
                iters = int(min(2_000_000, max(1000, args.seconds * 1e9 / max(probe, 1.0))))
                plain: list[float] = []
                pre: list[float] = []
                for i in range(args.rounds):
                    order = (None, lib) if i % 2 == 0 else (lib, None)
                    for which in order:
                        t = run_loop(exe, np, nbytes, iters, which, work)
                        (pre if which else plain).append(t)
                    print(f"  np {np} {nbytes} B round {i + 1}: plain {plain[-1]:.1f} ns, preload {pre[-1]:.1f} ns",
                          file=sys.stderr)
                diffs = [b - a for a, b in zip(plain, pre)]
                mp = statistics.median(plain)
                rows.append((np, nbytes, iters, mp, statistics.median(pre), statistics.median(diffs),
                             median_abs_dev(plain)))
    cmd = " ".join(shlex.quote(a) for a in [Path(sys.argv[0]).as_posix() if argv is None else "mpi_overhead.py",
                                             *(sys.argv[1:] if argv is None else argv)])
    mpirun_version = subprocess.run(["mpirun", "--version"], capture_output=True, text=True,
                                    check=False).stdout.splitlines()[0]
    print(f"`python {cmd}` — {mpirun_version}, {os.cpu_count()} CPUs, load average "
          f"{' '.join(f'{x:.1f}' for x in os.getloadavg())}, {args.rounds} interleaved pairs per row, medians\n")
    print("| ranks | bytes | calls/run | plain ns/call | preloaded ns/call | added ns/call (median of pairs) "
          "| plain spread (MAD) |")
    print("|---:|---:|---:|---:|---:|---:|---:|")
    for np, nbytes, iters, mp, mq, md, mad in rows:
        print(f"| {np} | {nbytes} | {iters} | {mp:.1f} | {mq:.1f} | {md:+.1f} | {mad:.1f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
