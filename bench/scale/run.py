"""Scale harness: N native ranks (bench/scale/scale_rank.cc, no Python per rank) on this machine.

They rendezvous, run ring all_reduces over TCP (connections on demand: two per rank), one
rank stops taking part for a while, and every other rank's watchdog may fire; the job-wide
dump spreads down the side-channel tree. Prints one JSON object: start-up time, dumps,
spread requests, dump time window, and what `hetobs diagnose` named (and how long it took).

    .venv/bin/python bench/scale/run.py --ranks 512 [--hang-rank 7] [--hang-timeout 2]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

from hetobs.ports import free_port

ROOT = Path(__file__).resolve().parents[2]


def build() -> Path:
    builds = sorted((ROOT / "build").glob("cp*"))
    if not builds:
        sys.exit("bench/scale: no build directory under build/ (run scripts/setup.sh first)")
    subprocess.run(["cmake", "--build", str(builds[-1]), "--target", "hetobs_scale_rank"], check=True,
                   stdout=subprocess.DEVNULL)
    return builds[-1] / "hetobs_scale_rank"


def reap(procs: list, job: str) -> None:
    """Kill what is left of a job's rank processes (each leads a session of its own) and remove
    the job's stats segments (a killed rank cannot)."""
    for p in procs:
        if p.poll() is None:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            p.wait()
    for name in os.listdir("/dev/shm"):
        if name.startswith(f"hetobs-stats-{job}-"):
            os.unlink(os.path.join("/dev/shm", name))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--ranks", type=int, default=256)
    ap.add_argument("--hang-rank", type=int, default=7)
    ap.add_argument("--hang-timeout", type=float, default=2.0)
    ap.add_argument("--keep", action="store_true", help="keep the job directory")
    args = ap.parse_args()
    exe = build()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))  # this launcher holds 2 pipes per rank
    job = f"scale{uuid.uuid4().hex[:8]}"
    tmp = Path(tempfile.mkdtemp(prefix="hetobs-scale-"))
    port = free_port()
    n = args.ranks
    # Start-up takes a while at hundreds of ranks on two cores: the hang must come after it.
    hang_seconds = int(max(4 * args.hang_timeout, 8))
    env = dict(os.environ, WORLD_SIZE=str(n), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), HETOBS_JOB_ID=job,
               HETOBS_DIR=str(tmp), HETOBS_TRANSPORT="tcp", HETOBS_HANG_TIMEOUT=str(args.hang_timeout),
               HETOBS_TIMEOUT="600", HETOBS_CONNECT_TIMEOUT="300", HETOBS_RECORDS="64", HETOBS_DEBUG="ERROR",
               SCALE_OPS="4", SCALE_HANG_AT="2", SCALE_HANG_RANK=str(args.hang_rank),
               SCALE_HANG_SECONDS=str(hang_seconds))
    procs: list[subprocess.Popen] = []
    t0 = time.monotonic()
    try:
        for r in range(n):
            procs.append(subprocess.Popen([str(exe)], env=dict(env, RANK=str(r)), stdout=subprocess.PIPE,
                                          stderr=subprocess.PIPE, start_new_session=True))
        # Each rank says "done" after its ops, then waits for SIGUSR2 to close (scale_rank.cc).
        for p in procs:
            p.stdout.readline()  # "done", or "" once it exited
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGUSR2)
        errs = []
        for p in procs:
            _, err = p.communicate(timeout=900)
            if p.returncode:
                errs.append(err.decode(errors="replace")[-300:])
        wall = time.monotonic() - t0
        inc_root = tmp / job / "incidents"
        incidents = sorted(os.listdir(inc_root)) if inc_root.exists() else []
        out: dict = {"ranks": n, "hang_rank": args.hang_rank, "hang_timeout_s": args.hang_timeout,
                     "hang_seconds": hang_seconds, "wall_s": round(wall, 1), "failed_ranks": len(errs),
                     "first_errors": errs[:3], "incidents": incidents,
                     "loadavg": os.getloadavg()}
        # The hang's incident: the op the hung rank skipped (SCALE_HANG_AT, 0-based; seqs count from 1).
        # Others may appear when start-up at hundreds of ranks outlasts the hang timeout.
        hang_incident = f"hang-c0-s{int(env['SCALE_HANG_AT']) + 1}"
        if hang_incident in incidents:
            out["incident"] = hang_incident
            inc = inc_root / hang_incident
            dumps = [json.loads(f.read_text()) for f in inc.glob("rank-*.json")]
            times = [d["time_ns"] for d in dumps]
            # A spread's origin heads the whole world (it may have started it at a peer's request).
            origins = [d for d in dumps if (d.get("spread") or {}).get("origin") == d["rank"]]
            # When each rank's own watchdog saw the hang (dumps before hang_detected_ns: their
            # dump time, the spread origins' only).
            fired = [d["hang_detected_ns"] for d in dumps if d.get("hang_detected_ns")]
            first_watchdog = min(fired or [d["time_ns"] for d in origins] or times)
            out.update({
                "dumps": len(dumps),
                "watchdogs_fired": len(fired),
                "spread_origins": sorted(d["rank"] for d in origins),
                "requests": sum((d.get("spread") or {}).get("requests_sent", 0) for d in dumps),
                "requests_per_rank": None,
                "dump_window_s": round((max(times) - min(times)) / 1e9, 3),
                "last_dump_after_first_watchdog_s": round((max(times) - first_watchdog) / 1e9, 3),
            })
            out["requests_per_rank"] = round(out["requests"] / n, 3)
            t = time.monotonic()
            rc = subprocess.run([str(Path(sys.executable).parent / "hetobs"), "diagnose", "--job", job, "--dir", str(tmp),
                                 "--incident", hang_incident, "--json"], capture_output=True, text=True)
            out["diagnose_s"] = round(time.monotonic() - t, 1)
            out["diagnose_rc"] = rc.returncode
            try:
                report = json.loads(rc.stdout)
                out["verdicts"] = [(v["kind"], v["ranks"][:8]) for v in report.get("verdicts", [])][:4]
            except ValueError:
                out["diagnose_stderr"] = rc.stderr[-500:]
        print(json.dumps(out, indent=1))
    finally:
        reap(procs, job)
        if not args.keep:
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
