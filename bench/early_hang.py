"""Hangs caught in seconds (issue 31 item 1): the must-reach scenarios with default settings.

Each run starts a steady training-like loop (a little compute, then a 1 MiB all_reduce, every
step), lets it run past the history the watchdog arms on, injects one fault and times:

- `suspected_s`: from the fault to the incident's `suspected.json` (the early, job-wide dump);
- `named_s`: from the fault to the end of `hetobs diagnose --job ID --json` (the CLI, as an
  operator would run it once the dumps stop arriving) naming the culprit.

Scenarios (all with the default HETOBS_SUSPECT_* and HETOBS_HANG_TIMEOUT; HETOBS_TIMEOUT and
HETOBS_CONNECT_TIMEOUT at their defaults too):
- `stopped`: one of 4 ranks (shared memory) is SIGSTOPped mid-loop; the stopped rank must be named.
- `nojoin`: one of 4 ranks stops calling collectives (stays busy elsewhere, alive); it must be named.
- `blackhole`: 3 "hosts" (network namespaces, root), one rank each over TCP; every packet between
  hosts 0 and 1 is dropped (iptables, both ways); the link 0-1 must be named, no rank blamed.
- `eval`: 4 ranks, healthy, one rank runs a 20 s "evaluation" every `--eval-every` steps
  (`--evals` of them): every suspected incident must be marked resolved, and no diagnosis of
  any incident may give a fault verdict.

Prints one JSON line per run and a summary table; `--json FILE` keeps them.

    .venv/bin/python bench/early_hang.py --runs 3
    .venv/bin/python bench/early_hang.py --scenarios stopped,nojoin --runs 5
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Optional

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from _inline import InlineJob  # noqa: E402

from hetobs.settings_table import SETTINGS  # noqa: E402

DEFAULTS = {s.name: s.default for s in SETTINGS
            if s.name in ("HETOBS_TIMEOUT", "HETOBS_CONNECT_TIMEOUT", "HETOBS_HANG_TIMEOUT", "HETOBS_SUSPECT_FACTOR",
                          "HETOBS_SUSPECT_FLOOR", "HETOBS_SUSPECT_HISTORY")}
TARGET_S = 15.0

PROGRAM = """
import os, time, numpy as np, hetobs
comm = hetobs.init()
mode, victim, fault = os.environ["BENCH_MODE"], int(os.environ["BENCH_VICTIM"]), os.environ["BENCH_FAULT"]
eval_every, eval_s = int(os.environ["BENCH_EVAL_EVERY"]), float(os.environ["BENCH_EVAL_S"])
x = np.empty(1 << 18, np.float32)  # 1 MiB
flag = np.zeros(1, np.float32)
i = 0
while True:
    time.sleep(0.01)  # the step's compute
    if mode == "eval" and comm.rank == victim and i and i % eval_every == 0:
        print("EVAL", i, time.time(), flush=True)
        time.sleep(eval_s)
    if mode == "nojoin" and comm.rank == victim and os.path.exists(fault):
        print("FAULT", time.time(), flush=True)
        while True:  # busy elsewhere for good: never joins the next collective
            time.sleep(1)
    x[:] = comm.rank + 1
    comm.all_reduce(x)
    assert x[0] == comm.size * (comm.size + 1) / 2, x[0]
    if i == 200:
        print("STEADY", flush=True)
    i += 1
    if i % 10 == 0:
        flag[0] = float(os.path.exists(fault + ".stop"))
        comm.all_reduce(flag, op="max")
        if flag[0]:
            break
