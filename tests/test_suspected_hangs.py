"""Suspected hangs (docs/early-hangs.md), with real rank processes in a steady loop.

A rank stopped mid-loop: the other ranks' watchdogs dump the job as a suspected hang within the
floor (plus a tick and the dump's own time), the diagnosis names the stopped rank, the job is
not touched, and HETOBS_HANG_TIMEOUT later confirms the same incident. A rank that pauses
for a few seconds and goes on: the suspected incident is marked resolved (file, metric,
report) and the diagnosis blames nobody.

The floor and history are lowered (1.5 s, 5 ops) so the tests take seconds; bench/early_hang.py
runs the same faults with the default settings.
"""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from _inline import InlineJob, loop_program, wait_until
from hetobs.diagnosis import Options, diagnose

FLOOR_S = 1.5
EARLY = {"HETOBS_SUSPECT_FLOOR": str(FLOOR_S), "HETOBS_SUSPECT_HISTORY": "5", "HETOBS_TIMEOUT": "60"}

# Each rank prints its own hang counters as the exporter serves them (in-process source).
METRICS = """
from prometheus_client import CollectorRegistry, generate_latest
from hetobs.exporters.prometheus import HetobsCollector
from hetobs.exporters.source import InProcessSource
reg = CollectorRegistry()
reg.register(HetobsCollector(InProcessSource()))
print("METRICS", json.dumps(generate_latest(reg).decode()), flush=True)
"""


def _incidents(job: InlineJob) -> Path:
    return job.dir / job.job_id / "incidents"


def _state(job: InlineJob, incident: str, state: str) -> dict | None:
    p = _incidents(job) / incident / f"{state}.json"
    return json.loads(p.read_text()) if p.exists() else None


def _suspected(job: InlineJob) -> list[str]:
    base = _incidents(job)
    return sorted(i for i in os.listdir(base) if (base / i / "suspected.json").exists()) if base.exists() else []


def _counters(stdout: str) -> dict[str, float]:
    line = next(l for l in stdout.splitlines() if l.startswith("METRICS "))
    out = {}
    for fam in text_string_to_metric_families(json.loads(line.split(" ", 1)[1])):
        for s in fam.samples:
            if s.name in ("hetobs_hangs_suspected_total", "hetobs_hangs_resolved_total",
                          "hetobs_hangs_detected_total"):
                out[s.name] = s.value
    return out


def test_a_stopped_rank_is_suspected_within_the_floor_named_and_then_confirmed(tmp_path: Path) -> None:
    stop = tmp_path / "stop"
    body = loop_program("""
        if i == 40 and comm.rank == 2:
            print("ROUND", i, flush=True)
        x = np.ones(256, np.float32)
        comm.all_reduce(x)
        assert x[0] == 3
    """, stop=str(stop), setup="import json")
    env = {**EARLY, "HETOBS_HANG_TIMEOUT": "6"}
    with InlineJob(body, 3, tmp_path, env=env) as job:
        job.wait_line(2, "ROUND", 60)
        os.kill(job.procs[2].pid, signal.SIGSTOP)
        stopped = time.monotonic()
        try:
            wait_until(lambda: _suspected(job), FLOOR_S + 10, "a suspected incident")
            took = time.monotonic() - stopped
            [incident] = _suspected(job)
            # The floor, a tick (floor / 10), the spread's one-second ask of the stopped rank, file polling.
            assert took <= FLOOR_S + 3.0, took
            marked = _state(job, incident, "suspected")
            assert marked["threshold_s"] >= FLOOR_S and marked["quiet_s"] >= FLOOR_S, marked
            assert 2 in marked["waiting_on"], marked
            wait_until(lambda: {"rank-0.json", "rank-1.json"} <= set(os.listdir(_incidents(job) / incident)),
                       10, "the dumps of the two running ranks")
            report = diagnose(Options(job_dir=job.dir / job.job_id))
            assert report.incident == incident and report.suspicion["state"] == "suspected", report.to_dict()
            assert report.status.value == "fault", report.to_dict()
            assert {r for v in report.faults for r in v.ranks} == {2}, report.to_dict()["verdicts"]
            assert any(json.loads((_incidents(job) / incident / f"rank-{r}.json").read_text())["suspected"]
                       for r in (0, 1))
            # HETOBS_HANG_TIMEOUT confirms the same incident: no second incident, nothing rewritten.
            wait_until(lambda: _state(job, incident, "confirmed") is not None, 15, "the confirmation")
            assert os.listdir(_incidents(job)) == [incident]
        finally:
            os.kill(job.procs[2].pid, signal.SIGCONT)
        stop.touch()
        runs = job.wait(60)
    # Untouched: every rank finishes its loop with exact results once the stopped one goes on.
    assert all(r.returncode == 0 for r in runs), [r.stderr[-2000:] for r in runs]
    assert _state(job, incident, "resolved") is None  # a confirmed hang stays one
    stderr = "".join(r.stderr for r in runs)
    assert "suspected hang: all_reduce" in stderr and "hang confirmed" in stderr


