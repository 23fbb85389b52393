#!/usr/bin/env python3
"""Two builds of `hetobs bench`, alternating: what a change costs the collectives themselves.

Each build's CLI (`--before`, `--after`: paths of their `hetobs` executables, e.g. two
worktrees' .venv/bin/hetobs) runs `hetobs bench --json` on the same backends and sizes, the two
taking turns (before, after, after, before, ...) so that load and caches treat them alike.
Printed: per (backend, size), the median over rounds of each build's median latency (small
sizes) and busbw, and after / before. Used for "with digests off the cost is nothing
measurable" (docs/digests.md): the build before who-arrives-last and digests against this one.

    .venv/bin/python bench/bench_compare.py --before /work/wt30a/.venv/bin/hetobs \\
        --after .venv/bin/hetobs --backends hetobs-shm,hetobs-tcp --sizes 8,1M,16M --rounds 6
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

from hetobs.bench.units import load_average


def _run(cli: str, args: argparse.Namespace) -> list[dict]:
    cmd = [cli, "bench", "--ranks", str(args.ranks), "--op", "all_reduce", "--backends", args.backends,
           "--sizes", args.sizes, "--reps", str(args.reps), "--json"]
    env = dict(os.environ, HETOBS_DIGEST="0")
    r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=3600)
    if r.returncode != 0:
        sys.exit(f"{cli} bench failed ({r.returncode}):\n{r.stderr[-3000:]}")
    return json.loads(r.stdout)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--before", required=True, help="the `hetobs` executable of the build before")
    ap.add_argument("--after", required=True, help="the `hetobs` executable of the build after")
    ap.add_argument("--backends", default="hetobs-shm,hetobs-tcp")
    ap.add_argument("--sizes", default="8,1M,16M")
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=6)
    args = ap.parse_args()
    load0 = load_average()
    got: dict[tuple[str, str, int], dict[str, list[float]]] = {}
    for i in range(args.rounds):
        for which in (("before", "after") if i % 2 == 0 else ("after", "before")):
            for row in _run(getattr(args, which), args):
                cell = got.setdefault((which, row["backend"], int(row["size"])), {"us": [], "busbw": []})
                cell["us"].append(float(row["time_us"]))
                cell["busbw"].append(float(row["busbw"]))
    print(f"`python bench/bench_compare.py --before {args.before} --after {args.after} --backends {args.backends} "
          f"--sizes {args.sizes} --ranks {args.ranks} --reps {args.reps} --rounds {args.rounds}` "
          f"— load average {load0} before, {load_average()} after\n")
    print("| backend | size | before us | after us | after / before (time) | before GB/s | after GB/s |")
    print("|---|---|---:|---:|---:|---:|---:|")
    for (which, backend, size) in sorted(k for k in got if k[0] == "before"):
        b, a = got[("before", backend, size)], got[("after", backend, size)]
        bu, au = statistics.median(b["us"]), statistics.median(a["us"])
        print(f"| {backend} | {size} B | {bu:.2f} | {au:.2f} | {au / bu:.3f} | {statistics.median(b['busbw']):.2f} | "
              f"{statistics.median(a['busbw']):.2f} |")


if __name__ == "__main__":
    main()
