#!/usr/bin/env python3
"""Time added by libhetobs_mpi.so, with and without the preload, in one of two programs:

- `--program allreduce` (default): bench/mpi_overhead_loop.c, an MPI_Allreduce loop: the
  time added per call. One rank (`-np 1`) isolates the interposer's own cost; more ranks
  add MPI's wake-ups and, when ranks outnumber cores, scheduler noise (the spread column).
- `--program stencil`: bench/mpi_stencil.c, a real MPI program (Jacobi iterations of the
  2-D heat equation, rows split across ranks: halo exchange with Isend/Irecv/Waitall and a
  residual MPI_Allreduce per iteration): the time added per iteration, and as a fraction.

Each is compiled here with mpicc and run under `mpirun`, alternating plain and preloaded
runs (the order flips every round) so drift in machine load hits both alike; medians of the
runs and of the paired differences.

    python bench/mpi_overhead.py                    # allreduce: 4, 2 and 1 ranks; 8 B and 64 KiB
    python bench/mpi_overhead.py --np 4,2 --rounds 9 --bytes 8,65536,1048576
    python bench/mpi_overhead.py --program stencil --np 2,4 --rounds 9

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
PROGRAMS = {"allreduce": HERE / "mpi_overhead_loop.c", "stencil": HERE / "mpi_stencil.c"}


def run_loop(exe: Path, np: int, args: list[int], preload: str | None, workdir: Path) -> float:
    """ns per call (allreduce) or per iteration (stencil) the program reports, slowest rank."""
    cmd = ["mpirun", "--allow-run-as-root", "--oversubscribe", "--bind-to", "none", "-np", str(np)]
    env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
    if preload:
        cmd += ["-x", f"LD_PRELOAD={preload}", "-x", f"HETOBS_DIR={workdir / 'hetobs'}",
                "-x", "HETOBS_JOB_ID=bench-mpi-overhead"]
    cmd += [str(exe), *map(str, args)]
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
    ap.add_argument("--program", choices=tuple(PROGRAMS), default="allreduce", help="what runs (default allreduce)")
    ap.add_argument("--np", default=None, help="rank counts, comma-separated (default 4,2,1; stencil 2,4)")
    ap.add_argument("--bytes", default="8,65536", help="allreduce: payload sizes in bytes (default 8,65536)")
    ap.add_argument("--rows", type=int, default=256, help="stencil: grid rows per rank (default 256)")
    ap.add_argument("--cols", type=int, default=2048, help="stencil: grid columns (default 2048)")
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
    stencil = args.program == "stencil"
    nps = [int(x) for x in (args.np or ("2,4" if stencil else "4,2,1")).split(",") if x]
    sizes = [args.rows] if stencil else [int(x) for x in args.bytes.split(",") if x]
    rows = []
    with tempfile.TemporaryDirectory(prefix="hetobs-mpi-bench-") as tmp:
        work = Path(tmp)
        exe = work / args.program
        subprocess.run(["mpicc", "-O2", "-o", str(exe), str(PROGRAMS[args.program])], check=True)

        def argv_for(size: int, iters: int) -> list[int]:
            if stencil:
                return [size, iters, max(5, iters // 10), args.cols]
            return [size, iters, max(100, iters // 10)]

        for np in nps:
            for size in sizes:
                probe = run_loop(exe, np, argv_for(size, 20 if stencil else 2000), None, work)
                cap = 100_000 if stencil else 2_000_000
                iters = int(min(cap, max(20 if stencil else 1000, args.seconds * 1e9 / max(probe, 1.0))))
                plain: list[float] = []
                pre: list[float] = []
                for i in range(args.rounds):
                    order = (None, lib) if i % 2 == 0 else (lib, None)
                    for which in order:
                        t = run_loop(exe, np, argv_for(size, iters), which, work)
                        (pre if which else plain).append(t)
                    print(f"  np {np} {size} round {i + 1}: plain {plain[-1]:.1f} ns, preload {pre[-1]:.1f} ns",
                          file=sys.stderr)
                diffs = [b - a for a, b in zip(plain, pre)]
                mp = statistics.median(plain)
                rows.append((np, size, iters, mp, statistics.median(pre), statistics.median(diffs),
                             median_abs_dev(plain)))
    cmd = " ".join(shlex.quote(a) for a in [Path(sys.argv[0]).as_posix() if argv is None else "mpi_overhead.py",
                                             *(sys.argv[1:] if argv is None else argv)])
    mpirun_version = subprocess.run(["mpirun", "--version"], capture_output=True, text=True,
                                    check=False).stdout.splitlines()[0]
    print(f"`python {cmd}` — {mpirun_version}, {os.cpu_count()} CPUs, load average "
          f"{' '.join(f'{x:.1f}' for x in os.getloadavg())}, {args.rounds} interleaved pairs per row, medians\n")
    if stencil:
        print(f"Stencil: {args.cols} columns, rows per rank as given; per iteration a halo exchange "
              "(2 Isend, 2 Irecv, 1 Waitall) and a residual MPI_Allreduce of 8 B.\n")
        print("| ranks | rows/rank | iterations/run | plain ms/iter | preloaded ms/iter "
              "| added ms/iter (median of pairs) | added | plain spread (MAD, ms) |")
        print("|---:|---:|---:|---:|---:|---:|---:|---:|")
        for np, size, iters, mp, mq, md, mad in rows:
            print(f"| {np} | {size} | {iters} | {mp / 1e6:.3f} | {mq / 1e6:.3f} | {md / 1e6:+.4f} "
                  f"| {md / mp:+.2%} | {mad / 1e6:.3f} |")
        return 0
    print("| ranks | bytes | calls/run | plain ns/call | preloaded ns/call | added ns/call (median of pairs) "
          "| plain spread (MAD) |")
    print("|---:|---:|---:|---:|---:|---:|---:|")
    for np, nbytes, iters, mp, mq, md, mad in rows:
        print(f"| {np} | {nbytes} | {iters} | {mp:.1f} | {mq:.1f} | {md:+.1f} | {mad:.1f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
