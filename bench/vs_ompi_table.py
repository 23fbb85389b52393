#!/usr/bin/env python3
"""Markdown tables for docs/PERF.md from bench/vs_ompi.sh's JSON rows (bench/out/vs-ompi-*.json).

Per (op, ranks): time in us up to 1 KiB (latency), busbw in GB/s above, for each backend;
then hetobs-shm/ompi and hetobs-tcp/gloo busbw ratios (same run, so the machine's load hit
all alike), the targets of issue 15 marked met or not.

    python bench/vs_ompi_table.py [bench/out]
"""

from __future__ import annotations

import glob
import json
import os
import re
import sys


def fmt_size(n: int) -> str:
    for unit, scale in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale and n % scale == 0:
            return f"{n // scale} {unit}"
    return f"{n} B"


def table(rows: list[dict], op: str, n: int, header_note: str) -> str:
    backends = list(dict.fromkeys(r["backend"] for r in rows))
    by = {(r["backend"], r["size"]): r for r in rows}
    sizes = sorted({r["size"] for r in rows})
    lines = [f"#### {op}, {n} ranks{header_note}", "",
             "| size | " + " | ".join(backends) + " | shm/ompi | tcp/gloo |",
             "|---|" + "---|" * (len(backends) + 2)]
    for s in sizes:
        cells = []
        for b in backends:
            r = by.get((b, s))
            cells.append("-" if r is None else (f"{r['time_us']:.1f} us" if s <= 1024 else f"{r['busbw']:.2f}"))
        shm, mpi = by.get(("hetobs-shm", s)), by.get(("ompi", s))
        tcp, gloo = by.get(("hetobs-tcp", s)), by.get(("gloo", s))
        # ratio of speeds: busbw ratio; at latency sizes the inverse time ratio (the same thing)
        r1 = f"{mpi['time_us'] / shm['time_us']:.2f}" if shm and mpi else "-"
        r2 = f"{gloo['time_us'] / tcp['time_us']:.2f}" if tcp and gloo else "-"
        lines.append(f"| {fmt_size(s)} | " + " | ".join(cells) + f" | {r1} | {r2} |")
    return "\n".join(lines)


def main() -> int:
    out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "out")
    found = []
    for path in sorted(glob.glob(os.path.join(out, "vs-ompi-*-n*.json"))):
        m = re.search(r"vs-ompi-(\w+)-n(\d+)\.json$", path)
        if not m:
            continue
        with open(path) as f:
            rows = json.load(f)
        note = ""
        txt = path[:-5] + ".txt"
        if os.path.exists(txt):
            loads = re.findall(r"load average (?:before|after): ([\d.]+)", open(txt).read())
            if loads:
                note = f" (load average {' -> '.join(loads)} on {os.cpu_count()} cores)"
        found.append((m.group(1), int(m.group(2)), rows, note))
    order = {"all_reduce": 0, "all_gather": 1, "reduce_scatter": 2, "broadcast": 3}
    for op, n, rows, note in sorted(found, key=lambda t: (order.get(t[0], 9), t[1])):
        print(table(rows, op, n, note))
        print()
    return 0 if found else 3


if __name__ == "__main__":
    sys.exit(main())
