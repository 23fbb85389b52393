"""`hetobs top` against a real 4-rank job: idle, busy, then one rank stopped mid-loop.

`--once --json` is one plain JSON document; the window numbers come from two reads of
the ranks' stats segments --interval apart.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _telemetry_job import RankJob  # noqa: E402

pytestmark = pytest.mark.slow

WORLD = 4


def _top(job: RankJob, *extra: str, interval: float = 0.3) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "hetobs.cli", "top", "--job", job.job_id, "--dir",
                           str(job.hetobs_dir), "--interval", str(interval), *extra], capture_output=True, text=True,
                          timeout=60, env={**os.environ, "COLUMNS": "250"})


def _doc(job: RankJob, interval: float = 0.3) -> dict[str, Any]:
    r = _top(job, "--once", "--json", interval=interval)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def test_top_idle_busy_and_stopped(tmp_path: Path) -> None:
    with RankJob("workload", WORLD, {"rounds": 1}, workdir=tmp_path, env={"HETOBS_HANG_TIMEOUT": "2"}) as job:
        job.wait_all("phase1")
        doc = _doc(job)
        assert doc["job"] == job.job_id and 0.25 < doc["window_s"] < 5
        assert [r["rank"] for r in doc["ranks"]] == list(range(WORLD))
        for r in doc["ranks"]:
            assert r["state"] == "healthy" and r["up"] and r["current"] == [] and r["window_ops"] == 0
            assert r["pid"] == job.procs[r["rank"]].pid and r["last_seq"] == {"0": 7}
        assert {(ln["rank"], ln["peer"]) for ln in doc["links"]} == {
            (r, p) for r in range(WORLD) for p in range(WORLD) if p != r}

        job.send("loop")
        job.wait_all("looping")
        doc = _doc(job, interval=1.0)  # a window long enough for ops to finish on a loaded machine
        for r in doc["ranks"]:
            assert r["window_ops"] > 0 and r["busbw_gbps"] > 0 and r["algbw_gbps"] > 0, r
        moving = [ln for ln in doc["links"] if ln["send_mbps"]]
        assert moving and all(ln["busy_fraction"] is not None for ln in moving)

        victim = job.procs[1].pid
        os.kill(victim, signal.SIGSTOP)
        os.waitpid(victim, os.WUNTRACED)
        try:
            end = time.monotonic() + 30
            # The stop lands either inside an op (rank 1 reads stuck) or between two ops (rank 1
            # reads stopped, and the ranks waiting for it in the next op read stuck). The hang
            # timeout is 2 s: poll top until one of the two pictures is there.
            while True:
                doc = _doc(job)
                r1 = doc["ranks"][1]
                others_stuck = [r["rank"] for r in doc["ranks"] if r["rank"] != 1 and r["state"] == "stuck"]
                if r1["state"] == "stuck" or (r1["state"] == "stopped" and others_stuck) or time.monotonic() > end:
                    break
            assert r1["process"] == "stopped" and r1["seconds_since_progress"] >= 2.0, r1
            if r1["state"] == "stuck":
                assert [c["op"] for c in r1["current"]] == ["all_reduce"] and r1["current"][0]["seq"] > 7
            else:
                assert r1["state"] == "stopped" and r1["current"] == [] and others_stuck, doc["ranks"]
            assert r1["window_ops"] == 0
            human = _top(job, "--once")
            assert human.returncode == 0, human.stderr
            assert "stuck" in human.stdout and "all_reduce #" in human.stdout and "links" in human.stdout
        finally:
            os.kill(victim, signal.SIGCONT)


def test_top_without_segments_is_no_data(tmp_path: Path) -> None:
    r = subprocess.run([sys.executable, "-m", "hetobs.cli", "top", "--job", "nosuchjob-top", "--once", "--json",
                        "--dir", str(tmp_path)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 3 and r.stdout == ""
    assert "no stats segment of job nosuchjob-top" in r.stderr


def test_top_names_the_rank_the_stuck_ones_wait_on(tmp_path: Path) -> None:
    """Rank 1 sits in Python (reading its stdin) while ranks 0 and 2 enter an all_reduce: they
    are stuck waiting on rank 1, and rank 1 — idle, so healthy by its own numbers — is the
    one holding the job up: state "blocking", waited on by 0 and 2 (in --json and the table)."""
    world = 3
    with RankJob("workload", world, {"rounds": 1}, workdir=tmp_path, env={"HETOBS_HANG_TIMEOUT": "1"}) as job:
        job.wait_all("phase1")
        job.send("one", ranks=[0, 2])
        for r in (0, 2):
            job.wait_event(r, "entering")
        end = time.monotonic() + 30
        while True:  # the hang timeout (1 s) must pass before the waiters read stuck
            doc = _doc(job)
            states = [r["state"] for r in doc["ranks"]]
            if states == ["stuck", "blocking", "stuck"] or time.monotonic() > end:
                break
        ranks = doc["ranks"]
        assert states == ["stuck", "blocking", "stuck"], ranks
        assert 1 in ranks[0]["waiting_on"] and 1 in ranks[2]["waiting_on"], ranks
        assert ranks[1]["waiting_on"] == [] and ranks[1]["waited_on_by"] == [0, 2], ranks
        assert ranks[1]["current"] == [] and ranks[1]["process"] == "alive"
        human = _top(job, "--once")
        assert human.returncode == 0 and "blocking" in human.stdout and "waits on" in human.stdout, human.stderr
        job.send("one", ranks=[1])
        job.wait_all("one_done")
        doc = _doc(job)
        assert [r["state"] for r in doc["ranks"]] == ["healthy"] * world
        assert all(r["waited_on_by"] == [] for r in doc["ranks"])