print("STEPS", i, flush=True)
comm.close()
"""


def _incidents(job: InlineJob) -> Path:
    return job.dir / job.job_id / "incidents"


def _suspected(job: InlineJob) -> list[tuple[str, float]]:
    base = _incidents(job)
    out = []
    for inc in sorted(os.listdir(base)) if base.exists() else []:
        p = base / inc / "suspected.json"
        if p.exists():
            out.append((inc, json.loads(p.read_text())["time_ns"] / 1e9))
    return out


def _dump_count(job: InlineJob, incident: str) -> int:
    d = _incidents(job) / incident
    return sum(1 for f in os.listdir(d) if f.startswith("rank-") and f.endswith(".json")) if d.exists() else 0


def _wait(pred: Callable[[], Any], timeout: float, step: float = 0.05) -> Any:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        v = pred()
        if v:
            return v
        time.sleep(step)  # polling files the ranks rename into place
    return None


def _diagnose(job: InlineJob, incident: Optional[str] = None) -> dict[str, Any]:
    argv = [sys.executable, "-m", "hetobs.cli", "diagnose", "--job", job.job_id, "--json"]
    if incident:
        argv += ["--incident", incident]
    out = subprocess.run(argv, env=dict(os.environ, HETOBS_DIR=str(job.dir)), capture_output=True, text=True,
                         timeout=120)
    try:
        return json.loads(out.stdout)
    except ValueError:
        return {"status": "error", "exit": out.returncode, "stderr": out.stderr[-2000:]}


def _env(mode: str, victim: int, fault: Path, eval_every: int = 0, eval_s: float = 0.0) -> dict[str, str]:
    return {**DEFAULTS, "BENCH_MODE": mode, "BENCH_VICTIM": str(victim), "BENCH_FAULT": str(fault),
            "BENCH_EVAL_EVERY": str(eval_every), "BENCH_EVAL_S": str(eval_s)}


def _settled(job: InlineJob, incident: str, world: int, quiet_s: float = 1.0, limit_s: float = 6.0) -> None:
    """Wait until the incident has every rank's dump, or its count has not grown for `quiet_s`."""
    end = time.monotonic() + limit_s
    last, since = -1, time.monotonic()
    while time.monotonic() < end:
        n = _dump_count(job, incident)
        if n >= world:
            return
        if n != last:
            last, since = n, time.monotonic()
        elif time.monotonic() - since >= quiet_s:
            return
        time.sleep(0.05)


def _judge_hang(job: InlineJob, fault_wall: float, fault_mono: float, world: int,
                expect: Callable[[dict[str, Any]], bool]) -> dict[str, Any]:
    got = _wait(lambda: _suspected(job), 60)
    row: dict[str, Any] = {"suspected_s": None, "named_s": None, "named": False}
    if not got:
        return row
    incident, t = got[0]
    row.update(incident=incident, suspected_s=round(t - fault_wall, 2))
    _settled(job, incident, world)
    report = _diagnose(job)
    row["named_s"] = round(time.monotonic() - fault_mono, 2)
    row["diagnosed_incident"] = report.get("incident")
    row["status"] = report.get("status")
    row["verdicts"] = [{"kind": v["kind"], "ranks": v["ranks"], "links": v["links"]}
                       for v in report.get("verdicts", [])]
    row["suspicion"] = (report.get("suspicion") or {}).get("state")
    row["named"] = expect(report)
    return row


def _faults(report: dict[str, Any]) -> list[dict[str, Any]]:
    advisory = {"straggler", "slow_link"}
    return [v for v in report.get("verdicts", []) if v["kind"] not in advisory]


def _names_rank(rank: int) -> Callable[[dict[str, Any]], bool]:
    def ok(report: dict[str, Any]) -> bool:
        blamed = {r for v in _faults(report) for r in v["ranks"]}
        return report.get("status") == "fault" and blamed == {rank}
    return ok


def _names_link(a: int, b: int) -> Callable[[dict[str, Any]], bool]:
    def ok(report: dict[str, Any]) -> bool:
        links = {tuple(sorted(lk)) for v in _faults(report) for lk in v["links"]}
        blamed = {r for v in _faults(report) for r in v["ranks"]}
        return report.get("status") == "fault" and (a, b) in links and not blamed
    return ok


def run_stopped(tmp: Path) -> dict[str, Any]:
    world, victim = 4, 2
    with InlineJob(PROGRAM, world, tmp, env=_env("stopped", victim, tmp / "fault")) as job:
        job.wait_line(0, "STEADY", 120)
        fault_wall, fault_mono = time.time(), time.monotonic()
        os.kill(job.procs[victim].pid, signal.SIGSTOP)
        try:
            row = _judge_hang(job, fault_wall, fault_mono, world, _names_rank(victim))
        finally:
            os.kill(job.procs[victim].pid, signal.SIGCONT)
    return row


def run_nojoin(tmp: Path) -> dict[str, Any]:
    world, victim = 4, 1
    fault = tmp / "fault"
    with InlineJob(PROGRAM, world, tmp, env=_env("nojoin", victim, fault)) as job:
        job.wait_line(0, "STEADY", 120)
        fault.touch()
        line = job.wait_line(victim, "FAULT", 30)
        fault_wall = float(line.split()[1])
        fault_mono = time.monotonic() - (time.time() - fault_wall)
        return _judge_hang(job, fault_wall, fault_mono, world, _names_rank(victim))


