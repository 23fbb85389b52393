"""The test launcher itself (tests/_launch.py): no hetobs needed, so these run first and fast."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from _launch import Job, JobTimeout


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie counts as dead
    with open(f"/proc/{pid}/stat") as f:
        return f.read().split(") ", 1)[1][0] != "Z"


def test_events_gates_and_results(tmp_path: Path) -> None:
    job = Job("selftest", 3, {"gate": [1]}, workdir=tmp_path, transport="shm", deadline=30, gates=["g-1"])
    with job:
        ev = job.wait_event(1, "started", timeout=20)
        assert ev["rank"] == 1 and ev["pid"] == job.pids[1]
        job.gate_open("g-1", timeout=20)
        job.wait_event(1, "released", timeout=20)
        res = job.wait()
    results = res.check()
    assert [r["rank"] for r in results] == [0, 1, 2]
    env = results[2]["env"]
    assert env["MASTER_ADDR"] == "127.0.0.1" and int(env["MASTER_PORT"]) > 0
    assert env["HETOBS_JOB_ID"] == job.job_id and env["HETOBS_TRANSPORT"] == "shm"
    assert Path(env["HETOBS_DIR"]).is_dir()


def test_hang_and_crash_are_reported_and_killed(tmp_path: Path) -> None:
    job = Job("selftest", 3, {"hang": [0], "crash": [2]}, workdir=tmp_path, deadline=4.0)
    with job:
        pids = job.pids
        res = job.wait()
    assert res.timed_out
    assert res.ranks[1].returncode == 0
    assert res.ranks[2].returncode == 1 and "crashed on purpose" in res.ranks[2].result["exception"]["msg"]
    assert res.ranks[0].returncode == -9 and res.ranks[0].result is None
    assert "Thread" in res.ranks[0].stderr or "File" in res.ranks[0].stderr  # faulthandler's stack dump
    assert not any(_alive(p) for p in pids)
    with pytest.raises(AssertionError):
        res.check()


def test_wait_event_fails_fast_when_rank_exits(tmp_path: Path) -> None:
    with Job("selftest", 2, {}, workdir=tmp_path, deadline=30) as job:
        with pytest.raises(JobTimeout, match="exited without reporting"):
            job.wait_event(0, "never", timeout=20)


def test_kill_rank(tmp_path: Path) -> None:
    with Job("selftest", 2, {"hang": [0, 1]}, workdir=tmp_path, deadline=30) as job:
        job.wait_event(1, "started", timeout=20)
        job.kill_rank(1)
        assert not _alive(job.pids[1])
        assert _alive(job.pids[0])
        res = job.wait(timeout=0.5)
    assert res.timed_out and res.ranks[1].killed_by_test
    assert not _alive(job.pids[0])
