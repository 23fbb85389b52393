"""Start-up at scale through the Python API: N rank processes on this one host, started R times.

Each rank does what a user's script does: `hetobs.init()` from the environment (torchrun
variables), then a few 1 MiB all_reduces whose sums it checks. A run "started" when every rank
got through init and its ops; the start-up time of a run is from launching the first process
to the last rank's init returning. Per run it also counts ranks that failed and the warnings
that say a pair fell back from shared memory to TCP (a symptom of the start-up race of issue 28).

    .venv/bin/python bench/scale/python_start.py --ranks 128,256 --runs 20
    .venv/bin/python bench/scale/python_start.py --ranks 512 --runs 1 --json

Prints one line per run (stderr) and a table (or --json) at the end. Not a test: numbers depend
on the machine and on what else runs; the load average is printed with them.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from run import free_port, reap  # noqa: E402  (bench/scale/run.py: the native-rank scale harness)

RANK = r"""
import os, sys, time
t0 = time.monotonic()
import numpy as np, hetobs
comm = hetobs.init()
init_s = time.monotonic() - t0
READY_AT = time.time()
x = np.empty(1 << 18, np.float32)  # 1 MiB
for i in range(OPS):
    x[:] = comm.rank + i
    comm.all_reduce(x)
    want = comm.size * (comm.size - 1) // 2 + comm.size * i
    if not np.all(x == want):
        print("WRONG", i, float(x[0]), want, flush=True)
        sys.exit(5)
print("READY", init_s, READY_AT, flush=True)
comm.close()
"""

FALLBACK = "is unusable"  # the shared-memory fallback warning (csrc/src/comm/connect.cc)
MB_PER_RANK = 32  # memory of one Python rank with numpy and hetobs (PSS ~23 MiB) and its segments, rounded up


def available_mb() -> int:
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) // 1024
    return 0


def one_run(n: int, ops: int, timeout: float) -> dict:
    job = f"pystart{uuid.uuid4().hex[:8]}"
    tmp = Path(tempfile.mkdtemp(prefix="hetobs-pystart-"))
    env = {k: v for k, v in os.environ.items() if not k.startswith("HETOBS_")}
    env.update(WORLD_SIZE=str(n), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), HETOBS_JOB_ID=job,
               HETOBS_DIR=str(tmp), HETOBS_CONNECT_TIMEOUT=str(timeout), HETOBS_TIMEOUT=str(timeout),
               HETOBS_HANG_TIMEOUT=str(timeout), HETOBS_DEBUG="WARN", OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    body = RANK.replace("OPS", str(ops))
    procs: list[subprocess.Popen[bytes]] = []
    t0 = time.monotonic()
    launched = time.time()
    ready_at: list[float] = []  # wall clock of each rank's init returning
    try:
        for r in range(n):
            procs.append(subprocess.Popen([sys.executable, "-c", body], env=dict(env, RANK=str(r)),
                                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True))
        init_s: list[float] = []
        errors: list[str] = []
        fallbacks = 0
        end = t0 + timeout + 60
        for p in procs:
            try:
                out, err = p.communicate(timeout=max(1.0, end - time.monotonic()))
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                out, err = p.communicate()
                errors.append("timed out")
                continue
            text = err.decode(errors="replace")
            fallbacks += text.count(FALLBACK)
            line = next((l for l in out.decode().splitlines() if l.startswith("READY ")), None)
            if p.returncode == 0 and line:
                init_s.append(float(line.split()[1]))
                ready_at.append(float(line.split()[2]))
            else:
                last = [l for l in text.splitlines() if l.strip()][-1:] or [f"exit {p.returncode}"]
                errors.append(last[0][-300:])
        wall = time.monotonic() - t0
        started = len(init_s) == n
        return {"ranks": n, "started": started, "failed_ranks": n - len(init_s), "fallback_warnings": fallbacks,
                # the job's start-up: from launching the first process to the last rank's init returning
                "startup_s": round(max(ready_at) - launched, 2) if started else None,
                "init_p50_s": round(statistics.median(init_s), 2) if init_s else None,
                "wall_s": round(wall, 1), "errors": sorted(set(errors))[:3]}
    finally:
        reap(procs, job)
        shutil.rmtree(tmp, ignore_errors=True)


def summary(rows: list[dict]) -> dict:
    times = [r["startup_s"] for r in rows if r["started"]]
    q = statistics.quantiles(times, n=10) if len(times) >= 2 else times
    return {"ranks": rows[0]["ranks"], "runs": len(rows), "started": sum(r["started"] for r in rows),
            "startup_min_s": min(times) if times else None,
            "startup_median_s": round(statistics.median(times), 2) if times else None,
            "startup_p90_s": round(q[-1], 2) if times else None,
            "startup_max_s": max(times) if times else None,
            "fallback_warnings": sum(r["fallback_warnings"] for r in rows),
            "errors": sorted({e for r in rows for e in r["errors"]})[:3]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ranks", default="128,256,512", help="comma-separated world sizes (default 128,256,512)")
    ap.add_argument("--runs", type=int, default=5, help="starts per world size (default 5)")
    ap.add_argument("--ops", type=int, default=3, help="1 MiB all_reduces per rank after init (default 3)")
    ap.add_argument("--timeout", type=float, default=300.0, help="connect and op timeout per run, seconds")
    ap.add_argument("--json", action="store_true", help="print JSON instead of a table")
    args = ap.parse_args()
    try:
        sizes = [int(s) for s in args.ranks.split(",") if s.strip()]
    except ValueError:
        sys.exit(f"--ranks {args.ranks!r}: expected comma-separated integers")
    if not sizes or min(sizes) < 2 or args.runs < 1:
        sys.exit("--ranks needs sizes of at least 2 and --runs at least 1")
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))  # 2 pipes per rank here
    out = []
    for n in sizes:
        need = n * MB_PER_RANK
        if available_mb() < need + 1024:
            print(f"{n} ranks: skipped, about {need} MiB needed and {available_mb()} MiB available", file=sys.stderr)
            continue
        rows = []
        for k in range(args.runs):
            row = one_run(n, args.ops, args.timeout)
            row["loadavg_1m"] = round(os.getloadavg()[0], 1)
            rows.append(row)
            print(f"{n} ranks, run {k + 1}/{args.runs}: " + json.dumps(row), file=sys.stderr, flush=True)
        s = summary(rows)
        s["loadavg"] = [round(x, 1) for x in os.getloadavg()]
        out.append({"summary": s, "runs": rows})
    if args.json:
        print(json.dumps(out, indent=1))
        return
    print(f"{'ranks':>6} {'started':>9} {'min s':>7} {'median s':>9} {'p90 s':>7} {'max s':>7} {'fallbacks':>10}  errors")
    for block in out:
        s = block["summary"]
        print(f"{s['ranks']:>6} {s['started']:>4}/{s['runs']:<4} {s['startup_min_s'] or '-':>7} "
              f"{s['startup_median_s'] or '-':>9} {s['startup_p90_s'] or '-':>7} {s['startup_max_s'] or '-':>7} "
              f"{s['fallback_warnings']:>10}  {'; '.join(s['errors'])}")


if __name__ == "__main__":
    main()