def run_blackhole(tmp: Path) -> dict[str, Any]:
    from netns import Hosts, drop_incoming, drop_outgoing
    world = 3
    with Hosts(world) as hosts:
        env = {**_env("blackhole", -1, tmp / "fault"), "HETOBS_TRANSPORT": "tcp"}
        with InlineJob(PROGRAM, world, tmp, env=env, transport="tcp", master_addr=hosts.addrs[0],
                       prefix=[hosts.prefix(i) for i in range(world)]) as job:
            job.wait_line(0, "STEADY", 120)
            fault_wall, fault_mono = time.time(), time.monotonic()
            for i, j in ((0, 1), (1, 0)):
                drop_outgoing(hosts, i, j)
                drop_incoming(hosts, i, j)
            return _judge_hang(job, fault_wall, fault_mono, world, _names_link(0, 1))


def run_eval(tmp: Path, every: int, evals: int, eval_s: float) -> dict[str, Any]:
    world, victim = 4, 3
    fault = tmp / "fault"
    with InlineJob(PROGRAM, world, tmp, env=_env("eval", victim, fault, every, eval_s)) as job:
        for _ in range(evals):
            job.wait_line(victim, "EVAL", 300)
        # The last evaluation ends, then a few more steps, then the loop stops.
        time.sleep(eval_s + 3)
        (tmp / "fault.stop").touch()
        runs = job.wait(120)
    base = _incidents(job)
    incidents = sorted(os.listdir(base)) if base.exists() else []
    states = {i: sorted(f[:-5] for f in os.listdir(base / i) if not f.startswith("rank-")) for i in incidents}
    reports = {i: _diagnose(job, i) for i in incidents}
    faults = {i: _faults(r) for i, r in reports.items() if _faults(r)}
    ok = (all(r.returncode == 0 for r in runs) and all(s == ["resolved", "suspected"] for s in states.values())
          and not faults and all(r.get("status") == "healthy" for r in reports.values()))
    durations = [(reports[i].get("suspicion") or {}).get("duration_s") for i in incidents]
    return {"incidents": states, "resolved_after_s": durations, "fault_verdicts": faults,
            "exit_codes": [r.returncode for r in runs], "ok": ok}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--scenarios", default="stopped,nojoin,blackhole,eval")
    ap.add_argument("--eval-every", type=int, default=300, help="steps between evaluations")
    ap.add_argument("--evals", type=int, default=3)
    ap.add_argument("--eval-seconds", type=float, default=20.0)
    ap.add_argument("--json", type=Path)
    a = ap.parse_args()
    rows: list[dict[str, Any]] = []
    for run in range(a.runs):
        for name in a.scenarios.split(","):
            with tempfile.TemporaryDirectory(prefix=f"early-{name}-") as d:
                t0 = time.monotonic()
                if name == "stopped":
                    row = run_stopped(Path(d))
                elif name == "nojoin":
                    row = run_nojoin(Path(d))
                elif name == "blackhole":
                    row = run_blackhole(Path(d))
                elif name == "eval":
                    row = run_eval(Path(d), a.eval_every, a.evals, a.eval_seconds)
                else:
                    raise SystemExit(f"unknown scenario {name!r}")
                row.update(scenario=name, run=run, wall_s=round(time.monotonic() - t0, 1))
                if name != "eval":
                    row["ok"] = bool(row["named"] and row["named_s"] is not None and row["named_s"] <= TARGET_S)
            print(json.dumps(row), flush=True)
            rows.append(row)
    print(f"\n{'scenario':<10} {'run':>3} {'suspected_s':>11} {'named_s':>8}  ok  verdicts / incidents")
    for r in rows:
        what = r.get("verdicts") if r["scenario"] != "eval" else r.get("incidents")
        print(f"{r['scenario']:<10} {r['run']:>3} {str(r.get('suspected_s', '-')):>11} "
              f"{str(r.get('named_s', '-')):>8}  {'yes' if r['ok'] else 'NO ':<3} {json.dumps(what)[:120]}")
    if a.json:
        a.json.write_text(json.dumps(rows, indent=1))
    return 0 if all(r["ok"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
