"""Two builds of `hetobs diagnose` on one synthetic incident, alternating: before and after a change.

The incident is bench/diagnose_scale.py's (one rank of WORLD never called the last of 200
all_reduces), written once; then each build's CLI diagnoses it RUNS times, the two taking
turns so that load and page cache treat them alike. Reported per build: wall time (best and
median) and the CPU of the whole process tree. This process is a child subreaper, so the
CPU of the parallel readers' fork server and workers (grandchildren of the CLI) is reaped
here and counted; a timing of the CLI alone would miss it. Each run must name the culprit
and carry no note (a parallel-reading failure is a note).

    .venv/bin/python bench/diagnose_compare.py --before /work/main/.venv/bin/hetobs \\
        --after .venv/bin/hetobs --world 16384 --runs 5
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from diagnose_scale import write_hetobs  # noqa: E402  (the same incident as the scale bench)

PR_SET_CHILD_SUBREAPER = 36


def _children_cpu() -> float:
    u = resource.getrusage(resource.RUSAGE_CHILDREN)
    return u.ru_utime + u.ru_stime


def _reap() -> None:
    """Wait for every orphan reparented here (the fork server exits once the CLI has)."""
    while True:
        try:
            os.waitpid(-1, 0)
        except ChildProcessError:
            return


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--before", required=True, help="the `hetobs` executable of the build before the change")
    ap.add_argument("--after", required=True, help="the `hetobs` executable of the build after it")
    ap.add_argument("--world", type=int, default=16384)
    ap.add_argument("--runs", type=int, default=5, help="runs per build")
    ap.add_argument("--format", default="2.1", choices=("1.0", "2.0", "2.1"))
    ap.add_argument("--dir", default=None, help="scratch directory (default: a temp dir, removed after)")
    args = ap.parse_args()
    if ctypes.CDLL(None).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        print("cannot become a child subreaper: the workers' CPU would not be counted", file=sys.stderr)
        return 2
    scratch = Path(args.dir) if args.dir else Path(tempfile.mkdtemp(prefix="hetobs-diag-compare-"))
    culprit = args.world // 3
    builds = {"before": args.before, "after": args.after}
    results: dict[str, list[tuple[float, float]]] = {k: [] for k in builds}
    loads: list[float] = []
    try:
        write_hetobs(scratch / "jobs", "scale", args.world, culprit, 200, args.format)
        for i in range(args.runs):
            for name, exe in builds.items():
                loads.append(os.getloadavg()[0])
                c0, t0 = _children_cpu(), time.perf_counter()
                p = subprocess.run([exe, "diagnose", "--job", "scale", "--dir", str(scratch / "jobs"), "--json"],
                                   capture_output=True, text=True, timeout=900)
                wall = time.perf_counter() - t0
                _reap()
                cpu = _children_cpu() - c0
                doc = json.loads(p.stdout) if p.stdout.strip() else {}
                verdicts = doc.get("verdicts") or [{}]
                ok = p.returncode == 1 and verdicts[0].get("ranks") == [culprit] and not doc.get("notes")
                results[name].append((wall, cpu))
                print(f"# {name} run {i + 1}: wall {wall:.2f} s, CPU {cpu:.2f} s, load {loads[-1]:.2f}"
                      f"{'' if ok else ', WRONG or failed: ' + p.stderr[-300:]}", file=sys.stderr, flush=True)
                if not ok:
                    return 1
    finally:
        if not args.dir:
            shutil.rmtree(scratch, ignore_errors=True)
    print(f"{args.world} ranks, dump format {args.format}, {args.runs} runs each, alternating; "
          f"load average (1 min) {min(loads):.2f}-{max(loads):.2f}\n")
    print("| build | wall best | wall median | CPU best | CPU median |")
    print("|---|---:|---:|---:|---:|")
    for name, rs in results.items():
        walls, cpus = [w for w, _ in rs], [c for _, c in rs]
        print(f"| {name} | {min(walls):.2f} s | {statistics.median(walls):.2f} s | {min(cpus):.2f} s | "
              f"{statistics.median(cpus):.2f} s |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