def test_a_pause_that_ends_is_marked_resolved_blames_nobody_and_is_learned(tmp_path: Path) -> None:
    """Rank 1 pauses 3.5 s three times: in start-up (round 1: the communicator is not armed), in
    steady state (round 40: suspected, then resolved) and again (round 80: a wait the job has
    shown, 4 x 3.5 s is the threshold now: not suspected)."""
    stop = tmp_path / "stop"
    body = loop_program("""
        if i in (1, 40, 80) and comm.rank == 1:
            print("PAUSE", i, flush=True)
            time.sleep(3.5)  # an evaluation on one rank
        x = np.ones(256, np.float32)
        comm.all_reduce(x)
        assert x[0] == 3
    """, stop=str(stop), setup="import json", finish=METRICS)
    with InlineJob(body, 3, tmp_path, env=EARLY) as job:
        for _ in range(3):
            job.wait_line(1, "PAUSE", 60)
        stop.touch()  # the loop ends after the round of the last pause: its op completes first
        runs = job.wait(60)
    [incident] = _suspected(job)  # the round-40 pause only
    assert os.listdir(_incidents(job)) == [incident]
    assert all(r.returncode == 0 for r in runs), [r.stderr[-2000:] for r in runs]
    resolved = _state(job, incident, "resolved")
    assert resolved["verdict"] == "slow, not hung" and resolved["op"] == "all_reduce", resolved
    assert resolved["seq"] >= 2 * 40, resolved  # two ops a round: the round-40 pause, not the start-up one
    # The op started before the pause ended, so it lasted less than the pause, and past the floor.
    assert FLOOR_S <= resolved["duration_s"] <= 3.5 + 1.0, resolved
    assert resolved["stalled_s"] >= FLOOR_S, resolved
    waiters = [r for r in runs if _counters(r.stdout).get("hetobs_hangs_suspected_total")]
    assert waiters and all(_counters(r.stdout)["hetobs_hangs_resolved_total"] == 1 for r in waiters), \
        [_counters(r.stdout) for r in runs]
    assert _counters(runs[1].stdout)["hetobs_hangs_suspected_total"] == 0  # the pausing rank waited on nobody
    assert all(_counters(r.stdout)["hetobs_hangs_detected_total"] == 0 for r in runs)
    report = diagnose(Options(job_dir=job.dir / job.job_id))
    assert report.incident == incident and report.status.value == "healthy", report.to_dict()
    assert report.verdicts == [] and report.suspicion["state"] == "resolved", report.to_dict()
    assert report.to_dict()["suspicion"]["duration_s"] == resolved["duration_s"]
    assert "slow, not hung" in report.suspicion["summary"]


def test_a_slow_op_that_ends_just_before_the_job_does_is_still_marked_resolved(tmp_path: Path) -> None:
    """The slow op completes and the job exits within one watchdog tick: the exit marks it."""
    body = """
import time, numpy as np, hetobs
comm = hetobs.init()
x = np.ones(16, np.float32)
for i in range(40):
    if i == 30 and comm.rank == 1:
        time.sleep(2.5)
    comm.all_reduce(x)
comm.close()
"""
    with InlineJob(body, 2, tmp_path, env=EARLY) as job:
        runs = job.wait(60)
    assert all(r.returncode == 0 for r in runs), [r.stderr[-2000:] for r in runs]
    [incident] = _suspected(job)
    resolved = _state(job, incident, "resolved")
    assert resolved is not None and resolved["rank"] == 0 and resolved["duration_s"] >= FLOOR_S, resolved


def test_the_counters_are_read_where_the_native_header_keeps_them() -> None:
    from hetobs import _core, stats
    layout = _core.stats_layout()
    assert stats._SUSPECT_AT == layout["StatsHeader.hangs_suspected"]
    assert layout["StatsHeader.hangs_resolved"] == stats._SUSPECT_AT + 8
    assert stats._SUSPECT_AT + stats._HEADER_SUSPECT.size <= layout["sizeof.StatsHeader"]
